//! The one executor of µGraphs, generic over the value [`Domain`].
//!
//! [`run_kernel_graph_ranks`] walks a kernel graph in op order, for every rank of a
//! multi-device graph (all_reduce sums over the ranks); customized ops run their block
//! graph through [`run_block_graph`], which executes every block of the grid exactly as a
//! kernel would: slice inputs by imap/block index and fmap/iteration, run loop-body ops in
//! every iteration, update accumulators, run after-loop ops once, place output tiles by
//! omap/block index. The phase of each op comes from [`crate::phase`] (stored on the tiles
//! by the builder). Masked edge tiles ([`BlockGraph::masked_axes`]): a tile element past the
//! tensor's extent reads as zero, and output elements past it are not written; so does a
//! masked loop's last tile ([`BlockGraph::loop_extent`]). Blocks run in parallel with rayon; each block owns its buffers.
//!
//! A static sign analysis ([`tensor_signs`]) marks the values that are ≥ 0 for every real
//! input; `sqrt`/`rsqrt` of other values use the domain's sign-unknown square root.

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::dense::{self, Dense};
use crate::domain::Domain;
use crate::error::{eval_err, CoreError, Result};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::masked_loop::{masked_exps, padded_divisors};
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use crate::phase::Phase;
use crate::shape::fmt_dims;
use rayon::prelude::*;
use std::borrow::{Borrow, Cow};

fn internal(what: &str) -> CoreError {
    CoreError::Evaluation(format!("internal error: {what} (please report this graph)"))
}

/// A tensor's value during execution: the caller's input (borrowed) or a computed one.
type Val<'a, V> = Option<Cow<'a, Dense<V>>>;

/// The value of tensor `id` (kernel level: [`Val`]s; block level: owned tiles).
fn get<V, T: Borrow<Dense<V>>>(vals: &[Option<T>], id: usize) -> Result<&Dense<V>> {
    vals.get(id)
        .and_then(|v| v.as_ref())
        .map(|v| v.borrow())
        .ok_or_else(|| internal(&format!("value of t{id} missing")))
}

/// Largest total number of elements over all tensors of a graph that an executor accepts
/// (2^31, i.e. 16 GiB of f64): bigger graphs are refused with an EvaluationError instead of
/// aborting the process on allocation failure. Fingerprints need only small shapes.
pub const MAX_EVAL_ELEMS: u64 = 1 << 31;

/// Refuse graphs whose tensors (over all `world_size` ranks) exceed [`MAX_EVAL_ELEMS`]
/// elements in all.
pub fn check_size(g: &KernelGraph) -> Result<()> {
    let total: u64 = g
        .tensors()
        .iter()
        .map(|t| crate::shape::numel(&t.dims) as u64)
        .sum::<u64>()
        .saturating_mul(g.world_size() as u64);
    if total > MAX_EVAL_ELEMS {
        return eval_err(format!(
            "the graph's tensors hold {total} elements in all (over all ranks), more than the evaluator's limit of 2^31; evaluate/fingerprint a smaller instance of the graph"
        ));
    }
    Ok(())
}

/// Evaluate a single-device graph (`world_size` 1) on `inputs` (one per graph input, dims
/// checked); returns the outputs. Multi-device graphs go through [`run_kernel_graph_ranks`].
pub fn run_kernel_graph<D: Domain>(
    d: &D,
    g: &KernelGraph,
    inputs: Vec<Dense<D::V>>,
) -> Result<Vec<Dense<D::V>>> {
    if g.world_size() != 1 {
        return eval_err(format!(
            "the graph runs on {} ranks: give every rank's inputs (evaluate all ranks)",
            g.world_size()
        ));
    }
    let mut outs = run_kernel_graph_ranks(d, g, vec![inputs])?;
    outs.pop().ok_or_else(|| internal("rank count"))
}

/// Evaluate every rank of `g`: `inputs[r]` are rank r's inputs (one per graph input, dims
/// checked); returns `outputs[r]`. Ops run per rank (ranks in parallel); `all_reduce` sums
/// over the ranks in rank order, so results do not depend on the thread count.
pub fn run_kernel_graph_ranks<D: Domain>(
    d: &D,
    g: &KernelGraph,
    inputs: Vec<Vec<Dense<D::V>>>,
) -> Result<Vec<Vec<Dense<D::V>>>> {
    run_kernel_graph_ranks_on(d, g, &inputs)
}

/// [`run_kernel_graph_ranks`] on borrowed inputs (not copied: fingerprinting checks many
/// candidates on the same inputs).
pub fn run_kernel_graph_ranks_on<D: Domain>(
    d: &D,
    g: &KernelGraph,
    inputs: &[Vec<Dense<D::V>>],
) -> Result<Vec<Vec<Dense<D::V>>>> {
    g.check_complete()?;
    let n = g.world_size();
    if inputs.len() != n {
        return eval_err(format!(
            "the graph runs on {n} ranks, got inputs for {}",
            inputs.len()
        ));
    }
    for (r, rank_inputs) in inputs.iter().enumerate() {
        let on_rank = if n > 1 {
            format!(" on rank {r}")
        } else {
            String::new()
        };
        if rank_inputs.len() != g.inputs().len() {
            return eval_err(format!(
                "the graph has {} inputs, got {}{on_rank}",
                g.inputs().len(),
                rank_inputs.len()
            ));
        }
        for (k, (x, &t)) in rank_inputs.iter().zip(g.inputs()).enumerate() {
            let want = &g.tensors()[t].dims;
            if &x.dims != want || x.data.len() != crate::shape::numel(want) {
                return eval_err(format!(
                    "input #{k}{on_rank} has dims {}; the graph expects {}",
                    fmt_dims(&x.dims),
                    fmt_dims(want)
                ));
            }
        }
    }
    check_size(g)?;
    let signs = tensor_signs(g);
    let mut vals: Vec<Vec<Val<'_, D::V>>> = vec![vec![None; g.num_tensors()]; n];
    let mut inputs: Vec<_> = inputs.iter().map(|v| v.iter()).collect();
    for op in g.ops() {
        let outs: Vec<Vec<Cow<'_, Dense<D::V>>>> = match &op.kind {
            KernelOpKind::Input { .. } => inputs
                .iter_mut()
                .map(|it| {
                    it.next()
                        .map(|v| vec![Cow::Borrowed(v)])
                        .ok_or_else(|| internal("input count"))
                })
                .collect::<Result<_>>()?,
            KernelOpKind::AllReduce { x } => {
                let mut acc = get(&vals[0], *x)?.clone();
                for rank_vals in &vals[1..] {
                    dense::add_assign(d, &mut acc, get(rank_vals, *x)?);
                }
                vec![vec![Cow::Owned(acc)]; n]
            }
            kind if n == 1 => vec![owned(run_op(d, kind, &vals[0], &signs)?)],
            kind => vals
                .par_iter()
                .map(|v| run_op(d, kind, v, &signs).map(owned))
                .collect::<Result<_>>()?,
        };
        for (rank_vals, rank_outs) in vals.iter_mut().zip(outs) {
            if rank_outs.len() != op.outs.len() {
                return Err(internal("output count"));
            }
            for (&id, v) in op.outs.iter().zip(rank_outs) {
                rank_vals[id] = Some(v);
            }
        }
    }
    vals.into_iter()
        .map(|mut rank_vals| {
            g.outputs()
                .iter()
                .map(|&o| {
                    rank_vals[o]
                        .take()
                        .map(Cow::into_owned)
                        .ok_or_else(|| internal("output missing"))
                })
                .collect()
        })
        .collect()
}

