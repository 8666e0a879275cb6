//! The fingerprint field Z_p × Z_q.
//!
//! p = 2q + 1 is a safe prime with q prime and q ≡ 3 (mod 4) (hence p ≡ 7 mod 8, p ≡ 3
//! mod 4). Found by an offline search downward from 2^26 (re-checked by a unit test):
//! p = 67 107 983, q = 33 553 991. Because p < 2^26, a product of two reduced values is
//! < 2^52 and a u64 holds a sum of 4096 of them, so dot products reduce once per 4096 terms.
//!
//! G = 4 is a quadratic residue ≠ 1 mod p; the residues form the subgroup of prime order q,
//! so every residue g ≠ 1 has order q and `b ↦ g^b` is a homomorphism (Z_q, +) → (Z_p^*, ·).
//! A fingerprint trial uses a seeded random power g = G^k (k ≠ 0 mod q) as exp's base, so
//! exp of a constant (g^c) is not the image of a simple constant (with the fixed base 4,
//! exp(1) was the image of 4.0).
//!
//! The q-part is a value's residue mod q, needed only as an exponent. An exp's output has no
//! known residue mod q (g^b is known mod p alone), so its q-part, and that of everything
//! computed from it, is the marker [`UNKNOWN_Q`]: such values are compared by their p-part,
//! and an exp of one is modelled by the fingerprint domain as g^h with h a seeded random
//! function of its p-part (sound; exact again for exps of exp-free values). The inverse of a
//! value whose q-part is 0 (but whose p-part is not) has an unknown q-part too.
//!
//! Scalars enter exactly through the **dyadic embedding**: a finite f64 is m·2^e with m an
//! integer (|m| < 2^53); it maps to m·2^e in each field, with 2^e for e < 0 computed as
//! (2⁻¹)^|e|. The embedding is a ring homomorphism on dyadic rationals; it is not injective
//! (m·2^e and (m + k·p·q)·2^e collide), so the fingerprint checks the scalars of the graphs it
//! compares for collisions (see [`crate::fingerprint`]).

/// The prime p (safe prime, p = 2q + 1, p < 2^26).
pub const P: u64 = 67_107_983;
/// The prime q = (p − 1)/2, q ≡ 3 (mod 4).
pub const Q: u64 = 33_553_991;
/// Generator of the order-q subgroup of Z_p^*; exp's base in a trial is a seeded power of it.
pub const G: u64 = 4;
/// Number of products a u64 accumulator may hold before a reduction.
pub const LAZY_TERMS: usize = 4096;

/// The q-part of a value whose residue mod q is unknown (an exp's output and everything
/// computed from it). Reduced q-parts are < Q < 2^25, so the marker's top bit tells them apart.
pub const UNKNOWN_Q: u32 = u32::MAX;

/// An element of Z_p × Z_q (equivalently one residue mod p·q by CRT), or of Z_p alone when
/// `q` is [`UNKNOWN_Q`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fv {
    pub p: u32,
    pub q: u32,
}

/// `f(a, b)` on two q-parts, or [`UNKNOWN_Q`] when either is unknown.
#[inline]
fn q_op(a: u32, b: u32, f: impl FnOnce(u64, u64) -> u64) -> u32 {
    if a == UNKNOWN_Q || b == UNKNOWN_Q {
        UNKNOWN_Q
    } else {
        (f(a as u64, b as u64) % Q) as u32
    }
}

impl std::ops::Add for Fv {
    type Output = Fv;
    fn add(self, o: Fv) -> Fv {
        // operands are reduced: one conditional subtraction instead of a division
        let p = self.p + o.p;
        Fv {
            p: if p >= P as u32 { p - P as u32 } else { p },
            q: q_op(self.q, o.q, |a, b| a + b),
        }
    }
}

impl std::ops::Sub for Fv {
    type Output = Fv;
    fn sub(self, o: Fv) -> Fv {
        Fv {
            p: ((self.p as u64 + P - o.p as u64) % P) as u32,
            q: q_op(self.q, o.q, |a, b| a + Q - b),
        }
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
        Fv {
            p: ((self.p as u64 * o.p as u64) % P) as u32,
            q: q_op(self.q, o.q, |a, b| a * b),
        }
    }
}

