//! Thread-block graphs: the body of a customized kernel operator.
//!
//! A block graph runs once per thread block of a `grid_dim` grid. Each block loads tiles of
//! the kernel inputs, loops `forloop_range` times over slices of them, accumulates, and
//! writes output tiles. Every op yields exactly one tile, so tile id == op index.
//!
//! Mapping conventions (validated by the builder, relied on by every executor):
//! * `imap[a]` (grid axis a = x, y, z): kernel dim split across the blocks of axis a, or -1
//!   (replicated). Only axes with `grid_dim[a] > 1` partition anything; the imap entry of an
//!   axis with `grid_dim[a] == 1` is range-checked, then ignored and stored as -1 (so equal
//!   mappings have equal canonical JSON). Two partitioning axes may not share a dim.
//! * Masked edge tiles: a block of axis a owns `t = ceil(E / grid_dim[a])` elements of the
//!   split dim of extent `E`, and every block must own at least one (`(grid_dim[a]-1)·t <
//!   E`). When `grid_dim[a]` does not divide `E` the axis is *masked* at `E`: the last block's
//!   tile runs past the tensor, its elements past `E` read as zero, and output elements past
//!   `E` are never written (an output placed along the axis has extent `E`). Every input
//!   split along a masked axis has extent `E` there, the loop may not walk a masked dim, and an
//!   output along a masked axis has tile `t` on that dim. Rows of a dim no op reduces never
//!   mix, so masking such a dim computes exactly the unmasked values; a dim that is summed
//!   gains only zeros (see [`BlockGraph::masked_axes`]).
//! * `fmap`: dim further split by `forloop_range` (iteration i reads slice i), or -1 (loaded
//!   once). With `forloop_range == 1` the split is a no-op and fmap is stored as -1.
//! * Masked loop: iteration i owns `t = ceil(E / forloop_range)` elements of a walked dim of
//!   extent `E` (every iteration at least one), or the loop's explicit tile `t`
//!   ([`BlockGraph::set_loop_tile`]: any `t` with `(forloop_range-1)·t < E ≤ forloop_range·t`,
//!   so a 2000-long dim can be walked in 32 aligned tiles of 64 rather than 63). When
//!   `forloop_range·t ≠ E` the loop is *masked* at `E` ([`BlockGraph::loop_extent`]): the last
//!   iteration's tile runs past the tensor and its elements there read as zero. Every dim the
//!   loop walks then has extent `E` and is split by no grid axis. A sum over the walked dim
//!   gains only zeros; an op that maps zero elsewhere (a sigmoid) computes something else,
//!   which verification sees. An exp of padding (along one dim) is zero, as if the padding were −∞
//!   ([`crate::masked_loop::masked_exps`]), so a softmax over the walked dim stays exact.
//! * `omap[a]`: output dim along which block index a places its tile. Every axis with
//!   `grid_dim[a] > 1` needs a distinct dim (-1 would make blocks overwrite each other);
//!   entries of axes with `grid_dim[a] == 1` are stored as -1.
//! * Phases: see [`crate::phase`].

use crate::dtype::{same_dtype, DType};
use crate::error::{graph_err, mapping_err, shape_err, Result};
use crate::ops::{check_eps, AccumKind, BinaryOp, UnaryOp};
use crate::phase::{check_output_phase, infer_phase, Phase, PhaseClass};
use crate::shape::{
    broadcast_dims, check_elems, concat_dims, fmt_dims, keepdim_dims, matmul_dims, norm_dim,
    validate_dims, Dims,
};

/// Tile id (index of the op that produced it).
pub type TileId = usize;

/// Largest supported number of blocks in a grid.
pub const MAX_BLOCKS: u64 = 1 << 31;
/// Largest supported for-loop range.
pub const MAX_FORLOOP: i64 = 1 << 24;

/// One op of a block graph.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockOpKind {
    /// Tile of a kernel input of `kernel_dims`.
    Input {
        kernel_dims: Dims,
        dtype: DType,
        imap: [i32; 3],
        fmap: i32,
    },
    Matmul {
        a: TileId,
        b: TileId,
    },
    Unary {
        op: UnaryOp,
        x: TileId,
    },
    Binary {
        op: BinaryOp,
        a: TileId,
        b: TileId,
    },
    /// Sum over `dim`, keepdim.
    Reduction {
        x: TileId,
        dim: usize,
    },
    /// Sum `dim` in strided groups (out[j] = Σ_g x[g·dimx + j]) down to `reduction_dimx`.
    ReductionToDimx {
        x: TileId,
        dim: usize,
    },
    /// `x / sqrt(mean(x²) over the last dim + eps)`.
    RmsNorm {
        x: TileId,
        eps: f64,
    },
    Concat {
        xs: Vec<TileId>,
        dim: usize,
    },
    ForloopAccum {
        x: TileId,
        kind: AccumKind,
    },
}

impl BlockOpKind {
    /// Operand tiles.
    pub fn operands(&self) -> Vec<TileId> {
        match self {
            BlockOpKind::Input { .. } => vec![],
            BlockOpKind::Matmul { a, b } | BlockOpKind::Binary { a, b, .. } => vec![*a, *b],
            BlockOpKind::Unary { x, .. }
            | BlockOpKind::Reduction { x, .. }
            | BlockOpKind::ReductionToDimx { x, .. }
            | BlockOpKind::RmsNorm { x, .. }
            | BlockOpKind::ForloopAccum { x, .. } => vec![*x],
            BlockOpKind::Concat { xs, .. } => xs.clone(),
        }
    }

