//! Phase (a) of the block level: enumeration of *abstract* block programs.
//!
//! Given the kernel tensors a customized op reads, enumerate DAGs of block ops over their
//! tiles without any mapping (no grid, no loop, no tile sizes). Tiles carry their *value
//! dims* (the dims the tile would have with one block and no loop), so shape rules prune
//! ill-typed programs here already, and their abstract expression, so the e-graph prunes
//! every op that cannot be a subterm of the target. Phases follow the IR's rule: ops before
//! accumulators run in the loop, accumulators end the loop, after-loop ops consume
//! accumulated tiles (and inputs, which the concretisation then loads once).
//!
//! Unary ops, rms_norm and target [`Fragment`]s in the loop body are not moves of their
//! own: a move is a main op whose operands are *views* — a tile with a chain of such steps
//! applied, materialised with the move (see `views`). Elementwise chains are fused into
//! their consumer by rule (docs/kernel-plan.md), and every body tile has a consumer, so this
//! enumerates the same programs with far fewer states: attention's 7 ops are 5 moves,
//! QK-norm attention's 13 ops 5 moves. `max_block_ops` counts every op, a fragment as one.
//!
//! For the kernel graph's last op ([`enumerate`]'s `last`), every output must be a target
//! output and every value one of the target's *goal classes*
//! ([`super::expr::TargetExprs::goal_classes`]): values that cannot end up under an output
//! are never built.
//!
//! Canonical ordering: moves are appended in an order where each move either consumes the
//! previous move's main tile or has a larger key (max base tile, kind, bases, parameter and
//! chains) than the previous move; every DAG has such an order (take ready moves by
//! smallest key), so the enumeration is complete while most permutations are skipped.
//! Identical tiles (same expression, dims and phase) are never built twice.

use super::dims::{self, Labels};
use super::expr::{AbsVal, LookupBuilder};
use super::lift::{lift_accum, lift_binary, lift_matmul, lift_rms_norm, lift_unary};
use super::{Run, Vocab};
use crate::dtype::DType;
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use crate::shape::{broadcast_dims, broadcast_fits, keepdim_dims, matmul_dims, matmul_fits, Dims};
use rayon::prelude::*;
use std::sync::Arc;

/// A kernel tensor as seen by a customized op.
#[derive(Debug, Clone, PartialEq)]
pub struct KIn {
    pub abs: AbsVal,
    /// Stored dims.
    pub dims: Dims,
    /// Dims of the value (stored dims with the partial-chunk dim divided by its count).
    pub value_dims: Dims,
    /// `(dim, s)`: the tensor holds `s` partial sums side by side along `dim`.
    pub chunks: Option<(usize, usize)>,
    pub dtype: DType,
    /// Bytes per element of its buffer (for the cost model).
    pub elem_bytes: usize,
    /// The target class of each dim ([`Labels`]).
    pub labels: Labels,
}

/// An abstract block op (operands are tile ids; inputs come first).
#[derive(Debug, Clone, PartialEq)]
pub enum BOp {
    Input(usize),
    Matmul(usize, usize),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Reduction(usize, usize),
    RmsNorm(usize),
    Accum(usize, AccumKind),
}

impl BOp {
    /// Operand tiles.
    pub fn operands(&self) -> Vec<usize> {
        match *self {
            BOp::Input(_) => vec![],
            BOp::Matmul(a, b) | BOp::Binary(_, a, b) => vec![a, b],
            BOp::Unary(_, x) | BOp::Reduction(x, _) | BOp::RmsNorm(x) | BOp::Accum(x, _) => vec![x],
        }
    }

    /// Short name for labels.
    pub fn name(&self) -> String {
        match self {
            BOp::Input(_) => "input".into(),
            BOp::Matmul(..) => "matmul".into(),
            BOp::Unary(op, _) => op.name().into(),
            BOp::Binary(op, ..) => op.name().into(),
            BOp::Reduction(..) => "reduction".into(),
            BOp::RmsNorm(_) => "rms_norm".into(),
            BOp::Accum(_, k) => format!("accum_{}", k.name().unwrap_or("iter")),
        }
    }
}

fn param_code(name: &str, params: &[f64]) -> u64 {
    let mut h: u64 = 1469598103934665603;
    for b in name
        .bytes()
        .chain(params.iter().flat_map(|p| p.to_bits().to_le_bytes()))
    {
        h = (h ^ b as u64).wrapping_mul(1099511628211);
    }
    h
}

/// One tile of an abstract program.
#[derive(Debug, Clone, PartialEq)]
pub struct BTile {
    pub abs: AbsVal,
    pub dims: Dims,
    /// After the loop (downstream of an accumulator).
    pub after: bool,
    /// Can hold a partial sum (derived from a contraction or a partial-chunk input through
    /// ops linear in it): the only tiles an iteration accumulator may take, since
    /// accumulating anything else is either a copy (no loop) or wrong (with a loop).
    pub summable: bool,
    /// The target class of each dim ([`Labels`]).
    pub labels: Labels,
    /// Holds partial chunks whatever the loop: made from a partial-chunk input by ops linear
    /// in it. The concretisation refuses every mapping of a program that uses such a tile
    /// non-linearly (see [`partial_step`]), so the enumeration does not build one.
    pub partial: bool,
}

