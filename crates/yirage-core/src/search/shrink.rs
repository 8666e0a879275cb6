//! Verification at a reduced row count.
//!
//! Fingerprinting evaluates the whole graph in the finite field, so its cost grows with the
//! problem: at prefill sizes (a thousand rows and more) one candidate's fingerprint takes
//! seconds, and the search spends its budget verifying two or three candidates.
//!
//! A *free* dim of the target is one no op contracts, reduces, normalises, concatenates or
//! chunks: its rows are computed independently (the M and N of a matmul, the rows of an
//! RMSNorm, the heads of an attention). A candidate splits a free dim over grid blocks that
//! run one block program on equal slices, so the candidate restricted to fewer rows — the
//! same tiles, the same block program, fewer blocks along that dim — is the same program at a
//! smaller size. The verifier fingerprints that smaller twin against the target at the same
//! smaller size.
//!
//! The reduced extent keeps every tile of the candidate whole and at least two blocks per
//! split axis (so the block-to-slice arithmetic is exercised), and never coincides with
//! another extent of the graph (so a dim mix-up that the full sizes would expose as a shape
//! mismatch is not hidden). Whatever cannot be reduced this way (an extent tied to a
//! contracted dim, a whole-dim or looped tile, an op outside the known vocabulary, a twin
//! that fails the validating builder or whose outputs disagree in shape) is fingerprinted
//! at full size. Every candidate is still checked numerically at full size on the device
//! before it is used; `SearchConfig::verify_full_size` turns the reduction off.

use crate::error::Result;
use crate::fingerprint::TrialCheck;
use crate::json::{from_json, to_json};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

/// Smallest reduced extent of a free dim that no tile constrains.
const MIN_ROWS: usize = 32;
/// Reduced extents are multiples of this (and of every tile of the dim).
const ROW_STEP: usize = 16;

/// Extent → reduced extent.
type ShrinkMap = BTreeMap<usize, usize>;
/// A reduced target and its fingerprints.
type ReducedTarget = Arc<(KernelGraph, TrialCheck)>;

/// Union-find over the (tensor, dim) slots of a kernel graph.
struct Slots {
    parent: Vec<usize>,
    base: Vec<usize>,
}

impl Slots {
    fn new(g: &KernelGraph) -> Slots {
        let mut base = vec![];
        let mut n = 0;
        for t in g.tensors() {
            base.push(n);
            n += t.dims.len();
        }
        Slots {
            parent: (0..n).collect(),
            base,
        }
    }
    fn id(&self, t: usize, d: usize) -> usize {
        self.base[t] + d
    }
    fn find(&mut self, x: usize) -> usize {
        let mut r = x;
        while self.parent[r] != r {
            r = self.parent[r];
        }
        self.parent[x] = r;
        r
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[ra.max(rb)] = ra.min(rb);
        }
    }
}

