//! Operator vocabularies shared by the kernel and the thread-block level.
//!
//! Names and parameter lists here are the ones used by the Python API and the canonical
//! JSON, so parsing and printing live next to the enums.

use crate::error::{graph_err, Result};

/// Elementwise unary operators.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    Exp,
    Square,
    Sqrt,
    Rsqrt,
    Silu,
    Gelu,
    Relu,
    Sigmoid,
    Tanh,
    Neg,
    /// Multiply by a finite scalar.
    MulScalar(f64),
    /// Add a finite scalar (subtracting `c` is adding `-c`).
    AddScalar(f64),
    /// Clamp into `[lo, hi]` (finite, `lo <= hi`).
    Clamp {
        lo: f64,
        hi: f64,
    },
}

fn check_finite(what: &str, v: f64) -> Result<f64> {
    if v.is_finite() {
        Ok(v)
    } else {
        graph_err(format!("{what}: parameter {v} must be a finite number"))
    }
}

impl UnaryOp {
    /// API / JSON name.
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Exp => "exp",
            UnaryOp::Square => "square",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Silu => "silu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Neg => "neg",
            UnaryOp::MulScalar(_) => "mul_scalar",
            UnaryOp::AddScalar(_) => "add_scalar",
            UnaryOp::Clamp { .. } => "clamp",
        }
    }

    /// Parameters in API order (empty for parameterless ops).
    pub fn params(&self) -> Vec<f64> {
        match *self {
            UnaryOp::MulScalar(s) | UnaryOp::AddScalar(s) => vec![s],
            UnaryOp::Clamp { lo, hi } => vec![lo, hi],
            _ => vec![],
        }
    }

    /// Build from an API name and parameter list, validating the parameters.
    pub fn parse(name: &str, params: &[f64]) -> Result<UnaryOp> {
        let plain = |op: UnaryOp| {
            if params.is_empty() {
                Ok(op)
            } else {
                graph_err(format!(
                    "unary op {name:?} takes no parameters, got {params:?}"
                ))
            }
        };
        match name {
            "exp" => plain(UnaryOp::Exp),
            "square" => plain(UnaryOp::Square),
            "sqrt" => plain(UnaryOp::Sqrt),
            "rsqrt" => plain(UnaryOp::Rsqrt),
            "silu" => plain(UnaryOp::Silu),
            "gelu" => plain(UnaryOp::Gelu),
            "relu" => plain(UnaryOp::Relu),
            "sigmoid" => plain(UnaryOp::Sigmoid),
            "tanh" => plain(UnaryOp::Tanh),
            "neg" => plain(UnaryOp::Neg),
            "mul_scalar" => match params {
                [s] => Ok(UnaryOp::MulScalar(check_finite("mul_scalar", *s)?)),
                _ => graph_err(format!(
                    "unary op \"mul_scalar\" takes params=(scalar,), got {params:?}"
                )),
            },
            "add_scalar" => match params {
                [s] => Ok(UnaryOp::AddScalar(check_finite("add_scalar", *s)?)),
                _ => graph_err(format!(
                    "unary op \"add_scalar\" takes params=(scalar,), got {params:?}"
                )),
            },
            "clamp" => match params {
                [lo, hi] => {
                    let (lo, hi) = (check_finite("clamp", *lo)?, check_finite("clamp", *hi)?);
                    if lo > hi {
                        return graph_err(format!("clamp: lo ({lo}) must be ≤ hi ({hi})"));
                    }
                    Ok(UnaryOp::Clamp { lo, hi })
                }
                _ => graph_err(format!(
                    "unary op \"clamp\" takes params=(lo, hi), got {params:?}"
                )),
            },
            other => graph_err(format!(
                "unknown unary op {other:?}; expected one of exp, square, sqrt, rsqrt, silu, gelu, relu, sigmoid, tanh, neg, mul_scalar, add_scalar, clamp"
            )),
        }
    }
}

/// Elementwise binary operators (size-1 broadcasting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
}

