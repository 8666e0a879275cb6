//! Reference evaluator: float64 semantics of every op.
//!
//! Used to check generated kernels numerically and to validate customized ops (the block
//! graph is executed with its real mapping, see [`crate::exec`]). Definitions:
//! silu x·σ(x); gelu the exact erf form x·½(1+erf(x/√2)) (PyTorch's default);
//! sigmoid 1/(1+e^-x); rsqrt 1/√x; clamp min(max(x, lo), hi); pow powf.

use crate::dense::Tensor;
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
        assert_eq!(f(UnaryOp::Clamp { lo: -1.0, hi: 1.0 }, 5.0), 1.0);
        assert_eq!(f(UnaryOp::Sigmoid, 0.0), 0.5);
        assert_eq!(f(UnaryOp::Silu, 0.0), 0.0);
        assert!((f(UnaryOp::Gelu, 1.0) - 0.841_344_746_068_542_9).abs() < 1e-14);
        assert_eq!(f(UnaryOp::Exp, 0.0), 1.0);
        assert_eq!(d.binary(BinaryOp::Pow, 2.0, 3.0), 8.0);
        assert_eq!(d.binary(BinaryOp::Sub, 2.0, 3.0), -1.0);
    }
}
