//! Whether a masked loop's padding stays out of the values a block computes.
//!
//! The last iteration of a masked loop ([`BlockGraph::loop_extent`]) reads zeros past the
//! walked dim's extent. A sum over that dim is then exact (it gains only zeros); an op that
//! maps zero elsewhere (a sigmoid, adding a scalar) turns the padding into values that a
//! later sum over the dim would add in. An `exp` is the exception the IR defines: its padded
//! elements are zero (the padding is absent, as if it were −∞), so a softmax over a dim no
//! tile divides stays exact; printers fill −∞ there before the exp and its group's max
//! ([`masked_exps`]). [`padding_stays_out`] follows the padded elements op by op — which
//! dims carry them and whether they are still zero — and answers whether any reaches a real
//! element. The search asks it before building a masked-loop candidate, so one that
//! verification would reject costs no fingerprint; verification stays the judge of
//! equivalence.

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::ops::{AccumKind, BinaryOp, UnaryOp};

/// Padded elements of a tile: the dims that carry them (bit i = the i-th dim from the
/// right, so broadcasting aligns the masks) and whether all of them are zero.
#[derive(Clone, Copy)]
struct Pad {
    dims: u32,
    zero: bool,
}

impl Pad {
    const CLEAN: Pad = Pad {
        dims: 0,
        zero: true,
    };

    fn any(self) -> bool {
        self.dims != 0
    }

    fn has(self, bit: u32) -> bool {
        self.dims & (1 << bit) != 0
    }

    /// Whether every padded element along `bit` is zero.
    fn zero_along(self, bit: u32) -> bool {
        self.has(bit) && self.zero
    }
}

/// Whether `op` maps zero to zero.
fn keeps_zero(op: UnaryOp) -> bool {
    match op {
        UnaryOp::Square
        | UnaryOp::Sqrt
        | UnaryOp::Silu
        | UnaryOp::Gelu
        | UnaryOp::Relu
        | UnaryOp::Tanh
        | UnaryOp::Neg
        | UnaryOp::MulScalar(_) => true,
        UnaryOp::AddScalar(c) => c == 0.0,
        UnaryOp::Clamp { lo, hi } => lo <= 0.0 && 0.0 <= hi,
        UnaryOp::Exp | UnaryOp::Rsqrt | UnaryOp::Sigmoid => false,
    }
}

