//! Phase (b) of the block level: concretising an abstract program with dimension classes.
//!
//! Union-find over the (tile, dim) slots of the program: ops link the dims they keep
//! (matmul: batch dims, A[-2]→C[-2], B[-1]→C[-1], and A[-1]~B[-2] which it *contracts*;
//! elementwise ops link equal non-broadcast dims; reductions and sum/rms accumulators
//! contract their dim). Every class — one logical loop index of the kernel — is then
//! assigned **whole**, **grid** (split over a grid axis into `p` parts), **loop** (walked by
//! the for-loop in `F` steps) or **grid+loop**. From the assignment follow every input's
//! imap/fmap and every output's omap, so a mapping is never guessed per tensor.
//!
//! A *partiality* check keeps only semantically plausible assignments before anything is
//! built: splitting a contracted class yields partial sums, which may only flow through
//! linear ops into an accumulator (loop splits) or out of the kernel on a free output dim
//! (grid splits: split-K / split-KV, the tensor is then marked as holding `s` partial
//! chunks and can only be consumed by a customized op that walks the chunks with an
//! iteration accumulator). Fingerprints remain the judge; this check only avoids building
//! and verifying candidates that are wrong by construction.
//!
//! Survivors are built through the IR's validating builder ([`BlockGraph`]), checked
//! against the device's shared memory, costed, grouped by the dims of their outputs (the
//! only thing later kernel ops depend on) and kept best-first.

use super::block::{BOp, BlockProgram, KIn};
use super::dims::{self, Labels};
use super::Run;
use crate::block_graph::BlockGraph;
use crate::cost::kernel_cost;
use crate::dtype::DType;
use crate::masked_loop::padding_stays_out;
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use crate::plan::{
    block_profile, profile_of, smem_bytes, smem_of, TileDesc, TileKind, INTERMEDIATE_BYTES,
};
use crate::shape::Dims;
use std::sync::Arc;

/// Smallest tile of a dim that is an operand of a matmul (matrix-unit granularity).
pub const MIN_MATRIX_TILE: usize = 16;
/// Loop tiles (per iteration) of a walked dim lie in this range.
pub const LOOP_TILE: (usize, usize) = (16, 512);
/// Widest tile [`aligned_divisor_ranges`] offers. Wider ones (kv 6000 in 24 tiles of 256)
/// go with loops a split leaves one or two iterations per part, which the cost model ranks
/// above the narrow tiles that run faster: GQA decode's one-kernel form ran 35.8 µs in
/// 24 × 256 against 31.8 in 94 × 64 on an H200, and took the latter's place in the top-k.
pub const ALIGNED_DIVISOR_TILE_MAX: usize = 128;
/// Concretisations kept per output-dims group.
pub const KEEP_PER_GROUP: usize = 8;

/// A concretised customized op.
#[derive(Debug, Clone)]
pub struct Concrete {
    pub graph: BlockGraph,
    /// Predicted time of this kernel (outputs costed as fp32 intermediates).
    pub cost_us: f64,
}

/// Stored dims and partial chunks `(dim, count)` of each output of a customized op.
pub type OutSig = Vec<(Dims, Option<(usize, usize)>)>;

/// Concretisations of one program whose outputs have the same stored dims / chunks.
#[derive(Debug, Clone)]
pub struct Group {
    pub outs: OutSig,
    pub concretes: Vec<Arc<Concrete>>,
}

struct Uf(Vec<usize>);

