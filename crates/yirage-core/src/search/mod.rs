//! The superoptimizer's search.
//!
//! Pipeline:
//! 1. **Target preprocessing**: every target tensor gets an abstract expression
//!    ([`lift`]); softmax is expanded to exp/sum/div there. The output expressions are
//!    saturated once in an e-graph ([`expr`]); the target's op kinds form the vocabulary.
//! 2. **Kernel level** ([`kernel`]): DFS over library ops and customized ops, at most
//!    `max_kernel_ops` ops of which `max_custom_ops` customized, canonical order, each new
//!    tensor checked against the e-graph.
//! 3. **Block level** for a customized op: (a) abstract block programs ([`block`]),
//!    (b) concretised with dimension classes into grid/loop/tile mappings, built through the
//!    IR's validating builder, checked against the device's shared memory and costed
//!    ([`concrete`]). Results are memoised per input signature.
//! 4. **Ranking and verification**: complete programs are realised with their cheapest
//!    concretisations, ranked by the cost model ([`crate::cost`]) and verified with
//!    finite-field fingerprints in cost order until `top_k` pass; each verified candidate
//!    must also lower to a KernelPlan valid on the device ([`crate::plan`]).
//! 5. The **baseline** (the original graph as library kernels) is always returned too,
//!    labelled, ranked by cost like the rest.
//!
//! Before all that the target is brought to equal ranks ([`crate::canon`]); a target with
//! `all_reduce` is split at its collectives and the parts searched separately ([`split`]).
//!
//! Parallelism: rayon over the first-level moves of both DFS levels and over
//! concretisations; counters are atomics, the cancel flag is checked at every state.
//! Results are collected in move order and ties broken by canonical hash, so the candidate
//! set does not depend on the thread count when the search runs to exhaustion.

pub mod block;
pub mod budget;
pub mod concrete;
pub(crate) mod dims;
pub mod expr;
pub mod kernel;
pub mod lift;
pub mod shard;
pub mod shrink;
mod split;

use crate::cost::{total_cost, DeviceSpec};
use crate::error::{CoreError, Result};
use crate::fingerprint::with_threads;
use crate::kernel_graph::{KernelGraph, KernelOpKind, TensorId};
use crate::ops::{BinaryOp, UnaryOp};
use crate::plan::{graph_profiles, lower, lower_candidate, KernelPlan};
use crate::shape::Dims;
use expr::{RecBuilder, TargetExprs};
use kernel::{KOp, KTensor, LibOp, Memo, Skeleton};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// eps used for tile rms_norm when the target has none (never reached in practice: the
/// op is only in the vocabulary when the target has an rms_norm).
pub const DEFAULT_RMS_EPS: f64 = 1e-6;
/// Verified tilings of one kernel structure returned before other structures are tried.
pub const PER_STRUCTURE: usize = 2;
/// The same for the structure of the best candidate: its tilings differ most in measured
/// time (on the H100 the fused RMSNorm + Linear profiled at 21.3–28.1 µs over four K tiles
/// and grids the model put within 4 % of each other), so the device profiles more of them.
pub const PER_LEADING_STRUCTURE: usize = 4;
/// When another structure's best estimate is within this factor of the best one's, the
/// leading structure leaves it one of the top-k: the model cannot order such structures. On
/// the H100, fused LoRA accumulating X·A and multiplying by B after the loop was predicted
/// 7-9 % below multiplying by B in the loop; both ran 19.3-19.5 µs with a cold L2 at b16,
/// and 14.9 against 11.2 µs with W in L2; at b1 the leader's tilings had filled the top-k.
pub const RUNNER_UP_RATIO: f64 = 1.10;
/// The last of the top-k goes to the best candidate with the fewest kernels when its
/// estimate is within this factor of the best one's and no such candidate is in yet: the
/// model errs most between structures of different kernel counts (on the H100, GQA decode
/// at kv 16384 as two kernels was predicted 52 µs and ran 76; the single fused kernel,
/// predicted 55, ran 54).
pub const FEWEST_KERNELS_RATIO: f64 = 1.25;
/// Candidates estimated slower than this factor times the best estimate, and slower than the
/// library baseline's estimate too, are not fingerprinted: the baseline always races, and
/// the race's screen drops what runs 1.5x the fastest. QK-norm GQA over 3000 keys had 4
/// close candidates verified and then tested 44 more at 11x the best estimate (107 against
/// 9.3 µs, the baseline 35.7), all rejected: 14 of its 19 s of search on 2 cores.
pub const HOPELESS_RATIO: f64 = 3.0;

/// Whether a kernel of `g` has a masked edge tile (a grid that does not divide its dim, or
/// a masked loop).
/// The cost model has no measurements of such tiles yet: on the H100, RMSNorm + Linear at
/// 8×4000×5000 as one masked kernel was predicted 16.2–16.9 µs and ran 22–30, while a
/// library matmul with a divisible RMSNorm kernel, predicted 18.8, ran 15.6. The first pass
/// of the verification therefore leaves one of the top-k to a candidate without them, and
/// the device decides.
fn has_masked_tiles(g: &KernelGraph) -> bool {
    g.ops().iter().any(|op| match &op.kind {
        KernelOpKind::Customized { graph, .. } => {
            graph.masked_axes().iter().any(Option::is_some) || graph.loop_extent().is_some()
        }
        _ => false,
    })
}

/// Whether a candidate of `kernels` kernels must wait: one slot is left of `top_k` (≥ 2, so
/// the best estimate always gets one), and the candidates in (`verified_kernels`) have none
/// of the `fewest` kernels that a close enough candidate has (see [`FEWEST_KERNELS_RATIO`]).
fn held_for_fewest(
    verified_kernels: &[usize],
    fewest: Option<usize>,
    top_k: usize,
    kernels: usize,
) -> bool {
    fewest.is_some_and(|n| {
        top_k >= 2
            && kernels != n
            && verified_kernels.len() + 1 == top_k
            && !verified_kernels.contains(&n)
    })
}

/// Whether a masked candidate of `kernels` kernels must wait in the first pass, with
/// `verified_masked` masked candidates in (`verified_kernels`: the kernel counts of all that
/// are in). Masked ones leave one of the top-k to a candidate without masked tiles (see
/// [`has_masked_tiles`]); while the last slot is also owed to the `fewest` kernels
/// ([`held_for_fewest`]), they leave two, and the candidate that the fewest-kernel slot waits
/// for never waits for being masked: GQA decode over 6000 keys had only masked candidates,
/// the unmasked slot went to a fifth two-kernel tiling, and the single masked kernel (the
/// form that ran fastest at the nearby kv 5000) was never profiled.
fn held_as_masked(
    verified_kernels: &[usize],
    verified_masked: usize,
    fewest: Option<usize>,
    top_k: usize,
    kernels: usize,
) -> bool {
    let fewest_owed = fewest.is_some_and(|n| top_k >= 2 && !verified_kernels.contains(&n));
    if fewest_owed && fewest == Some(kernels) {
        return false;
    }
    let cap = if fewest_owed && top_k >= 3 {
        top_k - 2
    } else {
        top_k.saturating_sub(1).max(1)
    };
    verified_masked >= cap
}

