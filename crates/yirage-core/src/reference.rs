//! Reference evaluator: float64 semantics of every op.
//!
//! Used to check generated kernels numerically and to validate customized ops (the block
//! graph is executed with its real mapping, see [`crate::exec`]). Definitions:
//! silu x·σ(x); gelu the exact erf form x·½(1+erf(x/√2)) (PyTorch's default);
//! sigmoid 1/(1+e^-x); rsqrt 1/√x; clamp min(max(x, lo), hi); pow powf.

use crate::dense::{Dense, Tensor};
use crate::domain::Domain;
use crate::error::Result;
use crate::exec::{run_kernel_graph, run_kernel_graph_ranks};
use crate::kernel_graph::KernelGraph;
use crate::ops::{BinaryOp, UnaryOp};

/// The float64 domain.
#[derive(Debug, Clone, Copy, Default)]
pub struct F64;

/// erf(x) to about 1e-15: Maclaurin series for |x| < 3, continued fraction of erfc beyond.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let r = if ax < 3.0 {
        // erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = ax * ax;
        let mut term = ax;
        let mut sum = ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
            if n > 200.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if ax > 27.0 {
        1.0
    } else {
        // erfc(x) = e^{-x²}/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + …)))) via modified Lentz.
        let tiny = 1e-300;
        let mut f = ax;
        let mut c = ax;
        let mut dd = 0.0;
        for k in 1..300 {
            let a = k as f64 * 0.5;
            dd = ax + a * dd;
            dd = if dd.abs() < tiny { tiny } else { dd };
            c = ax + a / c;
            c = if c.abs() < tiny { tiny } else { c };
            dd = 1.0 / dd;
            let delta = c * dd;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-ax * ax).exp() / (f * std::f64::consts::PI.sqrt())
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

impl Domain for F64 {
    type V = f64;
    fn zero(&self) -> f64 {
        0.0
    }
    fn constant(&self, c: f64) -> f64 {
        c
    }
    fn add(&self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn mul(&self, a: f64, b: f64) -> f64 {
        a * b
    }
    fn div(&self, a: f64, b: f64) -> f64 {
        a / b
    }
    fn sqrt(&self, a: f64) -> f64 {
        a.sqrt()
    }
    fn div_count(&self, x: f64, n: usize) -> f64 {
        x / n as f64
    }
    fn unary_fn<'a>(&'a self, op: UnaryOp) -> Box<dyn Fn(f64) -> f64 + Send + Sync + 'a> {
        match op {
            UnaryOp::Exp => Box::new(f64::exp),
            UnaryOp::Square => Box::new(|x| x * x),
            UnaryOp::Sqrt => Box::new(f64::sqrt),
            UnaryOp::Rsqrt => Box::new(|x: f64| 1.0 / x.sqrt()),
            UnaryOp::Silu => Box::new(|x: f64| x / (1.0 + (-x).exp())),
            UnaryOp::Gelu => Box::new(|x: f64| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))),
            UnaryOp::Relu => Box::new(|x: f64| if x > 0.0 { x } else { 0.0 }),
            UnaryOp::Sigmoid => Box::new(|x: f64| 1.0 / (1.0 + (-x).exp())),
            UnaryOp::Tanh => Box::new(f64::tanh),
            UnaryOp::Neg => Box::new(|x: f64| -x),
            UnaryOp::MulScalar(s) => Box::new(move |x| x * s),
            UnaryOp::AddScalar(s) => Box::new(move |x| x + s),
            UnaryOp::Clamp { lo, hi } => Box::new(move |x: f64| x.max(lo).min(hi)),
        }
    }
    fn binary(&self, op: BinaryOp, a: f64, b: f64) -> f64 {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
        }
    }
    fn softmax_shift(&self, row: &mut dyn Iterator<Item = f64>) -> Option<f64> {
        row.filter(|v| v.is_finite()).reduce(f64::max)
    }
    fn max_of(&self, row: &[f64]) -> f64 {
        row.iter()
            .copied()
            .reduce(|m, v| {
                if !m.is_nan() && (v.is_nan() || v > m) {
                    v
                } else {
                    m
                }
            })
            .unwrap_or(f64::NAN)
    }
}