fn owned<'a, V: Clone>(outs: Vec<Dense<V>>) -> Vec<Cow<'a, Dense<V>>> {
    outs.into_iter().map(Cow::Owned).collect()
}

/// One rank's results of a per-rank op (not an input, not a collective); `signs` is the
/// graph's sign analysis ([`nonneg_tensors`]).
fn run_op<D: Domain>(
    d: &D,
    kind: &KernelOpKind,
    vals: &[Val<'_, D::V>],
    signs: &[Sign],
) -> Result<Vec<Dense<D::V>>> {
    let one = |v: Dense<D::V>| Ok(vec![v]);
    match kind {
        KernelOpKind::Input { .. } | KernelOpKind::AllReduce { .. } => {
            Err(internal("run_op on an input or a collective"))
        }
        KernelOpKind::Matmul { a, b } => one(dense::matmul(d, get(vals, *a)?, get(vals, *b)?)),
        KernelOpKind::Unary { op, x } => one(unary_signed(d, *op, get(vals, *x)?, signs[*x])),
        KernelOpKind::Binary { op, a, b } => one(binary_op(d, *op, (*a, *b), vals)?),
        KernelOpKind::Reduction { x, dim } => one(dense::reduce_sum(d, get(vals, *x)?, *dim)),
        KernelOpKind::ReduceMax { x, dim } => one(dense::reduce_max(d, get(vals, *x)?, *dim)),
        KernelOpKind::RmsNorm {
            x,
            normalized_shape,
            weight,
            eps,
        } => {
            let w = match weight {
                Some(w) => Some(get(vals, *w)?),
                None => None,
            };
            one(dense::rms_norm(
                d,
                get(vals, *x)?,
                normalized_shape.len(),
                w,
                *eps,
            ))
        }
        KernelOpKind::Softmax { x, dim } => one(dense::softmax(d, get(vals, *x)?, *dim)),
        KernelOpKind::Concat { xs, dim } => {
            let parts: Vec<&Dense<D::V>> =
                xs.iter().map(|&x| get(vals, x)).collect::<Result<_>>()?;
            one(dense::concat(&parts, *dim))
        }
        KernelOpKind::Chunk {
            x,
            chunks,
            dim,
            index,
        } => {
            let src = get(vals, *x)?;
            let mut sizes = src.dims.clone();
            sizes[*dim] /= chunks;
            let mut off = vec![0; sizes.len()];
            off[*dim] = index * sizes[*dim];
            one(src.slice(&off, &sizes))
        }
        KernelOpKind::Permute { x, perm } => one(get(vals, *x)?.permute(perm)),
        KernelOpKind::Reshape { x, dims } => one(Dense {
            dims: dims.clone(),
            data: get(vals, *x)?.data.clone(),
        }),
        KernelOpKind::Customized { inputs, graph } => {
            let ins: Vec<&Dense<D::V>> = inputs
                .iter()
                .map(|&x| get(vals, x))
                .collect::<Result<_>>()?;
            let in_signs: Vec<Sign> = inputs.iter().map(|&x| signs[x]).collect();
            run_block_graph_signed(d, graph, &ins, &in_signs)
        }
    }
}

/// Elementwise binary op on values `ids`; `x − x` of one value goes through
/// [`Domain::sub_self`].
fn binary_op<D: Domain, T: Borrow<Dense<D::V>>>(
    d: &D,
    op: BinaryOp,
    ids: (usize, usize),
    vals: &[Option<T>],
) -> Result<Dense<D::V>> {
    let a = get(vals, ids.0)?;
    if op == BinaryOp::Sub && ids.0 == ids.1 {
        return Ok(dense::unary_map(a, |v| d.sub_self(v)));
    }
    Ok(dense::binary(d, op, a, get(vals, ids.1)?))
}

/// Elementwise unary op; `sqrt`/`rsqrt` of a value not known to be ≥ 0 (by `sign`) go
/// through the domain's sign-unknown square root.
fn unary_signed<D: Domain>(d: &D, op: UnaryOp, x: &Dense<D::V>, sign: Sign) -> Dense<D::V> {
    let nonneg = sign >= Sign::NonNeg;
    match op {
        UnaryOp::Sqrt if !nonneg => dense::unary_map(x, |v| d.sqrt_signed(v)),
        UnaryOp::Rsqrt if !nonneg => dense::unary_map(x, |v| d.rsqrt_signed(v)),
        _ => dense::unary(d, op, x),
    }
}

/// What the sign analysis knows of a value for every real input (NaN allowed anywhere):
/// ordered from least to most known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sign {
    Any,
    /// ≥ 0.
    NonNeg,
    /// > 0.
    Pos,
}

