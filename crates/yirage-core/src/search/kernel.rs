//! Kernel-level enumeration: DFS over kernel graphs built from the target's inputs.
//!
//! Moves: a library op (matmul, the target's unary/binary ops, reduction, rms_norm,
//! softmax) over existing tensors, or a customized op over a subset of them — one move
//! per (abstract block program, output-dims group) found by the block level. Every new
//! tensor must be known to the target's e-graph (pruning), new (no tensor with the same
//! expression and dims exists) and appended in canonical order (same rule as the block
//! level). Tensors holding partial chunks (split-K/KV outputs) can only feed customized
//! ops. A state is complete when every target output has a tensor of the same e-class and
//! dims; it is then recorded (if all its ops are live) and not extended.

use super::block::{enumerate, BlockProgram, KIn};
use super::concrete::{concretise, Group};
use super::dims::{self, Labels};
use super::expr::{AbsVal, LookupBuilder};
use super::lift::{lift_binary, lift_matmul, lift_rms_norm, lift_unary};
use super::{Run, Vocab};
use crate::dtype::DType;
use crate::ops::{BinaryOp, UnaryOp};
use crate::shape::{broadcast_dims, broadcast_fits, keepdim_dims, matmul_dims, matmul_fits, Dims};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A kernel-level tensor of a search state.
#[derive(Debug, Clone, PartialEq)]
pub struct KTensor {
    pub dims: Dims,
    pub value_dims: Dims,
    pub dtype: DType,
    pub abs: AbsVal,
    pub chunks: Option<(usize, usize)>,
    /// Bytes per element of its buffer (dtype for graph inputs, fp32 for intermediates).
    pub elem_bytes: usize,
    /// The target class of each dim ([`Labels`]).
    pub labels: Labels,
}

/// A library op over state tensors.
#[derive(Debug, Clone, PartialEq)]
pub enum LibOp {
    Matmul(usize, usize),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Reduction(usize, usize),
    RmsNorm {
        x: usize,
        ns: Dims,
        w: Option<usize>,
        eps: f64,
    },
    Softmax(usize, usize),
}

impl LibOp {
    fn operands(&self) -> Vec<usize> {
        match self {
            LibOp::Matmul(a, b) | LibOp::Binary(_, a, b) => vec![*a, *b],
            LibOp::Unary(_, x) | LibOp::Reduction(x, _) | LibOp::Softmax(x, _) => vec![*x],
            LibOp::RmsNorm { x, w, .. } => {
                let mut v = vec![*x];
                v.extend(w);
                v
            }
        }
    }

    /// Short name for labels.
    pub fn name(&self) -> String {
        match self {
            LibOp::Matmul(..) => "matmul".into(),
            LibOp::Unary(op, _) => op.name().into(),
            LibOp::Binary(op, ..) => op.name().into(),
            LibOp::Reduction(..) => "reduction".into(),
            LibOp::RmsNorm { .. } => "rms_norm".into(),
            LibOp::Softmax(..) => "softmax".into(),
        }
    }
}

/// A kernel-level op of a state.
#[derive(Debug, Clone)]
pub enum KOp {
    Lib(LibOp),
    Custom {
        inputs: Vec<usize>,
        prog: Arc<BlockProgram>,
        group: Arc<Group>,
    },
}

impl KOp {
    fn operands(&self) -> Vec<usize> {
        match self {
            KOp::Lib(l) => l.operands(),
            KOp::Custom { inputs, .. } => inputs.clone(),
        }
    }
}

/// A complete kernel-level program (customized ops still hold their alternatives).
#[derive(Debug, Clone)]
pub struct Skeleton {
    pub tensors: Vec<KTensor>,
    pub ops: Vec<(KOp, Vec<usize>)>,
    pub outputs: Vec<usize>,
}

/// Groups with partial-sum outputs kept per abstract program (see `keep_groups`).
pub const MAX_GROUPS: usize = 4;

type MemoKey = (
    Vec<(AbsVal, Dims, Option<(usize, usize)>, DType, usize, Labels)>,
    bool,
);
type Programs = Arc<Vec<(Arc<BlockProgram>, Vec<Arc<Group>>)>>;

