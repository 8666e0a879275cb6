//! The value domain an executor computes in.
//!
//! One executor (see [`crate::exec`]) runs kernel and block graphs; what a "value" is and
//! what each primitive means is supplied by a [`Domain`]: f64 for the reference evaluator
//! ([`crate::reference`]) and Z_p × Z_q for fingerprints ([`crate::fingerprint`]). Composite
//! ops (rms_norm, softmax, means, accumulators) are written once in terms of these
//! primitives, so both domains follow the same definitions.

use crate::ops::{BinaryOp, UnaryOp};

/// Semantics of primitive operations on one value type.
pub trait Domain: Sync {
    /// A scalar value.
    type V: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static;

    /// Additive identity.
    fn zero(&self) -> Self::V;
    /// Embed a finite f64 constant (eps, scalars, clamp bounds …).
    fn constant(&self, c: f64) -> Self::V;
    fn add(&self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(&self, a: Self::V, b: Self::V) -> Self::V;
    fn div(&self, a: Self::V, b: Self::V) -> Self::V;
    /// Square root of a value known to be ≥ 0 in real arithmetic (means of squares plus eps;
    /// the executor's sign analysis decides for `sqrt`/`rsqrt` ops, see [`crate::exec`]).
    fn sqrt(&self, a: Self::V) -> Self::V;
    /// Square root of a value whose sign is not known (the field models it differently from
    /// [`Domain::sqrt`]: its square root cannot see signs).
    fn sqrt_signed(&self, a: Self::V) -> Self::V {
        self.sqrt(a)
    }
    /// `1 / sqrt_signed(a)` (`rsqrt` of a value whose sign is not known).
    fn rsqrt_signed(&self, a: Self::V) -> Self::V {
        self.div(self.constant(1.0), self.sqrt_signed(a))
    }
    /// `x / n` for an element count `n` (means): f64 divides, the field multiplies by n⁻¹.
    fn div_count(&self, x: Self::V, n: usize) -> Self::V;
    /// An elementwise unary op as a function (parameters are embedded once here); `sqrt` and
    /// `rsqrt` here take arguments known to be ≥ 0.
    fn unary_fn<'a>(&'a self, op: UnaryOp) -> Box<dyn Fn(Self::V) -> Self::V + Send + Sync + 'a>;
    /// `a − a` of one tensor with itself (exactly 0 in real arithmetic where `a` is finite;
    /// the f64 balls would otherwise widen it).
    fn sub_self(&self, a: Self::V) -> Self::V {
        self.binary(BinaryOp::Sub, a, a)
    }
    /// An elementwise binary op.
    fn binary(&self, op: BinaryOp, a: Self::V, b: Self::V) -> Self::V;
    /// The value a softmax subtracts from one row before its exp (`exp(x − m)` cancels in the
    /// ratio): the row's largest finite value in float64, so a row whose largest logit passes
    /// exp's range (709.8) still has the finite softmax it has mathematically. None (the
    /// default, and for a row without a finite value): nothing is subtracted; the field has no
    /// order, and its fingerprints must stay those of the plain `exp(x) / Σ exp(x)`.
    fn softmax_shift(&self, row: &mut dyn Iterator<Item = Self::V>) -> Option<Self::V> {
        let _ = row;
        None
    }
    /// The largest of `row`'s values (a max-reduction; the row is never empty). f64 propagates
    /// NaN as torch.amax does; the field, which has no order, takes a seeded random
    /// function of the row's values that does not depend on their order.
    fn max_of(&self, row: &[Self::V]) -> Self::V;
    /// Whether `a / b` is exactly `a · recip(b)` here (the field; not f64, which rounds),
    /// so a broadcast divisor can be inverted once per element.
    fn divides_by_reciprocal(&self) -> bool {
        false
    }
    /// `1 / b` (used only where [`Domain::divides_by_reciprocal`]).
    fn recip(&self, b: Self::V) -> Self::V {
        self.div(self.constant(1.0), b)
    }

    /// `Σ_i f(i)` for `i < n`, summed in index order (domains may reduce lazily).
    fn sum(&self, n: usize, f: impl Fn(usize) -> Self::V) -> Self::V {
        (0..n).fold(self.zero(), |acc, i| self.add(acc, f(i)))
    }
    /// `Σ_i a(i)·b(i)` for `i < n`, in index order (domains may reduce lazily).
    fn dot(&self, n: usize, f: impl Fn(usize) -> (Self::V, Self::V)) -> Self::V {
        (0..n).fold(self.zero(), |acc, i| {
            let (a, b) = f(i);
            self.add(acc, self.mul(a, b))
        })
    }
}
