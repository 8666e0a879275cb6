//! Lowering of a µGraph to a KernelPlan (format `yirage.kernel_plan`, version 3).
//!
//! The plan is the contract with every code generator; `docs/kernel-plan.md` is its
//! specification and this module its only producer. It makes the schedule explicit
//! (buffers, kernels in order, tile offsets as `Σ var·stride`, op phases, safe-softmax
//! groups, shared-memory size) and carries the analyses printers would otherwise repeat
//! (module `analysis`: loop-invariant ops as phase `pre`, matmuls accumulated straight into
//! their accumulator, safe-softmax rescale degrees, the loop split), so printers need no
//! analysis of their own. Lowering also
//! validates the plan against a [`DeviceSpec`] (shared memory, threads per block), which is
//! how the search rejects candidates a device cannot run.
//!
//! The same walk yields the [`KernelProfile`]s of the cost model, so ranking and code
//! generation always see the same kernels.

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::cost::{
    CollectiveKind, CollectiveProfile, DeviceSpec, KernelProfile, MatmulProfile, ReadProfile,
};
use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::kernel_graph::{KernelGraph, KernelOpKind, TensorId};
use crate::masked_loop::masked_exps;
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use crate::phase::Phase;
use crate::shape::numel;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod analysis;
pub use analysis::loop_split;
mod exp_shift;
pub use exp_shift::{exp_shifts, unsafe_exp_into_kernel};
mod shift_carry;
pub use shift_carry::{ShiftCarry, ShiftLoad, ShiftStore};

/// Format name of a plan document.
pub const FORMAT: &str = "yirage.kernel_plan";
/// Format version (3: the analysed fields `accumulate_into`, `rescale` and `loop_split`).
pub const VERSION: u32 = 3;
/// Bytes per element of intermediate buffers (fp32 regardless of the graph dtype).
pub const INTERMEDIATE_BYTES: usize = 4;

/// A whole plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPlan {
    pub format: String,
    pub version: u32,
    pub graph_hash: String,
    pub buffers: Vec<Buffer>,
    pub kernels: Vec<PlanKernel>,
}

/// A device buffer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub id: usize,
    pub dims: Vec<usize>,
    pub dtype: String,
    /// `input`, `output` or `intermediate`.
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

/// One kernel of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PlanKernel {
    Library(LibraryKernel),
    Generated(GeneratedKernel),
}

impl PlanKernel {
    /// `"library"` or `"generated"`.
    pub fn kind(&self) -> &'static str {
        match self {
            PlanKernel::Library(_) => "library",
            PlanKernel::Generated(_) => "generated",
        }
    }
}

/// A framework/BLAS call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibraryKernel {
    pub op: String,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    pub params: Value,
}

/// A generated block program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeneratedKernel {
    pub name: String,
    pub grid: [u32; 3],
    pub block_threads: u32,
    pub warps: u32,
    pub forloop_range: u32,
    pub inputs: Vec<TileIo>,
    pub ops: Vec<TileOp>,
    pub outputs: Vec<TileOut>,
    pub safe_softmax: Vec<SafeSoftmax>,
    /// Undoing of shifted partial inputs (module `shift_carry`, docs/kernel-plan.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift_carry: Option<ShiftCarry>,
    pub smem_bytes: u64,
    /// Ways a GPU printer splits the for-loop across extra blocks (1: not split), see
    /// [`loop_split`].
    pub loop_split: u32,
}

/// `var·stride` term of a tile offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offset {
    /// `bx`, `by`, `bz` or `iter`.
    pub var: String,
    pub stride: usize,
}

/// An input tile stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileIo {
    pub buffer: usize,
    pub dims: Vec<usize>,
    pub tile: Vec<usize>,
    pub offsets: Vec<Vec<Offset>>,
    /// Maxima of a shifted partial input (module `shift_carry`, docs/kernel-plan.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift_load: Option<ShiftLoad>,
    /// Dims whose last block's tile runs past the buffer (masked edge tiles): elements past
    /// `extent` load as zero.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<MaskedDim>,
}

/// A tile dim of a masked edge tile: the grid does not divide the buffer's `extent`, so
/// the last block's tile runs past it; loads read zeros there, stores skip it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskedDim {
    pub dim: usize,
    pub extent: usize,
}

/// An output tile store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileOut {
    pub buffer: usize,
    pub src: usize,
    pub tile: Vec<usize>,
    pub offsets: Vec<Vec<Offset>>,
    /// Dims whose last block's tile runs past the buffer: elements past `extent` are not
    /// stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<MaskedDim>,
}

/// One tile op (fields present depending on `op`, see docs/kernel-plan.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileOp {
    pub id: usize,
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unop: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binop: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimx: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extent: Option<usize>,
    pub dims: Vec<usize>,
    /// `pre`, `loop`, `accum` or `epilogue`; ops whose value is the same in every iteration
    /// are `pre` (hoisted before the loop).
    pub phase: String,
    /// A loop matmul whose only reader is this `iter` accumulator (same dims): printers add
    /// its product straight into the accumulator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulate_into: Option<usize>,
    /// An exp whose input carries a masked loop's padding along `dim`: in iteration `i` the
    /// elements `i·dims[dim] + j ≥ extent` are padding, which the exp maps to zero (printers
    /// fill −∞ there before the exp and its safe-softmax max).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<MaskedDim>,
}

/// A safe-softmax group (see docs/kernel-plan.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SafeSoftmax {
    pub exp: usize,
    pub accums: Vec<usize>,
    /// Outputs stored shifted by `exp(−m)` (degree 1), with `m` stored at `shift_store`.
    pub scale_outputs: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift_store: Option<ShiftStore>,
    /// Accumulators multiplied by `exp(m_old − m_new)^degree` before each update: those of
    /// `accums` with a non-zero shift degree; empty when the exp is hoisted (`m` is fixed).
    pub rescale: Vec<Rescale>,
}

/// One accumulator of a safe-softmax group and the power of the rescale factor it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rescale {
    pub accum: usize,
    pub degree: i32,
}

impl KernelPlan {
    /// Canonical JSON (field order fixed by the types).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse a plan document (format and version checked).
    pub fn from_json(s: &str) -> Result<KernelPlan> {
        let p: KernelPlan = serde_json::from_str(s)
            .map_err(|e| CoreError::Serialization(format!("kernel plan: {e}")))?;
        if p.format != FORMAT || p.version != VERSION {
            return Err(CoreError::Serialization(format!(
                "kernel plan: format {:?} version {} is not {FORMAT:?} version {VERSION}",
                p.format, p.version
            )));
        }
        Ok(p)
    }
}

