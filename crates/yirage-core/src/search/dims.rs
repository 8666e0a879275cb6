//! Index classes: rejecting candidates that pair the wrong dims, before any fingerprint.
//!
//! Abstract expressions do not say which index a matmul contracts, so where two dims of a
//! graph have equal extents the search builds programs that contract, split or walk the
//! wrong one: in self-attention (as many keys as query rows) `Kt · Q` type-checks, and a
//! loop over the feature dim of `Q` may also walk the feature dim of `V`. Fingerprints reject
//! them, but each test is a full evaluation in the finite field: at prefill sizes these
//! programs, often predicted cheaper, used up the verification budget before the right
//! ones were reached.
//!
//! Every (tensor, dim) slot is put in a class with the slots the ops pair it with: a matmul
//! pairs its operands' contracted dims and carries rows and columns, elementwise ops pair
//! equal dims, a grid axis pairs every input dim it cuts (not the output's: a split-K
//! output stores its partial chunks along a row dim), the for-loop every dim it walks. The
//! candidate's inputs and outputs are the target's; a candidate that puts two input or
//! output dims in one class where the target keeps them apart indexes one by the other,
//! which no program equal to the target does. Dims of extent 1 are left out (broadcasts
//! pair nothing), and a graph with an op outside the modelled vocabulary is not judged.

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::ops::AccumKind;
use std::collections::HashMap;

/// Union-find over slots.
#[derive(Default)]
struct Classes {
    parent: Vec<usize>,
}

impl Classes {
    /// `n` fresh slots; returns the first.
    fn add(&mut self, n: usize) -> usize {
        let base = self.parent.len();
        self.parent.extend(base..base + n);
        base
    }
    fn find(&mut self, x: usize) -> usize {
        let mut r = x;
        while self.parent[r] != r {
            r = self.parent[r];
        }
        let mut y = x;
        while self.parent[y] != r {
            let next = self.parent[y];
            self.parent[y] = r;
            y = next;
        }
        r
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[ra.max(rb)] = ra.min(rb);
        }
    }
}

/// Slots of a list of shaped values (tensors or tiles): `base[i] + j` is dim `j` of value `i`.
struct Shaped<'a> {
    base: Vec<usize>,
    dims: Vec<&'a [usize]>,
}

impl Shaped<'_> {
    fn slot(&self, v: usize, j: usize) -> usize {
        self.base[v] + j
    }
}

/// Pair the dims an op keeps: `out`'s trailing dims with `x`'s (right-aligned), where both
/// have the same extent above 1, except `skip` (a dim of `out` counted from the right).
fn pair_aligned(c: &mut Classes, s: &Shaped<'_>, x: usize, out: usize, skip: Option<usize>) {
    let (dx, dout) = (s.dims[x], s.dims[out]);
    for k in 1..=dx.len().min(dout.len()) {
        if skip == Some(k) {
            continue;
        }
        let (jx, jo) = (dx.len() - k, dout.len() - k);
        if dx[jx] == dout[jo] && dx[jx] > 1 {
            c.union(s.slot(x, jx), s.slot(out, jo));
        }
    }
}

/// A matmul `a · b → out`: batch dims, rows, columns, and the contracted pair.
fn pair_matmul(c: &mut Classes, s: &Shaped<'_>, a: usize, b: usize, out: usize) {
    pair_aligned(c, s, a, out, Some(1));
    pair_aligned(c, s, b, out, Some(2));
    let (ra, rb) = (s.dims[a].len(), s.dims[b].len());
    if ra >= 2 && rb >= 2 && s.dims[a][ra - 1] > 1 {
        c.union(s.slot(a, ra - 1), s.slot(b, rb - 2));
    }
}