/// How many candidates the verification loop fingerprints at once: with few threads one
/// fingerprint keeps them busy; the memory of each (16-byte field values, about twice the
/// target's tensors) must fit in half of the available memory.
fn verify_width(target: &KernelGraph) -> usize {
    let by_threads = (rayon::current_num_threads() / 2).clamp(1, 4);
    let elems: u64 = target
        .tensors()
        .iter()
        .map(|t| crate::shape::numel_saturating(&t.dims))
        .sum::<u64>()
        .saturating_mul(target.world_size() as u64);
    let per_candidate = elems.saturating_mul(32).max(1);
    let budget = available_memory_bytes().unwrap_or(4 << 30) / 2;
    by_threads.min(
        usize::try_from(budget / per_candidate)
            .unwrap_or(usize::MAX)
            .max(1),
    )
}

/// `MemAvailable` of /proc/meminfo (Linux), in bytes.
fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Whether work expected to take `expected` from now would end after `deadline`.
fn past_deadline(deadline: Option<Instant>, expected: Duration) -> bool {
    deadline.is_some_and(|d| {
        Instant::now()
            .checked_add(expected)
            .is_none_or(|end| end > d)
    })
}

/// Whether a check of `work` units would take the verification past `limit` after `spent`
/// (small checks never do: see [`budget::SMALL_WORK`]).
fn over_work_limit(limit: Option<u64>, spent: u64, work: u64) -> bool {
    work >= budget::SMALL_WORK && limit.is_some_and(|l| spent.saturating_add(work) > l)
}

/// Up to `n` candidates from `queue` (indices into the space's realisations) that the
/// verification loop may fingerprint next, realised: those `eligible` says are not held
/// back, that realise and lower, and whose hash is not `known`.
fn lookahead(
    realise_at: RealiseAt<'_>,
    queue: &[usize],
    spec: &DeviceSpec,
    n: usize,
    eligible: impl Fn(usize) -> bool,
    known: impl Fn(&str) -> bool,
) -> Vec<(String, KernelGraph)> {
    let mut out: Vec<(String, KernelGraph)> = vec![];
    for &i in queue {
        if out.len() >= n {
            break;
        }
        if !eligible(i) {
            continue;
        }
        let Ok((g, _)) = realise_at(i) else {
            continue;
        };
        let h = crate::json::hash(&g);
        if known(&h) || out.iter().any(|(o, _)| *o == h) || lower_candidate(&g, spec).is_err() {
            continue;
        }
        out.push((h, g));
    }
    out
}

/// A candidate label without the op lists of its kernels (`custom[grid=8x1x1 loop=4: a,b]`
/// becomes `custom[grid=8x1x1 loop=4]`): its kernels and tilings only.
fn tiling_key(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    let mut skipping = false;
    for c in label.chars() {
        match c {
            ':' if !skipping => skipping = true,
            ']' if skipping => {
                skipping = false;
                out.push(c);
            }
            _ if !skipping => out.push(c),
            _ => {}
        }
    }
    out
}

/// The family of a candidate's label: what its generated kernels compute (their op lists)
/// and which library kernels it calls, without grids and loops, and without kernels that only
/// add up split-K partials. Tilings and split-K forms of one computation are one family.
fn family_key(label: &str) -> String {
    label
        .split(" ; ")
        .filter_map(|part| match part.split_once(": ") {
            Some((_, ops)) => {
                let ops = ops.trim_end_matches(']');
                (ops != "accum_iter").then_some(ops)
            }
            None => Some(part),
        })
        .collect::<Vec<_>>()
        .join(" ; ")
}

/// Whether a candidate of the first verified candidate's family must wait for the last of the
/// top-k (`verified` in, each marked whether it is of the leading family): no other family is
/// in yet, and the candidate is within [`FEWEST_KERNELS_RATIO`] of the best estimate (`near`),
/// so a close candidate of another family may still come. The model errs more between
/// families than between tilings of one: on the H200, fused LoRA multiplying by B inside the
/// loop was predicted 10 % slower than multiplying after it and ran 9.2 µs against 21 µs at
/// 16 rows (12.5 against 15.6 at one row), while the leading family's tilings filled the
/// top-k.
fn held_for_other_family(verified: &[bool], top_k: usize, leading: bool, near: bool) -> bool {
    top_k >= 2 && leading && near && verified.len() + 1 == top_k && verified.iter().all(|&l| l)
}

/// The default of [`SearchConfig::verify_work_limit`], in units of [`budget::eval_work`]:
/// about 2 s of checks on a 16-core host (one field multiply-add took 1.5–2.6 ns on one
/// core; the verification runs four checks at once, about 6× one core on 16), 40 % of the
/// 10 s a cold `superoptimize` may take; 4–9 s on this project's 2-core machine.
pub const DEFAULT_VERIFY_WORK_LIMIT: u64 = 6_000_000_000;

/// Search options (JSON from Python: every field optional).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// Wall-clock limit in seconds (`None`: no limit). The DFS gets 70 % of it, the
    /// verification the rest.
    pub time_limit_s: Option<f64>,
    /// Stop after this many search states.
    pub max_states: Option<u64>,
    /// Stop after this many complete (unverified) candidates.
    pub max_candidates: Option<u64>,
    /// Verified candidates to return (besides the baseline).
    pub top_k: usize,
    /// Fingerprint trials per verification.
    pub trials: usize,
    pub seed: u64,
    /// Worker threads (`None`: rayon's default pool).
    pub threads: Option<usize>,
    /// Sort results by (cost, canonical hash) so the set is thread-count independent.
    pub deterministic: bool,
    /// Abstract-expression pruning (disable to measure its effect).
    pub prune: bool,
    pub max_kernel_ops: usize,
    pub max_custom_ops: usize,
    pub max_custom_inputs: usize,
    pub max_block_ops: usize,
    pub max_accums: usize,
    /// Assignments evaluated per abstract block program.
    pub max_concretisations: usize,
    /// Fingerprint tests at most (the verification stops after this many).
    pub max_verify: usize,
    /// Fingerprint every candidate at the target's full size (default: at a reduced row
    /// count where the candidate's tiling allows, see [`shrink`]).
    pub verify_full_size: bool,
    /// Work the verification may spend on large fingerprint checks, in units of
    /// [`budget::eval_work`] over the trials (`None`: no limit). A large check that would
    /// take the total past it is not started; checks below [`budget::SMALL_WORK`] always
    /// run. Work, not seconds, so that what a search verifies does not depend on the load
    /// or the clock.
    pub verify_work_limit: Option<u64>,
    pub egraph_node_limit: usize,
    /// `attention`, `mlp` or `lora`: narrows the space (see [`SearchConfig::apply_preset`]).
    pub preset: Option<String>,
}