/// A complete abstract program: every input used, every loop tile consumed, outputs =
/// after-loop sinks.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockProgram {
    pub ops: Vec<BOp>,
    pub tiles: Vec<BTile>,
    pub outputs: Vec<usize>,
    pub n_inputs: usize,
}

impl BlockProgram {
    /// Ops (without inputs) as a short list, e.g. `matmul,accum_iter,accum_rms,div`.
    pub fn describe(&self) -> String {
        let v: Vec<String> = self.ops[self.n_inputs..].iter().map(|o| o.name()).collect();
        v.join(",")
    }
}

/// Classes the values of a kernel graph's last op may take.
pub type Goal = std::collections::HashSet<egg::Id>;

/// Longest chain of steps (unary ops, rms_norm, fragments) folded into one operand of a
/// block op (see the module doc).
pub const MAX_CHAIN: usize = 3;

/// Canonical-order key of a move: (max base tile, op code, base a, base b, parameters and
/// operand chains).
type Key = (usize, u8, usize, usize, u64);

#[derive(Clone)]
struct BState {
    ops: Vec<BOp>,
    tiles: Vec<BTile>,
    uses: Vec<u32>,
    /// Made by a unary chain folded into an operand (such a tile is reached through its
    /// chain's base, never used as a base itself).
    chained: Vec<bool>,
    n_inputs: usize,
    n_accum: usize,
    /// Ops charged against `max_block_ops` (a fragment counts as one).
    charged: usize,
    applied: Vec<Applied>,
    /// The view of each tile as itself (shared, so building views allocates nothing).
    plain: Vec<Arc<Tpl>>,
}

/// What undoing a move needs, and what the next move's canonical check compares with.
#[derive(Clone, Copy)]
struct Applied {
    /// Ops the move pushed.
    pushed: usize,
    charge: usize,
    key: Key,
    /// The move's main tile.
    main: usize,
}

impl BState {
    fn is_input(&self, t: usize) -> bool {
        t < self.n_inputs
    }
}

/// One DFS move: the unary ops of its operands' chains that do not exist yet, then the main
/// op (operands are tile ids valid once `pre` is applied).
struct BMove {
    pre: Vec<(BOp, BTile)>,
    op: BOp,
    tile: BTile,
    key: Key,
    charge: usize,
}

