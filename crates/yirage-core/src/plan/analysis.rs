//! The analyses a plan carries for its printers (docs/kernel-plan.md, version 3), made once
//! here on the lowered kernel so no printer repeats them:
//!
//! * **hoisting** is the lowering's phase rule itself: a load that does not walk the loop and
//!   a loop op whose operands are all `pre` are `pre`;
//! * **matmul → accumulator fusion** (`accumulate_into`): a loop matmul read only by an
//!   `iter` accumulator of its dims adds its product straight into it;
//! * **rescale degrees** (`rescale` of a safe-softmax group) come from the group's shift
//!   degrees ([`super::safe_softmax_groups`]); a hoisted exp's max is fixed, so its group
//!   rescales nothing;
//! * **the loop split** ([`loop_split`]): the cost model's rule and cap
//!   ([`crate::cost::gpu_loop_split`]), applied once for every GPU printer.

use super::{GeneratedKernel, TileIo};
use crate::cost::{gpu_loop_split, DeviceSpec};

/// Fill in the analysed fields of a lowered kernel (its phases are already hoisted).
pub(super) fn analyse(k: &mut GeneratedKernel, spec: &DeviceSpec) {
    fuse_matmuls(k);
    drop_fixed_rescales(k);
    k.loop_split = loop_split(k, spec);
}

/// Mark each loop matmul whose only reader is an `iter` accumulator of the same dims (and
/// which is not stored) with that accumulator.
fn fuse_matmuls(k: &mut GeneratedKernel) {
    let stored: Vec<usize> = k.outputs.iter().map(|o| o.src).collect();
    let mut fused = vec![];
    for m in k
        .ops
        .iter()
        .filter(|o| o.op == "matmul" && o.phase == "loop")
    {
        if stored.contains(&m.id) {
            continue;
        }
        let mut readers = k
            .ops
            .iter()
            .filter(|o| o.args.as_ref().is_some_and(|a| a.contains(&m.id)));
        if let (Some(acc), None) = (readers.next(), readers.next()) {
            let single_arg = acc.args.as_ref().is_some_and(|a| a.len() == 1);
            if acc.op == "accum"
                && acc.acc.as_deref() == Some("iter")
                && single_arg
                && acc.dims == m.dims
            {
                fused.push((m.id, acc.id));
            }
        }
    }
    for (m, acc) in fused {
        if let Some(op) = k.ops.iter_mut().find(|o| o.id == m) {
            op.accumulate_into = Some(acc);
        }
    }
}

/// A group whose exp is hoisted keeps one max for the whole loop: nothing to rescale.
fn drop_fixed_rescales(k: &mut GeneratedKernel) {
    for g in &mut k.safe_softmax {
        let hoisted = k.ops.iter().any(|o| o.id == g.exp && o.phase == "pre");
        if hoisted {
            g.rescale.clear();
        }
    }
}

fn walks_loop(io: &TileIo) -> bool {
    io.offsets.iter().flatten().any(|t| t.var == "iter")
}

/// Ways a GPU printer splits `k`'s for-loop across extra blocks (1: not split), like
/// split-K GEMMs and flash-decoding: on a streaming GPU, a kernel whose loop streams tiles
/// into accumulators and whose grid leaves units idle is split as
/// [`crate::cost::gpu_loop_split`] says, the rule and cap the cost model charges too.
pub fn loop_split(k: &GeneratedKernel, spec: &DeviceSpec) -> u32 {
    let streams = k.ops.iter().any(|o| o.op == "accum") && k.inputs.iter().any(walks_loop);
    if !spec.is_streaming_gpu() || !streams {
        return 1;
    }
    let blocks: u64 = k.grid.iter().map(|&g| g as u64).product();
    gpu_loop_split(spec, blocks, k.forloop_range)
}

#[cfg(test)]
mod tests {
    use super::super::{lower, KernelPlan, PlanKernel};
    use super::*;
    use crate::block_graph::BlockGraph;
    use crate::cost::GPU_MAX_SPLIT;
    use crate::dtype::DType;
    use crate::kernel_graph::KernelGraph;
    use crate::ops::{AccumKind, BinaryOp, UnaryOp};
    use crate::ErrorKind;

