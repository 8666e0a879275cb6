//! Rank canonicalisation: the equal-rank form of a kernel graph that the search works on.
//!
//! Kernel-level binary ops broadcast numpy style (a missing leading dim counts as 1), but the
//! search, the cost model, the lowering and the code generators work on equal-rank graphs.
//! A lower-rank tensor that enters a broadcast is exactly its rank-promoted view (leading
//! size-1 dims, identical row-major bytes), so [`promote_ranks`] rewrites the graph with such
//! tensors re-declared at the rank they are used at:
//!
//! * every op puts its operands and results in one class (binary, matmul, the unary ops,
//!   reduction, rms_norm with its weight, softmax, concat, chunk, permute, all_reduce; not
//!   reshape, whose operand and result have unrelated ranks); each class takes the largest
//!   rank among its tensors;
//! * a tensor below its class's rank gets leading size-1 dims: graph inputs are re-declared
//!   that way and dim arguments (reduction, softmax, concat, chunk) shift accordingly. An
//!   rms_norm weight `[K]` thus becomes `[1, K]` next to an `x` of rank 2, the form in which
//!   the search can fuse the weight's multiplication into a customized op;
//! * inputs and outputs of customized ops have a fixed rank: a class that would promote one
//!   is an error that names the tensors to give explicit leading size-1 dims.
//!
//! The result computes the same values on the same bytes: graph inputs and outputs differ
//! from the original only by leading size-1 dims, so callers pass reshaped views (no copies)
//! and read the outputs back in the original shapes. A graph without rank promotion is
//! returned unchanged.

use crate::error::{shape_err, CoreError, Result};
use crate::kernel_graph::{KernelGraph, KernelOpKind, TensorId};
use crate::shape::fmt_dims;

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

fn union(parent: &mut [usize], a: usize, b: usize) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    if ra != rb {
        parent[ra.max(rb)] = ra.min(rb);
    }
}

/// The rank every tensor of `g` takes in the canonical form (≥ its own rank).
pub fn canonical_ranks(g: &KernelGraph) -> Result<Vec<usize>> {
    let n = g.num_tensors();
    let ts = g.tensors();
    let mut parent: Vec<usize> = (0..n).collect();
    let mut fixed: Vec<bool> = vec![false; n];
    for op in g.ops() {
        let tied: Vec<TensorId> = match &op.kind {
            // a reshape's input and output have unrelated ranks
            KernelOpKind::Input { .. } | KernelOpKind::Reshape { .. } => vec![],
            KernelOpKind::Customized { inputs, .. } => {
                for &t in inputs.iter().chain(&op.outs) {
                    fixed[t] = true;
                }
                vec![]
            }
            kind => kind.operands(),
        };
        if tied.is_empty() {
            continue;
        }
        for &o in &op.outs {
            for &t in &tied {
                union(&mut parent, t, o);
            }
        }
    }
    let mut class_rank = vec![0usize; n];
    for (t, info) in ts.iter().enumerate() {
        let c = find(&mut parent, t);
        class_rank[c] = class_rank[c].max(info.dims.len());
    }
    let ranks: Vec<usize> = (0..n).map(|t| class_rank[find(&mut parent, t)]).collect();
    for t in 0..n {
        if fixed[t] && ranks[t] > ts[t].dims.len() {
            let c = find(&mut parent, t);
            let low: Vec<String> = (0..n)
                .filter(|&i| find(&mut parent, i) == c && ts[i].dims.len() < ranks[t])
                .take(6)
                .map(|i| format!("t{i}{}", fmt_dims(&ts[i].dims)))
                .collect();
            return shape_err(format!(
                "cannot bring the graph to equal ranks for the search: t{t}{} is an input or output of a customized operator (fixed rank {}) but meets rank-{} tensors through broadcasting; give the lower-rank tensors{} explicit leading size-1 dims",
                fmt_dims(&ts[t].dims),
                ts[t].dims.len(),
                ranks[t],
                if low.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", low.join(", "))
                }
            ));
        }
    }
    Ok(ranks)
}

/// The equal-rank form of `g` (see the module doc); `g` itself when nothing is promoted.
pub fn promote_ranks(g: &KernelGraph) -> Result<KernelGraph> {
    let ranks = canonical_ranks(g)?;
    let ts = g.tensors();
    if ranks.iter().zip(ts).all(|(&r, t)| r == t.dims.len()) {
        return Ok(g.clone());
    }
    rebuild(g, &ranks).map_err(|e| {
        e.context(
            "bringing the graph to equal ranks for the search (give lower-rank tensors explicit leading size-1 dims to avoid this)",
        )
    })
}

