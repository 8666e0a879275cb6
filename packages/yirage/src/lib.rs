//! `yirage._core`: PyO3 bindings of yirage-core. Bindings only — every semantic decision
//! (validation, shapes, evaluation, fingerprints, JSON) lives in the core crate. This file
//! converts arguments, maps `CoreError` kinds to Python exception classes, releases the GIL
//! around long computations, and turns any Rust panic into a `YirageError`.

mod estimate;
mod search;
mod shard;

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use yirage_core::block_graph::BlockGraph;
use yirage_core::kernel_graph::{parse_id, KernelGraph};
use yirage_core::{canon, field, fingerprint, json, reference};
use yirage_core::{AccumKind, BinaryOp, CoreError, DType, ErrorKind, Tensor, UnaryOp};

pyo3::create_exception!(
    yirage._core,
    YirageError,
    PyException,
    "Base class of every error yirage raises."
);
pyo3::create_exception!(
    yirage._core,
    ShapeError,
    YirageError,
    "Dims that do not fit the operator (the message names the expected shape)."
);
pyo3::create_exception!(
    yirage._core,
    DTypeError,
    YirageError,
    "Unsupported dtype or mixed dtypes."
);
pyo3::create_exception!(
    yirage._core,
    GraphError,
    YirageError,
    "Malformed graph: unknown tensor id, no outputs, bad op name or parameters."
);
pyo3::create_exception!(
    yirage._core,
    MappingError,
    YirageError,
    "Thread-block graph mapping problem."
);
pyo3::create_exception!(
    yirage._core,
    SerializationError,
    YirageError,
    "Invalid or unsupported JSON."
);
pyo3::create_exception!(
    yirage._core,
    EvaluationError,
    YirageError,
    "Inputs given to evaluate/fingerprint do not match the graph."
);

/// Map a core error onto its Python exception class.
fn to_py(e: CoreError) -> PyErr {
    let m = e.to_string();
    match e.kind() {
        ErrorKind::Shape => ShapeError::new_err(m),
        ErrorKind::DType => DTypeError::new_err(m),
        ErrorKind::Graph => GraphError::new_err(m),
        ErrorKind::Mapping => MappingError::new_err(m),
        ErrorKind::Serialization => SerializationError::new_err(m),
        ErrorKind::Evaluation => EvaluationError::new_err(m),
    }
}

/// Run `f`, converting a core error to its exception and a panic to `YirageError`.
fn guard<T>(f: impl FnOnce() -> yirage_core::Result<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(to_py),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(YirageError::new_err(format!(
                "internal error in yirage-core (please report): {msg}"
            )))
        }
    }
}

fn ids(what: &str, v: &[i64]) -> yirage_core::Result<Vec<usize>> {
    v.iter().map(|&x| parse_id(what, x)).collect()
}

fn dims_u64(d: &[usize]) -> Vec<u64> {
    d.iter().map(|&x| x as u64).collect()
}

/// Seeds are 64-bit: accept any int in [-2^63, 2^64) (negatives wrap).
fn seed_arg(seed: i128) -> PyResult<u64> {
    if (-(1i128 << 63)..(1i128 << 64)).contains(&seed) {
        Ok(seed as u64)
    } else {
        Err(EvaluationError::new_err(
            "seed must be an integer in [-2**63, 2**64)",
        ))
    }
}

/// Thread-block graph (body of a customized op).
#[pyclass(name = "BlockGraph", module = "yirage._core")]
struct PyBlockGraph {
    inner: BlockGraph,
}

#[pymethods]
impl PyBlockGraph {
    #[new]
    #[pyo3(signature = (grid_dim, block_dim, forloop_range, reduction_dimx, forloop_tile=None))]
    fn new(
        grid_dim: (i64, i64, i64),
        block_dim: (i64, i64, i64),
        forloop_range: i64,
        reduction_dimx: i64,
        forloop_tile: Option<i64>,
    ) -> PyResult<Self> {
        guard(|| {
            let mut inner = BlockGraph::new(
                [grid_dim.0, grid_dim.1, grid_dim.2],
                [block_dim.0, block_dim.1, block_dim.2],
                forloop_range,
                reduction_dimx,
            )?;
            if let Some(t) = forloop_tile {
                inner.set_loop_tile(t)?;
            }
            Ok(PyBlockGraph { inner })
        })
    }