/// Sign of a unary op's output given its input's.
fn unary_sign(op: UnaryOp, x: Sign) -> Sign {
    use Sign::*;
    match op {
        UnaryOp::Exp | UnaryOp::Sigmoid => Pos,
        UnaryOp::Square | UnaryOp::Sqrt | UnaryOp::Rsqrt => x.max(NonNeg),
        UnaryOp::Relu => NonNeg,
        UnaryOp::MulScalar(s) if s > 0.0 => x,
        UnaryOp::MulScalar(0.0) => NonNeg,
        UnaryOp::AddScalar(c) if c > 0.0 && x >= NonNeg => Pos,
        UnaryOp::AddScalar(0.0) => x,
        UnaryOp::Clamp { lo, .. } if lo > 0.0 => Pos,
        UnaryOp::Clamp { lo, hi } if lo >= 0.0 || (x >= NonNeg && hi >= 0.0) => NonNeg,
        _ => Any,
    }
}

/// Sign of a binary op on operands `ids` with signs `a`, `b`.
fn binary_sign(op: BinaryOp, ids: (usize, usize), a: Sign, b: Sign) -> Sign {
    use Sign::*;
    match op {
        BinaryOp::Add if a >= NonNeg && b >= NonNeg => a.max(b),
        BinaryOp::Mul if ids.0 == ids.1 => a.max(NonNeg),
        BinaryOp::Div if ids.0 == ids.1 => Pos, // x / x: 1 (NaN at 0)
        BinaryOp::Mul | BinaryOp::Div => a.min(b),
        BinaryOp::Pow => a,
        _ => Any,
    }
}

/// Per kernel tensor: what is provably known of its sign for every real input (products,
/// sums and quotients of squares, exps, square roots …). Sound, not complete: `Any` only
/// means "not known". The field takes exact square roots only of values known to be ≥ 0.
pub fn tensor_signs(g: &KernelGraph) -> Vec<Sign> {
    let mut s = vec![Sign::Any; g.num_tensors()];
    for op in g.ops() {
        let outs: Vec<Sign> = match &op.kind {
            KernelOpKind::Input { .. } => vec![Sign::Any],
            KernelOpKind::Matmul { a, b } => vec![s[*a].min(s[*b])],
            KernelOpKind::Unary { op, x } => vec![unary_sign(*op, s[*x])],
            KernelOpKind::Binary { op, a, b } => vec![binary_sign(*op, (*a, *b), s[*a], s[*b])],
            KernelOpKind::Reduction { x, .. }
            | KernelOpKind::Chunk { x, .. }
            | KernelOpKind::Permute { x, .. }
            | KernelOpKind::Reshape { x, .. }
            | KernelOpKind::ReduceMax { x, .. }
            | KernelOpKind::AllReduce { x } => vec![s[*x]],
            KernelOpKind::RmsNorm { x, weight, .. } => {
                vec![weight.map_or(s[*x], |w| s[*x].min(s[w]))]
            }
            KernelOpKind::Softmax { .. } => vec![Sign::Pos],
            KernelOpKind::Concat { xs, .. } => {
                vec![xs.iter().map(|&x| s[x]).min().unwrap_or(Sign::Any)]
            }
            KernelOpKind::Customized { inputs, graph } => {
                let in_signs: Vec<Sign> = inputs.iter().map(|&x| s[x]).collect();
                let tiles = tile_signs(graph, &in_signs);
                graph.outputs().iter().map(|o| tiles[o.tile]).collect()
            }
        };
        for (&id, v) in op.outs.iter().zip(outs) {
            s[id] = v;
        }
    }
    s
}

/// Per tensor: whether it is known to be ≥ 0 ([`tensor_signs`]).
pub fn nonneg_tensors(g: &KernelGraph) -> Vec<bool> {
    tensor_signs(g)
        .into_iter()
        .map(|s| s >= Sign::NonNeg)
        .collect()
}

/// Per tile of a block graph: [`tensor_signs`] at the block level, given the signs of the
/// kernel inputs (in input order).
pub fn tile_signs(bg: &BlockGraph, in_signs: &[Sign]) -> Vec<Sign> {
    let mut s = vec![Sign::Any; bg.ops().len()];
    let mut next_input = 0;
    for (i, op) in bg.ops().iter().enumerate() {
        s[i] = match op {
            BlockOpKind::Input { .. } => {
                next_input += 1;
                in_signs.get(next_input - 1).copied().unwrap_or(Sign::Any)
            }
            BlockOpKind::Matmul { a, b } => s[*a].min(s[*b]),
            BlockOpKind::Unary { op, x } => unary_sign(*op, s[*x]),
            BlockOpKind::Binary { op, a, b } => binary_sign(*op, (*a, *b), s[*a], s[*b]),
            BlockOpKind::Reduction { x, .. }
            | BlockOpKind::ReductionToDimx { x, .. }
            | BlockOpKind::RmsNorm { x, .. } => s[*x],
            BlockOpKind::Concat { xs, .. } => xs.iter().map(|&x| s[x]).min().unwrap_or(Sign::Any),
            BlockOpKind::ForloopAccum { x, kind } => match kind {
                AccumKind::Rms { eps } if *eps > 0.0 => Sign::Pos,
                AccumKind::Rms { .. } => s[*x].max(Sign::NonNeg),
                _ => s[*x],
            },
        };
    }
    s
}

/// Block index (x, y, z) of linear block number `b` (x fastest).
pub fn block_index(grid: [u32; 3], b: usize) -> [usize; 3] {
    let (gx, gy) = (grid[0] as usize, grid[1] as usize);
    [b % gx, (b / gx) % gy, b / (gx * gy)]
}

