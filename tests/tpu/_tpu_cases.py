"""Shared pieces of the TPU tests: the five bench workloads at CI size, their search with
the TPU v5e DeviceSpec (once per workload and dtype per session), the interpret-mode
backend, and the float64 comparison."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from functools import cache
from typing import Any

import numpy as np
import pytest

# a private cache so these runs never share printed modules or search entries with others
os.environ.setdefault("YIRAGE_CACHE_DIR", tempfile.mkdtemp(prefix="yirage-tpu-tests-"))

#: Small shapes of each bench workload family (yirage._workloads builders), legal for the
#: TPU tiling rule with whole dims where a dim is under 128.
SMALL: dict[str, dict[str, Any]] = {
    "rmsnorm_linear": {"b": 4, "h": 256, "n": 384},
    "gated_mlp": {"b": 4, "h": 256, "n": 256},
    "lora": {"b": 4, "h": 256, "n": 256, "r": 16},
    "gqa_decode": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
    "qknorm_gqa": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
}
#: float32 and the TPU's 16-bit type.
DTYPES = ("float32", "bfloat16")
#: Relative Frobenius error against the float64 reference of the rounded inputs (bf16
#: outputs are rounded to 8 bits of mantissa: 2^-8 ≈ 3.9e-3 per element at worst).
TOL = {"float32": 1e-4, "bfloat16": 1e-2}


def have_jax() -> bool:
    return importlib.util.find_spec("jax") is not None


needs_jax = pytest.mark.skipif(not have_jax(), reason="jax not installed: pip install yirage[tpu]")


def interpret_backend() -> Any:
    from yirage_tpu import TpuBackend

    return TpuBackend(interpret=True)


def small_graph(name: str, dtype: str) -> Any:
    import yirage as yr
    from yirage._workloads import get_workload

    return get_workload(name)._build(SMALL[name], getattr(yr, dtype))


@cache
def candidates(name: str, dtype: str) -> tuple[Any, list[Any]]:
    """(graph, every candidate the search returns with the TPU v5e spec, baseline included)."""
    import yirage as yr

    graph = small_graph(name, dtype)
    result = yr.search(
        graph, backend=interpret_backend(), time_limit=60, top_k=6, deterministic=True
    )
    return graph, list(result.candidates)


def inputs_and_reference(graph: Any, seed: int = 11) -> tuple[list[Any], list[np.ndarray]]:
    """jax inputs in the graph's dtypes and the float64 reference of their rounded values."""
    be = interpret_backend()
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(t.dims).astype(np.float32) for t in graph.inputs]
    xs = be.from_numpy(arrays, [t.dtype.name for t in graph.inputs])
    ref = graph.evaluate([np.asarray(x, dtype=np.float64) for x in xs])
    return xs, [np.asarray(r) for r in ref]


def rel(a: Any, b: np.ndarray) -> float:
    x = np.asarray(a, dtype=np.float64)
    if x.shape != b.shape or not np.isfinite(x).all():
        return float("inf")
    return float(np.linalg.norm(x - b) / max(float(np.linalg.norm(b)), 1e-30))