/// What the cost model and the shared-memory estimate need to know about one tile of a
/// block program: shared by [`block_profile`] (on a built [`BlockGraph`]) and the search's
/// size estimates (on a mapping not built yet), so both apply the same rules.
#[derive(Debug, Clone, PartialEq)]
pub struct TileDesc {
    pub kind: TileKind,
    pub operands: Vec<usize>,
    /// Tile dims (per block, per iteration).
    pub dims: Vec<usize>,
    /// Runs every iteration (loop body, including inputs and accumulator updates).
    pub in_loop: bool,
}

/// Kind of a [`TileDesc`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TileKind {
    /// An input tile: elements of the whole kernel tensor, bytes per element, and whether
    /// it walks the for-loop (`fmap ≥ 0`) or is loaded once.
    Input {
        kernel_numel: usize,
        elem_bytes: usize,
        walks_loop: bool,
    },
    Matmul,
    /// Elementwise op with a flop weight per element (transcendentals cost more).
    Elementwise {
        weight: f64,
    },
    /// Reductions and accumulators (one flop per element of the operand).
    Reduce {
        accumulator: bool,
    },
    RmsNorm,
}

fn unary_weight(op: UnaryOp) -> f64 {
    match op {
        UnaryOp::Exp | UnaryOp::Silu | UnaryOp::Gelu | UnaryOp::Sigmoid | UnaryOp::Tanh => 4.0,
        _ => 1.0,
    }
}

/// Tile descriptions of a built block graph (`in_bytes`: element size of each input).
pub fn tile_descs(bg: &BlockGraph, in_bytes: &[usize]) -> Vec<TileDesc> {
    let tiles = bg.tiles();
    let mut k = 0;
    bg.ops()
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let kind = match op {
                BlockOpKind::Input {
                    kernel_dims, fmap, ..
                } => {
                    let eb = in_bytes.get(k).copied().unwrap_or(INTERMEDIATE_BYTES);
                    k += 1;
                    TileKind::Input {
                        kernel_numel: numel(kernel_dims),
                        elem_bytes: eb,
                        walks_loop: *fmap >= 0,
                    }
                }
                BlockOpKind::Matmul { .. } => TileKind::Matmul,
                BlockOpKind::Unary { op, .. } => TileKind::Elementwise {
                    weight: unary_weight(*op),
                },
                BlockOpKind::Binary { .. } | BlockOpKind::Concat { .. } => {
                    TileKind::Elementwise { weight: 1.0 }
                }
                BlockOpKind::Reduction { .. } | BlockOpKind::ReductionToDimx { .. } => {
                    TileKind::Reduce { accumulator: false }
                }
                BlockOpKind::ForloopAccum { .. } => TileKind::Reduce { accumulator: true },
                BlockOpKind::RmsNorm { .. } => TileKind::RmsNorm,
            };
            let in_loop = match op {
                BlockOpKind::ForloopAccum { .. } => true,
                _ => tiles[i].phase == Phase::LoopBody,
            };
            TileDesc {
                kind,
                operands: op.operands(),
                dims: tiles[i].dims.clone(),
                in_loop,
            }
        })
        .collect()
}

