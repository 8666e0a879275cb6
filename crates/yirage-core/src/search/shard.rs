//! The search split into shards for a distributed executor.
//!
//! The kernel-level DFS starts from a list of first-level moves; shard `i` of `n` explores
//! the moves whose index is `i` modulo `n` (round robin, so the expensive moves spread)
//! with the e-graph, block level and concretisation of the local search, and returns its
//! skeletons as realised candidate graphs with their estimates ([`ShardOutput`], JSON).
//! [`merge_shards`] orders the skeletons by first-level move, as the local search lists
//! them, and runs the local search's ranking and fingerprint verification on the union: a
//! search that runs to exhaustion returns exactly the local search's candidates.
//! Shards share no memo, so block programs reached from several moves are enumerated once
//! per shard; `max_states` and `max_candidates` apply to each shard.

use super::{
    conclude, enumerate_space, real_order, realisations, realise, skeleton_is_fused, Enumerated,
    Realisation, SearchConfig, SearchControl, SearchResult, Space, Stop,
};
use crate::cost::DeviceSpec;
use crate::error::{CoreError, Result};
use crate::fingerprint::with_threads;
use crate::kernel_graph::KernelGraph;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::ProgressSnapshot;

/// One realisation of a shard's skeleton: its concretisation choice, estimate, and the
/// realised graph (JSON; `None` when it does not build, counted as rejected on merge).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRealisation {
    pub choice: Vec<usize>,
    pub est_us: f64,
    pub graph: Option<String>,
    pub label: String,
}

/// One skeleton a shard found: the first-level move it starts with, its kernel count,
/// whether it has a fused kernel, and its realisations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardSkeleton {
    pub first_move: usize,
    pub kernels: usize,
    pub fused: bool,
    pub realisations: Vec<ShardRealisation>,
}

/// What one shard returns to the driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardOutput {
    pub index: usize,
    pub count: usize,
    /// First-level moves of the whole search (equal in every shard of one search).
    pub first_moves: usize,
    /// `exhausted`, `time_limit`, `state_limit`, `candidate_limit` or `cancelled`.
    pub stop: String,
    pub elapsed_s: f64,
    /// Of `elapsed_s`: the e-graph, kernel and block levels, and realising the candidates.
    pub enumerate_s: f64,
    pub realise_s: f64,
    pub progress: ProgressSnapshot,
    pub block_programs: u64,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub skeletons: Vec<ShardSkeleton>,
}

impl ShardOutput {
    /// Canonical JSON (what a worker sends back).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse a worker's JSON.
    pub fn from_json(s: &str) -> Result<ShardOutput> {
        serde_json::from_str(s).map_err(|e| CoreError::Serialization(format!("search shard: {e}")))
    }
}

fn stop_name(s: Stop) -> &'static str {
    match s {
        Stop::None => "exhausted",
        Stop::Time => "time_limit",
        Stop::States => "state_limit",
        Stop::Candidates => "candidate_limit",
        Stop::Cancelled => "cancelled",
        Stop::Verify => "verify_limit",
    }
}

fn stop_of(name: &str) -> Result<Stop> {
    Ok(match name {
        "exhausted" => Stop::None,
        "time_limit" => Stop::Time,
        "state_limit" => Stop::States,
        "candidate_limit" => Stop::Candidates,
        "cancelled" => Stop::Cancelled,
        "verify_limit" => Stop::Verify,
        other => {
            return Err(CoreError::Serialization(format!(
                "search shard: unknown stop {other:?}"
            )))
        }
    })
}

/// The equal-rank target both sides search; multi-device targets are refused (their parts
/// are searched separately, which the shards do not split).
fn shardable(target: &KernelGraph, spec: &DeviceSpec, cfg: &SearchConfig) -> Result<KernelGraph> {
    target.check_complete()?;
    spec.validate()?;
    cfg.validate()?;
    let canon = crate::canon::promote_ranks(target)?;
    if canon.has_collectives() || canon.world_size() > 1 {
        return Err(CoreError::Graph(
            "search shards: multi-device graphs (all_reduce, world_size > 1) are not sharded; search them with the local executor".into(),
        ));
    }
    Ok(canon)
}

/// Run shard `index` of `count` (see the module doc).
pub fn search_shard(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
    index: usize,
    count: usize,
) -> Result<ShardOutput> {
    if count == 0 || index >= count {
        return Err(CoreError::Graph(format!(
            "search shards: shard index {index} is not below the shard count {count} (≥ 1)"
        )));
    }
    let canon = shardable(target, spec, cfg)?;
    let start = Instant::now();
    let (first_moves, tagged, en) = with_threads(cfg.threads, || {
        enumerate_space(&canon, spec, cfg, ctl, start, |i| i % count == index)
    })?;
    let enumerate_s = start.elapsed().as_secs_f64();
    let mut skeletons = Vec::with_capacity(tagged.len());
    for (first_move, sk) in &tagged {
        let reals = realisations(std::slice::from_ref(sk), &canon, spec);
        let realisations = reals
            .iter()
            .map(|r| {
                let built = realise(&canon, sk, &r.choice).ok();
                ShardRealisation {
                    choice: r.choice.clone(),
                    est_us: r.est_us,
                    label: built.as_ref().map(|b| b.1.clone()).unwrap_or_default(),
                    graph: built.map(|b| crate::json::to_json(&b.0)),
                }
            })
            .collect();
        skeletons.push(ShardSkeleton {
            first_move: *first_move,
            kernels: sk.ops.len(),
            fused: skeleton_is_fused(sk),
            realisations,
        });
    }
    Ok(ShardOutput {
        index,
        count,
        first_moves,
        stop: stop_name(en.dfs_stop).into(),
        elapsed_s: start.elapsed().as_secs_f64(),
        enumerate_s,
        realise_s: start.elapsed().as_secs_f64() - enumerate_s,
        progress: ctl.progress.snapshot(),
        block_programs: en.stats.0,
        egraph_nodes: en.stats.1,
        egraph_classes: en.stats.2,
        skeletons,
    })
}

