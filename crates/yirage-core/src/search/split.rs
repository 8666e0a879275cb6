//! Search of graphs with collectives: split at `all_reduce`, search the parts, stitch.
//! Graphs with the library-only ops permute, reshape and reduce_max are split at them the
//! same way (see [`is_boundary`]), so the rest of such a graph is still fused.
//!
//! An all_reduce is never fused into a customized op: it is a boundary. Each tensor gets a
//! *level*, the largest number of all_reduces on a path from the inputs to it; the ops of
//! one level (all_reduces excepted) form a collective-free part. Every part becomes its own
//! single-rank kernel graph (its inputs: graph inputs, all_reduce results and tensors of
//! earlier parts; its outputs: the tensors used later or marked as outputs) and is searched
//! like any graph. The candidates are stitched back in level order with the all_reduces in
//! between, kept as library kernels: candidate j takes the j-th best candidate of every part
//! (the last one where a part has fewer). Every stitched graph is verified against the whole
//! target with a multi-rank fingerprint before it is returned; the target as library
//! kernels is the baseline, as for every search.

use super::{add_baseline_and_rank, graph_cost, search_in_pool, Candidate, SearchResult};
use crate::cost::DeviceSpec;
use crate::error::{CoreError, Result};
use crate::fingerprint::TrialCheck;
use crate::kernel_graph::{KernelGraph, KernelOpKind, TensorId};
use crate::plan::lower_candidate;
use crate::search::{SearchConfig, SearchControl};
use std::collections::HashSet;
use std::time::Instant;

/// One collective-free part of the target.
struct Part {
    /// The part as a single-rank graph.
    graph: KernelGraph,
    /// Target tensors feeding the part's inputs, in order.
    inputs: Vec<TensorId>,
    /// Target tensors of the part's outputs, in order.
    outputs: Vec<TensorId>,
}

/// Level of every tensor (see the module doc).
fn levels(g: &KernelGraph) -> Vec<usize> {
    let mut lvl = vec![0usize; g.num_tensors()];
    for op in g.ops() {
        let base = op
            .kind
            .operands()
            .iter()
            .map(|&t| lvl[t])
            .max()
            .unwrap_or(0);
        let l = match op.kind {
            _ if is_boundary(&op.kind) => base + 1,
            _ => base,
        };
        for &o in &op.outs {
            lvl[o] = l;
        }
    }
    lvl
}

fn is_part_op(kind: &KernelOpKind) -> bool {
    !matches!(kind, KernelOpKind::Input { .. }) && !is_boundary(kind)
}

/// Ops the search never fuses and splits the target at: all_reduce (a collective) and the
/// library-only ops (they stay library kernels between the searched parts).
pub(super) fn is_boundary(kind: &KernelOpKind) -> bool {
    matches!(
        kind,
        KernelOpKind::AllReduce { .. }
            | KernelOpKind::Permute { .. }
            | KernelOpKind::Reshape { .. }
            | KernelOpKind::ReduceMax { .. }
    )
}

/// Whether `g` holds a library-only op the search splits at (besides all_reduce).
pub(super) fn has_library_boundaries(g: &KernelGraph) -> bool {
    g.ops()
        .iter()
        .any(|op| is_boundary(&op.kind) && !matches!(op.kind, KernelOpKind::AllReduce { .. }))
}

/// The collective-free parts of `g`, one per level (`None` where a level has no ops).
fn parts(g: &KernelGraph, lvl: &[usize]) -> Result<Vec<Option<Part>>> {
    let levels = lvl.iter().copied().max().unwrap_or(0) + 1;
    let mut used_later: Vec<HashSet<TensorId>> = vec![HashSet::new(); levels];
    // a tensor is needed outside its part when a later-level op or an all_reduce reads it,
    // or when it is a graph output
    for op in g.ops() {
        let l = op.outs.first().map_or(0, |&o| lvl[o]);
        for t in op.kind.operands() {
            if !is_part_op(&op.kind) || lvl[t] != l {
                used_later[lvl[t]].insert(t);
            }
        }
    }
    for &o in g.outputs() {
        used_later[lvl[o]].insert(o);
    }
    let mut out = vec![];
    for (k, later) in used_later.iter().enumerate() {
        let ops: Vec<_> = g
            .ops()
            .iter()
            .filter(|op| is_part_op(&op.kind) && op.outs.first().is_some_and(|&o| lvl[o] == k))
            .collect();
        if ops.is_empty() {
            out.push(None);
            continue;
        }
        let produced: HashSet<TensorId> = ops.iter().flat_map(|op| op.outs.clone()).collect();
        let mut inputs: Vec<TensorId> = ops
            .iter()
            .flat_map(|op| op.kind.operands())
            .filter(|t| !produced.contains(t))
            .collect();
        inputs.sort_unstable();
        inputs.dedup();
        let mut outputs: Vec<TensorId> = produced
            .iter()
            .copied()
            .filter(|t| later.contains(t))
            .collect();
        outputs.sort_unstable();
        let mut h = KernelGraph::new();
        let mut map = vec![usize::MAX; g.num_tensors()];
        for &t in &inputs {
            let info = &g.tensors()[t];
            let d: Vec<i64> = info.dims.iter().map(|&v| v as i64).collect();
            map[t] = h.new_input(&d, info.dtype)?;
        }
        for op in ops {
            let m = |t: TensorId| -> Result<TensorId> {
                map.get(t)
                    .copied()
                    .filter(|&v| v != usize::MAX)
                    .ok_or_else(|| {
                        CoreError::Graph("search: splitting at all_reduce (missing tensor)".into())
                    })
            };
            let new = h.replay(&op.kind, &m)?;
            for (&o, n) in op.outs.iter().zip(new) {
                map[o] = n;
            }
        }
        for &o in &outputs {
            h.mark_output(map[o])?;
        }
        out.push(Some(Part {
            graph: h,
            inputs,
            outputs,
        }));
    }
    Ok(out)
}