impl Uf {
    fn find(&mut self, x: usize) -> usize {
        let mut r = x;
        while self.0[r] != r {
            r = self.0[r];
        }
        let mut y = x;
        while self.0[y] != r {
            let n = self.0[y];
            self.0[y] = r;
            y = n;
        }
        r
    }
    fn union(&mut self, a: Option<usize>, b: Option<usize>) {
        if let (Some(a), Some(b)) = (a, b) {
            let (ra, rb) = (self.find(a), self.find(b));
            if ra != rb {
                self.0[ra.max(rb)] = ra.min(rb);
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
struct ClassInfo {
    extent: usize,
    /// The last (contiguous) dim of an input or an output of the kernel.
    contiguous: bool,
    contracted: bool,
    matrix: bool,
    chunk: Option<usize>,
    needs_whole: bool,
    no_grid: bool,
}

/// Assignment of one class.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Assign {
    parts: usize,
    loopy: bool,
}

struct Analysis {
    /// Class of each (tile, dim), `None` for unit dims.
    cls: Vec<Vec<Option<usize>>>,
    classes: Vec<ClassInfo>,
    /// Class contracted by each op (matmul, reduction, sum/rms accumulator).
    contracted_by: Vec<Option<usize>>,
}

fn analyse(prog: &BlockProgram, ins: &[KIn]) -> Option<Analysis> {
    let tiles = &prog.tiles;
    let mut slot: Vec<Vec<Option<usize>>> = vec![];
    let mut n = 0;
    for (t, tile) in tiles.iter().enumerate() {
        let chunk_dim = if t < prog.n_inputs {
            ins[t].chunks.map(|c| c.0)
        } else {
            None
        };
        slot.push(
            tile.dims
                .iter()
                .enumerate()
                .map(|(j, &d)| {
                    if d > 1 || chunk_dim == Some(j) {
                        n += 1;
                        Some(n - 1)
                    } else {
                        None
                    }
                })
                .collect(),
        );
    }
    let mut uf = Uf((0..n).collect());
    let mut contracted_slot: Vec<Option<usize>> = vec![None; tiles.len()];
    let mut matrix_slots = vec![];
    let mut whole_slots = vec![];
    let mut nogrid_slots = vec![];
    for (i, op) in prog.ops.iter().enumerate() {
        let s = |t: usize, j: usize| slot[t].get(j).copied().flatten();
        let rank = tiles[i].dims.len();
        match *op {
            BOp::Input(_) => {}
            BOp::Matmul(a, b) => {
                for j in 0..rank - 2 {
                    uf.union(s(a, j), s(i, j));
                    uf.union(s(b, j), s(i, j));
                }
                uf.union(s(a, rank - 1), s(b, rank - 2));
                uf.union(s(i, rank - 2), s(a, rank - 2));
                uf.union(s(i, rank - 1), s(b, rank - 1));
                contracted_slot[i] = s(a, rank - 1);
                for j in [rank - 2, rank - 1] {
                    matrix_slots.extend([s(a, j), s(b, j)]);
                }
            }
            BOp::Unary(_, x) => {
                for j in 0..rank {
                    uf.union(s(i, j), s(x, j));
                }
            }
            BOp::Binary(_, a, b) => {
                for j in 0..rank {
                    if tiles[a].dims[j] == tiles[i].dims[j] {
                        uf.union(s(a, j), s(i, j));
                    }
                    if tiles[b].dims[j] == tiles[i].dims[j] {
                        uf.union(s(b, j), s(i, j));
                    }
                }
            }
            BOp::Reduction(x, d) => {
                for j in (0..rank).filter(|&j| j != d) {
                    uf.union(s(i, j), s(x, j));
                }
                contracted_slot[i] = s(x, d);
            }
            BOp::RmsNorm(x) => {
                for j in 0..rank {
                    uf.union(s(i, j), s(x, j));
                }
                whole_slots.push(s(x, rank - 1));
            }
            BOp::Accum(x, kind) => {
                let keep = if kind == AccumKind::Iter {
                    rank
                } else {
                    rank - 1
                };
                for j in 0..keep {
                    uf.union(s(i, j), s(x, j));
                }
                if kind != AccumKind::Iter {
                    contracted_slot[i] = s(x, rank - 1);
                }
                if let AccumKind::Rms { .. } = kind {
                    nogrid_slots.push(s(x, rank - 1));
                }
            }
        }
    }
    // Compress roots to class ids.
    let mut class_of_root = vec![usize::MAX; n];
    let mut classes: Vec<ClassInfo> = vec![];
    let mut cls = vec![];
    for (t, row) in slot.iter().enumerate() {
        let mut crow = vec![];
        for (j, sl) in row.iter().enumerate() {
            crow.push(match sl {
                None => None,
                Some(sl) => {
                    let r = uf.find(*sl);
                    if class_of_root[r] == usize::MAX {
                        class_of_root[r] = classes.len();
                        classes.push(ClassInfo {
                            extent: tiles[t].dims[j],
                            ..Default::default()
                        });
                    }
                    let c = class_of_root[r];
                    if classes[c].extent != tiles[t].dims[j] {
                        return None;
                    }
                    Some(c)
                }
            });
        }
        cls.push(crow);
    }
    if classes.len() > 64 {
        return None;
    }
    let mut class_of_slot = |sl: Option<usize>| sl.map(|s| class_of_root[uf.find(s)]);
    let contracted_by: Vec<Option<usize>> =
        contracted_slot.iter().map(|&s| class_of_slot(s)).collect();
    for c in contracted_by.iter().flatten() {
        classes[*c].contracted = true;
    }
    for s in matrix_slots {
        if let Some(c) = class_of_slot(s) {
            classes[c].matrix = true;
        }
    }
    for s in whole_slots {
        if let Some(c) = class_of_slot(s) {
            classes[c].needs_whole = true;
        }
    }
    for s in nogrid_slots {
        if let Some(c) = class_of_slot(s) {
            classes[c].no_grid = true;
        }
    }
    for t in (0..prog.n_inputs).chain(prog.outputs.iter().copied()) {
        if let Some(&Some(c)) = cls[t].last() {
            classes[c].contiguous = true;
        }
    }
    for (k, kin) in ins.iter().enumerate() {
        if let Some((d, s)) = kin.chunks {
            let c = cls[k][d]?;
            match classes[c].chunk {
                Some(old) if old != s => return None,
                _ => classes[c].chunk = Some(s),
            }
        }
    }
    Some(Analysis {
        cls,
        classes,
        contracted_by,
    })
}

fn pow2_divisors(extent: usize, max: usize) -> impl Iterator<Item = usize> {
    (1..usize::BITS)
        .map(|i| 1usize << i)
        .take_while(move |&p| p <= extent && p <= max)
        .filter(move |&p| extent % p == 0)
}

/// Grid part counts of a class of `extent` (≤ `max`, tile ≥ `min_tile`): power-of-two
/// counts, plus counts leaving a power-of-two tile (6144 → 192 blocks of 32), so a
/// non-power-of-two extent can still fill every unit with matrix-friendly tiles (the
/// latter only with `pow2_tiles`, i.e. for GPUs). With `masked` (a free class, see
/// [`masked_parts`]; for CPUs [`masked_counts`]) also the counts of masked edge tiles: a
/// CPU's free dim that no power-of-two count divides (N = 6151) is otherwise one block on
/// one thread. With `rows` (a masked GPU dim no tensor of the kernel is contiguous along)
/// also [`masked_row_parts`].
fn grid_parts(
    extent: usize,
    max: usize,
    min_tile: usize,
    pow2_tiles: bool,
    masked: bool,
    rows: bool,
) -> Vec<usize> {
    let mut v: Vec<usize> = pow2_divisors(extent, max).collect();
    if pow2_tiles {
        v.extend(
            pow2_divisors(extent, extent)
                .filter(|&t| t < extent)
                .map(|t| extent / t)
                .filter(|&p| p <= max),
        );
    }
    v.retain(|&p| extent / p >= min_tile);
    if masked && pow2_tiles {
        v.extend(masked_parts(extent, max, min_tile));
        if rows {
            v.extend(masked_row_parts(extent, max, min_tile));
        }
    } else if masked {
        v.extend(masked_counts(extent, max, min_tile));
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Part counts `p` whose tile `ceil(extent / p)` is a power of two `t ≥ max(min_tile,
/// MIN_MATRIX_TILE)` that does not divide `extent`: the last block owns a partial, masked
/// tile (5000 → 313 blocks of 16, …; 40 → 3 blocks is not offered, its tile would be 14).
/// Only for dims no op of the kernel reduces, where the masked rows never mix with the
/// others, so the edge computes exact values.
fn masked_parts(extent: usize, max: usize, min_tile: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS)
        .map(|i| 1usize << i)
        .skip_while(move |&t| t < min_tile.max(MIN_MATRIX_TILE))
        .take_while(move |&t| t < extent)
        .filter(move |&t| extent % t != 0)
        .map(move |t| (t, extent.div_ceil(t)))
        .filter(move |&(t, p)| extent.div_ceil(p) == t && (2..=max).contains(&p))
        .map(|(_, p)| p)
}

/// Part counts `p = ceil(extent / t)` for matrix tiles `t` up to [`ROW_TILE_MAX`] whose
/// blocks own `ceil(extent / p) < t` rows, the last one partial and masked (4099 → 33 blocks
/// of 125, printed in tiles of 128): for a dim no tensor is contiguous along, where a block
/// starting at any row reads whole rows, so the tile need not be a power of two (attention's
/// query rows get the 128-row tiles of their divisible neighbour, not 64).
fn masked_row_parts(extent: usize, max: usize, min_tile: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS)
        .map(|i| 1usize << i)
        .skip_while(move |&t| t < min_tile.max(MIN_MATRIX_TILE))
        .take_while(move |&t| t <= ROW_TILE_MAX && t < extent)
        .map(move |t| extent.div_ceil(t))
        .filter(move |&p| {
            let t = extent.div_ceil(p);
            extent % p != 0
                && !t.is_power_of_two()
                && (p - 1) * t < extent
                && (2..=max).contains(&p)
        })
}

/// The widest tile [`masked_row_parts`] rounds up to.
const ROW_TILE_MAX: usize = 128;

/// Power-of-two part counts `p` that do not divide `extent`, for CPUs: blocks of
/// `ceil(extent / p)` (≥ `max(min_tile, MIN_MATRIX_TILE)`), the last one partial and masked
/// (6151 → 2 blocks of 3076, 4 of 1538, …), so every thread gets a share of a dim no count
/// divides. Only for dims no op of the kernel reduces, as [`masked_parts`].
fn masked_counts(extent: usize, max: usize, min_tile: usize) -> impl Iterator<Item = usize> {
    (1..usize::BITS)
        .map(|i| 1usize << i)
        .take_while(move |&p| p <= max && p < extent)
        .filter(move |&p| {
            let t = extent.div_ceil(p);
            extent % p != 0 && t >= min_tile.max(MIN_MATRIX_TILE) && (p - 1) * t < extent
        })
}

/// Whether the pattern `m` walked by the masked loop range `f` keeps the loop's zero
/// padding out of every real value ([`padding_stays_out`]; it depends on which dims the loop
/// pads, not on the sizes, so one probe with one block answers for every masked range).
fn masked_loop_is_exact(cx: &Ctx<'_>, m: &Mapping, f: usize, eps: f64) -> bool {
    let probe = Mapping {
        grid: [1; 3],
        f,
        ..m.clone()
    };
    let threads = cx.run.spec.block_threads(cx.run.spec.warp_choices()[0]);
    build(cx.prog, cx.ins, &probe, threads, eps)
        .is_ok_and(|bg| bg.loop_extent().is_some() && padding_stays_out(&bg))
}

/// Loop ranges `f = ceil(extent / t)`, `t` a power-of-two tile of [`LOOP_TILE`], that do not
/// divide `extent`: each iteration walks `ceil(extent / f)` (at most `t`) elements and the
/// last one's tile is masked (4099 → 65 iterations of 64, 9 of 456, …), so a
/// contraction no tile divides (a prime K) is still walked by matrix-sized tiles. Whether
/// the program tolerates the zeros past `extent` (a sum does, an exp does not) is for
/// [`masked_loop_is_exact`] and verification to decide.
fn masked_loop_ranges(extent: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS)
        .map(|i| 1usize << i)
        .skip_while(|&t| t < LOOP_TILE.0)
        .take_while(move |&t| t <= LOOP_TILE.1 && t < extent)
        .map(move |t| extent.div_ceil(t))
        .filter(move |&f| {
            f >= 2 && extent % f != 0 && (LOOP_TILE.0..=LOOP_TILE.1).contains(&extent.div_ceil(f))
        })
}

/// Loop ranges no power of two is that divide `extent` and walk it in power-of-two tiles `t`
/// of [`LOOP_TILE`], at most [`ALIGNED_DIVISOR_TILE_MAX`] wide: `f = extent / t` exactly
/// (5120 = 40 · 128, 12288 = 96 · 128), or `f = extent / t'` with `t' < t` and
/// `(f-1)·t < extent`, walked by [`aligned_loop_tile`] in whole tiles of `t` with the last one
/// masked (3000 = 24 · 125 in 24 tiles of 128). The power-of-two ranges give such extents
/// only tiles no power of two is (5120 in 16 × 320 or 32 × 160; 3000 in 8 × 375), which the
/// printers pad to the next power of two: on an H200 the fused RMSNorm + Linear at K 3000 ran
/// 36.5 µs in 8 × 375 and 27.0 in 12 × 256; the gated MLP 592.6 µs, and 29.9 in 24 × 128.
/// Ranges that do not divide `extent` are [`masked_loop_ranges`]'.
fn aligned_divisor_ranges(extent: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS)
        .map(|i| 1usize << i)
        .skip_while(|&t| t < LOOP_TILE.0)
        .take_while(move |&t| t <= ALIGNED_DIVISOR_TILE_MAX && t < extent)
        .map(move |t| (t, extent.div_ceil(t)))
        .filter(move |&(t, f)| {
            f >= 2 && !f.is_power_of_two() && extent % f == 0 && (f - 1) * t < extent
        })
        .map(|(_, f)| f)
}

/// The power-of-two tile a loop walks instead of `t = ceil(extent / f)`, when one still
/// leaves every iteration a share (`(f-1)·T < extent`): printers pad a tile to a power of two
/// anyway, so the iterations then start on aligned, whole tiles (2000 in 32 iterations: tiles
/// of 64, the last owning 16, rather than 63 at misaligned offsets; 4000 in 32: 128, the last
/// owning 32, rather than 125). The loop is then masked, so only for programs where that is
/// exact (`m.pow2_loop`). None for a power-of-two `t`, or walked dims of different extents.
fn aligned_loop_tile(ins: &[KIn], m: &Mapping) -> Option<usize> {
    if m.f < 2 || !m.pow2_loop {
        return None;
    }
    let split = |k: usize, d: i64| (0..3).any(|a| m.grid[a] > 1 && m.imaps[k][a] == d);
    if (0..ins.len()).any(|k| m.fmaps[k] >= 0 && split(k, m.fmaps[k])) {
        return None; // a masked loop may not walk a grid-split dim
    }
    let mut walked = ins
        .iter()
        .zip(&m.fmaps)
        .filter_map(|(kin, &d)| usize::try_from(d).ok().map(|d| kin.dims[d]));
    let extent = walked.next()?;
    if walked.any(|e| e != extent) {
        return None;
    }
    let t = loop_tile(extent, m.f, true);
    (t != extent.div_ceil(m.f)).then_some(t)
}

/// The tile `f` iterations walk `extent` in: with `pow2`, the power-of-two tile of
/// [`aligned_loop_tile`] where it leaves every iteration a share, else `ceil(extent / f)`.
fn loop_tile(extent: usize, f: usize, pow2: bool) -> usize {
    let t = extent.div_ceil(f.max(1));
    if !pow2 || f < 2 {
        return t;
    }
    let aligned = t.next_power_of_two();
    if (f - 1) * aligned < extent {
        aligned
    } else {
        t
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Ty {
    vg: u64,
    vl: bool,
    pg: u64,
    pl: bool,
}

impl Ty {
    fn partial(&self) -> bool {
        self.pl || self.pg != 0
    }
}

/// Mapping derived from an assignment.
#[derive(Clone)]
struct Mapping {
    grid: [usize; 3],
    f: usize,
    imaps: Vec<[i64; 3]>,
    fmaps: Vec<i64>,
    omaps: Vec<[i64; 3]>,
    /// Per output: the dim carrying partial chunks and the class whose grid parts
    /// multiply it (so `outs` can be recomputed for other sizes of the same pattern).
    chunk_of: Vec<Option<(usize, usize)>>,
    /// Grid classes in axis order.
    axes: Vec<usize>,
    /// Walk the loop in power-of-two tiles ([`aligned_loop_tile`]): GPUs, whose printers pad
    /// every tile to a power of two anyway, for programs whose zeros past a walked extent stay
    /// out of every value ([`masked_loop_is_exact`]).
    pow2_loop: bool,
}

fn bit(c: usize) -> u64 {
    1u64 << c
}

/// Check an assignment and derive the mapping (see the module doc for the rules).
fn derive(
    prog: &BlockProgram,
    ins: &[KIn],
    an: &Analysis,
    asg: &[Assign],
    f: usize,
) -> Option<Mapping> {
    let split = |c: usize| asg[c].parts > 1;
    let loopy = |c: usize| asg[c].loopy;
    // Grid axes in class order.
    let mut axes: Vec<usize> = vec![];
    for (c, a) in asg.iter().enumerate() {
        if a.parts > 1 {
            axes.push(c);
        }
    }
    if axes.len() > 3 {
        return None;
    }
    let mut grid = [1usize; 3];
    for (a, &c) in axes.iter().enumerate() {
        grid[a] = asg[c].parts;
    }
    let present = |t: usize| -> u64 { an.cls[t].iter().flatten().fold(0, |m, &c| m | bit(c)) };
    let loop_mask: u64 = (0..asg.len())
        .filter(|&c| loopy(c))
        .fold(0, |m, c| m | bit(c));
    let grid_mask: u64 = axes.iter().fold(0, |m, &c| m | bit(c));
    let chunk_mask: u64 = (0..an.classes.len())
        .filter(|&c| an.classes[c].chunk.is_some())
        .fold(0, |m, c| m | bit(c));
    let mut ty: Vec<Ty> = vec![Ty::default(); prog.tiles.len()];
    let mut imaps = vec![];
    let mut fmaps = vec![];
    for (k, kin) in ins.iter().enumerate() {
        let mut imap = [-1i64; 3];
        let mut fmap = -1i64;
        let mut seen = 0u64;
        for (j, c) in an.cls[k].iter().enumerate() {
            let Some(c) = *c else { continue };
            if seen & bit(c) != 0 && (split(c) || loopy(c)) {
                return None;
            }
            seen |= bit(c);
            if let Some(a) = axes.iter().position(|&x| x == c) {
                imap[a] = j as i64;
            }
            if loopy(c) {
                if fmap >= 0 {
                    return None;
                }
                fmap = j as i64;
            }
        }
        ty[k] = Ty {
            vg: seen & grid_mask,
            vl: seen & loop_mask != 0,
            pg: 0,
            pl: kin.chunks.is_some(),
        };
        imaps.push(imap);
        fmaps.push(fmap);
    }
    let is_input = |t: usize| t < prog.n_inputs;
    for (i, op) in prog.ops.iter().enumerate().skip(prog.n_inputs) {
        // Accumulators read loop-body tiles; every other after-loop op reads after-loop
        // tiles or inputs, which must then be loaded once.
        let after = prog.tiles[i].after && !matches!(op, BOp::Accum(..));
        for a in op.operands() {
            if after && is_input(a) && ty[a].vl {
                return None; // read after the loop, so it must be loaded once
            }
        }
        let contracted = an.contracted_by[i];
        let newp = |ty: &mut Ty| {
            if let Some(c) = contracted {
                if loopy(c) {
                    ty.pl = true;
                }
                if split(c) {
                    ty.pg |= bit(c);
                }
            }
        };
        // Product-like combination: at most one partial operand, and the other must not
        // vary along what the partial one still sums over.
        let product = |x: Ty, y: Ty| -> Option<Ty> {
            if x.partial() && y.partial() {
                return None;
            }
            let (p, o) = if x.partial() { (x, y) } else { (y, x) };
            if (p.pl && o.vl) || (p.pg & o.vg != 0) {
                return None;
            }
            Some(Ty {
                vg: x.vg | y.vg,
                vl: x.vl || y.vl,
                pg: x.pg | y.pg,
                pl: x.pl || y.pl,
            })
        };
        let t = match *op {
            BOp::Input(_) => continue,
            BOp::Matmul(a, b) => {
                let mut t = product(ty[a], ty[b])?;
                newp(&mut t);
                t
            }
            BOp::Unary(u, x) => {
                let linear = matches!(u, UnaryOp::Neg | UnaryOp::MulScalar(_));
                if !linear && ty[x].partial() {
                    return None;
                }
                ty[x]
            }
            BOp::Binary(bop, a, b) => match bop {
                BinaryOp::Add | BinaryOp::Sub => {
                    let (x, y) = (ty[a], ty[b]);
                    if x.pl != y.pl || x.pg != y.pg {
                        return None;
                    }
                    Ty {
                        vg: x.vg | y.vg,
                        vl: x.vl || y.vl,
                        pg: x.pg,
                        pl: x.pl,
                    }
                }
                BinaryOp::Mul => product(ty[a], ty[b])?,
                BinaryOp::Div => {
                    if ty[b].partial() {
                        return None;
                    }
                    product(ty[a], ty[b])?
                }
                BinaryOp::Pow => {
                    if ty[a].partial() || ty[b].partial() {
                        return None;
                    }
                    product(ty[a], ty[b])?
                }
            },
            BOp::Reduction(x, _) => {
                let mut t = ty[x];
                newp(&mut t);
                t
            }
            BOp::RmsNorm(x) => {
                if ty[x].partial() {
                    return None;
                }
                ty[x]
            }
            BOp::Accum(x, kind) => {
                let tx = ty[x];
                let loops_present = present(x) & loop_mask;
                if f > 1 && !tx.vl {
                    return None; // accumulating a loop invariant F times
                }
                let mut t = Ty {
                    vg: tx.vg,
                    vl: false,
                    pg: tx.pg,
                    pl: false,
                };
                match kind {
                    AccumKind::Iter => {
                        if f > 1 && (!tx.pl || loops_present & !chunk_mask != 0) {
                            return None;
                        }
                    }
                    AccumKind::Sum | AccumKind::SumToDimx => {
                        let c = contracted;
                        let cm = c.map_or(0, bit);
                        if loops_present & !cm != 0 {
                            return None;
                        }
                        if f > 1 && !tx.pl && !c.is_some_and(loopy) {
                            return None;
                        }
                        newp(&mut t);
                        t.pl = false;
                    }
                    AccumKind::Rms { .. } => {
                        let cm = contracted.map_or(0, bit);
                        if tx.partial() || loops_present & !cm != 0 {
                            return None;
                        }
                    }
                }
                t
            }
        };
        ty[i] = t;
    }
    // Outputs.
    let mut omaps = vec![];
    let mut chunk_of = vec![];
    for &o in &prog.outputs {
        let t = ty[o];
        if t.pl || t.pg.count_ones() > 1 {
            return None;
        }
        let mut omap = [-1i64; 3];
        let mut used = 0u64;
        for (a, &c) in axes.iter().enumerate() {
            if let Some(j) = an.cls[o].iter().position(|&x| x == Some(c)) {
                omap[a] = j as i64;
                used |= bit(j);
            } else if t.pg & bit(c) == 0 {
                return None; // every block of this axis would write the same tile
            }
        }
        let dims = &prog.tiles[o].dims;
        let mut co = None;
        if t.pg != 0 {
            let c = t.pg.trailing_zeros() as usize;
            let a = axes.iter().position(|&x| x == c)?;
            let j = (0..dims.len())
                .rev()
                .find(|&j| used & bit(j) == 0 && an.cls[o][j].is_none_or(|x| !split(x)))?;
            omap[a] = j as i64;
            co = Some((j, c));
        }
        omaps.push(omap);
        chunk_of.push(co);
    }
    Some(Mapping {
        grid,
        f,
        imaps,
        fmaps,
        omaps,
        chunk_of,
        axes,
        pow2_loop: false,
    })
}

fn build(
    prog: &BlockProgram,
    ins: &[KIn],
    m: &Mapping,
    threads: u32,
    eps: f64,
) -> crate::Result<BlockGraph> {
    let g = m.grid.map(|x| x as i64);
    let mut bg = BlockGraph::new(g, [threads as i64, 1, 1], m.f as i64, 1)?;
    if let Some(t) = aligned_loop_tile(ins, m) {
        bg.set_loop_tile(t as i64)?;
    }
    for (k, kin) in ins.iter().enumerate() {
        let dims: Vec<i64> = kin.dims.iter().map(|&d| d as i64).collect();
        bg.new_input(&dims, kin.dtype, m.imaps[k], m.fmaps[k])?;
    }
    for op in &prog.ops[prog.n_inputs..] {
        match *op {
            BOp::Input(_) => {}
            BOp::Matmul(a, b) => {
                bg.matmul(a, b)?;
            }
            BOp::Unary(u, x) => {
                bg.unary(u, x)?;
            }
            BOp::Binary(b, x, y) => {
                bg.binary(b, x, y)?;
            }
            BOp::Reduction(x, d) => {
                bg.reduction(x, d as i64)?;
            }
            BOp::RmsNorm(x) => {
                bg.rms_norm(x, eps)?;
            }
            BOp::Accum(x, kind) => {
                bg.forloop_accum(x, kind)?;
            }
        }
    }
    for (o, omap) in prog.outputs.iter().zip(&m.omaps) {
        bg.new_output(*o, *omap)?;
    }
    Ok(bg)
}

fn warps_for(run: &Run, bg: &BlockGraph) -> u32 {
    let choices = run.spec.warp_choices();
    let biggest = bg
        .ops()
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, crate::block_graph::BlockOpKind::Matmul { .. }))
        .map(|(i, _)| crate::shape::numel(&bg.tiles()[i].dims))
        .max()
        .unwrap_or(0);
    let want = if biggest >= 64 * 64 { 8 } else { 4 };
    if choices.contains(&want) {
        want
    } else {
        choices[0]
    }
}

/// Pattern kinds of a class (sizes chosen later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Whole,
    Grid,
    Loop,
    GridLoop,
}