/// Execute block graph `bg` over its whole grid on kernel-level `inputs` (of unknown sign).
pub fn run_block_graph<D: Domain>(
    d: &D,
    bg: &BlockGraph,
    inputs: &[&Dense<D::V>],
) -> Result<Vec<Dense<D::V>>> {
    run_block_graph_signed(d, bg, inputs, &vec![Sign::Any; inputs.len()])
}

/// [`run_block_graph`] with the inputs' sign analysis.
fn run_block_graph_signed<D: Domain>(
    d: &D,
    bg: &BlockGraph,
    inputs: &[&Dense<D::V>],
    in_signs: &[Sign],
) -> Result<Vec<Dense<D::V>>> {
    if inputs.len() != bg.num_inputs() {
        return Err(internal("customized input count"));
    }
    let signs = tile_signs(bg, in_signs);
    let padding = LoopPadding::of(bg);
    let per_block: Vec<Vec<Dense<D::V>>> = (0..bg.num_blocks())
        .into_par_iter()
        .map(|b| {
            run_one_block(
                d,
                bg,
                inputs,
                &signs,
                &padding,
                block_index(bg.grid_dim(), b),
            )
        })
        .collect::<Result<_>>()?;
    let grid = bg.grid_dim();
    let mut outs: Vec<Dense<D::V>> = bg
        .outputs()
        .iter()
        .map(|o| Dense::full(&o.dims, d.zero()))
        .collect();
    for (b, tiles) in per_block.iter().enumerate() {
        let bidx = block_index(grid, b);
        for ((out, spec), tile) in outs.iter_mut().zip(bg.outputs()).zip(tiles) {
            let mut off = vec![0; tile.dims.len()];
            for a in 0..3 {
                if grid[a] > 1 && spec.omap[a] >= 0 {
                    let dd = spec.omap[a] as usize;
                    off[dd] = bidx[a] * tile.dims[dd];
                }
            }
            place_clipped(out, tile, &off);
        }
    }
    Ok(outs)
}

/// The tile of `src` at `off` of `sizes`, elements past `src`'s extent read as zero.
fn slice_padded<V: Copy>(src: &Dense<V>, off: &[usize], sizes: &[usize], zero: V) -> Dense<V> {
    let inside: Vec<usize> = (0..sizes.len())
        .map(|k| sizes[k].min(src.dims[k].saturating_sub(off[k])))
        .collect();
    if inside == sizes {
        return src.slice(off, sizes);
    }
    let mut t = Dense::full(sizes, zero);
    if inside.iter().all(|&n| n > 0) {
        t.place(&src.slice(off, &inside), &vec![0; sizes.len()]);
    }
    t
}

/// Write `tile` into `out` at `off`, dropping the elements past `out`'s extent.
fn place_clipped<V: Copy>(out: &mut Dense<V>, tile: &Dense<V>, off: &[usize]) {
    let inside: Vec<usize> = (0..off.len())
        .map(|k| tile.dims[k].min(out.dims[k].saturating_sub(off[k])))
        .collect();
    if inside == tile.dims {
        out.place(tile, off);
    } else if inside.iter().all(|&n| n > 0) {
        out.place(&tile.slice(&vec![0; off.len()], &inside), off);
    }
}

/// Contribution of one iteration to an accumulator (before summing over iterations).
fn accum_step<D: Domain>(d: &D, kind: AccumKind, x: &Dense<D::V>, dimx: usize) -> Dense<D::V> {
    let last = x.dims.len() - 1;
    match kind {
        AccumKind::Iter => x.clone(),
        AccumKind::Sum => dense::reduce_sum(d, x, last),
        AccumKind::Rms { .. } => dense::sum_squares_last(d, x),
        AccumKind::SumToDimx => dense::reduce_groups(d, x, last, dimx),
    }
}

/// Final value of an accumulator after all iterations (`n`: the count an `rms` one
/// averages over, [`BlockGraph::rms_count`]).
fn accum_finish<D: Domain>(d: &D, kind: AccumKind, acc: Dense<D::V>, n: usize) -> Dense<D::V> {
    match kind {
        AccumKind::Rms { eps } => {
            let e = d.constant(eps);
            dense::map::<D>(&acc, |v| d.sqrt(d.add(d.div_count(v, n), e)))
        }
        _ => acc,
    }
}

/// Compute a non-input, non-accumulator tile op (`signs`: the tiles' sign analysis).
fn compute_tile<D: Domain>(
    d: &D,
    op: &BlockOpKind,
    vals: &[Option<Dense<D::V>>],
    signs: &[Sign],
    dimx: usize,
) -> Result<Dense<D::V>> {
    Ok(match op {
        BlockOpKind::Matmul { a, b } => dense::matmul(d, get(vals, *a)?, get(vals, *b)?),
        BlockOpKind::Unary { op, x } => unary_signed(d, *op, get(vals, *x)?, signs[*x]),
        BlockOpKind::Binary { op, a, b } => binary_op(d, *op, (*a, *b), vals)?,
        BlockOpKind::Reduction { x, dim } => dense::reduce_sum(d, get(vals, *x)?, *dim),
        BlockOpKind::ReductionToDimx { x, dim } => {
            dense::reduce_groups(d, get(vals, *x)?, *dim, dimx)
        }
        BlockOpKind::RmsNorm { x, eps } => dense::rms_norm(d, get(vals, *x)?, 1, None, *eps),
        BlockOpKind::Concat { xs, dim } => {
            let parts: Vec<&Dense<D::V>> =
                xs.iter().map(|&x| get(vals, x)).collect::<Result<_>>()?;
            dense::concat(&parts, *dim)
        }
        BlockOpKind::Input { .. } | BlockOpKind::ForloopAccum { .. } => {
            return Err(internal("compute_tile on input/accumulator"))
        }
    })
}

/// What the executor does at a masked loop's padding: the exps whose padded elements are
/// zero ([`masked_exps`]: per op, the tile dim the padding runs along) and the divisors
/// whose padded elements are taken as 1 ([`padded_divisors`]: per op, its operand and the
/// operand's padded dims), and the loop's extent.
struct LoopPadding {
    dim_of: Vec<Option<usize>>,
    divisor_of: Vec<Option<(usize, Vec<usize>)>>,
    extent: usize,
}

