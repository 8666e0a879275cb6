//! Finite-field fingerprints: probabilistic equivalence of µGraphs (ARCHITECTURE §4).
//!
//! A graph is executed by the shared executor ([`crate::exec`]) in the domain Z_p × Z_q
//! ([`crate::field`]) on seeded random inputs, over `k` independent trials; the digest is a
//! blake3 hash of the output dims and all output values. Two graphs computing the same
//! function get the same digest; different functions collide with probability ≈ 1/p per
//! trial and output element (in practice far less).
//!
//! Exact ops (modelled by their algebra): add, sub, mul, neg, square, mul_scalar (dyadic
//! embedding of the scalar), div (multiplication by the inverse, 0⁻¹ := 0), exp (g^b for a
//! value (a, b); an exp of a value computed from another exp's output has no known b and
//! is g^h(a) with h seeded, see [`crate::field`]),
//! sqrt (multiplicative modular square root), rsqrt (inverse of sqrt), matmul, reductions,
//! rms_norm, softmax, concat/chunk, accumulators (sums of the same field ops; means
//! multiply by N⁻¹).
//!
//! Uninterpreted ops (seeded random functions of their input value(s), the same function in
//! every graph for the same op, parameters and trial): silu, gelu, relu, sigmoid, tanh,
//! clamp(lo, hi), pow(a, b). They are sound: equal inputs give equal outputs, but no
//! algebraic identity of them (e.g. silu(x) = x·sigmoid(x)) is recognised.
//!
//! Multi-device graphs (`world_size` N > 1): every rank is evaluated on its own seeded random
//! inputs, all_reduce sums over the ranks, and the digest covers every rank's outputs.
//!
//! Determinism: inputs come from a counter-based generator keyed by (seed, trial, input
//! position, element index); per-element sums are exact mod p/q; every thread works on its
//! own buffers. The digest is therefore bit-identical for any thread count.

use crate::dense::Dense;
use crate::domain::Domain;
use crate::error::{eval_err, shape_err, CoreError, Result};
use crate::exec::run_kernel_graph_ranks_on;
use crate::field::{fv_from_key, mix64, mix_words, Fv, G, LAZY_TERMS, P, Q, UNKNOWN_Q};
use crate::kernel_graph::KernelGraph;
use crate::ops::{BinaryOp, UnaryOp};
use crate::shape::{fmt_dims, numel, Dims};
use crate::DType;
use rayon::prelude::*;

/// Name of the fingerprint scheme: digests (and search results verified by them) of two
/// schemes are not comparable. v2: unknown residues mod q after an exp.
pub const FINGERPRINT_SCHEME: &str = "yirage.fingerprint.v2";

/// The field domain for one trial (the trial key seeds the uninterpreted functions).
#[derive(Debug, Clone, Copy)]
pub struct FieldDomain {
    trial_key: u64,
}

impl FieldDomain {
    /// Domain for `trial` of a run with `seed`.
    pub fn new(seed: u64, trial: u64) -> FieldDomain {
        FieldDomain {
            trial_key: mix_words(&[0x0074_7269_616c, seed, trial]),
        }
    }

    /// Key of the seeded uninterpreted function for op `tag` with `params` in this trial.
    fn uf_key(&self, tag: u64, params: &[f64]) -> u64 {
        let mut w = vec![self.trial_key, tag];
        w.extend(params.iter().map(|p| p.to_bits()));
        mix_words(&w)
    }
}

/// Apply the uninterpreted function `key` to its argument value(s).
fn uf_apply(key: u64, args: &[Fv]) -> Fv {
    let h = args.iter().fold(key, |h, a| {
        mix64(h ^ mix64(((a.p as u64) << 32) | a.q as u64))
    });
    fv_from_key(h)
}

/// Stable tags of the uninterpreted ops (part of the fingerprint format).
fn uf_tag(op: &UnaryOp) -> u64 {
    match op {
        UnaryOp::Silu => 1,
        UnaryOp::Gelu => 2,
        UnaryOp::Relu => 3,
        UnaryOp::Sigmoid => 4,
        UnaryOp::Tanh => 5,
        UnaryOp::Clamp { .. } => 6,
        _ => 0,
    }
}
const POW_TAG: u64 = 7;
/// Tag of the random exponent of an exp whose argument's residue mod q is unknown.
const EXP_TAG: u64 = 8;