/// The padded elements of every tile of `bg` (op order), and whether padding reaches a real
/// element (an op past that point is still followed, its padding then counted non-zero);
/// all clean for a graph without a masked loop.
fn pads(bg: &BlockGraph) -> (Vec<Pad>, bool) {
    if bg.loop_extent().is_none() {
        return (vec![Pad::CLEAN; bg.ops().len()], false);
    }
    let tiles = bg.tiles();
    let mut leak = false;
    let mut pads: Vec<Pad> = Vec::with_capacity(tiles.len());
    for (i, op) in bg.ops().iter().enumerate() {
        let rank = tiles[i].dims.len() as u32;
        let pad = match op {
            BlockOpKind::Input { fmap, .. } => {
                if *fmap >= 0 {
                    Pad {
                        dims: 1 << (rank - 1 - *fmap as u32),
                        zero: true,
                    }
                } else {
                    Pad::CLEAN
                }
            }
            BlockOpKind::Matmul { a, b } => {
                // a: [.., m, k], b: [.., k, n] (bits: k = 0 and m = 1 of a, n = 0 and k = 1 of b)
                let (pa, pb) = (pads[*a], pads[*b]);
                if (pa.has(0) || pb.has(1)) && !(pa.zero_along(0) || pb.zero_along(1)) {
                    leak = true; // padding summed into every output element
                }
                let batch = (pa.dims | pb.dims) & !0b11;
                let dims = batch | (pa.dims & 0b10) | (pb.dims & 0b1);
                let from_a = pa.dims & !0b1 & dims;
                let from_b = (pb.dims & !0b10) & dims;
                let zero = (0..rank).filter(|&d| dims & (1 << d) != 0).all(|d| {
                    (from_a & (1 << d) != 0 && pa.zero) || (from_b & (1 << d) != 0 && pb.zero)
                });
                Pad { dims, zero }
            }
            BlockOpKind::Unary {
                op: UnaryOp::Exp,
                x,
            } if pads[*x].any() => {
                // exp of padding is zero (printers fill −∞ before it): along one dim only,
                // which printers mask by the loop's running index; along more, exp(0) = 1
                let p = pads[*x];
                let one = p.dims.count_ones() == 1;
                leak |= !one;
                Pad {
                    dims: p.dims,
                    zero: one,
                }
            }
            BlockOpKind::Unary { op, x } => {
                let p = pads[*x];
                Pad {
                    dims: p.dims,
                    zero: p.zero && keeps_zero(*op),
                }
            }
            BlockOpKind::Binary { op, a, b } => {
                let (pa, pb) = (pads[*a], pads[*b]);
                let dims = pa.dims | pb.dims;
                let zero = match op {
                    // 0 · x = 0 wherever one factor is padded with zeros
                    BinaryOp::Mul => (0..rank)
                        .filter(|&d| dims & (1 << d) != 0)
                        .all(|d| pa.zero_along(d) || pb.zero_along(d)),
                    // 0 ± 0 = 0 only where both are padded with zeros
                    BinaryOp::Add | BinaryOp::Sub => {
                        pa.dims == dims && pb.dims == dims && pa.zero && pb.zero
                    }
                    // 0 / x = 0 for a divisor without padding (0 / 0 is not)
                    BinaryOp::Div => pa.dims == dims && pa.zero && !pb.any(),
                    BinaryOp::Pow => !pa.any() && !pb.any(),
                };
                Pad { dims, zero }
            }
            BlockOpKind::Reduction { x, dim } | BlockOpKind::ReductionToDimx { x, dim } => {
                let p = pads[*x];
                let bit = rank - 1 - *dim as u32;
                leak |= p.has(bit) && !p.zero;
                Pad {
                    dims: p.dims & !(1 << bit),
                    zero: p.zero,
                }
            }
            BlockOpKind::RmsNorm { x, .. } => {
                let p = pads[*x];
                leak |= p.has(0); // the norm's mean would count the padding
                p
            }
            BlockOpKind::Concat { xs, .. } => {
                leak |= xs.iter().any(|&x| pads[x].any());
                Pad::CLEAN
            }
            BlockOpKind::ForloopAccum { x, kind } => {
                // iterations are summed: padding of the last one adds in unless it is zero
                let p = pads[*x];
                leak |= p.any() && !p.zero;
                // rms_count covers padding along the last dim only
                leak |= matches!(kind, AccumKind::Rms { .. }) && p.any() && !p.has(0);
                Pad::CLEAN
            }
        };
        pads.push(pad);
    }
    (pads, leak)
}

/// Whether no padded element of `bg`'s masked loop reaches a real element of a tile or an
/// output (true for a graph without a masked loop).
pub fn padding_stays_out(bg: &BlockGraph) -> bool {
    let (pads, leak) = pads(bg);
    stays_out(bg, &pads, leak)
}

/// [`padding_stays_out`] from [`pads`]' result.
fn stays_out(bg: &BlockGraph, pads: &[Pad], leak: bool) -> bool {
    !leak && bg.outputs().iter().all(|o| !pads[o.tile].any())
}

/// The exps of `bg` whose input carries the masked loop's padding along one dim, as (op
/// index, tile dim): the dim's elements at or past the loop's extent (iteration `i` holds
/// elements `i·t ..`, `t` the dim's size) are padding, which the exp maps to zero. Empty
/// without a masked loop.
pub fn masked_exps(bg: &BlockGraph) -> Vec<(usize, usize)> {
    let (pads, _) = pads(bg);
    let tiles = bg.tiles();
    bg.ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            BlockOpKind::Unary {
                op: UnaryOp::Exp,
                x,
            } if pads[*x].dims.count_ones() == 1 => {
                let rank = tiles[i].dims.len() as u32;
                Some((i, (rank - 1 - pads[*x].dims.trailing_zeros()) as usize))
            }
            _ => None,
        })
        .collect()
}