/// Evaluate `graph` in float64 on `inputs` (one per graph input, matching dims).
/// Single-device graphs only; see [`evaluate_ranks`].
pub fn evaluate(graph: &KernelGraph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    run_kernel_graph(&F64, graph, inputs.to_vec())
}

/// Evaluate every rank of `graph` in float64: `inputs[r]` are rank r's inputs (one list per
/// rank, `world_size` lists); returns each rank's outputs.
pub fn evaluate_ranks(graph: &KernelGraph, inputs: &[Vec<Tensor>]) -> Result<Vec<Vec<Tensor>>> {
    run_kernel_graph_ranks(&F64, graph, inputs.to_vec())
}

/// A float64 value with a rigorous error radius: the exact real result of the computation
/// on the same (exact) inputs lies in `[v − r, v + r]`. Non-finite values are either exact
/// (`r == 0`: a NaN or an infinity that every real evaluation of the ops in IEEE semantics
/// gives, e.g. x / (y − y)) or unknown (`r == ∞`: overflow, a divisor or a square root's
/// argument whose sign the radius leaves open).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ball {
    pub v: f64,
    pub r: f64,
}

/// Unit roundoff bound used to widen every rounded result (2^-52, twice the half-ulp).
const U: f64 = f64::EPSILON;

impl Ball {
    /// An exact value.
    pub fn exact(v: f64) -> Ball {
        Ball { v, r: 0.0 }
    }
    /// Nothing known (e.g. after an overflow).
    pub const UNKNOWN: Ball = Ball {
        v: f64::NAN,
        r: f64::INFINITY,
    };
    /// Whether nothing is known.
    pub fn is_unknown(self) -> bool {
        self.r.is_infinite() || self.r.is_nan()
    }
    /// An exact NaN or infinity.
    pub fn is_exact_nonfinite(self) -> bool {
        !self.v.is_finite() && self.r == 0.0
    }
    /// A finite result `v` of a rounded op with propagated radius `r`: adds the rounding error
    /// (relative, plus one subnormal step where `v` may have underflowed); unknown when `v` or
    /// the radius overflowed.
    fn rounded(v: f64, r: f64, may_underflow: bool) -> Ball {
        let tiny = if may_underflow && v.abs() < f64::MIN_POSITIVE {
            f64::MIN_POSITIVE * U
        } else {
            0.0
        };
        let r = r + U * v.abs() + tiny;
        if v.is_finite() && r.is_finite() {
            Ball { v, r }
        } else {
            Ball::UNKNOWN
        }
    }
    /// The interval's ends.
    fn ends(self) -> [f64; 2] {
        [self.v - self.r, self.v + self.r]
    }
}

/// `f` on operands of which one is an exact non-finite value: evaluated at the ends of the
/// finite operands' intervals; exact when every end gives the same NaN/infinity (or the same
/// finite value), unknown otherwise.
fn at_ends(args: &[Ball], f: impl Fn(&[f64]) -> f64) -> Ball {
    let mut results = vec![];
    let n = args.len();
    for mask in 0..(1usize << n) {
        let point: Vec<f64> = (0..n)
            .map(|k| {
                let a = args[k];
                if a.r == 0.0 {
                    a.v
                } else {
                    a.ends()[(mask >> k) & 1]
                }
            })
            .collect();
        results.push(f(&point));
    }
    let first = results[0];
    let same = |x: f64| (x.is_nan() && first.is_nan()) || x == first;
    if results.iter().all(|&x| same(x)) {
        Ball::exact(first)
    } else {
        Ball::UNKNOWN
    }
}

