"""The numeric check: fresh inputs, the float64 reference evaluator's outputs for them, a
launcher's worst relative error against those, and the tolerance it must meet.

``superoptimize`` checks every contender (every variant of every candidate) with these before
it may win; ``load_kernel`` re-checks a loaded kernel. Inputs are drawn in the graph's shapes
and viewed in the kernel's (:class:`~yirage._shapes.Shapes`). Multi-device graphs
(``world_size`` N > 1) are checked by running all N ranks in this process
(``yirage._collectives.run_ranks``) against the reference evaluator's N ranks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from yirage import _collectives, _compare_torch, _reference_torch
from yirage._backend import Backend
from yirage._errors import NumericCheckError
from yirage._graph import KernelGraph
from yirage._shapes import Shapes

__all__ = [
    "CHECK_INPUTS_VERSION",
    "TOLERANCES",
    "arrays_to_backend",
    "check_arrays",
    "check_failure",
    "check_input_generator",
    "check_inputs",
    "check_scale",
    "check_tensors",
    "new_check_seed",
    "reference_outputs",
    "rel_frobenius",
    "run_check",
    "to_backend_tensors",
    "to_numpy32",
    "to_numpy64",
    "tolerance_for",
]

#: Relative Frobenius-norm error allowed by the numeric check, by output dtype.
TOLERANCES: dict[str, float] = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def new_check_seed() -> int:
    """A fresh seed for the check inputs (recorded in the report, so a failure reproduces)."""
    return int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]


def to_numpy32(x: Any) -> np.ndarray:
    """A float32 numpy array of a numpy array or a torch tensor on any device (a copy only
    where the dtype or device needs one)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float32, copy=False)
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        arr: np.ndarray = x.detach().float().cpu().numpy()
        return arr
    return np.asarray(x, dtype=np.float32)


def to_numpy64(x: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array or a torch tensor on any device."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        arr: np.ndarray = x.detach().float().cpu().double().numpy()
        return arr
    return np.asarray(x, dtype=np.float64)


#: Version of :func:`check_inputs`' generator: stored references are only reused with it.
CHECK_INPUTS_VERSION = 2


#: Check inputs are drawn in chunks of this many elements, each from its own child seed, on a
#: thread pool (numpy's generators release the GIL): 2 x 33.5M values (GQA decode's K and V at
#: kv 16384) take a fraction of the 1-2 s one generator needs, and the values do not depend on
#: the number of threads.
_CHECK_CHUNK = 1 << 20


def check_scale(dims: Sequence[int]) -> float:
    """Factor on a check input's N(0, 1) values: 1/√(dims[-2]) for matrix-like inputs
    (dims[-2] ≥ 64), so matmul outputs stay O(1) even in float16."""
    return 1.0 / math.sqrt(dims[-2]) if len(dims) >= 2 and dims[-2] >= 64 else 1.0


def check_inputs(graph: KernelGraph, seed: int) -> list[np.ndarray]:
    """Fresh float32 inputs for the numeric check: N(0, 1) times :func:`check_scale`."""
    out = []
    jobs: list[tuple[np.ndarray, np.random.SeedSequence]] = []
    for i, t in enumerate(graph.inputs):
        dims = t.dims
        x = np.empty(dims, dtype=np.float32)
        flat = x.reshape(-1)
        starts = range(0, flat.size, _CHECK_CHUNK)
        seeds = np.random.SeedSequence([seed, i]).spawn(len(starts))
        jobs += [(flat[a : a + _CHECK_CHUNK], sq) for a, sq in zip(starts, seeds, strict=True)]
        out.append(x)

    def fill(job: tuple[np.ndarray, np.random.SeedSequence]) -> None:
        np.random.default_rng(job[1]).standard_normal(out=job[0], dtype=np.float32)

    if sum(job[0].size for job in jobs) > _CHECK_CHUNK:
        with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1, 32)) as pool:
            list(pool.map(fill, jobs))
    else:
        for job in jobs:
            fill(job)
    for x in out:
        scale = check_scale(x.shape)
        if scale != 1.0:
            x *= np.float32(scale)
    return out


def check_input_generator(backend: Backend) -> str:
    """Names the generator of the check inputs on ``backend``: the backend's own device
    generator where it has one (:meth:`Backend.check_input_generator`), else numpy's. A stored
    reference is only reused with the same generator."""
    return backend.check_input_generator() or f"numpy-{CHECK_INPUTS_VERSION}"


def _drawn_on_device(backend: Backend, graph: KernelGraph, seed: int) -> list[Any]:
    """The check inputs drawn by the backend on its device: input i from its own seed (a
    function of ``seed`` and i), in the graph's shapes and dtypes."""
    specs = []
    for i, t in enumerate(graph.inputs):
        child = int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint64)[0] >> 1)
        specs.append((tuple(t.dims), t.dtype.name, check_scale(t.dims), child))
    return list(backend.draw_check_inputs(specs))


def to_backend_tensors(
    backend: Backend, arrays: Sequence[np.ndarray], dtypes: Sequence[str]
) -> list[Any]:
    """Put float32 numpy arrays on the backend's device in the graph's dtypes."""
    return list(backend.from_numpy(arrays, dtypes))


def rel_frobenius(actual: Any, expected: Any) -> float:
    """‖actual - expected‖ / ‖expected‖ (absolute when the reference is 0); NaN/inf → inf.
    Compared on the device where ``expected`` is a torch tensor (``yirage._compare_torch``),
    else with numpy (``actual`` copied to the host in float64)."""
    if _compare_torch.is_torch_tensor(expected):
        return _compare_torch.rel_frobenius(actual, expected)
    if not (isinstance(actual, np.ndarray) and actual.dtype == np.float64):
        actual = to_numpy64(actual)
    if actual.shape != expected.shape:
        return math.inf
    if not np.isfinite(actual).all() or not np.isfinite(expected).all():
        return math.inf
    denom = float(np.linalg.norm(expected))
    err = float(np.linalg.norm(actual - expected))
    return err / denom if denom > 0 else err


