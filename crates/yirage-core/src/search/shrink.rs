//! Verification at a reduced row count.
//!
//! Fingerprinting evaluates the whole graph in the finite field, so its cost grows with the
//! problem: at prefill sizes (a thousand rows and more) one candidate's fingerprint takes
//! seconds, and the search spends its budget verifying two or three candidates.
//!
//! A *free* dim of the target is one no op contracts, reduces, normalises, concatenates or
//! chunks: its rows are computed independently (the M and N of a matmul, the rows of an
//! RMSNorm, the heads of an attention). Dims are followed as classes of (tensor, dim) slots
//! that the ops link — the candidate's inputs are the target's, and a grid axis links the
//! slots it cuts — never by extent, so an N equal to K is still N. A candidate splits a free
//! dim over grid blocks that
//! run one block program on equal slices, so the candidate restricted to fewer rows — the
//! same tiles, the same block program, fewer blocks along that dim — is the same program at a
//! smaller size. The verifier fingerprints that smaller twin against the target at the same
//! smaller size. A masked edge tile (a grid that does not divide the dim) keeps its tile
//! `ceil(extent / parts)`; the twin's reduced extent is a multiple of it, so the twin runs the
//! same block program on whole tiles and the edge only drops rows that are never written.
//!
//! The reduced extent keeps every tile of the candidate whole and at least two blocks per
//! split axis (so the block-to-slice arithmetic is exercised), and never coincides with
//! another extent of the graph (so a dim mix-up that the full sizes would expose as a shape
//! mismatch is not hidden). Whatever cannot be reduced this way (a class the candidate
//! merges with another or binds, a dim a block reads whole or walks with its loop, an op
//! outside the known vocabulary, a twin that fails the validating builder or whose outputs
//! disagree in shape) is fingerprinted at full size. Every candidate is still checked numerically at full size on the device
//! before it is used; `SearchConfig::verify_full_size` turns the reduction off.

use crate::block_graph::BlockOpKind;
use crate::error::{CoreError, Result};
use crate::fingerprint::TrialCheck;
use crate::json::{from_json, to_json};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::budget::{eval_work, CheckClock, SMALL_WORK};

/// Smallest reduced extent of a free dim that no tile constrains.
const MIN_ROWS: usize = 32;
/// Reduced extents of a dim no tile constrains are multiples of this (else of its tiles).
const ROW_STEP: usize = 16;
/// Reduced extent of a dim every block owns one index of (heads, batch): its blocks'
/// arithmetic is exercised by a few of them, and attention's work shrinks with it.
const PER_BLOCK_MIN: usize = 4;

/// Free class of the target (index into [`Target::classes`]) → reduced extent.
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

/// What the ops of a graph say about its slots.
struct Linked {
    slots: Slots,
    /// Slots some op contracts, reduces, normalises, concatenates or chunks.
    bound: Vec<usize>,
    /// Slots a block reads whole or walks with its for-loop.
    whole: Vec<usize>,
    /// (slot, tile): a grid axis cuts the slot's dim into tiles of that size.
    tiles: Vec<(usize, usize)>,
}