/// Check that `shards` are exactly shards 0..n of one search: never merge a partial set.
fn check_complete_set(shards: &[ShardOutput]) -> Result<()> {
    let n = shards.len();
    let bad = |m: String| Err(CoreError::Graph(format!("search shards: {m}")));
    if n == 0 {
        return bad("no shard outputs to merge".into());
    }
    let mut seen = vec![false; n];
    for s in shards {
        if s.count != n || s.index >= n || seen[s.index] {
            return bad(format!(
                "got {n} outputs but shard {} of {} (every shard exactly once is needed)",
                s.index, s.count
            ));
        }
        seen[s.index] = true;
        if s.first_moves != shards[0].first_moves {
            return bad(format!(
                "shards disagree on the first-level moves ({} against {}): they searched different targets or options",
                s.first_moves, shards[0].first_moves
            ));
        }
    }
    Ok(())
}

/// The most severe stop over the shards (the order the report's stop reason uses).
fn merged_stop(shards: &[ShardOutput]) -> Result<Stop> {
    let mut stops = vec![];
    for s in shards {
        stops.push(stop_of(&s.stop)?);
    }
    let rank = |s: &Stop| match s {
        Stop::Cancelled => 4,
        Stop::Time => 3,
        Stop::States => 2,
        Stop::Candidates => 1,
        // a shard only enumerates; the verification runs on the driver
        Stop::None | Stop::Verify => 0,
    };
    Ok(stops.into_iter().max_by_key(rank).unwrap_or(Stop::None))
}

/// Add a shard's counters to the driver's progress.
fn add_progress(ctl: &SearchControl, s: &ProgressSnapshot) {
    let p = &ctl.progress;
    let add = |a: &std::sync::atomic::AtomicU64, v: u64| {
        a.fetch_add(v, Ordering::Relaxed);
    };
    add(&p.states_explored, s.states_explored);
    add(&p.states_pruned, s.states_pruned);
    add(&p.concretisations, s.concretisations);
    add(&p.smem_rejected, s.smem_rejected);
    add(&p.candidates_found, s.candidates_found);
}

/// Merge the outputs of every shard of one search and verify on this side; `enumerate_s`
/// is the wall time the shards took (it counts into the report's elapsed time).
pub fn merge_shards(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
    shards: &[ShardOutput],
    enumerate_s: f64,
) -> Result<SearchResult> {
    check_complete_set(shards)?;
    let canon = shardable(target, spec, cfg)?;
    let start = Instant::now()
        .checked_sub(Duration::from_secs_f64(enumerate_s.max(0.0)))
        .unwrap_or_else(Instant::now);
    let mut by_move: Vec<&ShardSkeleton> = shards.iter().flat_map(|s| &s.skeletons).collect();
    // stable: within one move, a shard lists skeletons in the DFS's order
    by_move.sort_by_key(|sk| sk.first_move);
    let mut reals: Vec<(Realisation, &ShardRealisation)> = vec![];
    let mut structures = std::collections::HashSet::new();
    for (si, sk) in by_move.iter().enumerate() {
        // the same structure found at another depth of the DFS (see `realisations`)
        let base = sk
            .realisations
            .iter()
            .find(|r| r.choice.iter().all(|&c| c == 0));
        if !structures.insert(base.and_then(|r| r.graph.as_deref()).map(str::to_owned)) {
            continue;
        }
        for r in &sk.realisations {
            let real = Realisation {
                skel: si,
                choice: r.choice.clone(),
                est_us: r.est_us,
            };
            reals.push((real, r));
        }
    }
    reals.sort_by(|a, b| real_order(&a.0, &b.0));
    let (reals, sources): (Vec<Realisation>, Vec<&ShardRealisation>) = reals.into_iter().unzip();
    for s in shards {
        add_progress(ctl, &s.progress);
    }
    let vocab = super::Vocab::from_target(&canon);
    let why = super::blocked(&canon, &vocab);
    let mut notes: Vec<String> = why.iter().map(|(_, note)| note.clone()).collect();
    for s in shards.iter().filter(|s| s.stop != "exhausted") {
        notes.push(format!(
            "shard {} of {} stopped: {}",
            s.index, s.count, s.stop
        ));
    }
    let en = Enumerated {
        dfs_stop: merged_stop(shards)?,
        blocked: why.map(|(w, _)| w),
        notes,
        stats: (
            shards.iter().map(|s| s.block_programs).sum(),
            shards[0].egraph_nodes,
            shards[0].egraph_classes,
        ),
    };
    let realise_at = |i: usize| {
        let src = sources[i];
        let json = src.graph.as_deref().ok_or_else(|| {
            CoreError::Graph("search shards: the realisation did not build on the worker".into())
        })?;
        Ok((crate::json::from_json(json)?, src.label.clone()))
    };
    let space = Space {
        reals: &reals,
        kernels: by_move.iter().map(|sk| sk.kernels).collect(),
        fused_found: by_move.iter().any(|sk| sk.fused),
        realise: &realise_at,
    };
    let mut res = with_threads(cfg.threads, || {
        conclude(&canon, spec, cfg, ctl, start, enumerate_s, en, &space)
    })?;
    if canon != *target {
        res.report.notes.push(
            "lower-rank tensors that enter a broadcast were given leading size-1 dims (rank canonicalisation); the candidates take those shapes".into(),
        );
    }
    Ok(res)
}