/// The divisors of `bg` that carry the masked loop's padding, as (op index, operand op,
/// tile dims the padding runs along): the divisor of a `div`, the argument of an `rsqrt`.
/// Padding past a zero-padded load is 0 there, and 0⁻¹ is what the field cannot model, so
/// the executor divides the padding by 1 instead (see `exec`). Only where the padding
/// provably stays out of every real element ([`padding_stays_out`]): the quotient's padded
/// elements are then never read, whatever they hold. Empty without a masked loop.
pub fn padded_divisors(bg: &BlockGraph) -> Vec<(usize, usize, Vec<usize>)> {
    let (pads, leak) = pads(bg);
    if !stays_out(bg, &pads, leak) {
        return vec![];
    }
    let tiles = bg.tiles();
    bg.ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| {
            let x = match op {
                BlockOpKind::Binary {
                    op: BinaryOp::Div,
                    b,
                    ..
                } => *b,
                BlockOpKind::Unary {
                    op: UnaryOp::Rsqrt,
                    x,
                } => *x,
                _ => return None,
            };
            let rank = tiles[x].dims.len() as u32;
            let dims: Vec<usize> = (0..rank)
                .filter(|&bit| pads[x].has(bit))
                .map(|bit| (rank - 1 - bit) as usize)
                .collect();
            (!dims.is_empty()).then_some((i, x, dims))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// `rms_norm(x) · w` over a loop of `f` on hidden `k`, computed as the fused kernel does
    /// (x·w accumulated, divided by the rms accumulator after the loop), with `pre` applied
    /// to the x tile first.
    fn rms_linear(k: i64, f: i64, pre: Option<UnaryOp>) -> BlockGraph {
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], f, 1).unwrap();
        let x = b.new_input(&[8, k], DType::F32, [-1; 3], 1).unwrap();
        let w = b.new_input(&[k, 64], DType::F32, [-1; 3], 0).unwrap();
        let x = match pre {
            Some(op) => b.unary(op, x).unwrap(),
            None => x,
        };
        let p = b.matmul(x, w).unwrap();
        let acc = b.forloop_accum(p, AccumKind::Iter).unwrap();
        let rms = b.forloop_accum(x, AccumKind::Rms { eps: 1e-6 }).unwrap();
        let out = b.binary(BinaryOp::Div, acc, rms).unwrap();
        b.new_output(out, [-1; 3]).unwrap();
        b
    }

    #[test]
    fn sums_of_zero_padding_stay_exact() {
        let g = rms_linear(4099, 65, None);
        assert_eq!(g.loop_extent(), Some(4099));
        assert!(padding_stays_out(&g));
        assert!(padding_stays_out(&rms_linear(
            4099,
            65,
            Some(UnaryOp::Silu)
        )));
        // a divisible loop has no padding
        assert_eq!(rms_linear(4096, 64, Some(UnaryOp::Exp)).loop_extent(), None);
        assert!(padding_stays_out(&rms_linear(4096, 64, Some(UnaryOp::Exp))));
    }

    #[test]
    fn exp_of_padding_is_zero_along_the_walked_dim() {
        let g = rms_linear(4099, 65, Some(UnaryOp::Exp));
        assert!(padding_stays_out(&g));
        // the exp is op 2 (after x and w); its tile [8, 64] is padded along dim 1
        assert_eq!(masked_exps(&g), vec![(2, 1)]);
        assert!(masked_exps(&rms_linear(4099, 65, Some(UnaryOp::Sigmoid))).is_empty());
        assert!(masked_exps(&rms_linear(4096, 64, Some(UnaryOp::Exp))).is_empty());
    }

    #[test]
    fn exp_of_padding_along_two_dims_is_refused() {
        // x·xᵀ over a walked dim of x carries padding along both dims of the square
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], 65, 1).unwrap();
        let x = b.new_input(&[4099, 8], DType::F32, [-1; 3], 0).unwrap();
        let xt = b.new_input(&[8, 4099], DType::F32, [-1; 3], 1).unwrap();
        let sq = b.matmul(x, xt).unwrap();
        let e = b.unary(UnaryOp::Exp, sq).unwrap();
        let s = b.reduction(e, 1).unwrap();
        let s = b.reduction(s, 0).unwrap();
        let acc = b.forloop_accum(s, AccumKind::Iter).unwrap();
        b.new_output(acc, [-1; 3]).unwrap();
        assert!(!padding_stays_out(&b));
        assert!(masked_exps(&b).is_empty());
    }

    #[test]
    fn padding_an_op_turns_nonzero_is_refused() {
        for op in [
            UnaryOp::Sigmoid,
            UnaryOp::AddScalar(1.0),
            UnaryOp::Clamp { lo: 1.0, hi: 2.0 },
        ] {
            assert!(
                !padding_stays_out(&rms_linear(4099, 65, Some(op))),
                "{op:?}"
            );
        }
    }

    /// The row sums of `op(x, c)`, `x[8,4099]` walked by a masked loop of 65 and `c[8,1]`
    /// loaded once (no padding).
    fn sum_of(op: BinaryOp) -> BlockGraph {
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], 65, 1).unwrap();
        let x = b.new_input(&[8, 4099], DType::F32, [-1; 3], 1).unwrap();
        let c = b.new_input(&[8, 1], DType::F32, [-1; 3], -1).unwrap();
        let y = b.binary(op, x, c).unwrap();
        let s = b.reduction(y, 1).unwrap();
        let acc = b.forloop_accum(s, AccumKind::Iter).unwrap();
        b.new_output(acc, [-1; 3]).unwrap();
        b
    }

    #[test]
    fn adding_an_unpadded_operand_to_padding_is_refused() {
        assert!(!padding_stays_out(&sum_of(BinaryOp::Add)));
        // a product keeps the padding zero; a quotient by the unpadded operand too
        assert!(padding_stays_out(&sum_of(BinaryOp::Mul)));
        assert!(padding_stays_out(&sum_of(BinaryOp::Div)));
    }

    #[test]
    fn padded_divisors_only_where_the_padding_stays_out() {
        // x / c: the divisor carries no padding
        assert!(padded_divisors(&sum_of(BinaryOp::Div)).is_empty());
        // c / x summed over the walked dim: 0⁻¹ of the padding would reach every row sum
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], 65, 1).unwrap();
        let x = b.new_input(&[8, 4099], DType::F32, [-1; 3], 1).unwrap();
        let c = b.new_input(&[8, 1], DType::F32, [-1; 3], -1).unwrap();
        let q = b.binary(BinaryOp::Div, c, x).unwrap();
        let s = b.reduction(q, 1).unwrap();
        let acc = b.forloop_accum(s, AccumKind::Iter).unwrap();
        b.new_output(acc, [-1; 3]).unwrap();
        assert!(!padding_stays_out(&b));
        assert!(padded_divisors(&b).is_empty());
        // c / x under an exp that masks it: the padded quotients are never read
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], 65, 1).unwrap();
        let x = b.new_input(&[8, 4099], DType::F32, [-1; 3], 1).unwrap();
        let c = b.new_input(&[8, 1], DType::F32, [-1; 3], -1).unwrap();
        let q = b.binary(BinaryOp::Div, c, x).unwrap();
        let e = b.unary(UnaryOp::Exp, q).unwrap();
        let s = b.reduction(e, 1).unwrap();
        let acc = b.forloop_accum(s, AccumKind::Iter).unwrap();
        b.new_output(acc, [-1; 3]).unwrap();
        assert!(padding_stays_out(&b));
        assert_eq!(padded_divisors(&b), vec![(q, x, vec![1])]);
    }
}
