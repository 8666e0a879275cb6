//! Binding of the cost model's per-kernel terms (`yirage_core::cost::kernel_cost` over the
//! kernels `yirage_core::plan::graph_profiles` finds), for `yirage.estimate`. Bindings only:
//! the terms, their sum and their labels are the core's.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use yirage_core::cost::{kernel_cost, DeviceSpec};
use yirage_core::kernel_graph::{KernelGraph, KernelOpKind};
use yirage_core::{plan, CoreError};

use crate::{guard, to_py, PyKernelGraph};

/// Name of the kernel an op becomes: the library op, or `customized` for a generated one.
fn kernel_name(kind: &KernelOpKind) -> Option<&'static str> {
    Some(match kind {
        KernelOpKind::Input { .. } => return None,
        KernelOpKind::Matmul { .. } => "matmul",
        KernelOpKind::Unary { op, .. } => op.name(),
        KernelOpKind::Binary { op, .. } => op.name(),
        KernelOpKind::Reduction { .. } => "reduction",
        KernelOpKind::RmsNorm { .. } => "rms_norm",
        KernelOpKind::Softmax { .. } => "softmax",
        KernelOpKind::Concat { .. } => "concat",
        KernelOpKind::Chunk { .. } => "chunk",
        KernelOpKind::Permute { .. } => "permute",
        KernelOpKind::ReduceMax { .. } => "reduce_max",
        KernelOpKind::Reshape { .. } => "reshape",
        KernelOpKind::AllReduce { .. } => "all_reduce",
        KernelOpKind::Customized { .. } => "customized",
    })
}

/// (kernel name, cost) of every kernel of `g`, in execution order.
fn kernel_costs(
    g: &KernelGraph,
    spec: &DeviceSpec,
) -> yirage_core::Result<Vec<(&'static str, yirage_core::cost::KernelCost)>> {
    let profiles = plan::graph_profiles(g)?;
    let names: Vec<&'static str> = g
        .ops()
        .iter()
        .filter_map(|op| kernel_name(&op.kind))
        .collect();
    if names.len() != profiles.len() {
        return Err(CoreError::Graph(format!(
            "cost terms: {} kernels named but {} profiled (please report)",
            names.len(),
            profiles.len()
        )));
    }
    Ok(names
        .into_iter()
        .zip(profiles.iter().map(|p| kernel_cost(spec, p)))
        .collect())
}

/// The cost model's terms of every kernel of `graph` on `device_spec` (JSON), in execution
/// order: a dict per kernel with `op`, `total_us`, `memory_us`, `compute_us`, `launch_us`,
/// `exposed_us`, `loop_us`, `combine_us`, `utilization`, `loop_split`, `collective_us` and
/// `terms` (the parts that add up to `total_us`). Their totals sum to
/// `predicted_us(graph, device_spec)`.
#[pyfunction]
fn cost_terms<'py>(
    py: Python<'py>,
    graph: PyRef<'_, PyKernelGraph>,
    device_spec: &str,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let spec = DeviceSpec::from_json(device_spec).map_err(to_py)?;
    let costs = guard(|| kernel_costs(&graph.inner, &spec))?;
    let mut out = Vec::with_capacity(costs.len());
    for (name, c) in costs {
        let d = PyDict::new(py);
        d.set_item("op", name)?;
        d.set_item("total_us", c.total_us)?;
        d.set_item("memory_us", c.memory_us)?;
        d.set_item("compute_us", c.compute_us)?;
        d.set_item("launch_us", c.launch_us)?;
        d.set_item("exposed_us", c.exposed_us)?;
        d.set_item("loop_us", c.loop_us)?;
        d.set_item("combine_us", c.combine_us)?;
        d.set_item("utilization", c.utilization)?;
        d.set_item("loop_split", c.loop_split)?;
        d.set_item("collective_us", c.collective_us)?;
        let terms = PyDict::new(py);
        for (term, value) in c.additive_terms() {
            terms.set_item(term, value)?;
        }
        d.set_item("terms", terms)?;
        out.push(d);
    }
    Ok(out)
}

/// Register the cost-term binding in `_core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cost_terms, m)?)?;
    Ok(())
}
