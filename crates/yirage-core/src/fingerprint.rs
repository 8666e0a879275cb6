//! Finite-field fingerprints: probabilistic equivalence of µGraphs.
//!
//! A graph is executed by the shared executor ([`crate::exec`]) in the domain Z_p × Z_q
//! ([`crate::field`]) on seeded random inputs, over `k` independent trials; the digest is a
//! blake3 hash of the output dims and all output values. Two graphs computing the same
//! function get the same digest; different functions collide with probability ≈ 1/p per
//! trial and output element (in practice far less), except where the field cannot see the
//! difference, which [`TrialCheck::verdict`] (and so [`equivalent`] and the search) checks.
//!
//! Exact ops (modelled by their algebra): add, sub, mul, neg, square, mul_scalar and
//! add_scalar (dyadic embedding of the scalar), div (multiplication by the inverse), exp
//! (g^b for a value (a, b), g a seeded element of order q per trial; exp(0) = 1; an exp of a
//! value computed from another exp's output has no known b and is g^h(a) with h seeded, see
//! [`crate::field`]), sqrt and rsqrt of values the sign analysis proves ≥ 0
//! ([`crate::exec::tensor_signs`]: multiplicative modular square root), matmul,
//! reductions, rms_norm, softmax, concat/chunk, permute/reshape (they move elements),
//! accumulators (sums of the same field ops; means multiply by N⁻¹).
//!
//! Uninterpreted ops (seeded random functions of their input value(s), the same function in
//! every graph for the same op, parameters and trial): silu, gelu, relu, sigmoid, tanh,
//! clamp(lo, hi), pow(a, b), reduce_max (of the row's values in sorted order), and sqrt of a value not proven ≥ 0 (rsqrt: its inverse). They
//! are sound: equal inputs give equal outputs, but no algebraic identity of them (e.g.
//! silu(x) = x·sigmoid(x)) is recognised.
//!
//! What the field cannot see, and how the verdict handles it: a division by a value whose
//! p-part is 0 (e.g. x / (y − y)) is flagged and makes the trial undecided; scalars whose
//! images collide with each other or with small integers (p·q + 1 and 1) make the
//! comparison undecided; an undecided comparison is decided by the float64 cross-check
//! alone, which must agree on every element. Graphs the field finds equal are still
//! cross-checked in float64 ([`crate::reference::BallDomain`], rigorous error radii), which
//! vetoes on a certain difference (a NaN or infinity against a finite value, a gap wider
//! than both radii).
//!
//! Multi-device graphs (`world_size` N > 1): every rank is evaluated on its own seeded random
//! inputs, all_reduce sums over the ranks, and the digest covers every rank's outputs.
//!
//! Determinism: inputs come from a counter-based generator keyed by (seed, trial, input
//! position, element index); per-element sums are exact mod p/q; every thread works on its
//! own buffers. The digest is therefore bit-identical for any thread count.

use crate::block_graph::BlockOpKind;
use crate::dense::Dense;
use crate::dense::Tensor;
use crate::domain::Domain;
use crate::error::{eval_err, shape_err, CoreError, Result};
use crate::exec::{run_kernel_graph_ranks_on, tensor_signs, tile_signs, Sign};
use crate::field::{exp_base, fv_from_key, mix64, mix_words, Fv, G, LAZY_TERMS, P, Q, UNKNOWN_Q};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use crate::reference::{evaluate_balls, evaluate_ranks, Ball};
use crate::shape::{fmt_dims, numel, Dims};
use crate::DType;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Name of the fingerprint scheme: digests (and search results verified by them) of two
/// schemes are not comparable. v2: unknown residues mod q after an exp. v3: a seeded exp
/// base per trial, square roots of values not known to be ≥ 0 as random functions, zero
/// divisors flagged, float64 cross-check of field-equal graphs.
pub const FINGERPRINT_SCHEME: &str = "yirage.fingerprint.v3";

