//! The fingerprint field Z_p × Z_q.
//!
//! p = 2q + 1 is a safe prime with q prime and q ≡ 3 (mod 4) (hence p ≡ 7 mod 8, p ≡ 3
//! mod 4). Found by an offline search downward from 2^26 (re-checked by a unit test):
//! p = 67 107 983, q = 33 553 991. Because p < 2^26, a product of two reduced values is
//! < 2^52 and a u64 holds a sum of 4096 of them, so dot products reduce once per 4096 terms.
//!
//! g = 4 is a quadratic residue ≠ 1 mod p; the residues form the subgroup of prime order q,
//! so g has order q and `b ↦ g^b` is a homomorphism (Z_q, +) → (Z_p^*, ·).
//!
//! Scalars enter exactly through the **dyadic embedding**: a finite f64 is m·2^e with m an
//! integer (|m| < 2^53); it maps to m·2^e in each field, with 2^e for e < 0 computed as
//! (2⁻¹)^|e|. Distinct dyadic rationals map to distinct field elements except with
//! negligible probability, and the embedding is a ring homomorphism on dyadic rationals.

/// The prime p (safe prime, p = 2q + 1, p < 2^26).
pub const P: u64 = 67_107_983;
/// The prime q = (p − 1)/2, q ≡ 3 (mod 4).
pub const Q: u64 = 33_553_991;
/// Generator of the order-q subgroup of Z_p^* used by exp.
pub const G: u64 = 4;
/// Number of products a u64 accumulator may hold before a reduction.
pub const LAZY_TERMS: usize = 4096;

/// An element of Z_p × Z_q (equivalently one residue mod p·q by CRT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fv {
    pub p: u32,
    pub q: u32,
}

impl std::ops::Add for Fv {
    type Output = Fv;
    fn add(self, o: Fv) -> Fv {
        // operands are reduced: one conditional subtraction instead of a division
        let (p, q) = (self.p + o.p, self.q + o.q);
        Fv {
            p: if p >= P as u32 { p - P as u32 } else { p },
            q: if q >= Q as u32 { q - Q as u32 } else { q },
        }
    }
}

impl std::ops::Sub for Fv {
    type Output = Fv;
    fn sub(self, o: Fv) -> Fv {
        Fv::new(
            self.p as u64 + P - o.p as u64,
            self.q as u64 + Q - o.q as u64,
        )
    }
}

impl std::ops::Neg for Fv {
    type Output = Fv;
    fn neg(self) -> Fv {
        Fv::ZERO - self
    }
}

impl std::ops::Mul for Fv {
    type Output = Fv;
    fn mul(self, o: Fv) -> Fv {
        Fv::new(self.p as u64 * o.p as u64, self.q as u64 * o.q as u64)
    }
}

/// Division multiplies by the componentwise inverse (0⁻¹ := 0).
impl std::ops::Div for Fv {
    type Output = Fv;
    #[allow(clippy::suspicious_arithmetic_impl)]
    fn div(self, o: Fv) -> Fv {
        self * o.inv()
    }
}

/// `b^e mod m`.
pub fn pow_mod(mut b: u64, mut e: u64, m: u64) -> u64 {
    let mut r = 1 % m;
    b %= m;
    while e > 0 {
        if e & 1 == 1 {
            r = r * b % m;
        }
        b = b * b % m;
        e >>= 1;
    }
    r
}

/// Modular inverse in a prime field; the inverse of 0 is defined as 0 (so division by a
/// zero value is total and deterministic — a fingerprint never traps).
pub fn inv_mod(a: u64, m: u64) -> u64 {
    if a % m == 0 {
        0
    } else {
        pow_mod(a, m - 2, m)
    }
}

impl Fv {
    pub const ZERO: Fv = Fv { p: 0, q: 0 };

    pub fn new(p: u64, q: u64) -> Fv {
        Fv {
            p: (p % P) as u32,
            q: (q % Q) as u32,
        }
    }
    pub fn from_int(v: i128) -> Fv {
        Fv::new(
            v.rem_euclid(P as i128) as u64,
            v.rem_euclid(Q as i128) as u64,
        )
    }
    /// Componentwise inverse (0 ↦ 0).
    pub fn inv(self) -> Fv {
        Fv::new(inv_mod(self.p as u64, P), inv_mod(self.q as u64, Q))
    }
    /// exp((a, b)) = (g^b mod p, 1). The q-part carries no information afterwards, so exp of
    /// an exp's output only depends on the constant 1 (information is lost, soundly).
    pub fn exp(self) -> Fv {
        Fv::new(pow_mod(G, self.q as u64, P), 1)
    }
    /// sqrt((a, b)) = (a^((p+1)/4), b^((q+1)/4)): a multiplicative function that is a square
    /// root on quadratic residues, so sqrt(xy) = sqrt(x)·sqrt(y) holds exactly.
    pub fn sqrt(self) -> Fv {
        Fv::new(
            pow_mod(self.p as u64, (P + 1) / 4, P),
            pow_mod(self.q as u64, (Q + 1) / 4, Q),
        )
    }
    /// Integer power by a non-negative exponent.
    pub fn powi(self, e: u64) -> Fv {
        Fv::new(pow_mod(self.p as u64, e, P), pow_mod(self.q as u64, e, Q))
    }

