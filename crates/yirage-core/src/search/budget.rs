//! What a fingerprint check costs, so the verification keeps within its limits.
//!
//! A fingerprint evaluates the whole graph (at full size or at a reduced row count, see
//! [`super::shrink`]), so its cost grows with the problem: a 4096×4096×4096 matmul is 69 G
//! multiply-adds per trial, minutes in the finite field. The verification loop only checks
//! the clock between candidates, so one such check started just before the deadline ran the
//! search far past it. Every check's work is therefore counted up front ([`eval_work`]): a
//! large check that would take the verification past `verify_work_limit` is not started (a
//! limit in work, not seconds, so the outcome does not depend on the load), and one whose
//! time, at the rate measured on the checks run so far ([`CheckClock`]), would end after the
//! time limit is not started either. The candidate stays unverified and the report's stop
//! reason says which limit cut the verification short.

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::dtype::DType;
use crate::error::Result;
use crate::fingerprint::TrialCheck;
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::shape::numel_saturating;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds per unit of work assumed before any check has been timed: the field's
/// multiply-add on one core of a loaded 2-core host took 1.5–2.6 ns (rms_norm + matmul,
/// 64–256 rows, K 1024–4096), so this errs on the slow side.
pub const PRIOR_NS_PER_WORK: f64 = 3.0;
/// Checks with less work than this are never held back: tens of milliseconds each, and at
/// most `max_verify` of them, so searches at test sizes (GQA decode at kv 1024, RMSNorm +
/// Linear 8×1024×1536) verify the same candidates whatever the clock says.
pub const SMALL_WORK: u64 = 1 << 25;

/// Work units of one evaluation of `g`: multiply-adds of every matmul plus one per element
/// every other op writes (a customized op's block ops over all its blocks and iterations).
pub fn eval_work(g: &KernelGraph) -> u64 {
    let ts = g.tensors();
    let mut work: u64 = 0;
    for op in g.ops() {
        let out_elems = op
            .outs
            .iter()
            .map(|&t| numel_saturating(&ts[t].dims))
            .fold(0u64, u64::saturating_add);
        let w = match &op.kind {
            KernelOpKind::Input { .. } => 0,
            KernelOpKind::Matmul { a, .. } => {
                let k = ts[*a].dims.last().copied().unwrap_or(1) as u64;
                out_elems.saturating_mul(k)
            }
            KernelOpKind::Customized { graph, .. } => block_work(graph),
            _ => out_elems,
        };
        work = work.saturating_add(w);
    }
    work.max(1)
}

/// [`eval_work`] of one customized op: its block ops' work per block and iteration, over
/// every block and iteration.
fn block_work(bg: &BlockGraph) -> u64 {
    let tiles = bg.tiles();
    let per_block: u64 = bg
        .ops()
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let elems = tiles.get(i).map_or(1, |t| numel_saturating(&t.dims));
            match op {
                BlockOpKind::Input { .. } => 0,
                BlockOpKind::Matmul { a, .. } => {
                    let k = tiles
                        .get(*a)
                        .and_then(|t| t.dims.last().copied())
                        .unwrap_or(1) as u64;
                    elems.saturating_mul(k)
                }
                _ => elems,
            }
        })
        .fold(0u64, u64::saturating_add);
    per_block
        .saturating_mul(bg.num_blocks() as u64)
        .saturating_mul(u64::from(bg.forloop_range().max(1)))
}

/// A small matmul graph (128×256 by 256×256, 8 M multiply-adds) whose check
/// [`CheckClock::calibrate_once`] times on the pool it runs in.
fn calibration_graph() -> Result<KernelGraph> {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[128, 256], DType::F32)?;
    let w = g.new_input(&[256, 256], DType::F32)?;
    let xn = g.rms_norm(x, &[256], None, 1e-6)?;
    let y = g.matmul(xn, w)?;
    g.mark_output(y)?;
    Ok(g)
}

/// The measured time per unit of check work: the total time of the checks run so far over
/// their total work (large checks dominate it, as they should), [`PRIOR_NS_PER_WORK`] until
/// one has been timed.
#[derive(Debug, Default)]
pub struct CheckClock {
    ns: AtomicU64,
    work: AtomicU64,
    calibrated: AtomicBool,
}

impl CheckClock {
    /// Measure the first estimate, once: a small check ([`calibration_graph`], tens of
    /// milliseconds) is timed on the current pool, so the first large check is judged by this
    /// host's rate at this thread count, not by [`PRIOR_NS_PER_WORK`]. Small checks are
    /// dominated by fixed costs, so this errs on the slow side. The prior stays when the
    /// calibration cannot run. Called only when a large check is about to be judged, so
    /// searches with small checks only never pay for it; no lock is held while it runs (it
    /// evaluates with rayon).
    pub fn calibrate_once(&self, trials: usize, seed: u64) {
        if self.calibrated.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Ok(g) = calibration_graph() {
            let t0 = Instant::now();
            if TrialCheck::new(&g, trials, seed).is_ok() {
                self.record(eval_work(&g).saturating_mul(trials as u64), t0.elapsed());
            }
        }
    }

    /// Record a check of `work` units that took `took`.
    pub fn record(&self, work: u64, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.ns.fetch_add(ns, Ordering::Relaxed);
        self.work.fetch_add(work, Ordering::Relaxed);
    }

    /// Nanoseconds per unit of work.
    pub fn ns_per_work(&self) -> f64 {
        let work = self.work.load(Ordering::Relaxed);
        if work == 0 {
            return PRIOR_NS_PER_WORK;
        }
        self.ns.load(Ordering::Relaxed) as f64 / work as f64
    }

    /// The expected time of a check of `work` units.
    pub fn estimate(&self, work: u64) -> Duration {
        Duration::from_secs_f64(work as f64 * self.ns_per_work() * 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::tests::rmsnorm_linear;

    #[test]
    fn work_counts_matmul_multiply_adds_and_elements() {
        // rms_norm writes 8·64, the matmul 8·96 outputs of 64 multiply-adds each
        assert_eq!(eval_work(&rmsnorm_linear(8, 64, 96)), 8 * 64 + 8 * 96 * 64);
        // quadrupling the rows quadruples the work
        assert_eq!(
            eval_work(&rmsnorm_linear(32, 64, 96)),
            4 * eval_work(&rmsnorm_linear(8, 64, 96))
        );
    }

    #[test]
    fn the_clock_starts_from_the_prior_and_then_follows_the_measurements() {
        let c = CheckClock::default();
        assert_eq!(c.ns_per_work(), PRIOR_NS_PER_WORK);
        c.record(1_000, Duration::from_nanos(500));
        c.record(3_000, Duration::from_nanos(1_500));
        assert_eq!(c.ns_per_work(), 0.5);
        assert_eq!(c.estimate(2_000_000), Duration::from_millis(1));
    }

    #[test]
    fn the_calibration_times_one_check_once() {
        let c = CheckClock::default();
        c.calibrate_once(2, 0);
        c.calibrate_once(2, 0);
        assert_eq!(
            c.work.load(Ordering::Relaxed),
            2 * eval_work(&calibration_graph().unwrap())
        );
        assert!(c.ns.load(Ordering::Relaxed) > 0);
    }
}