/// Shared per-search memo of block-level results, keyed by the inputs' signature.
#[derive(Default)]
pub struct Memo {
    map: Mutex<HashMap<MemoKey, Programs>>,
}

impl Memo {
    /// Number of distinct abstract programs found so far.
    pub fn programs(&self) -> usize {
        self.map
            .lock()
            .map(|m| m.values().map(|v| v.len()).sum())
            .unwrap_or(0)
    }
}

fn programs_for(
    run: &Run,
    vocab: &Vocab,
    memo: &Memo,
    ins: &[KIn],
    last: bool,
    goal: Option<&super::block::Goal>,
) -> Programs {
    let key: MemoKey = (
        ins.iter()
            .map(|k| {
                (
                    k.abs,
                    k.dims.clone(),
                    k.chunks,
                    k.dtype,
                    k.elem_bytes,
                    k.labels.clone(),
                )
            })
            .collect(),
        last,
    );
    if let Ok(m) = memo.map.lock() {
        if let Some(v) = m.get(&key) {
            return v.clone();
        }
    }
    // Computed without holding the lock (a duplicate computation by a racing thread is
    // harmless; blocking here could deadlock rayon's work stealing).
    let progs = enumerate(run, vocab, ins, last, goal);
    let eps = vocab.rms_eps.unwrap_or(super::DEFAULT_RMS_EPS);
    let v: Vec<(Arc<BlockProgram>, Vec<Arc<Group>>)> = progs
        .into_par_iter()
        .map(|p| {
            let groups = concretise(run, &p, ins, eps);
            (
                Arc::new(p),
                groups.into_iter().map(Arc::new).collect::<Vec<_>>(),
            )
        })
        .map(|(p, g)| (p, keep_groups(g, last)))
        .filter(|(_, g)| !g.is_empty())
        .collect();
    let v = Arc::new(v);
    if let Ok(mut m) = memo.map.lock() {
        m.entry(key).or_insert_with(|| v.clone());
    }
    v
}

/// The groups of one abstract program worth offering to the kernel level: every group whose
/// outputs are complete tensors, and the cheapest of those with partial sums (one group per
/// split count: a handful is enough to choose from). Partial sums need a later op to add
/// them up, so they are dropped for the kernel graph's last op, and they never crowd out a
/// complete group: their block-level cost leaves out that later op (LoRA at b16 lost its
/// fully fused kernel, 9.8 µs on the H100, to four split-K groups that way).
fn keep_groups(mut groups: Vec<Arc<Group>>, last: bool) -> Vec<Arc<Group>> {
    groups.sort_by(|a, b| a.concretes[0].cost_us.total_cmp(&b.concretes[0].cost_us));
    let (complete, partial): (Vec<_>, Vec<_>) = groups
        .into_iter()
        .partition(|g| g.outs.iter().all(|(_, chunks)| chunks.is_none()));
    let room = if last {
        0
    } else {
        MAX_GROUPS.saturating_sub(complete.len())
    };
    complete
        .into_iter()
        .chain(partial.into_iter().take(room))
        .collect()
}

#[derive(Clone)]
struct KState {
    tensors: Vec<KTensor>,
    ops: Vec<(KOp, Vec<usize>)>,
    keys: Vec<MoveKey>,
    n_inputs: usize,
    n_custom: usize,
}

type MoveKey = (usize, u8, Vec<usize>, u64);

struct Move {
    op: KOp,
    outs: Vec<KTensor>,
    key: MoveKey,
}

/// Run the kernel-level DFS from the target's inputs.
pub fn search_kernels(
    run: &Run,
    vocab: &Vocab,
    memo: &Memo,
    inputs: Vec<KTensor>,
) -> Vec<Skeleton> {
    search_kernels_where(run, vocab, memo, inputs, |_| true)
        .1
        .into_iter()
        .map(|(_, sk)| sk)
        .collect()
}