impl BinaryOp {
    /// API / JSON name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
        }
    }

    /// Parse an API name.
    pub fn parse(name: &str) -> Result<BinaryOp> {
        match name {
            "add" => Ok(BinaryOp::Add),
            "sub" => Ok(BinaryOp::Sub),
            "mul" => Ok(BinaryOp::Mul),
            "div" => Ok(BinaryOp::Div),
            "pow" => Ok(BinaryOp::Pow),
            other => graph_err(format!(
                "unknown binary op {other:?}; expected one of add, sub, mul, div, pow"
            )),
        }
    }
}

/// For-loop accumulator kinds of the thread-block level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AccumKind {
    /// Sum over iterations; dims unchanged. (API name: `None`.)
    Iter,
    /// Sum over the last dim and iterations; last dim becomes 1.
    Sum,
    /// `sqrt(sum over last dim and iterations of x² / (last_dim·forloop_range) + eps)`;
    /// last dim becomes 1.
    Rms { eps: f64 },
    /// Sum over iterations, last dim summed in strided groups (out[j] = Σ_g x[g·dimx + j]) down to `reduction_dimx`.
    SumToDimx,
}

impl AccumKind {
    /// API / JSON name (`None` for [`AccumKind::Iter`]).
    pub fn name(self) -> Option<&'static str> {
        match self {
            AccumKind::Iter => None,
            AccumKind::Sum => Some("sum"),
            AccumKind::Rms { .. } => Some("rms"),
            AccumKind::SumToDimx => Some("sum_todimx"),
        }
    }

    /// The eps of an rms accumulator, 0 otherwise.
    pub fn eps(self) -> f64 {
        match self {
            AccumKind::Rms { eps } => eps,
            _ => 0.0,
        }
    }

    /// Parse an API name; `eps` is only used by `"rms"` (ignored otherwise).
    pub fn parse(name: Option<&str>, eps: f64) -> Result<AccumKind> {
        match name {
            None | Some("iter") => Ok(AccumKind::Iter),
            Some("sum") => Ok(AccumKind::Sum),
            Some("rms") => Ok(AccumKind::Rms {
                eps: check_eps("forloop_accum(rms)", eps)?,
            }),
            Some("sum_todimx") => Ok(AccumKind::SumToDimx),
            Some(other) => graph_err(format!(
                "unknown accumulator {other:?}; expected None, \"sum\", \"rms\" or \"sum_todimx\""
            )),
        }
    }
}

/// Validate an epsilon: finite and ≥ 0.
pub fn check_eps(what: &str, eps: f64) -> Result<f64> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(eps)
    } else {
        graph_err(format!("{what}: eps ({eps}) must be a finite number ≥ 0"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trip() {
        for (n, p) in [
            ("exp", vec![]),
            ("gelu", vec![]),
            ("mul_scalar", vec![0.5]),
            ("add_scalar", vec![1e-5]),
            ("clamp", vec![-1.0, 2.0]),
        ] {
            let op = UnaryOp::parse(n, &p).unwrap();
            assert_eq!(op.name(), n);
            assert_eq!(op.params(), p);
        }
        assert!(UnaryOp::parse("exp", &[1.0]).is_err());
        assert!(UnaryOp::parse("mul_scalar", &[f64::NAN]).is_err());
        assert!(UnaryOp::parse("add_scalar", &[f64::INFINITY]).is_err());
        assert!(UnaryOp::parse("add_scalar", &[]).is_err());
        assert!(UnaryOp::parse("clamp", &[2.0, 1.0]).is_err());
        assert!(UnaryOp::parse("cos", &[]).is_err());
        assert_eq!(BinaryOp::parse("pow").unwrap(), BinaryOp::Pow);
        assert!(BinaryOp::parse("max").is_err());
        assert_eq!(AccumKind::parse(None, 0.0).unwrap(), AccumKind::Iter);
        assert_eq!(
            AccumKind::parse(Some("rms"), 1e-6).unwrap(),
            AccumKind::Rms { eps: 1e-6 }
        );
        assert!(AccumKind::parse(Some("rms"), -1.0).is_err());
        assert!(AccumKind::parse(Some("max"), 0.0).is_err());
    }
}