fn pattern_kinds(c: &ClassInfo, max_blocks: usize, gpu: bool, masks: bool) -> Vec<Kind> {
    if c.chunk.is_some() {
        return vec![Kind::Loop];
    }
    if c.needs_whole {
        return vec![Kind::Whole];
    }
    let min_tile = if c.matrix { MIN_MATRIX_TILE } else { 1 };
    let grid_ok = !c.no_grid
        && !grid_parts(
            c.extent,
            max_blocks,
            min_tile,
            gpu,
            masks && !c.contracted,
            !c.contiguous,
        )
        .is_empty();
    let loop_ok = c.contracted && c.extent >= 2 * LOOP_TILE.0;
    let mut v = vec![Kind::Whole];
    if grid_ok {
        v.push(Kind::Grid);
    }
    if loop_ok {
        v.push(Kind::Loop);
    }
    if grid_ok && loop_ok && c.extent >= 4 * LOOP_TILE.0 {
        v.push(Kind::GridLoop);
    }
    v
}

/// A valid size choice of a pattern with its estimated cost.
struct Sized {
    asg: Vec<Assign>,
    f: usize,
    est_us: f64,
}

/// Tile dims of every tile of `prog` under assignment `asg` with `f` iterations (`pow2`: a
/// masked loop's tiles are [`loop_tile`]'s power of two).
fn tile_dims(
    prog: &BlockProgram,
    an: &Analysis,
    asg: &[Assign],
    f: usize,
    pow2: bool,
) -> Vec<Dims> {
    an.cls
        .iter()
        .zip(&prog.tiles)
        .map(|(row, t)| {
            row.iter()
                .zip(&t.dims)
                .map(|(c, &d)| match c {
                    None => d,
                    Some(c) => {
                        let info = &an.classes[*c];
                        if info.chunk.is_some() {
                            info.extent
                        } else {
                            let a = asg[*c];
                            let block = info.extent.div_ceil(a.parts);
                            if a.loopy {
                                // a masked loop may not walk a grid-split dim
                                loop_tile(block, f, pow2 && a.parts == 1)
                            } else {
                                block
                            }
                        }
                    }
                })
                .collect()
        })
        .collect()
}