/// Extents of `target` that only free dims have (see the module doc), or None when the
/// target holds an op this analysis does not model.
pub fn free_extents(target: &KernelGraph) -> Option<BTreeSet<usize>> {
    let ts = target.tensors();
    let mut s = Slots::new(target);
    let mut bound: Vec<usize> = vec![];
    let rank = |t: usize| ts[t].dims.len();
    for op in target.ops() {
        let Some(&out) = op.outs.first() else {
            continue;
        };
        let r = rank(out);
        match &op.kind {
            KernelOpKind::Input { .. } => {}
            KernelOpKind::Matmul { a, b } => {
                for j in 0..r - 2 {
                    for x in [*a, *b] {
                        if ts[x].dims[j] == ts[out].dims[j] {
                            s.union(s.id(x, j), s.id(out, j));
                        }
                    }
                }
                s.union(s.id(out, r - 2), s.id(*a, r - 2));
                s.union(s.id(out, r - 1), s.id(*b, r - 1));
                s.union(s.id(*a, r - 1), s.id(*b, r - 2));
                bound.push(s.id(*a, r - 1));
            }
            KernelOpKind::Unary { x, .. } | KernelOpKind::AllReduce { x } => {
                for j in 0..r {
                    s.union(s.id(*x, j), s.id(out, j));
                }
            }
            KernelOpKind::Binary { a, b, .. } => {
                for j in 0..r {
                    for x in [*a, *b] {
                        if ts[x].dims[j] == ts[out].dims[j] {
                            s.union(s.id(x, j), s.id(out, j));
                        }
                    }
                }
            }
            KernelOpKind::Reduction { x, dim } | KernelOpKind::Softmax { x, dim } => {
                for j in (0..r).filter(|j| j != dim) {
                    s.union(s.id(*x, j), s.id(out, j));
                }
                bound.extend([s.id(*x, *dim), s.id(out, *dim)]);
            }
            KernelOpKind::RmsNorm {
                x,
                normalized_shape,
                weight,
                ..
            } => {
                for j in 0..r {
                    s.union(s.id(*x, j), s.id(out, j));
                }
                bound.extend((r - normalized_shape.len()..r).map(|j| s.id(*x, j)));
                if let Some(w) = weight {
                    bound.extend((0..rank(*w)).map(|j| s.id(*w, j)));
                }
            }
            KernelOpKind::Concat { xs, dim } => {
                for &x in xs {
                    for j in (0..r).filter(|j| j != dim) {
                        s.union(s.id(x, j), s.id(out, j));
                    }
                    bound.push(s.id(x, *dim));
                }
                bound.push(s.id(out, *dim));
            }
            KernelOpKind::Chunk { x, dim, .. } => {
                for j in (0..r).filter(|j| j != dim) {
                    s.union(s.id(*x, j), s.id(out, j));
                }
                bound.extend([s.id(*x, *dim), s.id(out, *dim)]);
            }
            _ => return None,
        }
    }
    let bound_roots: BTreeSet<usize> = bound.into_iter().map(|x| s.find(x)).collect();
    let mut free = BTreeSet::new();
    let mut tied = BTreeSet::new();
    for (t, info) in ts.iter().enumerate() {
        for (j, &e) in info.dims.iter().enumerate() {
            if e <= 1 {
                continue;
            }
            let root = s.find(s.id(t, j));
            if bound_roots.contains(&root) {
                tied.insert(e);
            } else {
                free.insert(e);
            }
        }
    }
    Some(free.difference(&tied).copied().collect())
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn usizes(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(Value::as_i64).collect()
}

/// Kernel ops whose attributes hold no extent (anything else leaves the candidate at full
/// size).
const KNOWN_OPS: [&str; 11] = [
    "input",
    "matmul",
    "unary",
    "binary",
    "reduction",
    "rms_norm",
    "softmax",
    "concat",
    "chunk",
    "all_reduce",
    "customized",
];

/// Per free extent of `doc`'s customized ops: the tiles the grid cuts it into, or None when
/// some block reads that extent whole or walks it with the for-loop.
fn tiles_of(doc: &Value, free: &BTreeSet<usize>) -> Option<BTreeMap<usize, Option<Vec<usize>>>> {
    let mut tiles: BTreeMap<usize, Option<Vec<usize>>> =
        free.iter().map(|&e| (e, Some(vec![]))).collect();
    for op in doc.get("ops")?.as_array()? {
        let name = op.get("op")?.as_str()?;
        if !KNOWN_OPS.contains(&name) {
            return None;
        }
        if name != "customized" {
            continue;
        }
        let bg = op.get("block_graph")?;
        let grid = usizes(bg.get("grid_dim")?)?;
        for bop in bg.get("ops")?.as_array()? {
            if bop.get("op")?.as_str()? != "input" {
                continue;
            }
            let dims = usizes(bop.get("dims")?)?;
            let imap = usizes(bop.get("imap")?)?;
            let fmap = bop.get("fmap")?.as_i64()?;
            for (j, &e) in dims.iter().enumerate() {
                let Some(entry) = tiles.get_mut(&(e as usize)) else {
                    continue;
                };
                let axis = imap.iter().position(|&d| d == j as i64);
                match (axis, fmap == j as i64) {
                    (Some(a), false) if grid[a] > 1 => {
                        if let Some(v) = entry {
                            v.push(e as usize / grid[a] as usize);
                        }
                    }
                    _ => *entry = None,
                }
            }
        }
    }
    Some(tiles)
}

/// The reduced extents for `doc` (empty: nothing to reduce).
fn shrink_map(doc: &Value, free: &BTreeSet<usize>, all: &BTreeSet<usize>) -> Option<ShrinkMap> {
    let mut map = ShrinkMap::new();
    let mut taken: BTreeSet<usize> = all.clone();
    for (e, tiles) in tiles_of(doc, free)? {
        let Some(tiles) = tiles else { continue };
        let lcm = tiles.iter().fold(ROW_STEP, |l, &t| l / gcd(l, t) * t);
        let floor = tiles.iter().map(|t| 2 * t).max().unwrap_or(0).max(MIN_ROWS);
        let mut small = floor.div_ceil(lcm) * lcm;
        while small < e && taken.contains(&small) {
            small += lcm;
        }
        if small < e {
            taken.insert(small);
            map.insert(e, small);
        }
    }
    Some(map)
}

/// `doc` with every free extent in `map` reduced: input dims, block input dims and the grid
/// parts of the axes that split them.
fn rewrite(doc: &mut Value, map: &ShrinkMap) -> Option<()> {
    let remap = |dims: &mut Value| -> Option<()> {
        for d in dims.as_array_mut()? {
            if let Some(&small) = map.get(&(d.as_u64()? as usize)) {
                *d = Value::from(small as u64);
            }
        }
        Some(())
    };
    for op in doc.get_mut("ops")?.as_array_mut()? {
        match op.get("op")?.as_str()? {
            "input" => remap(op.get_mut("dims")?)?,
            "customized" => {
                let bg = op.get_mut("block_graph")?;
                let mut grid = usizes(bg.get("grid_dim")?)?;
                let mut new_grid: [Option<i64>; 3] = [None; 3];
                for bop in bg.get_mut("ops")?.as_array_mut()? {
                    if bop.get("op")?.as_str()? != "input" {
                        continue;
                    }
                    let dims = usizes(bop.get("dims")?)?;
                    let imap = usizes(bop.get("imap")?)?;
                    for (a, &j) in imap.iter().enumerate() {
                        let Some(&e) = (j >= 0).then(|| dims.get(j as usize)).flatten() else {
                            continue;
                        };
                        let Some(&small) = map.get(&(e as usize)) else {
                            continue;
                        };
                        let parts = (small as i64) / (e / grid[a]);
                        if *new_grid[a].get_or_insert(parts) != parts {
                            return None;
                        }
                    }
                    remap(bop.get_mut("dims")?)?;
                }
                for (a, p) in new_grid.iter().enumerate() {
                    if let Some(p) = p {
                        grid[a] = *p;
                    }
                }
                bg["grid_dim"] = Value::from(grid);
            }
            _ => {}
        }
    }
    Some(())
}

/// `g` at the reduced extents, or None when it cannot be reduced (see the module doc).
fn reduce(g: &KernelGraph, map: &ShrinkMap) -> Option<KernelGraph> {
    let mut doc: Value = serde_json::from_str(&to_json(g)).ok()?;
    rewrite(&mut doc, map)?;
    from_json(&doc.to_string()).ok()
}

fn output_dims(g: &KernelGraph) -> Vec<Vec<usize>> {
    g.outputs()
        .iter()
        .map(|&t| g.tensors()[t].dims.to_vec())
        .collect()
}

/// The search's equivalence check: the target's fingerprints at full size, and at every
/// reduced size a candidate asks for (built when first needed).
pub struct Verifier {
    target: KernelGraph,
    trials: usize,
    seed: u64,
    /// Free extents and all extents of the target; None: no reduction.
    extents: Option<(BTreeSet<usize>, BTreeSet<usize>)>,
    full: OnceLock<Option<TrialCheck>>,
    reduced: Mutex<HashMap<ShrinkMap, Option<ReducedTarget>>>,
}

impl Verifier {
    /// A verifier for `target`; `reduce_rows` enables the reduced-size check. Errors when the
    /// target cannot be fingerprinted at all.
    pub fn new(target: &KernelGraph, trials: usize, seed: u64, reduce_rows: bool) -> Result<Self> {
        let extents = reduce_rows
            .then(|| free_extents(target))
            .flatten()
            .filter(|f| !f.is_empty())
            .map(|free| {
                let all = target
                    .tensors()
                    .iter()
                    .flat_map(|t| t.dims.iter().copied())
                    .collect();
                (free, all)
            });
        let v = Verifier {
            target: target.clone(),
            trials,
            seed,
            extents,
            full: OnceLock::new(),
            reduced: Mutex::new(HashMap::new()),
        };
        if v.extents.is_none() {
            let check = TrialCheck::new(target, trials, seed)?;
            let _ = v.full.set(Some(check));
        }
        Ok(v)
    }

    fn full(&self) -> Option<&TrialCheck> {
        self.full
            .get_or_init(|| TrialCheck::new(&self.target, self.trials, self.seed).ok())
            .as_ref()
    }

    /// The reduced target and its fingerprints for `map` (None: the target does not reduce).
    fn reduced_target(&self, map: &ShrinkMap) -> Option<ReducedTarget> {
        if let Some(hit) = self.reduced.lock().ok()?.get(map) {
            return hit.clone();
        }
        let built = reduce(&self.target, map).and_then(|small| {
            let check = TrialCheck::new(&small, self.trials, self.seed).ok()?;
            Some(Arc::new((small, check)))
        });
        self.reduced.lock().ok()?.insert(map.clone(), built.clone());
        built
    }

    /// `g`'s reduced extents, its reduced twin and the matching reduced target, when all
    /// exist.
    fn twin(&self, g: &KernelGraph) -> Option<(ShrinkMap, KernelGraph, ReducedTarget)> {
        let (free, all) = self.extents.as_ref()?;
        let doc: Value = serde_json::from_str(&to_json(g)).ok()?;
        let map = shrink_map(&doc, free, all)?;
        if map.is_empty() {
            return None;
        }
        let target = self.reduced_target(&map)?;
        let small = reduce(g, &map)?;
        (output_dims(&small) == output_dims(&target.0)).then_some((map, small, target))
    }

    /// Whether `g` is equivalent to the target (false when it cannot be evaluated).
    pub fn matches(&self, g: &KernelGraph) -> bool {
        match self.twin(g) {
            Some((_, small, target)) => target.1.matches(&small),
            None => self.full().is_some_and(|c| c.matches(g)),
        }
    }

    /// The (full, reduced) extents `g` is verified at (empty: full size).
    pub fn reduced_extents(&self, g: &KernelGraph) -> Vec<(usize, usize)> {
        self.twin(g)
            .map(|(map, _, _)| map.into_iter().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::tests::rmsnorm_linear;

    /// RMSNorm + Linear fused into one kernel, rows split in `grid[0]` parts and columns in
    /// `grid[1]`; `combine` is the final binary op (`div` is right).
    fn fused(m: usize, k: usize, n: usize, grid: [usize; 2], combine: &str) -> KernelGraph {
        let doc = format!(
            r#"{{"format":"yirage.kernel_graph","version":1,"ops":[
            {{"op":"input","dims":[{m},{k}],"dtype":"float32"}},
            {{"op":"input","dims":[{k},{n}],"dtype":"float32"}},
            {{"op":"customized","inputs":[0,1],"block_graph":{{"grid_dim":[{g0},{g1},1],
              "block_dim":[128,1,1],"forloop_range":1,"reduction_dimx":1,"ops":[
              {{"op":"input","dims":[{m},{k}],"dtype":"float32","imap":[0,-1,-1],"fmap":-1}},
              {{"op":"input","dims":[{k},{n}],"dtype":"float32","imap":[-1,1,-1],"fmap":-1}},
              {{"op":"forloop_accum","x":0,"acc":"rms","eps":1e-6}},
              {{"op":"matmul","a":0,"b":1}},
              {{"op":"forloop_accum","x":3,"acc":null,"eps":0.0}},
              {{"op":"binary","kind":"{combine}","a":4,"b":2}}],
              "outputs":[{{"x":5,"omap":[0,1,-1]}}]}}}}],"outputs":[2]}}"#,
            g0 = grid[0],
            g1 = grid[1],
        );
        from_json(&doc).expect("candidate builds")
    }

    #[test]
    fn free_extents_exclude_contracted_and_tied_dims() {
        let free = free_extents(&rmsnorm_linear(256, 64, 192)).unwrap();
        assert_eq!(free, BTreeSet::from([192, 256]));
        // N equals the contracted K: the value is ambiguous, so it stays at full size
        let free = free_extents(&rmsnorm_linear(256, 64, 64)).unwrap();
        assert_eq!(free, BTreeSet::from([256]));
    }

    #[test]
    fn a_fused_candidate_is_verified_at_fewer_rows_and_columns() {
        let target = rmsnorm_linear(256, 64, 192);
        let v = Verifier::new(&target, 2, 3, true).unwrap();
        let good = fused(256, 64, 192, [8, 3], "div");
        // M tiles of 32: two blocks need 64 rows, taken by K, so 96; N tiles of 64: 128
        assert_eq!(v.reduced_extents(&good), vec![(192, 128), (256, 96)]);
        assert!(v.matches(&good));
        let full = Verifier::new(&target, 2, 3, false).unwrap();
        assert!(full.reduced_extents(&good).is_empty());
        assert!(full.matches(&good));
    }

    #[test]
    fn a_wrong_candidate_is_rejected_at_fewer_rows() {
        let target = rmsnorm_linear(256, 64, 192);
        let v = Verifier::new(&target, 2, 3, true).unwrap();
        let wrong = fused(256, 64, 192, [8, 3], "mul");
        assert!(!v.reduced_extents(&wrong).is_empty());
        assert!(!v.matches(&wrong));
        assert!(!Verifier::new(&target, 2, 3, false).unwrap().matches(&wrong));
    }

    #[test]
    fn a_whole_dim_is_kept_and_the_rest_reduced() {
        let target = rmsnorm_linear(256, 64, 192);
        let v = Verifier::new(&target, 2, 3, true).unwrap();
        // N read whole by every block: only M is reduced (tiles of 16 → 32 rows)
        let rows_only = fused(256, 64, 192, [16, 1], "div");
        assert_eq!(v.reduced_extents(&rows_only), vec![(256, 32)]);
        assert!(v.matches(&rows_only));
        // the library baseline (no tiles) is reduced to the smallest row count
        assert_eq!(v.reduced_extents(&target), vec![(192, 32), (256, 48)]);
        assert!(v.matches(&target));
    }
}