/// The field domain for one trial (the trial key seeds the uninterpreted functions and
/// exp's base). It records whether a division by a value with p-part 0 happened: the field
/// cannot model that division (0⁻¹ is taken as 0), so such a trial does not decide.
#[derive(Debug)]
pub struct FieldDomain {
    trial_key: u64,
    /// exp's base in this trial, an element of order q.
    g: u64,
    zero_divisor: AtomicBool,
}

impl FieldDomain {
    /// Domain for `trial` of a run with `seed`.
    pub fn new(seed: u64, trial: u64) -> FieldDomain {
        let trial_key = mix_words(&[0x0074_7269_616c, seed, trial]);
        FieldDomain {
            trial_key,
            g: exp_base(trial_key),
            zero_divisor: AtomicBool::new(false),
        }
    }

    /// exp's base in this trial.
    pub fn exp_base(&self) -> u64 {
        self.g
    }

    /// Whether a division by a value with p-part 0 happened in this domain.
    pub fn saw_zero_divisor(&self) -> bool {
        self.zero_divisor.load(Ordering::Relaxed)
    }

    /// `1 / b`, flagging a zero divisor.
    fn checked_inv(&self, b: Fv) -> Fv {
        if b.p_is_zero() {
            self.zero_divisor.store(true, Ordering::Relaxed);
        }
        b.inv()
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
/// Tag of the square root of a value whose sign is not known to be ≥ 0.
const SQRT_TAG: u64 = 9;
/// Tag of a max-reduction (a symmetric function of its row).
const MAX_TAG: u64 = 10;

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
        a * self.checked_inv(b)
    }
    /// The multiplicative square root (exact on values known to be ≥ 0, see the module doc).
    fn sqrt(&self, a: Fv) -> Fv {
        a.sqrt()
    }
    /// A seeded random function: the field's square root forgets the sign (sqrt(-x) would
    /// be sqrt(x)), so of a value not known to be ≥ 0 only "equal in, equal out" is kept.
    fn sqrt_signed(&self, a: Fv) -> Fv {
        if a.p_is_zero() {
            return a; // sqrt(0) = 0 exactly
        }
        uf_apply(self.uf_key(SQRT_TAG, &[]), &[a])
    }
    fn divides_by_reciprocal(&self) -> bool {
        true // a / b is defined as a · b⁻¹
    }
    fn recip(&self, b: Fv) -> Fv {
        self.checked_inv(b)
    }
    fn div_count(&self, x: Fv, n: usize) -> Fv {
        x * self.checked_inv(Fv::from_int(n as i128))
    }
    fn unary_fn<'a>(&'a self, op: UnaryOp) -> Box<dyn Fn(Fv) -> Fv + Send + Sync + 'a> {
        match op {
            UnaryOp::Exp => {
                // exact for an exponent known mod q; otherwise g^h(p-part), h seeded
                let key = self.uf_key(EXP_TAG, &[]);
                let g = self.g;
                Box::new(move |x: Fv| {
                    if x.p_is_zero() {
                        return Fv::new(1, 1); // exp(0) = 1, an integer: its residue is known
                    }
                    x.exp(g)
                        .unwrap_or_else(|| Fv::exp_of_exponent(g, mix64(key ^ x.p as u64)))
                })
            }
            UnaryOp::Square => Box::new(|x: Fv| x * x),
            UnaryOp::Sqrt => Box::new(Fv::sqrt),
            UnaryOp::Rsqrt => Box::new(|x: Fv| self.checked_inv(x.sqrt())),
            UnaryOp::Neg => Box::new(|x: Fv| -x),
            UnaryOp::MulScalar(s) => {
                let c = Fv::from_f64(s);
                Box::new(move |x: Fv| x * c)
            }
            UnaryOp::AddScalar(s) => {
                let c = Fv::from_f64(s);
                Box::new(move |x: Fv| x + c)
            }
            other => {
                // f(0) is exact (a zero p-part is, but for chance 1/p, a value that is 0 for
                // every input, e.g. y − y): relu/silu/gelu/tanh(0) = 0, sigmoid(0) = 1/2, clamp
                let at_zero = Fv::from_f64(crate::reference::F64.unary_fn(other)(0.0));
                let key = self.uf_key(uf_tag(&other), &other.params());
                Box::new(move |x: Fv| {
                    if x.p_is_zero() {
                        at_zero
                    } else {
                        uf_apply(key, &[x])
                    }
                })
            }
        }
    }
    /// A seeded random function of the row's values in sorted order (the field has no order:
    /// equal multisets give equal results, nothing else is known; a one-element row is
    /// its value).
    fn max_of(&self, row: &[Fv]) -> Fv {
        if let [v] = row {
            return *v;
        }
        let mut vals: Vec<(u32, u32)> = row.iter().map(|v| (v.p, v.q)).collect();
        vals.sort_unstable();
        let args: Vec<Fv> = vals.into_iter().map(|(p, q)| Fv { p, q }).collect();
        uf_apply(self.uf_key(MAX_TAG, &[]), &args)
    }
    fn binary(&self, op: BinaryOp, a: Fv, b: Fv) -> Fv {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => self.div(a, b),
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
    Ok(fingerprint_runs(g, trials, seed)?
        .into_iter()
        .map(|r| r.outputs)
        .collect())
}