/// Radius propagation for a rounded op: `None` when an operand is unknown, the operands'
/// ends when one is an exact non-finite value, else the finite rule.
fn lift(args: &[Ball], f: impl Fn(&[f64]) -> f64, finite: impl FnOnce() -> Ball) -> Ball {
    if args.iter().any(|a| a.is_unknown()) {
        Ball::UNKNOWN
    } else if args.iter().any(|a| !a.v.is_finite()) {
        at_ends(args, f)
    } else {
        finite()
    }
}

/// The float64 domain with error radii ([`Ball`]): its values are the reference evaluator's
/// (the same f64 operations), with a bound on how far each is from the exact real result.
/// The fingerprint's float64 cross-check runs in it, so two graphs that compute the same real
/// function always have overlapping balls, however differently they round.
#[derive(Debug, Clone, Copy, Default)]
pub struct BallDomain;

/// `a + b`.
fn ball_add(a: Ball, b: Ball) -> Ball {
    lift(
        &[a, b],
        |x| x[0] + x[1],
        || {
            let v = a.v + b.v;
            // TwoSum: the rounding error of the sum, exactly (exact sums stay exact)
            let bb = v - a.v;
            let err = (a.v - (v - bb)) + (b.v - bb);
            exact_rounding(v, a.r + b.r, err.abs(), false)
        },
    )
}

/// A rounded result `v` with propagated radius `r` and the op's own rounding error `err`
/// (known exactly, so results that need no rounding stay exact); `underflow` adds one
/// subnormal step. Unknown when `v` or the radius overflowed.
fn exact_rounding(v: f64, r: f64, err: f64, underflow: bool) -> Ball {
    let tiny = if underflow {
        f64::MIN_POSITIVE * U
    } else {
        0.0
    };
    // r's own rounding: a relative 4U on top
    let r = if r == 0.0 {
        err + tiny
    } else {
        (r + err) * (1.0 + 4.0 * U) + tiny
    };
    if v.is_finite() && r.is_finite() {
        Ball { v, r }
    } else {
        Ball::UNKNOWN
    }
}

/// `a · b`.
fn ball_mul(a: Ball, b: Ball) -> Ball {
    lift(
        &[a, b],
        |x| x[0] * x[1],
        || {
            let v = a.v * b.v;
            let r = a.v.abs() * b.r + b.v.abs() * a.r + a.r * b.r;
            // the product's rounding error, exactly (fma), unless it underflowed
            let err = a.v.mul_add(b.v, -v).abs();
            let underflow = v.abs() < f64::MIN_POSITIVE && a.v != 0.0 && b.v != 0.0;
            exact_rounding(v, r, err, underflow)
        },
    )
}

/// `a / b`: exact IEEE results for an exact zero divisor (±∞ or NaN), unknown when the
/// divisor's interval holds 0 otherwise.
fn ball_div(a: Ball, b: Ball) -> Ball {
    if a.is_unknown() || b.is_unknown() {
        return Ball::UNKNOWN;
    }
    if b.v == 0.0 && b.r == 0.0 {
        // the quotient's class (NaN, +∞, −∞) is known when the dividend's sign is
        return if a.r == 0.0 || a.v.abs() > a.r || !a.v.is_finite() {
            Ball::exact(a.v / b.v)
        } else {
            Ball::UNKNOWN
        };
    }
    lift(
        &[a, b],
        |x| x[0] / x[1],
        || {
            let gap = b.v.abs() - b.r;
            if gap <= 0.0 {
                return Ball::UNKNOWN;
            }
            let v = a.v / b.v;
            let r = (a.r + v.abs() * b.r) / gap;
            if a.v == 0.0 && a.r == 0.0 {
                Ball { v, r: 0.0 }
            } else {
                Ball::rounded(v, r * (1.0 + 4.0 * U), true)
            }
        },
    )
}

