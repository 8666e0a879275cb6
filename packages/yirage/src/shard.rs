//! Bindings of the sharded search (`yirage_core::search::shard`) for distributed executors:
//! a worker runs one shard and returns its JSON; the driver merges every shard's JSON and
//! verifies. Both release the GIL around the work. The Python glue lives in
//! `yirage/_distributed.py`.

use pyo3::prelude::*;

use yirage_core::cost::DeviceSpec;
use yirage_core::search::shard::{merge_shards, search_shard as core_shard, ShardOutput};
use yirage_core::search::{SearchConfig, SearchControl};

use crate::search::PySearchResult;
use crate::{guard, to_py, PyKernelGraph};

/// Run shard `index` of `count` of the search of `graph` (see the core's shard module);
/// returns the shard's output as JSON.
#[pyfunction]
#[pyo3(signature = (graph, device_spec, options, index, count))]
fn search_shard(
    py: Python<'_>,
    graph: PyRef<'_, PyKernelGraph>,
    device_spec: &str,
    options: &str,
    index: usize,
    count: usize,
) -> PyResult<String> {
    let spec = DeviceSpec::from_json(device_spec).map_err(to_py)?;
    let cfg = SearchConfig::from_json(options).map_err(to_py)?;
    let target = graph.inner.clone();
    py.detach(|| {
        guard(|| {
            let ctl = SearchControl::default();
            Ok(core_shard(&target, &spec, &cfg, &ctl, index, count)?.to_json())
        })
    })
}

/// Merge the JSON outputs of every shard of one search and verify them on this side;
/// `enumerate_s` is the wall time the shards took.
#[pyfunction]
#[pyo3(signature = (graph, device_spec, options, shards, enumerate_s))]
fn merge_search_shards(
    py: Python<'_>,
    graph: PyRef<'_, PyKernelGraph>,
    device_spec: &str,
    options: &str,
    shards: Vec<String>,
    enumerate_s: f64,
) -> PyResult<PySearchResult> {
    let spec = DeviceSpec::from_json(device_spec).map_err(to_py)?;
    let cfg = SearchConfig::from_json(options).map_err(to_py)?;
    let target = graph.inner.clone();
    let worker_spec = spec.clone();
    let inner = py.detach(|| {
        guard(|| {
            let outs = shards
                .iter()
                .map(|s| ShardOutput::from_json(s))
                .collect::<yirage_core::Result<Vec<_>>>()?;
            let ctl = SearchControl::default();
            merge_shards(&target, &worker_spec, &cfg, &ctl, &outs, enumerate_s)
        })
    })?;
    Ok(PySearchResult { inner, spec })
}

/// Register the shard bindings in `_core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(search_shard, m)?)?;
    m.add_function(wrap_pyfunction!(merge_search_shards, m)?)?;
    Ok(())
}