/// Analytic estimate (cost, shared memory) of one sizing, through the same
/// [`profile_of`]/[`smem_of`] as the exact cost of a built graph.
/// What the size estimates of one program need.
struct Ctx<'a> {
    run: &'a Run,
    prog: &'a BlockProgram,
    ins: &'a [KIn],
    an: &'a Analysis,
    low: bool,
}

fn estimate(cx: &Ctx<'_>, m: &Mapping, asg: &[Assign], f: usize) -> (f64, u64, OutSig) {
    let (run, prog, ins, an, low) = (cx.run, cx.prog, cx.ins, cx.an, cx.low);
    let dims = tile_dims(prog, an, asg, f, m.pow2_loop);
    let descs: Vec<TileDesc> = prog
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let kind = match op {
                BOp::Input(k) => TileKind::Input {
                    kernel_numel: crate::shape::numel(&ins[*k].dims),
                    elem_bytes: ins[*k].elem_bytes,
                    walks_loop: f > 1 && m.fmaps[*k] >= 0,
                },
                BOp::Matmul(..) => TileKind::Matmul,
                BOp::Unary(u, _) => TileKind::Elementwise {
                    weight: if matches!(
                        u,
                        UnaryOp::Exp
                            | UnaryOp::Silu
                            | UnaryOp::Gelu
                            | UnaryOp::Sigmoid
                            | UnaryOp::Tanh
                    ) {
                        4.0
                    } else {
                        1.0
                    },
                },
                BOp::Binary(..) => TileKind::Elementwise { weight: 1.0 },
                BOp::Reduction(..) => TileKind::Reduce { accumulator: false },
                BOp::Accum(..) => TileKind::Reduce { accumulator: true },
                BOp::RmsNorm(_) => TileKind::RmsNorm,
            };
            TileDesc {
                kind,
                operands: op.operands(),
                dims: dims[i].clone(),
                in_loop: !prog.tiles[i].after || matches!(op, BOp::Accum(..)),
            }
        })
        .collect();
    let outs: OutSig = prog
        .outputs
        .iter()
        .enumerate()
        .map(|(k, &o)| {
            let mut d = prog.tiles[o].dims.clone();
            let mut ch = None;
            if let Some((j, c)) = m.chunk_of[k] {
                d[j] *= asg[c].parts;
                ch = Some((j, asg[c].parts));
            }
            (d, ch)
        })
        .collect();
    let writes: Vec<f64> = outs
        .iter()
        .map(|(d, _)| (crate::shape::numel(d) * INTERMEDIATE_BYTES) as f64)
        .collect();
    let blocks: usize = asg.iter().map(|a| a.parts).product();
    let prof = profile_of(&descs, blocks as u64, f as u32, &writes, low);
    (
        kernel_cost(&run.spec, &prof).total_us,
        smem_of(&descs, &prog.outputs),
        outs,
    )
}