/// `Σ a_i·b_i` in index order with one bound for the whole sum (the classic
/// |fl(Σ) − Σ| ≤ γ_(n+1)·Σ|a_i·b_i|, doubled) instead of one per step; operands that are not
/// finite balls take the op-by-op path.
fn ball_dot(n: usize, f: impl Fn(usize) -> (Ball, Ball)) -> Ball {
    let (mut s, mut abs, mut rad, mut underflow) = (0.0f64, 0.0f64, 0.0f64, false);
    for i in 0..n {
        let (a, b) = f(i);
        if !(a.v.is_finite() && b.v.is_finite() && a.r.is_finite() && b.r.is_finite()) {
            return (0..n).fold(Ball::exact(0.0), |acc, i| {
                let (a, b) = f(i);
                ball_add(acc, ball_mul(a, b))
            });
        }
        let p = a.v * b.v;
        underflow |= p.abs() < f64::MIN_POSITIVE && a.v != 0.0 && b.v != 0.0;
        s += p;
        abs += p.abs();
        rad += a.v.abs() * b.r + b.v.abs() * a.r + a.r * b.r;
    }
    let tiny = if underflow {
        n as f64 * f64::MIN_POSITIVE * U
    } else {
        0.0
    };
    let r = (rad + (n as f64 + 2.0) * U * abs) * (1.0 + 4.0 * U) + tiny;
    if s.is_finite() && r.is_finite() && abs.is_finite() {
        Ball { v: s, r }
    } else {
        Ball::UNKNOWN
    }
}

/// `sqrt(a)`: NaN (exact) when the whole interval is negative, unknown when it straddles 0.
fn ball_sqrt(a: Ball) -> Ball {
    lift(
        &[a],
        |x| x[0].sqrt(),
        || {
            let v = a.v.sqrt();
            if a.r == 0.0 {
                return if v.is_nan() {
                    Ball::exact(v)
                } else {
                    Ball::rounded(v, 0.0, false)
                };
            }
            let lo = a.v - a.r;
            if a.v + a.r < 0.0 {
                Ball::exact(f64::NAN)
            } else if lo < 0.0 {
                Ball::UNKNOWN
            } else {
                // sqrt(v) − sqrt(v − r) ≥ sqrt(v + r) − sqrt(v)
                let r = a.r / (v + lo.sqrt());
                Ball::rounded(v, r * (1.0 + 4.0 * U) + U * v, false)
            }
        },
    )
}

/// `exp(a)`: unknown on overflow.
fn ball_exp(a: Ball) -> Ball {
    lift(
        &[a],
        |x| x[0].exp(),
        || {
            let v = a.v.exp();
            let r = v * a.r.exp_m1();
            Ball::rounded(v, r * (1.0 + 4.0 * U) + U * v, true)
        },
    )
}

/// `pow(a, b)` (powf): exact operands give the rounded result; inexact ones need a > 0 (the
/// function is monotone in each argument there, so the corners bound it), or a < 0 with no
/// integer exponent in b's interval (NaN).
fn ball_pow(a: Ball, b: Ball) -> Ball {
    lift(
        &[a, b],
        |x| x[0].powf(x[1]),
        || {
            let v = a.v.powf(b.v);
            if a.r == 0.0 && b.r == 0.0 {
                return if v.is_nan() || (v.is_infinite() && a.v == 0.0) {
                    Ball::exact(v) // a negative base with a fractional exponent, 0^-b
                } else {
                    Ball::rounded(v, 2.0 * U * v.abs(), true)
                };
            }
            if a.v == 0.0 && a.r == 0.0 && (b.v - b.r > 0.0 || b.v + b.r < 0.0) {
                // 0^b: 0 for b > 0, +∞ for b < 0
                return Ball::exact(a.v.powf(b.v));
            }
            if a.v + a.r < 0.0 && (b.v - b.r).ceil() > b.v + b.r {
                // a negative base and no integer exponent in the interval: NaN
                return Ball::exact(f64::NAN);
            }
            if a.v - a.r <= 0.0 {
                return Ball::UNKNOWN;
            }
            let mut r: f64 = 0.0;
            for x in a.ends() {
                for y in b.ends() {
                    r = r.max((x.powf(y) - v).abs());
                }
            }
            Ball::rounded(v, r * (1.0 + 4.0 * U) + 2.0 * U * v.abs(), true)
        },
    )
}