    /// The loop's explicit tile along walked dims, when it differs from the default.
    #[getter]
    fn forloop_tile(&self) -> Option<u32> {
        self.inner.loop_tile()
    }

    #[getter]
    fn grid_dim(&self) -> (u32, u32, u32) {
        let g = self.inner.grid_dim();
        (g[0], g[1], g[2])
    }

    #[getter]
    fn block_dim(&self) -> (u32, u32, u32) {
        let b = self.inner.block_dim();
        (b[0], b[1], b[2])
    }

    #[getter]
    fn forloop_range(&self) -> u32 {
        self.inner.forloop_range()
    }

    #[getter]
    fn reduction_dimx(&self) -> u32 {
        self.inner.reduction_dimx()
    }

    fn new_input(
        &mut self,
        dims: Vec<i64>,
        dtype: &str,
        input_map: (i64, i64, i64),
        forloop_dim: i64,
    ) -> PyResult<usize> {
        guard(|| {
            let dt = DType::parse(dtype)?;
            self.inner.new_input(
                &dims,
                dt,
                [input_map.0, input_map.1, input_map.2],
                forloop_dim,
            )
        })
    }

    fn matmul(&mut self, a: i64, b: i64) -> PyResult<usize> {
        guard(|| {
            self.inner
                .matmul(parse_id("matmul", a)?, parse_id("matmul", b)?)
        })
    }

    #[pyo3(signature = (op, x, params = Vec::new()))]
    fn unary(&mut self, op: &str, x: i64, params: Vec<f64>) -> PyResult<usize> {
        guard(|| {
            let op = UnaryOp::parse(op, &params)?;
            self.inner.unary(op, parse_id("unary", x)?)
        })
    }

    fn binary(&mut self, op: &str, a: i64, b: i64) -> PyResult<usize> {
        guard(|| {
            let op = BinaryOp::parse(op)?;
            self.inner
                .binary(op, parse_id("binary", a)?, parse_id("binary", b)?)
        })
    }

    fn reduction(&mut self, x: i64, dim: i64) -> PyResult<usize> {
        guard(|| self.inner.reduction(parse_id("reduction", x)?, dim))
    }

    fn reduction_to_dimx(&mut self, x: i64, dim: i64) -> PyResult<usize> {
        guard(|| {
            self.inner
                .reduction_to_dimx(parse_id("reduction_to_dimx", x)?, dim)
        })
    }

    fn rms_norm(&mut self, x: i64, eps: f64) -> PyResult<usize> {
        guard(|| self.inner.rms_norm(parse_id("rms_norm", x)?, eps))
    }

    fn concat(&mut self, xs: Vec<i64>, dim: i64) -> PyResult<usize> {
        guard(|| self.inner.concat(&ids("concat", &xs)?, dim))
    }

    #[pyo3(signature = (x, acc = None, eps = 0.0))]
    fn forloop_accum(&mut self, x: i64, acc: Option<&str>, eps: f64) -> PyResult<usize> {
        guard(|| {
            let kind = AccumKind::parse(acc, eps)?;
            self.inner
                .forloop_accum(parse_id("forloop_accum", x)?, kind)
        })
    }

    fn new_output(&mut self, x: i64, output_map: (i64, i64, i64)) -> PyResult<usize> {
        guard(|| {
            self.inner.new_output(
                parse_id("new_output", x)?,
                [output_map.0, output_map.1, output_map.2],
            )
        })
    }

    fn tensor_dims(&self, t: i64) -> PyResult<Vec<u64>> {
        guard(|| {
            Ok(dims_u64(
                &self.inner.tile(parse_id("tensor_dims", t)?)?.dims,
            ))
        })
    }

