"""The bench workloads at CI size and their search candidates per AMD target, shared by the
ROCm tests (searched once per session with each target's DeviceSpec)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np
import pytest

#: small shapes of each workload family (yirage._workloads builders), as tests/cuda uses them
SMALL: dict[str, dict[str, Any]] = {
    "rmsnorm_linear": {"b": 4, "h": 256, "n": 384},
    "gated_mlp": {"b": 4, "h": 256, "n": 256},
    "lora": {"b": 4, "h": 256, "n": 256, "r": 16},
    "gqa_decode": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
    "qknorm_gqa": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
}
#: the table entry each AMD ahead-of-time target is searched for
TARGET_DEVICE = {"gfx942": "MI300X", "gfx90a": "MI250X", "gfx1100": "RX7900XTX"}
TOP_K = 6
#: "<target> <workload> <candidate> <kernel>: resources" lines, listed at the end of the run
RESOURCES: list[str] = []


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def skip_without_triton() -> None:
    if not (have("triton") and have("torch")):
        pytest.skip("torch and triton are not installed (pip install torch triton)")


def small_graph(name: str, dtype: str) -> Any:
    import yirage as yr
    from yirage._workloads import get_workload

    return get_workload(name)._build(SMALL[name], getattr(yr, dtype))


@functools.cache
def candidates(name: str, dtype: str, device: str = "MI300X") -> tuple[Any, list[Any]]:
    """(graph, candidates) of a deterministic search for the named AMD table device."""
    import yirage as yr
    from yirage._workloads import get_workload
    from yirage_rocm import _device_spec

    graph = small_graph(name, dtype)
    spec = _device_spec.KNOWN_DEVICES[device]
    result = yr.search(
        graph,
        backend="rocm",
        config=get_workload(name).search_config,
        device_spec=spec,
        time_limit=60,
        top_k=TOP_K,
        deterministic=True,
    )
    return graph, list(result.candidates)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