/// `min(max(x, lo), hi)` (relu: lo = 0, hi = ∞), with the reference's NaN handling
/// (`f64::max` returns the other operand): exact, so an interval wholly below `lo` (above
/// `hi`) gives exactly `lo` (`hi`), e.g. relu of a negative value is an exact 0.
fn ball_clamp(x: Ball, lo: f64, hi: f64) -> Ball {
    let f = move |v: f64| {
        if hi.is_infinite() {
            if v > 0.0 {
                v
            } else {
                0.0
            }
        } else {
            v.max(lo).min(hi)
        }
    };
    lift(
        &[x],
        |p| f(p[0]),
        || {
            let [a, b] = x.ends();
            let (fa, fb) = (f(a), f(b));
            Ball {
                v: f(x.v),
                r: (f(x.v) - fa).abs().max((fb - f(x.v)).abs()),
            }
        },
    )
}

/// Lipschitz constant and rounding (in units of U·|result|, plus a multiple of U·|x|) of the
/// reference formulas of the uninterpreted ops.
fn lipschitz(op: UnaryOp) -> (f64, f64, f64) {
    match op {
        UnaryOp::Silu => (1.1, 8.0, 0.0),     // max silu' ≈ 1.0998
        UnaryOp::Gelu => (1.13, 8.0, 64.0),   // max gelu' ≈ 1.1289; erf to ~1e-15
        UnaryOp::Sigmoid => (0.25, 8.0, 0.0), // max σ' = 1/4
        UnaryOp::Tanh => (1.0, 4.0, 0.0),
        _ => (1.0, 0.0, 0.0),
    }
}

impl Domain for BallDomain {
    type V = Ball;
    fn zero(&self) -> Ball {
        Ball::exact(0.0)
    }
    fn constant(&self, c: f64) -> Ball {
        Ball::exact(c)
    }
    fn add(&self, a: Ball, b: Ball) -> Ball {
        ball_add(a, b)
    }
    fn mul(&self, a: Ball, b: Ball) -> Ball {
        ball_mul(a, b)
    }
    fn div(&self, a: Ball, b: Ball) -> Ball {
        ball_div(a, b)
    }
    fn sqrt(&self, a: Ball) -> Ball {
        ball_sqrt(a)
    }
    fn div_count(&self, x: Ball, n: usize) -> Ball {
        ball_div(x, Ball::exact(n as f64))
    }
    fn unary_fn<'a>(&'a self, op: UnaryOp) -> Box<dyn Fn(Ball) -> Ball + Send + Sync + 'a> {
        match op {
            UnaryOp::Exp => Box::new(ball_exp),
            UnaryOp::Square => Box::new(|x| ball_mul(x, x)),
            UnaryOp::Sqrt => Box::new(ball_sqrt),
            UnaryOp::Rsqrt => Box::new(|x| ball_div(Ball::exact(1.0), ball_sqrt(x))),
            UnaryOp::Neg => Box::new(|x: Ball| Ball { v: -x.v, r: x.r }),
            UnaryOp::MulScalar(s) => Box::new(move |x| ball_mul(x, Ball::exact(s))),
            UnaryOp::AddScalar(s) => Box::new(move |x| ball_add(x, Ball::exact(s))),
            UnaryOp::Relu => Box::new(|x| ball_clamp(x, 0.0, f64::INFINITY)),
            UnaryOp::Clamp { lo, hi } => Box::new(move |x| ball_clamp(x, lo, hi)),
            other => {
                let f = F64.unary_fn(other);
                let (l, k, kx) = lipschitz(other);
                Box::new(move |x: Ball| {
                    lift(
                        &[x],
                        |p| f(p[0]),
                        || {
                            let v = f(x.v);
                            Ball::rounded(v, l * x.r + k * U * v.abs() + kx * U * x.v.abs(), true)
                        },
                    )
                })
            }
        }
    }
    /// The max of the centres with the largest radius: every real max lies within it.
    fn max_of(&self, row: &[Ball]) -> Ball {
        if row.iter().any(|b| b.is_unknown()) {
            return Ball::UNKNOWN;
        }
        if row.iter().any(|b| b.v.is_nan()) {
            return Ball::exact(f64::NAN);
        }
        let v = row.iter().map(|b| b.v).fold(f64::NEG_INFINITY, f64::max);
        let r = row.iter().map(|b| b.r).fold(0.0, f64::max);
        if v.is_finite() || r == 0.0 {
            Ball { v, r }
        } else {
            Ball::UNKNOWN
        }
    }
    fn sub_self(&self, a: Ball) -> Ball {
        if a.is_unknown() {
            Ball::UNKNOWN
        } else if a.v.is_finite() {
            Ball::exact(0.0)
        } else {
            Ball::exact(f64::NAN) // NaN − NaN, ∞ − ∞
        }
    }
    fn sum(&self, n: usize, f: impl Fn(usize) -> Ball) -> Ball {
        ball_dot(n, |i| (f(i), Ball::exact(1.0)))
    }
    fn dot(&self, n: usize, f: impl Fn(usize) -> (Ball, Ball)) -> Ball {
        ball_dot(n, f)
    }
    fn binary(&self, op: BinaryOp, a: Ball, b: Ball) -> Ball {
        match op {
            BinaryOp::Add => ball_add(a, b),
            BinaryOp::Sub => ball_add(a, Ball { v: -b.v, r: b.r }),
            BinaryOp::Mul => ball_mul(a, b),
            BinaryOp::Div => ball_div(a, b),
            BinaryOp::Pow => ball_pow(a, b),
        }
    }
}

