"""The Ascend tests' shared cases: the five bench workloads at CI size (the cuda tests'
shapes), every search candidate for the Ascend spec run through the backend against the
float64 reference."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SMALL: dict[str, dict[str, Any]] = {
    "rmsnorm_linear": {"b": 4, "h": 256, "n": 384},
    "gated_mlp": {"b": 4, "h": 256, "n": 256},
    "lora": {"b": 4, "h": 256, "n": 256, "r": 16},
    "gqa_decode": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
    "qknorm_gqa": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
}
TOL = {"float32": 1e-4, "float16": 1e-2}


def triton_label() -> str:
    """Which Triton ran: "triton-ascend 3.2.0" or "triton 3.9.0" (both install ``triton``)."""
    import importlib.metadata

    spec = importlib.util.find_spec("triton")
    roots = spec.submodule_search_locations or [] if spec else []
    ascend = any((Path(r) / "backends" / "ascend").is_dir() for r in roots)
    dist = "triton-ascend" if ascend else "triton"
    return f"{dist} {importlib.metadata.version(dist)}"


def rel(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@dataclass
class Ran:
    candidates: int
    kernels: int
    max_ub_bytes: int
    plans: list[Any]

    def __str__(self) -> str:
        return (
            f"{self.candidates} candidates, {self.kernels} generated kernels ran, "
            f"largest UB footprint {self.max_ub_bytes} B"
        )


def run_candidates(backend: Any, name: str, dtype: str) -> Ran:
    """Search ``name`` at CI size for ``backend``; print, check and run every candidate
    against the float64 reference. AssertionError on a mismatch."""
    import yirage as yr
    from yirage._kernel import check_inputs, to_numpy64
    from yirage._workloads import get_workload

    graph = get_workload(name)._build(SMALL[name], getattr(yr, dtype))
    result = yr.search(graph, backend=backend, time_limit=60, top_k=6, deterministic=True)
    arrays = check_inputs(graph, seed=11)
    tensors = backend.from_numpy(arrays, [t.dtype.name for t in graph.inputs])
    reference = graph.evaluate([to_numpy64(t) for t in tensors])
    kernels, ub, plans = 0, 0, []
    for cand in result.candidates:
        plans.append(cand.kernel_plan())
        printed = backend.codegen(plans[-1])
        kernels += len(printed.plan.generated)
        ub = max([ub, *(f.ub_bytes for f in printed.footprints)])
        kernel = backend.load(backend.compile(printed))
        for variant, launcher in backend.variants(kernel).items():
            outs = launcher(*tensors)
            for o, r in zip(outs, reference, strict=True):
                err = rel(to_numpy64(o), np.asarray(r))
                assert err <= TOL[dtype], (name, dtype, cand.label, variant, err)
    return Ran(len(result.candidates), kernels, ub, plans)


def run_fixture(backend: Any, case: Any, seed: int = 0) -> tuple[list[np.ndarray], list[Any]]:
    """A fixture plan (tests/cuda/plans.py) through codegen, compile, load and one run."""
    kernel = backend.load(backend.compile(backend.codegen(case.plan)))
    xs = case.random_inputs(seed)
    tensors = backend.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    outs = kernel(*tensors)
    return [o.double().numpy() for o in outs], [t.double().numpy() for t in tensors]