/// Whether every block the kernel loads (inputs) or stores (outputs, `outs`) obeys the
/// device's tiling rule ([`crate::cost::DeviceSpec::block_legal`]); outputs are checked at
/// the inputs' narrowest element width, since a graph output keeps the graph's dtype.
fn blocks_legal(cx: &Ctx<'_>, m: &Mapping, asg: &[Assign], f: usize, outs: &OutSig) -> bool {
    let spec = &cx.run.spec;
    if spec.tiling.is_none() {
        return true;
    }
    let dims = tile_dims(cx.prog, cx.an, asg, f, m.pow2_loop);
    let ins_ok = cx
        .ins
        .iter()
        .enumerate()
        .all(|(k, kin)| spec.block_legal(&dims[k], &kin.dims, kin.elem_bytes));
    let narrowest = cx
        .ins
        .iter()
        .map(|k| k.elem_bytes)
        .min()
        .unwrap_or(INTERMEDIATE_BYTES)
        .min(INTERMEDIATE_BYTES);
    ins_ok
        && cx
            .prog
            .outputs
            .iter()
            .zip(outs)
            .all(|(&o, (full, _))| spec.block_legal(&dims[o], full, narrowest))
}

/// Concretise `prog` over `ins`: groups of built, costed block graphs, best first.
///
/// Split patterns (whole / grid / loop / grid+loop per class) are type-checked once each;
/// sizes (grid parts, for-loop range) are then enumerated only for valid patterns and
/// ranked with an analytic estimate; the best few per output group are built through the
/// validating builder and costed exactly.
pub fn concretise(run: &Run, prog: &BlockProgram, ins: &[KIn], eps: f64) -> Vec<Group> {
    let Some(an) = analyse(prog, ins) else {
        return vec![];
    };
    let Some(class_labels) = class_labels(prog, &an) else {
        run.count_mixed();
        return vec![];
    };
    let gpu = run.spec.is_streaming_gpu();
    // masked edge tiles along the grid: GPUs and CPUs (a tile machine's blocks must obey
    // its tiling rule, which a partial block rarely does)
    let masks = gpu || run.spec.is_cpu();
    // a GPU runs its blocks in waves: prefill-sized grids (attention over 4096 query rows
    // in 128-row tiles for 32 heads is 1024 blocks) need several waves' worth
    let max_blocks = (run.spec.compute_units as usize * if gpu { 16 } else { 4 }).max(1);
    let low = ins.first().is_some_and(|k| k.dtype != DType::F32);
    let in_bytes: Vec<usize> = ins.iter().map(|k| k.elem_bytes).collect();
    let out_bytes = vec![INTERMEDIATE_BYTES; prog.outputs.len()];
    let chunk_f: Vec<usize> = an.classes.iter().filter_map(|c| c.chunk).collect();
    if chunk_f.windows(2).any(|w| w[0] != w[1]) {
        return vec![];
    }
    let kinds: Vec<Vec<Kind>> = an
        .classes
        .iter()
        .map(|c| pattern_kinds(c, max_blocks, gpu, masks))
        .collect();
    let patterns = first_patterns(&kinds, run.cfg.max_concretisations);
    let loop_rules = LoopRules::of(prog, &an);
    // Best sizings per output group: (group outs, pattern index, sizing).
    let mut per_group: Vec<(OutSig, Vec<(usize, Sized)>)> = vec![];
    let cx = Ctx {
        run,
        prog,
        ins,
        an: &an,
        low,
    };
    let mut mappings: Vec<Mapping> = vec![];
    let mut budget = run.cfg.max_concretisations;
    for pat in &patterns {
        if run.stopped() {
            break;
        }
        run.count_concretisation();
        let any_loop = pat.iter().any(|k| matches!(k, Kind::Loop | Kind::GridLoop));
        if walks_apart(pat, &class_labels) {
            run.count_mixed();
            continue;
        }
        if !loop_rules.allow(pat) {
            continue;
        }
        let rep_f = chunk_f.first().copied().unwrap_or(2);
        let Some(mut m) = derive_pattern(prog, ins, &an, pat, rep_f) else {
            continue;
        };
        let pi = mappings.len();
        // Sizes: the loop range, then grid parts class by class.
        // Masked loop ranges of the walked classes, offered only where the padding stays out.
        let masked: Vec<usize> = if any_loop && chunk_f.is_empty() {
            pat.iter()
                .enumerate()
                .filter(|(_, k)| **k == Kind::Loop)
                .flat_map(|(c, _)| masked_loop_ranges(an.classes[c].extent))
                .collect()
        } else {
            vec![]
        };
        let masked_ok = masked
            .first()
            .is_some_and(|&f| masked_loop_is_exact(&cx, &m, f, eps));
        m.pow2_loop = gpu && masked_ok;
        let fs: Vec<usize> = if !any_loop {
            vec![1]
        } else if let Some(&s) = chunk_f.first() {
            vec![s]
        } else {
            let mut fs: Vec<usize> = (1..=12).map(|i| 1usize << i).collect();
            if gpu {
                // power-of-two tiles for extents the power-of-two ranges walk in others; a
                // masked one only where the program tolerates the padding
                for (c, _) in pat.iter().enumerate().filter(|(_, k)| **k == Kind::Loop) {
                    let e = an.classes[c].extent;
                    fs.extend(
                        aligned_divisor_ranges(e)
                            .filter(|&f| m.pow2_loop || (e / f).is_power_of_two()),
                    );
                }
            }
            if masked_ok {
                fs.extend(&masked);
            }
            fs.sort_unstable();
            fs.dedup();
            fs
        };
        for f in fs {
            let mut opts: Vec<Vec<Assign>> = vec![];
            for (c, k) in pat.iter().enumerate() {
                let info = &an.classes[c];
                let min_tile = if info.matrix { MIN_MATRIX_TILE } else { 1 };
                let free = !info.contracted;
                let loop_ok = |tile: usize| {
                    info.chunk.is_some() || (LOOP_TILE.0..=LOOP_TILE.1).contains(&tile)
                };
                let o: Vec<Assign> = match k {
                    Kind::Whole => vec![Assign {
                        parts: 1,
                        loopy: false,
                    }],
                    Kind::Loop => {
                        if info.chunk.is_some()
                            || (info.extent % f == 0 && loop_ok(info.extent / f))
                            || (masked_ok && masked_loop_ranges(info.extent).any(|m| m == f))
                        {
                            vec![Assign {
                                parts: 1,
                                loopy: true,
                            }]
                        } else {
                            vec![]
                        }
                    }
                    Kind::Grid => grid_parts(
                        info.extent,
                        max_blocks,
                        min_tile,
                        gpu,
                        masks && free,
                        !info.contiguous,
                    )
                    .into_iter()
                    .map(|p| Assign {
                        parts: p,
                        loopy: false,
                    })
                    .collect(),
                    Kind::GridLoop => grid_parts(info.extent, max_blocks, 1, gpu, false, false)
                        .into_iter()
                        .filter(|&p| info.extent % (p * f) == 0 && loop_ok(info.extent / (p * f)))
                        .map(|p| Assign {
                            parts: p,
                            loopy: true,
                        })
                        .collect(),
                };
                opts.push(o);
            }
            if opts.iter().any(|o| o.is_empty()) {
                continue;
            }
            let mut asg = vec![
                Assign {
                    parts: 1,
                    loopy: false
                };
                an.classes.len()
            ];
            let mut leaf = |asg: &[Assign]| {
                if budget == 0 {
                    return false;
                }
                budget -= 1;
                let (est, smem, outs) = estimate(&cx, &m, asg, f);
                if !blocks_legal(&cx, &m, asg, f, &outs) {
                    return true;
                }
                if smem > run.spec.shared_mem_per_block {
                    run.count_smem_reject();
                    return true;
                }
                let sized = Sized {
                    asg: asg.to_vec(),
                    f,
                    est_us: est,
                };
                match per_group.iter_mut().find(|g| g.0 == outs) {
                    Some(g) => {
                        g.1.push((pi, sized));
                        if g.1.len() > 4 * KEEP_PER_GROUP {
                            g.1.sort_by(|a, b| a.1.est_us.total_cmp(&b.1.est_us));
                            g.1.truncate(KEEP_PER_GROUP);
                        }
                    }
                    None => per_group.push((outs, vec![(pi, sized)])),
                }
                true
            };
            if !assign_rec(&opts, 0, 1, max_blocks, &mut asg, &mut leaf) {
                break;
            }
        }
        mappings.push(m);
    }
    // Build the best sizings of each group.
    let mut groups: Vec<Group> = vec![];
    for (outs, mut cands) in per_group {
        cands.sort_by(|a, b| a.1.est_us.total_cmp(&b.1.est_us));
        cands.truncate(KEEP_PER_GROUP);
        let mut concretes = vec![];
        for (pi, sz) in cands {
            let base = &mappings[pi];
            let mut grid = [1usize; 3];
            for (a, &c) in base.axes.iter().enumerate() {
                grid[a] = sz.asg[c].parts;
            }
            let m = Mapping {
                grid,
                f: sz.f,
                imaps: base.imaps.clone(),
                fmaps: base.fmaps.clone(),
                omaps: base.omaps.clone(),
                chunk_of: base.chunk_of.clone(),
                axes: base.axes.clone(),
                pow2_loop: base.pow2_loop,
            };
            let threads0 = run.spec.block_threads(run.spec.warp_choices()[0]);
            let Ok(bg0) = build(prog, ins, &m, threads0, eps) else {
                continue;
            };
            let warps = warps_for(run, &bg0);
            let bg = if run.spec.block_threads(warps) == threads0 {
                bg0
            } else {
                match build(prog, ins, &m, run.spec.block_threads(warps), eps) {
                    Ok(b) => b,
                    Err(_) => continue,
                }
            };
            if smem_bytes(&bg) > run.spec.shared_mem_per_block
                || bg.output_dims() != outs.iter().map(|o| o.0.clone()).collect::<Vec<_>>()
            {
                continue;
            }
            let cost =
                kernel_cost(&run.spec, &block_profile(&bg, &in_bytes, &out_bytes, low)).total_us;
            concretes.push(Arc::new(Concrete {
                graph: bg,
                cost_us: cost,
            }));
        }
        if !concretes.is_empty() {
            concretes.sort_by(|a, b| a.cost_us.total_cmp(&b.cost_us));
            groups.push(Group { outs, concretes });
        }
    }
    groups
}

