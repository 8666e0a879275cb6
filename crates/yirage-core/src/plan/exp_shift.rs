//! Overflow safety of kernel-level `exp` ops (library kernels).
//!
//! A library `exp` that feeds a normalising sum or division (a softmax written out, or the
//! score path of attention) overflows once its argument passes ~88 in float32, although the
//! graph's value is finite. The lowering therefore computes such an exp as `exp(x − m)`,
//! with `m` the maximum of `x` over some dims (`shift_dims` in the plan), whenever the factor
//! `exp(−m)` provably cancels before any graph output. That is decided here by propagating,
//! for every tensor, the factor it carries: a monomial `Π exp(−m_e)^d_e`, one term per
//! shifted exp `e`, each with the shape of its `m` (the exp's dims with the shift dims set
//! to 1), which must broadcast consistently through every op. Outputs must carry no factor.
//! One dim is tried at a time, the last first (a row max keeps the most precision), then the
//! maximum over the whole tensor.
//!
//! An exp that cannot be shifted but whose value reaches a generated kernel makes the
//! candidate overflow-unsafe ([`unsafe_exp_into_kernel`]); the search does not offer it.

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::kernel_graph::{KernelGraph, KernelOpKind, TensorId};
use crate::ops::{BinaryOp, UnaryOp};
use crate::plan::safe_softmax_groups;
use std::collections::BTreeMap;

/// The factor a tensor carries: shifted exp op index → (degree, shape of its `m`).
/// Empty = unscaled. `None` in the propagation = not a monomial (the shift cannot be undone).
type Factor = BTreeMap<usize, (i32, Vec<usize>)>;

/// Shift dims per kernel op index, for the library `exp` ops that get a shift.
pub fn exp_shifts(g: &KernelGraph) -> BTreeMap<usize, Vec<usize>> {
    let mut accepted: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, op) in g.ops().iter().enumerate() {
        if !is_exp(&op.kind) {
            continue;
        }
        let rank = g.tensors()[op.outs[0]].dims.len();
        let choices = (0..rank)
            .rev()
            .map(|d| vec![d])
            .chain([(0..rank).collect()]);
        for dims in choices {
            let mut trial = accepted.clone();
            trial.insert(i, dims);
            if cancels(g, &trial) {
                accepted = trial;
                break;
            }
        }
    }
    accepted
}

/// True when an unshifted exp value leaves one kernel for another, where it can overflow
/// although the graph's value is finite: a library `exp` without a shift that reaches (through
/// library ops) a generated kernel (`exp ; custom[sum] ; div`), or a generated kernel's output
/// computed from an exp outside any running-max group (an exp after the loop) that any further
/// kernel reads. Such candidates are not offered; a graph output may still carry one (the
/// overflow is then the graph's own).
pub fn unsafe_exp_into_kernel(g: &KernelGraph, shifts: &BTreeMap<usize, Vec<usize>>) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Raw {
        No,
        Library,
        Kernel,
    }
    let mut raw = vec![Raw::No; g.num_tensors()];
    for (i, op) in g.ops().iter().enumerate() {
        let operands = op.kind.operands();
        let read = |r: Raw| operands.iter().any(|&t| raw[t] == r);
        let fused = matches!(op.kind, KernelOpKind::Customized { .. });
        if read(Raw::Kernel) || (fused && read(Raw::Library)) {
            return true;
        }
        if let KernelOpKind::Customized { graph, .. } = &op.kind {
            for (k, unshifted) in outputs_with_raw_exp(graph).into_iter().enumerate() {
                if unshifted {
                    raw[op.outs[k]] = Raw::Kernel;
                }
            }
        } else if read(Raw::Library) || (is_exp(&op.kind) && !shifts.contains_key(&i)) {
            for &t in &op.outs {
                raw[t] = Raw::Library;
            }
        }
    }
    false
}

/// Per block output: whether it is computed from an exp that no safe-softmax group covers.
fn outputs_with_raw_exp(bg: &BlockGraph) -> Vec<bool> {
    let covered: Vec<usize> = safe_softmax_groups(bg)
        .map(|gs| gs.iter().map(|g| g.exp).collect())
        .unwrap_or_default();
    let ops = bg.ops();
    let mut raw = vec![false; ops.len()];
    for (i, op) in ops.iter().enumerate() {
        let exp = matches!(
            op,
            BlockOpKind::Unary {
                op: UnaryOp::Exp,
                ..
            }
        );
        raw[i] = (exp && !covered.contains(&i)) || op.operands().iter().any(|&t| raw[t]);
    }
    bg.outputs().iter().map(|o| raw[o.tile]).collect()
}

fn is_exp(kind: &KernelOpKind) -> bool {
    matches!(
        kind,
        KernelOpKind::Unary {
            op: UnaryOp::Exp,
            ..
        }
    )
}