/// Division multiplies by the componentwise inverse (see [`Fv::inv`] for a zero divisor).
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
    /// Whether the residue mod q is known (the value does not depend on an exp's output).
    pub fn q_known(self) -> bool {
        self.q != UNKNOWN_Q
    }
    /// `f` on the p-part and (when known) the q-part, each with its own modulus.
    fn map_parts(self, f: impl Fn(u64, u64) -> u64) -> Fv {
        Fv {
            p: f(self.p as u64, P) as u32,
            q: if self.q_known() {
                f(self.q as u64, Q) as u32
            } else {
                UNKNOWN_Q
            },
        }
    }
    /// Componentwise inverse. A zero p-part maps to 0 (total and deterministic; callers that
    /// divide flag it, see [`crate::fingerprint`]); a zero q-part of a nonzero value has no
    /// inverse mod q, so the result's q-part is unknown.
    pub fn inv(self) -> Fv {
        let v = self.map_parts(inv_mod);
        if self.q == 0 && self.p != 0 {
            Fv { q: UNKNOWN_Q, ..v }
        } else {
            v
        }
    }
    /// Whether the p-part is 0 (as a divisor: the field cannot model the division).
    pub fn p_is_zero(self) -> bool {
        self.p == 0
    }
    /// exp((a, b)) = (g^b mod p, unknown) for the base `g` (an element of order q), or `None`
    /// when b is unknown (the caller models that exp as an uninterpreted exponent).
    pub fn exp(self, g: u64) -> Option<Fv> {
        self.q_known()
            .then(|| Fv::exp_of_exponent(g, self.q as u64))
    }
    /// (g^e mod p, unknown): an exp's output for the exponent e mod q and base `g`.
    pub fn exp_of_exponent(g: u64, e: u64) -> Fv {
        Fv {
            p: pow_mod(g, e % Q, P) as u32,
            q: UNKNOWN_Q,
        }
    }
    /// sqrt((a, b)) = (a^((p+1)/4), b^((q+1)/4)): a multiplicative function that is a square
    /// root on quadratic residues, so sqrt(xy) = sqrt(x)·sqrt(y) holds exactly.
    pub fn sqrt(self) -> Fv {
        self.map_parts(|v, m| pow_mod(v, (m + 1) / 4, m))
    }
    /// Integer power by a non-negative exponent.
    pub fn powi(self, e: u64) -> Fv {
        self.map_parts(|v, m| pow_mod(v, e, m))
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

/// exp's base for a trial keyed by `key`: G^k with k in [1, q−1], an element of order q.
pub fn exp_base(key: u64) -> u64 {
    pow_mod(G, 1 + mix64(key ^ 0x0065_7870_6261_7365) % (Q - 1), P)
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
        assert_eq!(Fv::ZERO.inv().p, 0);
        // a nonzero value with q-part 0 has no inverse mod q
        assert!(!Fv::new(5, 0).inv().q_known());
        assert_eq!(Fv::new(5, 0).inv().p as u64 * 5 % P, 1);
        // exp is a homomorphism on the q-part, for any base of order q
        for g in [G, exp_base(1), exp_base(2)] {
            assert_eq!(pow_mod(g, Q, P), 1);
            assert_ne!(g, 1);
            assert_eq!((a + b).exp(g), Some(a.exp(g).unwrap() * b.exp(g).unwrap()));
        }
        assert_ne!(exp_base(1), exp_base(2));
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

    #[test]
    fn unknown_residues_propagate() {
        let a = Fv::new(12345, 678);
        let e = a.exp(G).unwrap();
        assert!(!e.q_known() && a.q_known());
        // an exp's output has no residue mod q: everything computed from it has none either
        for v in [
            e + a,
            a + e,
            e - a,
            a - e,
            e * a,
            a / e,
            e.inv(),
            e.sqrt(),
            e.powi(3),
        ] {
            assert!(!v.q_known(), "{v:?}");
        }
        assert_eq!(e.exp(G), None);
        // the p-part still computes exactly
        assert_eq!((e * a).p as u64, e.p as u64 * a.p as u64 % P);
        assert_eq!((e - e).p, 0);
    }
}