/// Bytes of the tiles that must be resident at once (inputs at their dtype size,
/// everything computed in fp32), from a liveness scan in op order: accumulators live from
/// before the loop to their last use, inputs loaded once from the start to their last
/// use, other tiles from their definition to their last use. A loop matmul whose only
/// reader is an accumulator of its dims takes no room of its own: the lowering fuses it
/// into that accumulator (`accumulate_into`), and every printer adds the product in place.
pub fn smem_of(tiles: &[TileDesc], outputs: &[usize]) -> u64 {
    let n = tiles.len();
    let mut last_use: Vec<usize> = (0..n).collect();
    let mut readers: Vec<Vec<usize>> = vec![vec![]; n];
    for (i, t) in tiles.iter().enumerate() {
        for &a in &t.operands {
            if a < n {
                last_use[a] = last_use[a].max(i);
                readers[a].push(i);
            }
        }
    }
    let fused_into_accumulator = |i: usize| {
        let t = &tiles[i];
        matches!(t.kind, TileKind::Matmul)
            && t.in_loop
            && !outputs.contains(&i)
            && matches!(readers[i].as_slice(), [r] if {
                let acc = &tiles[*r];
                matches!(acc.kind, TileKind::Reduce { accumulator: true })
                    && acc.operands.len() == 1
                    && acc.dims == t.dims
            })
    };
    for &o in outputs {
        if o < n {
            last_use[o] = n;
        }
    }
    let mut start = vec![0usize; n];
    let mut bytes = vec![0u64; n];
    for (i, t) in tiles.iter().enumerate() {
        let elems = numel(&t.dims) as u64;
        match t.kind {
            TileKind::Input {
                elem_bytes,
                walks_loop,
                ..
            } => {
                bytes[i] = elems * elem_bytes as u64;
                start[i] = if walks_loop { i } else { 0 };
            }
            TileKind::Reduce { accumulator: true } => {
                bytes[i] = elems * INTERMEDIATE_BYTES as u64;
                start[i] = 0;
            }
            _ if fused_into_accumulator(i) => {}
            _ => {
                bytes[i] = elems * INTERMEDIATE_BYTES as u64;
                start[i] = i;
            }
        }
    }
    (0..=n)
        .map(|time| {
            (0..n)
                .filter(|&i| start[i] <= time && time <= last_use[i])
                .map(|i| bytes[i])
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// Shared memory of a built block graph (see [`smem_of`]).
pub fn smem_bytes(bg: &BlockGraph) -> u64 {
    let in_bytes: Vec<usize> = bg
        .ops()
        .iter()
        .filter_map(|o| match o {
            BlockOpKind::Input { dtype, .. } => Some(dtype.size_bytes()),
            _ => None,
        })
        .collect();
    let outs: Vec<usize> = bg.outputs().iter().map(|o| o.tile).collect();
    smem_of(&tile_descs(bg, &in_bytes), &outs)
}

/// Elements of a tile with its rows (second-to-last dim) padded as the GPU printers pad
/// tile matmuls (see [`crate::cost::GPU_DOT_MIN_ROWS`]).
fn dot_padded_numel(dims: &[usize]) -> usize {
    let r = dims.len();
    dims.iter()
        .enumerate()
        .map(|(i, &d)| {
            if r >= 2 && i == r - 2 {
                d.max(crate::cost::GPU_DOT_MIN_ROWS)
            } else {
                d
            }
        })
        .product()
}

/// Cost-model profile of a block program from its tile descriptions: `blocks` blocks,
/// `forloop` iterations, `out_bytes` = bytes written per output (whole kernel).
pub fn profile_of(
    tiles: &[TileDesc],
    blocks: u64,
    forloop: u32,
    out_bytes: &[f64],
    low_precision: bool,
) -> KernelProfile {
    let nb = blocks as f64;
    let f = forloop.max(1) as f64;
    let mut p = KernelProfile {
        library: false,
        blocks,
        low_precision,
        forloop,
        ..Default::default()
    };
    for (i, t) in tiles.iter().enumerate() {
        let reps = if t.in_loop { f } else { 1.0 } * nb;
        match t.kind {
            TileKind::Input {
                kernel_numel,
                elem_bytes,
                walks_loop,
            } => {
                let eb = elem_bytes as f64;
                let loads = if walks_loop { f } else { 1.0 };
                p.reads.push(ReadProfile {
                    unique_bytes: kernel_numel as f64 * eb,
                    total_bytes: numel(&t.dims) as f64 * eb * loads * nb,
                    run_bytes: t.dims.last().map_or(0.0, |&d| d as f64 * eb),
                    staged: tiles
                        .iter()
                        .any(|u| u.kind != TileKind::Matmul && u.operands.contains(&i)),
                    once: !walks_loop || forloop <= 1,
                });
            }
            TileKind::Matmul => {
                let r = t.dims.len();
                let a = t.operands.first().and_then(|&a| tiles.get(a));
                let kk = a.and_then(|a| a.dims.last().copied()).unwrap_or(1);
                let batch: usize = t.dims[..r.saturating_sub(2)].iter().product();
                let (m, nn) = (t.dims[r - 2], t.dims[r - 1]);
                p.matmuls.push(MatmulProfile {
                    m: m as u64,
                    n: nn as u64,
                    k: kk as u64,
                    flops: 2.0 * (batch * m * nn * kk) as f64 * reps,
                });
            }
            TileKind::Elementwise { weight } => {
                p.other_flops += weight * numel(&t.dims) as f64 * reps
            }
            TileKind::Reduce { .. } | TileKind::RmsNorm => {
                if t.kind == (TileKind::Reduce { accumulator: true }) {
                    p.accum_bytes += dot_padded_numel(&t.dims) as f64 * INTERMEDIATE_BYTES as f64;
                }
                let x = t.operands.first().and_then(|&x| tiles.get(x));
                let n = x.map_or(0, |x| numel(&x.dims));
                let w = if t.kind == TileKind::RmsNorm {
                    3.0
                } else {
                    1.0
                };
                p.other_flops += w * n as f64 * reps;
            }
        }
    }
    p.write_bytes = out_bytes.iter().sum();
    // the walked tiles' bytes at their power-of-two padded dims, over their bytes
    let (mut padded, mut real) = (0.0, 0.0);
    for t in tiles {
        if let TileKind::Input {
            elem_bytes,
            walks_loop: true,
            ..
        } = t.kind
        {
            real += (numel(&t.dims) * elem_bytes) as f64;
            padded += t
                .dims
                .iter()
                .map(|&d| d.next_power_of_two())
                .product::<usize>() as f64
                * elem_bytes as f64;
        }
    }
    p.lane_padding = if forloop > 1 && real > 0.0 {
        padded / real
    } else {
        1.0
    };
    // a batched tile matmul is one dot per batch entry, each waiting for its operand
    p.computed_operand_matmuls = tiles
        .iter()
        .filter(|t| t.kind == TileKind::Matmul && t.in_loop)
        .filter(|t| {
            // an fp32 tile (an intermediate) feeding a 16-bit dot is converted in registers
            // on its way to the matrix units, like a computed operand
            t.operands.iter().any(|&o| {
                tiles.get(o).is_some_and(|x| {
                    x.in_loop
                        && match x.kind {
                            TileKind::Input { elem_bytes, .. } => low_precision && elem_bytes > 2,
                            _ => true,
                        }
                })
            })
        })
        .map(|t| {
            t.dims[..t.dims.len().saturating_sub(2)]
                .iter()
                .product::<usize>()
        })
        .sum::<usize>() as u32;
    p
}

/// Cost-model profile of a customized op. `in_bytes`/`out_bytes`: element size of each
/// kernel-level input/output buffer (dtype size for graph buffers, 4 for intermediates).
pub fn block_profile(
    bg: &BlockGraph,
    in_bytes: &[usize],
    out_bytes: &[usize],
    low_precision: bool,
) -> KernelProfile {
    let writes: Vec<f64> = bg
        .outputs()
        .iter()
        .enumerate()
        .map(|(j, o)| {
            (numel(&o.dims) * out_bytes.get(j).copied().unwrap_or(INTERMEDIATE_BYTES)) as f64
        })
        .collect();
    profile_of(
        &tile_descs(bg, in_bytes),
        bg.num_blocks() as u64,
        bg.forloop_range(),
        &writes,
        low_precision,
    )
}

/// How each kernel-level tensor is stored.
struct BufferMap {
    buffer_of: Vec<Option<usize>>,
    elem_bytes: Vec<usize>,
    buffers: Vec<Buffer>,
}

fn buffers(g: &KernelGraph) -> Result<BufferMap> {
    let n = g.num_tensors();
    let mut buffer_of = vec![None; n];
    let mut elem_bytes = vec![INTERMEDIATE_BYTES; n];
    let mut buffers = vec![];
    let ts = g.tensors();
    for (k, &t) in g.inputs().iter().enumerate() {
        if g.outputs().contains(&t) {
            return Err(CoreError::Graph(format!(
                "kernel plan: graph input t{t} is also an output; a plan needs an op between them"
            )));
        }
        buffer_of[t] = Some(buffers.len());
        elem_bytes[t] = ts[t].dtype.size_bytes();
        buffers.push(Buffer {
            id: buffers.len(),
            dims: ts[t].dims.clone(),
            dtype: ts[t].dtype.name().into(),
            role: "input".into(),
            index: Some(k),
        });
    }
    for (k, &t) in g.outputs().iter().enumerate() {
        buffer_of[t] = Some(buffers.len());
        elem_bytes[t] = ts[t].dtype.size_bytes();
        buffers.push(Buffer {
            id: buffers.len(),
            dims: ts[t].dims.clone(),
            dtype: ts[t].dtype.name().into(),
            role: "output".into(),
            index: Some(k),
        });
    }
    for t in 0..n {
        if buffer_of[t].is_none() && !g.inputs().contains(&t) {
            buffer_of[t] = Some(buffers.len());
            buffers.push(Buffer {
                id: buffers.len(),
                dims: ts[t].dims.clone(),
                dtype: DType::F32.name().into(),
                role: "intermediate".into(),
                index: None,
            });
        }
    }
    Ok(BufferMap {
        buffer_of,
        elem_bytes,
        buffers,
    })
}

fn buf(m: &BufferMap, t: TensorId) -> Result<usize> {
    m.buffer_of
        .get(t)
        .copied()
        .flatten()
        .ok_or_else(|| CoreError::Graph(format!("kernel plan: tensor t{t} has no buffer")))
}

fn library_kernel(
    kind: &KernelOpKind,
    ins: Vec<usize>,
    outs: Vec<usize>,
    world_size: usize,
) -> Option<LibraryKernel> {
    let (op, params) = match kind {
        KernelOpKind::Matmul { .. } => ("matmul", json!({})),
        KernelOpKind::Unary { op, .. } => {
            ("unary", json!({"op": op.name(), "params": op.params()}))
        }
        KernelOpKind::Binary { op, .. } => ("binary", json!({"op": op.name()})),
        KernelOpKind::Reduction { dim, .. } => ("reduction", json!({"dim": dim})),
        KernelOpKind::RmsNorm {
            normalized_shape,
            weight,
            eps,
            ..
        } => (
            "rms_norm",
            json!({"num_normalized_dims": normalized_shape.len(), "eps": eps, "has_weight": weight.is_some()}),
        ),
        KernelOpKind::Softmax { dim, .. } => ("softmax", json!({"dim": dim})),
        KernelOpKind::Concat { dim, .. } => ("concat", json!({"dim": dim})),
        KernelOpKind::Chunk {
            chunks, dim, index, ..
        } => (
            "chunk",
            json!({"chunks": chunks, "dim": dim, "index": index}),
        ),
        // Sum over the ranks through the runtime's collective (docs/kernel-plan.md).
        KernelOpKind::AllReduce { .. } => ("all_reduce", json!({"world_size": world_size})),
        KernelOpKind::Permute { perm, .. } => ("permute", json!({"perm": perm})),
        KernelOpKind::ReduceMax { dim, .. } => ("reduce_max", json!({"dim": dim})),
        KernelOpKind::Reshape { dims, .. } => ("reshape", json!({"dims": dims})),
        KernelOpKind::Input { .. } | KernelOpKind::Customized { .. } => return None,
    };
    Some(LibraryKernel {
        op: op.into(),
        inputs: ins,
        outputs: outs,
        params,
    })
}

/// Cost-model profile of a library kernel.
pub fn library_profile(
    g: &KernelGraph,
    kind: &KernelOpKind,
    outs: &[TensorId],
    elem: &dyn Fn(TensorId) -> usize,
) -> KernelProfile {
    let ts = g.tensors();
    let low = ts
        .get(outs.first().copied().unwrap_or(0))
        .is_some_and(|t| t.dtype != DType::F32);
    let mut p = KernelProfile {
        library: true,
        blocks: 0,
        low_precision: low,
        ..Default::default()
    };
    for a in kind.operands() {
        let b = (numel(&ts[a].dims) * elem(a)) as f64;
        p.reads.push(ReadProfile {
            unique_bytes: b,
            total_bytes: b,
            ..Default::default()
        });
    }
    for &o in outs {
        p.write_bytes += (numel(&ts[o].dims) * elem(o)) as f64;
    }
    match kind {
        KernelOpKind::Matmul { a, b } => {
            let (ad, bd) = (&ts[*a].dims, &ts[*b].dims);
            let r = ad.len();
            let batch: usize = ad[..r - 2].iter().product();
            let (m, n, k) = (ad[r - 2], bd[r - 1], ad[r - 1]);
            p.matmuls.push(MatmulProfile {
                m: m as u64,
                n: n as u64,
                k: k as u64,
                flops: 2.0 * (batch * m * n * k) as f64,
            });
        }
        _ => {
            let n: usize = kind.operands().iter().map(|&a| numel(&ts[a].dims)).sum();
            p.other_flops += 4.0 * n as f64;
        }
    }
    p.collective = collective_profile(g, kind, p.write_bytes);
    p
}

/// The link traffic of a collective op (an `all_reduce` of `bytes` over the graph's ranks).
fn collective_profile(
    g: &KernelGraph,
    kind: &KernelOpKind,
    bytes: f64,
) -> Option<CollectiveProfile> {
    match kind {
        KernelOpKind::AllReduce { .. } => Some(CollectiveProfile {
            kind: CollectiveKind::AllReduce,
            bytes,
            world_size: g.world_size() as u32,
        }),
        _ => None,
    }
}

/// Profiles of every kernel of `g` (library ops and customized ops) in execution order.
pub fn graph_profiles(g: &KernelGraph) -> Result<Vec<KernelProfile>> {
    let m = buffers(g)?;
    let elem = |t: TensorId| m.elem_bytes.get(t).copied().unwrap_or(INTERMEDIATE_BYTES);
    let mut out = vec![];
    for op in g.ops() {
        match &op.kind {
            KernelOpKind::Input { .. } => {}
            KernelOpKind::Customized { inputs, graph } => {
                let ib: Vec<usize> = inputs.iter().map(|&t| elem(t)).collect();
                let ob: Vec<usize> = op.outs.iter().map(|&t| elem(t)).collect();
                let low = graph.tiles().first().is_some_and(|t| t.dtype != DType::F32);
                out.push(block_profile(graph, &ib, &ob, low));
            }
            kind => out.push(library_profile(g, kind, &op.outs, &elem)),
        }
    }
    Ok(out)
}

/// Shift degree of each tile w.r.t. one exp's running max (see [`safe_softmax_groups`]):
/// `Some(d)` = the tile is scaled by `exp(-m)^d`; `None` = not expressible.
fn shift_degrees(bg: &BlockGraph, exp: usize) -> Vec<Option<i32>> {
    let ops = bg.ops();
    let mut deg: Vec<Option<i32>> = vec![Some(0); ops.len()];
    for (i, op) in ops.iter().enumerate() {
        let d = |t: usize| deg[t];
        deg[i] = if i == exp {
            Some(1)
        } else {
            match op {
                BlockOpKind::Input { .. } => Some(0),
                BlockOpKind::Matmul { a, b } => d(*a).zip(d(*b)).map(|(x, y)| x + y),
                BlockOpKind::Binary { op, a, b } => match (op, d(*a), d(*b)) {
                    (BinaryOp::Mul, Some(x), Some(y)) => Some(x + y),
                    (BinaryOp::Div, Some(x), Some(y)) => Some(x - y),
                    (BinaryOp::Add | BinaryOp::Sub, Some(x), Some(y)) if x == y => Some(x),
                    (_, Some(0), Some(0)) => Some(0),
                    _ => None,
                },
                BlockOpKind::Unary { op, x } => match (op, d(*x)) {
                    (UnaryOp::Neg | UnaryOp::MulScalar(_), v) => v,
                    (_, Some(0)) => Some(0),
                    _ => None,
                },
                BlockOpKind::Reduction { x, .. } | BlockOpKind::ReductionToDimx { x, .. } => d(*x),
                BlockOpKind::ForloopAccum { x, kind } => match kind {
                    AccumKind::Rms { .. } => d(*x).filter(|&v| v == 0),
                    _ => d(*x),
                },
                BlockOpKind::RmsNorm { x, .. } => d(*x).filter(|&v| v == 0),
                BlockOpKind::Concat { xs, .. } => {
                    let v: Vec<Option<i32>> = xs.iter().map(|&x| d(x)).collect();
                    if v.windows(2).all(|w| w[0] == w[1]) {
                        v.first().copied().flatten()
                    } else {
                        None
                    }
                }
            }
        };
    }
    deg
}

/// Safe-softmax groups of a block graph: one per loop-body `exp` whose value reaches a
/// for-loop accumulator. Errors when an output's shift cannot be undone by one `exp(m)`
/// factor (degree other than 0 or 1), so such candidates are rejected by the lowering.
pub fn safe_softmax_groups(bg: &BlockGraph) -> Result<Vec<SafeSoftmax>> {
    let ops = bg.ops();
    let tiles = bg.tiles();
    let mut groups = vec![];
    for (e, op) in ops.iter().enumerate() {
        if !matches!(
            op,
            BlockOpKind::Unary {
                op: UnaryOp::Exp,
                ..
            }
        ) || tiles[e].phase != Phase::LoopBody
        {
            continue;
        }
        // Loop-body tiles reachable from the exp, then the accumulators fed by them.
        let mut reach = vec![false; ops.len()];
        reach[e] = true;
        let mut accums = vec![];
        for (i, op) in ops.iter().enumerate().skip(e + 1) {
            if op.operands().iter().any(|&a| reach[a]) {
                if matches!(op, BlockOpKind::ForloopAccum { .. }) {
                    accums.push(i);
                } else if tiles[i].phase == Phase::LoopBody {
                    reach[i] = true;
                }
            }
        }
        if accums.is_empty() {
            continue;
        }
        let deg = shift_degrees(bg, e);
        let rescale = rescales(&deg, &accums, e)?;
        let mut scale_outputs = vec![];
        for (k, o) in bg.outputs().iter().enumerate() {
            match deg[o.tile] {
                Some(0) => {}
                Some(1) => scale_outputs.push(k),
                other => {
                    return Err(CoreError::Mapping(format!(
                        "kernel plan: output #{k} depends on exp tile t{e} with shift degree {other:?}; \
                         the safe-softmax rewrite can only undo degree 0 or 1"
                    )))
                }
            }
        }
        groups.push(SafeSoftmax {
            exp: e,
            accums,
            scale_outputs,
            shift_store: None,
            rescale,
        });
    }
    Ok(groups)
}

/// The rescale degree of each accumulator of exp `e`'s group (degree 0 needs none); an
/// error where an accumulator is not a monomial in `exp(−m)`, which no running-max rewrite
/// can rescale.
fn rescales(deg: &[Option<i32>], accums: &[usize], e: usize) -> Result<Vec<Rescale>> {
    let mut out = vec![];
    for &a in accums {
        match deg[a] {
            Some(0) => {}
            Some(degree) => out.push(Rescale { accum: a, degree }),
            None => {
                return Err(CoreError::Mapping(format!(
                    "kernel plan: accumulator t{a} is not a power of exp tile t{e}'s shift; the \
                     safe-softmax rewrite cannot rescale it"
                )))
            }
        }
    }
    Ok(out)
}

const AXES: [&str; 3] = ["bx", "by", "bz"];

fn generated_kernel(
    name: String,
    bg: &BlockGraph,
    in_bufs: &[usize],
    out_bufs: &[usize],
    spec: &DeviceSpec,
) -> Result<GeneratedKernel> {
    let grid = bg.grid_dim();
    let f = bg.forloop_range();
    let tiles = bg.tiles();
    let ops = bg.ops();
    let mut inputs = vec![];
    let mut plan_ops = vec![];
    let mut pre = vec![false; ops.len()];
    let mut k = 0;
    for (i, op) in ops.iter().enumerate() {
        let t = &tiles[i];
        let mut o = TileOp {
            id: i,
            op: String::new(),
            input: None,
            args: Some(op.operands()),
            unop: None,
            params: None,
            binop: None,
            acc: None,
            dim: None,
            dimx: None,
            eps: None,
            extent: None,
            dims: t.dims.clone(),
            accumulate_into: None,
            masked: vec![],
            phase: match t.phase {
                Phase::AfterLoop => "epilogue".into(),
                Phase::LoopBody => {
                    let operands = op.operands();
                    if !operands.is_empty() && operands.iter().all(|&a| pre[a]) {
                        pre[i] = true;
                        "pre".into()
                    } else {
                        "loop".into()
                    }
                }
            },
        };
        match op {
            BlockOpKind::Input {
                kernel_dims,
                imap,
                fmap,
                ..
            } => {
                let geo = bg.input_geometry(kernel_dims, *imap, *fmap);
                let mut offsets = vec![vec![]; kernel_dims.len()];
                for a in 0..3 {
                    if grid[a] > 1 && imap[a] >= 0 {
                        let d = imap[a] as usize;
                        offsets[d].push(Offset {
                            var: AXES[a].into(),
                            stride: geo.block_dims[d],
                        });
                    }
                }
                if *fmap >= 0 {
                    let d = *fmap as usize;
                    offsets[d].push(Offset {
                        var: "iter".into(),
                        stride: geo.tile_dims[d],
                    });
                } else {
                    pre[i] = true;
                    o.phase = "pre".into();
                }
                let buffer = *in_bufs.get(k).ok_or_else(|| {
                    CoreError::Graph("kernel plan: customized input count".into())
                })?;
                inputs.push(TileIo {
                    buffer,
                    dims: kernel_dims.clone(),
                    tile: geo.tile_dims,
                    offsets,
                    shift_load: None,
                    masked: masked_dims(bg, imap, *fmap),
                });
                o.op = "input".into();
                o.input = Some(k);
                o.args = None;
                k += 1;
            }
            BlockOpKind::Matmul { .. } => o.op = "matmul".into(),
            BlockOpKind::Unary { op, .. } => {
                o.op = "unary".into();
                o.unop = Some(op.name().into());
                o.params = Some(op.params());
            }
            BlockOpKind::Binary { op, .. } => {
                o.op = "binary".into();
                o.binop = Some(op.name().into());
            }
            BlockOpKind::Reduction { dim, .. } => {
                o.op = "reduction".into();
                o.dim = Some(*dim);
            }
            BlockOpKind::ReductionToDimx { dim, .. } => {
                o.op = "reduction_to_dimx".into();
                o.dim = Some(*dim);
                o.dimx = Some(bg.reduction_dimx() as usize);
            }
            BlockOpKind::RmsNorm { eps, .. } => {
                o.op = "rms_norm".into();
                o.eps = Some(*eps);
            }
            BlockOpKind::Concat { dim, .. } => {
                o.op = "concat".into();
                o.dim = Some(*dim);
            }
            BlockOpKind::ForloopAccum { x, kind } => {
                o.op = "accum".into();
                o.phase = "accum".into();
                o.acc = Some(kind.name().unwrap_or("iter").into());
                match kind {
                    AccumKind::Rms { eps } => {
                        o.eps = Some(*eps);
                        let last = tiles[*x].dims.last().copied().unwrap_or(1);
                        o.extent = Some(bg.rms_count(last));
                    }
                    AccumKind::SumToDimx => o.dimx = Some(bg.reduction_dimx() as usize),
                    _ => {}
                }
            }
        }
        plan_ops.push(o);
    }
    if let Some(extent) = bg.loop_extent() {
        for (i, dim) in masked_exps(bg) {
            plan_ops[i].masked = vec![MaskedDim { dim, extent }];
        }
    }
    let mut outputs = vec![];
    for (j, out) in bg.outputs().iter().enumerate() {
        let tile = tiles[out.tile].dims.clone();
        let mut offsets = vec![vec![]; tile.len()];
        for a in 0..3 {
            if grid[a] > 1 && out.omap[a] >= 0 {
                let d = out.omap[a] as usize;
                offsets[d].push(Offset {
                    var: AXES[a].into(),
                    stride: tile[d],
                });
            }
        }
        let buffer = *out_bufs
            .get(j)
            .ok_or_else(|| CoreError::Graph("kernel plan: customized output count".into()))?;
        outputs.push(TileOut {
            buffer,
            src: out.tile,
            tile,
            offsets,
            masked: masked_dims(bg, &out.omap, -1),
        });
    }
    let threads: u32 = bg.block_dim().iter().product();
    let smem = smem_bytes(bg);
    if smem > spec.shared_mem_per_block {
        return Err(CoreError::Mapping(format!(
            "kernel plan: {name} needs {smem} bytes of shared memory per block; the device has {}",
            spec.shared_mem_per_block
        )));
    }
    if !spec.is_cpu() && threads > spec.max_threads_per_block {
        return Err(CoreError::Mapping(format!(
            "kernel plan: {name} has {threads} threads per block; the device allows {}",
            spec.max_threads_per_block
        )));
    }
    let mut k = GeneratedKernel {
        name,
        grid,
        block_threads: threads,
        warps: threads.div_ceil(spec.warp_size.max(1)),
        forloop_range: f,
        inputs,
        ops: plan_ops,
        outputs,
        safe_softmax: safe_softmax_groups(bg)?,
        shift_carry: None,
        smem_bytes: smem,
        loop_split: 1,
    };
    analysis::analyse(&mut k, spec);
    Ok(k)
}

/// The dims of a tile placed by `map` (an imap or omap) along masked grid axes, with the
/// axis' extent, and its dim `fmap` walked by a masked loop, with the loop's extent.
fn masked_dims(bg: &BlockGraph, map: &[i32; 3], fmap: i32) -> Vec<MaskedDim> {
    let mut v: Vec<MaskedDim> = (0..3)
        .filter_map(|a| {
            let extent = bg.masked_axes()[a]?;
            (map[a] >= 0).then(|| MaskedDim {
                dim: map[a] as usize,
                extent,
            })
        })
        .collect();
    if let (Some(extent), true) = (bg.loop_extent(), fmap >= 0) {
        v.push(MaskedDim {
            dim: fmap as usize,
            extent,
        });
    }
    v.sort_by_key(|m| m.dim);
    v
}

/// Whether a generated kernel has masked edge tiles.
fn has_masked(k: &GeneratedKernel) -> bool {
    k.inputs.iter().any(|i| !i.masked.is_empty()) || k.outputs.iter().any(|o| !o.masked.is_empty())
}

/// Masked edge tiles are not combined with shifted partials (their row-max windows would
/// need masks of their own): such a plan is refused.
fn check_masked(plan: &KernelPlan) -> Result<()> {
    for k in &plan.kernels {
        let PlanKernel::Generated(k) = k else {
            continue;
        };
        let shifted =
            k.shift_carry.is_some() || k.safe_softmax.iter().any(|g| g.shift_store.is_some());
        if has_masked(k) && shifted {
            return Err(CoreError::Mapping(format!(
                "kernel plan: {} has masked edge tiles and stores or reads shifted partials; use a grid that divides the split dims",
                k.name
            )));
        }
    }
    Ok(())
}

/// Lower a search candidate: as [`lower`], but a candidate in which an exp that cannot be
/// shifted enters a generated kernel unshifted is rejected (it would overflow where the
/// graph's value is finite), so the search does not offer it.
pub fn lower_candidate(g: &KernelGraph, spec: &DeviceSpec) -> Result<KernelPlan> {
    if unsafe_exp_into_kernel(g, &exp_shifts(g)) {
        return Err(CoreError::Mapping(
            "kernel plan: an exp without a max shift feeds a generated kernel (overflow-unsafe)"
                .into(),
        ));
    }
    lower(g, spec)
}

/// Lower `g` to a KernelPlan validated against `spec`.
pub fn lower(g: &KernelGraph, spec: &DeviceSpec) -> Result<KernelPlan> {
    g.check_complete()?;
    let m = buffers(g)?;
    let shifts = exp_shifts(g);
    let mut kernels = vec![];
    let mut generated = 0;
    for (i, op) in g.ops().iter().enumerate() {
        let ins: Vec<usize> = op
            .kind
            .operands()
            .iter()
            .map(|&t| buf(&m, t))
            .collect::<Result<_>>()?;
        let outs: Vec<usize> = op.outs.iter().map(|&t| buf(&m, t)).collect::<Result<_>>()?;
        match &op.kind {
            KernelOpKind::Input { .. } => {}
            KernelOpKind::Customized { graph, .. } => {
                let k = generated_kernel(format!("k{generated}"), graph, &ins, &outs, spec)?;
                generated += 1;
                kernels.push(PlanKernel::Generated(k));
            }
            kind => {
                let mut k = library_kernel(kind, ins, outs, g.world_size())
                    .ok_or_else(|| CoreError::Graph("kernel plan: unexpected op".into()))?;
                if let Some(dims) = shifts.get(&i) {
                    k.params["shift_dims"] = json!(dims); // exp(x - max over dims)
                }
                kernels.push(PlanKernel::Library(k));
            }
        }
    }
    let plan = KernelPlan {
        format: FORMAT.into(),
        version: VERSION,
        graph_hash: crate::json::hash(g),
        buffers: m.buffers,
        kernels,
    };
    let plan = shift_carry::carried(plan, spec)?;
    check_masked(&plan)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rms_fused(f: i64) -> KernelGraph {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 512], DType::F32).unwrap();
        let w = g.new_input(&[512, 768], DType::F32).unwrap();
        let mut bg = BlockGraph::new([48, 1, 1], [128, 1, 1], f, 1).unwrap();
        let tx = bg
            .new_input(&[8, 512], DType::F32, [-1, -1, -1], 1)
            .unwrap();
        let tw = bg
            .new_input(&[512, 768], DType::F32, [1, -1, -1], 0)
            .unwrap();
        let mm = bg.matmul(tx, tw).unwrap();
        let acc = bg.forloop_accum(mm, AccumKind::Iter).unwrap();
        let rms = bg.forloop_accum(tx, AccumKind::Rms { eps: 1e-6 }).unwrap();
        let out = bg.binary(BinaryOp::Div, acc, rms).unwrap();
        bg.new_output(out, [1, -1, -1]).unwrap();
        let o = g.customized(&[x, w], &bg).unwrap();
        g.mark_output(o[0]).unwrap();
        g
    }

    /// silu(X·W1)·(X·W3) with 128×128 tiles of each product: the two loop matmuls add into
    /// their accumulators in place, so the block holds the three stage tiles and the two
    /// accumulators in the loop, and at most three 128×128 fp32 tiles after it.
    #[test]
    fn matmuls_fused_into_accumulators_take_no_room() {
        // X [4096, 4096] in 128-row tiles walking K by 64; a weight in 128-column tiles
        let block = || BlockGraph::new([32, 32, 1], [256, 1, 1], 64, 1).unwrap();
        let x_of = |bg: &mut BlockGraph| {
            bg.new_input(&[4096, 4096], DType::F16, [0, -1, -1], 1)
                .unwrap()
        };
        let w_of = |bg: &mut BlockGraph| {
            bg.new_input(&[4096, 4096], DType::F16, [-1, 1, -1], 0)
                .unwrap()
        };
        let mut bg = block();
        let (x, w1, w3) = (x_of(&mut bg), w_of(&mut bg), w_of(&mut bg));
        let a1 = bg.matmul(x, w1).unwrap();
        let a1 = bg.forloop_accum(a1, AccumKind::Iter).unwrap();
        let a3 = bg.matmul(x, w3).unwrap();
        let a3 = bg.forloop_accum(a3, AccumKind::Iter).unwrap();
        let g = bg.unary(UnaryOp::Silu, a1).unwrap();
        let out = bg.binary(BinaryOp::Mul, g, a3).unwrap();
        bg.new_output(out, [0, 1, -1]).unwrap();
        let tile = 128 * 128 * INTERMEDIATE_BYTES as u64;
        let stages = 3 * 128 * 64 * 2;
        assert_eq!(smem_bytes(&bg), (3 * tile).max(2 * tile + stages));
        // a matmul read by anything but its accumulator keeps its room
        let mut bg2 = block();
        let (x, w1) = (x_of(&mut bg2), w_of(&mut bg2));
        let m = bg2.matmul(x, w1).unwrap();
        let e = bg2.unary(UnaryOp::Exp, m).unwrap();
        let acc = bg2.forloop_accum(e, AccumKind::Iter).unwrap();
        bg2.new_output(acc, [0, 1, -1]).unwrap();
        assert_eq!(smem_bytes(&bg2), 3 * tile);
    }

    #[test]
    fn lowers_the_documented_example() {
        let g = rms_fused(16);
        let plan = lower(&g, &DeviceSpec::h100()).unwrap();
        assert_eq!(plan.kernels.len(), 1);
        let PlanKernel::Generated(k) = &plan.kernels[0] else {
            panic!("expected a generated kernel")
        };
        assert_eq!(k.grid, [48, 1, 1]);
        assert_eq!(k.warps, 4);
        // 48 blocks on 132 SMs: 8 parts give two blocks per SM (the documented loop_split)
        assert_eq!(k.loop_split, 8);
        assert_eq!(k.ops[2].accumulate_into, Some(3));
        assert_eq!(k.inputs[0].tile, vec![8, 32]);
        assert_eq!(
            k.inputs[1].offsets[1],
            vec![Offset {
                var: "bx".into(),
                stride: 16
            }]
        );
        assert_eq!(
            k.inputs[1].offsets[0],
            vec![Offset {
                var: "iter".into(),
                stride: 32
            }]
        );
        assert_eq!(k.ops[4].acc.as_deref(), Some("rms"));
        assert_eq!(k.ops[4].extent, Some(512));
        assert_eq!(k.ops[5].phase, "epilogue");
        assert_eq!(k.outputs[0].offsets[1][0].stride, 16);
        assert!(k.safe_softmax.is_empty());
        let back = KernelPlan::from_json(&plan.to_json()).unwrap();
        assert_eq!(back, plan);
        let mut tiny = DeviceSpec::h100();
        tiny.shared_mem_per_block = 256;
        assert_eq!(
            lower(&g, &tiny).unwrap_err().kind(),
            crate::ErrorKind::Mapping
        );
    }

    #[test]
    fn profile_counts_the_padded_lanes_of_walked_tiles() {
        // X[8, 3000] · W[3000, 64], K walked in `f` tiles (of `tile` when given)
        let walked = |f: i64, tile: Option<i64>| {
            let mut bg = BlockGraph::new([1, 1, 1], [128, 1, 1], f, 1).unwrap();
            if let Some(t) = tile {
                bg.set_loop_tile(t).unwrap();
            }
            let x = bg.new_input(&[8, 3000], DType::F16, [-1; 3], 1).unwrap();
            let w = bg.new_input(&[3000, 64], DType::F16, [-1; 3], 0).unwrap();
            let m = bg.matmul(x, w).unwrap();
            let acc = bg.forloop_accum(m, AccumKind::Iter).unwrap();
            bg.new_output(acc, [-1; 3]).unwrap();
            block_profile(&bg, &[2, 2], &[4], true).lane_padding
        };
        // 8 tiles of 375 run as tiles of 512; 24 tiles of 128 (the last one masked) as such
        assert!((walked(8, None) - 512.0 / 375.0).abs() < 1e-12);
        assert_eq!(walked(24, Some(128)), 1.0);
    }

    #[test]
    fn profile_marks_staged_tiles_and_computed_matmul_operands() {
        // rms_norm(X) @ W fused: X feeds the rms accumulator (staged), W only the matmul
        let g = rms_fused(16);
        let Some(KernelOpKind::Customized { graph: bg, .. }) = g.ops().last().map(|o| &o.kind)
        else {
            panic!("expected a customized op")
        };
        let p = block_profile(bg, &[4, 4], &[4], false);
        assert_eq!(
            p.reads.iter().map(|r| r.staged).collect::<Vec<_>>(),
            [true, false]
        );
        assert_eq!(p.computed_operand_matmuls, 0);
        // attention: exp(Q Kᵀ) V — the second matmul's operand is computed in the loop; on a
        // grid of 2 every block holds two heads, so the tile matmul is two dots, each waiting
        let attention = |grid: i64| {
            let mut bg = BlockGraph::new([grid, 1, 1], [128, 1, 1], 8, 1).unwrap();
            let q = bg
                .new_input(&[4, 4, 64], DType::F16, [0, -1, -1], -1)
                .unwrap();
            let kt = bg
                .new_input(&[4, 64, 256], DType::F16, [0, -1, -1], 2)
                .unwrap();
            let v = bg
                .new_input(&[4, 256, 64], DType::F16, [0, -1, -1], 1)
                .unwrap();
            let s = bg.matmul(q, kt).unwrap();
            let e = bg.unary(UnaryOp::Exp, s).unwrap();
            let o = bg.matmul(e, v).unwrap();
            let acc = bg.forloop_accum(o, AccumKind::Iter).unwrap();
            bg.new_output(acc, [0, -1, -1]).unwrap();
            block_profile(&bg, &[2, 2, 2], &[4], true)
        };
        let p = attention(4);
        assert_eq!(p.computed_operand_matmuls, 1);
        assert!(p.reads.iter().all(|r| !r.staged));
        assert_eq!(attention(2).computed_operand_matmuls, 2);
        // the fp32 accumulator of a block's heads, its 4 query rows padded to 16 as dots are
        assert_eq!(p.accum_bytes, (16 * 64 * 4) as f64);
        assert_eq!(attention(2).accum_bytes, (2 * 16 * 64 * 4) as f64);
        // P · V with P loaded: converted in registers when P is an fp32 intermediate
        let mut pv = BlockGraph::new([4, 1, 1], [128, 1, 1], 8, 1).unwrap();
        let pt = pv
            .new_input(&[4, 4, 256], DType::F16, [0, -1, -1], 2)
            .unwrap();
        let v = pv
            .new_input(&[4, 256, 64], DType::F16, [0, -1, -1], 1)
            .unwrap();
        let o = pv.matmul(pt, v).unwrap();
        let acc = pv.forloop_accum(o, AccumKind::Iter).unwrap();
        pv.new_output(acc, [0, -1, -1]).unwrap();
        let computed =
            |p_bytes| block_profile(&pv, &[p_bytes, 2], &[4], true).computed_operand_matmuls;
        assert_eq!((computed(2), computed(4)), (0, 1));
    }

    #[test]
    fn library_plan_and_profiles() {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 512], DType::F16).unwrap();
        let w = g.new_input(&[512, 768], DType::F16).unwrap();
        let n = g.rms_norm(x, &[512], None, 1e-6).unwrap();
        let y = g.matmul(n, w).unwrap();
        g.mark_output(y).unwrap();
        let plan = lower(&g, &DeviceSpec::h100()).unwrap();
        assert_eq!(plan.buffers.len(), 4);
        assert_eq!(plan.buffers[3].role, "intermediate");
        assert_eq!(plan.buffers[3].dtype, "float32");
        assert_eq!(
            plan.kernels.iter().map(|k| k.kind()).collect::<Vec<_>>(),
            ["library", "library"]
        );
        let profiles = graph_profiles(&g).unwrap();
        assert_eq!(profiles.len(), 2);
        assert!(profiles[1].low_precision);
        // The fused kernel moves fewer bytes and launches once.
        let spec = DeviceSpec::h100();
        let fused = crate::cost::total_cost(&spec, &graph_profiles(&rms_fused(16)).unwrap());
        let unfused = crate::cost::total_cost(&spec, &profiles);
        assert!(fused > 0.0 && unfused > 0.0);
    }
}