fn rebuild(g: &KernelGraph, ranks: &[usize]) -> Result<KernelGraph> {
    let ts = g.tensors();
    let mut h = KernelGraph::with_world_size(g.world_size() as i64)?;
    let mut map: Vec<TensorId> = vec![usize::MAX; g.num_tensors()];
    let lost = || CoreError::Graph("rank canonicalisation: internal error (missing tensor)".into());
    for op in g.ops() {
        let m = |t: TensorId| -> Result<TensorId> {
            map.get(t)
                .copied()
                .filter(|&v| v != usize::MAX)
                .ok_or_else(lost)
        };
        // dims added in front of operand/result `t`
        let lead = |t: TensorId| ranks[t] - ts[t].dims.len();
        let outs = h.replay_promoted(&op.kind, &op.outs, &m, &lead)?;
        if outs.len() != op.outs.len() {
            return Err(lost());
        }
        for (&old, new) in op.outs.iter().zip(outs) {
            map[old] = new;
        }
    }
    for &o in g.outputs() {
        h.mark_output(map[o])?;
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::Tensor;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::reference::evaluate;
    use crate::{fingerprint, DType, ErrorKind};

    fn t(dims: &[usize], seed: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let data = (0..n)
            .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f64 / 500.0 - 1.0)
            .collect();
        Tensor::new(dims.to_vec(), data).unwrap()
    }

    #[test]
    fn promotes_inputs_and_keeps_values() {
        // y = softmax(exp(b[64]) + x[8,64], -1);  z = reduction(b * c, 0) (c [64])
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let b = g.new_input(&[64], DType::F32).unwrap();
        let c = g.new_input(&[64], DType::F32).unwrap();
        let e = g.unary(UnaryOp::Exp, b).unwrap();
        let s = g.binary(BinaryOp::Add, e, x).unwrap();
        let y = g.softmax(s, -1).unwrap();
        let bc = g.binary(BinaryOp::Mul, b, c).unwrap();
        let z = g.reduction(bc, 0).unwrap();
        g.mark_output(y).unwrap();
        g.mark_output(z).unwrap();
        let h = promote_ranks(&g).unwrap();
        let sig: Vec<Vec<usize>> = h.input_signature().into_iter().map(|s| s.0).collect();
        assert_eq!(sig, vec![vec![8, 64], vec![1, 64], vec![1, 64]]);
        // the reduction over dim 0 of the rank-1 tensor is dim 1 of the promoted one
        let outs: Vec<Vec<usize>> = h
            .outputs()
            .iter()
            .map(|&o| h.tensors()[o].dims.clone())
            .collect();
        assert_eq!(outs, vec![vec![8, 64], vec![1, 1]]);
        let ins = [t(&[8, 64], 1), t(&[64], 2), t(&[64], 3)];
        let hins: Vec<Tensor> = ins
            .iter()
            .zip(&sig)
            .map(|(x, d)| Tensor::new(d.clone(), x.data.clone()).unwrap())
            .collect();
        let (a, b) = (evaluate(&g, &ins).unwrap(), evaluate(&h, &hins).unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.data, y.data);
        }
        // the fingerprint digest sees the same bytes (outputs' dims differ: compare values)
        let fa = fingerprint::fingerprint_values(&g, 2, 5).unwrap();
        let fb = fingerprint::fingerprint_values(&h, 2, 5).unwrap();
        for (x, y) in fa.iter().flatten().zip(fb.iter().flatten()) {
            assert_eq!(x.data, y.data);
        }
        // canonical graphs are fixed points; equal-rank graphs are returned as they are
        assert_eq!(promote_ranks(&h).unwrap(), h);
    }

    #[test]
    fn shared_tensor_takes_the_larger_rank_and_customized_is_fixed() {
        let mut g = KernelGraph::new();
        let b = g.new_input(&[64], DType::F32).unwrap();
        let x2 = g.new_input(&[8, 64], DType::F32).unwrap();
        let x3 = g.new_input(&[2, 8, 64], DType::F32).unwrap();
        let s2 = g.binary(BinaryOp::Add, x2, b).unwrap();
        let s3 = g.binary(BinaryOp::Add, x3, b).unwrap();
        g.mark_output(s2).unwrap();
        g.mark_output(s3).unwrap();
        let h = promote_ranks(&g).unwrap();
        let sig: Vec<Vec<usize>> = h.input_signature().into_iter().map(|s| s.0).collect();
        assert_eq!(sig, vec![vec![1, 1, 64], vec![1, 8, 64], vec![2, 8, 64]]);

        // a promoted class reaching a customized op's input is an error naming the fix
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let v = g.new_input(&[64], DType::F32).unwrap();
        let mut bg = crate::BlockGraph::new([1, 1, 1], [1, 1, 1], 1, 1).unwrap();
        let bi = bg.new_input(&[64], DType::F32, [-1, -1, -1], -1).unwrap();
        let acc = bg.forloop_accum(bi, crate::AccumKind::Iter).unwrap();
        bg.new_output(acc, [-1, -1, -1]).unwrap();
        let e = g.unary(UnaryOp::Exp, v).unwrap();
        g.customized(&[e], &bg).unwrap();
        let s = g.binary(BinaryOp::Add, x, e).unwrap();
        g.mark_output(s).unwrap();
        let err = promote_ranks(&g).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Shape);
        let m = err.to_string();
        assert!(
            m.contains("customized") && m.contains("leading size-1 dims"),
            "{m}"
        );
        assert!(m.contains("t1[64]"), "{m}");
    }
}