/// Evaluate every rank of `graph` in [`BallDomain`] on exact float64 inputs.
pub fn evaluate_balls(
    graph: &KernelGraph,
    inputs: &[Vec<Tensor>],
) -> Result<Vec<Vec<Dense<Ball>>>> {
    let balls = inputs
        .iter()
        .map(|rank| {
            rank.iter()
                .map(|t| Dense {
                    dims: t.dims.clone(),
                    data: t.data.iter().map(|&v| Ball::exact(v)).collect(),
                })
                .collect()
        })
        .collect();
    run_kernel_graph_ranks(&BallDomain, graph, balls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_values() {
        // reference values from high-precision tables
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (4.0, 0.999_999_984_582_742_1),
            (-1.0, -0.842_700_792_949_714_9),
        ];
        for (x, want) in cases {
            assert!(
                (erf(x) - want).abs() < 1e-14,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn unary_values() {
        let d = F64;
        let f = |op: UnaryOp, x: f64| d.unary_fn(op)(x);
        assert_eq!(f(UnaryOp::Square, 3.0), 9.0);
        assert_eq!(f(UnaryOp::Rsqrt, 4.0), 0.5);
        assert_eq!(f(UnaryOp::Relu, -2.0), 0.0);
        assert_eq!(f(UnaryOp::Neg, 2.0), -2.0);
        assert_eq!(f(UnaryOp::MulScalar(0.25), 2.0), 0.5);
        assert_eq!(f(UnaryOp::AddScalar(-0.5), 2.0), 1.5);
        assert_eq!(f(UnaryOp::Clamp { lo: -1.0, hi: 1.0 }, 5.0), 1.0);
        assert_eq!(f(UnaryOp::Sigmoid, 0.0), 0.5);
        assert_eq!(f(UnaryOp::Silu, 0.0), 0.0);
        assert!((f(UnaryOp::Gelu, 1.0) - 0.841_344_746_068_542_9).abs() < 1e-14);
        assert_eq!(f(UnaryOp::Exp, 0.0), 1.0);
        assert_eq!(d.binary(BinaryOp::Pow, 2.0, 3.0), 8.0);
        assert_eq!(d.binary(BinaryOp::Sub, 2.0, 3.0), -1.0);
    }
}
