//! Bindings of the search (`yirage_core::search`), the KernelPlan lowering and the
//! DeviceSpec parser. Bindings only: the Python glue lives in `yirage/_search.py`.
//!
//! The search runs in a worker thread with the GIL released; the calling thread wakes every
//! 50 ms to run `check_signals()` (Ctrl-C sets the cancel flag and raises
//! `KeyboardInterrupt` at once, without waiting for the worker) and to call the optional
//! progress callback with a dict of counters.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use yirage_core::cost::DeviceSpec;
use yirage_core::search::{
    search as core_search, Candidate, ProgressSnapshot, SearchConfig, SearchControl, SearchResult,
};
use yirage_core::{plan, CoreError};

use crate::{guard, to_py, PyKernelGraph, YirageError};

/// Poll interval of the calling thread.
const POLL: Duration = Duration::from_millis(50);

/// One candidate µGraph of a search.
#[pyclass(name = "SearchCandidate", module = "yirage._core", frozen)]
struct PyCandidate {
    inner: Candidate,
    spec: DeviceSpec,
}

#[pymethods]
impl PyCandidate {
    /// The candidate graph (a new `_core.KernelGraph`).
    #[getter]
    fn graph(&self) -> PyKernelGraph {
        PyKernelGraph {
            inner: self.inner.graph.clone(),
        }
    }
    /// Predicted time on the device (µs, cost model).
    #[getter]
    fn predicted_us(&self) -> f64 {
        self.inner.predicted_us
    }
    /// Canonical content hash of the graph.
    #[getter]
    fn hash(&self) -> String {
        self.inner.hash.clone()
    }
    /// Human-readable structure.
    #[getter]
    fn label(&self) -> String {
        self.inner.label.clone()
    }
    /// True for the original graph as library kernels.
    #[getter]
    fn baseline(&self) -> bool {
        self.inner.baseline
    }
    /// The KernelPlan (JSON) validated against the search's DeviceSpec.
    fn kernel_plan_json(&self) -> PyResult<String> {
        guard(|| Ok(self.inner.kernel_plan(&self.spec)?.to_json()))
    }
    fn __repr__(&self) -> String {
        format!(
            "SearchCandidate({:.2} us, {})",
            self.inner.predicted_us, self.inner.label
        )
    }
}

/// Result of `search`: candidates (best predicted first) and the report.
#[pyclass(name = "SearchResult", module = "yirage._core", frozen)]
pub(crate) struct PySearchResult {
    pub(crate) inner: SearchResult,
    pub(crate) spec: DeviceSpec,
}

#[pymethods]
impl PySearchResult {
    #[getter]
    fn candidates(&self) -> Vec<PyCandidate> {
        self.inner
            .candidates
            .iter()
            .map(|c| PyCandidate {
                inner: c.clone(),
                spec: self.spec.clone(),
            })
            .collect()
    }
    /// The report as JSON.
    #[getter]
    fn report_json(&self) -> String {
        self.inner.report.to_json()
    }
    /// The report as text.
    #[getter]
    fn report_text(&self) -> String {
        self.inner.report.to_string()
    }
}

fn counters<'py>(
    py: Python<'py>,
    s: &ProgressSnapshot,
    elapsed: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("states_explored", s.states_explored)?;
    d.set_item("states_pruned", s.states_pruned)?;
    d.set_item("concretisations", s.concretisations)?;
    d.set_item("candidates_found", s.candidates_found)?;
    d.set_item("fingerprint_tests", s.fingerprint_tests)?;
    d.set_item("verified", s.verified)?;
    d.set_item("rejected", s.rejected)?;
    d.set_item("elapsed_s", elapsed)?;
    Ok(d)
}