/// States the enumeration explores by default. Every bench workload but one ends below it
/// (GQA decode explores 314,000); QK-norm attention's graphs of three kernels alone are 8.3
/// million (two minutes on two threads), and a count, unlike a clock, cuts them at the same
/// place on any machine and load. The deepening DFS has found every graph of one and two
/// kernels by 220,000; QK-norm's five best were the same at 250,000, 500,000 and 1,000,000
/// states, and 1,000,000 took 4.9 s of its 11.5 s cold `superoptimize` on a 16-core host.
pub const DEFAULT_MAX_STATES: u64 = 500_000;

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            time_limit_s: Some(60.0),
            max_states: Some(DEFAULT_MAX_STATES),
            max_candidates: None,
            top_k: 4,
            trials: 2,
            seed: 0,
            threads: None,
            deterministic: false,
            prune: true,
            max_kernel_ops: 4,
            max_custom_ops: 2,
            max_custom_inputs: 4,
            max_block_ops: 9,
            max_accums: 4,
            max_concretisations: 20_000,
            max_verify: 48,
            verify_full_size: false,
            verify_work_limit: Some(DEFAULT_VERIFY_WORK_LIMIT),
            egraph_node_limit: 20_000,
            preset: None,
        }
    }
}

impl SearchConfig {
    /// Parse JSON options (unknown keys are an error, so typos are loud).
    pub fn from_json(s: &str) -> Result<SearchConfig> {
        let mut c: SearchConfig = serde_json::from_str(s)
            .map_err(|e| CoreError::Serialization(format!("search config: {e}")))?;
        c.apply_preset()?;
        Ok(c)
    }

    /// Canonical JSON (cache keys).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Narrow the space for a known workload family. The defaults find every family
    /// without a preset; presets only make the search faster.
    pub fn apply_preset(&mut self) -> Result<()> {
        match self.preset.as_deref() {
            None => {}
            Some("attention") => {
                // 9: QK-norm attention's one-kernel form (rms_norm(Q), K's norm fragment,
                // matmul, mul_scalar, exp, matmul, two accumulators, div).
                self.max_kernel_ops = self.max_kernel_ops.min(2);
                self.max_block_ops = self.max_block_ops.min(9);
            }
            Some("mlp") | Some("lora") => {
                self.max_kernel_ops = self.max_kernel_ops.min(2);
                self.max_custom_ops = self.max_custom_ops.min(1);
                self.max_block_ops = self.max_block_ops.min(7);
            }
            Some(other) => {
                return Err(CoreError::Graph(format!(
                    "search config: unknown preset {other:?}; expected \"attention\", \"mlp\" or \"lora\""
                )))
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(CoreError::Graph(format!("search config: {m}")));
        if let Some(t) = self.time_limit_s {
            if !(t.is_finite() && t >= 0.0) {
                return bad("time_limit_s must be a finite number ≥ 0");
            }
        }
        if self.top_k == 0 {
            return bad("top_k must be ≥ 1");
        }
        if self.trials == 0 {
            return bad("trials must be ≥ 1");
        }
        if self.threads == Some(0) {
            return bad("threads must be ≥ 1");
        }
        if self.max_kernel_ops == 0 || self.max_block_ops == 0 || self.max_custom_inputs == 0 {
            return bad("max_kernel_ops, max_block_ops and max_custom_inputs must be ≥ 1");
        }
        Ok(())
    }
}

/// Progress counters (atomics, readable while the search runs).
#[derive(Debug, Default)]
pub struct Progress {
    pub states_explored: AtomicU64,
    pub states_pruned: AtomicU64,
    pub concretisations: AtomicU64,
    pub smem_rejected: AtomicU64,
    pub candidates_found: AtomicU64,
    pub fingerprint_tests: AtomicU64,
    pub verified: AtomicU64,
    pub rejected: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressSnapshot {
    pub states_explored: u64,
    pub states_pruned: u64,
    pub concretisations: u64,
    pub smem_rejected: u64,
    pub candidates_found: u64,
    pub fingerprint_tests: u64,
    pub verified: u64,
    pub rejected: u64,
}

impl Progress {
    pub fn snapshot(&self) -> ProgressSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProgressSnapshot {
            states_explored: g(&self.states_explored),
            states_pruned: g(&self.states_pruned),
            concretisations: g(&self.concretisations),
            smem_rejected: g(&self.smem_rejected),
            candidates_found: g(&self.candidates_found),
            fingerprint_tests: g(&self.fingerprint_tests),
            verified: g(&self.verified),
            rejected: g(&self.rejected),
        }
    }
}

/// Cancellation flag and progress counters shared with the caller.
#[derive(Debug, Clone, Default)]
pub struct SearchControl {
    pub cancel: Arc<AtomicBool>,
    pub progress: Arc<Progress>,
}

/// Why the search stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Stop {
    None = 0,
    Time = 1,
    States = 2,
    Candidates = 3,
    Cancelled = 4,
    /// The verification ran `max_verify` fingerprint tests with fewer than `top_k` verified
    /// and candidates left (set by the verification loop only).
    Verify = 5,
}

/// The search report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SearchReport {
    pub states_explored: u64,
    pub states_pruned: u64,
    pub fingerprint_tests: u64,
    pub verified: u64,
    pub rejected: u64,
    pub elapsed_s: f64,
    /// Time spent enumerating (e-graph, kernel and block levels) and verifying/lowering.
    pub enumerate_s: f64,
    pub verify_s: f64,
    pub threads: usize,
    /// `exhausted`, `time_limit`, `state_limit`, `candidate_limit`, `verify_limit`,
    /// `cancelled` or `no_candidates: <why>`.
    pub stop_reason: String,
    pub candidates_found: u64,
    pub concretisations: u64,
    pub smem_rejected: u64,
    pub block_programs: u64,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub pruning: bool,
    pub deterministic: bool,
    /// Answered from the disk cache (set by the Python layer).
    pub cache_hit: bool,
    pub notes: Vec<String>,
}

impl SearchReport {
    /// Canonical JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl std::fmt::Display for SearchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "search {} after {:.2} s ({:.2} s enumerating, {:.2} s verifying) on {} threads (pruning {})",
            self.stop_reason,
            self.elapsed_s,
            self.enumerate_s,
            self.verify_s,
            self.threads,
            if self.pruning { "on" } else { "off" }
        )?;
        writeln!(
            f,
            "  states explored {}, pruned by abstract expressions {}, block programs {}, concretisations {} ({} over shared memory)",
            self.states_explored, self.states_pruned, self.block_programs, self.concretisations, self.smem_rejected
        )?;
        write!(
            f,
            "  candidates {}, fingerprint tests {}, verified {}, rejected {}; e-graph {} nodes / {} classes",
            self.candidates_found,
            self.fingerprint_tests,
            self.verified,
            self.rejected,
            self.egraph_nodes,
            self.egraph_classes
        )?;
        for n in &self.notes {
            write!(f, "\n  note: {n}")?;
        }
        Ok(())
    }
}

/// One returned µGraph.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub graph: KernelGraph,
    /// Predicted time on the device (cost model).
    pub predicted_us: f64,
    /// Canonical content hash of `graph`.
    pub hash: String,
    /// Human-readable structure, e.g. `custom[grid=48x1x1 loop=16: matmul,accum_iter,…]`.
    pub label: String,
    /// True for the original graph lowered to library kernels.
    pub baseline: bool,
}

