//! Kernel graphs: the user-facing level of a µGraph.
//!
//! A kernel graph is an append-only list of ops over tensors identified by dense ids.
//! Every builder method validates ids, shapes and dtypes before anything is appended, so a
//! graph that exists is well formed; `from_json` replays documents through these same
//! methods. Dims arguments are `i64` (Python ints) and normalised before storage.
//!
//! Multi-device graphs (SPMD): a graph with `world_size` N > 1 is the program of one of N
//! ranks; every input holds that rank's own data, every op runs per rank, and
//! [`KernelGraph::all_reduce`] returns on every rank the sum over ranks of its operand.

use crate::block_graph::BlockGraph;
use crate::dtype::{same_dtype, DType};
use crate::error::{graph_err, shape_err, Result};
use crate::ops::{check_eps, BinaryOp, UnaryOp};
use crate::shape::{
    concat_dims, fmt_dims, keepdim_dims, matmul_dims, norm_dim, numel, numpy_broadcast_dims,
    validate_dims, Dims,
};

/// Dims already checked by [`validate_dims`], as stored.
fn dims_of(dims: &[i64]) -> Dims {
    dims.iter().map(|&d| d as usize).collect()
}

/// Largest `world_size` of a multi-device graph.
pub const MAX_WORLD_SIZE: usize = 1024;

/// Tensor id within a kernel graph.
pub type TensorId = usize;

/// One kernel-level op.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelOpKind {
    Input {
        dims: Dims,
        dtype: DType,
    },
    Matmul {
        a: TensorId,
        b: TensorId,
    },
    Unary {
        op: UnaryOp,
        x: TensorId,
    },
    Binary {
        op: BinaryOp,
        a: TensorId,
        b: TensorId,
    },
    /// Sum over `dim`, keepdim.
    Reduction {
        x: TensorId,
        dim: usize,
    },
    /// Max over `dim`, keepdim (a library op, a boundary for the search).
    ReduceMax {
        x: TensorId,
        dim: usize,
    },
    /// `x / sqrt(mean(x²) over the trailing normalized dims + eps) * weight`.
    RmsNorm {
        x: TensorId,
        normalized_shape: Dims,
        weight: Option<TensorId>,
        eps: f64,
    },
    /// `exp(x) / sum(exp(x), dim)` (exact math; printers apply the safe-softmax shift).
    Softmax {
        x: TensorId,
        dim: usize,
    },
    Concat {
        xs: Vec<TensorId>,
        dim: usize,
    },
    /// Piece `index` of `x` split into `chunks` equal pieces along `dim`.
    Chunk {
        x: TensorId,
        chunks: usize,
        dim: usize,
        index: usize,
    },
    /// Output dim `i` is input dim `perm[i]` (elements move; run by the backends' library
    /// path, a boundary for the search).
    Permute {
        x: TensorId,
        perm: Vec<usize>,
    },
    /// The same elements in row-major order under new dims (equal element count; run by
    /// the backends' library path, a boundary for the search).
    Reshape {
        x: TensorId,
        dims: Dims,
    },
    /// Sum over the `world_size` ranks (multi-device collective; a boundary for the search).
    AllReduce {
        x: TensorId,
    },
    /// A graph-defined operator whose body is a thread-block graph.
    Customized {
        inputs: Vec<TensorId>,
        graph: Box<BlockGraph>,
    },
}

impl KernelOpKind {
    /// Operand tensors.
    pub fn operands(&self) -> Vec<TensorId> {
        match self {
            KernelOpKind::Input { .. } => vec![],
            KernelOpKind::Matmul { a, b } | KernelOpKind::Binary { a, b, .. } => vec![*a, *b],
            KernelOpKind::Unary { x, .. }
            | KernelOpKind::Reduction { x, .. }
            | KernelOpKind::Softmax { x, .. }
            | KernelOpKind::AllReduce { x }
            | KernelOpKind::Permute { x, .. }
            | KernelOpKind::Reshape { x, .. }
            | KernelOpKind::ReduceMax { x, .. }
            | KernelOpKind::Chunk { x, .. } => vec![*x],
            KernelOpKind::RmsNorm { x, weight, .. } => {
                let mut v = vec![*x];
                v.extend(weight);
                v
            }
            KernelOpKind::Concat { xs, .. } => xs.clone(),
            KernelOpKind::Customized { inputs, .. } => inputs.clone(),
        }
    }
}