/// Every trial's [`FieldRun`].
fn fingerprint_runs(g: &KernelGraph, trials: usize, seed: u64) -> Result<Vec<FieldRun>> {
    g.check_complete()?;
    crate::exec::check_size(g)?;
    if trials == 0 {
        return eval_err("fingerprint: trials must be ≥ 1");
    }
    (0..trials as u64)
        .into_par_iter()
        .map(|t| trial_run(g, seed, t, &trial_inputs(g, seed, t)))
        .collect()
}

/// Every rank's random field inputs of trial `t`.
fn trial_inputs(g: &KernelGraph, seed: u64, t: u64) -> Vec<Vec<Dense<Fv>>> {
    (0..g.world_size())
        .map(|r| random_rank_inputs(g, seed, t, r))
        .collect()
}

/// One trial's field outputs, and whether the field could not model a division in it.
struct FieldRun {
    outputs: Vec<Dense<Fv>>,
    zero_divisor: bool,
}

fn trial_run(g: &KernelGraph, seed: u64, t: u64, inputs: &[Vec<Dense<Fv>>]) -> Result<FieldRun> {
    let d = FieldDomain::new(seed, t);
    let outs = run_kernel_graph_ranks_on(&d, g, inputs)?;
    Ok(FieldRun {
        outputs: outs.into_iter().flatten().collect(),
        zero_divisor: d.saw_zero_divisor(),
    })
}

/// Whether two field outputs agree: equal p-parts, and equal q-parts where both are known
/// (a value computed through an exp's output has no residue mod q; see [`crate::field`]).
fn same_values(a: &[Dense<Fv>], b: &[Dense<Fv>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.dims == y.dims
                && x.data
                    .iter()
                    .zip(&y.data)
                    .all(|(u, v)| u.p == v.p && (u.q == v.q || !u.q_known() || !v.q_known()))
        })
}

/// Integers whose images a scalar's image must not share (the images of values a graph
/// makes without scalars: sums of a value with itself, negations, counts).
const IMPLICIT_INTEGERS: std::ops::RangeInclusive<i64> = -64..=64;