impl LoopPadding {
    fn of(bg: &BlockGraph) -> LoopPadding {
        let mut dim_of = vec![None; bg.ops().len()];
        for (i, dim) in masked_exps(bg) {
            dim_of[i] = Some(dim);
        }
        let mut divisor_of = vec![None; bg.ops().len()];
        for (i, x, dims) in padded_divisors(bg) {
            divisor_of[i] = Some((x, dims));
        }
        LoopPadding {
            dim_of,
            divisor_of,
            extent: bg.loop_extent().unwrap_or(usize::MAX),
        }
    }

    /// Set the elements of `t` that lie past the extent along any of `dims` in iteration
    /// `it` to `v`; whether any did.
    fn fill_padding<V: Copy>(&self, dims: &[usize], it: usize, t: &mut Dense<V>, v: V) -> bool {
        let mut any = false;
        for &dim in dims {
            let size = t.dims[dim];
            let valid = self.extent.saturating_sub(it * size).min(size);
            if valid == size {
                continue;
            }
            any = true;
            let inner: usize = t.dims[dim + 1..].iter().product();
            for (k, x) in t.data.iter_mut().enumerate() {
                if (k / inner) % size >= valid {
                    *x = v;
                }
            }
        }
        any
    }

    /// Zero the elements of exp `i`'s tile `t` that lie past the extent in iteration `it`.
    fn mask_exp<V: Copy>(&self, i: usize, it: usize, t: &mut Dense<V>, zero: V) {
        if let Some(dim) = self.dim_of[i] {
            self.fill_padding(&[dim], it, t, zero);
        }
    }

    /// Op `i`'s divisor in iteration `it` with its padded elements set to `one`, when it has
    /// padding there: (operand op, patched tile).
    fn divisor<V: Copy>(
        &self,
        i: usize,
        it: usize,
        vals: &[Option<Dense<V>>],
        one: V,
    ) -> Option<(usize, Dense<V>)> {
        let (x, dims) = self.divisor_of[i].as_ref()?;
        let mut t = vals.get(*x)?.as_ref()?.clone();
        self.fill_padding(dims, it, &mut t, one).then_some((*x, t))
    }
}

/// Run one thread block: the for-loop, accumulators, after-loop ops; returns output tiles.
fn run_one_block<D: Domain>(
    d: &D,
    bg: &BlockGraph,
    inputs: &[&Dense<D::V>],
    signs: &[Sign],
    padding: &LoopPadding,
    bidx: [usize; 3],
) -> Result<Vec<Dense<D::V>>> {
    let ops = bg.ops();
    let tiles = bg.tiles();
    let grid = bg.grid_dim();
    let forloop = bg.forloop_range() as usize;
    let dimx = bg.reduction_dimx() as usize;
    let mut vals: Vec<Option<Dense<D::V>>> = vec![None; ops.len()];
    let mut accs: Vec<Option<Dense<D::V>>> = vec![None; ops.len()];
    let mut input_pos = 0usize;
    let input_of: Vec<usize> = ops
        .iter()
        .map(|op| {
            let k = input_pos;
            if matches!(op, BlockOpKind::Input { .. }) {
                input_pos += 1;
            }
            k
        })
        .collect();
    for it in 0..forloop {
        for (i, op) in ops.iter().enumerate() {
            match op {
                BlockOpKind::Input {
                    kernel_dims,
                    imap,
                    fmap,
                    ..
                } => {
                    if *fmap < 0 && it > 0 {
                        continue; // loaded once
                    }
                    let src = inputs.get(input_of[i]).ok_or_else(|| internal("input"))?;
                    let geo = bg.input_geometry(kernel_dims, *imap, *fmap);
                    let mut off = vec![0; kernel_dims.len()];
                    for a in 0..3 {
                        if grid[a] > 1 && imap[a] >= 0 {
                            let dd = imap[a] as usize;
                            off[dd] = bidx[a] * geo.block_dims[dd];
                        }
                    }
                    if *fmap >= 0 {
                        let dd = *fmap as usize;
                        off[dd] += it * geo.tile_dims[dd];
                    }
                    vals[i] = Some(slice_padded(src, &off, &geo.tile_dims, d.zero()));
                }
                BlockOpKind::ForloopAccum { x, kind } => {
                    let step = accum_step(d, *kind, get(&vals, *x)?, dimx);
                    match &mut accs[i] {
                        Some(acc) => dense::add_assign(d, acc, &step),
                        slot @ None => *slot = Some(step),
                    }
                }
                other => {
                    if tiles[i].phase == Phase::LoopBody {
                        // a padded divisor divides by 1 there (0⁻¹ is not a value)
                        let patched = padding.divisor(i, it, &vals, d.constant(1.0));
                        let kept = patched.map(|(x, t)| (x, vals[x].replace(t)));
                        let t = compute_tile(d, other, &vals, signs, dimx);
                        if let Some((x, orig)) = kept {
                            vals[x] = orig;
                        }
                        let mut t = t?;
                        padding.mask_exp(i, it, &mut t, d.zero());
                        vals[i] = Some(t);
                    }
                }
            }
        }
    }
    for (i, op) in ops.iter().enumerate() {
        if tiles[i].phase != Phase::AfterLoop {
            continue;
        }
        vals[i] = Some(match op {
            BlockOpKind::ForloopAccum { x, kind } => {
                let acc = accs[i].take().ok_or_else(|| internal("accumulator"))?;
                let last = tiles[*x].dims.last().copied().unwrap_or(1);
                accum_finish(d, *kind, acc, bg.rms_count(last))
            }
            other => compute_tile(d, other, &vals, signs, dimx)?,
        });
    }
    bg.outputs()
        .iter()
        .map(|o| get(&vals, o.tile).cloned())
        .collect()
}