/// An op plus the ids of the tensors it produced.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelOp {
    pub kind: KernelOpKind,
    pub outs: Vec<TensorId>,
}

/// Metadata of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub dims: Dims,
    pub dtype: DType,
}

/// A kernel graph.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelGraph {
    ops: Vec<KernelOp>,
    tensors: Vec<TensorInfo>,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    /// Number of ranks of the SPMD program (1: the single-device case).
    world_size: usize,
}

impl Default for KernelGraph {
    fn default() -> Self {
        KernelGraph {
            ops: vec![],
            tensors: vec![],
            inputs: vec![],
            outputs: vec![],
            world_size: 1,
        }
    }
}

/// Convert a Python-side id to a tensor/tile id (negative ids are a GraphError).
pub fn parse_id(what: &str, id: i64) -> Result<usize> {
    if id < 0 {
        return graph_err(format!("{what}: tensor id {id} is negative; ids are ≥ 0"));
    }
    Ok(id as usize)
}

impl KernelGraph {
    pub fn new() -> KernelGraph {
        KernelGraph::default()
    }

    /// An empty graph describing one rank's program on `world_size` ranks (1 ≤ N ≤ 1024).
    pub fn with_world_size(world_size: i64) -> Result<KernelGraph> {
        if world_size < 1 || world_size > MAX_WORLD_SIZE as i64 {
            return graph_err(format!(
                "world_size {world_size} is out of range: expected 1 to {MAX_WORLD_SIZE} ranks"
            ));
        }
        Ok(KernelGraph {
            world_size: world_size as usize,
            ..KernelGraph::default()
        })
    }