/// The label of every class of `an` ([`Labels`]): the tiles' labels, met over the classes
/// the program's ops form. None when a class links dims the target keeps apart, a link the
/// labels carried forward op by op may not have seen (two unlabelled dims joined first).
fn class_labels(prog: &BlockProgram, an: &Analysis) -> Option<Labels> {
    let mut out: Labels = vec![None; an.classes.len()];
    for (row, tile) in an.cls.iter().zip(&prog.tiles) {
        for (c, &l) in row.iter().zip(&tile.labels) {
            if let Some(c) = *c {
                out[c] = dims::meet(out[c], l)?;
            }
        }
    }
    Some(out)
}

/// Does the for-loop of `pat` walk classes of different labels in step? (The loop links
/// every dim it walks.)
fn walks_apart(pat: &[Kind], labels: &[Option<usize>]) -> bool {
    let mut walked = None;
    for (k, &l) in pat.iter().zip(labels) {
        if matches!(k, Kind::Loop | Kind::GridLoop) {
            match dims::meet(walked, l) {
                Some(w) => walked = w,
                None => return true,
            }
        }
    }
    false
}

/// [`derive`] for a pattern's representative sizes: 2 parts per grid class, `rep_f`
/// iterations when it has a loop (the mapping does not depend on the sizes).
fn derive_pattern(
    prog: &BlockProgram,
    ins: &[KIn],
    an: &Analysis,
    pat: &[Kind],
    rep_f: usize,
) -> Option<Mapping> {
    let rep: Vec<Assign> = pat
        .iter()
        .map(|k| Assign {
            parts: if matches!(k, Kind::Grid | Kind::GridLoop) {
                2
            } else {
                1
            },
            loopy: matches!(k, Kind::Loop | Kind::GridLoop),
        })
        .collect();
    let any_loop = rep.iter().any(|a| a.loopy);
    derive(prog, ins, an, &rep, if any_loop { rep_f } else { 1 })
}

