//! IR ops → abstract expressions: the single mapping used for the target (built into the
//! e-graph) and for every candidate op (looked up in it), so both sides always agree.

use super::expr::{AbsBuilder, AbsNode};
use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::ops::{AccumKind, BinaryOp, UnaryOp};

/// Symbol of an uninterpreted unary op with its parameters (e.g. `clamp[-1.0, 1.0]`).
pub fn unary_symbol(op: UnaryOp) -> String {
    format!("{}{:?}", op.name(), op.params())
}

/// Expression of a unary op applied to `x`.
pub fn lift_unary<B: AbsBuilder>(b: &mut B, op: UnaryOp, x: B::H) -> B::H {
    match op {
        UnaryOp::Exp => b.node(AbsNode::Exp(x)),
        UnaryOp::Sqrt => b.node(AbsNode::Sqrt(x)),
        UnaryOp::Square => b.node(AbsNode::Mul(x, x)),
        UnaryOp::Neg => b.node(AbsNode::Scale("-1".into(), x)),
        UnaryOp::MulScalar(s) => b.node(AbsNode::Scale(format!("{s:?}"), x)),
        other => b.node(AbsNode::Un(unary_symbol(other), x)),
    }
}

/// Expression of a binary op.
pub fn lift_binary<B: AbsBuilder>(b: &mut B, op: BinaryOp, x: B::H, y: B::H) -> B::H {
    match op {
        BinaryOp::Add => b.node(AbsNode::Add(x, y)),
        BinaryOp::Sub => {
            let ny = b.node(AbsNode::Scale("-1".into(), y));
            b.node(AbsNode::Add(x, ny))
        }
        BinaryOp::Mul => b.node(AbsNode::Mul(x, y)),
        BinaryOp::Div => b.node(AbsNode::Div(x, y)),
        BinaryOp::Pow => b.node(AbsNode::Bin("pow".into(), x, y)),
    }
}

/// `sum(a * b)`.
pub fn lift_matmul<B: AbsBuilder>(b: &mut B, x: B::H, y: B::H) -> B::H {
    let m = b.node(AbsNode::Mul(x, y));
    b.node(AbsNode::Sum(m))
}

/// `x / rms(x)` (× weight).
pub fn lift_rms_norm<B: AbsBuilder>(b: &mut B, x: B::H, w: Option<B::H>) -> B::H {
    let r = b.node(AbsNode::Rms(x));
    let n = b.node(AbsNode::Div(x, r));
    match w {
        Some(w) => b.node(AbsNode::Mul(n, w)),
        None => n,
    }
}

/// Accumulator expression (iter is the identity: see the `expr` module doc).
pub fn lift_accum<B: AbsBuilder>(b: &mut B, kind: AccumKind, x: B::H) -> B::H {
    match kind {
        AccumKind::Iter => x,
        AccumKind::Sum | AccumKind::SumToDimx => b.node(AbsNode::Sum(x)),
        AccumKind::Rms { .. } => b.node(AbsNode::Rms(x)),
    }
}

/// Expressions of a block graph's outputs given its inputs' expressions.
pub fn lift_block<B: AbsBuilder>(b: &mut B, g: &BlockGraph, inputs: &[B::H]) -> Option<Vec<B::H>> {
    let mut vals: Vec<B::H> = Vec::with_capacity(g.ops().len());
    let mut next_input = 0;
    for op in g.ops() {
        let v = |i: usize| vals[i];
        let h = match op {
            BlockOpKind::Input { .. } => {
                let h = *inputs.get(next_input)?;
                next_input += 1;
                h
            }
            BlockOpKind::Matmul { a, b: y } => lift_matmul(b, v(*a), v(*y)),
            BlockOpKind::Unary { op, x } => lift_unary(b, *op, v(*x)),
            BlockOpKind::Binary { op, a, b: y } => lift_binary(b, *op, v(*a), v(*y)),
            BlockOpKind::Reduction { x, .. } | BlockOpKind::ReductionToDimx { x, .. } => {
                b.node(AbsNode::Sum(v(*x)))
            }
            BlockOpKind::RmsNorm { x, .. } => lift_rms_norm(b, v(*x), None),
            BlockOpKind::Concat { xs, dim } => {
                let hs = xs.iter().map(|&x| v(x)).collect();
                b.node(AbsNode::Concat(format!("d{dim}"), hs))
            }
            BlockOpKind::ForloopAccum { x, kind } => lift_accum(b, *kind, v(*x)),
        };
        vals.push(h);
    }
    Some(g.outputs().iter().map(|o| vals[o.tile]).collect())
}