impl Candidate {
    /// Lower to a KernelPlan validated against `spec`.
    pub fn kernel_plan(&self, spec: &DeviceSpec) -> Result<KernelPlan> {
        lower(&self.graph, spec)
    }
}

/// Result of a search: candidates best predicted first, and the report.
#[derive(Debug, Clone)]
pub struct SearchResult {
    pub candidates: Vec<Candidate>,
    pub report: SearchReport,
}

/// Op kinds of the target, which bound the search's vocabulary.
#[derive(Debug, Clone, Default)]
pub struct Vocab {
    pub unary: Vec<UnaryOp>,
    pub binary: Vec<BinaryOp>,
    pub reduction: bool,
    /// Reduced dims, counted from the end (1 = last): reductions are only tried there.
    pub reduction_dims_from_end: Vec<usize>,
    pub rms_eps: Option<f64>,
    pub rms_norms: Vec<(Dims, bool, f64)>,
    pub softmax_dims: Vec<usize>,
    pub unsupported: Vec<String>,
    /// Single-source elementwise/reduction sub-DAGs of the target ([`block::Fragment`]).
    pub fragments: Vec<block::Fragment>,
}

impl Vocab {
    fn from_target(g: &KernelGraph) -> Vocab {
        let mut v = Vocab::default();
        let un = |v: &mut Vocab, op: UnaryOp| {
            if !v.unary.contains(&op) {
                v.unary.push(op);
            }
        };
        let bin = |v: &mut Vocab, op: BinaryOp| {
            if !v.binary.contains(&op) {
                v.binary.push(op);
            }
        };
        for op in g.ops() {
            match &op.kind {
                KernelOpKind::Input { .. } | KernelOpKind::Matmul { .. } => {}
                KernelOpKind::Unary { op, .. } => un(&mut v, *op),
                KernelOpKind::Binary { op, .. } => bin(&mut v, *op),
                KernelOpKind::Reduction { x, dim } => {
                    v.reduction = true;
                    let from_end = g.tensors()[*x].dims.len() - dim;
                    if !v.reduction_dims_from_end.contains(&from_end) {
                        v.reduction_dims_from_end.push(from_end);
                    }
                }
                KernelOpKind::RmsNorm {
                    normalized_shape,
                    weight,
                    eps,
                    ..
                } => {
                    v.rms_eps.get_or_insert(*eps);
                    // rms_norm ↦ x / rms(x) (× weight): fused forms divide (and multiply).
                    bin(&mut v, BinaryOp::Div);
                    let e = (normalized_shape.clone(), weight.is_some(), *eps);
                    if !v.rms_norms.contains(&e) {
                        v.rms_norms.push(e);
                    }
                    if weight.is_some() {
                        bin(&mut v, BinaryOp::Mul);
                    }
                }
                KernelOpKind::Softmax { x, dim } => {
                    if !v.softmax_dims.contains(dim) {
                        v.softmax_dims.push(*dim);
                    }
                    let from_end = g.tensors()[*x].dims.len() - dim;
                    if !v.reduction_dims_from_end.contains(&from_end) {
                        v.reduction_dims_from_end.push(from_end);
                    }
                    un(&mut v, UnaryOp::Exp);
                    bin(&mut v, BinaryOp::Div);
                    v.reduction = true;
                }
                KernelOpKind::Concat { .. } => v.unsupported.push("concat".into()),
                KernelOpKind::Chunk { .. } => v.unsupported.push("chunk".into()),
                KernelOpKind::Permute { .. } => v.unsupported.push("permute".into()),
                KernelOpKind::ReduceMax { .. } => v.unsupported.push("reduce_max".into()),
                KernelOpKind::Reshape { .. } => v.unsupported.push("reshape".into()),
                KernelOpKind::AllReduce { .. } => v.unsupported.push("all_reduce".into()),
                KernelOpKind::Customized { graph, .. } => {
                    for bop in graph.ops() {
                        use crate::block_graph::BlockOpKind as B;
                        match bop {
                            B::Unary { op, .. } => un(&mut v, *op),
                            B::Binary { op, .. } => bin(&mut v, *op),
                            B::Reduction { x, dim } | B::ReductionToDimx { x, dim } => {
                                v.reduction = true;
                                let from_end = graph.tiles()[*x].dims.len() - dim;
                                if !v.reduction_dims_from_end.contains(&from_end) {
                                    v.reduction_dims_from_end.push(from_end);
                                }
                            }
                            B::RmsNorm { eps, .. } => {
                                v.rms_eps.get_or_insert(*eps);
                                bin(&mut v, BinaryOp::Div);
                            }
                            B::ForloopAccum {
                                kind: crate::ops::AccumKind::Rms { eps },
                                ..
                            } => {
                                v.rms_eps.get_or_insert(*eps);
                            }
                            B::Concat { .. } => {
                                v.unsupported.push("concat (in a customized op)".into())
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        v.unsupported.dedup();
        v.fragments = block::fragments(g);
        v
    }
}

/// Shared state of one search run.
pub struct Run {
    pub cfg: SearchConfig,
    pub spec: DeviceSpec,
    pub target: TargetExprs,
    pub target_output_dims: Vec<Dims>,
    /// The target's index classes, whose labels the enumeration carries ([`dims::Labels`]).
    pub index_classes: dims::TargetClasses,
    ctl: SearchControl,
    dfs_deadline: Option<Instant>,
    stop: AtomicU8,
    /// Ops and programs dropped because they link dims the target keeps apart.
    mixed: AtomicU64,
}

impl Run {
    fn set_stop(&self, s: Stop) {
        let _ = self.stop.compare_exchange(
            Stop::None as u8,
            s as u8,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    fn stop_reason(&self) -> Stop {
        match self.stop.load(Ordering::Relaxed) {
            1 => Stop::Time,
            2 => Stop::States,
            3 => Stop::Candidates,
            4 => Stop::Cancelled,
            _ => Stop::None,
        }
    }

    /// Should the enumeration stop? (Checks the cancel flag, the clock and the limits.)
    pub fn stopped(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) != 0 {
            return true;
        }
        let p = &self.ctl.progress;
        if self.ctl.cancel.load(Ordering::Relaxed) {
            self.set_stop(Stop::Cancelled);
        } else if self.dfs_deadline.is_some_and(|d| Instant::now() >= d) {
            self.set_stop(Stop::Time);
        } else if self
            .cfg
            .max_states
            .is_some_and(|m| p.states_explored.load(Ordering::Relaxed) >= m)
        {
            self.set_stop(Stop::States);
        } else if self
            .cfg
            .max_candidates
            .is_some_and(|m| p.candidates_found.load(Ordering::Relaxed) >= m)
        {
            self.set_stop(Stop::Candidates);
        }
        self.stop.load(Ordering::Relaxed) != 0
    }

    /// Count one explored state; returns true if the search must stop.
    pub fn count_state(&self) -> bool {
        self.ctl
            .progress
            .states_explored
            .fetch_add(1, Ordering::Relaxed);
        self.stopped()
    }
    pub fn count_pruned(&self) {
        self.ctl
            .progress
            .states_pruned
            .fetch_add(1, Ordering::Relaxed);
    }
    /// Count an op or program dropped for linking dims the target keeps apart (also a
    /// pruned state).
    pub fn count_mixed(&self) {
        self.mixed.fetch_add(1, Ordering::Relaxed);
        self.count_pruned();
    }
    pub fn count_concretisation(&self) {
        self.ctl
            .progress
            .concretisations
            .fetch_add(1, Ordering::Relaxed);
    }
    pub fn count_smem_reject(&self) {
        self.ctl
            .progress
            .smem_rejected
            .fetch_add(1, Ordering::Relaxed);
    }
    pub fn count_candidate(&self) {
        self.ctl
            .progress
            .candidates_found
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// One way to realise a skeleton: a concretisation index per customized op.
struct Realisation {
    skel: usize,
    choice: Vec<usize>,
    est_us: f64,
}

fn realise(target: &KernelGraph, sk: &Skeleton, choice: &[usize]) -> Result<(KernelGraph, String)> {
    let mut g = KernelGraph::new();
    let mut map: Vec<TensorId> = vec![];
    for (dims, dtype) in target.input_signature() {
        let d: Vec<i64> = dims.iter().map(|&x| x as i64).collect();
        map.push(g.new_input(&d, dtype)?);
    }
    let mut labels = vec![];
    let mut ci = 0;
    for (op, ids) in &sk.ops {
        let m = |t: usize| map[t];
        let outs: Vec<TensorId> = match op {
            KOp::Lib(l) => {
                labels.push(l.name());
                vec![match l {
                    LibOp::Matmul(a, b) => g.matmul(m(*a), m(*b))?,
                    LibOp::Unary(u, x) => g.unary(*u, m(*x))?,
                    LibOp::Binary(b, x, y) => g.binary(*b, m(*x), m(*y))?,
                    LibOp::Reduction(x, d) => g.reduction(m(*x), *d as i64)?,
                    LibOp::RmsNorm { x, ns, w, eps } => {
                        let ns: Vec<i64> = ns.iter().map(|&v| v as i64).collect();
                        g.rms_norm(m(*x), &ns, w.map(m), *eps)?
                    }
                    LibOp::Softmax(x, d) => g.softmax(m(*x), *d as i64)?,
                }]
            }
            KOp::Custom {
                inputs,
                prog,
                group,
            } => {
                let c = group
                    .concretes
                    .get(choice.get(ci).copied().unwrap_or(0))
                    .ok_or_else(|| CoreError::Graph("search: concretisation index".into()))?;
                ci += 1;
                let bg = &c.graph;
                let gd = bg.grid_dim();
                labels.push(format!(
                    "custom[grid={}x{}x{} loop={}{}: {}]",
                    gd[0],
                    gd[1],
                    gd[2],
                    bg.forloop_range(),
                    bg.loop_tile().map_or_else(String::new, |t| format!("x{t}")),
                    prog.describe()
                ));
                let ins: Vec<TensorId> = inputs.iter().map(|&t| m(t)).collect();
                g.customized(&ins, bg)?
            }
        };
        if outs.len() != ids.len() {
            return Err(CoreError::Graph(
                "search: output count of a realised op".into(),
            ));
        }
        map.extend(outs);
    }
    for &o in &sk.outputs {
        g.mark_output(map[o])?;
    }
    Ok((g, labels.join(" ; ")))
}

fn graph_cost(g: &KernelGraph, spec: &DeviceSpec) -> Result<f64> {
    Ok(total_cost(spec, &graph_profiles(g)?))
}

/// Realisations of every skeleton: the cheapest concretisation of each customized op,
/// plus, per op, its next-cheapest alternatives (so a concretisation that fails
/// verification is replaced by the next one).
///
/// A structure the deepening DFS found at two depths (the same ops, programs and output
/// groups) is realised once, for its first skeleton: a copy would take the verification
/// slots meant for other structures.
fn realisations(skels: &[Skeleton], target: &KernelGraph, spec: &DeviceSpec) -> Vec<Realisation> {
    let mut out = vec![];
    let mut structures = std::collections::HashSet::new();
    for (si, sk) in skels.iter().enumerate() {
        let groups: Vec<&concrete::Group> = sk
            .ops
            .iter()
            .filter_map(|(op, _)| match op {
                KOp::Custom { group, .. } => Some(group.as_ref()),
                KOp::Lib(_) => None,
            })
            .collect();
        let best = vec![0; groups.len()];
        let Ok((g, _)) = realise(target, sk, &best) else {
            continue;
        };
        if !structures.insert(crate::json::to_json(&g)) {
            continue;
        }
        let Ok(base) = graph_cost(&g, spec) else {
            continue;
        };
        out.push(Realisation {
            skel: si,
            choice: best.clone(),
            est_us: base,
        });
        for (slot, g) in groups.iter().enumerate() {
            let c0 = g.concretes[0].cost_us;
            for (j, c) in g.concretes.iter().enumerate().skip(1) {
                let mut choice = best.clone();
                choice[slot] = j;
                out.push(Realisation {
                    skel: si,
                    choice,
                    est_us: base - c0 + c.cost_us,
                });
            }
        }
    }
    out.sort_by(real_order);
    out
}

/// The verification's order: best estimate first, ties by skeleton and choice.
fn real_order(a: &Realisation, b: &Realisation) -> std::cmp::Ordering {
    a.est_us
        .total_cmp(&b.est_us)
        .then(a.skel.cmp(&b.skel))
        .then(a.choice.cmp(&b.choice))
}

fn target_exprs(g: &KernelGraph, node_limit: usize) -> Result<TargetExprs> {
    let mut b = RecBuilder::default();
    let vals = lift::lift_kernel_graph(&mut b, g).ok_or_else(|| {
        CoreError::Graph("search: could not build the target's abstract expressions".into())
    })?;
    let roots: Vec<egg::Id> = g.outputs().iter().map(|&o| vals[o]).collect();
    Ok(TargetExprs::saturate_roots(&b.expr, &roots, node_limit, 30))
}

/// Search for µGraphs equivalent to `target`, best predicted first.
///
/// Errors: a target without outputs, an invalid config or device spec, a target the
/// fingerprinter cannot evaluate. Everything else (limits, cancellation, nothing found)
/// ends in a report whose `stop_reason` says why; the baseline is always returned.
pub fn search(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
) -> Result<SearchResult> {
    target.check_complete()?;
    spec.validate()?;
    cfg.validate()?;
    // Equal ranks (numpy rank promotion made explicit, see crate::canon): candidates take
    // the canonical input/output shapes, which differ from the target's by leading 1s.
    let canon = crate::canon::promote_ranks(target)?;
    let promoted = canon != *target;
    let threads = cfg.threads;
    let mut res = with_threads(threads, || {
        // multi-device graphs (per-rank parts, stitched back at their world_size) too
        let split = canon.has_collectives() || canon.world_size() > 1;
        if split || split::has_library_boundaries(&canon) {
            split::search_split(&canon, spec, cfg, ctl)
        } else {
            search_in_pool(&canon, spec, cfg, ctl)
        }
    })?;
    if promoted {
        res.report.notes.push(
            "lower-rank tensors that enter a broadcast were given leading size-1 dims (rank canonicalisation); the candidates take those shapes".into(),
        );
    }
    Ok(res)
}

fn search_in_pool(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
) -> Result<SearchResult> {
    let start = Instant::now();
    let (_, tagged, en) = enumerate_space(target, spec, cfg, ctl, start, |_| true)?;
    let enumerate_s = start.elapsed().as_secs_f64();
    let skeletons: Vec<Skeleton> = tagged.into_iter().map(|(_, sk)| sk).collect();
    let reals = realisations(&skeletons, target, spec);
    let realise_at = |i: usize| {
        let r = &reals[i];
        realise(target, &skeletons[r.skel], &r.choice)
    };
    let space = Space {
        reals: &reals,
        kernels: skeletons.iter().map(|sk| sk.ops.len()).collect(),
        fused_found: skeletons.iter().any(skeleton_is_fused),
        realise: &realise_at,
    };
    conclude(target, spec, cfg, ctl, start, enumerate_s, en, &space)
}

/// Whether a skeleton has a customized (fused) kernel.
fn skeleton_is_fused(sk: &Skeleton) -> bool {
    sk.ops
        .iter()
        .any(|(op, _)| matches!(op, KOp::Custom { .. }))
}

/// Why a target is not searched beyond its baseline (ops the search does not fuse, mixed
/// input dtypes): the stop reason's words and the report's note.
fn blocked(target: &KernelGraph, vocab: &Vocab) -> Option<(String, String)> {
    let dtypes: Vec<_> = target.input_signature().iter().map(|s| s.1).collect();
    if !vocab.unsupported.is_empty() {
        let ops = vocab.unsupported.join(", ");
        Some((
            format!("the target contains {ops}"),
            format!("the target contains {ops}, which the search does not fuse; only the baseline is returned"),
        ))
    } else if dtypes.windows(2).any(|w| w[0] != w[1]) {
        Some((
            "the target mixes input dtypes".into(),
            "the target mixes input dtypes; only the baseline is returned".into(),
        ))
    } else {
        None
    }
}

/// What the enumeration leaves for the verification and the report.
struct Enumerated {
    dfs_stop: Stop,
    /// Why only the baseline is searched (see [`blocked`]).
    blocked: Option<String>,
    notes: Vec<String>,
    /// Block programs enumerated, e-graph nodes, e-graph classes.
    stats: (u64, usize, usize),
}

/// Skeletons tagged with the index of the first-level move each starts with.
type Tagged = Vec<(usize, Skeleton)>;

/// The e-graph, kernel and block levels of the search below the first-level moves `keep`
/// accepts: the number of first-level moves, the skeletons with the move each starts with.
fn enumerate_space(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
    start: Instant,
    keep: impl Fn(usize) -> bool + Sync,
) -> Result<(usize, Tagged, Enumerated)> {
    let limit = cfg.time_limit_s.map(Duration::from_secs_f64);
    let vocab = Vocab::from_target(target);
    let texprs = target_exprs(target, cfg.egraph_node_limit)?;
    let run = Run {
        cfg: cfg.clone(),
        spec: spec.clone(),
        target: texprs,
        target_output_dims: target
            .outputs()
            .iter()
            .map(|&o| target.tensors()[o].dims.clone())
            .collect(),
        index_classes: dims::TargetClasses::of(target),
        ctl: ctl.clone(),
        dfs_deadline: limit.map(|l| start + l.mul_f64(0.7)),
        stop: AtomicU8::new(0),
        mixed: AtomicU64::new(0),
    };
    let memo = Memo::default();
    let why = blocked(target, &vocab);
    let mut notes = vec![];
    let (n_first, tagged) = match &why {
        Some((_, note)) => {
            notes.push(note.clone());
            (0, vec![])
        }
        None => {
            let inputs: Vec<KTensor> = target
                .input_signature()
                .iter()
                .enumerate()
                .map(|(i, (dims, dtype))| {
                    let abs = run.target.lookup(expr::AbsNode::Sym(format!("in{i}")));
                    KTensor {
                        dims: dims.clone(),
                        value_dims: dims.clone(),
                        dtype: *dtype,
                        abs,
                        chunks: None,
                        elem_bytes: dtype.size_bytes(),
                        labels: run.index_classes.input_labels(i, dims.len()),
                    }
                })
                .collect();
            kernel::search_kernels_where(&run, &vocab, &memo, inputs, keep)
        }
    };
    let mixed = run.mixed.load(Ordering::Relaxed);
    if mixed > 0 {
        notes.push(format!(
            "{mixed} op(s) or block program(s) were cut during the enumeration: they pair dims the graph keeps apart (equal extents let them type-check)"
        ));
    }
    let en = Enumerated {
        dfs_stop: run.stop_reason(),
        blocked: why.map(|(w, _)| w),
        notes,
        stats: (memo.programs() as u64, run.target.nodes, run.target.classes),
    };
    Ok((n_first, tagged, en))
}

/// How [`Space`] realises its i-th realisation.
type RealiseAt<'a> = &'a (dyn Fn(usize) -> Result<(KernelGraph, String)> + Sync);

/// The enumerated candidates the verification ranks: realisations best estimate first,
/// each skeleton's kernel count, whether any skeleton is fused, and how to realise the
/// i-th realisation (from skeletons locally, from shipped graphs after a sharded search).
struct Space<'a> {
    reals: &'a [Realisation],
    kernels: Vec<usize>,
    fused_found: bool,
    realise: RealiseAt<'a>,
}

/// Rank and verify the candidates of `space`, add the baseline and write the report.
#[allow(clippy::too_many_arguments)]
fn conclude(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
    start: Instant,
    enumerate_s: f64,
    en: Enumerated,
    space: &Space<'_>,
) -> Result<SearchResult> {
    let deadline = cfg.time_limit_s.map(|l| start + Duration::from_secs_f64(l));
    let dfs_stop = en.dfs_stop;
    let mut notes = en.notes;
    let target_hash = crate::json::hash(target);
    let (mut verified, verify_stop, rejects) =
        verify_space(target, spec, cfg, ctl, deadline, &target_hash, space)?;
    if rejects.plan > 0 {
        notes.push(format!(
            "{} candidate(s) did not lower to a valid kernel plan on this device",
            rejects.plan
        ));
    }
    if rejects.mixed > 0 {
        notes.push(format!(
            "{} candidate(s) were rejected without a fingerprint test: they pair dims the graph keeps apart (equal extents let them type-check)",
            rejects.mixed
        ));
    }
    if rejects.over_time > 0 {
        notes.push(format!(
            "{} candidate(s) were left unverified: their fingerprint checks, estimated from the checks already run, would have ended after the time limit",
            rejects.over_time
        ));
    }
    if rejects.hopeless > 0 {
        notes.push(format!(
            "{} candidate(s) were left unverified: estimated slower than {HOPELESS_RATIO}x the best estimate and than the library baseline",
            rejects.hopeless
        ));
    }
    if rejects.over_work > 0 {
        notes.push(format!(
            "{} candidate(s) were left unverified: their fingerprint checks would have taken the verification past verify_work_limit = {} units of work; pass a larger one (or None) to check them",
            rejects.over_work,
            cfg.verify_work_limit.unwrap_or(0)
        ));
    }

    add_baseline_and_rank(target, spec, target_hash, &mut verified, &mut notes)?;

    let p = &ctl.progress;
    let n_fused = verified.iter().filter(|c| !c.baseline).count();
    let fused_found = space.fused_found;
    let stop_reason = match (dfs_stop, verify_stop) {
        (Stop::Cancelled, _) | (_, Stop::Cancelled) => "cancelled".to_string(),
        (Stop::Time, _) | (_, Stop::Time) => "time_limit".to_string(),
        (Stop::States, _) => "state_limit".to_string(),
        (Stop::Candidates, _) => "candidate_limit".to_string(),
        (_, Stop::Verify) => {
            if rejects.max_verify {
                notes.push(format!(
                    "the verification stopped after max_verify = {} fingerprint tests with {} of top_k = {} verified and candidates left; pass a larger max_verify to test more",
                    cfg.max_verify, n_fused, cfg.top_k
                ));
            }
            "verify_limit".to_string()
        }
        _ if n_fused == 0 => {
            let why = if let Some(b) = &en.blocked {
                b.clone()
            } else if !fused_found && p.smem_rejected.load(Ordering::Relaxed) > 0 {
                format!(
                    "no fused program fits the device ({} mappings exceeded its {} bytes of shared memory)",
                    p.smem_rejected.load(Ordering::Relaxed),
                    spec.shared_mem_per_block
                )
            } else if !fused_found {
                "no fused program equivalent to the target was found within the search limits"
                    .to_string()
            } else {
                format!("{} candidate(s) found, none verified", space.reals.len())
            };
            format!("no_candidates: {why}")
        }
        _ => "exhausted".to_string(),
    };
    if cfg.deterministic && stop_reason != "exhausted" {
        notes.push(
            "deterministic mode: the search hit a limit, so the candidate set may depend on timing"
                .into(),
        );
    }
    let report = report_of(p, cfg, start, enumerate_s, stop_reason, en.stats, notes);
    Ok(SearchResult {
        candidates: verified,
        report,
    })
}

/// Candidates the verification loop left out without a verdict.
#[derive(Debug, Default, Clone, Copy)]
struct Unchecked {
    /// Did not lower to a kernel plan on the device.
    plan: usize,
    /// Paired dims the target keeps apart (see [`dims`]): rejected without a fingerprint.
    mixed: usize,
    /// Their check would have ended after the time limit (see [`budget`]).
    over_time: usize,
    /// Their check would have taken the verification past `verify_work_limit`.
    over_work: usize,
    /// The loop stopped at `max_verify` tests with candidates left.
    max_verify: bool,
    /// Left untested past [`HOPELESS_RATIO`] (slower than the library baseline too).
    hopeless: usize,
}

/// The verification loop: fingerprint the candidates of `space` in estimate order until
/// `top_k` pass; returns the verified ones, why it stopped early, and the candidates left
/// without a verdict. A large check expected to end after `deadline` or to take the
/// verification past `verify_work_limit` is not started: the candidate stays unverified and
/// the stop reason is `time_limit` or `verify_limit`.
fn verify_space(
    target: &KernelGraph,
    spec: &DeviceSpec,
    cfg: &SearchConfig,
    ctl: &SearchControl,
    deadline: Option<Instant>,
    target_hash: &str,
    space: &Space<'_>,
) -> Result<(Vec<Candidate>, Stop, Unchecked)> {
    // Rank and verify.
    let p = &ctl.progress;
    let reals = space.reals;
    let mut verified: Vec<Candidate> = vec![];
    let mut seen = std::collections::HashSet::new();
    let mut target_fp: Option<shrink::Verifier> = None;
    let classes = dims::TargetClasses::of(target);
    let mut verdicts: std::collections::HashMap<String, bool> = Default::default();
    let width = verify_width(target);
    let mut verify_stop = Stop::None;
    seen.insert(target_hash.to_string());
    let mut tests = 0usize;
    let mut unchecked = Unchecked::default();
    let mut work_spent: u64 = 0;
    // First pass: at most PER_STRUCTURE tilings of one kernel structure, so the top-k the
    // device profiles are diverse; the second pass fills up with the skipped ones.
    let mut per_skel = vec![0usize; space.kernels.len()];
    let mut leader: Option<usize> = None;
    let mut seen_tilings = std::collections::HashMap::new();
    let mut skipped = vec![];
    let order: Vec<usize> = (0..reals.len()).collect();
    let best_est = reals.first().map_or(0.0, |r| r.est_us);
    let fewest = reals
        .iter()
        .filter(|r| r.est_us <= FEWEST_KERNELS_RATIO * best_est)
        .map(|r| space.kernels[r.skel])
        .min();
    let runner_up = reals
        .iter()
        .take_while(|r| r.est_us <= RUNNER_UP_RATIO * best_est)
        .any(|r| reals.first().is_some_and(|b| b.skel != r.skel));
    let leading_cap = if runner_up {
        PER_LEADING_STRUCTURE.min(cfg.top_k.saturating_sub(1).max(1))
    } else {
        PER_LEADING_STRUCTURE
    };
    let mut verified_kernels: Vec<usize> = vec![];
    let mut leading_family: Option<String> = None;
    let mut verified_leading: Vec<bool> = vec![];
    let mut verified_masked = 0usize;
    let mut second = false;
    let mut queue = order.clone();
    let mut qi = 0;
    let library_us = graph_cost(target, spec).unwrap_or(f64::INFINITY);
    let hopeless = |est: f64| est > HOPELESS_RATIO * best_est && est > library_us;
    loop {
        if qi >= queue.len() {
            if second || skipped.is_empty() {
                break;
            }
            second = true;
            queue = std::mem::take(&mut skipped);
            qi = 0;
            continue;
        }
        let r = &reals[queue[qi]];
        qi += 1;
        if verified.len() >= cfg.top_k {
            break;
        }
        if hopeless(r.est_us) {
            // every later one of this pass too (both are in estimate order)
            unchecked.hopeless += queue.len() - (qi - 1);
            qi = queue.len();
            continue;
        }
        if tests >= cfg.max_verify {
            unchecked.max_verify = true;
            if verify_stop == Stop::None {
                verify_stop = Stop::Verify;
            }
            break;
        }
        let kernels = space.kernels[r.skel];
        // first pass: structures at their cap, or waiting for the fewest kernels, wait
        let held_back = |i: usize| {
            let skel = reals[i].skel;
            let cap = if leader == Some(skel) {
                leading_cap
            } else {
                PER_STRUCTURE
            };
            let k = space.kernels[skel];
            !second
                && (per_skel[skel] >= cap
                    || held_for_fewest(&verified_kernels, fewest, cfg.top_k, k))
        };
        if held_back(queue[qi - 1]) {
            skipped.push(queue[qi - 1]);
            continue;
        }
        if ctl.cancel.load(Ordering::Relaxed) {
            verify_stop = Stop::Cancelled;
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            verify_stop = Stop::Time;
            break;
        }
        let Ok((g, label)) = (space.realise)(queue[qi - 1]) else {
            p.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let family = family_key(&label);
        let leading = leading_family.as_ref().is_none_or(|f| *f == family);
        let near = r.est_us <= FEWEST_KERNELS_RATIO * best_est;
        if !second && held_for_other_family(&verified_leading, cfg.top_k, leading, near) {
            skipped.push(queue[qi - 1]);
            continue;
        }
        let masked = has_masked_tiles(&g);
        if masked
            && !second
            && held_as_masked(
                &verified_kernels,
                verified_masked,
                fewest,
                cfg.top_k,
                kernels,
            )
        {
            skipped.push(queue[qi - 1]);
            continue;
        }
        let h = crate::json::hash(&g);
        if !seen.insert(h.clone()) {
            continue;
        }
        // the same kernels and cost with an op spelled differently (reduction + accum_iter
        // for accum_sum) lower to the same memory traffic: once one of them has passed, the
        // others need no test (a rejected one says nothing about the rest)
        let predicted_us = graph_cost(&g, spec)?;
        let tiling = tiling_key(&label);
        if seen_tilings.get(&tiling).is_some_and(|costs: &Vec<f64>| {
            costs
                .iter()
                .any(|&c| (c - predicted_us).abs() <= 1e-4 * c.max(predicted_us))
        }) {
            continue;
        }
        if classes.mixes(&g) {
            unchecked.mixed += 1;
            p.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if lower_candidate(&g, spec).is_err() {
            unchecked.plan += 1;
            p.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let check = match &target_fp {
            Some(c) => c,
            None => target_fp.insert(shrink::Verifier::new(
                target,
                cfg.trials,
                cfg.seed,
                !cfg.verify_full_size,
            )?),
        };
        let work = check.check_work(&g);
        if past_deadline(deadline, check.estimate(work)) {
            unchecked.over_time += 1;
            verify_stop = Stop::Time;
            continue;
        }
        if over_work_limit(cfg.verify_work_limit, work_spent, work) {
            unchecked.over_work += 1;
            if verify_stop == Stop::None {
                verify_stop = Stop::Verify;
            }
            continue;
        }
        work_spent = work_spent.saturating_add(work);
        tests += 1;
        p.fingerprint_tests.fetch_add(1, Ordering::Relaxed);
        let ok = match verdicts.remove(&h) {
            Some(ok) => ok,
            None => {
                // this candidate and the next few the loop may test, side by side
                // (`verify_width`): one fingerprint uses 16 cores poorly (2.7x over one core
                // on the H100 host), four at once give 2.3x its throughput. Verdicts of
                // candidates the loop then skips are unused; the outcome is the serial loop's.
                let mut ahead = lookahead(
                    space.realise,
                    &queue[qi..],
                    spec,
                    width - 1,
                    |i| !held_back(i),
                    |h| seen.contains(h) || verdicts.contains_key(h),
                );
                // checked ahead only where the loop could still afford them after this one;
                // the loop charges each check when it uses the verdict, so the outcome is
                // the serial loop's whatever the width
                ahead.retain(|(_, a)| {
                    if classes.mixes(a) {
                        return false;
                    }
                    let w = check.check_work(a);
                    !past_deadline(deadline, check.estimate(w))
                        && !over_work_limit(cfg.verify_work_limit, work_spent, w)
                });
                let (ok, oks) = rayon::join(
                    || check.matches_timed(&g),
                    || {
                        ahead
                            .par_iter()
                            .map(|(_, a)| check.matches_timed(a))
                            .collect::<Vec<_>>()
                    },
                );
                verdicts.extend(ahead.into_iter().map(|(h, _)| h).zip(oks));
                ok
            }
        };
        if ok {
            verified_masked += usize::from(masked);
            // the same kernels and cost spelled differently need no second test
            seen_tilings.entry(tiling).or_default().push(predicted_us);
            per_skel[r.skel] += 1;
            verified_kernels.push(kernels);
            leader.get_or_insert(r.skel);
            verified_leading.push(*leading_family.get_or_insert_with(|| family.clone()) == family);
            p.verified.fetch_add(1, Ordering::Relaxed);
            verified.push(Candidate {
                graph: g,
                predicted_us,
                hash: h,
                label,
                baseline: false,
            });
        } else {
            p.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok((verified, verify_stop, unchecked))
}

/// The report of a finished search from its progress counters: `programs_nodes_classes` =
/// (block programs enumerated, e-graph nodes, e-graph classes).
pub(crate) fn report_of(
    p: &Progress,
    cfg: &SearchConfig,
    start: Instant,
    enumerate_s: f64,
    stop_reason: String,
    programs_nodes_classes: (u64, usize, usize),
    notes: Vec<String>,
) -> SearchReport {
    let snap = p.snapshot();
    let (block_programs, egraph_nodes, egraph_classes) = programs_nodes_classes;
    SearchReport {
        states_explored: snap.states_explored,
        states_pruned: snap.states_pruned,
        fingerprint_tests: snap.fingerprint_tests,
        verified: snap.verified,
        rejected: snap.rejected,
        elapsed_s: start.elapsed().as_secs_f64(),
        enumerate_s,
        verify_s: start.elapsed().as_secs_f64() - enumerate_s,
        threads: rayon::current_num_threads(),
        stop_reason,
        candidates_found: snap.candidates_found,
        concretisations: snap.concretisations,
        smem_rejected: snap.smem_rejected,
        block_programs,
        egraph_nodes,
        egraph_classes,
        pruning: cfg.prune,
        deterministic: cfg.deterministic,
        cache_hit: false,
        notes,
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// Add the original graph as the labelled library baseline (when it lowers on `spec`) and
/// order the candidates best predicted first (ties by hash, so the order is deterministic).
pub(crate) fn add_baseline_and_rank(
    target: &KernelGraph,
    spec: &DeviceSpec,
    target_hash: String,
    verified: &mut Vec<Candidate>,
    notes: &mut Vec<String>,
) -> Result<()> {
    match lower(target, spec) {
        Ok(_) => verified.push(Candidate {
            graph: target.clone(),
            predicted_us: graph_cost(target, spec)?,
            hash: target_hash,
            label: "baseline: the original graph as library kernels".into(),
            baseline: true,
        }),
        Err(e) => notes.push(format!(
            "the original graph does not lower on this device: {e}"
        )),
    }
    verified.sort_by(|a, b| {
        a.predicted_us
            .total_cmp(&b.predicted_us)
            .then(a.hash.cmp(&b.hash))
    });
    Ok(())
}