/// The first `max` patterns (a kind per class, at most 3 grid axes) in lexicographic order,
/// the first class most significant; built depth first, so no prefix beyond them is made.
fn first_patterns(kinds: &[Vec<Kind>], max: usize) -> Vec<Vec<Kind>> {
    fn rec(
        kinds: &[Vec<Kind>],
        grids: usize,
        cur: &mut Vec<Kind>,
        max: usize,
        out: &mut Vec<Vec<Kind>>,
    ) {
        if out.len() >= max {
            return;
        }
        let Some(ks) = kinds.get(cur.len()) else {
            out.push(cur.clone());
            return;
        };
        for &k in ks {
            let g = grids + usize::from(matches!(k, Kind::Grid | Kind::GridLoop));
            if g > 3 {
                continue;
            }
            cur.push(k);
            rec(kinds, g, cur, max, out);
            cur.pop();
        }
    }
    let mut out = vec![];
    rec(
        kinds,
        0,
        &mut Vec::with_capacity(kinds.len()),
        max,
        &mut out,
    );
    out
}

/// Two of [`derive`]'s rules on the loop, as class masks checked before it runs (most
/// patterns of wide programs fail them, and `derive` builds a mapping before it finds out):
/// with a loop, every accumulator must take a tile that varies with it, and an input an
/// after-loop op reads must not vary with it.
struct LoopRules {
    /// Per accumulator: the classes of the inputs its operand is computed from.
    accumulated: Vec<u64>,
    /// The classes of the inputs that after-loop ops (other than accumulators) read.
    read_after: u64,
}

impl LoopRules {
    fn of(prog: &BlockProgram, an: &Analysis) -> LoopRules {
        let mut from: Vec<u64> = vec![0; prog.tiles.len()];
        let mut rules = LoopRules {
            accumulated: vec![],
            read_after: 0,
        };
        for (i, op) in prog.ops.iter().enumerate() {
            if i < prog.n_inputs {
                from[i] = an.cls[i].iter().flatten().fold(0, |m, &c| m | bit(c));
                continue;
            }
            if let BOp::Accum(x, _) = op {
                rules.accumulated.push(from[*x]);
                continue;
            }
            for a in op.operands() {
                from[i] |= from[a];
                if prog.tiles[i].after && a < prog.n_inputs {
                    rules.read_after |= from[a];
                }
            }
        }
        rules
    }

    fn allow(&self, pat: &[Kind]) -> bool {
        let walked = pat
            .iter()
            .enumerate()
            .filter(|(_, k)| matches!(k, Kind::Loop | Kind::GridLoop))
            .fold(0u64, |m, (c, _)| m | bit(c));
        walked == 0
            || (self.accumulated.iter().all(|&a| a & walked != 0) && self.read_after & walked == 0)
    }
}