    fn tensor_dtype(&self, t: i64) -> PyResult<&'static str> {
        guard(|| Ok(self.inner.tile(parse_id("tensor_dtype", t)?)?.dtype.name()))
    }

    fn num_inputs(&self) -> usize {
        self.inner.num_inputs()
    }

    fn num_outputs(&self) -> usize {
        self.inner.num_outputs()
    }

    fn output_dims(&self) -> Vec<Vec<u64>> {
        self.inner
            .output_dims()
            .iter()
            .map(|d| dims_u64(d))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockGraph(grid_dim={:?}, block_dim={:?}, forloop_range={}, reduction_dimx={}, ops={}, outputs={})",
            self.inner.grid_dim(),
            self.inner.block_dim(),
            self.inner.forloop_range(),
            self.inner.reduction_dimx(),
            self.inner.ops().len(),
            self.inner.num_outputs()
        )
    }
}

/// Kernel graph (the user-level µGraph).
#[pyclass(name = "KernelGraph", module = "yirage._core")]
struct PyKernelGraph {
    inner: KernelGraph,
}

#[pymethods]
impl PyKernelGraph {
    #[new]
    #[pyo3(signature = (world_size = 1))]
    fn new(world_size: i64) -> PyResult<Self> {
        guard(|| {
            Ok(PyKernelGraph {
                inner: KernelGraph::with_world_size(world_size)?,
            })
        })
    }

    /// Number of ranks of the SPMD program (1: single device).
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn all_reduce(&mut self, x: i64) -> PyResult<usize> {
        guard(|| self.inner.all_reduce(parse_id("all_reduce", x)?))
    }

    /// The equal-rank form the search works on (this graph when nothing is promoted).
    fn promote_ranks(&self) -> PyResult<PyKernelGraph> {
        guard(|| {
            Ok(PyKernelGraph {
                inner: canon::promote_ranks(&self.inner)?,
            })
        })
    }

    fn new_input(&mut self, dims: Vec<i64>, dtype: &str) -> PyResult<usize> {
        guard(|| {
            let dt = DType::parse(dtype)?;
            self.inner.new_input(&dims, dt)
        })
    }

    fn matmul(&mut self, a: i64, b: i64) -> PyResult<usize> {
        guard(|| {
            self.inner
                .matmul(parse_id("matmul", a)?, parse_id("matmul", b)?)
        })
    }

    #[pyo3(signature = (op, x, params = Vec::new()))]
    fn unary(&mut self, op: &str, x: i64, params: Vec<f64>) -> PyResult<usize> {
        guard(|| {
            let op = UnaryOp::parse(op, &params)?;
            self.inner.unary(op, parse_id("unary", x)?)
        })
    }

    fn binary(&mut self, op: &str, a: i64, b: i64) -> PyResult<usize> {
        guard(|| {
            let op = BinaryOp::parse(op)?;
            self.inner
                .binary(op, parse_id("binary", a)?, parse_id("binary", b)?)
        })
    }

    fn reduction(&mut self, x: i64, dim: i64) -> PyResult<usize> {
        guard(|| self.inner.reduction(parse_id("reduction", x)?, dim))
    }

    fn rms_norm(
        &mut self,
        x: i64,
        normalized_shape: Vec<i64>,
        weight: Option<i64>,
        eps: f64,
    ) -> PyResult<usize> {
        guard(|| {
            let w = weight.map(|w| parse_id("rms_norm", w)).transpose()?;
            self.inner
                .rms_norm(parse_id("rms_norm", x)?, &normalized_shape, w, eps)
        })
    }

    fn softmax(&mut self, x: i64, dim: i64) -> PyResult<usize> {
        guard(|| self.inner.softmax(parse_id("softmax", x)?, dim))
    }

    fn concat(&mut self, xs: Vec<i64>, dim: i64) -> PyResult<usize> {
        guard(|| self.inner.concat(&ids("concat", &xs)?, dim))
    }

    fn chunk(&mut self, x: i64, chunks: i64, dim: i64) -> PyResult<Vec<usize>> {
        guard(|| self.inner.chunk(parse_id("chunk", x)?, chunks, dim))
    }