/// Pair the slots of one block graph's tiles among themselves and with the kernel tensors
/// it reads (`inputs`) and writes (`outs`); None for an op outside the vocabulary.
fn pair_block(
    c: &mut Classes,
    kernel: &Shaped<'_>,
    inputs: &[usize],
    outs: &[usize],
    bg: &BlockGraph,
) -> Option<()> {
    let tiles = bg.tiles();
    let mut base = vec![];
    for t in tiles {
        base.push(c.add(t.dims.len()));
    }
    let s = Shaped {
        base,
        dims: tiles.iter().map(|t| t.dims.as_slice()).collect(),
    };
    let grid = bg.grid_dim();
    let mut by_axis: [Vec<usize>; 3] = Default::default();
    let mut walked = vec![];
    let mut next_input = 0;
    for (i, op) in bg.ops().iter().enumerate() {
        match op {
            BlockOpKind::Input { imap, fmap, .. } => {
                let t = *inputs.get(next_input)?;
                next_input += 1;
                if kernel.dims[t].len() != s.dims[i].len() {
                    return None;
                }
                for j in 0..s.dims[i].len() {
                    if kernel.dims[t][j] > 1 {
                        c.union(s.slot(i, j), kernel.slot(t, j));
                    }
                }
                for a in 0..3 {
                    if imap[a] >= 0 && grid[a] > 1 {
                        by_axis[a].push(kernel.slot(t, imap[a] as usize));
                    }
                }
                if *fmap >= 0 && bg.forloop_range() > 1 {
                    walked.push(kernel.slot(t, *fmap as usize));
                }
            }
            BlockOpKind::Matmul { a, b } => pair_matmul(c, &s, *a, *b, i),
            BlockOpKind::Unary { x, .. } | BlockOpKind::RmsNorm { x, .. } => {
                pair_aligned(c, &s, *x, i, None)
            }
            BlockOpKind::Binary { a, b, .. } => {
                pair_aligned(c, &s, *a, i, None);
                pair_aligned(c, &s, *b, i, None);
            }
            BlockOpKind::Reduction { x, dim } | BlockOpKind::ReductionToDimx { x, dim } => {
                pair_aligned(c, &s, *x, i, Some(s.dims[i].len() - dim))
            }
            BlockOpKind::ForloopAccum { x, kind } => {
                let skip = match kind {
                    AccumKind::Iter => None,
                    AccumKind::Sum | AccumKind::Rms { .. } | AccumKind::SumToDimx => Some(1),
                };
                pair_aligned(c, &s, *x, i, skip)
            }
            BlockOpKind::Concat { .. } => return None,
        }
    }
    for (o, &t) in bg.outputs().iter().zip(outs) {
        if kernel.dims[t].len() != s.dims[o.tile].len() {
            return None;
        }
        for j in 0..kernel.dims[t].len() {
            if kernel.dims[t][j] > 1 {
                c.union(s.slot(o.tile, j), kernel.slot(t, j));
            }
        }
    }
    for slots in by_axis.iter().chain([&walked]) {
        for w in slots.windows(2) {
            c.union(w[0], w[1]);
        }
    }
    Some(())
}

/// The class of every dim (extent above 1) of `g`'s inputs and outputs, as
/// `(is_output, index, dim) → class`; None when `g` holds an op outside the vocabulary.
fn boundary_classes(g: &KernelGraph) -> Option<HashMap<(bool, usize, usize), usize>> {
    let ts = g.tensors();
    let mut c = Classes::default();
    let mut base = vec![];
    for t in ts {
        base.push(c.add(t.dims.len()));
    }
    let s = Shaped {
        base,
        dims: ts.iter().map(|t| t.dims.as_slice()).collect(),
    };
    for op in g.ops() {
        let out = op.outs.first().copied();
        match (&op.kind, out) {
            (KernelOpKind::Input { .. }, _) => {}
            (KernelOpKind::Matmul { a, b }, Some(o)) => pair_matmul(&mut c, &s, *a, *b, o),
            (
                KernelOpKind::Unary { x, .. }
                | KernelOpKind::AllReduce { x }
                | KernelOpKind::Softmax { x, .. },
                Some(o),
            ) => pair_aligned(&mut c, &s, *x, o, None),
            (KernelOpKind::Binary { a, b, .. }, Some(o)) => {
                pair_aligned(&mut c, &s, *a, o, None);
                pair_aligned(&mut c, &s, *b, o, None);
            }
            (KernelOpKind::Reduction { x, dim } | KernelOpKind::ReduceMax { x, dim }, Some(o)) => {
                pair_aligned(&mut c, &s, *x, o, Some(s.dims[o].len() - dim))
            }
            (KernelOpKind::RmsNorm { x, weight, .. }, Some(o)) => {
                pair_aligned(&mut c, &s, *x, o, None);
                if let Some(w) = weight {
                    pair_aligned(&mut c, &s, *w, o, None);
                }
            }
            (KernelOpKind::Permute { x, perm }, Some(o)) => {
                for (j, &p) in perm.iter().enumerate() {
                    if s.dims[o][j] > 1 {
                        c.union(s.slot(*x, p), s.slot(o, j));
                    }
                }
            }
            (KernelOpKind::Customized { inputs, graph }, _) => {
                pair_block(&mut c, &s, inputs, &op.outs, graph)?
            }
            _ => return None,
        }
    }
    let mut out = HashMap::new();
    for (is_output, list) in [(false, g.inputs()), (true, g.outputs())] {
        for (i, &t) in list.iter().enumerate() {
            for (j, &e) in ts[t].dims.iter().enumerate() {
                if e > 1 {
                    out.insert((is_output, i, j), c.find(s.slot(t, j)));
                }
            }
        }
    }
    Some(out)
}