    /// Class for the phase rule.
    pub fn phase_class(&self) -> PhaseClass {
        match self {
            BlockOpKind::Input { .. } => PhaseClass::Input,
            BlockOpKind::ForloopAccum { .. } => PhaseClass::Accumulator,
            _ => PhaseClass::Compute,
        }
    }
}

/// Metadata of one tile.
#[derive(Debug, Clone, PartialEq)]
pub struct TileInfo {
    pub dims: Dims,
    pub dtype: DType,
    pub phase: Phase,
}

/// A block-graph output.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockOutput {
    /// The (after-loop) tile written.
    pub tile: TileId,
    /// Output dim per grid axis (-1 for axes with grid_dim 1).
    pub omap: [i32; 3],
    /// Kernel-level dims: tile dims times grid_dim[a] on dim omap[a].
    pub dims: Dims,
}

/// Geometry of an input tile, derived once from the mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct InputGeometry {
    /// Dims of the slice owned by one block (kernel dims divided by the grid).
    pub block_dims: Dims,
    /// Dims of one iteration's tile (block dims divided by forloop on fmap).
    pub tile_dims: Dims,
}

/// A thread-block graph.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockGraph {
    grid_dim: [u32; 3],
    block_dim: [u32; 3],
    forloop_range: u32,
    reduction_dimx: u32,
    ops: Vec<BlockOpKind>,
    tiles: Vec<TileInfo>,
    inputs: Vec<TileId>,
    outputs: Vec<BlockOutput>,
    /// Per grid axis: the extent of the dims it splits (first input that splits it).
    split_extent: [Option<usize>; 3],
    /// Per grid axis: whether its grid does not divide `split_extent` (masked edge tiles).
    masked: [bool; 3],
    /// The per-block extent of the dims the loop walks (first walked input).
    walk_extent: Option<usize>,
    /// Whether the loop's tiles do not cover `walk_extent` exactly (a masked loop).
    loop_masked: bool,
    /// The loop's tile along walked dims when set ([`BlockGraph::set_loop_tile`]), else
    /// `ceil(extent / forloop_range)`.
    loop_tile: Option<u32>,
}

fn axis_name(a: usize) -> char {
    ['x', 'y', 'z'][a]
}

impl BlockGraph {
    /// New empty block graph. grid dims ≥ 1 (≤ 2^31 blocks), block dims ≥ 1 with at most
    /// 1024 threads, `1 ≤ forloop_range ≤ 2^24`, `reduction_dimx ≥ 1`.
    pub fn new(
        grid_dim: [i64; 3],
        block_dim: [i64; 3],
        forloop_range: i64,
        reduction_dimx: i64,
    ) -> Result<BlockGraph> {
        let prod = |v: &[i64; 3]| v.iter().fold(1u64, |a, &x| a.saturating_mul(x as u64));
        if grid_dim.iter().any(|&g| g < 1) || prod(&grid_dim) > MAX_BLOCKS {
            return mapping_err(format!(
                "grid_dim {grid_dim:?}: every grid dim must be ≥ 1 (at most 2^31 blocks in all)"
            ));
        }
        if block_dim.iter().any(|&b| b < 1) || prod(&block_dim) > 1024 {
            return mapping_err(format!(
                "block_dim {block_dim:?}: every block dim must be ≥ 1 and their product (threads per block) between 1 and 1024"
            ));
        }
        if !(1..=MAX_FORLOOP).contains(&forloop_range) {
            return mapping_err(format!(
                "forloop_range {forloop_range}: must be between 1 and 2^24"
            ));
        }
        if !(1..=(u32::MAX as i64)).contains(&reduction_dimx) {
            return mapping_err(format!("reduction_dimx {reduction_dimx}: must be ≥ 1"));
        }
        Ok(BlockGraph {
            grid_dim: grid_dim.map(|g| g as u32),
            block_dim: block_dim.map(|b| b as u32),
            forloop_range: forloop_range as u32,
            reduction_dimx: reduction_dimx as u32,
            ops: vec![],
            tiles: vec![],
            inputs: vec![],
            outputs: vec![],
            split_extent: [None; 3],
            masked: [false; 3],
            walk_extent: None,
            loop_masked: false,
            loop_tile: None,
        })
    }

    /// Walk the loop's dims in tiles of `tile` elements instead of `ceil(extent /
    /// forloop_range)`; every walked dim's extent `E` must then satisfy `(forloop_range-1)·tile
    /// < E ≤ forloop_range·tile`. Set it before the first input: printers pad tiles to a power
    /// of two, so a power-of-two tile of a masked loop reads aligned, whole tiles where the
    /// default tile (63 of 2000 in 32 iterations) starts each tile off alignment.
    pub fn set_loop_tile(&mut self, tile: i64) -> Result<()> {
        if !self.inputs.is_empty() {
            return mapping_err(format!(
                "loop tile {tile}: set it before the first input ({} declared)",
                self.inputs.len()
            ));
        }
        if self.forloop_range < 2 || !(1..=(u32::MAX as i64)).contains(&tile) {
            return mapping_err(format!(
                "loop tile {tile}: needs forloop_range ≥ 2 (it is {}) and a tile ≥ 1",
                self.forloop_range
            ));
        }
        self.loop_tile = Some(tile as u32);
        Ok(())
    }