    fn reduce_max(&mut self, x: i64, dim: i64) -> PyResult<usize> {
        guard(|| self.inner.reduce_max(parse_id("reduce_max", x)?, dim))
    }

    fn permute(&mut self, x: i64, perm: Vec<i64>) -> PyResult<usize> {
        guard(|| self.inner.permute(parse_id("permute", x)?, &perm))
    }

    fn reshape(&mut self, x: i64, dims: Vec<i64>) -> PyResult<usize> {
        guard(|| self.inner.reshape(parse_id("reshape", x)?, &dims))
    }

    fn customized(
        &mut self,
        inputs: Vec<i64>,
        block_graph: PyRef<'_, PyBlockGraph>,
    ) -> PyResult<Vec<usize>> {
        guard(|| {
            self.inner
                .customized(&ids("customized", &inputs)?, &block_graph.inner)
        })
    }

    fn mark_output(&mut self, x: i64) -> PyResult<()> {
        guard(|| self.inner.mark_output(parse_id("mark_output", x)?))
    }

    fn tensor_dims(&self, t: i64) -> PyResult<Vec<u64>> {
        guard(|| {
            Ok(dims_u64(
                &self.inner.tensor(parse_id("tensor_dims", t)?)?.dims,
            ))
        })
    }

    fn tensor_dtype(&self, t: i64) -> PyResult<&'static str> {
        guard(|| {
            Ok(self
                .inner
                .tensor(parse_id("tensor_dtype", t)?)?
                .dtype
                .name())
        })
    }

    fn num_tensors(&self) -> usize {
        self.inner.num_tensors()
    }

    fn inputs(&self) -> Vec<usize> {
        self.inner.inputs().to_vec()
    }

    fn outputs(&self) -> Vec<usize> {
        self.inner.outputs().to_vec()
    }

    fn describe(&self) -> PyResult<String> {
        guard(|| Ok(self.inner.describe()))
    }

    /// Reference evaluator in float64; inputs and outputs are (little-endian f64 bytes, dims)
    /// with per-rank dims: for `world_size` N the bytes hold the N ranks' values one after
    /// the other (rank-major).
    fn evaluate(
        &self,
        py: Python<'_>,
        inputs: Vec<(PyBackedBytes, Vec<i64>)>,
    ) -> PyResult<Vec<(Py<PyBytes>, Vec<u64>)>> {
        let n = self.inner.world_size();
        let outs = py.detach(|| {
            guard(|| {
                let tensors = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, (bytes, dims))| decode_f64(k, bytes, dims, n))
                    .collect::<yirage_core::Result<Vec<Vec<Tensor>>>>()?;
                // per input, per rank → per rank, per input
                let mut per_rank: Vec<Vec<Tensor>> = vec![Vec::with_capacity(tensors.len()); n];
                for ranks in tensors {
                    for (r, t) in ranks.into_iter().enumerate() {
                        per_rank[r].push(t);
                    }
                }
                reference::evaluate_ranks(&self.inner, &per_rank)
            })
        })?;
        let n_out = outs.first().map_or(0, |o| o.len());
        Ok((0..n_out)
            .map(|k| {
                let mut buf = vec![];
                for rank in &outs {
                    for v in &rank[k].data {
                        buf.extend_from_slice(&v.to_le_bytes());
                    }
                }
                (PyBytes::new(py, &buf).unbind(), dims_u64(&outs[0][k].dims))
            })
            .collect())
    }

    /// Hex digest of the finite-field fingerprint; bit-identical for any `threads`.
    #[pyo3(signature = (trials = 2, seed = 0, threads = None))]
    fn fingerprint(
        &self,
        py: Python<'_>,
        trials: i64,
        seed: i128,
        threads: Option<i64>,
    ) -> PyResult<String> {
        let seed = seed_arg(seed)?;
        let trials = usize::try_from(trials).unwrap_or(0);
        let threads = threads.map(|t| usize::try_from(t).unwrap_or(0));
        py.detach(|| guard(|| fingerprint::fingerprint(&self.inner, trials, seed, threads)))
    }

    fn to_json(&self) -> PyResult<String> {
        guard(|| Ok(json::to_json(&self.inner)))
    }

    #[staticmethod]
    fn from_json(s: &str) -> PyResult<PyKernelGraph> {
        guard(|| {
            Ok(PyKernelGraph {
                inner: json::from_json(s)?,
            })
        })
    }

    fn hash(&self) -> PyResult<String> {
        guard(|| Ok(json::hash(&self.inner)))
    }

    fn __repr__(&self) -> String {
        let ws = match self.inner.world_size() {
            1 => String::new(),
            n => format!(", world_size={n}"),
        };
        format!(
            "KernelGraph(tensors={}, inputs={:?}, outputs={:?}{ws})",
            self.inner.num_tensors(),
            self.inner.inputs(),
            self.inner.outputs()
        )
    }
}