/// The target's classes, computed once per search.
pub struct TargetClasses(Option<HashMap<(bool, usize, usize), usize>>);

impl TargetClasses {
    pub fn of(target: &KernelGraph) -> TargetClasses {
        TargetClasses(boundary_classes(target))
    }

    /// The labels of input `i`'s `rank` dims (all None when the target is not judged).
    pub fn input_labels(&self, i: usize, rank: usize) -> Labels {
        (0..rank)
            .map(|j| self.0.as_ref()?.get(&(false, i, j)).copied())
            .collect()
    }

    /// Does `candidate` put two input or output dims in one class where the target keeps
    /// them apart? False when either graph is outside the vocabulary (not judged).
    pub fn mixes(&self, candidate: &KernelGraph) -> bool {
        let Some(target) = &self.0 else {
            return false;
        };
        let Some(cand) = boundary_classes(candidate) else {
            return false;
        };
        let mut seen: HashMap<usize, usize> = HashMap::new();
        for (key, &root) in &cand {
            let Some(&class) = target.get(key) else {
                return false;
            };
            if *seen.entry(root).or_insert(class) != class {
                return true;
            }
        }
        false
    }
}

/// Per dim of a tensor or tile the enumeration builds: the target class of an input dim
/// it is linked to (None: extent 1, or linked to none yet). The enumeration carries labels
/// forward through every op it appends and drops an op that links two dims of different
/// classes: the rule [`TargetClasses::mixes`] applies to whole candidates, applied before
/// anything is built below the op. Classes only grow as ops are added, so a dropped op
/// could only have led to candidates that `mixes` rejects.
pub type Labels = Vec<Option<usize>>;

/// The label of two linked dims; None when they belong to different classes.
pub fn meet(a: Option<usize>, b: Option<usize>) -> Option<Option<usize>> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => None,
        _ => Some(a.or(b)),
    }
}

/// Labels of an elementwise op over equal-rank operands (a broadcast dim has extent 1,
/// hence no label); None when the op links different classes.
pub fn join(a: &[Option<usize>], b: &[Option<usize>]) -> Option<Labels> {
    if a.len() != b.len() {
        return Some(vec![None; a.len().max(b.len())]);
    }
    a.iter().zip(b).map(|(&x, &y)| meet(x, y)).collect()
}

/// Labels of `a · b` (equal ranks): batch dims linked, rows from `a`, columns from `b`;
/// None when the contracted pair or a batch dim links different classes.
pub fn matmul_labels(a: &[Option<usize>], b: &[Option<usize>]) -> Option<Labels> {
    let r = a.len();
    if r < 2 || b.len() != r {
        return Some(vec![None; r]);
    }
    meet(a[r - 1], b[r - 2])?;
    let mut out = join(&a[..r - 2], &b[..r - 2])?;
    out.extend([a[r - 2], b[r - 1]]);
    Some(out)
}