/// Enumerate assignments class by class; returns false to stop.
fn assign_rec(
    opts: &[Vec<Assign>],
    c: usize,
    blocks: usize,
    max_blocks: usize,
    asg: &mut Vec<Assign>,
    leaf: &mut dyn FnMut(&[Assign]) -> bool,
) -> bool {
    if c == opts.len() {
        return leaf(asg);
    }
    for &o in &opts[c] {
        let b = blocks * o.parts;
        if b > max_blocks {
            continue;
        }
        asg[c] = o;
        if !assign_rec(opts, c + 1, b, max_blocks, asg, leaf) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::expr::AbsVal;

    fn tile(dims: &[usize], after: bool, chunks: bool) -> crate::search::block::BTile {
        crate::search::block::BTile {
            abs: AbsVal::Unknown(0),
            dims: dims.to_vec(),
            after,
            summable: chunks,
            labels: vec![None; dims.len()],
            partial: chunks,
        }
    }

    fn input(dims: &[usize], chunks: Option<(usize, usize)>) -> KIn {
        let value_dims = match chunks {
            Some((d, s)) => {
                let mut v = dims.to_vec();
                v[d] /= s;
                v
            }
            None => dims.to_vec(),
        };
        KIn {
            abs: AbsVal::Unknown(0),
            dims: dims.to_vec(),
            value_dims,
            chunks,
            dtype: DType::F16,
            elem_bytes: 2,
            labels: vec![None; dims.len()],
        }
    }

    /// Every pattern [`LoopRules`] refuses, `derive` refuses too (the rules only save it the
    /// work), over programs with loops, after-loop reads and partial-chunk inputs.
    #[test]
    fn loop_rules_refuse_only_what_derive_refuses() {
        use BOp::*;
        // attention: Q[2,64,32] Kt[2,32,128] V[2,128,32]; exp(Q·Kt)·V and its row sums
        // accumulated, divided after the loop; and a variant reading V after the loop
        let att_tiles = vec![
            tile(&[2, 64, 32], false, false),
            tile(&[2, 32, 128], false, false),
            tile(&[2, 128, 32], false, false),
            tile(&[2, 64, 128], false, false),
            tile(&[2, 64, 128], false, false),
            tile(&[2, 64, 32], false, false),
            tile(&[2, 64, 32], true, false),
            tile(&[2, 64, 1], true, false),
            tile(&[2, 64, 32], true, false),
        ];
        let attention = BlockProgram {
            ops: vec![
                Input(0),
                Input(1),
                Input(2),
                Matmul(0, 1),
                Unary(UnaryOp::Exp, 3),
                Matmul(4, 2),
                Accum(5, AccumKind::Iter),
                Accum(4, AccumKind::Sum),
                Binary(BinaryOp::Div, 6, 7),
            ],
            tiles: att_tiles,
            outputs: vec![8],
            n_inputs: 3,
        };
        let att_ins = vec![
            input(&[2, 64, 32], None),
            input(&[2, 32, 128], None),
            input(&[2, 128, 32], None),
        ];
        // partial chunks [2,64,4·32] summed by an iteration accumulator, scaled after it by
        // an input read after the loop
        let chunked = BlockProgram {
            ops: vec![
                Input(0),
                Input(1),
                Accum(0, AccumKind::Iter),
                Binary(BinaryOp::Mul, 2, 1),
            ],
            tiles: vec![
                tile(&[2, 64, 32], false, true),
                tile(&[2, 64, 32], false, false),
                tile(&[2, 64, 32], true, false),
                tile(&[2, 64, 32], true, false),
            ],
            outputs: vec![3],
            n_inputs: 2,
        };
        let chunk_ins = vec![
            input(&[2, 64, 128], Some((2, 4))),
            input(&[2, 64, 32], None),
        ];
        let mut refused = 0;
        let mut allowed = 0;
        for (prog, ins) in [(&attention, &att_ins), (&chunked, &chunk_ins)] {
            let an = analyse(prog, ins).expect("analysable");
            let kinds: Vec<Vec<Kind>> = an
                .classes
                .iter()
                .map(|c| pattern_kinds(c, 528, true, true))
                .collect();
            let rules = LoopRules::of(prog, &an);
            let rep_f = an.classes.iter().find_map(|c| c.chunk).unwrap_or(2);
            for pat in first_patterns(&kinds, 100_000) {
                let derived = derive_pattern(prog, ins, &an, &pat, rep_f);
                if rules.allow(&pat) {
                    allowed += 1;
                } else {
                    refused += 1;
                    assert!(derived.is_none(), "{pat:?} refused but derivable");
                }
            }
        }
        assert!(
            refused > 0 && allowed > 0,
            "{refused} refused, {allowed} allowed"
        );
    }

    #[test]
    fn first_patterns_are_the_lexicographic_prefix() {
        let kinds = vec![
            vec![Kind::Whole, Kind::Grid],
            vec![Kind::Whole, Kind::Grid, Kind::Loop],
            vec![Kind::Grid, Kind::GridLoop],
            vec![Kind::Grid, Kind::Whole],
        ];
        let all = first_patterns(&kinds, usize::MAX);
        // every combination with at most 3 grid axes, in order
        let mut expected = vec![];
        for a in &kinds[0] {
            for b in &kinds[1] {
                for c in &kinds[2] {
                    for d in &kinds[3] {
                        let p = vec![*a, *b, *c, *d];
                        let grids = p
                            .iter()
                            .filter(|k| matches!(k, Kind::Grid | Kind::GridLoop))
                            .count();
                        if grids <= 3 {
                            expected.push(p);
                        }
                    }
                }
            }
        }
        assert_eq!(all, expected);
        assert_eq!(first_patterns(&kinds, 5), expected[..5].to_vec());
    }

    #[test]
    fn gpu_loops_walk_power_of_two_tiles_where_every_iteration_keeps_a_share() {
        assert_eq!(loop_tile(2000, 32, true), 64); // not 63: the last owns 16
        assert_eq!(loop_tile(4000, 32, true), 128); // not 125: the last owns 32
        assert_eq!(loop_tile(4096, 32, true), 128);
        assert_eq!(loop_tile(6000, 16, true), 375); // 512 would leave the 13th to 16th empty
        assert_eq!(loop_tile(2000, 32, false), 63);
        assert_eq!(loop_tile(2000, 1, true), 2000);
    }

    #[test]
    fn masked_loop_ranges_walk_a_prime_extent_in_matrix_sized_tiles() {
        let f: Vec<usize> = masked_loop_ranges(4099).collect();
        assert_eq!(f, vec![257, 129, 65, 33, 17, 9]);
        for &f in &f {
            let t = 4099usize.div_ceil(f);
            assert!(
                (16..=512).contains(&t) && (f - 1) * t < 4099 && 4099 % f != 0,
                "{f}: {t}"
            );
        }
        // a range that divides the extent is no masked range (4000 = 8 · 500)
        assert!(!masked_loop_ranges(4000).any(|f| 4000 % f == 0));
        assert_eq!(masked_loop_ranges(4096).count(), 0);
        // 40: 3 iterations would walk tiles of 14, below the loop tile
        assert_eq!(masked_loop_ranges(40).count(), 0);
    }

    #[test]
    fn divisor_ranges_walk_power_of_two_tiles() {
        let f: Vec<usize> = aligned_divisor_ranges(3000).collect();
        assert_eq!(f, vec![24]); // 24 tiles of 128, the last owning 56, instead of 125
        assert_eq!(loop_tile(3000, 24, true), 128);
        // exact tiles: 5120 = 320 · 16 = 160 · 32 = 80 · 64 = 40 · 128, 12288 = 96 · 128
        assert_eq!(
            aligned_divisor_ranges(5120).collect::<Vec<_>>(),
            vec![320, 160, 80, 40]
        );
        assert!(aligned_divisor_ranges(12288).any(|f| f == 96));
        // the power-of-two ranges already walk 4096 in every such tile
        assert_eq!(aligned_divisor_ranges(4096).count(), 0);
        // 6000 = 48 · 125: 48 tiles of 128 would leave the last one without a share; 375 · 16
        assert_eq!(aligned_divisor_ranges(6000).collect::<Vec<_>>(), vec![375]);
        for e in [1500, 3000, 4000, 5120, 6000, 12288] {
            for f in aligned_divisor_ranges(e) {
                let t = loop_tile(e, f, true);
                assert!(e % f == 0 && !f.is_power_of_two(), "{e}: {f}");
                assert!(
                    t.is_power_of_two() && t <= ALIGNED_DIVISOR_TILE_MAX,
                    "{e}: {f}"
                );
                assert!((f - 1) * t < e && e <= f * t, "{e}: {f} x {t}");
            }
        }
    }

    #[test]
    fn masked_parts_leave_power_of_two_tiles() {
        // 5000 = 625·8: no matrix-sized power-of-two tile divides it
        let p: Vec<usize> = masked_parts(5000, 528, 16).collect();
        assert_eq!(p, vec![313, 157, 79]); // tiles of 16, 32, 64 (40 blocks would get 125)
        for &p in &p {
            let t = 5000usize.div_ceil(p);
            assert!(
                t.is_power_of_two() && t >= 16 && (p - 1) * t < 5000,
                "{p}: {t}"
            );
        }
        // 40 rows: 3 blocks would get tiles of 14, below the matrix tile
        assert_eq!(masked_parts(40, 528, 16).count(), 0);
        // a dim no tensor is contiguous along also gets blocks just under a matrix tile
        let rows: Vec<usize> = masked_row_parts(4099, 528, 16).collect();
        assert_eq!(rows, vec![33]); // 125 rows (257, 129, 65 blocks get power-of-two tiles)
        assert!(grid_parts(4099, 528, 16, true, true, true).contains(&33));
        assert!(!grid_parts(4099, 528, 16, true, true, false).contains(&33));
        assert_eq!(masked_parts(300, 528, 16).collect::<Vec<_>>(), vec![19]);
        // only free classes get them, on GPUs and CPUs alike
        assert!(grid_parts(5000, 528, 16, true, true, false).contains(&313));
        assert!(!grid_parts(5000, 528, 16, true, false, false).contains(&313));
        // CPUs: power-of-two counts, the last block partial
        assert_eq!(
            grid_parts(6151, 64, 16, false, false, false),
            Vec::<usize>::new()
        );
        assert_eq!(
            grid_parts(6151, 64, 16, false, true, false),
            vec![2, 4, 8, 16, 32, 64]
        );
        assert_eq!(grid_parts(40, 64, 16, false, true, false), vec![2]);
        assert_eq!(
            grid_parts(4096, 528, 16, true, true, false),
            grid_parts(4096, 528, 16, true, false, false)
        );
    }
}