#[cfg(test)]
mod masked_tests {
    //! Masked edge tiles: a grid that does not divide a free dim computes the target exactly.
    use crate::block_graph::BlockGraph;
    use crate::dense::Dense;
    use crate::dense::Tensor;
    use crate::fingerprint::equivalent;
    use crate::kernel_graph::KernelGraph;
    use crate::reference::evaluate;
    use crate::{AccumKind, BinaryOp, DType, UnaryOp};

    const F: DType = DType::F32;

    fn data(dims: &[usize], salt: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let v = (0..n)
            .map(|i| {
                let h = crate::field::mix64(salt.wrapping_mul(7919) ^ i as u64);
                (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect();
        Tensor::new(dims.to_vec(), v).unwrap()
    }

    /// `silu(X·W1) ⊙ (X·W3)` of `X[m,k]`, `W[k,n]` as plain kernel ops.
    fn plain_gated(m: i64, k: i64, n: i64) -> KernelGraph {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[m, k], F).unwrap();
        let w1 = g.new_input(&[k, n], F).unwrap();
        let w3 = g.new_input(&[k, n], F).unwrap();
        let a = g.matmul(x, w1).unwrap();
        let b = g.matmul(x, w3).unwrap();
        let s = g.unary(UnaryOp::Silu, a).unwrap();
        let o = g.binary(BinaryOp::Mul, s, b).unwrap();
        g.mark_output(o).unwrap();
        g
    }

    /// The same as one kernel: N over `gx` blocks (axis x), M over `gy` blocks (axis y), K
    /// walked by a loop of `f`; `gate` is the elementwise op joining the two products.
    fn fused_gated(dims: [i64; 3], grid: [i64; 2], f: i64, gate: BinaryOp) -> KernelGraph {
        let [m, k, n] = dims;
        let mut b = BlockGraph::new([grid[0], grid[1], 1], [128, 1, 1], f, 1).unwrap();
        let x = b.new_input(&[m, k], F, [-1, 0, -1], 1).unwrap();
        let w1 = b.new_input(&[k, n], F, [1, -1, -1], 0).unwrap();
        let w3 = b.new_input(&[k, n], F, [1, -1, -1], 0).unwrap();
        let p1 = b.matmul(x, w1).unwrap();
        let p3 = b.matmul(x, w3).unwrap();
        let a1 = b.forloop_accum(p1, AccumKind::Iter).unwrap();
        let a3 = b.forloop_accum(p3, AccumKind::Iter).unwrap();
        let s = b.unary(UnaryOp::Silu, a1).unwrap();
        let o = b.binary(gate, s, a3).unwrap();
        b.new_output(o, [1, 0, -1]).unwrap();
        let mut g = KernelGraph::new();
        let ins: Vec<usize> = [[m, k], [k, n], [k, n]]
            .iter()
            .map(|d| g.new_input(d, F).unwrap())
            .collect();
        let outs = g.customized(&ins, &b).unwrap();
        g.mark_output(outs[0]).unwrap();
        g
    }

    /// `plain` and `fused` evaluate to the same first output (dims and values) on `ins` (float64, 1e-9).
    fn assert_same_values(plain: &KernelGraph, fused: &KernelGraph, ins: &[Tensor]) {
        let (a, b) = (evaluate(plain, ins).unwrap(), evaluate(fused, ins).unwrap());
        assert_eq!(a[0].dims, b[0].dims);
        for (u, v) in a[0].data.iter().zip(&b[0].data) {
            assert!((u - v).abs() <= 1e-9 * (1.0 + v.abs()), "{u} vs {v}");
        }
    }

    #[test]
    fn masked_gated_mlp_matches_target() {
        // N = 100 over 7 blocks (tiles of 15, the last owns 10); M = 40 over 3 (14, 14, 12).
        let plain = plain_gated(40, 64, 100);
        let fused = fused_gated([40, 64, 100], [7, 3], 4, BinaryOp::Mul);
        let ins = [data(&[40, 64], 1), data(&[64, 100], 2), data(&[64, 100], 3)];
        assert_same_values(&plain, &fused, &ins);
        assert!(equivalent(&plain, &fused, 2, 3).unwrap());
    }

    #[test]
    fn mutated_masked_gated_mlp_disagrees() {
        let plain = plain_gated(40, 64, 100);
        let wrong = fused_gated([40, 64, 100], [7, 3], 4, BinaryOp::Add);
        assert!(!equivalent(&plain, &wrong, 2, 3).unwrap());
    }

    #[test]
    fn the_cost_profile_charges_the_padded_edge_tile() {
        // N = 100 over 7 blocks costs the compute of 7 tiles of 15 (105 columns) like its
        // dividing twin N = 105, while the inputs it reads stay those of N = 100.
        let profile = |n: i64| {
            let g = fused_gated([40, 64, n], [7, 1], 4, BinaryOp::Mul);
            let crate::kernel_graph::KernelOpKind::Customized { graph, .. } = &g.ops()[3].kind
            else {
                panic!("op 3 is the customized op");
            };
            crate::plan::block_profile(graph, &[4, 4, 4], &[4], false)
        };
        let (masked, twin) = (profile(100), profile(105));
        let flops = |p: &crate::cost::KernelProfile| -> f64 {
            p.matmuls.iter().map(|m| m.flops).sum::<f64>() + p.other_flops
        };
        assert_eq!(masked.blocks, twin.blocks);
        assert_eq!(flops(&masked), flops(&twin));
        let read = |p: &crate::cost::KernelProfile| -> f64 {
            p.reads.iter().map(|r| r.unique_bytes).sum::<f64>()
        };
        assert!(read(&masked) < read(&twin));
    }

    #[test]
    fn masked_rms_norm_rows_match_target() {
        // RMSNorm + Linear with the rows (M = 37) over 5 blocks of 8 and N = 48 over 3.
        let mut plain = KernelGraph::new();
        let x = plain.new_input(&[37, 32], F).unwrap();
        let w = plain.new_input(&[32, 48], F).unwrap();
        let r = plain.rms_norm(x, &[32], None, 1e-6).unwrap();
        let y = plain.matmul(r, w).unwrap();
        plain.mark_output(y).unwrap();
        let mut b = BlockGraph::new([3, 5, 1], [128, 1, 1], 1, 1).unwrap();
        let bx = b.new_input(&[37, 32], F, [-1, 0, -1], -1).unwrap();
        let bw = b.new_input(&[32, 48], F, [1, -1, -1], -1).unwrap();
        let n = b.rms_norm(bx, 1e-6).unwrap();
        let m = b.matmul(n, bw).unwrap();
        let acc = b.forloop_accum(m, AccumKind::Iter).unwrap();
        b.new_output(acc, [1, 0, -1]).unwrap();
        assert_eq!(b.masked_axes(), [None, Some(37), None]);
        let mut g = KernelGraph::new();
        let gx = g.new_input(&[37, 32], F).unwrap();
        let gw = g.new_input(&[32, 48], F).unwrap();
        let o = g.customized(&[gx, gw], &b).unwrap();
        g.mark_output(o[0]).unwrap();
        assert!(equivalent(&plain, &g, 2, 5).unwrap());
    }

    /// RMSNorm + Linear of `X[8,k]`, `W[k,24]` as one kernel whose loop of `f` walks K, the
    /// x tile passed through `pre` first; and the plain graph with the same `pre`.
    fn rms_linear_pair(k: i64, f: i64, pre: Option<UnaryOp>) -> (KernelGraph, KernelGraph) {
        let mut plain = KernelGraph::new();
        let x = plain.new_input(&[8, k], F).unwrap();
        let w = plain.new_input(&[k, 24], F).unwrap();
        let x2 = pre.map_or(x, |op| plain.unary(op, x).unwrap());
        let r = plain.rms_norm(x2, &[k], None, 1e-6).unwrap();
        let y = plain.matmul(r, w).unwrap();
        plain.mark_output(y).unwrap();
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], f, 1).unwrap();
        let bx = b.new_input(&[8, k], F, [-1; 3], 1).unwrap();
        let bw = b.new_input(&[k, 24], F, [-1; 3], 0).unwrap();
        let bx = pre.map_or(bx, |op| b.unary(op, bx).unwrap());
        let m = b.matmul(bx, bw).unwrap();
        let acc = b.forloop_accum(m, AccumKind::Iter).unwrap();
        let rms = b.forloop_accum(bx, AccumKind::Rms { eps: 1e-6 }).unwrap();
        let o = b.binary(BinaryOp::Div, acc, rms).unwrap();
        b.new_output(o, [-1; 3]).unwrap();
        let mut g = KernelGraph::new();
        let gx = g.new_input(&[8, k], F).unwrap();
        let gw = g.new_input(&[k, 24], F).unwrap();
        let outs = g.customized(&[gx, gw], &b).unwrap();
        g.mark_output(outs[0]).unwrap();
        (plain, g)
    }