    /// Dyadic embedding of a finite f64 (see module doc). Non-finite values map to 0
    /// (the builders reject them before they get here).
    pub fn from_f64(x: f64) -> Fv {
        if !x.is_finite() || x == 0.0 {
            return Fv::ZERO;
        }
        let bits = x.to_bits();
        let sign = if bits >> 63 == 1 { -1i128 } else { 1 };
        let exp_bits = ((bits >> 52) & 0x7ff) as i64;
        let frac = bits & ((1u64 << 52) - 1);
        // value = mant · 2^e
        let (mant, e) = if exp_bits == 0 {
            (frac, -1074i64)
        } else {
            (frac | (1u64 << 52), exp_bits - 1075)
        };
        let m = Fv::from_int(sign * mant as i128);
        let two_e = if e >= 0 {
            Fv::new(2, 2).powi(e as u64)
        } else {
            Fv::new(2, 2).inv().powi((-e) as u64)
        };
        m * two_e
    }
}

/// splitmix64 finaliser: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash a sequence of words into one 64-bit value (order sensitive).
pub fn mix_words(words: &[u64]) -> u64 {
    words
        .iter()
        .fold(0x5945_5241_4745_u64, |h, &w| mix64(h ^ mix64(w)))
}

/// A field element drawn from a 64-bit key: p-part and q-part from two derived words
/// (bias of the reduction < 2^-37).
pub fn fv_from_key(key: u64) -> Fv {
    let a = mix64(key ^ 0x0123_4567_89ab_cdef);
    let b = mix64(key ^ 0xfedc_ba98_7654_3210);
    Fv::new(a % P, b % Q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_prime(n: u64) -> bool {
        if n < 2 {
            return false;
        }
        let mut i = 2;
        while i * i <= n {
            if n % i == 0 {
                return false;
            }
            i += 1;
        }
        true
    }

    #[test]
    fn parameters() {
        assert!(is_prime(P));
        assert!(is_prime(Q));
        assert_eq!(P, 2 * Q + 1);
        assert_eq!(Q % 4, 3);
        assert_eq!(P % 4, 3);
        const { assert!(P < 1 << 26) };
        assert!(((P - 1) as u128).pow(2) * LAZY_TERMS as u128 <= u64::MAX as u128);
        // g has order exactly q (q prime, g ≠ 1)
        assert_eq!(pow_mod(G, Q, P), 1);
        assert_ne!(G % P, 1);
    }

    #[test]
    fn arithmetic() {
        let a = Fv::new(12345, 678);
        let b = Fv::new(99, 1001);
        assert_eq!(a + b - b, a);
        assert_eq!(a * b / b, a);
        assert_eq!(-a + a, Fv::ZERO);
        assert_eq!(Fv::ZERO.inv(), Fv::ZERO);
        // exp is a homomorphism on the q-part
        assert_eq!((a + b).exp(), a.exp() * b.exp());
        // sqrt is multiplicative and a square root of squares up to sign
        assert_eq!((a * b).sqrt(), a.sqrt() * b.sqrt());
        let s = (a * a).sqrt();
        assert!(s.p == a.p || s.p as u64 == P - a.p as u64);
        assert_eq!(s * s, a * a);
    }

    #[test]
    fn dyadic_embedding() {
        assert_eq!(Fv::from_f64(3.0), Fv::new(3, 3));
        assert_eq!(Fv::from_f64(-2.0), Fv::from_int(-2));
        let half = Fv::from_f64(0.5);
        assert_eq!(half * Fv::new(2, 2), Fv::new(1, 1));
        assert_eq!(Fv::from_f64(0.75), Fv::from_f64(3.0) * Fv::from_f64(0.25));
        assert_ne!(Fv::from_f64(1e-6), Fv::from_f64(1e-5));
        assert_ne!(Fv::from_f64(0.1), Fv::from_f64(0.1f32 as f64));
        assert_eq!(
            Fv::from_f64(2f64.powi(-1000)) * Fv::from_f64(2f64.powi(1000)),
            Fv::new(1, 1)
        );
        assert_eq!(
            Fv::from_f64(f64::MIN_POSITIVE / 4.0) * Fv::from_f64(4.0),
            Fv::from_f64(f64::MIN_POSITIVE)
        );
    }
}