    /// Number of ranks (1 for a single-device graph).
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// True when the graph contains an all_reduce.
    pub fn has_collectives(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op.kind, KernelOpKind::AllReduce { .. }))
    }

    pub fn ops(&self) -> &[KernelOp] {
        &self.ops
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// `(dims, dtype)` of every input, in order (the "input signature").
    pub fn input_signature(&self) -> Vec<(Dims, DType)> {
        self.inputs
            .iter()
            .map(|&t| (self.tensors[t].dims.clone(), self.tensors[t].dtype))
            .collect()
    }

    /// Metadata of tensor `t`, or a GraphError naming the valid range.
    pub fn tensor(&self, t: TensorId) -> Result<&TensorInfo> {
        self.tensors.get(t).ok_or_else(|| {
            crate::CoreError::Graph(format!(
                "unknown tensor id t{t}: this graph has {} tensors (t0..t{})",
                self.tensors.len(),
                self.tensors.len() as i64 - 1
            ))
        })
    }

    fn push(&mut self, kind: KernelOpKind, outs: Vec<TensorInfo>) -> Vec<TensorId> {
        let first = self.tensors.len();
        let ids: Vec<TensorId> = (first..first + outs.len()).collect();
        self.tensors.extend(outs);
        self.ops.push(KernelOp {
            kind,
            outs: ids.clone(),
        });
        ids
    }

    fn push1(&mut self, kind: KernelOpKind, dims: Dims, dtype: DType) -> TensorId {
        self.push(kind, vec![TensorInfo { dims, dtype }])[0]
    }

    /// New graph input.
    pub fn new_input(&mut self, dims: &[i64], dtype: DType) -> Result<TensorId> {
        let dims = validate_dims(&format!("input #{}", self.inputs.len()), dims)?;
        let id = self.push1(
            KernelOpKind::Input {
                dims: dims.clone(),
                dtype,
            },
            dims,
            dtype,
        );
        self.inputs.push(id);
        Ok(id)
    }

    /// Batched matmul.
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let dims = matmul_dims("matmul", &ta.dims, &tb.dims)?;
        let dtype = same_dtype(&format!("matmul(t{a}, t{b})"), &[ta.dtype, tb.dtype])?;
        Ok(self.push1(KernelOpKind::Matmul { a, b }, dims, dtype))
    }

    /// Elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: TensorId) -> Result<TensorId> {
        let t = self.tensor(x)?.clone();
        Ok(self.push1(KernelOpKind::Unary { op, x }, t.dims, t.dtype))
    }

    /// Elementwise binary op with numpy broadcasting (right-aligned, missing leading dims
    /// are 1, sizes equal or 1).
    pub fn binary(&mut self, op: BinaryOp, a: TensorId, b: TensorId) -> Result<TensorId> {
        let what = format!("{}(t{a}, t{b})", op.name());
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let dims = numpy_broadcast_dims(&what, &ta.dims, &tb.dims)?;
        let dtype = same_dtype(&what, &[ta.dtype, tb.dtype])?;
        Ok(self.push1(KernelOpKind::Binary { op, a, b }, dims, dtype))
    }

    /// Sum over `dim`, keepdim.
    pub fn reduction(&mut self, x: TensorId, dim: i64) -> Result<TensorId> {
        let what = format!("reduction(t{x}, dim={dim})");
        let t = self.tensor(x)?.clone();
        let d = norm_dim(&what, dim, t.dims.len())?;
        Ok(self.push1(
            KernelOpKind::Reduction { x, dim: d },
            keepdim_dims(&t.dims, d),
            t.dtype,
        ))
    }

    /// RMS norm over the trailing `normalized_shape` dims, optional `weight` of those dims
    /// (shape `normalized_shape`, optionally with leading size-1 dims up to `x`'s rank).
    pub fn rms_norm(
        &mut self,
        x: TensorId,
        normalized_shape: &[i64],
        weight: Option<TensorId>,
        eps: f64,
    ) -> Result<TensorId> {
        let what = format!("rms_norm(t{x})");
        let t = self.tensor(x)?.clone();
        let eps = check_eps(&what, eps)?;
        let ns = validate_dims(&format!("{what}: normalized_shape"), normalized_shape)?;
        if ns.len() > t.dims.len() || t.dims[t.dims.len() - ns.len()..] != ns[..] {
            return shape_err(format!(
                "{what}: normalized_shape {} must equal the trailing dims of the input {}",
                fmt_dims(&ns),
                fmt_dims(&t.dims)
            ));
        }
        if let Some(w) = weight {
            let tw = self.tensor(w)?.clone();
            let lead = tw.dims.len().saturating_sub(ns.len());
            let fits = tw.dims.len() >= ns.len()
                && tw.dims.len() <= t.dims.len()
                && tw.dims[lead..] == ns[..]
                && tw.dims[..lead].iter().all(|&d| d == 1);
            if !fits {
                return shape_err(format!(
                    "{what}: weight t{w} has dims {}; expected normalized_shape {} (optionally with leading size-1 dims up to the input's rank {}, e.g. {})",
                    fmt_dims(&tw.dims),
                    fmt_dims(&ns),
                    t.dims.len(),
                    fmt_dims(&crate::shape::promote_dims(&ns, t.dims.len()))
                ));
            }
            same_dtype(&what, &[t.dtype, tw.dtype])?;
        }
        Ok(self.push1(
            KernelOpKind::RmsNorm {
                x,
                normalized_shape: ns,
                weight,
                eps,
            },
            t.dims,
            t.dtype,
        ))
    }

    /// Sum of `x` over the graph's `world_size` ranks, returned on every rank (the identity
    /// when `world_size` is 1).
    pub fn all_reduce(&mut self, x: TensorId) -> Result<TensorId> {
        let t = self.tensor(x)?.clone();
        Ok(self.push1(KernelOpKind::AllReduce { x }, t.dims, t.dtype))
    }

    /// Softmax over `dim`.
    pub fn softmax(&mut self, x: TensorId, dim: i64) -> Result<TensorId> {
        let what = format!("softmax(t{x}, dim={dim})");
        let t = self.tensor(x)?.clone();
        let d = norm_dim(&what, dim, t.dims.len())?;
        Ok(self.push1(KernelOpKind::Softmax { x, dim: d }, t.dims, t.dtype))
    }

    /// Concatenate along `dim`.
    pub fn concat(&mut self, xs: &[TensorId], dim: i64) -> Result<TensorId> {
        let what = format!("concat({xs:?}, dim={dim})");
        if xs.is_empty() {
            return graph_err(format!("{what}: needs at least one tensor"));
        }
        let infos: Vec<TensorInfo> = xs
            .iter()
            .map(|&t| self.tensor(t).cloned())
            .collect::<Result<_>>()?;
        let d = norm_dim(&what, dim, infos[0].dims.len())?;
        let parts: Vec<&[usize]> = infos.iter().map(|i| i.dims.as_slice()).collect();
        let dims = concat_dims(&what, &parts, d)?;
        let dtypes: Vec<DType> = infos.iter().map(|i| i.dtype).collect();
        let dtype = same_dtype(&what, &dtypes)?;
        Ok(self.push1(
            KernelOpKind::Concat {
                xs: xs.to_vec(),
                dim: d,
            },
            dims,
            dtype,
        ))
    }

    /// Split `x` into `chunks` equal pieces along `dim` (one op per piece).
    pub fn chunk(&mut self, x: TensorId, chunks: i64, dim: i64) -> Result<Vec<TensorId>> {
        let (n, d) = self.check_chunk(x, chunks, dim)?;
        (0..n)
            .map(|i| self.chunk_piece_checked(x, n, d, i))
            .collect()
    }

    fn check_chunk(&self, x: TensorId, chunks: i64, dim: i64) -> Result<(usize, usize)> {
        let what = format!("chunk(t{x}, chunks={chunks}, dim={dim})");
        let t = self.tensor(x)?;
        let d = norm_dim(&what, dim, t.dims.len())?;
        if chunks < 1 || t.dims[d] % chunks as usize != 0 {
            return shape_err(format!(
                "{what}: dim {d} of {} (size {}) must be divisible by chunks (≥ 1)",
                fmt_dims(&t.dims),
                t.dims[d]
            ));
        }
        Ok((chunks as usize, d))
    }

    /// One piece of a chunk (used by the JSON replay; validates everything).
    pub fn chunk_piece(
        &mut self,
        x: TensorId,
        chunks: i64,
        dim: i64,
        index: i64,
    ) -> Result<TensorId> {
        let (n, d) = self.check_chunk(x, chunks, dim)?;
        if index < 0 || index as usize >= n {
            return shape_err(format!("chunk: index {index} out of range 0..{n}"));
        }
        self.chunk_piece_checked(x, n, d, index as usize)
    }

    fn chunk_piece_checked(
        &mut self,
        x: TensorId,
        chunks: usize,
        dim: usize,
        index: usize,
    ) -> Result<TensorId> {
        let t = self.tensor(x)?.clone();
        let mut dims = t.dims.clone();
        dims[dim] /= chunks;
        Ok(self.push1(
            KernelOpKind::Chunk {
                x,
                chunks,
                dim,
                index,
            },
            dims,
            t.dtype,
        ))
    }

    /// Max of `x` over `dim`, kept with size 1.
    pub fn reduce_max(&mut self, x: TensorId, dim: i64) -> Result<TensorId> {
        let what = format!("reduce_max(t{x}, dim={dim})");
        let t = self.tensor(x)?.clone();
        let d = norm_dim(&what, dim, t.dims.len())?;
        let mut dims = t.dims.clone();
        dims[d] = 1;
        Ok(self.push1(KernelOpKind::ReduceMax { x, dim: d }, dims, t.dtype))
    }

    /// Reorder the dims of `x`: output dim `i` is input dim `perm[i]` (negative entries count
    /// from the end); `perm` must name every dim exactly once.
    pub fn permute(&mut self, x: TensorId, perm: &[i64]) -> Result<TensorId> {
        let what = format!("permute(t{x}, perm={perm:?})");
        let t = self.tensor(x)?.clone();
        let n = t.dims.len();
        let p = perm
            .iter()
            .map(|&d| norm_dim(&what, d, n))
            .collect::<Result<Vec<usize>>>()?;
        let mut seen = vec![false; n];
        for &d in &p {
            seen[d] = true;
        }
        if p.len() != n || seen.contains(&false) {
            let example: Vec<usize> = (0..n).rev().collect();
            return shape_err(format!(
                "{what}: perm must list each of the input's {n} dims (0 to {}) exactly once, e.g. {example:?}",
                n - 1
            ));
        }
        let dims: Dims = p.iter().map(|&d| t.dims[d]).collect();
        Ok(self.push1(KernelOpKind::Permute { x, perm: p }, dims, t.dtype))
    }

    /// The elements of `x` in row-major order under `dims` (the element count must match).
    pub fn reshape(&mut self, x: TensorId, dims: &[i64]) -> Result<TensorId> {
        let what = format!("reshape(t{x}, {dims:?})");
        let t = self.tensor(x)?.clone();
        let d = validate_dims(&what, dims)?;
        let (have, want) = (numel(&t.dims), numel(&d));
        if have != want {
            return shape_err(format!(
                "{what}: the input {} has {have} elements but the new dims hold {want}; choose dims whose product is {have}",
                fmt_dims(&t.dims)
            ));
        }
        Ok(self.push1(KernelOpKind::Reshape { x, dims: d }, dims_of(dims), t.dtype))
    }

    /// Graph-defined operator: `inputs` must match the block graph's inputs in count,
    /// dims and dtype; returns one new tensor per block-graph output.
    pub fn customized(&mut self, inputs: &[TensorId], graph: &BlockGraph) -> Result<Vec<TensorId>> {
        graph.check_complete()?;
        let sig = graph.input_signature();
        let fmt_sig = |s: &[(Dims, DType)]| {
            let v: Vec<String> = s
                .iter()
                .map(|(d, t)| format!("{}:{t}", fmt_dims(d)))
                .collect();
            format!("({})", v.join(", "))
        };
        let given: Vec<(Dims, DType)> = inputs
            .iter()
            .map(|&t| self.tensor(t).map(|i| (i.dims.clone(), i.dtype)))
            .collect::<Result<_>>()?;
        if given.len() != sig.len() || given.iter().zip(&sig).any(|(g, s)| g.0 != s.0) {
            return shape_err(format!(
                "customized: inputs {} do not match the block graph's inputs {}",
                fmt_sig(&given),
                fmt_sig(&sig)
            ));
        }
        if given.iter().zip(&sig).any(|(g, s)| g.1 != s.1) {
            return crate::error::dtype_err(format!(
                "customized: input dtypes {} do not match the block graph's inputs {}",
                fmt_sig(&given),
                fmt_sig(&sig)
            ));
        }
        let outs: Vec<TensorInfo> = graph
            .outputs()
            .iter()
            .map(|o| TensorInfo {
                dims: o.dims.clone(),
                dtype: graph.tiles()[o.tile].dtype,
            })
            .collect();
        Ok(self.push(
            KernelOpKind::Customized {
                inputs: inputs.to_vec(),
                graph: Box::new(graph.clone()),
            },
            outs,
        ))
    }

    /// Append a copy of an op of another graph, its operands mapped through `m` (dims
    /// arguments as stored there); validated like every builder. Returns the new results.
    pub fn replay(
        &mut self,
        kind: &KernelOpKind,
        m: &dyn Fn(TensorId) -> Result<TensorId>,
    ) -> Result<Vec<TensorId>> {
        self.replay_promoted(kind, &[], m, &|_| 0)
    }

    /// [`KernelGraph::replay`] with tensors of the other graph given `lead(t)` extra leading
    /// size-1 dims (rank promotion, see `canon`): an input's dims gain them and every dim
    /// argument moves by its tensor's count (`outs`: the op's results in the other graph,
    /// for inputs and concat).
    pub fn replay_promoted(
        &mut self,
        kind: &KernelOpKind,
        outs: &[TensorId],
        m: &dyn Fn(TensorId) -> Result<TensorId>,
        lead: &dyn Fn(TensorId) -> usize,
    ) -> Result<Vec<TensorId>> {
        let one = |r: Result<TensorId>| r.map(|t| vec![t]);
        let out_lead = outs.first().map_or(0, |&o| lead(o));
        let dim = |t: TensorId, d: usize| (d + lead(t)) as i64;
        match kind {
            KernelOpKind::Input { dims, dtype } => {
                let d: Vec<i64> = std::iter::repeat_n(1, out_lead)
                    .chain(dims.iter().map(|&v| v as i64))
                    .collect();
                one(self.new_input(&d, *dtype))
            }
            KernelOpKind::Matmul { a, b } => one(self.matmul(m(*a)?, m(*b)?)),
            KernelOpKind::Unary { op, x } => one(self.unary(*op, m(*x)?)),
            KernelOpKind::Binary { op, a, b } => one(self.binary(*op, m(*a)?, m(*b)?)),
            KernelOpKind::Reduction { x, dim: d } => one(self.reduction(m(*x)?, dim(*x, *d))),
            KernelOpKind::ReduceMax { x, dim: d } => one(self.reduce_max(m(*x)?, dim(*x, *d))),
            KernelOpKind::RmsNorm {
                x,
                normalized_shape,
                weight,
                eps,
            } => {
                let ns: Vec<i64> = normalized_shape.iter().map(|&v| v as i64).collect();
                let w = weight.map(m).transpose()?;
                one(self.rms_norm(m(*x)?, &ns, w, *eps))
            }
            KernelOpKind::Softmax { x, dim: d } => one(self.softmax(m(*x)?, dim(*x, *d))),
            KernelOpKind::Concat { xs, dim: d } => {
                let ids = xs.iter().map(|&x| m(x)).collect::<Result<Vec<_>>>()?;
                one(self.concat(&ids, (*d + out_lead) as i64))
            }
            KernelOpKind::Chunk {
                x,
                chunks,
                dim: d,
                index,
            } => one(self.chunk_piece(m(*x)?, *chunks as i64, dim(*x, *d), *index as i64)),
            KernelOpKind::AllReduce { x } => one(self.all_reduce(m(*x)?)),
            KernelOpKind::Permute { x, perm } => {
                // promoted leading dims stay in front
                let l = lead(*x);
                let p: Vec<i64> = (0..l)
                    .chain(perm.iter().map(|&d| d + l))
                    .map(|d| d as i64)
                    .collect();
                one(self.permute(m(*x)?, &p))
            }
            KernelOpKind::Reshape { x, dims } => {
                let d: Vec<i64> = std::iter::repeat_n(1, out_lead)
                    .chain(dims.iter().map(|&v| v as i64))
                    .collect();
                one(self.reshape(m(*x)?, &d))
            }
            KernelOpKind::Customized { inputs, graph } => {
                let ids = inputs.iter().map(|&x| m(x)).collect::<Result<Vec<_>>>()?;
                self.customized(&ids, graph)
            }
        }
    }

    /// Mark `x` as the next graph output (each tensor at most once).
    pub fn mark_output(&mut self, x: TensorId) -> Result<()> {
        self.tensor(x)?;
        if self.outputs.contains(&x) {
            return graph_err(format!("mark_output(t{x}): t{x} is already an output"));
        }
        self.outputs.push(x);
        Ok(())
    }

    /// Check the graph can be evaluated: at least one output.
    pub fn check_complete(&self) -> Result<()> {
        if self.outputs.is_empty() {
            return graph_err("the graph has no outputs; call mark_output on a tensor");
        }
        Ok(())
    }

    /// Human-readable listing of the ops, one per line.
    pub fn describe(&self) -> String {
        let ts = |v: &[TensorId]| {
            let s: Vec<String> = v.iter().map(|x| format!("t{x}")).collect();
            s.join(", ")
        };
        let mut s = String::new();
        for op in &self.ops {
            let body = match &op.kind {
                KernelOpKind::Input { dims, dtype } => {
                    format!("input({}, {dtype})", fmt_dims(dims))
                }
                KernelOpKind::Matmul { a, b } => format!("matmul(t{a}, t{b})"),
                KernelOpKind::Unary { op, x } => {
                    let p = op.params();
                    if p.is_empty() {
                        format!("{}(t{x})", op.name())
                    } else {
                        format!("{}(t{x}, {p:?})", op.name())
                    }
                }
                KernelOpKind::Binary { op, a, b } => format!("{}(t{a}, t{b})", op.name()),
                KernelOpKind::Reduction { x, dim } => format!("reduction(t{x}, dim={dim})"),
                KernelOpKind::ReduceMax { x, dim } => format!("reduce_max(t{x}, dim={dim})"),
                KernelOpKind::RmsNorm {
                    x,
                    normalized_shape,
                    weight,
                    eps,
                } => format!(
                    "rms_norm(t{x}, {}, weight={}, eps={eps:e})",
                    fmt_dims(normalized_shape),
                    weight.map_or("None".to_string(), |w| format!("t{w}"))
                ),
                KernelOpKind::Softmax { x, dim } => format!("softmax(t{x}, dim={dim})"),
                KernelOpKind::Concat { xs, dim } => format!("concat([{}], dim={dim})", ts(xs)),
                KernelOpKind::Chunk {
                    x,
                    chunks,
                    dim,
                    index,
                } => format!("chunk(t{x}, chunks={chunks}, dim={dim})[{index}]"),
                KernelOpKind::AllReduce { x } => format!("all_reduce(t{x})"),
                KernelOpKind::Permute { x, perm } => format!("permute(t{x}, perm={perm:?})"),
                KernelOpKind::Reshape { x, dims } => format!("reshape(t{x}, {})", fmt_dims(dims)),
                KernelOpKind::Customized { inputs, .. } => format!("customized({})", ts(inputs)),
            };
            let outs: Vec<String> = op
                .outs
                .iter()
                .map(|&o| format!("t{o}{}", fmt_dims(&self.tensors[o].dims)))
                .collect();
            let dtype = op
                .outs
                .first()
                .map(|&o| self.tensors[o].dtype.name())
                .unwrap_or("");
            s += &format!("{} = {body} : {dtype}\n", outs.join(", "));
            if let KernelOpKind::Customized { graph, .. } = &op.kind {
                s += &graph.describe("    ");
            }
        }
        s += &format!("outputs: [{}]\n", ts(&self.outputs));
        if self.world_size > 1 {
            s += &format!("world_size: {}\n", self.world_size);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn builder_validates() {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 4096], DType::F32).unwrap();
        let w = g.new_input(&[512, 768], DType::F32).unwrap();
        let e = g.matmul(x, w).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shape);
        assert!(e
            .to_string()
            .contains("A's last dim (4096) must equal B's dim -2 (512)"));
        assert_eq!(g.matmul(x, 99).unwrap_err().kind(), ErrorKind::Graph);
        let h = g.new_input(&[8, 4096], DType::F16).unwrap();
        assert_eq!(
            g.binary(BinaryOp::Add, x, h).unwrap_err().kind(),
            ErrorKind::DType
        );
        let r = g.reduction(x, -1).unwrap();
        assert_eq!(g.tensor(r).unwrap().dims, vec![8, 1]);
        let parts = g.chunk(x, 4, 1).unwrap();
        assert_eq!(parts.len(), 4);
        assert_eq!(g.tensor(parts[3]).unwrap().dims, vec![8, 1024]);
        assert!(g.chunk(x, 3, 1).is_err());
        let c = g.concat(&parts, 1).unwrap();
        assert_eq!(g.tensor(c).unwrap().dims, vec![8, 4096]);
        let wt = g.new_input(&[4096], DType::F32).unwrap();
        assert!(g.rms_norm(x, &[4096], Some(wt), 1e-6).is_ok());
        assert!(g.rms_norm(x, &[8], Some(wt), 1e-6).is_err());
        assert!(g.rms_norm(x, &[4096], Some(w), 1e-6).is_err());
        // full-rank weight (leading 1s) is accepted, a longer one is not
        let w2 = g.new_input(&[1, 4096], DType::F32).unwrap();
        assert!(g.rms_norm(x, &[4096], Some(w2), 1e-6).is_ok());
        let w3 = g.new_input(&[1, 1, 4096], DType::F32).unwrap();
        let e = g.rms_norm(x, &[4096], Some(w3), 1e-6).unwrap_err();
        assert!(e.to_string().contains("[1,4096]"), "{e}");
        // numpy broadcasting with rank promotion
        let s = g.binary(BinaryOp::Add, x, wt).unwrap();
        assert_eq!(g.tensor(s).unwrap().dims, vec![8, 4096]);
        let e = g.binary(BinaryOp::Add, x, w).unwrap_err();
        assert!(e.to_string().contains("[8,4096]") && e.to_string().contains("[512,768]"));
        let ar = g.all_reduce(x).unwrap();
        assert_eq!(g.tensor(ar).unwrap().dims, vec![8, 4096]);
        assert!(KernelGraph::with_world_size(0).is_err());
        assert!(KernelGraph::with_world_size(1025).is_err());
        assert_eq!(KernelGraph::with_world_size(4).unwrap().world_size(), 4);
        assert!(g.softmax(x, 2).is_err());
        assert!(g.check_complete().is_err());
        g.mark_output(c).unwrap();
        assert!(g.mark_output(c).is_err());
        assert!(g.describe().contains("matmul") || g.describe().contains("concat"));
        assert!(parse_id("x", -1).is_err());
    }
}