/// Whether shifting every exp in `shifts` over its dims leaves every graph output unscaled.
fn cancels(g: &KernelGraph, shifts: &BTreeMap<usize, Vec<usize>>) -> bool {
    let mut factor: Vec<Option<Factor>> = vec![Some(Factor::new()); g.num_tensors()];
    for (i, op) in g.ops().iter().enumerate() {
        let f = |t: TensorId| factor[t].clone();
        let out = if let Some(dims) = shifts.get(&i) {
            let mut shape = g.tensors()[op.outs[0]].dims.to_vec();
            for &d in dims {
                shape[d] = 1;
            }
            let KernelOpKind::Unary { x, .. } = op.kind else {
                return false;
            };
            f(x).filter(Factor::is_empty)
                .map(|_| Factor::from([(i, (1, shape))]))
        } else {
            propagate(g, &op.kind, &f)
        };
        for &t in &op.outs {
            factor[t] = out.clone();
        }
    }
    factor.iter().all(Option::is_some)
        && g.outputs()
            .iter()
            .all(|&t| factor[t].as_ref().is_some_and(Factor::is_empty))
}

fn propagate(
    g: &KernelGraph,
    kind: &KernelOpKind,
    f: &dyn Fn(TensorId) -> Option<Factor>,
) -> Option<Factor> {
    match kind {
        KernelOpKind::Input { .. } => Some(Factor::new()),
        KernelOpKind::Unary { op, x } => {
            let fx = f(*x)?;
            match op {
                UnaryOp::Neg | UnaryOp::MulScalar(_) => Some(fx),
                _ => fx.is_empty().then_some(fx),
            }
        }
        KernelOpKind::Binary { op, a, b } => {
            let (fa, fb) = (f(*a)?, f(*b)?);
            match op {
                BinaryOp::Mul => combine(fa, fb, 1),
                BinaryOp::Div => combine(fa, fb, -1),
                BinaryOp::Add | BinaryOp::Sub => (fa == fb).then_some(fa),
                BinaryOp::Pow => (fa.is_empty() && fb.is_empty()).then_some(fa),
            }
        }
        KernelOpKind::Reduction { x, dim } => {
            let fx = f(*x)?;
            fx.values().all(|(_, s)| s[*dim] == 1).then_some(fx)
        }
        KernelOpKind::Matmul { a, b } => {
            let (fa, fb) = (f(*a)?, f(*b)?);
            let rank = g.tensors()[*a].dims.len();
            let mut out = Factor::new();
            for (e, (d, s)) in fa {
                if s[rank - 1] != 1 || fb.contains_key(&e) {
                    return None; // the factor varies along the contracted dim
                }
                out.insert(e, (d, s)); // [.., rows, 1]: stays per row of the product
            }
            for (e, (d, mut s)) in fb {
                if s[rank - 2] != 1 {
                    return None;
                }
                s[rank - 2] = 1;
                out.insert(e, (d, s)); // [.., 1, cols]
            }
            Some(out)
        }
        other => other
            .operands()
            .iter()
            .all(|&t| f(t).is_some_and(|x| x.is_empty()))
            .then(Factor::new),
    }
}