impl Domain for FieldDomain {
    type V = Fv;
    fn zero(&self) -> Fv {
        Fv::ZERO
    }
    fn constant(&self, c: f64) -> Fv {
        Fv::from_f64(c)
    }
    fn add(&self, a: Fv, b: Fv) -> Fv {
        a + b
    }
    fn mul(&self, a: Fv, b: Fv) -> Fv {
        a * b
    }
    fn div(&self, a: Fv, b: Fv) -> Fv {
        a / b
    }
    fn sqrt(&self, a: Fv) -> Fv {
        a.sqrt()
    }
    fn divides_by_reciprocal(&self) -> bool {
        true // a / b is defined as a · b⁻¹
    }
    fn recip(&self, b: Fv) -> Fv {
        b.inv()
    }
    fn div_count(&self, x: Fv, n: usize) -> Fv {
        x * Fv::from_int(n as i128).inv()
    }
    fn unary_fn<'a>(&'a self, op: UnaryOp) -> Box<dyn Fn(Fv) -> Fv + Send + Sync + 'a> {
        match op {
            UnaryOp::Exp => {
                // exact for an exponent known mod q; otherwise g^h(p-part), h seeded
                let key = self.uf_key(EXP_TAG, &[]);
                Box::new(move |x: Fv| {
                    x.exp()
                        .unwrap_or_else(|| Fv::exp_of_exponent(mix64(key ^ x.p as u64)))
                })
            }
            UnaryOp::Square => Box::new(|x: Fv| x * x),
            UnaryOp::Sqrt => Box::new(Fv::sqrt),
            UnaryOp::Rsqrt => Box::new(|x: Fv| x.sqrt().inv()),
            UnaryOp::Neg => Box::new(|x: Fv| -x),
            UnaryOp::MulScalar(s) => {
                let c = Fv::from_f64(s);
                Box::new(move |x: Fv| x * c)
            }
            other => {
                let key = self.uf_key(uf_tag(&other), &other.params());
                Box::new(move |x: Fv| uf_apply(key, &[x]))
            }
        }
    }
    fn binary(&self, op: BinaryOp, a: Fv, b: Fv) -> Fv {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => uf_apply(self.uf_key(POW_TAG, &[]), &[a, b]),
        }
    }
    fn sum(&self, n: usize, f: impl Fn(usize) -> Fv) -> Fv {
        // each term < 2^26: a u64 holds 2^38 of them, reduce at the end (an unknown q-part
        // is u32::MAX: it sets `unknown`'s top bit, and its sum is discarded)
        let (mut sp, mut sq, mut unknown) = (0u64, 0u64, 0u32);
        for i in 0..n {
            let v = f(i);
            sp += v.p as u64;
            sq = sq.wrapping_add(v.q as u64);
            unknown |= v.q;
            if i % (1 << 30) == (1 << 30) - 1 {
                sp %= P;
                sq %= Q;
            }
        }
        with_q(sp, sq, unknown)
    }
    fn dot(&self, n: usize, f: impl Fn(usize) -> (Fv, Fv)) -> Fv {
        let (mut tp, mut tq, mut unknown) = (0u64, 0u64, 0u32);
        let mut start = 0;
        while start < n {
            let end = (start + LAZY_TERMS).min(n);
            let (mut sp, mut sq) = (0u64, 0u64);
            for i in start..end {
                let (a, b) = f(i);
                sp += a.p as u64 * b.p as u64;
                // wraps only when a q-part is unknown (u32::MAX), and then it is discarded
                sq = sq.wrapping_add((a.q as u64).wrapping_mul(b.q as u64));
                unknown |= a.q | b.q;
            }
            tp = (tp + sp % P) % P;
            tq = (tq + sq % Q) % Q;
            start = end;
        }
        with_q(tp, tq, unknown)
    }
}

/// (p mod P, q mod Q), or with an unknown q-part when `unknown` has the marker's top bit
/// (an OR of the terms' q-parts: reduced ones are < 2^25).
fn with_q(p: u64, q: u64, unknown: u32) -> Fv {
    let v = Fv::new(p, q);
    if unknown >> 31 == 1 {
        Fv { q: UNKNOWN_Q, ..v }
    } else {
        v
    }
}