/// Enumerate the abstract block programs over `ins` (at most `cfg.max_block_ops` ops).
/// `last`: the program is the kernel graph's last op, so every output must be a target
/// output (nothing could consume it); `goal`: then every value must be one of these classes
/// ([`super::expr::TargetExprs::goal_classes`]; `None` with pruning off).
pub fn enumerate(
    run: &Run,
    vocab: &Vocab,
    ins: &[KIn],
    last: bool,
    goal: Option<&Goal>,
) -> Vec<BlockProgram> {
    let n = ins.len();
    let st = BState {
        ops: (0..n).map(BOp::Input).collect(),
        tiles: ins
            .iter()
            .map(|k| BTile {
                abs: k.abs,
                dims: k.value_dims.clone(),
                after: false,
                summable: k.chunks.is_some(),
                labels: k.labels.clone(),
                partial: k.chunks.is_some(),
            })
            .collect(),
        uses: vec![0; n],
        chained: vec![false; n],
        n_inputs: n,
        n_accum: 0,
        charged: 0,
        applied: vec![],
        plain: vec![],
    };
    let st = BState {
        plain: st.tiles.iter().map(plain_tpl).collect(),
        ..st
    };
    let first = moves(run, vocab, goal, &st, &mut ViewCache::new());
    first
        .into_par_iter()
        .map(|mv| {
            let mut out = vec![];
            let mut st = st.clone();
            apply(&mut st, mv);
            if feasible(run, &st) {
                let mut cache = ViewCache::new();
                dfs(run, vocab, (last, goal), &mut st, &mut cache, &mut out);
            }
            out
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flatten()
        .collect()
}

fn push(st: &mut BState, op: BOp, tile: BTile, chained: bool) {
    for a in op.operands() {
        st.uses[a] += 1;
    }
    if matches!(op, BOp::Accum(..)) {
        st.n_accum += 1;
    }
    st.ops.push(op);
    st.tiles.push(tile);
    st.uses.push(0);
    st.chained.push(chained);
    let p = plain_tpl(st.tiles.last().expect("just pushed"));
    st.plain.push(p);
}

fn plain_tpl(t: &BTile) -> Arc<Tpl> {
    Arc::new(Tpl {
        base_abs: t.abs,
        base_sum: t.summable,
        ops: vec![],
        steps: 0,
        charge: 0,
        abs: t.abs,
        dims: t.dims.clone(),
        after: t.after,
        summable: t.summable,
        code: 0,
    })
}

fn apply(st: &mut BState, mv: BMove) {
    let pushed = mv.pre.len() + 1;
    for (op, tile) in mv.pre {
        push(st, op, tile, true);
    }
    push(st, mv.op, mv.tile, false);
    st.charged += mv.charge;
    st.applied.push(Applied {
        pushed,
        charge: mv.charge,
        key: mv.key,
        main: st.tiles.len() - 1,
    });
}

fn undo(st: &mut BState) {
    let Some(a) = st.applied.pop() else {
        return;
    };
    st.charged -= a.charge;
    for _ in 0..a.pushed {
        if let Some(op) = st.ops.pop() {
            for a in op.operands() {
                st.uses[a] -= 1;
            }
            if matches!(op, BOp::Accum(..)) {
                st.n_accum -= 1;
            }
            st.tiles.pop();
            st.uses.pop();
            st.chained.pop();
            st.plain.pop();
        }
    }
}

fn dfs(
    run: &Run,
    vocab: &Vocab,
    (last, goal): (bool, Option<&Goal>),
    st: &mut BState,
    cache: &mut ViewCache,
    out: &mut Vec<BlockProgram>,
) {
    if run.count_state() {
        return;
    }
    if let Some(p) = complete(run, last, st) {
        out.push(p);
    }
    if st.charged >= run.cfg.max_block_ops {
        return;
    }
    for mv in moves(run, vocab, goal, st, cache) {
        apply(st, mv);
        if feasible(run, st) {
            dfs(run, vocab, (last, goal), st, cache, out);
        }
        undo(st);
        if run.stopped() {
            return;
        }
    }
}

/// Can the state still be completed within the op budget?
fn feasible(run: &Run, st: &BState) -> bool {
    let open_inputs = (0..st.n_inputs).filter(|&i| st.uses[i] == 0).count();
    let open_loop = (st.n_inputs..st.tiles.len())
        .filter(|&i| !st.tiles[i].after && st.uses[i] == 0)
        .count();
    let left = run.cfg.max_block_ops.saturating_sub(st.charged);
    // Each op consumes at most two open tiles; an accumulator is needed if none exists.
    let need = (open_inputs + open_loop)
        .div_ceil(2)
        .max(usize::from(st.n_accum == 0));
    need <= left
}

fn complete(run: &Run, last: bool, st: &BState) -> Option<BlockProgram> {
    if st.n_accum == 0 || (0..st.n_inputs).any(|i| st.uses[i] == 0) {
        return None;
    }
    let mut outputs = vec![];
    for i in st.n_inputs..st.tiles.len() {
        let t = &st.tiles[i];
        if st.uses[i] == 0 {
            if !t.after || t.abs.known().is_none() {
                return None;
            }
            if last && !(0..run.target.outputs.len()).any(|k| run.target.is_output(t.abs, k)) {
                return None;
            }
            outputs.push(i);
        }
    }
    if outputs.is_empty() {
        return None;
    }
    Some(BlockProgram {
        ops: st.ops.clone(),
        tiles: st.tiles.clone(),
        outputs,
        n_inputs: st.n_inputs,
    })
}

/// A fragment of the target: a sub-DAG of elementwise ops and reductions that reads one
/// tensor and yields a tensor of the same dims (e.g. QK-norm's `K / sqrt(mean(K², d))`).
/// The search applies fragments to tiles as operand steps (see the module doc), so a prologue
/// the target computes on an input is fused into a block program in one step instead of
/// being rediscovered op by op. Operand 0 is the source; `k + 1` is the result of `ops[k]`;
/// the last op is the fragment's value. Fingerprints verify every use like any other op.
#[derive(Debug, Clone, PartialEq)]
pub struct Fragment {
    pub ops: Vec<FOp>,
}

/// One op of a [`Fragment`] (operands are fragment-local ids).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FOp {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// Sum over a dim (keepdim), counted from the front as in the target.
    Reduction(usize, usize),
}

/// The fragments of `g` (see [`Fragment`]): every tensor made by unary/binary/reduction ops
/// from exactly one other tensor of the same dims, with at least one binary op or reduction
/// (pure unary chains are operand chains already).
pub fn fragments(g: &KernelGraph) -> Vec<Fragment> {
    let ops = g.ops();
    let mut producer: Vec<Option<usize>> = vec![None; g.num_tensors()];
    for (i, op) in ops.iter().enumerate() {
        for &o in &op.outs {
            if let Some(p) = producer.get_mut(o) {
                *p = Some(i);
            }
        }
    }
    let elementwise = |i: usize| {
        matches!(
            ops[i].kind,
            KernelOpKind::Unary { .. }
                | KernelOpKind::Binary { .. }
                | KernelOpKind::Reduction { .. }
        )
    };
    let mut out: Vec<Fragment> = vec![];
    for (t, info) in g.tensors().iter().enumerate() {
        let Some(pi) = producer[t].filter(|&p| elementwise(p)) else {
            continue;
        };
        // The sub-DAG of elementwise ops ending at t and the tensors it reads.
        let mut sub: Vec<usize> = vec![];
        let mut leaves: Vec<usize> = vec![];
        let mut stack = vec![pi];
        while let Some(i) = stack.pop() {
            if sub.contains(&i) {
                continue;
            }
            sub.push(i);
            for x in ops[i].kind.operands() {
                match producer[x].filter(|&p| elementwise(p)) {
                    Some(p) => stack.push(p),
                    None => {
                        if !leaves.contains(&x) {
                            leaves.push(x)
                        }
                    }
                }
            }
        }
        if leaves.len() != 1 || g.tensors()[leaves[0]].dims != info.dims || sub.len() < 2 {
            continue;
        }
        if sub
            .iter()
            .all(|&i| matches!(ops[i].kind, KernelOpKind::Unary { .. }))
        {
            continue;
        }
        sub.sort_unstable();
        let mut local: Vec<(usize, usize)> = vec![(leaves[0], 0)];
        let id = |local: &Vec<(usize, usize)>, x: usize| {
            local.iter().find(|l| l.0 == x).map(|l| l.1).unwrap_or(0)
        };
        let mut fops = vec![];
        for (k, &i) in sub.iter().enumerate() {
            let f = match ops[i].kind {
                KernelOpKind::Unary { op, x } => FOp::Unary(op, id(&local, x)),
                KernelOpKind::Binary { op, a, b } => FOp::Binary(op, id(&local, a), id(&local, b)),
                KernelOpKind::Reduction { x, dim } => FOp::Reduction(id(&local, x), dim),
                _ => unreachable!("only elementwise ops are collected"),
            };
            fops.push(f);
            local.push((ops[i].outs[0], k + 1));
        }
        let f = Fragment { ops: fops };
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// Where an op of a view reads: the view's base tile or an earlier op of the view.
#[derive(Debug, Clone, Copy, PartialEq)]
enum VSrc {
    Base,
    Op(usize),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum VKind {
    Unary(UnaryOp, VSrc),
    Binary(BinaryOp, VSrc, VSrc),
    Reduction(VSrc, usize),
    RmsNorm(VSrc),
}

/// One op of a view, with its value's expression, dims and whether it can hold a partial sum.
#[derive(Debug, Clone)]
struct VOp {
    kind: VKind,
    /// The step of the view this op belongs to.
    step: usize,
    abs: AbsVal,
    dims: Dims,
    summable: bool,
}

/// An operand of a move: a base tile with a chain of steps applied to it (no steps: the
/// tile itself). A step is a unary op, an rms_norm or a target [`Fragment`].
#[derive(Debug, Clone)]
struct View {
    base: usize,
    t: Arc<Tpl>,
}

impl std::ops::Deref for View {
    type Target = Tpl;
    fn deref(&self) -> &Tpl {
        &self.t
    }
}

/// A view without its base tile: what the steps compute from a value like the base's.
#[derive(Debug, Clone)]
struct Tpl {
    base_abs: AbsVal,
    base_sum: bool,
    ops: Vec<VOp>,
    steps: usize,
    /// Ops charged against `max_block_ops` (a fragment counts as one).
    charge: usize,
    abs: AbsVal,
    dims: Dims,
    after: bool,
    summable: bool,
    /// Hash of the steps (part of the move key).
    code: u64,
}

fn summable_of(kind: VKind, s: impl Fn(VSrc) -> bool) -> bool {
    match kind {
        VKind::Reduction(..) => true,
        VKind::Unary(u, x) => s(x) && matches!(u, UnaryOp::Neg | UnaryOp::MulScalar(_)),
        VKind::Binary(BinaryOp::Add | BinaryOp::Sub, a, b) => s(a) && s(b),
        VKind::Binary(BinaryOp::Mul, a, b) => s(a) || s(b),
        VKind::Binary(BinaryOp::Div, a, _) => s(a),
        _ => false,
    }
}

/// Apply one step (`Err` index: unary op, `Ok(None)`: rms_norm, `Ok(Some(f))`: fragment
/// `f`) to `v`; `None` when an op is not known to the target or the dims do not fit.
fn extend(
    run: &Run,
    vocab: &Vocab,
    lb: &mut LookupBuilder<'_>,
    v: &Tpl,
    step: Result<Option<usize>, UnaryOp>,
) -> Option<Tpl> {
    let mut ops = v.ops.clone();
    let src0 = if ops.is_empty() {
        VSrc::Base
    } else {
        VSrc::Op(ops.len() - 1)
    };
    let val = |ops: &Vec<VOp>, s: VSrc| match s {
        VSrc::Base => (v.base_abs, v.dims.clone(), v.base_sum),
        VSrc::Op(k) => (ops[k].abs, ops[k].dims.clone(), ops[k].summable),
    };
    let mut push = |ops: &mut Vec<VOp>, kind: VKind| -> Option<VSrc> {
        let (abs, dims) = match kind {
            VKind::Unary(u, x) => {
                let (a, d, _) = val(ops, x);
                (lift_unary(lb, u, a), d)
            }
            VKind::RmsNorm(x) => {
                let (a, d, _) = val(ops, x);
                (lift_rms_norm(lb, a, None), d)
            }
            VKind::Binary(b, x, y) => {
                let (a1, d1, _) = val(ops, x);
                let (a2, d2, _) = val(ops, y);
                (
                    lift_binary(lb, b, a1, a2),
                    broadcast_dims("", &d1, &d2).ok()?,
                )
            }
            VKind::Reduction(x, d) => {
                let (a, dd, _) = val(ops, x);
                if d >= dd.len() || dd[d] <= 1 {
                    return None;
                }
                (
                    lb.target.lookup(super::expr::AbsNode::Sum(a)),
                    keepdim_dims(&dd, d),
                )
            }
        };
        if abs.known().is_none() && run.cfg.prune {
            run.count_pruned();
            return None;
        }
        let summable = summable_of(kind, |s| val(ops, s).2);
        ops.push(VOp {
            kind,
            step: v.steps,
            abs,
            dims,
            summable,
        });
        Some(VSrc::Op(ops.len() - 1))
    };
    let (charge, code) = match step {
        Err(u) => {
            push(&mut ops, VKind::Unary(u, src0))?;
            (1, param_code(u.name(), &u.params()))
        }
        Ok(None) => {
            vocab.rms_eps?;
            push(&mut ops, VKind::RmsNorm(src0))?;
            (1, param_code("rms_norm", &[]))
        }
        Ok(Some(fi)) => {
            let f = &vocab.fragments[fi];
            let mut ids = vec![src0];
            for fop in &f.ops {
                let kind = match *fop {
                    FOp::Unary(u, x) => VKind::Unary(u, ids[x]),
                    FOp::Binary(b, x, y) => VKind::Binary(b, ids[x], ids[y]),
                    FOp::Reduction(x, d) => VKind::Reduction(ids[x], d),
                };
                ids.push(push(&mut ops, kind)?);
            }
            (1, param_code("fragment", &[fi as f64]))
        }
    };
    let last = ops.last()?;
    if last.dims != v.dims {
        return None;
    }
    Some(Tpl {
        base_abs: v.base_abs,
        base_sum: v.base_sum,
        steps: v.steps + 1,
        charge: v.charge + charge,
        abs: last.abs,
        dims: v.dims.clone(),
        after: false,
        summable: last.summable,
        code: code
            .wrapping_add(v.code.rotate_left(17))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1,
        ops,
    })
}

/// The operands moves may use. Unary ops, rms_norm and target fragments in the loop body
/// are not moves of their own: they are steps folded into the operand that consumes them
/// (elementwise chains are fused into their consumer by rule, docs/kernel-plan.md, and every
/// body tile has a consumer), so the DFS is as deep as the program has other ops. Body
/// tiles and inputs get every chain of known steps up to [`MAX_CHAIN`] long (1 without
/// pruning); a value reachable two ways keeps the shorter (a tile itself first). After-loop
/// tiles take unary ops and rms_norm as moves of their own, since an after-loop value may be
/// an output that nothing consumes.
fn views(
    run: &Run,
    vocab: &Vocab,
    goal: Option<&Goal>,
    st: &BState,
    cache: &mut ViewCache,
) -> Vec<View> {
    let mut out: Vec<View> = (0..st.tiles.len())
        .filter(|&t| !st.chained[t])
        .map(|t| View {
            base: t,
            t: st.plain[t].clone(),
        })
        .collect();
    let plain = out.len();
    for bi in 0..plain {
        if out[bi].after {
            continue;
        }
        let key = (out[bi].abs, out[bi].dims.clone(), out[bi].summable);
        let chains = cache
            .entry(key)
            .or_insert_with(|| chains(run, vocab, goal, &out[bi].t))
            .clone();
        for c in chains.iter() {
            if out
                .iter()
                .any(|w| w.abs == c.abs && w.dims == c.dims && !w.after)
            {
                continue;
            }
            out.push(View {
                base: out[bi].base,
                t: c.clone(),
            });
        }
    }
    out
}

/// Chained views of values like `base` (by expression, dims and summability), shortest
/// first; memoised per DFS task (`base` in the result is a placeholder).
type ViewCache = std::collections::HashMap<(AbsVal, Dims, bool), Arc<Vec<Arc<Tpl>>>>;

fn chains(run: &Run, vocab: &Vocab, goal: Option<&Goal>, base: &Tpl) -> Arc<Vec<Arc<Tpl>>> {
    let in_goal = |abs: AbsVal| goal.is_none_or(|g| abs.known().is_some_and(|i| g.contains(&i)));
    let max_chain = if run.cfg.prune { MAX_CHAIN } else { 1 };
    let mut lb = LookupBuilder {
        target: &run.target,
    };
    let mut steps: Vec<Result<Option<usize>, UnaryOp>> =
        vocab.unary.iter().map(|&u| Err(u)).collect();
    if vocab.rms_eps.is_some() {
        steps.push(Ok(None));
    }
    steps.extend((0..vocab.fragments.len()).map(|f| Ok(Some(f))));
    let mut out: Vec<Arc<Tpl>> = vec![];
    let mut frontier: Vec<Tpl> = vec![base.clone()];
    for _ in 0..max_chain {
        let mut next = vec![];
        for v in &frontier {
            for &step in &steps {
                let Some(nv) = extend(run, vocab, &mut lb, v, step) else {
                    continue;
                };
                if nv.abs == base.abs
                    || out.iter().any(|w| w.abs == nv.abs && w.dims == nv.dims)
                    || !nv.ops.iter().all(|o| in_goal(o.abs))
                {
                    continue;
                }
                out.push(Arc::new(nv.clone()));
                next.push(nv);
            }
        }
        frontier = next;
    }
    Arc::new(out)
}

/// The tile of `v` once its ops exist: existing tiles with the same value are reused (from
/// the state or already pending in `pre`), the missing ops are appended to `pre`. Returns
/// the tile and the number of steps that had ops to add (each is charged as one op).
fn resolve(st: &BState, pre: &mut Vec<(BOp, BTile)>, v: &View, partial: &[bool]) -> (usize, usize) {
    if v.ops.is_empty() {
        return (v.base, 0);
    }
    let n = st.tiles.len();
    let find = |pre: &Vec<(BOp, BTile)>, o: &VOp| -> Option<usize> {
        (0..n)
            .find(|&t| st.tiles[t].abs == o.abs && st.tiles[t].dims == o.dims && !st.tiles[t].after)
            .or_else(|| {
                pre.iter()
                    .position(|(_, t)| t.abs == o.abs && t.dims == o.dims)
                    .map(|i| n + i)
            })
    };
    // Ops needed: the last one, and (unless they exist) the operands of needed ops.
    let k = v.ops.len();
    let existing: Vec<Option<usize>> = v.ops.iter().map(|o| find(pre, o)).collect();
    let mut needed = vec![false; k];
    needed[k - 1] = true;
    for i in (0..k).rev() {
        if !needed[i] || existing[i].is_some() {
            continue;
        }
        let srcs = match v.ops[i].kind {
            VKind::Unary(_, x) | VKind::Reduction(x, _) | VKind::RmsNorm(x) => vec![x],
            VKind::Binary(_, x, y) => vec![x, y],
        };
        for s in srcs {
            if let VSrc::Op(j) = s {
                needed[j] = true;
            }
        }
    }
    let mut ids: Vec<usize> = vec![usize::MAX; k];
    let mut charged = vec![false; v.steps];
    for i in 0..k {
        if !needed[i] {
            continue;
        }
        if let Some(t) = existing[i].or_else(|| find(pre, &v.ops[i])) {
            ids[i] = t;
            continue;
        }
        let id = |s: VSrc| match s {
            VSrc::Base => v.base,
            VSrc::Op(j) => ids[j],
        };
        let op = match v.ops[i].kind {
            VKind::Unary(u, x) => BOp::Unary(u, id(x)),
            VKind::Binary(b, x, y) => BOp::Binary(b, id(x), id(y)),
            VKind::Reduction(x, d) => BOp::Reduction(id(x), d),
            VKind::RmsNorm(x) => BOp::RmsNorm(id(x)),
        };
        let o = &v.ops[i];
        // a step keeps its base's dims or reduces some of them to 1
        let labels = o
            .dims
            .iter()
            .zip(&st.tiles[v.base].labels)
            .map(|(&d, &l)| l.filter(|_| d > 1))
            .collect();
        pre.push((
            op,
            BTile {
                abs: o.abs,
                dims: o.dims.clone(),
                after: false,
                summable: o.summable,
                labels,
                partial: partial[i],
            },
        ));
        ids[i] = n + pre.len() - 1;
        charged[o.step] = true;
    }
    (ids[k - 1], charged.iter().filter(|&&c| c).count())
}

/// Whether an op's result holds partial chunks whatever the loop, from its operands' flags
/// (`a`, `b`); None when the concretisation would refuse it under every mapping: a partial
/// tile through a non-linear op, divided by, raised to a power, multiplied by another
/// partial one, or normalised. (An add of a partial tile and another one is partial or
/// refused; the refusal depends on the mapping, so it is not decided here.)
fn partial_step(op: Step, a: bool, b: bool) -> Option<bool> {
    match op {
        Step::Linear | Step::Reduce => Some(a),
        Step::NonLinear | Step::Norm => (!a).then_some(false),
        Step::Binary(BinaryOp::Add | BinaryOp::Sub) => Some(a || b),
        Step::Binary(BinaryOp::Mul) => (!(a && b)).then_some(a || b),
        Step::Binary(BinaryOp::Div) => (!b).then_some(a),
        Step::Binary(BinaryOp::Pow) => (!(a || b)).then_some(false),
    }
}

/// The kinds of op [`partial_step`] tells apart.
#[derive(Clone, Copy)]
enum Step {
    Linear,
    NonLinear,
    Reduce,
    Norm,
    Binary(BinaryOp),
}

fn unary_step(u: UnaryOp) -> Step {
    if matches!(u, UnaryOp::Neg | UnaryOp::MulScalar(_)) {
        Step::Linear
    } else {
        Step::NonLinear
    }
}

/// The [`partial_step`] flag of every op of view `v` (None: one is refused).
fn view_partial(st: &BState, v: &View) -> Option<Vec<bool>> {
    let base = st.tiles[v.base].partial;
    let mut out: Vec<bool> = Vec::with_capacity(v.ops.len());
    for o in &v.ops {
        let p = |s: VSrc| match s {
            VSrc::Base => base,
            VSrc::Op(k) => out[k],
        };
        let flag = match o.kind {
            VKind::Unary(u, x) => partial_step(unary_step(u), p(x), false),
            VKind::Reduction(x, _) => partial_step(Step::Reduce, p(x), false),
            VKind::RmsNorm(x) => partial_step(Step::Norm, p(x), false),
            VKind::Binary(b, x, y) => partial_step(Step::Binary(b), p(x), p(y)),
        }?;
        out.push(flag);
    }
    Some(out)
}

/// A candidate main op over views (operands are view indices).
#[derive(Clone, Copy)]
enum Cand {
    Matmul(usize, usize),
    Binary(BinaryOp, usize, usize),
    Unary(UnaryOp, usize),
    Reduction(usize, usize),
    RmsNorm(usize),
    Accum(usize, AccumKind),
}

fn moves(
    run: &Run,
    vocab: &Vocab,
    goal: Option<&Goal>,
    st: &BState,
    cache: &mut ViewCache,
) -> Vec<BMove> {
    let vs = views(run, vocab, goal, st, cache);
    let in_goal = |abs: AbsVal| goal.is_none_or(|g| abs.known().is_some_and(|i| g.contains(&i)));
    let mut cands: Vec<Cand> = vec![];
    for a in 0..vs.len() {
        for b in 0..vs.len() {
            cands.push(Cand::Matmul(a, b));
            for &op in &vocab.binary {
                let commutative = matches!(op, BinaryOp::Add | BinaryOp::Mul);
                if !commutative || a <= b {
                    cands.push(Cand::Binary(op, a, b));
                }
            }
        }
        let va = &vs[a];
        if va.after && va.steps == 0 {
            for &op in &vocab.unary {
                cands.push(Cand::Unary(op, a));
            }
            if vocab.rms_eps.is_some() {
                cands.push(Cand::RmsNorm(a));
            }
        }
        if vocab.reduction {
            let r = va.dims.len();
            for &fe in &vocab.reduction_dims_from_end {
                if fe <= r && va.dims[r - fe] > 1 {
                    cands.push(Cand::Reduction(a, r - fe));
                }
            }
        }
        if st.n_accum < run.cfg.max_accums && !va.after {
            if va.summable {
                cands.push(Cand::Accum(a, AccumKind::Iter));
            }
            cands.push(Cand::Accum(a, AccumKind::Sum));
            if let Some(eps) = vocab.rms_eps {
                cands.push(Cand::Accum(a, AccumKind::Rms { eps }));
            }
        }
    }
    let last = st.applied.last().map(|a| (a.key, a.main));
    let left = run.cfg.max_block_ops.saturating_sub(st.charged);
    let mut out = vec![];
    let mut lb = LookupBuilder {
        target: &run.target,
    };
    for c in cands {
        let (arr, nops) = match c {
            Cand::Matmul(a, b) | Cand::Binary(_, a, b) => ([a, b], 2),
            Cand::Unary(_, a) | Cand::Reduction(a, _) | Cand::RmsNorm(a) | Cand::Accum(a, _) => {
                ([a, a], 1)
            }
        };
        let operands = &arr[..nops];
        // Cheap shape checks first (the shape functions format their error messages).
        match c {
            Cand::Matmul(a, b) if !matmul_fits(&vs[a].dims, &vs[b].dims) => continue,
            Cand::Binary(_, a, b) if !broadcast_fits(&vs[a].dims, &vs[b].dims) => continue,
            _ => {}
        }

        let (code, param) = match c {
            Cand::Matmul(..) => (1, 0),
            Cand::Unary(op, _) => (2, param_code(op.name(), &op.params())),
            Cand::Binary(op, ..) => (3, op as u64),
            Cand::Reduction(_, d) => (4, d as u64),
            Cand::RmsNorm(_) => (5, 0),
            Cand::Accum(_, k) => (6, param_code(k.name().unwrap_or("iter"), &[])),
        };
        let ba = vs[operands[0]].base;
        let bb = operands.get(1).map_or(0, |&o| vs[o].base);
        let steps = operands
            .iter()
            .fold(0u64, |h, &o| h.rotate_left(29) ^ vs[o].code);
        let key: Key = (ba.max(bb), code, ba, bb, param ^ steps);
        if let Some((lk, lt)) = last {
            if !operands.iter().any(|&o| vs[o].base == lt) && key <= lk {
                continue;
            }
        }
        // Phase: accumulators end the loop; other ops must not mix body and after-loop tiles
        // (inputs without steps go either way).
        let is_body = |v: &View| !(v.after || v.steps == 0 && st.is_input(v.base));
        let after = match c {
            Cand::Accum(..) => true,
            _ => {
                let aft = operands.iter().any(|&o| vs[o].after);
                let body = operands.iter().any(|&o| is_body(&vs[o]));
                if aft && body {
                    continue;
                }
                aft
            }
        };
        let v = |i: usize| &vs[i];
        // the abstract value first: it prunes most candidates, before any dims are built
        let abs = match c {
            Cand::Matmul(a, b) => lift_matmul(&mut lb, v(a).abs, v(b).abs),
            Cand::Binary(op, a, b) => lift_binary(&mut lb, op, v(a).abs, v(b).abs),
            Cand::Unary(op, x) => lift_unary(&mut lb, op, v(x).abs),
            Cand::Reduction(x, _) => lb.target.lookup(super::expr::AbsNode::Sum(v(x).abs)),
            Cand::RmsNorm(x) => lift_rms_norm(&mut lb, v(x).abs, None),
            Cand::Accum(x, kind) => lift_accum(&mut lb, kind, v(x).abs),
        };
        if abs.known().is_none() && run.cfg.prune || !in_goal(abs) {
            run.count_pruned();
            continue;
        }
        let dims = match c {
            Cand::Matmul(a, b) => match matmul_dims("", &v(a).dims, &v(b).dims) {
                Ok(d) => d,
                Err(_) => continue,
            },
            Cand::Binary(_, a, b) => match broadcast_dims("", &v(a).dims, &v(b).dims) {
                Ok(d) => d,
                Err(_) => continue,
            },
            Cand::Unary(_, x) | Cand::RmsNorm(x) => v(x).dims.clone(),
            Cand::Reduction(x, d) => keepdim_dims(&v(x).dims, d),
            Cand::Accum(x, kind) => {
                let mut d = v(x).dims.clone();
                if !matches!(kind, AccumKind::Iter) {
                    let r = d.len() - 1;
                    d[r] = 1;
                }
                d
            }
        };
        if st
            .tiles
            .iter()
            .any(|x| x.abs == abs && x.dims == dims && x.after == after)
        {
            continue;
        }
        // a view keeps its base's dims, so it has the base's labels
        let lab = |i: usize| st.tiles[vs[i].base].labels.as_slice();
        let labels = match c {
            Cand::Matmul(a, b) => dims::matmul_labels(lab(a), lab(b)),
            Cand::Binary(_, a, b) => dims::join(lab(a), lab(b)),
            Cand::Unary(_, x) | Cand::RmsNorm(x) | Cand::Accum(x, AccumKind::Iter) => {
                Some(lab(x).to_vec())
            }
            Cand::Reduction(x, d) => Some(dims::reduced(lab(x), d)),
            Cand::Accum(x, _) => Some(dims::reduced(lab(x), lab(x).len().saturating_sub(1))),
        };
        let Some(labels) = labels else {
            run.count_mixed();
            continue;
        };
        let summable = match c {
            Cand::Matmul(..) | Cand::Reduction(..) => true,
            Cand::Unary(u, x) => v(x).summable && matches!(u, UnaryOp::Neg | UnaryOp::MulScalar(_)),
            Cand::Binary(BinaryOp::Add | BinaryOp::Sub, a, b) => v(a).summable && v(b).summable,
            Cand::Binary(BinaryOp::Mul, a, b) => v(a).summable || v(b).summable,
            Cand::Binary(BinaryOp::Div, a, _) => v(a).summable,
            _ => false,
        } && !after;
        let mut flags = vec![];
        for &o in operands {
            flags.push(view_partial(st, &vs[o]));
        }
        let Some(flags) = flags.into_iter().collect::<Option<Vec<Vec<bool>>>>() else {
            run.count_pruned();
            continue;
        };
        let p = |k: usize| {
            flags[k]
                .last()
                .copied()
                .unwrap_or(st.tiles[vs[operands[k]].base].partial)
        };
        let partial = match c {
            Cand::Matmul(..) => partial_step(Step::Binary(BinaryOp::Mul), p(0), p(1)),
            Cand::Binary(op, ..) => partial_step(Step::Binary(op), p(0), p(1)),
            Cand::Unary(u, _) => partial_step(unary_step(u), p(0), false),
            Cand::Reduction(..) => partial_step(Step::Reduce, p(0), false),
            Cand::RmsNorm(_) | Cand::Accum(_, AccumKind::Rms { .. }) => {
                partial_step(Step::Norm, p(0), false)
            }
            Cand::Accum(..) => Some(false),
        };
        let Some(partial) = partial else {
            run.count_pruned();
            continue;
        };
        let mut pre = vec![];
        let mut charge = 1;
        let mut ids: Vec<usize> = vec![];
        for (k, &o) in operands.iter().enumerate() {
            let (id, c) = resolve(st, &mut pre, &vs[o], &flags[k]);
            ids.push(id);
            charge += c;
        }
        if charge > left {
            continue;
        }
        if pre
            .iter()
            .any(|(_, t)| t.abs == abs && t.dims == dims && t.after == after)
        {
            continue;
        }
        let op = match c {
            Cand::Matmul(..) => BOp::Matmul(ids[0], ids[1]),
            Cand::Binary(op, ..) => BOp::Binary(op, ids[0], ids[1]),
            Cand::Unary(op, _) => BOp::Unary(op, ids[0]),
            Cand::Reduction(_, d) => BOp::Reduction(ids[0], d),
            Cand::RmsNorm(_) => BOp::RmsNorm(ids[0]),
            Cand::Accum(_, k) => BOp::Accum(ids[0], k),
        };
        out.push(BMove {
            pre,
            op,
            tile: BTile {
                abs,
                dims,
                after,
                summable,
                labels,
                partial,
            },
            key,
            charge,
        });
    }
    out
}