/// Search for µGraphs equivalent to `graph` on the device described by `device_spec`
/// (JSON), with `options` (JSON object of SearchConfig fields). `progress` is called with a
/// dict of counters every 50 ms.
#[pyfunction]
#[pyo3(signature = (graph, device_spec, options = "{}", progress = None))]
fn search(
    py: Python<'_>,
    graph: PyRef<'_, PyKernelGraph>,
    device_spec: &str,
    options: &str,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<PySearchResult> {
    let spec = DeviceSpec::from_json(device_spec).map_err(to_py)?;
    let cfg = SearchConfig::from_json(options).map_err(to_py)?;
    let target = graph.inner.clone();
    let ctl = SearchControl::default();
    let worker_ctl = ctl.clone();
    let worker_spec = spec.clone();
    let start = Instant::now();
    let handle = thread::Builder::new()
        .name("yirage-search".into())
        .spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                core_search(&target, &worker_spec, &cfg, &worker_ctl)
            }))
        })
        .map_err(|e| YirageError::new_err(format!("could not start the search thread: {e}")))?;
    loop {
        let finished = py.detach(|| {
            let until = Instant::now() + POLL;
            while Instant::now() < until {
                if handle.is_finished() {
                    return true;
                }
                thread::sleep(Duration::from_millis(2));
            }
            handle.is_finished()
        });
        if finished {
            break;
        }
        let interrupted = py.check_signals();
        let callback = match (&interrupted, &progress) {
            (Ok(()), Some(cb)) => {
                let d = counters(py, &ctl.progress.snapshot(), start.elapsed().as_secs_f64())?;
                cb.call1((d,)).map(|_| ())
            }
            _ => Ok(()),
        };
        if let Err(e) = interrupted.and(callback) {
            // Stop the worker; it notices the flag at its next state and exits on its own.
            ctl.cancel.store(true, Ordering::Relaxed);
            return Err(e);
        }
    }
    let res = py
        .detach(|| handle.join())
        .map_err(|_| YirageError::new_err("internal error: the search thread died"))?;
    let res = match res {
        Ok(r) => r.map_err(to_py)?,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            return Err(YirageError::new_err(format!(
                "internal error in the search (please report): {msg}"
            )));
        }
    };
    Ok(PySearchResult { inner: res, spec })
}

/// Lower `graph` to a KernelPlan (JSON) validated against `device_spec` (JSON).
#[pyfunction]
fn kernel_plan(
    py: Python<'_>,
    graph: PyRef<'_, PyKernelGraph>,
    device_spec: &str,
) -> PyResult<String> {
    let spec = DeviceSpec::from_json(device_spec).map_err(to_py)?;
    let g = &graph.inner;
    py.detach(|| guard(|| Ok(plan::lower(g, &spec)?.to_json())))
}

/// Validate a DeviceSpec (JSON) and return its canonical JSON.
#[pyfunction]
fn device_spec_json(device_spec: &str) -> PyResult<String> {
    Ok(DeviceSpec::from_json(device_spec).map_err(to_py)?.to_json())
}

/// Validate search options (JSON object) and return the complete canonical config JSON.
#[pyfunction]
#[pyo3(signature = (options = "{}"))]
fn search_config_json(options: &str) -> PyResult<String> {
    Ok(SearchConfig::from_json(options).map_err(to_py)?.to_json())
}

/// Predicted time (µs) of `graph` on `device_spec` (the search's cost model).
#[pyfunction]
fn predicted_us(graph: PyRef<'_, PyKernelGraph>, device_spec: &str) -> PyResult<f64> {
    let spec = DeviceSpec::from_json(device_spec).map_err(to_py)?;
    guard(|| {
        let profiles = plan::graph_profiles(&graph.inner)?;
        Ok::<f64, CoreError>(yirage_core::cost::total_cost(&spec, &profiles))
    })
}

/// Register the search bindings in `_core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCandidate>()?;
    m.add_class::<PySearchResult>()?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_plan, m)?)?;
    m.add_function(wrap_pyfunction!(device_spec_json, m)?)?;
    m.add_function(wrap_pyfunction!(search_config_json, m)?)?;
    m.add_function(wrap_pyfunction!(predicted_us, m)?)?;
    Ok(())
}