/// `fa · fb^sign` when the shared exps have equal shapes.
fn combine(mut fa: Factor, fb: Factor, sign: i32) -> Option<Factor> {
    for (e, (d, s)) in fb {
        match fa.remove(&e) {
            Some((da, sa)) => {
                if sa != s {
                    return None;
                }
                if da + sign * d != 0 {
                    fa.insert(e, (da + sign * d, sa));
                }
            }
            None => {
                fa.insert(e, (sign * d, s));
            }
        }
    }
    Some(fa)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::DeviceSpec;
    use crate::dtype::DType;
    use crate::ops::AccumKind;
    use crate::plan::{lower, lower_candidate, PlanKernel};

    fn softmax_by_hand(dims: &[i64], dim: i64) -> KernelGraph {
        let mut g = KernelGraph::new();
        let x = g.new_input(dims, DType::F32).unwrap();
        let e = g.unary(UnaryOp::Exp, x).unwrap();
        let s = g.reduction(e, dim).unwrap();
        let o = g.binary(BinaryOp::Div, e, s).unwrap();
        g.mark_output(o).unwrap();
        g
    }

    #[test]
    fn softmax_written_out_is_shifted_along_its_sum() {
        let g = softmax_by_hand(&[4, 8], 1);
        assert_eq!(exp_shifts(&g), BTreeMap::from([(1, vec![1])]));
        let g = softmax_by_hand(&[4, 8], 0);
        assert_eq!(exp_shifts(&g), BTreeMap::from([(1, vec![0])]));
    }

    #[test]
    fn attention_scores_are_shifted_per_query_row() {
        let mut g = KernelGraph::new();
        let q = g.new_input(&[2, 4, 8], DType::F16).unwrap();
        let k = g.new_input(&[2, 8, 16], DType::F16).unwrap();
        let v = g.new_input(&[2, 16, 8], DType::F16).unwrap();
        let s = g.matmul(q, k).unwrap();
        let e = g.unary(UnaryOp::Exp, s).unwrap();
        let n = g.matmul(e, v).unwrap();
        let d = g.reduction(e, 2).unwrap();
        let o = g.binary(BinaryOp::Div, n, d).unwrap();
        g.mark_output(o).unwrap();
        let shifts = exp_shifts(&g);
        assert_eq!(shifts, BTreeMap::from([(4, vec![2])]));
        assert!(!unsafe_exp_into_kernel(&g, &shifts));
    }

    #[test]
    fn a_total_over_all_rows_is_shifted_by_the_global_max() {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[4, 8], DType::F32).unwrap();
        let e = g.unary(UnaryOp::Exp, x).unwrap();
        let s = g.reduction(e, 0).unwrap();
        let t = g.reduction(s, 1).unwrap();
        let o = g.binary(BinaryOp::Div, e, t).unwrap();
        g.mark_output(o).unwrap();
        assert_eq!(exp_shifts(&g), BTreeMap::from([(1, vec![0, 1])]));
    }

    #[test]
    fn an_exp_whose_factor_reaches_an_output_is_left_alone() {
        // exp(x) @ w: the output would carry exp(-m); nothing normalises it
        let mut g = KernelGraph::new();
        let x = g.new_input(&[4, 8], DType::F32).unwrap();
        let w = g.new_input(&[8, 3], DType::F32).unwrap();
        let e = g.unary(UnaryOp::Exp, x).unwrap();
        let o = g.matmul(e, w).unwrap();
        g.mark_output(o).unwrap();
        assert!(exp_shifts(&g).is_empty());
        // a factor that differs between the two operands of an add does not cancel
        let mut g = KernelGraph::new();
        let x = g.new_input(&[4, 8], DType::F32).unwrap();
        let e = g.unary(UnaryOp::Exp, x).unwrap();
        let s = g.reduction(e, 1).unwrap();
        let a = g.binary(BinaryOp::Add, e, x).unwrap();
        let o = g.binary(BinaryOp::Div, a, s).unwrap();
        g.mark_output(o).unwrap();
        assert!(exp_shifts(&g).is_empty());
    }

    /// `exp ; custom[row sums] ; div`: the exp's unshifted value enters a generated kernel.
    fn exp_then_fused_sum() -> KernelGraph {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let e = g.unary(UnaryOp::Exp, x).unwrap();
        let mut bg = BlockGraph::new([8, 1, 1], [128, 1, 1], 4, 1).unwrap();
        let te = bg.new_input(&[8, 64], DType::F32, [0, -1, -1], 1).unwrap();
        let acc = bg.forloop_accum(te, AccumKind::Sum).unwrap();
        bg.new_output(acc, [0, -1, -1]).unwrap();
        let s = g.customized(&[e], &bg).unwrap();
        let o = g.binary(BinaryOp::Div, e, s[0]).unwrap();
        g.mark_output(o).unwrap();
        g
    }

    #[test]
    fn a_candidate_feeding_an_unshifted_exp_into_a_kernel_is_not_offered() {
        let g = exp_then_fused_sum();
        assert!(exp_shifts(&g).is_empty());
        assert!(unsafe_exp_into_kernel(&g, &exp_shifts(&g)));
        let spec = DeviceSpec::cpu2();
        assert!(lower(&g, &spec).is_ok()); // a user's own graph still lowers
        let err = lower_candidate(&g, &spec).unwrap_err().to_string();
        assert!(err.contains("overflow-unsafe"), "{err}");
    }

    #[test]
    fn the_plan_carries_the_shift_dims_of_library_exps() {
        let g = softmax_by_hand(&[4, 8], 1);
        let plan = lower_candidate(&g, &DeviceSpec::cpu2()).unwrap();
        let PlanKernel::Library(exp) = &plan.kernels[0] else {
            panic!("expected a library exp first");
        };
        assert_eq!(exp.params["op"], "exp");
        assert_eq!(exp.params["shift_dims"], serde_json::json!([1]));
        assert!(plan.kernels[1..].iter().all(|k| match k {
            PlanKernel::Library(l) => l.params.get("shift_dims").is_none(),
            PlanKernel::Generated(_) => true,
        }));
    }

    #[test]
    fn a_kernel_output_from_an_exp_after_the_loop_may_not_feed_another_kernel() {
        // custom[accum x ; exp] then a library row sum and div: the exp leaves unshifted
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let mut bg = BlockGraph::new([8, 1, 1], [128, 1, 1], 1, 1).unwrap();
        let tx = bg.new_input(&[8, 64], DType::F32, [0, -1, -1], -1).unwrap();
        let acc = bg.forloop_accum(tx, AccumKind::Iter).unwrap();
        let e = bg.unary(UnaryOp::Exp, acc).unwrap();
        bg.new_output(e, [0, -1, -1]).unwrap();
        let out = g.customized(&[x], &bg).unwrap();
        let s = g.reduction(out[0], 1).unwrap();
        let o = g.binary(BinaryOp::Div, out[0], s).unwrap();
        g.mark_output(o).unwrap();
        assert!(unsafe_exp_into_kernel(&g, &exp_shifts(&g)));
        // the same kernel whose exp is the graph's output is fine
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let out = g.customized(&[x], &bg).unwrap();
        g.mark_output(out[0]).unwrap();
        assert!(!unsafe_exp_into_kernel(&g, &exp_shifts(&g)));
    }
}