/// The scalars a graph embeds into the field: `mul_scalar` factors, `add_scalar` terms and
/// rms eps values (clamp bounds only key uninterpreted functions).
fn graph_scalars(g: &KernelGraph) -> Vec<f64> {
    let mut out = vec![];
    let unary = |op: &UnaryOp, out: &mut Vec<f64>| {
        if let UnaryOp::MulScalar(c) | UnaryOp::AddScalar(c) = op {
            out.push(*c);
        }
    };
    for op in g.ops() {
        match &op.kind {
            KernelOpKind::Unary { op, .. } => unary(op, &mut out),
            KernelOpKind::RmsNorm { eps, .. } => out.push(*eps),
            KernelOpKind::Customized { graph, .. } => {
                for bop in graph.ops() {
                    match bop {
                        BlockOpKind::Unary { op, .. } => unary(op, &mut out),
                        BlockOpKind::RmsNorm { eps, .. } => out.push(*eps),
                        BlockOpKind::ForloopAccum {
                            kind: AccumKind::Rms { eps },
                            ..
                        } => out.push(*eps),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether two different values among `scalars` and [`IMPLICIT_INTEGERS`] have the same
/// p-part or the same q-part (e.g. p·q + 1 and 1, or q + 1 and 1 under an exp): the field
/// cannot tell such graphs apart, so their comparison is left to the float64 cross-check.
fn scalars_collide(scalars: &[f64]) -> bool {
    static IMPLICIT: OnceLock<Vec<(f64, Fv)>> = OnceLock::new();
    let implicit = IMPLICIT.get_or_init(|| {
        IMPLICIT_INTEGERS
            .map(|k| (k as f64, Fv::from_f64(k as f64)))
            .collect()
    });
    let mut vals: Vec<f64> = scalars.iter().map(|&c| c + 0.0).collect(); // -0.0 is 0.0
    vals.sort_by(f64::total_cmp);
    vals.dedup();
    let mut seen: Vec<(f64, Fv)> = implicit.clone();
    for c in vals {
        if seen.iter().any(|&(d, _)| d == c) {
            continue;
        }
        let f = Fv::from_f64(c);
        if seen.iter().any(|&(_, g)| g.p == f.p || g.q == f.q) {
            return true;
        }
        seen.push((c, f));
    }
    false
}

/// Whether the field decides for `g` in a search, so that field-equal graphs that both pass
/// skip the float64 veto (a full-size float64 evaluation per candidate). It holds when `g` has
/// no pow (NaN for negative bases), every square root (sqrt, rsqrt, rms_norm, rms
/// accumulators) and every divisor is of a value the sign analysis proves ≥ 0, and every
/// scalar is positive. The field's root of a constant's square c² is ±c by c's quadratic
/// character, not |c|; a search's candidates are built from the target's own scalars, so a
/// root differs from the field's by a constant's sign only through a negative scalar
/// (√(c·c·m) against c·√m), while a root of a random tensor's square has a random sign per
/// element, which the field sees. A divisor ≥ 0 that is 0 on a trial's inputs is flagged by
/// that trial (which then does not decide); otherwise it is nonzero but on a null set, in both
/// graphs alike.
pub fn field_decides_in_search(g: &KernelGraph) -> bool {
    if graph_scalars(g).iter().any(|&c| c <= 0.0) {
        return false;
    }
    let signs = tensor_signs(g);
    let known = |s: Sign| s != Sign::Any;
    g.ops().iter().all(|op| match &op.kind {
        KernelOpKind::Unary { op, x } => {
            !matches!(op, UnaryOp::Sqrt | UnaryOp::Rsqrt) || known(signs[*x])
        }
        KernelOpKind::Binary { op, b, .. } => match op {
            BinaryOp::Pow => false,
            BinaryOp::Div => known(signs[*b]),
            _ => true,
        },
        KernelOpKind::Customized { inputs, graph } => {
            let in_signs: Vec<Sign> = inputs.iter().map(|&x| signs[x]).collect();
            let tiles = tile_signs(graph, &in_signs);
            graph.ops().iter().all(|bop| match bop {
                BlockOpKind::Unary { op, x } => {
                    !matches!(op, UnaryOp::Sqrt | UnaryOp::Rsqrt) || known(tiles[*x])
                }
                BlockOpKind::Binary { op, b, .. } => match op {
                    BinaryOp::Pow => false,
                    BinaryOp::Div => known(tiles[*b]),
                    _ => true,
                },
                _ => true,
            })
        }
        _ => true, // rms_norm and rms accumulators: roots of means of squares plus eps ≥ 0
    })
}

/// Outcome of comparing two graphs' outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossCheck {
    /// Some output element certainly differs.
    Differ,
    /// Every element agrees: the same infinity, or finite values within 1e-9 of the output's
    /// scale.
    Agree,
    /// No element certainly differs, but some cannot be compared closely.
    Unknown,
}

/// Relative width (to the output's largest magnitude) under which overlapping balls count
/// as agreeing.
const AGREE_TOL: f64 = 1e-9;

/// How many float64 input draws the cross-check evaluates: random signs, all positive, all
/// negative (a NaN that needs every element of a row or a sum to have one sign shows).
pub const CROSS_CHECK_DRAWS: u64 = 3;

/// Seeded float64 inputs of `draw` for every rank: magnitudes in [0.5, 2) (no input near 0),
/// signs random (draw ≡ 0 mod 3), positive (≡ 1) or negative (≡ 2).
pub fn float_inputs(g: &KernelGraph, seed: u64, draw: u64) -> Vec<Vec<Tensor>> {
    (0..g.world_size())
        .map(|r| {
            g.input_signature()
                .iter()
                .enumerate()
                .map(|(i, (dims, _))| {
                    let key = mix_words(&[0x0066_3634, seed, draw, r as u64, i as u64]);
                    let data = (0..numel(dims))
                        .map(|j| {
                            let h = mix64(key ^ mix64(j as u64));
                            let u = (h >> 11) as f64 / (1u64 << 53) as f64;
                            let m = 0.5 + 1.5 * u;
                            let negative = match draw % 3 {
                                0 => h & 1 == 1,
                                1 => false,
                                _ => true,
                            };
                            if negative {
                                -m
                            } else {
                                m
                            }
                        })
                        .collect();
                    Dense {
                        dims: dims.clone(),
                        data,
                    }
                })
                .collect()
        })
        .collect()
}

/// A graph's float64 outputs (all ranks, flattened) on the cross-check's inputs of a draw:
/// plain f64 first; the balls only when a comparison needs them.
struct FloatRun {
    inputs: Vec<Vec<Tensor>>,
    plain: Option<Vec<Tensor>>,
    /// Computed when first needed, with no lock held (see [`TrialCheck`]'s `floats`).
    balls: Mutex<Option<Arc<Balls>>>,
}

/// A graph's outputs as balls (None: the evaluator could not bound them).
type Balls = Option<Vec<Dense<Ball>>>;

impl FloatRun {
    fn new(g: &KernelGraph, seed: u64, draw: u64) -> FloatRun {
        let inputs = float_inputs(g, seed, draw);
        let plain = evaluate_ranks(g, &inputs)
            .ok()
            .map(|o| o.into_iter().flatten().collect());
        FloatRun {
            inputs,
            plain,
            balls: Mutex::new(None),
        }
    }

    fn balls(&self, g: &KernelGraph) -> Arc<Balls> {
        let cached = self.balls.lock().map(|b| b.clone()).unwrap_or(None);
        if let Some(hit) = cached {
            return hit;
        }
        let balls = Arc::new(
            evaluate_balls(g, &self.inputs)
                .ok()
                .map(|o| o.into_iter().flatten().collect()),
        );
        match self.balls.lock() {
            Ok(mut b) => b.get_or_insert(balls).clone(),
            Err(_) => balls,
        }
    }
}

/// Whether plain float64 outputs agree closely everywhere (NaN with NaN, the same infinity,
/// finite values within [`AGREE_TOL`] of the output's scale): then the balls cannot show a
/// certain difference worth the veto, and are not computed.
fn plain_close(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let scale = x
                .data
                .iter()
                .chain(&y.data)
                .filter(|v| v.is_finite())
                .fold(0.0f64, |m, v| m.max(v.abs()));
            x.dims == y.dims
                && x.data.iter().zip(&y.data).all(|(&u, &v)| {
                    (u.is_nan() && v.is_nan()) || u == v || (u - v).abs() <= AGREE_TOL * scale
                })
        })
}

/// Compare two elements of an output whose largest finite magnitude is `scale`.
fn compare_elem(a: Ball, b: Ball, scale: f64) -> CrossCheck {
    if a.is_unknown() || b.is_unknown() {
        return CrossCheck::Unknown;
    }
    match (a.v.is_finite(), b.v.is_finite()) {
        // NaN against NaN: no difference, but no evidence of agreement either (a graph that
        // is NaN almost everywhere agrees with any other such graph)
        (false, false) if a.v.is_nan() && b.v.is_nan() => CrossCheck::Unknown,
        (false, false) if a.v == b.v => CrossCheck::Agree,
        (false, false) => CrossCheck::Differ,
        (true, true) => {
            // the radii bound the distance to the exact results; 2x covers their own rounding
            if (a.v - b.v).abs() > 2.0 * (a.r + b.r) {
                CrossCheck::Differ
            } else if a.r + b.r <= AGREE_TOL * scale.max(a.v.abs()).max(b.v.abs()) {
                CrossCheck::Agree
            } else {
                CrossCheck::Unknown
            }
        }
        _ => CrossCheck::Differ, // an exact NaN/infinity against a finite value
    }
}

/// Compare two graphs' float64 outputs (same dims, checked by the callers).
pub fn cross_compare(a: &[Dense<Ball>], b: &[Dense<Ball>]) -> CrossCheck {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.dims != y.dims) {
        return CrossCheck::Differ;
    }
    let mut all_agree = true;
    for (x, y) in a.iter().zip(b) {
        let scale = x
            .data
            .iter()
            .chain(&y.data)
            .filter(|e| e.v.is_finite())
            .fold(0.0f64, |m, e| m.max(e.v.abs()));
        for (&ea, &eb) in x.data.iter().zip(&y.data) {
            match compare_elem(ea, eb, scale) {
                CrossCheck::Differ => return CrossCheck::Differ,
                CrossCheck::Unknown => all_agree = false,
                CrossCheck::Agree => {}
            }
        }
    }
    if all_agree {
        CrossCheck::Agree
    } else {
        CrossCheck::Unknown
    }
}

/// A target's fingerprint values, against which candidates are checked trial by trial: a
/// candidate that differs in the first trial (most wrong ones) costs one trial, not `trials`.
/// The random inputs of every trial are kept (candidates share the target's inputs; drawing
/// them was a fifth of a search's time).
///
/// The verdict ([`TrialCheck::verdict`]): a trial in which neither graph divided by a value
/// with p-part 0, of graphs whose scalars do not collide ([`scalars_collide`]), *decides*.
/// A decisive difference means "not equivalent". When every trial agrees and decides, the
/// float64 cross-check can still veto (in a search, unless both graphs pass
/// [`field_decides_in_search`]): it sees what the field cannot, NaNs of square roots of
/// negative values, infinities, magnitudes. When some trial does not decide, the float64
/// cross-check alone decides and must agree on every element.
pub struct TrialCheck {
    seed: u64,
    signature: (Vec<(Dims, DType)>, usize),
    trials: Vec<Trial>,
    scalars: Vec<f64>,
    /// [`field_decides_in_search`] of the target.
    alone: bool,
    /// Whether pairs that both pass [`field_decides_in_search`] skip the float64 veto (the
    /// search's setting; [`equivalent`] always runs it).
    skip_veto: bool,
    /// The target's float64 outputs per draw (computed when first needed).
    /// No lock is held while they are computed: the evaluator runs matmuls with rayon, and a
    /// rayon thread waiting on a lock may be the one holding it (it can steal another
    /// candidate's check while it waits), so two threads may compute them and one copy is kept.
    floats: Mutex<Option<Arc<Vec<FloatRun>>>>,
    target: KernelGraph,
}

/// One trial of the target: every rank's inputs and the outputs.
struct Trial {
    inputs: Vec<Vec<Dense<Fv>>>,
    run: FieldRun,
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
                let run = trial_run(target, seed, t, &inputs)?;
                Ok(Trial { inputs, run })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            seed,
            signature: (target.input_signature(), target.world_size()),
            trials,
            scalars: graph_scalars(target),
            alone: field_decides_in_search(target),
            skip_veto: true,
            floats: Mutex::new(None),
            target: target.clone(),
        })
    }

    /// Run the float64 veto on every field-equal pair, even where [`field_decides_in_search`]
    /// holds for both graphs (it then only guards against scalar products congruent modulo
    /// p and q, which a search's candidates, built from the target's own scalars, cannot
    /// have).
    pub fn always_cross_check(mut self) -> Self {
        self.skip_veto = false;
        self
    }

    /// Whether `g` is equivalent to the target (false when `g` cannot be evaluated).
    pub fn matches(&self, g: &KernelGraph) -> bool {
        self.verdict(g).unwrap_or(false)
    }

    /// Whether `g` is equivalent to the target (see the type's doc); errors when `g` cannot
    /// be evaluated.
    pub fn verdict(&self, g: &KernelGraph) -> Result<bool> {
        g.check_complete()?;
        crate::exec::check_size(g)?;
        let same_inputs = (g.input_signature(), g.world_size()) == self.signature;
        let mut scalars = graph_scalars(g);
        scalars.extend(&self.scalars);
        let collide = scalars_collide(&scalars);
        let mut decisive = !collide;
        for (t, trial) in self.trials.iter().enumerate() {
            let t = t as u64;
            let got = if same_inputs {
                trial_run(g, self.seed, t, &trial.inputs)?
            } else {
                trial_run(g, self.seed, t, &trial_inputs(g, self.seed, t))?
            };
            let trusted = !collide && !got.zero_divisor && !trial.run.zero_divisor;
            if trusted && !same_values(&got.outputs, &trial.run.outputs) {
                return Ok(false);
            }
            decisive &= trusted;
        }
        if decisive && self.skip_veto && self.alone && field_decides_in_search(g) {
            return Ok(true);
        }
        let cross = self.cross_check(g, !decisive);
        Ok(if decisive {
            cross != CrossCheck::Differ
        } else {
            // a graph is equivalent to itself, whatever its values
            cross == CrossCheck::Agree || crate::json::hash(g) == crate::json::hash(&self.target)
        })
    }

    /// The float64 cross-check of `g` against the target. With `strict` false (a veto of a
    /// field-equal pair) plain float64 outputs that agree closely end it (as `Unknown`: no
    /// certain difference); otherwise the balls decide.
    pub fn cross_check(&self, g: &KernelGraph, strict: bool) -> CrossCheck {
        let targets = self.target_floats();
        let mut out = CrossCheck::Agree;
        for (d, target) in targets.iter().enumerate() {
            match self.cross_check_draw(target, g, d as u64, strict) {
                CrossCheck::Differ => return CrossCheck::Differ,
                CrossCheck::Unknown => out = CrossCheck::Unknown,
                CrossCheck::Agree => {}
            }
        }
        out
    }

    /// The target's float64 outputs per draw, computed when first needed.
    fn target_floats(&self) -> Arc<Vec<FloatRun>> {
        let cached = self.floats.lock().map(|f| f.clone()).unwrap_or(None);
        if let Some(hit) = cached {
            return hit;
        }
        let runs: Arc<Vec<FloatRun>> = Arc::new(
            (0..CROSS_CHECK_DRAWS)
                .map(|d| FloatRun::new(&self.target, self.seed, d))
                .collect(),
        );
        match self.floats.lock() {
            Ok(mut f) => f.get_or_insert(runs).clone(),
            Err(_) => runs,
        }
    }

    /// [`TrialCheck::cross_check`] on one draw.
    fn cross_check_draw(
        &self,
        target: &FloatRun,
        g: &KernelGraph,
        draw: u64,
        strict: bool,
    ) -> CrossCheck {
        let got = FloatRun::new(g, self.seed, draw);
        if !strict {
            if let (Some(a), Some(b)) = (&target.plain, &got.plain) {
                if plain_close(a, b) {
                    return CrossCheck::Unknown;
                }
            }
        }
        match (&*target.balls(&self.target), &*got.balls(g)) {
            (Some(a), Some(b)) => cross_compare(a, b),
            _ => CrossCheck::Unknown,
        }
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
    let runs = with_threads(threads, || fingerprint_runs(g, trials, seed))?;
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
    for run in &runs {
        if run.zero_divisor {
            // the field could not model a division: such digests match only each other
            h.update(b"zero_divisor");
        }
        for out in &run.outputs {
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
/// `false` when output counts or dims differ; otherwise [`TrialCheck::verdict`]: the field
/// values of `trials` trials, checked by the float64 cross-check (the search verifies its
/// candidates the same way).
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
    TrialCheck::new(a, trials, seed)?
        .always_cross_check()
        .verdict(b)
}