/// The target with every part replaced by `choice[k]` (a graph with the part's signature).
fn stitch(
    g: &KernelGraph,
    lvl: &[usize],
    parts: &[Option<Part>],
    choice: &[Option<&KernelGraph>],
) -> Result<KernelGraph> {
    let mut h = KernelGraph::with_world_size(g.world_size() as i64)?;
    let mut map = vec![usize::MAX; g.num_tensors()];
    let lost = || CoreError::Graph("search: stitching at all_reduce (missing tensor)".into());
    for &t in g.inputs() {
        let info = &g.tensors()[t];
        let d: Vec<i64> = info.dims.iter().map(|&v| v as i64).collect();
        map[t] = h.new_input(&d, info.dtype)?;
    }
    for (k, part) in parts.iter().enumerate() {
        // boundary ops producing level k (their operands come from lower levels)
        for op in g.ops() {
            if is_boundary(&op.kind) && lvl[op.outs[0]] == k {
                let m = |t: TensorId| -> Result<TensorId> {
                    map.get(t)
                        .copied()
                        .filter(|&v| v != usize::MAX)
                        .ok_or_else(lost)
                };
                let new = h.replay(&op.kind, &m)?;
                map[op.outs[0]] = new[0];
            }
        }
        let (Some(part), Some(body)) = (part, choice.get(k).copied().flatten()) else {
            continue;
        };
        let mut local = vec![usize::MAX; body.num_tensors()];
        for (&bi, &t) in body.inputs().iter().zip(&part.inputs) {
            local[bi] = map
                .get(t)
                .copied()
                .filter(|&v| v != usize::MAX)
                .ok_or_else(lost)?;
        }
        for op in body.ops() {
            if matches!(op.kind, KernelOpKind::Input { .. }) {
                continue;
            }
            let m = |t: TensorId| -> Result<TensorId> {
                local
                    .get(t)
                    .copied()
                    .filter(|&v| v != usize::MAX)
                    .ok_or_else(lost)
            };
            let new = h.replay(&op.kind, &m)?;
            for (&o, n) in op.outs.iter().zip(new) {
                local[o] = n;
            }
        }
        for (&bo, &t) in body.outputs().iter().zip(&part.outputs) {
            map[t] = local[bo];
        }
    }
    for &o in g.outputs() {
        h.mark_output(
            map.get(o)
                .copied()
                .filter(|&v| v != usize::MAX)
                .ok_or_else(lost)?,
        )?;
    }
    Ok(h)
}