    #[test]
    fn masked_loop_rms_linear_matches_target() {
        // K = 67 (prime) walked in 5 tiles of 14, the last owning 11: the padding adds zeros
        // to the products and the squares, and the rms divides by 67, not 70
        let (plain, fused) = rms_linear_pair(67, 5, None);
        let ins = [data(&[8, 67], 4), data(&[67, 24], 5)];
        assert_same_values(&plain, &fused, &ins);
        assert!(equivalent(&plain, &fused, 2, 6).unwrap());
    }

    #[test]
    fn masked_loop_padding_a_sigmoid_turns_nonzero_disagrees() {
        // sigmoid(0) = 1/2 past K: the masked kernel sums 3 extra quarters into each row's
        // squares
        let (plain, fused) = rms_linear_pair(67, 5, Some(UnaryOp::Sigmoid));
        assert!(!equivalent(&plain, &fused, 2, 7).unwrap());
        // the same kernel over a dividing loop is exact
        let (plain, fused) = rms_linear_pair(70, 5, Some(UnaryOp::Sigmoid));
        assert!(equivalent(&plain, &fused, 2, 7).unwrap());
    }

    #[test]
    fn masked_loop_exp_of_padding_is_zero() {
        // exp past K is zero (the padding is absent), so the squares gain nothing
        let (plain, fused) = rms_linear_pair(67, 5, Some(UnaryOp::Exp));
        let ins = [data(&[8, 67], 8), data(&[67, 24], 9)];
        assert_same_values(&plain, &fused, &ins);
        assert!(equivalent(&plain, &fused, 2, 7).unwrap());
    }

    /// `softmax(Q·Kt)·V` of `Q[8,16]`, `Kt[16,kv]`, `V[kv,8]` as plain kernel ops, and as one
    /// block walking kv in `f` iterations (exp, its row sums and its product with V
    /// accumulated, divided after the loop), in tiles of `tile` when given.
    fn attention_pair(kv: i64, f: i64, tile: Option<i64>) -> (KernelGraph, KernelGraph) {
        attention_pair_keys(kv, f, tile, false)
    }