/// Expressions of every tensor of a kernel graph (`None` only for malformed graphs).
pub fn lift_kernel_graph<B: AbsBuilder>(b: &mut B, g: &KernelGraph) -> Option<Vec<B::H>> {
    let mut vals: Vec<Option<B::H>> = vec![None; g.num_tensors()];
    let mut next_input = 0;
    for op in g.ops() {
        let v = |i: usize| vals.get(i).copied().flatten();
        let outs: Vec<B::H> = match &op.kind {
            KernelOpKind::Input { .. } => {
                let h = b.node(AbsNode::Sym(format!("in{next_input}")));
                next_input += 1;
                vec![h]
            }
            KernelOpKind::Matmul { a, b: y } => vec![lift_matmul(b, v(*a)?, v(*y)?)],
            KernelOpKind::Unary { op, x } => vec![lift_unary(b, *op, v(*x)?)],
            KernelOpKind::Binary { op, a, b: y } => vec![lift_binary(b, *op, v(*a)?, v(*y)?)],
            KernelOpKind::Reduction { x, .. } => vec![b.node(AbsNode::Sum(v(*x)?))],
            KernelOpKind::RmsNorm { x, weight, .. } => {
                let w = match weight {
                    Some(w) => Some(v(*w)?),
                    None => None,
                };
                vec![lift_rms_norm(b, v(*x)?, w)]
            }
            KernelOpKind::Softmax { x, .. } => {
                let e = b.node(AbsNode::Exp(v(*x)?));
                let s = b.node(AbsNode::Sum(e));
                vec![b.node(AbsNode::Div(e, s))]
            }
            KernelOpKind::Concat { xs, dim } => {
                let hs = xs.iter().map(|&x| v(x)).collect::<Option<Vec<_>>>()?;
                vec![b.node(AbsNode::Concat(format!("d{dim}"), hs))]
            }
            KernelOpKind::Chunk {
                x,
                chunks,
                dim,
                index,
            } => vec![b.node(AbsNode::Chunk(format!("{index}/{chunks}@{dim}"), v(*x)?))],
            // layout ops: opaque, keyed by their parameters (the search does not fuse them)
            KernelOpKind::Permute { x, perm } => {
                vec![b.node(AbsNode::Un(format!("permute{perm:?}"), v(*x)?))]
            }
            KernelOpKind::Reshape { x, dims } => {
                vec![b.node(AbsNode::Un(format!("reshape{dims:?}"), v(*x)?))]
            }
            KernelOpKind::ReduceMax { x, dim } => {
                vec![b.node(AbsNode::Un(format!("max@{dim}"), v(*x)?))]
            }
            KernelOpKind::Customized { inputs, graph } => {
                let ins = inputs.iter().map(|&x| v(x)).collect::<Option<Vec<_>>>()?;
                lift_block(b, graph, &ins)?
            }
            // A collective is opaque to the per-rank algebra: a fresh symbol per op (the
            // search splits graphs at all_reduce, so it never has to match one).
            KernelOpKind::AllReduce { .. } => {
                let out = op.outs.first().copied().unwrap_or(0);
                vec![b.node(AbsNode::Sym(format!("all_reduce@t{out}")))]
            }
        };
        for (&id, h) in op.outs.iter().zip(outs) {
            *vals.get_mut(id)? = Some(h);
        }
    }
    vals.into_iter().collect()
}