def tolerance_for(graph: KernelGraph) -> float:
    """The tolerance of ``graph``'s check: the loosest of its outputs' dtypes."""
    return max(TOLERANCES[t.dtype.name] for t in graph.outputs)


def check_failure(err: float, tol: float) -> str | None:
    """None when a worst relative error ``err`` passes ``tol``, else why the check failed
    (NaN never passes)."""
    if err <= tol:
        return None
    if not math.isfinite(err):
        return "numeric check failed: non-finite output"
    return f"numeric check failed: max relative error {err:.3g} > {tol:g}"


def _worst_error(outs: Sequence[Any], reference: Sequence[np.ndarray]) -> float:
    if len(outs) != len(reference):
        raise NumericCheckError(
            f"the kernel returned {len(outs)} outputs, the graph has {len(reference)}"
        )
    return max(rel_frobenius(o, r) for o, r in zip(outs, reference, strict=True))


def check_arrays(graph: KernelGraph, shapes: Shapes, seed: int) -> list[Any]:
    """Fresh check inputs (:func:`check_inputs`) as numpy arrays in the kernel's shapes; for
    ``world_size`` N > 1 one such list per rank (rank r drawn from ``seed + r``)."""
    if shapes.world_size == 1:
        return shapes.to_kernel(check_inputs(graph, seed))
    return [shapes.to_kernel(check_inputs(graph, seed + r)) for r in range(shapes.world_size)]


def arrays_to_backend(
    backend: Backend, graph: KernelGraph, shapes: Shapes, arrays: list[Any]
) -> list[Any]:
    """:func:`check_arrays`' result as the backend's tensors (on the calling thread's
    device)."""
    dtypes = [t.dtype.name for t in graph.inputs]
    if shapes.world_size == 1:
        return to_backend_tensors(backend, arrays, dtypes)
    return [to_backend_tensors(backend, rank, dtypes) for rank in arrays]


def check_tensors(backend: Backend, graph: KernelGraph, shapes: Shapes, seed: int) -> list[Any]:
    """Fresh check inputs on the backend, in the kernel's shapes (per rank when
    ``world_size`` > 1, rank r from ``seed + r``): drawn on the device where the backend can
    (:meth:`Backend.draw_check_inputs`), else :func:`check_arrays` copied over."""
    if backend.check_input_generator() is None:
        return arrays_to_backend(backend, graph, shapes, check_arrays(graph, shapes, seed))
    ranks = [
        shapes.to_kernel(_drawn_on_device(backend, graph, seed + r))
        for r in range(shapes.world_size)
    ]
    return ranks[0] if shapes.world_size == 1 else ranks


def reference_outputs(
    graph: KernelGraph, shapes: Shapes, tensors: Sequence[Any], device: Any = None
) -> list[Any]:
    """The float64 reference evaluator's outputs (numpy arrays), in the kernel's shapes, for
    ``tensors`` (as :func:`check_tensors` returns them: per rank when ``world_size`` > 1).

    A single-device graph whose ``tensors`` are torch tensors on a GPU (or any inputs, given
    that GPU as ``device``) is evaluated there with torch (``yirage._reference_torch``: the
    core's formulas, op for op); graphs it does not mirror, a device out of memory, CPU
    tensors and multi-device graphs run the core evaluator (``KernelGraph.evaluate``)."""
    ws = shapes.world_size
    if ws == 1:
        outs = _on_device(graph, shapes, tensors, device)
        if outs is None:
            arrays = [
                to_numpy64(t).reshape(u) for t, u in zip(tensors, shapes.user_in, strict=True)
            ]
            outs = graph.evaluate(arrays)
        return [r.reshape(k) for r, k in zip(outs, shapes.kernel_out, strict=True)]
    stacked = [
        np.stack([to_numpy64(rank[i]).reshape(u) for rank in tensors])
        for i, u in enumerate(shapes.user_in)
    ]
    outs = graph.evaluate(stacked)
    return [
        [o[r].reshape(k) for o, k in zip(outs, shapes.kernel_out, strict=True)] for r in range(ws)
    ]


def _on_device(
    graph: KernelGraph, shapes: Shapes, tensors: Sequence[Any], device: Any
) -> list[np.ndarray] | None:
    """The reference outputs (the graph's shapes) evaluated with torch on ``device`` (default:
    that of ``tensors`` where it is a GPU); None where there is none or it refuses."""
    if device is None:
        device = _reference_torch.device_of(tensors)
    if device is None:
        return None
    users = [t.reshape(u) for t, u in zip(tensors, shapes.user_in, strict=True)]
    return _reference_torch.evaluate_numpy(graph, users, device)


def run_check(
    shapes: Shapes,
    run: Callable[..., Sequence[Any]],
    tensors: Sequence[Any],
    reference: Sequence[Any],
) -> float:
    """Worst relative error of ``run`` (a launcher of the kernel's shapes) against the
    reference; a multi-device kernel runs every rank in this process (one thread per rank,
    all_reduce through ``yirage._collectives.SimulatedGroup``)."""
    if shapes.world_size == 1:
        return _worst_error(run(*tensors), reference)
    outs = _collectives.run_ranks(lambda r: list(run(*tensors[r])), shapes.world_size)
    return max(_worst_error(o, ref) for o, ref in zip(outs, reference, strict=True))