    /// [`attention_pair`], with the keys normalised per column first when `normed`
    /// (`Kt / sqrt(Σ Kt²)`, QK-norm's key norm without eps: a masked loop's padding makes it
    /// 0 / 0).
    fn attention_pair_keys(
        kv: i64,
        f: i64,
        tile: Option<i64>,
        normed: bool,
    ) -> (KernelGraph, KernelGraph) {
        let mut plain = KernelGraph::new();
        let q = plain.new_input(&[8, 16], F).unwrap();
        let mut kt = plain.new_input(&[16, kv], F).unwrap();
        let v = plain.new_input(&[kv, 8], F).unwrap();
        if normed {
            let sq = plain.unary(UnaryOp::Square, kt).unwrap();
            let ss = plain.reduction(sq, 0).unwrap();
            let n = plain.unary(UnaryOp::Sqrt, ss).unwrap();
            kt = plain.binary(BinaryOp::Div, kt, n).unwrap();
        }
        let s = plain.matmul(q, kt).unwrap();
        let p = plain.softmax(s, -1).unwrap();
        let o = plain.matmul(p, v).unwrap();
        plain.mark_output(o).unwrap();
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], f, 1).unwrap();
        if let Some(t) = tile {
            b.set_loop_tile(t).unwrap();
        }
        let bq = b.new_input(&[8, 16], F, [-1; 3], -1).unwrap();
        let mut bk = b.new_input(&[16, kv], F, [-1; 3], 1).unwrap();
        let bv = b.new_input(&[kv, 8], F, [-1; 3], 0).unwrap();
        if normed {
            let sq = b.unary(UnaryOp::Square, bk).unwrap();
            let ss = b.reduction(sq, 0).unwrap();
            let n = b.unary(UnaryOp::Sqrt, ss).unwrap();
            bk = b.binary(BinaryOp::Div, bk, n).unwrap();
        }
        let s = b.matmul(bq, bk).unwrap();
        let e = b.unary(UnaryOp::Exp, s).unwrap();
        let pv = b.matmul(e, bv).unwrap();
        let rs = b.reduction(e, 1).unwrap();
        let acc = b.forloop_accum(pv, AccumKind::Iter).unwrap();
        let den = b.forloop_accum(rs, AccumKind::Iter).unwrap();
        let o = b.binary(BinaryOp::Div, acc, den).unwrap();
        b.new_output(o, [-1; 3]).unwrap();
        let mut g = KernelGraph::new();
        let ins: Vec<_> = [vec![8, 16], vec![16, kv], vec![kv, 8]]
            .iter()
            .map(|d| g.new_input(d, F).unwrap())
            .collect();
        let outs = g.customized(&ins, &b).unwrap();
        g.mark_output(outs[0]).unwrap();
        (plain, g)
    }

    #[test]
    fn masked_loop_softmax_over_a_prime_kv_matches_target() {
        // kv = 67 in 5 tiles of 14: the last tile's 3 padded scores are 0, and their exps
        // would add exp(0) = 1 to every row's sum; the masked exp makes them 0
        let (plain, fused) = attention_pair(67, 5, None);
        let ins = [data(&[8, 16], 1), data(&[16, 67], 2), data(&[67, 8], 3)];
        assert_same_values(&plain, &fused, &ins);
        assert!(equivalent(&plain, &fused, 2, 11).unwrap());
        // 67 in 6 tiles of 12 (the last owning 7) agrees as well
        assert!(equivalent(&plain, &attention_pair(67, 6, None).1, 2, 11).unwrap());
    }

    #[test]
    fn padded_divisors_divide_by_one_and_leave_the_field_decisive() {
        use crate::field::Fv;
        use crate::fingerprint::FieldDomain;
        // kv = 67 in 5 tiles of 14: the last tile's 3 padded key columns have norm 0
        let (plain, fused) = attention_pair_keys(67, 5, None, true);
        let ins = [data(&[8, 16], 7), data(&[16, 67], 8), data(&[67, 8], 9)];
        assert_same_values(&plain, &fused, &ins);
        assert!(equivalent(&plain, &fused, 2, 11).unwrap());
        // the field takes 0⁻¹ as 0 and flags it, which makes a trial undecided; the padding's
        // quotients are never read, so the masked loop divides them by 1 and nothing is flagged
        let field = |dims: &[usize], salt: i128| Dense {
            dims: dims.to_vec(),
            data: (0..dims.iter().product::<usize>())
                .map(|i| Fv::from_int(1 + (i as i128 * 7919 + salt) % 1009))
                .collect(),
        };
        let fins = vec![field(&[8, 16], 1), field(&[16, 67], 2), field(&[67, 8], 3)];
        let d = FieldDomain::new(3, 0);
        let want = super::run_kernel_graph(&d, &plain, fins.clone()).unwrap();
        assert!(!d.saw_zero_divisor());
        let d = FieldDomain::new(3, 0);
        assert_eq!(super::run_kernel_graph(&d, &fused, fins).unwrap(), want);
        assert!(!d.saw_zero_divisor(), "the padding's 0 / 0 was flagged");
    }

    #[test]
    fn an_explicit_loop_tile_walks_aligned_tiles_and_matches_target() {
        // kv = 67 in 5 tiles of 16 (the last owning 3) rather than 14: the same values, and
        // the tile is what JSON records and the listing shows
        let (plain, fused) = attention_pair(67, 5, Some(16));
        let bg = match &fused.ops().last().unwrap().kind {
            crate::kernel_graph::KernelOpKind::Customized { graph, .. } => graph.clone(),
            _ => panic!("customized"),
        };
        assert_eq!((bg.loop_tile(), bg.loop_extent()), (Some(16), Some(67)));
        assert_eq!(bg.tiles()[1].dims, vec![16, 16]);
        assert!(bg.describe("").contains("forloop=5 (tiles of 16)"));
        let ins = [data(&[8, 16], 4), data(&[16, 67], 5), data(&[67, 8], 6)];
        assert_same_values(&plain, &fused, &ins);
        assert!(equivalent(&plain, &fused, 2, 11).unwrap());
        let back = crate::json::from_json(&crate::json::to_json(&fused)).unwrap();
        assert_eq!(crate::json::to_json(&back), crate::json::to_json(&fused));
        assert!(crate::json::to_json(&fused).contains("\"forloop_tile\":16"));
        // the default tile (14) set explicitly is the default: nothing recorded
        let (_, same) = attention_pair(67, 5, Some(14));
        assert_eq!(
            crate::json::to_json(&same),
            crate::json::to_json(&attention_pair(67, 5, None).1)
        );
        // tiles that leave an iteration empty, or do not reach the extent, are refused
        for (t, want) in [
            (17, "leaving the last iteration(s) empty"),
            (13, "use a loop tile of at least 14"),
        ] {
            let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], 5, 1).unwrap();
            b.set_loop_tile(t).unwrap();
            let err = b
                .new_input(&[16, 67], F, [-1; 3], 1)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
        }
        let mut b = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 1).unwrap();
        assert!(b
            .set_loop_tile(16)
            .unwrap_err()
            .to_string()
            .contains("forloop_range ≥ 2"));
    }
}