/// Link the slots every op of `g` keeps together; None when `g` holds an op outside the
/// vocabulary this analysis models.
fn link(g: &KernelGraph) -> Option<Linked> {
    let ts = g.tensors();
    let mut s = Slots::new(g);
    let (mut bound, mut whole, mut tiles) = (vec![], vec![], vec![]);
    let rank = |t: usize| ts[t].dims.len();
    for op in g.ops() {
        let Some(&out) = op.outs.first() else {
            continue;
        };
        let r = rank(out);
        let same = |s: &mut Slots, x: usize, y: usize, j: usize| {
            if ts[x].dims[j] == ts[y].dims[j] {
                s.union(s.id(x, j), s.id(y, j));
            }
        };
        match &op.kind {
            KernelOpKind::Input { .. } => {}
            KernelOpKind::Matmul { a, b } => {
                for j in 0..r - 2 {
                    same(&mut s, *a, out, j);
                    same(&mut s, *b, out, j);
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
                    same(&mut s, *a, out, j);
                    same(&mut s, *b, out, j);
                }
            }
            KernelOpKind::Reduction { x, dim }
            | KernelOpKind::ReduceMax { x, dim }
            | KernelOpKind::Softmax { x, dim }
            | KernelOpKind::Chunk { x, dim, .. } => {
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
            KernelOpKind::Permute { x, perm } => {
                for (j, &p) in perm.iter().enumerate() {
                    s.union(s.id(*x, p), s.id(out, j));
                }
            }
            KernelOpKind::Customized { inputs, graph } => {
                let grid = graph.grid_dim();
                let block_inputs: Vec<([i32; 3], i32)> = graph
                    .ops()
                    .iter()
                    .filter_map(|o| match o {
                        BlockOpKind::Input { imap, fmap, .. } => Some((*imap, *fmap)),
                        _ => None,
                    })
                    .collect();
                if block_inputs.len() != inputs.len() || graph.outputs().len() != op.outs.len() {
                    return None;
                }
                for (&t, (imap, fmap)) in inputs.iter().zip(&block_inputs) {
                    for j in 0..rank(t) {
                        let axis = (0..3).find(|&a| imap[a] == j as i32 && grid[a] > 1);
                        match axis {
                            Some(a) if *fmap != j as i32 => {
                                tiles.push((s.id(t, j), ts[t].dims[j].div_ceil(grid[a] as usize)));
                            }
                            _ => whole.push(s.id(t, j)),
                        }
                    }
                }
                for a in (0..3).filter(|&a| grid[a] > 1) {
                    let mut on_axis = vec![];
                    for (&t, (imap, _)) in inputs.iter().zip(&block_inputs) {
                        if imap[a] >= 0 {
                            on_axis.push(s.id(t, imap[a] as usize));
                        }
                    }
                    for (&t, o) in op.outs.iter().zip(graph.outputs()) {
                        if o.omap[a] >= 0 {
                            on_axis.push(s.id(t, o.omap[a] as usize));
                        }
                    }
                    for w in on_axis.windows(2) {
                        s.union(w[0], w[1]);
                    }
                }
            }
            _ => return None,
        }
    }
    Some(Linked {
        slots: s,
        bound,
        whole,
        tiles,
    })
}

/// The target's free classes: dims no op binds, named by the input slots that hold them.
struct Target {
    /// Per input (in order), per dim: the free class, if the dim is free and not 1.
    input_class: Vec<Vec<Option<usize>>>,
    /// Extent of each free class.
    classes: Vec<usize>,
    /// Every extent of the target (reduced extents avoid them).
    extents: BTreeSet<usize>,
}

impl Target {
    fn of(g: &KernelGraph) -> Option<Target> {
        let mut l = link(g)?;
        let bound: BTreeSet<usize> = l.bound.iter().map(|&x| l.slots.find(x)).collect();
        let mut roots: Vec<usize> = vec![];
        let mut classes = vec![];
        let mut input_class = vec![];
        for &t in g.inputs() {
            let dims = &g.tensors()[t].dims;
            let mut row = vec![];
            for (j, &e) in dims.iter().enumerate() {
                let root = l.slots.find(l.slots.id(t, j));
                row.push((e > 1 && !bound.contains(&root)).then(|| {
                    roots.iter().position(|&r| r == root).unwrap_or_else(|| {
                        roots.push(root);
                        classes.push(e);
                        roots.len() - 1
                    })
                }));
            }
            input_class.push(row);
        }
        let extents = g
            .tensors()
            .iter()
            .flat_map(|t| t.dims.iter().copied())
            .collect();
        (!classes.is_empty()).then_some(Target {
            input_class,
            classes,
            extents,
        })
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// How `g` reduces: the target class of each of its slots (where reducible) and the
/// reduced extents.
struct Plan {
    class_of_slot: Vec<Option<usize>>,
    map: ShrinkMap,
    base: Vec<usize>,
}

/// The reduction of `g` (a candidate, or the target itself) against `target`'s free classes,
/// or None when nothing reduces.
fn plan(g: &KernelGraph, target: &Target) -> Option<Plan> {
    if g.inputs().len() != target.input_class.len() {
        return None;
    }
    let mut l = link(g)?;
    // the candidate's inputs are the target's: tie the slots of one target class together
    let mut first: Vec<Option<usize>> = vec![None; target.classes.len()];
    let mut class_at_root: HashMap<usize, BTreeSet<usize>> = HashMap::new();
    for (&t, row) in g.inputs().iter().zip(&target.input_class) {
        for (j, c) in row.iter().enumerate() {
            let Some(c) = *c else { continue };
            let slot = l.slots.id(t, j);
            match first[c] {
                Some(f) => l.slots.union(f, slot),
                None => first[c] = Some(slot),
            }
        }
    }
    for (&t, row) in g.inputs().iter().zip(&target.input_class) {
        for (j, c) in row.iter().enumerate() {
            if let Some(c) = *c {
                let root = l.slots.find(l.slots.id(t, j));
                class_at_root.entry(root).or_default().insert(c);
            }
        }
    }
    // a class merged with another, bound by an op, or read whole stays at full size
    let mut blocked: BTreeSet<usize> = BTreeSet::new();
    for cs in class_at_root.values().filter(|cs| cs.len() > 1) {
        blocked.extend(cs.iter().copied());
    }
    for &x in l.bound.iter().chain(&l.whole) {
        let root = l.slots.find(x);
        if let Some(cs) = class_at_root.get(&root) {
            blocked.extend(cs.iter().copied());
        }
    }
    let n = l.slots.parent.len();
    let class_of_slot: Vec<Option<usize>> = (0..n)
        .map(|x| {
            let root = l.slots.find(x);
            let cs = class_at_root.get(&root)?;
            let c = *cs.iter().next()?;
            (cs.len() == 1 && !blocked.contains(&c)).then_some(c)
        })
        .collect();
    let mut tiles: Vec<Vec<usize>> = vec![vec![]; target.classes.len()];
    for &(slot, tile) in &l.tiles {
        if let Some(c) = class_of_slot[slot] {
            tiles[c].push(tile);
        }
    }
    let mut map = ShrinkMap::new();
    let mut taken = target.extents.clone();
    for (c, &e) in target.classes.iter().enumerate() {
        if blocked.contains(&c) || first[c].is_none() {
            continue;
        }
        let per_block = !tiles[c].is_empty() && tiles[c].iter().all(|&t| t == 1);
        let (lcm, floor) = if per_block {
            (1, PER_BLOCK_MIN)
        } else {
            // a multiple of the dim's tiles only (a masked 125-row tile: 250, not 2000)
            let base = if tiles[c].is_empty() { ROW_STEP } else { 1 };
            let lcm = tiles[c].iter().fold(base, |a, &t| a / gcd(a, t) * t);
            let floor = tiles[c].iter().map(|t| 2 * t).max().unwrap_or(0);
            (lcm, floor.max(MIN_ROWS))
        };
        let mut small = floor.div_ceil(lcm) * lcm;
        while small < e && taken.contains(&small) {
            small += lcm;
        }
        if small < e {
            taken.insert(small);
            map.insert(c, small);
        }
    }
    (!map.is_empty()).then_some(Plan {
        class_of_slot,
        map,
        base: l.slots.base,
    })
}

fn usizes(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(Value::as_i64).collect()
}

/// `g` at the reduced extents of `plan` with `map` (input dims, block input dims and the
/// grid parts of the axes that cut reduced dims), through the validating builder.
fn reduce(g: &KernelGraph, p: &Plan, map: &ShrinkMap) -> Option<KernelGraph> {
    let ts = g.tensors();
    let small = |t: usize, j: usize| -> usize {
        p.class_of_slot[p.base[t] + j]
            .and_then(|c| map.get(&c).copied())
            .unwrap_or(ts[t].dims[j])
    };
    let mut doc: Value = serde_json::from_str(&to_json(g)).ok()?;
    let ops = doc.get_mut("ops")?.as_array_mut()?;
    if ops.len() != g.ops().len() {
        return None;
    }
    for (jop, op) in ops.iter_mut().zip(g.ops()) {
        match &op.kind {
            KernelOpKind::Input { .. } => {
                let t = *op.outs.first()?;
                jop["dims"] = Value::from(
                    (0..ts[t].dims.len())
                        .map(|j| small(t, j))
                        .collect::<Vec<_>>(),
                );
            }
            KernelOpKind::Customized { inputs, .. } => {
                let bg = jop.get_mut("block_graph")?;
                let mut grid = usizes(bg.get("grid_dim")?)?;
                let mut new_grid: [Option<i64>; 3] = [None; 3];
                let mut k = 0;
                for bop in bg.get_mut("ops")?.as_array_mut()? {
                    if bop.get("op")?.as_str()? != "input" {
                        continue;
                    }
                    let t = *inputs.get(k)?;
                    k += 1;
                    let imap = usizes(bop.get("imap")?)?;
                    for (a, &j) in imap.iter().enumerate() {
                        if j < 0 || grid[a] <= 1 {
                            continue;
                        }
                        let (full, red) =
                            (ts[t].dims[j as usize] as i64, small(t, j as usize) as i64);
                        let parts = red / ((full + grid[a] - 1) / grid[a]); // red: a multiple of the tile
                        if *new_grid[a].get_or_insert(parts) != parts {
                            return None;
                        }
                    }
                    bop["dims"] = Value::from(
                        (0..ts[t].dims.len())
                            .map(|j| small(t, j))
                            .collect::<Vec<_>>(),
                    );
                }
                for (a, np) in new_grid.iter().enumerate() {
                    if let Some(np) = np {
                        grid[a] = *np;
                    }
                }
                bg["grid_dim"] = Value::from(grid);
            }
            KernelOpKind::Reshape { .. } => return None,
            _ => {}
        }
    }
    from_json(&doc.to_string()).ok()
}

fn poisoned() -> CoreError {
    CoreError::Evaluation("fingerprint verifier: a lock was poisoned by a panic".into())
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
    /// The target's free classes; None: no reduction.
    free: Option<Target>,
    /// Built when first needed. No lock is held while a check is built: a check is built
    /// with rayon, and a rayon thread waiting for a lock may be the one holding it (it steals
    /// another candidate's check while it waits for its own tasks), so two threads may build
    /// the same check and one copy is kept.
    full: Mutex<Option<Arc<Option<TrialCheck>>>>,
    reduced: Mutex<HashMap<ShrinkMap, Option<ReducedTarget>>>,
    /// Time per unit of check work, measured on the checks run so far.
    clock: CheckClock,
}

impl Verifier {
    /// A verifier for `target`; `reduce_rows` enables the reduced-size check. Errors when the
    /// target cannot be fingerprinted at all.
    pub fn new(target: &KernelGraph, trials: usize, seed: u64, reduce_rows: bool) -> Result<Self> {
        let v = Verifier {
            target: target.clone(),
            trials,
            seed,
            free: if reduce_rows {
                Target::of(target)
            } else {
                None
            },
            full: Mutex::new(None),
            reduced: Mutex::new(HashMap::new()),
            clock: CheckClock::default(),
        };
        if v.free.is_none() {
            let t0 = Instant::now();
            let check = TrialCheck::new(target, trials, seed)?;
            v.clock.record(
                eval_work(target).saturating_mul(trials as u64),
                t0.elapsed(),
            );
            *v.full.lock().map_err(|_| poisoned())? = Some(Arc::new(Some(check)));
        }
        Ok(v)
    }

    /// Work units of checking `g`: [`eval_work`] of what is evaluated (its reduced twin, or
    /// itself at full size) over the trials. The target's own evaluation at that size, once
    /// per size, is not counted, so a candidate's count does not depend on which candidates
    /// were checked before it.
    pub fn check_work(&self, g: &KernelGraph) -> u64 {
        let small = self.free.as_ref().and_then(|free| {
            let p = plan(g, free)?;
            reduce(g, &p, &p.map)
        });
        let work = small.as_ref().map_or_else(|| eval_work(g), eval_work);
        work.saturating_mul(self.trials as u64)
    }

    /// The expected time of a check of `work` units ([`Verifier::check_work`]) at the time
    /// per unit measured so far; zero for a small check (below [`SMALL_WORK`]).
    pub fn estimate(&self, work: u64) -> Duration {
        if work < SMALL_WORK {
            return Duration::ZERO;
        }
        self.clock.calibrate_once(self.trials, self.seed);
        self.clock.estimate(work)
    }

    /// Whether `g` is equivalent to the target, timing the check for [`Verifier::estimate`].
    pub fn matches_timed(&self, g: &KernelGraph) -> bool {
        let work = self.check_work(g);
        let t0 = Instant::now();
        let ok = self.matches(g);
        self.clock.record(work, t0.elapsed());
        ok
    }

    fn full(&self) -> Option<Arc<Option<TrialCheck>>> {
        if let Some(hit) = self.full.lock().ok()?.clone() {
            return Some(hit);
        }
        let built = Arc::new(TrialCheck::new(&self.target, self.trials, self.seed).ok());
        Some(self.full.lock().ok()?.get_or_insert(built).clone())
    }

    /// The reduced target and its fingerprints for `map` (None: the target does not reduce).
    fn reduced_target(&self, free: &Target, map: &ShrinkMap) -> Option<ReducedTarget> {
        let hit = self.reduced.lock().ok()?.get(map).cloned();
        if let Some(hit) = hit {
            return hit;
        }
        let built = plan(&self.target, free)
            .and_then(|p| reduce(&self.target, &p, map))
            .and_then(|small| {
                let check = TrialCheck::new(&small, self.trials, self.seed).ok()?;
                Some(Arc::new((small, check)))
            });
        self.reduced.lock().ok()?.insert(map.clone(), built.clone());
        built
    }

    /// `g`'s reduced extents, its reduced twin and the matching reduced target, when all
    /// exist.
    fn twin(&self, g: &KernelGraph) -> Option<(ShrinkMap, KernelGraph, ReducedTarget)> {
        let free = self.free.as_ref()?;
        let p = plan(g, free)?;
        let target = self.reduced_target(free, &p.map)?;
        let small = reduce(g, &p, &p.map)?;
        (output_dims(&small) == output_dims(&target.0)).then_some((p.map, small, target))
    }

    /// Whether `g` is equivalent to the target (false when it cannot be evaluated).
    pub fn matches(&self, g: &KernelGraph) -> bool {
        match self.twin(g) {
            Some((_, small, target)) => target.1.matches(&small),
            None => self
                .full()
                .is_some_and(|c| c.as_ref().as_ref().is_some_and(|c| c.matches(g))),
        }
    }

    /// The (full, reduced) extents of the dims `g` is verified at reduced (empty: full size).
    pub fn reduced_extents(&self, g: &KernelGraph) -> Vec<(usize, usize)> {
        let Some(free) = &self.free else {
            return vec![];
        };
        self.twin(g)
            .map(|(map, _, _)| {
                let mut v: Vec<(usize, usize)> =
                    map.into_iter().map(|(c, e)| (free.classes[c], e)).collect();
                v.sort_unstable();
                v
            })
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
    fn free_classes_are_the_dims_no_op_binds() {
        let t = Target::of(&rmsnorm_linear(256, 64, 192)).unwrap();
        assert_eq!(t.classes, vec![256, 192]); // M, N; K is contracted
        assert_eq!(
            t.input_class,
            vec![vec![Some(0), None], vec![None, Some(1)]]
        );
        // N has K's extent and is still free: classes, not values
        let t = Target::of(&rmsnorm_linear(256, 64, 64)).unwrap();
        assert_eq!(t.classes, vec![256, 64]);
    }

    #[test]
    fn a_dim_with_a_contracted_dims_extent_is_reduced_too() {
        let target = rmsnorm_linear(256, 192, 192);
        let v = Verifier::new(&target, 2, 3, true).unwrap();
        let good = fused(256, 192, 192, [8, 3], "div");
        assert_eq!(v.reduced_extents(&good), vec![(192, 128), (256, 64)]);
        assert!(v.matches(&good));
        assert!(!v.matches(&fused(256, 192, 192, [8, 3], "mul")));
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
    fn a_masked_edge_tile_is_verified_at_whole_tiles() {
        // M = 250 over 16 blocks of 16 (the last owns 10), N = 300 over 19 blocks of 16 (the
        // last owns 12): the twin keeps the tiles and runs whole ones only.
        let target = rmsnorm_linear(250, 64, 300);
        let v = Verifier::new(&target, 2, 3, true).unwrap();
        let good = fused(250, 64, 300, [16, 19], "div");
        let reduced = v.reduced_extents(&good);
        assert_eq!(reduced.len(), 2, "{reduced:?}");
        assert!(
            reduced.iter().all(|&(_, e)| e % 16 == 0 && e >= 32),
            "{reduced:?}"
        );
        assert!(v.matches(&good));
        assert!(Verifier::new(&target, 2, 3, false).unwrap().matches(&good));
        let wrong = fused(250, 64, 300, [16, 19], "mul");
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
        assert_eq!(v.reduced_extents(&target), vec![(192, 48), (256, 32)]);
        assert!(v.matches(&target));
    }

    /// One-kernel attention over 32 heads (one per block along grid x), 128 query rows in
    /// two 64-row blocks, 128 keys walked in two 64-key tiles.
    fn one_kernel_attention() -> KernelGraph {
        let doc = r#"{"format":"yirage.kernel_graph","version":1,"ops":[
            {"op":"input","dims":[32,128,64],"dtype":"float32"},
            {"op":"input","dims":[32,64,128],"dtype":"float32"},
            {"op":"input","dims":[32,128,64],"dtype":"float32"},
            {"op":"customized","inputs":[0,1,2],"block_graph":{"grid_dim":[32,2,1],
              "block_dim":[128,1,1],"forloop_range":2,"reduction_dimx":1,"ops":[
              {"op":"input","dims":[32,128,64],"dtype":"float32","imap":[0,1,-1],"fmap":-1},
              {"op":"input","dims":[32,64,128],"dtype":"float32","imap":[0,-1,-1],"fmap":2},
              {"op":"input","dims":[32,128,64],"dtype":"float32","imap":[0,-1,-1],"fmap":1},
              {"op":"matmul","a":0,"b":1},
              {"op":"unary","kind":"exp","x":3,"params":[]},
              {"op":"matmul","a":4,"b":2},
              {"op":"forloop_accum","x":5,"acc":null,"eps":0.0},
              {"op":"forloop_accum","x":4,"acc":"sum","eps":0.0},
              {"op":"binary","kind":"div","a":6,"b":7}],
              "outputs":[{"x":8,"omap":[0,1,-1]}]}}],"outputs":[3]}"#;
        from_json(doc).expect("candidate builds")
    }

    #[test]
    fn heads_one_per_block_are_verified_at_four() {
        let target = crate::search::tests::attention(32, 128, 64, 128);
        let v = Verifier::new(&target, 2, 3, true).unwrap();
        let good = one_kernel_attention();
        // the query rows (two blocks of 64) stay: 128 is the smallest extent keeping both
        assert_eq!(v.reduced_extents(&good), vec![(32, 4)]);
        assert!(v.matches(&good));
    }
}