/// Random field inputs of trial `trial` on rank 0: element j of input i is keyed by
/// (seed, trial, i, j) — independent of threads and of the other inputs' sizes.
pub fn random_inputs(g: &KernelGraph, seed: u64, trial: u64) -> Vec<Dense<Fv>> {
    random_rank_inputs(g, seed, trial, 0)
}

/// Random field inputs of `rank` (rank 0 as [`random_inputs`]; rank r > 0 keyed by
/// (seed, trial, "rank", r, i, j), so every rank gets its own values).
pub fn random_rank_inputs(g: &KernelGraph, seed: u64, trial: u64, rank: usize) -> Vec<Dense<Fv>> {
    g.input_signature()
        .iter()
        .enumerate()
        .map(|(i, (dims, _))| {
            let key = if rank == 0 {
                mix_words(&[0x0069_6e70_7574, seed, trial, i as u64])
            } else {
                mix_words(&[
                    0x0069_6e70_7574,
                    seed,
                    trial,
                    0x7261_6e6b,
                    rank as u64,
                    i as u64,
                ])
            };
            let data = (0..numel(dims))
                .into_par_iter()
                .map(|j| fv_from_key(mix_words(&[key, j as u64])))
                .collect();
            Dense {
                dims: dims.clone(),
                data,
            }
        })
        .collect()
}

/// Field outputs of every trial: `result[t][k]` is output k of trial t (for multi-device
/// graphs, every rank's outputs in rank order: `result[t][r·outputs + k]`).
pub fn fingerprint_values(
    g: &KernelGraph,
    trials: usize,
    seed: u64,
) -> Result<Vec<Vec<Dense<Fv>>>> {
    g.check_complete()?;
    crate::exec::check_size(g)?;
    if trials == 0 {
        return eval_err("fingerprint: trials must be ≥ 1");
    }
    (0..trials as u64)
        .into_par_iter()
        .map(|t| trial_values(g, seed, t))
        .collect()
}

/// Field outputs of trial `t` (entry `t` of [`fingerprint_values`]).
fn trial_values(g: &KernelGraph, seed: u64, t: u64) -> Result<Vec<Dense<Fv>>> {
    trial_values_on(g, seed, t, &trial_inputs(g, seed, t))
}

/// Every rank's random field inputs of trial `t`.
fn trial_inputs(g: &KernelGraph, seed: u64, t: u64) -> Vec<Vec<Dense<Fv>>> {
    (0..g.world_size())
        .map(|r| random_rank_inputs(g, seed, t, r))
        .collect()
}

fn trial_values_on(
    g: &KernelGraph,
    seed: u64,
    t: u64,
    inputs: &[Vec<Dense<Fv>>],
) -> Result<Vec<Dense<Fv>>> {
    let outs = run_kernel_graph_ranks_on(&FieldDomain::new(seed, t), g, inputs)?;
    Ok(outs.into_iter().flatten().collect())
}

/// A target's fingerprint values, against which candidates are checked trial by trial: a
/// candidate that differs in the first trial (most wrong ones) costs one trial, not `trials`.
/// Agrees with comparing [`fingerprint`] digests. The random inputs of every trial are kept
/// (candidates share the target's inputs; drawing them was a fifth of a search's time).
pub struct TrialCheck {
    seed: u64,
    signature: (Vec<(Dims, DType)>, usize),
    trials: Vec<Trial>,
}

/// One trial of the target: every rank's inputs and the outputs.
struct Trial {
    inputs: Vec<Vec<Dense<Fv>>>,
    outputs: Vec<Dense<Fv>>,
}

impl TrialCheck {
    /// Evaluates the target's `trials` trials.
    pub fn new(target: &KernelGraph, trials: usize, seed: u64) -> Result<Self> {
        target.check_complete()?;
        crate::exec::check_size(target)?;
        if trials == 0 {
            return eval_err("fingerprint: trials must be ≥ 1");
        }
        let trials = (0..trials as u64)
            .into_par_iter()
            .map(|t| {
                let inputs = trial_inputs(target, seed, t);
                let outputs = trial_values_on(target, seed, t, &inputs)?;
                Ok(Trial { inputs, outputs })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            seed,
            signature: (target.input_signature(), target.world_size()),
            trials,
        })
    }