/// `x`'s labels with dim `d` reduced to extent 1.
pub fn reduced(x: &[Option<usize>], d: usize) -> Labels {
    let mut out = x.to_vec();
    if let Some(l) = out.get_mut(d) {
        *l = None;
    }
    out
}

/// Labels of `x` scaled by a weight over its trailing dims (rms_norm's); None on a mix.
pub fn with_trailing(x: &[Option<usize>], w: &[Option<usize>]) -> Option<Labels> {
    let mut out = x.to_vec();
    let lead = x.len().checked_sub(w.len())?;
    for (o, &l) in out[lead..].iter_mut().zip(w) {
        *o = meet(*o, l)?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::search::tests::attention;
    use crate::DType;

    /// `softmax(q·kt)·v` built with the operands of the first matmul as given.
    fn scores_then_values(
        b: i64,
        m: i64,
        d: i64,
        n: i64,
        swap: bool,
    ) -> crate::error::Result<KernelGraph> {
        let mut g = KernelGraph::new();
        let q = g.new_input(&[b, m, d], DType::F32)?;
        let k = g.new_input(&[b, d, n], DType::F32)?;
        let v = g.new_input(&[b, n, d], DType::F32)?;
        let s = if swap {
            g.matmul(k, q)?
        } else {
            g.matmul(q, k)?
        };
        let e = g.unary(UnaryOp::Exp, s)?;
        let r = g.reduction(e, -1)?;
        let p = g.binary(BinaryOp::Div, e, r)?;
        let o = if swap {
            g.matmul(v, p)?
        } else {
            g.matmul(p, v)?
        };
        g.mark_output(o)?;
        Ok(g)
    }

    #[test]
    fn the_target_itself_does_not_mix() {
        let t = attention(4, 512, 64, 512);
        assert!(!TargetClasses::of(&t).mixes(&t));
        let same = scores_then_values(4, 512, 64, 512, false).unwrap();
        assert!(!TargetClasses::of(&t).mixes(&same));
    }

    /// One-kernel attention over `Q[2,128,64]`, `Kt[2,64,128]`, `V[2,128,64]` (as many keys
    /// as query rows): blocks of 64 query rows per head, the loop over 64-key tiles.
    /// `keys_first` contracts the key tile with the query tile (`Kt·Q`) instead.
    fn one_kernel_attention(keys_first: bool) -> KernelGraph {
        let (a, b) = if keys_first { (1, 0) } else { (0, 1) };
        let doc = format!(
            r#"{{"format":"yirage.kernel_graph","version":1,"ops":[
            {{"op":"input","dims":[2,128,64],"dtype":"float32"}},
            {{"op":"input","dims":[2,64,128],"dtype":"float32"}},
            {{"op":"input","dims":[2,128,64],"dtype":"float32"}},
            {{"op":"customized","inputs":[0,1,2],"block_graph":{{"grid_dim":[2,2,1],
              "block_dim":[128,1,1],"forloop_range":2,"reduction_dimx":1,"ops":[
              {{"op":"input","dims":[2,128,64],"dtype":"float32","imap":[0,1,-1],"fmap":-1}},
              {{"op":"input","dims":[2,64,128],"dtype":"float32","imap":[0,-1,-1],"fmap":2}},
              {{"op":"input","dims":[2,128,64],"dtype":"float32","imap":[0,-1,-1],"fmap":1}},
              {{"op":"matmul","a":{a},"b":{b}}},
              {{"op":"unary","kind":"exp","x":3,"params":[]}},
              {{"op":"matmul","a":4,"b":2}},
              {{"op":"forloop_accum","x":5,"acc":null,"eps":0.0}},
              {{"op":"forloop_accum","x":4,"acc":"sum","eps":0.0}},
              {{"op":"binary","kind":"div","a":6,"b":7}}],
              "outputs":[{{"x":8,"omap":[0,1,-1]}}]}}}}],"outputs":[3]}}"#
        );
        crate::json::from_json(&doc).expect("candidate builds")
    }

    /// `X[16,256] · W[256,64]` split over K in two grid blocks whose partial chunks a
    /// second kernel sums with its loop.
    fn split_k_matmul() -> (KernelGraph, KernelGraph) {
        let mut t = KernelGraph::new();
        let x = t.new_input(&[16, 256], DType::F32).unwrap();
        let w = t.new_input(&[256, 64], DType::F32).unwrap();
        let y = t.matmul(x, w).unwrap();
        t.mark_output(y).unwrap();
        let doc = r#"{"format":"yirage.kernel_graph","version":1,"ops":[
            {"op":"input","dims":[16,256],"dtype":"float32"},
            {"op":"input","dims":[256,64],"dtype":"float32"},
            {"op":"customized","inputs":[0,1],"block_graph":{"grid_dim":[2,1,1],
              "block_dim":[128,1,1],"forloop_range":1,"reduction_dimx":1,"ops":[
              {"op":"input","dims":[16,256],"dtype":"float32","imap":[1,-1,-1],"fmap":-1},
              {"op":"input","dims":[256,64],"dtype":"float32","imap":[0,-1,-1],"fmap":-1},
              {"op":"matmul","a":0,"b":1},
              {"op":"forloop_accum","x":2,"acc":null,"eps":0.0}],
              "outputs":[{"x":3,"omap":[0,-1,-1]}]}},
            {"op":"customized","inputs":[2],"block_graph":{"grid_dim":[1,1,1],
              "block_dim":[128,1,1],"forloop_range":2,"reduction_dimx":1,"ops":[
              {"op":"input","dims":[32,64],"dtype":"float32","imap":[-1,-1,-1],"fmap":0},
              {"op":"forloop_accum","x":0,"acc":null,"eps":0.0}],
              "outputs":[{"x":1,"omap":[-1,-1,-1]}]}}],"outputs":[3]}"#;
        (t, crate::json::from_json(doc).expect("candidate builds"))
    }

    #[test]
    fn a_fused_attention_kernel_does_not_mix() {
        let t = TargetClasses::of(&attention(2, 128, 64, 128));
        assert!(!t.mixes(&one_kernel_attention(false)));
        // the key tile contracted with the query tile: the same shapes, the wrong program
        assert!(t.mixes(&one_kernel_attention(true)));
    }

    #[test]
    fn split_k_partial_chunks_do_not_mix() {
        // the first kernel's output stores its two partial sums along the row dim: the grid
        // axis that cuts K must not pair K with the rows
        let (target, candidate) = split_k_matmul();
        assert!(!TargetClasses::of(&target).mixes(&candidate));
    }

    #[test]
    fn labels_refuse_links_between_classes() {
        // self-attention: Q[h,m,d], Kt[h,d,n], V[h,n,d] with m = n and V's d its own class
        let t = TargetClasses::of(&attention(4, 512, 64, 512));
        let (q, kt, v) = (
            t.input_labels(0, 3),
            t.input_labels(1, 3),
            t.input_labels(2, 3),
        );
        let s = matmul_labels(&q, &kt).expect("Q·Kt links d with d");
        assert_eq!(s, vec![q[0], q[1], kt[2]]);
        assert!(
            matmul_labels(&kt, &q).is_none(),
            "Kt·Q contracts keys with query rows"
        );
        assert!(matmul_labels(&s, &v).is_some());
        assert!(join(&q, &v).is_none(), "Q's d and V's d are different dims");
        // a reduced dim has extent 1 and links nothing
        let r = reduced(&s, 2);
        assert_eq!(r[2], None);
        assert_eq!(join(&r, &s), Some(s.clone()));
        assert!(with_trailing(&q, &[kt[1]]).is_some());
        assert!(with_trailing(&q, &[v[2]]).is_none());
    }

    #[test]
    fn contracting_keys_with_query_rows_mixes() {
        // Kt·Q type-checks only because there are as many keys as query rows
        let t = attention(4, 512, 64, 512);
        let wrong = scores_then_values(4, 512, 64, 512, true).unwrap();
        assert!(TargetClasses::of(&t).mixes(&wrong));
    }
}