/// The kernel-level DFS below the first-level moves that `keep` accepts (by index): the
/// number of first-level moves of the first depth, and the skeletons found, each with the
/// index of the move it starts with, in move order. A shard of the search keeps every n-th
/// move; the union of the shards' skeletons, ordered by move, is the whole search's list.
///
/// The DFS deepens: graphs of at most 1, then 2, … `max_kernel_ops` ops, each depth a DFS of
/// its own (move `i` of depth `d` is numbered `d << 32 | i`, so moves order by depth). A limit
/// that cuts the search short so keeps every graph of the depths it finished, where one DFS
/// at full depth had only explored the moves it reached first (QK-norm attention's one-kernel
/// form, found at depth 1 in under a second, was still missing after 40 s); and a last op is
/// chosen among the target's outputs at every depth, so fused forms are offered as such.
pub fn search_kernels_where(
    run: &Run,
    vocab: &Vocab,
    memo: &Memo,
    inputs: Vec<KTensor>,
    keep: impl Fn(usize) -> bool + Sync,
) -> (usize, Vec<(usize, Skeleton)>) {
    let st = KState {
        n_inputs: inputs.len(),
        tensors: inputs,
        ops: vec![],
        keys: vec![],
        n_custom: 0,
    };
    if run.count_state() {
        return (0, vec![]);
    }
    let mut first_moves = None;
    let mut found = vec![];
    for depth in 1..=run.cfg.max_kernel_ops {
        if run.stopped() {
            break;
        }
        let first = moves(run, vocab, memo, &st, depth);
        first_moves.get_or_insert(first.len());
        let mut f = first
            .into_iter()
            .enumerate()
            .map(|(i, mv)| (depth << 32 | i, mv))
            .filter(|(i, _)| keep(*i))
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|(i, mv)| {
                let mut out = vec![];
                let mut st = st.clone();
                apply(&mut st, mv);
                dfs(run, vocab, memo, &mut st, depth, &mut out);
                out.into_iter().map(|sk| (i, sk)).collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flatten()
            .collect();
        found.append(&mut f);
    }
    (first_moves.unwrap_or(0), found)
}

fn apply(st: &mut KState, mv: Move) {
    let first = st.tensors.len();
    let ids: Vec<usize> = (first..first + mv.outs.len()).collect();
    if matches!(mv.op, KOp::Custom { .. }) {
        st.n_custom += 1;
    }
    st.tensors.extend(mv.outs);
    st.ops.push((mv.op, ids));
    st.keys.push(mv.key);
}

fn undo(st: &mut KState) {
    if let Some((op, ids)) = st.ops.pop() {
        if matches!(op, KOp::Custom { .. }) {
            st.n_custom -= 1;
        }
        st.tensors.truncate(st.tensors.len() - ids.len());
        st.keys.pop();
    }
}

fn dfs(
    run: &Run,
    vocab: &Vocab,
    memo: &Memo,
    st: &mut KState,
    depth: usize,
    out: &mut Vec<Skeleton>,
) {
    if run.count_state() {
        return;
    }
    if let Some(sk) = complete(run, st) {
        run.count_candidate();
        out.push(sk);
        return;
    }
    if st.ops.len() >= depth {
        return;
    }
    for mv in moves(run, vocab, memo, st, depth) {
        apply(st, mv);
        dfs(run, vocab, memo, st, depth, out);
        undo(st);
        if run.stopped() {
            return;
        }
    }
}

/// A complete state (every produced tensor used) as a skeleton.
fn complete(run: &Run, st: &KState) -> Option<Skeleton> {
    let n_out = run.target.outputs.len();
    let mut outputs = vec![];
    for k in 0..n_out {
        let dims = &run.target_output_dims[k];
        let t = (st.n_inputs..st.tensors.len()).find(|&t| {
            let x = &st.tensors[t];
            x.chunks.is_none()
                && &x.dims == dims
                && run.target.is_output(x.abs, k)
                && !outputs.contains(&t)
        })?;
        outputs.push(t);
    }
    // Every tensor an op produces must be used (by a later op or as an output): this rules
    // out dead ops and customized ops computing outputs nobody reads.
    let mut used = vec![false; st.tensors.len()];
    for &o in &outputs {
        used[o] = true;
    }
    for (op, _) in &st.ops {
        for a in op.operands() {
            used[a] = true;
        }
    }
    if st.ops.iter().any(|(_, ids)| ids.iter().any(|&i| !used[i])) {
        return None;
    }
    Some(Skeleton {
        tensors: st.tensors.clone(),
        ops: st.ops.clone(),
        outputs,
    })
}

/// The labels of a library op's output over `ts`; None when it links dims of different
/// classes (see [`Labels`]).
fn lib_labels(op: &LibOp, ts: &[KTensor]) -> Option<Labels> {
    let l = |i: usize| ts[i].labels.as_slice();
    match op {
        LibOp::Matmul(a, b) => dims::matmul_labels(l(*a), l(*b)),
        LibOp::Binary(_, a, b) => dims::join(l(*a), l(*b)),
        LibOp::Unary(_, x) | LibOp::Softmax(x, _) | LibOp::RmsNorm { x, w: None, .. } => {
            Some(l(*x).to_vec())
        }
        LibOp::RmsNorm { x, w: Some(w), .. } => dims::with_trailing(l(*x), l(*w)),
        LibOp::Reduction(x, d) => Some(dims::reduced(l(*x), *d)),
    }
}

fn lib_key(op: &LibOp) -> MoveKey {
    let ops = op.operands();
    let (code, param) = match op {
        LibOp::Matmul(..) => (1, 0),
        LibOp::Unary(u, _) => (2, hash_str(&format!("{}{:?}", u.name(), u.params()))),
        LibOp::Binary(b, ..) => (3, *b as u64),
        LibOp::Reduction(_, d) => (4, *d as u64),
        LibOp::RmsNorm { .. } => (5, 0),
        LibOp::Softmax(_, d) => (6, *d as u64),
    };
    (ops.iter().copied().max().unwrap_or(0), code, ops, param)
}

fn hash_str(s: &str) -> u64 {
    s.bytes().fold(1469598103934665603u64, |h, b| {
        (h ^ b as u64).wrapping_mul(1099511628211)
    })
}

/// Non-empty subsets of `0..n` with at most `max` elements, in lexicographic order
/// (generated directly: iterating all 2^n masks would not scale with many tensors).
fn subsets(n: usize, max: usize) -> Vec<Vec<usize>> {
    fn rec(start: usize, n: usize, max: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        for i in start..n {
            cur.push(i);
            out.push(cur.clone());
            if cur.len() < max {
                rec(i + 1, n, max, cur, out);
            }
            cur.pop();
        }
    }
    let mut out = vec![];
    if max > 0 {
        rec(0, n, max, &mut vec![], &mut out);
    }
    out
}

fn moves(run: &Run, vocab: &Vocab, memo: &Memo, st: &KState, depth: usize) -> Vec<Move> {
    let n = st.tensors.len();
    let t = |i: usize| &st.tensors[i];
    let plain = |i: usize| st.tensors[i].chunks.is_none();
    // The last op of the budget must make the state complete: it must read every produced
    // tensor nothing reads yet (unless that tensor is a target output itself) and its own
    // outputs must be target outputs.
    let last_op = st.ops.len() + 1 >= depth;
    let is_target_output =
        |abs: AbsVal| (0..run.target.outputs.len()).any(|k| run.target.is_output(abs, k));
    let mut read = vec![false; n];
    for (op, _) in &st.ops {
        for a in op.operands() {
            read[a] = true;
        }
    }
    let required: Vec<usize> = (st.n_inputs..n)
        .filter(|&i| {
            let output = t(i).chunks.is_none()
                && is_target_output(t(i).abs)
                && run.target_output_dims.contains(&t(i).dims);
            !(read[i] || output)
        })
        .collect();
    let covers = |ops: &[usize]| !last_op || required.iter().all(|r| ops.contains(r));
    let mut lb = LookupBuilder {
        target: &run.target,
    };
    let mut cands: Vec<(LibOp, AbsVal, Dims)> = vec![];
    for a in (0..n).filter(|&a| plain(a)) {
        for b in (0..n).filter(|&b| plain(b)) {
            // the fit checks first: the shape functions format their error messages
            let fits = matmul_fits(&t(a).dims, &t(b).dims);
            if let Some(d) = fits
                .then(|| matmul_dims("", &t(a).dims, &t(b).dims).ok())
                .flatten()
            {
                cands.push((
                    LibOp::Matmul(a, b),
                    lift_matmul(&mut lb, t(a).abs, t(b).abs),
                    d,
                ));
            }
            for &op in &vocab.binary {
                if matches!(op, BinaryOp::Add | BinaryOp::Mul) && a > b {
                    continue;
                }
                if !broadcast_fits(&t(a).dims, &t(b).dims) {
                    continue;
                }
                if let Ok(d) = broadcast_dims("", &t(a).dims, &t(b).dims) {
                    cands.push((
                        LibOp::Binary(op, a, b),
                        lift_binary(&mut lb, op, t(a).abs, t(b).abs),
                        d,
                    ));
                }
            }
        }
        for &op in &vocab.unary {
            cands.push((
                LibOp::Unary(op, a),
                lift_unary(&mut lb, op, t(a).abs),
                t(a).dims.clone(),
            ));
        }
        if vocab.reduction {
            let r = t(a).dims.len();
            let dims_ok: Vec<usize> = vocab
                .reduction_dims_from_end
                .iter()
                .filter(|&&fe| fe <= r)
                .map(|&fe| r - fe)
                .collect();
            for d in dims_ok.into_iter().filter(|&d| t(a).dims[d] > 1) {
                let abs = lb.target.lookup(super::expr::AbsNode::Sum(t(a).abs));
                cands.push((LibOp::Reduction(a, d), abs, keepdim_dims(&t(a).dims, d)));
            }
        }
        for (ns, has_w, eps) in &vocab.rms_norms {
            let dims = &t(a).dims;
            if ns.len() > dims.len() || dims[dims.len() - ns.len()..] != ns[..] {
                continue;
            }
            let ws: Vec<Option<usize>> = if *has_w {
                (0..n)
                    .filter(|&w| plain(w) && &t(w).dims == ns)
                    .map(Some)
                    .collect()
            } else {
                vec![None]
            };
            for w in ws {
                let abs = lift_rms_norm(&mut lb, t(a).abs, w.map(|w| t(w).abs));
                let op = LibOp::RmsNorm {
                    x: a,
                    ns: ns.clone(),
                    w,
                    eps: *eps,
                };
                cands.push((op, abs, dims.clone()));
            }
        }
        for &d in &vocab.softmax_dims {
            if d < t(a).dims.len() {
                let e = lb.target.lookup(super::expr::AbsNode::Exp(t(a).abs));
                let s = lb.target.lookup(super::expr::AbsNode::Sum(e));
                let abs = lb.target.lookup(super::expr::AbsNode::Div(e, s));
                cands.push((LibOp::Softmax(a, d), abs, t(a).dims.clone()));
            }
        }
    }
    let last = st
        .ops
        .last()
        .map(|(_, ids)| ids.clone())
        .unwrap_or_default();
    let last_key = st.keys.last();
    let canonical = |ops: &[usize], key: &MoveKey| match last_key {
        None => true,
        Some(lk) => ops.iter().any(|o| last.contains(o)) || key > lk,
    };
    let exists = |abs: AbsVal, dims: &Dims, chunks: Option<(usize, usize)>| {
        st.tensors
            .iter()
            .any(|x| x.abs == abs && &x.dims == dims && x.chunks == chunks)
    };
    let dtype = st.tensors.first().map_or(DType::F32, |x| x.dtype);
    let mut out = vec![];
    for (op, abs, dims) in cands {
        let key = lib_key(&op);
        if !canonical(&op.operands(), &key) {
            continue;
        }
        if last_op && (!covers(&op.operands()) || !is_target_output(abs)) {
            continue;
        }
        if run.cfg.prune && abs.known().is_none() {
            run.count_pruned();
            continue;
        }
        if exists(abs, &dims, None) {
            continue;
        }
        let Some(labels) = lib_labels(&op, &st.tensors) else {
            run.count_mixed();
            continue;
        };
        let outs = vec![KTensor {
            value_dims: dims.clone(),
            dims,
            dtype,
            abs,
            chunks: None,
            elem_bytes: crate::plan::INTERMEDIATE_BYTES,
            labels,
        }];
        out.push(Move {
            op: KOp::Lib(op),
            outs,
            key,
        });
    }
    if st.n_custom < run.cfg.max_custom_ops {
        for set in subsets(n, run.cfg.max_custom_inputs) {
            // A tensor unknown to the e-graph (e.g. an input the outputs do not use) can
            // never feed a useful tile.
            if run.cfg.prune && set.iter().any(|&i| t(i).abs.known().is_none()) {
                continue;
            }
            if !covers(&set) {
                continue;
            }
            // The last op: only subsets a target output can be computed from, using each.
            let goal = if last_op && run.cfg.prune {
                let avail: Vec<AbsVal> = set.iter().map(|&i| t(i).abs).collect();
                let Some(g) = run.target.goal_classes(&avail) else {
                    continue;
                };
                if !avail
                    .iter()
                    .all(|a| a.known().is_some_and(|i| g.contains(&i)))
                {
                    continue;
                }
                Some(g)
            } else {
                None
            };
            let key0: MoveKey = (set.iter().copied().max().unwrap_or(0), 10, set.clone(), 0);
            // Canonical check on the op class first (parameters only break ties).
            if let Some(lk) = last_key {
                if !set.iter().any(|o| last.contains(o))
                    && (key0.0, key0.1, &key0.2) < (lk.0, lk.1, &lk.2)
                {
                    continue;
                }
            }
            if run.stopped() {
                break;
            }
            let ins: Vec<KIn> = set
                .iter()
                .map(|&i| KIn {
                    abs: t(i).abs,
                    dims: t(i).dims.clone(),
                    value_dims: t(i).value_dims.clone(),
                    chunks: t(i).chunks,
                    dtype: t(i).dtype,
                    elem_bytes: t(i).elem_bytes,
                    labels: t(i).labels.clone(),
                })
                .collect();
            let progs = programs_for(run, vocab, memo, &ins, last_op, goal.as_ref());
            for (pi, (prog, groups)) in progs.iter().enumerate() {
                for (gi, group) in groups.iter().enumerate() {
                    let key: MoveKey = (key0.0, 10, set.clone(), ((pi as u64) << 16) | gi as u64);
                    if !canonical(&set, &key) {
                        continue;
                    }
                    let mut outs = vec![];
                    let mut fresh = true;
                    for (k, &o) in prog.outputs.iter().enumerate() {
                        let (dims, chunks) = group.outs[k].clone();
                        let abs = prog.tiles[o].abs;
                        if exists(abs, &dims, chunks)
                            || outs
                                .iter()
                                .any(|x: &KTensor| x.abs == abs && x.dims == dims)
                        {
                            fresh = false;
                            break;
                        }
                        // a dim holding partial chunks indexes chunks and rows together
                        let mut labels = prog.tiles[o].labels.clone();
                        if let Some((j, _)) = chunks {
                            labels = dims::reduced(&labels, j);
                        }
                        outs.push(KTensor {
                            value_dims: prog.tiles[o].dims.clone(),
                            dims,
                            dtype,
                            abs,
                            chunks,
                            elem_bytes: crate::plan::INTERMEDIATE_BYTES,
                            labels,
                        });
                    }
                    if !fresh {
                        continue;
                    }
                    out.push(Move {
                        op: KOp::Custom {
                            inputs: set.clone(),
                            prog: prog.clone(),
                            group: group.clone(),
                        },
                        outs,
                        key,
                    });
                }
            }
        }
    }
    out
}