/// Decode little-endian float64 bytes of input `k`: `ranks` tensors of the given dims.
fn decode_f64(
    k: usize,
    bytes: &[u8],
    dims: &[i64],
    ranks: usize,
) -> yirage_core::Result<Vec<Tensor>> {
    let dims = yirage_core::shape::validate_dims(&format!("evaluate: input #{k}"), dims)
        .map_err(|e| CoreError::Evaluation(e.message().to_string()))?;
    if bytes.len() % 8 != 0 {
        return Err(CoreError::Evaluation(format!(
            "evaluate: input #{k} has {} bytes, not a whole number of float64 values",
            bytes.len()
        )));
    }
    let data: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    let per_rank = yirage_core::shape::numel(&dims);
    if data.len() != per_rank.saturating_mul(ranks) {
        let each = if ranks > 1 {
            format!(" ({ranks} ranks)")
        } else {
            String::new()
        };
        return Err(CoreError::Evaluation(format!(
            "evaluate: input #{k} of dims {} needs {} values{each}, got {}",
            yirage_core::shape::fmt_dims(&dims),
            per_rank.saturating_mul(ranks),
            data.len()
        )));
    }
    data.chunks(per_rank)
        .map(|c| {
            Tensor::new(dims.clone(), c.to_vec())
                .map_err(|e| e.context(format!("evaluate: input #{k}")))
        })
        .collect()
}

/// Fingerprint equivalence with the float64 cross-check; raises ShapeError when the input
/// signatures differ.
#[pyfunction]
#[pyo3(signature = (a, b, trials = 2, seed = 0))]
fn equivalent(
    py: Python<'_>,
    a: PyRef<'_, PyKernelGraph>,
    b: PyRef<'_, PyKernelGraph>,
    trials: i64,
    seed: i128,
) -> PyResult<bool> {
    let seed = seed_arg(seed)?;
    let trials = usize::try_from(trials).unwrap_or(0);
    let (ga, gb) = (&a.inner, &b.inner);
    py.detach(|| guard(|| fingerprint::equivalent(ga, gb, trials, seed)))
}

/// The fingerprint field's parameters.
#[pyfunction]
fn field_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("p", field::P)?;
    d.set_item("q", field::Q)?;
    d.set_item("g", field::G)?;
    Ok(d)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", yirage_core::VERSION)?;
    m.add("FINGERPRINT_SCHEME", yirage_core::FINGERPRINT_SCHEME)?;
    m.add("YirageError", py.get_type::<YirageError>())?;
    m.add("ShapeError", py.get_type::<ShapeError>())?;
    m.add("DTypeError", py.get_type::<DTypeError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("MappingError", py.get_type::<MappingError>())?;
    m.add("SerializationError", py.get_type::<SerializationError>())?;
    m.add("EvaluationError", py.get_type::<EvaluationError>())?;
    m.add_class::<PyBlockGraph>()?;
    m.add_class::<PyKernelGraph>()?;
    m.add_function(wrap_pyfunction!(equivalent, m)?)?;
    m.add_function(wrap_pyfunction!(field_info, m)?)?;
    search::register(m)?;
    shard::register(m)?;
    estimate::register(m)?;
    Ok(())
}