    fn only_kernel(plan: &KernelPlan) -> &GeneratedKernel {
        match plan.kernels.last() {
            Some(PlanKernel::Generated(k)) => k,
            _ => panic!("expected a generated kernel"),
        }
    }

    /// silu(X[8, 768]) · W[768, 64·grid], both walked along the 768; the product goes to an
    /// `iter` accumulator, and also to a `sum` accumulator (a second reader) when
    /// `extra_reader`.
    fn linear(grid: i64, f: i64, extra_reader: bool) -> KernelGraph {
        let n = 64 * grid;
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 768], DType::F32).unwrap();
        let w = g.new_input(&[768, n], DType::F32).unwrap();
        let mut bg = BlockGraph::new([grid, 1, 1], [128, 1, 1], f, 1).unwrap();
        let tx = bg
            .new_input(&[8, 768], DType::F32, [-1, -1, -1], 1)
            .unwrap();
        let tw = bg.new_input(&[768, n], DType::F32, [1, -1, -1], 0).unwrap();
        let a = bg.unary(UnaryOp::Silu, tx).unwrap();
        let mm = bg.matmul(a, tw).unwrap();
        let acc = bg.forloop_accum(mm, AccumKind::Iter).unwrap();
        let out = if extra_reader {
            let s = bg.forloop_accum(mm, AccumKind::Sum).unwrap();
            bg.binary(BinaryOp::Div, acc, s).unwrap()
        } else {
            acc
        };
        bg.new_output(out, [1, -1, -1]).unwrap();
        let o = g.customized(&[x, w], &bg).unwrap();
        g.mark_output(o[0]).unwrap();
        g
    }

    /// silu(sum_to_32(X)) · W with X[8, 512] loaded once and W[128, 256] walked.
    fn linear_once() -> KernelGraph {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 512], DType::F32).unwrap();
        let w = g.new_input(&[128, 256], DType::F32).unwrap();
        let mut bg = BlockGraph::new([4, 1, 1], [128, 1, 1], 4, 32).unwrap();
        let tx = bg
            .new_input(&[8, 512], DType::F32, [-1, -1, -1], -1)
            .unwrap();
        let tw = bg
            .new_input(&[128, 256], DType::F32, [1, -1, -1], 0)
            .unwrap();
        let cols = bg.reduction_to_dimx(tx, 1).unwrap();
        let a = bg.unary(UnaryOp::Silu, cols).unwrap();
        let mm = bg.matmul(a, tw).unwrap();
        let acc = bg.forloop_accum(mm, AccumKind::Iter).unwrap();
        bg.new_output(acc, [1, -1, -1]).unwrap();
        let o = g.customized(&[x, w], &bg).unwrap();
        g.mark_output(o[0]).unwrap();
        g
    }

    fn phases(k: &GeneratedKernel) -> Vec<&str> {
        k.ops.iter().map(|o| o.phase.as_str()).collect()
    }

    #[test]
    fn invariant_loads_and_their_ops_are_hoisted() {
        let plan = lower(&linear(4, 16, false), &DeviceSpec::h100()).unwrap();
        assert_eq!(
            phases(only_kernel(&plan)),
            ["loop", "loop", "loop", "loop", "accum"]
        );
        // X loaded once: its column sums and their silu run before the loop
        let plan = lower(&linear_once(), &DeviceSpec::h100()).unwrap();
        assert_eq!(
            phases(only_kernel(&plan)),
            ["pre", "loop", "pre", "pre", "loop", "accum"]
        );
    }

    #[test]
    fn a_matmul_read_only_by_its_iter_accumulator_adds_into_it() {
        let plan = lower(&linear(4, 16, false), &DeviceSpec::h100()).unwrap();
        let k = only_kernel(&plan);
        assert_eq!(k.ops[3].op, "matmul");
        assert_eq!(k.ops[3].accumulate_into, Some(4));
        let fused: Vec<usize> = k
            .ops
            .iter()
            .filter(|o| o.accumulate_into.is_some())
            .map(|o| o.id)
            .collect();
        assert_eq!(fused, [3]);
        assert!(plan.to_json().contains(r#""accumulate_into":4"#));
        // a second reader (the sum accumulator) needs the product itself
        let plan = lower(&linear(4, 16, true), &DeviceSpec::h100()).unwrap();
        let k = only_kernel(&plan);
        assert!(k.ops.iter().all(|o| o.accumulate_into.is_none()));
    }

    /// Attention-like: exp(Q·Kᵀ)·V accumulated (degree 1), exp(S)² summed (degree 2), the
    /// output num² / sq (degree 0).
    fn attention_like() -> KernelGraph {
        let mut g = KernelGraph::new();
        let q = g.new_input(&[2, 4, 16], DType::F32).unwrap();
        let kt = g.new_input(&[2, 16, 64], DType::F32).unwrap();
        let v = g.new_input(&[2, 64, 16], DType::F32).unwrap();
        let mut bg = BlockGraph::new([2, 1, 1], [128, 1, 1], 4, 1).unwrap();
        let tq = bg
            .new_input(&[2, 4, 16], DType::F32, [0, -1, -1], -1)
            .unwrap();
        let tk = bg
            .new_input(&[2, 16, 64], DType::F32, [0, -1, -1], 2)
            .unwrap();
        let tv = bg
            .new_input(&[2, 64, 16], DType::F32, [0, -1, -1], 1)
            .unwrap();
        let s = bg.matmul(tq, tk).unwrap();
        let e = bg.unary(UnaryOp::Exp, s).unwrap();
        let e2 = bg.binary(BinaryOp::Mul, e, e).unwrap();
        let o = bg.matmul(e, tv).unwrap();
        let num = bg.forloop_accum(o, AccumKind::Iter).unwrap();
        let sq = bg.forloop_accum(e2, AccumKind::Sum).unwrap();
        let n2 = bg.binary(BinaryOp::Mul, num, num).unwrap();
        let r = bg.binary(BinaryOp::Div, n2, sq).unwrap();
        bg.new_output(r, [0, -1, -1]).unwrap();
        let out = g.customized(&[q, kt, v], &bg).unwrap();
        g.mark_output(out[0]).unwrap();
        g
    }

    #[test]
    fn safe_softmax_groups_carry_each_accumulators_rescale_degree() {
        let plan = lower(&attention_like(), &DeviceSpec::h100()).unwrap();
        let k = only_kernel(&plan);
        let g = &k.safe_softmax[0];
        assert_eq!(g.exp, 4);
        let rescale: Vec<(usize, i32)> = g.rescale.iter().map(|r| (r.accum, r.degree)).collect();
        assert_eq!(rescale, vec![(7, 1), (8, 2)]);
        let json = plan.to_json();
        assert!(json.contains(r#""rescale":[{"accum":7,"degree":1},{"accum":8,"degree":2}]"#));
        assert_eq!(KernelPlan::from_json(&json).unwrap(), plan);
    }

    #[test]
    fn a_hoisted_exp_rescales_nothing() {
        // exp(X) of an X loaded once is loop-invariant: its max is fixed
        let mut g = KernelGraph::new();
        let x = g.new_input(&[4, 64], DType::F32).unwrap();
        let v = g.new_input(&[64, 64], DType::F32).unwrap();
        let mut bg = BlockGraph::new([1, 1, 1], [128, 1, 1], 4, 1).unwrap();
        let tx = bg
            .new_input(&[4, 64], DType::F32, [-1, -1, -1], -1)
            .unwrap();
        let tv = bg
            .new_input(&[64, 64], DType::F32, [-1, -1, -1], 1)
            .unwrap();
        let e = bg.unary(UnaryOp::Exp, tx).unwrap();
        let o = bg.matmul(e, tv).unwrap();
        let num = bg.forloop_accum(o, AccumKind::Iter).unwrap();
        let den = bg.forloop_accum(e, AccumKind::Sum).unwrap();
        let r = bg.binary(BinaryOp::Div, num, den).unwrap();
        bg.new_output(r, [-1, -1, -1]).unwrap();
        let out = g.customized(&[x, v], &bg).unwrap();
        g.mark_output(out[0]).unwrap();
        let plan = lower(&g, &DeviceSpec::h100()).unwrap();
        let k = only_kernel(&plan);
        assert_eq!(k.ops[2].phase, "pre");
        assert_eq!(k.safe_softmax.len(), 1);
        assert!(k.safe_softmax[0].rescale.is_empty());
    }

    #[test]
    fn an_accumulator_that_is_no_power_of_the_shift_is_rejected() {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[4, 64], DType::F32).unwrap();
        let mut bg = BlockGraph::new([1, 1, 1], [128, 1, 1], 4, 1).unwrap();
        let tx = bg.new_input(&[4, 64], DType::F32, [-1, -1, -1], 1).unwrap();
        let e = bg.unary(UnaryOp::Exp, tx).unwrap();
        let e1 = bg.binary(BinaryOp::Add, e, tx).unwrap(); // exp(x) + x: no single degree
        let acc = bg.forloop_accum(e1, AccumKind::Sum).unwrap();
        bg.new_output(acc, [-1, -1, -1]).unwrap();
        let o = g.customized(&[x], &bg).unwrap();
        g.mark_output(o[0]).unwrap();
        let err = lower(&g, &DeviceSpec::h100()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Mapping);
        assert!(err.to_string().contains("cannot rescale it"), "{err}");
    }

    #[test]
    fn the_loop_split_fills_idle_units_with_one_cap() {
        let h100 = DeviceSpec::h100();
        assert_eq!(h100.compute_units, 132);
        let split = |grid: i64, f: i64| {
            let plan = lower(&linear(grid, f, false), &h100).unwrap();
            only_kernel(&plan).loop_split
        };
        // 16 blocks want 16.5 parts for two per SM: capped at 16
        assert_eq!(split(16, 64), 16);
        assert_eq!(split(16, 8), 8); // the loop has only 8 iterations
        assert_eq!(split(16, 12), 8); // shares of 2 and 1 iterations
        assert_eq!(split(64, 64), 8); // 64·4 = 256 < 264 ≤ 64·8
        assert_eq!(split(132, 64), 2);
        assert_eq!(split(264, 64), 1); // two blocks per SM already
        assert_eq!(split(16, 3), 2); // shares of 2 and 1
        assert_eq!(gpu_loop_split(&h100, 16, 1), 1); // one iteration: nothing to split
        assert_eq!(gpu_loop_split(&h100, 1, 1 << 20), GPU_MAX_SPLIT);
        // the CPU runs blocks as tasks: never split
        let plan = lower(&linear(16, 64, false), &DeviceSpec::cpu2()).unwrap();
        assert_eq!(only_kernel(&plan).loop_split, 1);
    }

    #[test]
    fn a_loop_that_streams_nothing_is_not_split() {
        // no input walks the loop: each iteration adds the same value
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 512], DType::F32).unwrap();
        let mut bg = BlockGraph::new([4, 1, 1], [128, 1, 1], 4, 1).unwrap();
        let tx = bg
            .new_input(&[8, 512], DType::F32, [1, -1, -1], -1)
            .unwrap();
        let y = bg.unary(UnaryOp::Silu, tx).unwrap();
        let acc = bg.forloop_accum(y, AccumKind::Iter).unwrap();
        bg.new_output(acc, [1, -1, -1]).unwrap();
        let o = g.customized(&[x], &bg).unwrap();
        g.mark_output(o[0]).unwrap();
        let plan = lower(&g, &DeviceSpec::h100()).unwrap();
        assert_eq!(only_kernel(&plan).loop_split, 1);
    }
}