    /// The loop's explicit tile, when it differs from the default `ceil(extent /
    /// forloop_range)` of the walked extent (what JSON, hashes and listings record: setting
    /// the default tile changes nothing).
    pub fn loop_tile(&self) -> Option<u32> {
        let (t, e) = (self.loop_tile?, self.walk_extent?);
        (t as usize != e.div_ceil(self.forloop_range as usize)).then_some(t)
    }

    /// The tile the loop walks a per-block extent of `extent` in.
    fn walk_tile(&self, extent: usize) -> usize {
        self.loop_tile.map_or_else(
            || extent.div_ceil(self.forloop_range as usize),
            |t| t as usize,
        )
    }

    /// `Some(E)` when the loop is masked: its tiles do not cover the extent `E` of the dims it
    /// walks exactly, so the last iteration's tile runs past `E`.
    pub fn loop_extent(&self) -> Option<usize> {
        self.walk_extent.filter(|_| self.loop_masked)
    }

    /// How many elements an `rms` accumulator over a loop-body tile whose last dim has
    /// `last` elements averages over: `last · forloop_range`, less the masked loop's padding
    /// when that dim is the walked one.
    pub fn rms_count(&self, last: usize) -> usize {
        let f = self.forloop_range as usize;
        match self.loop_extent() {
            Some(e) if last == self.walk_tile(e) => e,
            _ => last * f,
        }
    }

    /// Per grid axis: `Some(E)` when the axis is masked (its grid does not divide the
    /// extent `E` of the dims it splits, so the last block's tile runs past `E`).
    pub fn masked_axes(&self) -> [Option<usize>; 3] {
        std::array::from_fn(|a| {
            if self.masked[a] {
                self.split_extent[a]
            } else {
                None
            }
        })
    }