/// Search a target that contains all_reduce (see the module doc). Runs in the caller's pool.
pub(super) fn search_split(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
) -> Result<SearchResult> {
    let start = Instant::now();
    let lvl = levels(target);
    let parts = parts(target, &lvl)?;
    let n_parts = parts.iter().flatten().count();
    let mut notes = vec![if has_library_boundaries(target) {
        format!(
            "the target contains permute, reshape or reduce_max (library kernels the search does not fuse): it was split at them into {n_parts} part(s), searched separately"
        )
    } else if target.has_collectives() {
        format!(
            "the target contains all_reduce: it was split into {n_parts} collective-free part(s), searched separately; every all_reduce stays a library kernel (the runtime's collective)"
        )
    } else {
        format!(
            "the target runs on {} ranks: its per-rank program was searched as a single-device graph",
            target.world_size()
        )
    }];
    let mut results: Vec<Option<SearchResult>> = vec![];
    let mut stop_reasons = vec![];
    let (mut nodes, mut classes, mut programs) = (0usize, 0usize, 0u64);
    let mut remaining = n_parts;
    for (k, part) in parts.iter().enumerate() {
        let Some(part) = part else {
            results.push(None);
            continue;
        };
        let mut sub = cfg.clone();
        if let Some(t) = cfg.time_limit_s {
            let left = (t - start.elapsed().as_secs_f64()).max(0.0);
            sub.time_limit_s = Some(left / remaining.max(1) as f64);
        }
        remaining -= 1;
        let r = search_in_pool(&part.graph, spec, &sub, ctl)?;
        nodes += r.report.egraph_nodes;
        classes += r.report.egraph_classes;
        programs += r.report.block_programs;
        for n in &r.report.notes {
            notes.push(format!("part {k}: {n}"));
        }
        stop_reasons.push((k, r.report.stop_reason.clone()));
        results.push(Some(r));
    }
    let enumerate_s = start.elapsed().as_secs_f64();

    // Stitch, verify, rank.
    let p = &ctl.progress;
    let target_hash = crate::json::hash(target);
    let mut seen = HashSet::from([target_hash.clone()]);
    let mut verified: Vec<Candidate> = vec![];
    let mut target_fp: Option<TrialCheck> = None;
    let widest = results
        .iter()
        .flatten()
        .map(|r| r.candidates.len())
        .max()
        .unwrap_or(0);
    let mut cancelled = false;
    for j in 0..widest {
        if verified.len() >= cfg.top_k {
            break;
        }
        if ctl.cancel.load(std::sync::atomic::Ordering::Relaxed) {
            cancelled = true;
            break;
        }
        let picks: Vec<Option<&Candidate>> = results
            .iter()
            .map(|r| {
                r.as_ref().and_then(|r| {
                    r.candidates
                        .get(j.min(r.candidates.len().saturating_sub(1)))
                })
            })
            .collect();
        if picks.iter().flatten().all(|c| c.baseline) {
            continue; // that is the target itself
        }
        let bodies: Vec<Option<&KernelGraph>> = picks.iter().map(|c| c.map(|c| &c.graph)).collect();
        let Ok(g) = stitch(target, &lvl, &parts, &bodies) else {
            p.rejected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            continue;
        };
        let h = crate::json::hash(&g);
        if !seen.insert(h.clone()) || lower_candidate(&g, spec).is_err() {
            continue;
        }
        if target_fp.is_none() {
            target_fp = Some(TrialCheck::new(target, cfg.trials, cfg.seed)?);
        }
        p.fingerprint_tests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if target_fp.as_ref().is_some_and(|f| f.matches(&g)) {
            p.verified
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let label = picks
                .iter()
                .map(|c| match c {
                    Some(c) if !c.baseline => c.label.clone(),
                    Some(_) => "library kernels".to_string(),
                    None => "-".to_string(),
                })
                .collect::<Vec<_>>()
                .join(if target.has_collectives() {
                    " | all_reduce | "
                } else {
                    " | library | "
                });
            verified.push(Candidate {
                predicted_us: graph_cost(&g, spec)?,
                graph: g,
                hash: h,
                label,
                baseline: false,
            });
        } else {
            p.rejected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    add_baseline_and_rank(target, spec, target_hash, &mut verified, &mut notes)?;
    let n_fused = verified.iter().filter(|c| !c.baseline).count();
    let limit = stop_reasons
        .iter()
        .find(|(_, r)| !r.starts_with("exhausted") && !r.starts_with("no_candidates"));
    let stop_reason = if cancelled {
        "cancelled".to_string()
    } else if let Some((_, r)) = limit {
        r.clone()
    } else if n_fused == 0 {
        let why: Vec<String> = stop_reasons
            .iter()
            .map(|(k, r)| format!("part {k}: {}", r.trim_start_matches("no_candidates: ")))
            .collect();
        format!(
            "no_candidates: the target contains all_reduce, permute, reshape or reduce_max (kept as library kernels); {}",
            if why.is_empty() {
                "no collective-free part to fuse".to_string()
            } else {
                why.join("; ")
            }
        )
    } else {
        "exhausted".to_string()
    };
    let report = super::report_of(
        p,
        cfg,
        start,
        enumerate_s,
        stop_reason,
        (programs, nodes, classes),
        notes,
    );
    Ok(SearchResult {
        candidates: verified,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::fingerprint;
    use crate::ops::UnaryOp;
    use crate::plan::lower;
    use crate::DType;

    #[test]
    fn parts_and_stitch_round_trip() {
        // y = all_reduce(x @ w);  z = rms_norm(y) * s;  out z and all_reduce(z)
        let mut g = KernelGraph::with_world_size(2).unwrap();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let w = g.new_input(&[64, 32], DType::F32).unwrap();
        let s = g.new_input(&[8, 32], DType::F32).unwrap();
        let m = g.matmul(x, w).unwrap();
        let y = g.all_reduce(m).unwrap();
        let r = g.rms_norm(y, &[32], None, 1e-6).unwrap();
        let z = g.binary(crate::ops::BinaryOp::Mul, r, s).unwrap();
        let e = g.unary(UnaryOp::Exp, z).unwrap();
        let a = g.all_reduce(e).unwrap();
        g.mark_output(z).unwrap();
        g.mark_output(a).unwrap();
        let lvl = levels(&g);
        assert_eq!((lvl[m], lvl[y], lvl[z], lvl[a]), (0, 1, 1, 2));
        let ps = parts(&g, &lvl).unwrap();
        assert_eq!(ps.len(), 3);
        let p0 = ps[0].as_ref().unwrap();
        assert_eq!(
            (p0.inputs.clone(), p0.outputs.clone()),
            (vec![x, w], vec![m])
        );
        let p1 = ps[1].as_ref().unwrap();
        assert_eq!(
            (p1.inputs.clone(), p1.outputs.clone()),
            (vec![s, y], vec![z, e])
        );
        assert!(ps[2].is_none());
        let bodies: Vec<Option<&KernelGraph>> =
            ps.iter().map(|p| p.as_ref().map(|p| &p.graph)).collect();
        let h = stitch(&g, &lvl, &ps, &bodies).unwrap();
        assert_eq!(h.world_size(), 2);
        assert_eq!(
            fingerprint(&h, 2, 3, None).unwrap(),
            fingerprint(&g, 2, 3, None).unwrap()
        );
    }

    #[test]
    fn search_returns_stitched_candidates() {
        let mut g = KernelGraph::with_world_size(2).unwrap();
        let x = g.new_input(&[8, 256], DType::F32).unwrap();
        let w = g.new_input(&[256, 128], DType::F32).unwrap();
        let m = g.matmul(x, w).unwrap();
        let y = g.all_reduce(m).unwrap();
        let r = g.rms_norm(y, &[128], None, 1e-6).unwrap();
        g.mark_output(r).unwrap();
        let cfg = SearchConfig {
            time_limit_s: Some(30.0),
            ..SearchConfig::default()
        };
        let res =
            super::super::search(&g, &DeviceSpec::cpu2(), &cfg, &SearchControl::default()).unwrap();
        assert!(res.candidates.iter().any(|c| c.baseline));
        assert!(
            res.report.notes[0].contains("all_reduce"),
            "{:?}",
            res.report.notes
        );
        for c in &res.candidates {
            assert_eq!(c.graph.world_size(), 2);
            assert!(c.graph.has_collectives());
            assert!(lower(&c.graph, &DeviceSpec::cpu2()).is_ok());
        }
        assert!(res.candidates.iter().any(|c| !c.baseline), "{}", res.report);
    }

    #[test]
    fn a_transposed_input_is_split_off_and_the_rest_fused() {
        // out = gemm(transpose(xt), w) with a row sum: the matmul part is still searched
        let mut g = KernelGraph::new();
        let xt = g.new_input(&[256, 8], DType::F32).unwrap();
        let w = g.new_input(&[256, 128], DType::F32).unwrap();
        let x = g.permute(xt, &[1, 0]).unwrap();
        let m = g.matmul(x, w).unwrap();
        let r = g.rms_norm(m, &[128], None, 1e-6).unwrap();
        g.mark_output(r).unwrap();
        let lvl = levels(&g);
        assert_eq!((lvl[xt], lvl[x], lvl[r]), (0, 1, 1));
        let cfg = SearchConfig {
            time_limit_s: Some(30.0),
            ..SearchConfig::default()
        };
        let res =
            super::super::search(&g, &DeviceSpec::cpu2(), &cfg, &SearchControl::default()).unwrap();
        assert!(
            res.report.notes[0].contains("permute"),
            "{:?}",
            res.report.notes
        );
        let fused = res.candidates.iter().find(|c| !c.baseline);
        let fused = fused.unwrap_or_else(|| panic!("{}", res.report));
        assert!(fused.label.contains("custom["), "{}", fused.label);
        let kinds: Vec<_> = fused.graph.ops().iter().map(|o| &o.kind).collect();
        assert!(kinds
            .iter()
            .any(|k| matches!(k, KernelOpKind::Permute { .. })));
        assert!(crate::fingerprint::equivalent(&g, &fused.graph, 2, 0).unwrap());
    }
}
