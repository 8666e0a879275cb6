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
//! Canonical ordering: ops are appended in an order where each op either consumes the
//! previous op's tile or has a larger key (max operand, kind, operands, parameter) than
//! the previous op; every DAG has such an order (take ready ops by smallest key), so the
//! enumeration is complete while most permutations are skipped. Identical tiles (same
//! expression, dims and phase) are never built twice.

use super::expr::{AbsVal, LookupBuilder};
use super::lift::{lift_accum, lift_binary, lift_matmul, lift_rms_norm, lift_unary};
use super::{Run, Vocab};
use crate::dtype::DType;
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use crate::shape::{broadcast_dims, keepdim_dims, matmul_dims, Dims};
use rayon::prelude::*;

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

    fn key(&self) -> (usize, u8, usize, usize, u64) {
        let ops = self.operands();
        let a = ops.first().copied().unwrap_or(0);
        let b = ops.get(1).copied().unwrap_or(0);
        let (code, param) = match self {
            BOp::Input(k) => (0, *k as u64),
            BOp::Matmul(..) => (1, 0),
            BOp::Unary(op, _) => (2, param_code(op.name(), &op.params())),
            BOp::Binary(op, ..) => (3, *op as u64),
            BOp::Reduction(_, d) => (4, *d as u64),
            BOp::RmsNorm(_) => (5, 0),
            BOp::Accum(_, k) => (6, param_code(k.name().unwrap_or("iter"), &[])),
        };
        (a.max(b), code, a, b, param)
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

#[derive(Clone)]
struct BState {
    ops: Vec<BOp>,
    tiles: Vec<BTile>,
    uses: Vec<u32>,
    n_inputs: usize,
    n_accum: usize,
}

impl BState {
    fn n_ops(&self) -> usize {
        self.ops.len() - self.n_inputs
    }
    fn is_input(&self, t: usize) -> bool {
        t < self.n_inputs
    }
}

/// Enumerate the abstract block programs over `ins` (at most `cfg.max_block_ops` ops).
pub fn enumerate(run: &Run, vocab: &Vocab, ins: &[KIn]) -> Vec<BlockProgram> {
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
            })
            .collect(),
        uses: vec![0; n],
        n_inputs: n,
        n_accum: 0,
    };
    let first = moves(run, vocab, &st);
    first
        .into_par_iter()
        .map(|(op, tile)| {
            let mut out = vec![];
            let mut st = st.clone();
            apply(&mut st, op, tile);
            dfs(run, vocab, &mut st, &mut out);
            out
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flatten()
        .collect()
}

fn apply(st: &mut BState, op: BOp, tile: BTile) {
    for a in op.operands() {
        st.uses[a] += 1;
    }
    if matches!(op, BOp::Accum(..)) {
        st.n_accum += 1;
    }
    st.ops.push(op);
    st.tiles.push(tile);
    st.uses.push(0);
}

fn undo(st: &mut BState) {
    if let Some(op) = st.ops.pop() {
        for a in op.operands() {
            st.uses[a] -= 1;
        }
        if matches!(op, BOp::Accum(..)) {
            st.n_accum -= 1;
        }
        st.tiles.pop();
        st.uses.pop();
    }
}

fn dfs(run: &Run, vocab: &Vocab, st: &mut BState, out: &mut Vec<BlockProgram>) {
    if run.count_state() {
        return;
    }
    if let Some(p) = complete(st) {
        out.push(p);
    }
    if st.n_ops() >= run.cfg.max_block_ops {
        return;
    }
    for (op, tile) in moves(run, vocab, st) {
        apply(st, op, tile);
        if feasible(run, st) {
            dfs(run, vocab, st, out);
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
    let left = run.cfg.max_block_ops.saturating_sub(st.n_ops());
    // Each op consumes at most two open tiles; an accumulator is needed if none exists.
    let need = (open_inputs + open_loop)
        .div_ceil(2)
        .max(usize::from(st.n_accum == 0));
    need <= left
}

fn complete(st: &BState) -> Option<BlockProgram> {
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

/// Phase of an op over `operands`: `None` if it mixes loop-body tiles with after-loop
/// tiles (inputs may go either way).
fn phase_of(st: &BState, operands: &[usize]) -> Option<bool> {
    let after = operands.iter().any(|&a| st.tiles[a].after);
    let body = operands
        .iter()
        .any(|&a| !st.tiles[a].after && !st.is_input(a));
    if after && body {
        None
    } else {
        Some(after)
    }
}

fn moves(run: &Run, vocab: &Vocab, st: &BState) -> Vec<(BOp, BTile)> {
    let n = st.tiles.len();
    let last = st.ops.last().filter(|_| st.n_ops() > 0).cloned();
    let last_tile = n - 1;
    let mut cands: Vec<BOp> = vec![];
    for a in 0..n {
        for b in 0..n {
            cands.push(BOp::Matmul(a, b));
            for &op in &vocab.binary {
                let commutative = matches!(op, BinaryOp::Add | BinaryOp::Mul);
                if !commutative || a <= b {
                    cands.push(BOp::Binary(op, a, b));
                }
            }
        }
        for &op in &vocab.unary {
            cands.push(BOp::Unary(op, a));
        }
        if vocab.reduction {
            let r = st.tiles[a].dims.len();
            for &fe in &vocab.reduction_dims_from_end {
                if fe <= r && st.tiles[a].dims[r - fe] > 1 {
                    cands.push(BOp::Reduction(a, r - fe));
                }
            }
        }
        if vocab.rms_eps.is_some() {
            cands.push(BOp::RmsNorm(a));
        }
        if st.n_accum < run.cfg.max_accums && !st.tiles[a].after {
            if st.tiles[a].summable {
                cands.push(BOp::Accum(a, AccumKind::Iter));
            }
            cands.push(BOp::Accum(a, AccumKind::Sum));
            if let Some(eps) = vocab.rms_eps {
                cands.push(BOp::Accum(a, AccumKind::Rms { eps }));
            }
        }
    }
    let mut out = vec![];
    let mut lb = LookupBuilder {
        target: &run.target,
    };
    for op in cands {
        let operands = op.operands();
        if let Some(l) = &last {
            if !operands.contains(&last_tile) && op.key() <= l.key() {
                continue;
            }
        }
        let after = match &op {
            BOp::Accum(..) => true,
            _ => match phase_of(st, &operands) {
                Some(p) => p,
                None => continue,
            },
        };
        let t = |i: usize| &st.tiles[i];
        let (abs, dims) = match op {
            BOp::Input(_) => continue,
            BOp::Matmul(a, b) => match matmul_dims("", &t(a).dims, &t(b).dims) {
                Ok(d) => (lift_matmul(&mut lb, t(a).abs, t(b).abs), d),
                Err(_) => continue,
            },
            BOp::Binary(op, a, b) => match broadcast_dims("", &t(a).dims, &t(b).dims) {
                Ok(d) => (lift_binary(&mut lb, op, t(a).abs, t(b).abs), d),
                Err(_) => continue,
            },
            BOp::Unary(op, x) => (lift_unary(&mut lb, op, t(x).abs), t(x).dims.clone()),
            BOp::Reduction(x, d) => (
                lb.target.lookup(super::expr::AbsNode::Sum(t(x).abs)),
                keepdim_dims(&t(x).dims, d),
            ),
            BOp::RmsNorm(x) => (lift_rms_norm(&mut lb, t(x).abs, None), t(x).dims.clone()),
            BOp::Accum(x, kind) => {
                let mut d = t(x).dims.clone();
                if !matches!(kind, AccumKind::Iter) {
                    let r = d.len() - 1;
                    d[r] = 1;
                }
                (lift_accum(&mut lb, kind, t(x).abs), d)
            }
        };
        if abs.known().is_none() && run.cfg.prune {
            run.count_pruned();
            continue;
        }
        if st
            .tiles
            .iter()
            .any(|x| x.abs == abs && x.dims == dims && x.after == after)
        {
            continue;
        }
        let summable = match op {
            BOp::Matmul(..) | BOp::Reduction(..) => true,
            BOp::Unary(u, x) => t(x).summable && matches!(u, UnaryOp::Neg | UnaryOp::MulScalar(_)),
            BOp::Binary(BinaryOp::Add | BinaryOp::Sub, a, b) => t(a).summable && t(b).summable,
            BOp::Binary(BinaryOp::Mul, a, b) => t(a).summable || t(b).summable,
            BOp::Binary(BinaryOp::Div, a, _) => t(a).summable,
            _ => false,
        } && !after;
        out.push((
            op,
            BTile {
                abs,
                dims,
                after,
                summable,
            },
        ));
    }
    out
}