    pub fn grid_dim(&self) -> [u32; 3] {
        self.grid_dim
    }
    pub fn block_dim(&self) -> [u32; 3] {
        self.block_dim
    }
    pub fn forloop_range(&self) -> u32 {
        self.forloop_range
    }
    pub fn reduction_dimx(&self) -> u32 {
        self.reduction_dimx
    }
    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.grid_dim.iter().map(|&g| g as usize).product()
    }
    pub fn ops(&self) -> &[BlockOpKind] {
        &self.ops
    }
    pub fn tiles(&self) -> &[TileInfo] {
        &self.tiles
    }
    /// Tile ids of the inputs, in declaration order.
    pub fn inputs(&self) -> &[TileId] {
        &self.inputs
    }
    pub fn outputs(&self) -> &[BlockOutput] {
        &self.outputs
    }
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }
    /// Kernel-level dims of each output.
    pub fn output_dims(&self) -> Vec<Dims> {
        self.outputs.iter().map(|o| o.dims.clone()).collect()
    }
    /// Kernel-level `(dims, dtype)` of each input, in order.
    pub fn input_signature(&self) -> Vec<(Dims, DType)> {
        self.inputs
            .iter()
            .filter_map(|&t| match &self.ops[t] {
                BlockOpKind::Input {
                    kernel_dims, dtype, ..
                } => Some((kernel_dims.clone(), *dtype)),
                _ => None,
            })
            .collect()
    }

    /// Metadata of tile `t`, or a GraphError naming the valid range.
    pub fn tile(&self, t: TileId) -> Result<&TileInfo> {
        self.tiles.get(t).ok_or_else(|| {
            crate::CoreError::Graph(format!(
                "unknown tile id t{t}: this block graph has {} tiles (t0..t{})",
                self.tiles.len(),
                self.tiles.len() as i64 - 1
            ))
        })
    }

    /// Geometry of the input op `kernel_dims/imap/fmap` under this graph's grid and loop
    /// (a split dim's block slice is `ceil(extent / grid)`, see masked edge tiles above).
    pub fn input_geometry(
        &self,
        kernel_dims: &[usize],
        imap: [i32; 3],
        fmap: i32,
    ) -> InputGeometry {
        let mut block_dims = kernel_dims.to_vec();
        for (&g, &d) in self.grid_dim.iter().zip(&imap) {
            if g > 1 && d >= 0 {
                let d = d as usize;
                block_dims[d] = block_dims[d].div_ceil(g as usize);
            }
        }
        let mut tile_dims = block_dims.clone();
        if fmap >= 0 {
            let d = fmap as usize;
            tile_dims[d] = self.walk_tile(tile_dims[d]);
        }
        InputGeometry {
            block_dims,
            tile_dims,
        }
    }

    fn push(&mut self, what: &str, kind: BlockOpKind, dims: Dims, dtype: DType) -> Result<TileId> {
        let mut operands: Vec<(usize, Phase)> = kind
            .operands()
            .into_iter()
            .map(|t| (t, self.tiles[t].phase))
            .collect();
        // Inputs loaded once (fmap = -1) are loop-invariant: an after-loop op may read them
        // (e.g. LoRA's `accum(X·A) · B` with B loaded once), so they never force the
        // loop-body phase on an op that also reads after-loop tiles.
        if kind.phase_class() == PhaseClass::Compute
            && operands.iter().any(|(_, p)| *p == Phase::AfterLoop)
        {
            operands.retain(|(t, _)| !matches!(self.ops[*t], BlockOpKind::Input { fmap: -1, .. }));
        }
        let phase = infer_phase(what, kind.phase_class(), &operands)?;
        self.ops.push(kind);
        self.tiles.push(TileInfo { dims, dtype, phase });
        Ok(self.tiles.len() - 1)
    }

    /// Declare the next input: a kernel tensor of `dims`/`dtype` mapped by `imap`/`fmap`.
    pub fn new_input(
        &mut self,
        dims: &[i64],
        dtype: DType,
        imap: [i64; 3],
        fmap: i64,
    ) -> Result<TileId> {
        let what = format!("block input #{}", self.inputs.len());
        let kdims = validate_dims(&what, dims)?;
        let rank = kdims.len() as i64;
        let mut nimap = [-1i32; 3];
        let mut splits = vec![];
        for a in 0..3 {
            if imap[a] < -1 || imap[a] >= rank {
                return mapping_err(format!(
                    "{what}: input_map {imap:?}: entry for grid axis {} is {}, expected -1 (replicated) or a dim of {} (0..{})",
                    axis_name(a), imap[a], fmt_dims(&kdims), rank - 1
                ));
            }
            if self.grid_dim[a] > 1 && imap[a] >= 0 {
                let d = imap[a] as usize;
                if let Some(b) = (0..a).find(|&b| nimap[b] == imap[a] as i32) {
                    return mapping_err(format!(
                        "{what}: input_map {imap:?}: grid axes {} and {} both split dim {d}; each dim can be split by one grid axis only",
                        axis_name(b), axis_name(a)
                    ));
                }
                let masked = self.check_split(&what, a, kdims[d], fmap == d as i64)?;
                splits.push((a, kdims[d], masked));
                nimap[a] = imap[a] as i32;
            }
        }
        if fmap < -1 || fmap >= rank {
            return mapping_err(format!(
                "{what}: forloop_dim {fmap}: expected -1 (loaded once) or a dim of {} (0..{})",
                fmt_dims(&kdims),
                rank - 1
            ));
        }
        let nfmap = if self.forloop_range > 1 {
            fmap as i32
        } else {
            -1
        };
        let geo = self.input_geometry(&kdims, nimap, -1);
        let walk = if nfmap >= 0 {
            let d = nfmap as usize;
            let split = (0..3).any(|a| nimap[a] == nfmap);
            Some(self.check_walk(&what, d, geo.block_dims[d], split)?)
        } else {
            None
        };
        let tile = self.input_geometry(&kdims, nimap, nfmap).tile_dims;
        let id = self.push(
            &what,
            BlockOpKind::Input {
                kernel_dims: kdims,
                dtype,
                imap: nimap,
                fmap: nfmap,
            },
            tile,
            dtype,
        )?;
        for (a, extent, masked) in splits {
            self.split_extent[a].get_or_insert(extent);
            self.masked[a] |= masked;
        }
        if let Some((extent, masked)) = walk {
            self.walk_extent.get_or_insert(extent);
            self.loop_masked |= masked;
        }
        self.inputs.push(id);
        Ok(id)
    }

    /// Check that grid axis `a` may split a dim of `extent`: every block owns part of it, and
    /// a masked axis splits dims of one extent that the loop does not walk. Returns whether
    /// this split is masked (the caller records it once the input is added).
    fn check_split(&self, what: &str, a: usize, extent: usize, walked: bool) -> Result<bool> {
        let g = self.grid_dim[a] as usize;
        let t = extent.div_ceil(g);
        let ax = axis_name(a);
        if (g - 1) * t >= extent {
            return mapping_err(format!(
                "{what}: grid_dim.{ax} ({g}) splits a dim of size {extent} into tiles of {t}, leaving the last block(s) empty; use at most {} blocks",
                extent.div_ceil(t.max(1)).max(1).min(extent)
            ));
        }
        let masked = extent % g != 0;
        let first = self.split_extent[a].unwrap_or(extent);
        if (masked || self.masked[a]) && first != extent {
            return mapping_err(format!(
                "{what}: grid_dim.{ax} ({g}) does not divide every dim it splits (sizes {first} and {extent}); a masked axis must split dims of one extent"
            ));
        }
        if masked && self.forloop_range > 1 && walked {
            return mapping_err(format!(
                "{what}: the for-loop walks a dim of size {extent} that grid_dim.{ax} ({g}) does not divide; the loop may not walk a masked dim"
            ));
        }
        Ok(masked)
    }

    /// Check that the loop may walk dim `d` of per-block extent `extent` (`split`: a grid
    /// axis splits it too): every iteration owns part of it, and a masked loop walks dims of
    /// one extent that no grid axis splits. Returns (extent, whether this walk is masked).
    fn check_walk(
        &self,
        what: &str,
        d: usize,
        extent: usize,
        split: bool,
    ) -> Result<(usize, bool)> {
        let f = self.forloop_range as usize;
        let t = self.walk_tile(extent);
        if (f - 1) * t >= extent {
            return mapping_err(format!(
                "{what}: forloop_dim {d}: forloop_range ({f}) walks a per-block size of {extent} in tiles of {t}, leaving the last iteration(s) empty; use a forloop_range that divides {extent} or at most {}",
                extent.div_ceil(t.max(1)).max(1).min(extent)
            ));
        }
        if f * t < extent {
            return mapping_err(format!(
                "{what}: forloop_dim {d}: forloop_range ({f}) tiles of {t} cover {} of a per-block size of {extent}; use a loop tile of at least {}",
                f * t,
                extent.div_ceil(f)
            ));
        }
        let masked = f * t != extent;
        if masked && split {
            return mapping_err(format!(
                "{what}: forloop_dim {d}: forloop_range ({f}) does not divide the per-block size {extent} of a dim a grid axis splits; a masked loop walks only dims no grid axis splits"
            ));
        }
        let first = self.walk_extent.unwrap_or(extent);
        if (masked || self.loop_masked) && first != extent {
            return mapping_err(format!(
                "{what}: forloop_dim {d}: forloop_range ({f}) does not divide every dim the loop walks (sizes {first} and {extent}); a masked loop must walk dims of one extent"
            ));
        }
        Ok((extent, masked))
    }

    /// Tile matmul (2-D, or batched over equal leading dims).
    pub fn matmul(&mut self, a: TileId, b: TileId) -> Result<TileId> {
        let what = format!("block matmul(t{a}, t{b})");
        let (ta, tb) = (self.tile(a)?.clone(), self.tile(b)?.clone());
        let dims = matmul_dims(&what, &ta.dims, &tb.dims)?;
        let dtype = same_dtype(&what, &[ta.dtype, tb.dtype])?;
        self.push(&what, BlockOpKind::Matmul { a, b }, dims, dtype)
    }

    /// Elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: TileId) -> Result<TileId> {
        let t = self.tile(x)?.clone();
        self.push(
            &format!("block {}(t{x})", op.name()),
            BlockOpKind::Unary { op, x },
            t.dims,
            t.dtype,
        )
    }

    /// Elementwise binary op (size-1 broadcasting).
    pub fn binary(&mut self, op: BinaryOp, a: TileId, b: TileId) -> Result<TileId> {
        let what = format!("block {}(t{a}, t{b})", op.name());
        let (ta, tb) = (self.tile(a)?.clone(), self.tile(b)?.clone());
        let dims = broadcast_dims(&what, &ta.dims, &tb.dims)?;
        let dtype = same_dtype(&what, &[ta.dtype, tb.dtype])?;
        self.push(&what, BlockOpKind::Binary { op, a, b }, dims, dtype)
    }

    /// Sum over `dim`, keepdim.
    pub fn reduction(&mut self, x: TileId, dim: i64) -> Result<TileId> {
        let what = format!("block reduction(t{x}, dim={dim})");
        let t = self.tile(x)?.clone();
        let d = norm_dim(&what, dim, t.dims.len())?;
        self.push(
            &what,
            BlockOpKind::Reduction { x, dim: d },
            keepdim_dims(&t.dims, d),
            t.dtype,
        )
    }

    /// Sum `dim` in strided groups (out[j] = Σ_g x[g·dimx + j]) down to `reduction_dimx` elements.
    pub fn reduction_to_dimx(&mut self, x: TileId, dim: i64) -> Result<TileId> {
        let what = format!("block reduction_to_dimx(t{x}, dim={dim})");
        let t = self.tile(x)?.clone();
        let d = norm_dim(&what, dim, t.dims.len())?;
        let k = self.reduction_dimx as usize;
        if t.dims[d] % k != 0 {
            return shape_err(format!(
                "{what}: dim {d} of {} (size {}) is not divisible by reduction_dimx ({k})",
                fmt_dims(&t.dims),
                t.dims[d]
            ));
        }
        let mut dims = t.dims.clone();
        dims[d] = k;
        self.push(
            &what,
            BlockOpKind::ReductionToDimx { x, dim: d },
            dims,
            t.dtype,
        )
    }

    /// RMS normalisation over the last dim (no weight).
    pub fn rms_norm(&mut self, x: TileId, eps: f64) -> Result<TileId> {
        let what = format!("block rms_norm(t{x})");
        let eps = check_eps(&what, eps)?;
        let t = self.tile(x)?.clone();
        self.push(&what, BlockOpKind::RmsNorm { x, eps }, t.dims, t.dtype)
    }

    /// Concatenate along `dim`.
    pub fn concat(&mut self, xs: &[TileId], dim: i64) -> Result<TileId> {
        let what = format!("block concat({xs:?}, dim={dim})");
        if xs.is_empty() {
            return graph_err(format!("{what}: needs at least one tile"));
        }
        let infos: Vec<TileInfo> = xs
            .iter()
            .map(|&t| self.tile(t).cloned())
            .collect::<Result<_>>()?;
        let d = norm_dim(&what, dim, infos[0].dims.len())?;
        let parts: Vec<&[usize]> = infos.iter().map(|i| i.dims.as_slice()).collect();
        let dims = concat_dims(&what, &parts, d)?;
        let dtypes: Vec<DType> = infos.iter().map(|i| i.dtype).collect();
        let dtype = same_dtype(&what, &dtypes)?;
        self.push(
            &what,
            BlockOpKind::Concat {
                xs: xs.to_vec(),
                dim: d,
            },
            dims,
            dtype,
        )
    }

    /// For-loop accumulator.
    pub fn forloop_accum(&mut self, x: TileId, kind: AccumKind) -> Result<TileId> {
        let what = format!("forloop_accum(t{x}, {})", kind.name().unwrap_or("None"));
        let t = self.tile(x)?.clone();
        let last = t.dims.len() - 1;
        let mut dims = t.dims.clone();
        match kind {
            AccumKind::Iter => {}
            AccumKind::Sum | AccumKind::Rms { .. } => dims[last] = 1,
            AccumKind::SumToDimx => {
                let k = self.reduction_dimx as usize;
                if dims[last] % k != 0 {
                    return shape_err(format!(
                        "{what}: last dim of {} ({}) is not divisible by reduction_dimx ({k})",
                        fmt_dims(&t.dims),
                        dims[last]
                    ));
                }
                dims[last] = k;
            }
        }
        if let AccumKind::Rms { eps } = kind {
            check_eps(&what, eps)?;
        }
        self.push(&what, BlockOpKind::ForloopAccum { x, kind }, dims, t.dtype)
    }

    /// Mark after-loop tile `x` as the next output, placed by `omap`; returns its index.
    pub fn new_output(&mut self, x: TileId, omap: [i64; 3]) -> Result<usize> {
        let what = format!("block output #{} (tile t{x})", self.outputs.len());
        let t = self.tile(x)?.clone();
        check_output_phase(x, t.phase)?;
        let rank = t.dims.len() as i64;
        let mut nomap = [-1i32; 3];
        let mut dims = t.dims.clone();
        for a in 0..3 {
            if omap[a] < -1 || omap[a] >= rank {
                return mapping_err(format!(
                    "{what}: output_map {omap:?}: entry for grid axis {} is {}, expected a dim of tile {} (0..{})",
                    axis_name(a), omap[a], fmt_dims(&t.dims), rank - 1
                ));
            }
            if self.grid_dim[a] > 1 {
                if omap[a] < 0 {
                    return mapping_err(format!(
                        "{what}: output_map {omap:?}: grid axis {} has {} blocks but maps to no output dim (-1), so the blocks would overwrite each other; map it to a distinct output dim",
                        axis_name(a), self.grid_dim[a]
                    ));
                }
                if let Some(b) = (0..a).find(|&b| nomap[b] == omap[a] as i32) {
                    return mapping_err(format!(
                        "{what}: output_map {omap:?}: grid axes {} and {} both map to output dim {}; blocks would overwrite each other, use distinct dims",
                        axis_name(b), axis_name(a), omap[a]
                    ));
                }
                nomap[a] = omap[a] as i32;
                let d = omap[a] as usize;
                dims[d] = self.output_extent(&what, a, dims[d])?;
            }
        }
        check_elems(&what, &dims)?;
        self.outputs.push(BlockOutput {
            tile: x,
            omap: nomap,
            dims,
        });
        Ok(self.outputs.len() - 1)
    }

    /// Kernel-level extent of an output dim of tile size `tile` placed along grid axis `a`:
    /// the axis' true extent when it is masked (the tile must then be the axis' tile).
    fn output_extent(&self, what: &str, a: usize, tile: usize) -> Result<usize> {
        let g = self.grid_dim[a] as usize;
        match self.masked_axes()[a] {
            None => Ok(tile.saturating_mul(g)),
            Some(e) if e.div_ceil(g) == tile => Ok(e),
            Some(e) => mapping_err(format!(
                "{what}: grid axis {} is masked at extent {e} (tiles of {}), but this output's tile along it has size {tile}; place an output along a masked axis by a dim of the axis' tile",
                axis_name(a),
                e.div_ceil(g)
            )),
        }
    }

    /// Check the graph is usable inside a customized op: at least one output.
    pub fn check_complete(&self) -> Result<()> {
        if self.outputs.is_empty() {
            return graph_err("block graph has no outputs; call new_output on an accumulated tile");
        }
        Ok(())
    }

    /// Human-readable listing, one op per line, each prefixed by `indent`.
    pub fn describe(&self, indent: &str) -> String {
        let mut s = format!(
            "{indent}block graph grid={:?} block={:?} forloop={}{} reduction_dimx={}\n",
            self.grid_dim,
            self.block_dim,
            self.forloop_range,
            self.loop_tile()
                .map_or_else(String::new, |t| format!(" (tiles of {t})")),
            self.reduction_dimx
        );
        for (i, op) in self.ops.iter().enumerate() {
            let t = &self.tiles[i];
            let body = match op {
                BlockOpKind::Input {
                    kernel_dims,
                    dtype,
                    imap,
                    fmap,
                } => format!(
                    "input({} {dtype}, imap={imap:?}, fmap={fmap})",
                    fmt_dims(kernel_dims)
                ),
                BlockOpKind::Matmul { a, b } => format!("matmul(t{a}, t{b})"),
                BlockOpKind::Unary { op, x } => {
                    let p = op.params();
                    if p.is_empty() {
                        format!("{}(t{x})", op.name())
                    } else {
                        format!("{}(t{x}, {p:?})", op.name())
                    }
                }
                BlockOpKind::Binary { op, a, b } => format!("{}(t{a}, t{b})", op.name()),
                BlockOpKind::Reduction { x, dim } => format!("reduction(t{x}, dim={dim})"),
                BlockOpKind::ReductionToDimx { x, dim } => {
                    format!("reduction_to_dimx(t{x}, dim={dim})")
                }
                BlockOpKind::RmsNorm { x, eps } => format!("rms_norm(t{x}, eps={eps:e})"),
                BlockOpKind::Concat { xs, dim } => {
                    let v: Vec<String> = xs.iter().map(|x| format!("t{x}")).collect();
                    format!("concat([{}], dim={dim})", v.join(", "))
                }
                BlockOpKind::ForloopAccum { x, kind } => match kind {
                    AccumKind::Rms { eps } => format!("forloop_accum(t{x}, rms, eps={eps:e})"),
                    k => format!("forloop_accum(t{x}, {})", k.name().unwrap_or("None")),
                },
            };
            let ph = match t.phase {
                Phase::LoopBody => "loop",
                Phase::AfterLoop => "after",
            };
            s += &format!(
                "{indent}  t{i} = {body} -> {} {} [{ph}]\n",
                fmt_dims(&t.dims),
                t.dtype
            );
        }
        for (k, o) in self.outputs.iter().enumerate() {
            s += &format!(
                "{indent}  out{k} = t{} omap={:?} -> {}\n",
                o.tile,
                o.omap,
                fmt_dims(&o.dims)
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn bg(grid: [i64; 3], f: i64) -> BlockGraph {
        BlockGraph::new(grid, [128, 1, 1], f, 1).unwrap()
    }

    #[test]
    fn new_validates_ranges() {
        assert!(BlockGraph::new([0, 1, 1], [1, 1, 1], 1, 1).is_err());
        assert!(BlockGraph::new([1, 1, 1], [1025, 1, 1], 1, 1).is_err());
        assert!(BlockGraph::new([1, 1, 1], [32, 32, 2], 1, 1).is_err());
        assert!(BlockGraph::new([1, 1, 1], [1, 1, 1], 0, 1).is_err());
        assert!(BlockGraph::new([1, 1, 1], [1, 1, 1], 1, 0).is_err());
        assert!(BlockGraph::new([1 << 40, 1 << 40, 1 << 40], [1, 1, 1], 1, 1).is_err());
        assert!(BlockGraph::new([1, 1, 1], [i64::MAX, i64::MAX, 2], 1, 1).is_err());
        let mut g = BlockGraph::new([1 << 30, 1, 1], [1, 1, 1], 1, 1).unwrap();
        let x = g
            .new_input(&[1 << 30, 1 << 10], DType::F32, [-1, -1, -1], -1)
            .unwrap();
        let a = g.forloop_accum(x, AccumKind::Iter).unwrap();
        assert_eq!(
            g.new_output(a, [1, -1, -1]).unwrap_err().kind(),
            ErrorKind::Shape
        );
        assert_eq!(
            BlockGraph::new([1, 1, 1], [1, 1, 1], 0, 1)
                .unwrap_err()
                .kind(),
            ErrorKind::Mapping
        );
    }

    #[test]
    fn input_tiles() {
        let mut g = bg([4, 2, 1], 4);
        let x = g.new_input(&[8, 64], DType::F32, [1, 0, 0], 1).unwrap();
        // dim1: 64/4 = 16, then /4 for the loop = 4; dim0: 8/2 = 4; z ignored (grid 1).
        assert_eq!(g.tile(x).unwrap().dims, vec![4, 4]);
        match &g.ops()[x] {
            BlockOpKind::Input { imap, .. } => assert_eq!(*imap, [1, 0, -1]),
            _ => unreachable!(),
        }
        assert!(g.new_input(&[8, 64], DType::F32, [1, 1, -1], -1).is_err()); // collision
                                                                             // masked axes split dims of one extent: y already splits 8, x already splits 64
        assert!(g.new_input(&[5, 64], DType::F32, [1, 0, -1], -1).is_err());
        assert!(g.new_input(&[8, 62], DType::F32, [1, 0, -1], -1).is_err());
        assert!(g.new_input(&[8, 64], DType::F32, [2, -1, -1], -1).is_err()); // out of range
        assert!(g.new_input(&[8, 8], DType::F32, [-1, -1, -1], 0).is_ok());
        assert!(g.new_input(&[8, 6], DType::F32, [-1, -1, -1], 1).is_err()); // 6 % 4
    }

    #[test]
    fn phases_and_outputs() {
        let mut g = bg([4, 1, 1], 2);
        let x = g.new_input(&[8, 64], DType::F32, [-1, -1, -1], 1).unwrap();
        let w = g.new_input(&[64, 96], DType::F32, [1, -1, -1], 0).unwrap();
        let m = g.matmul(x, w).unwrap();
        assert_eq!(g.tile(m).unwrap().dims, vec![8, 24]);
        let e = g.new_output(m, [1, -1, -1]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Mapping);
        assert!(e.to_string().contains("must come after forloop_accum"));
        let acc = g.forloop_accum(m, AccumKind::Iter).unwrap();
        let r = g.forloop_accum(x, AccumKind::Rms { eps: 1e-6 }).unwrap();
        assert_eq!(g.tile(r).unwrap().dims, vec![8, 1]);
        assert!(g.binary(BinaryOp::Div, acc, m).is_err()); // mixes phases
        let out = g.binary(BinaryOp::Div, acc, r).unwrap();
        assert!(g.new_output(out, [-1, -1, -1]).is_err()); // grid x > 1 needs a dim
        assert_eq!(g.new_output(out, [1, 0, 0]).unwrap(), 0);
        assert_eq!(g.output_dims(), vec![vec![8, 96]]);
        assert!(g.forloop_accum(acc, AccumKind::Iter).is_err());
        assert!(g.tile(99).is_err());
    }

    #[test]
    fn reductions() {
        let mut g = BlockGraph::new([1, 1, 1], [32, 1, 1], 1, 4).unwrap();
        let x = g.new_input(&[8, 64], DType::F16, [-1, -1, -1], -1).unwrap();
        let r = g.reduction(x, -1).unwrap();
        assert_eq!(g.tile(r).unwrap().dims, vec![8, 1]);
        let r = g.reduction_to_dimx(x, 1).unwrap();
        assert_eq!(g.tile(r).unwrap().dims, vec![8, 4]);
        let s = g.forloop_accum(x, AccumKind::SumToDimx).unwrap();
        assert_eq!(g.tile(s).unwrap().dims, vec![8, 4]);
        let c = g.concat(&[x, x], 0).unwrap();
        assert_eq!(g.tile(c).unwrap().dims, vec![16, 64]);
        let y = g.new_input(&[8, 64], DType::F32, [-1, -1, -1], -1).unwrap();
        assert_eq!(
            g.binary(BinaryOp::Add, x, y).unwrap_err().kind(),
            ErrorKind::DType
        );
        let z = g.new_input(&[8, 6], DType::F16, [-1, -1, -1], -1).unwrap();
        assert!(g.reduction_to_dimx(z, 1).is_err());
    }

    #[test]
    fn masked_loop() {
        let mut g = BlockGraph::new([2, 1, 1], [128, 1, 1], 65, 1).unwrap();
        let x = g.new_input(&[8, 4099], DType::F32, [0, -1, -1], 1).unwrap();
        assert_eq!(g.tiles()[x].dims, vec![4, 64]);
        assert_eq!(g.loop_extent(), Some(4099));
        assert_eq!(g.rms_count(64), 4099);
        assert_eq!(g.rms_count(8), 8 * 65);
        // every walked dim has the masked extent
        let e = g
            .new_input(&[4100, 16], DType::F32, [-1; 3], 0)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("a masked loop must walk dims of one extent"),
            "{e}"
        );
        g.new_input(&[4099, 16], DType::F32, [-1; 3], 0).unwrap();
        // a masked loop walks no dim a grid axis splits
        let mut s = BlockGraph::new([2, 1, 1], [128, 1, 1], 3, 1).unwrap();
        let e = s
            .new_input(&[8, 64], DType::F32, [1, -1, -1], 1)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("a masked loop walks only dims no grid axis splits"),
            "{e}"
        );
        // every iteration owns part of the walked dim
        let mut z = BlockGraph::new([1, 1, 1], [128, 1, 1], 50, 1).unwrap();
        let e = z.new_input(&[8, 64], DType::F32, [-1; 3], 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("leaving the last iteration(s) empty"),
            "{e}"
        );
        // a dividing loop stays unmasked
        let mut d = BlockGraph::new([1, 1, 1], [128, 1, 1], 64, 1).unwrap();
        d.new_input(&[8, 4096], DType::F32, [-1; 3], 1).unwrap();
        assert_eq!(d.loop_extent(), None);
    }

    #[test]
    fn masked_edge_tiles() {
        let mut g = bg([7, 1, 1], 4);
        // 100 over 7 blocks: tiles of 15, the last block owns 10.
        let w = g.new_input(&[64, 100], DType::F32, [1, -1, -1], 0).unwrap();
        assert_eq!(g.tile(w).unwrap().dims, vec![16, 15]);
        assert_eq!(g.masked_axes(), [Some(100), None, None]);
        // another dim split by the masked axis must have the same extent
        let e = g
            .new_input(&[64, 105], DType::F32, [1, -1, -1], 0)
            .unwrap_err();
        assert!(e.to_string().contains("one extent"), "{e}");
        // the loop may not walk a masked dim
        let e = g
            .new_input(&[100, 64], DType::F32, [0, -1, -1], 0)
            .unwrap_err();
        assert!(e.to_string().contains("may not walk a masked dim"), "{e}");
        let acc = g.forloop_accum(w, AccumKind::Sum).unwrap();
        let e = g.new_output(acc, [1, -1, -1]).unwrap_err();
        assert!(e.to_string().contains("masked at extent 100"), "{e}");
        let it = g.forloop_accum(w, AccumKind::Iter).unwrap();
        g.new_output(it, [1, -1, -1]).unwrap();
        assert_eq!(g.output_dims(), vec![vec![16, 100]]);
        // 9 over 4 blocks would leave the last block empty (tiles of 3)
        let mut h = bg([4, 1, 1], 1);
        let e = h
            .new_input(&[9, 8], DType::F32, [0, -1, -1], -1)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Mapping);
        assert!(e.to_string().contains("use at most 3 blocks"), "{e}");
        // dividing grids stay unmasked
        let mut d = bg([4, 1, 1], 1);
        d.new_input(&[8, 64], DType::F32, [1, -1, -1], -1).unwrap();
        assert_eq!(d.masked_axes(), [None; 3]);
    }
}