    /// Whether `g` has the target's values in every trial (false when `g` cannot be
    /// evaluated).
    pub fn matches(&self, g: &KernelGraph) -> bool {
        if g.check_complete().is_err() || crate::exec::check_size(g).is_err() {
            return false;
        }
        let same_inputs = (g.input_signature(), g.world_size()) == self.signature;
        self.trials.iter().enumerate().all(|(t, trial)| {
            let got = if same_inputs {
                trial_values_on(g, self.seed, t as u64, &trial.inputs)
            } else {
                trial_values(g, self.seed, t as u64)
            };
            got.is_ok_and(|v| v == trial.outputs)
        })
    }
}

/// Run `f` on a rayon pool of `threads` threads (or the global pool when `None`).
pub fn with_threads<T: Send>(
    threads: Option<usize>,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    match threads {
        None => f(),
        Some(0) => eval_err("threads must be ≥ 1 (or None for the default pool)"),
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| CoreError::Evaluation(format!("could not start {n} threads: {e}")))?;
            pool.install(f)
        }
    }
}

/// Hex digest of the graph's fingerprint over `trials` trials with `seed`.
pub fn fingerprint(
    g: &KernelGraph,
    trials: usize,
    seed: u64,
    threads: Option<usize>,
) -> Result<String> {
    let vals = with_threads(threads, || fingerprint_values(g, trials, seed))?;
    let mut h = blake3::Hasher::new();
    h.update(FINGERPRINT_SCHEME.as_bytes());
    for w in [P, Q, G, trials as u64, seed, g.outputs().len() as u64] {
        h.update(&w.to_le_bytes());
    }
    if g.world_size() > 1 {
        // (absent for single-device graphs, whose digests stay as they were)
        h.update(b"world_size");
        h.update(&(g.world_size() as u64).to_le_bytes());
    }
    for &o in g.outputs() {
        let dims = &g.tensors()[o].dims;
        h.update(&(dims.len() as u64).to_le_bytes());
        for &d in dims {
            h.update(&(d as u64).to_le_bytes());
        }
    }
    for trial in &vals {
        for out in trial {
            let mut buf = Vec::with_capacity(out.data.len() * 8);
            for v in &out.data {
                buf.extend_from_slice(&v.p.to_le_bytes());
                buf.extend_from_slice(&v.q.to_le_bytes());
            }
            h.update(&buf);
        }
    }
    Ok(h.finalize().to_hex().to_string())
}

fn fmt_signature(s: &[(Dims, DType)]) -> String {
    let v: Vec<String> = s
        .iter()
        .map(|(d, t)| format!("{}:{t}", fmt_dims(d)))
        .collect();
    format!("({})", v.join(", "))
}

/// Fingerprint equivalence of two graphs with the same input signature.
///
/// Errors (ShapeError) when the input signatures (dims and dtypes, in order) differ;
/// `false` when output counts or dims differ; otherwise compares the digests.
pub fn equivalent(a: &KernelGraph, b: &KernelGraph, trials: usize, seed: u64) -> Result<bool> {
    let (sa, sb) = (a.input_signature(), b.input_signature());
    if sa != sb {
        return shape_err(format!(
            "equivalent: the graphs have different input signatures {} and {}",
            fmt_signature(&sa),
            fmt_signature(&sb)
        ));
    }
    if a.world_size() != b.world_size() {
        return shape_err(format!(
            "equivalent: the graphs run on different numbers of ranks (world_size {} and {})",
            a.world_size(),
            b.world_size()
        ));
    }
    a.check_complete()?;
    b.check_complete()?;
    let dims = |g: &KernelGraph| -> Vec<Dims> {
        g.outputs()
            .iter()
            .map(|&o| g.tensors()[o].dims.clone())
            .collect()
    };
    if dims(a) != dims(b) {
        return Ok(false);
    }
    Ok(fingerprint(a, trials, seed, None)? == fingerprint(b, trials, seed, None)?)
}
