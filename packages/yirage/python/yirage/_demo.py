"""``yirage demo``: superoptimize the bundled RMSNorm + Linear example (or any bench
workload, or all of them) on the best available backend and compare it with PyTorch eager
(numpy when torch is not installed).

The CPU backend runs the workloads' ``"cpu"`` preset (float32, reduced sizes), every other
backend the ``"gpu"`` preset (float16, the full decode sizes). Times are medians from the
backend's own profiler, yirage and the baseline measured alternately on the same inputs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from yirage._backend import Backend
from yirage._check import to_numpy64
from yirage._errors import ConfigError

__all__ = ["run_demo"]

DEFAULT_WORKLOAD = "rmsnorm_linear"


def _baseline(name: str, preset: str, device: str) -> tuple[str, Callable[..., Any], list[Any]]:
    """(name, function, inputs) of the eager baseline: torch if importable, else numpy."""
    from yirage._workloads import get_workload

    w = get_workload(name)
    try:
        import torch  # noqa: F401
    except ImportError:
        if name != DEFAULT_WORKLOAD:
            raise ConfigError(f"the {name} demo compares with PyTorch: pip install torch") from None
        eps = 1e-6

        def numpy_ref(x: np.ndarray, wt: np.ndarray) -> list[np.ndarray]:
            return [(x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)) @ wt]

        return "numpy", numpy_ref, w.inputs(preset, seed=0, numpy=True)
    return "PyTorch eager", w.reference, w.inputs(preset, seed=0, device=device)


def _time(be: Backend, fn: Callable[..., Any], inputs: Sequence[Any]) -> float:
    result = be.profile(fn, list(inputs))
    return float(getattr(result, "median_us", result))


def _one(be: Backend, name: str, rounds: int, search_options: dict[str, Any]) -> dict[str, Any]:
    from yirage._superoptimize import superoptimize
    from yirage._workloads import get_workload

    preset = "cpu" if be.name == "cpu" else "gpu"
    w = get_workload(name)
    g = w.graph(preset)
    t0 = time.perf_counter()
    options = dict(search_options)
    if w.search_config is not None:
        options.setdefault("config", w.search_config)
    kernel = superoptimize(g, backend=be, **options)
    wall = time.perf_counter() - t0
    rep = kernel.report
    device = be.torch_device or "cpu"
    base_name, base_fn, inputs = _baseline(name, preset, device)
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):  # alternate, so both see the same machine state
        ours.append(_time(be, kernel, inputs))
        theirs.append(_time(be, base_fn, inputs))
    yirage_us, base_us = float(np.median(ours)), float(np.median(theirs))
    yirage_best, base_best = float(min(ours)), float(min(theirs))
    outs = kernel(*inputs)
    refs = g.evaluate([to_numpy64(x) for x in inputs])
    err = max(
        float(np.linalg.norm(to_numpy64(o) - r) / max(np.linalg.norm(r), 1e-300))
        for o, r in zip(outs, refs, strict=True)
    )
    shape = " x ".join(str(list(t.dims)) for t in g.inputs)
    return {
        "workload": name,
        "shapes": f"{shape} {w.dtype(preset).name}",
        "backend": be.name,
        "device": rep.device,
        "candidate": rep.chosen_description,
        "library_baseline_won": rep.chosen_is_library_baseline,
        "search_s": rep.search_s,
        "codegen_compile_s": rep.codegen_compile_s,
        "superoptimize_s": wall,
        "from_cache": rep.from_cache,
        "yirage_us": yirage_us,
        "baseline": base_name,
        "baseline_us": base_us,
        "speedup": base_us / yirage_us if yirage_us > 0 else float("nan"),
        "yirage_best_us": yirage_best,
        "baseline_best_us": base_best,
        "rounds": rounds,
        "max_rel_err": err,
        "toolchain": rep.toolchain,
    }


def run_demo(
    backend: str | None = None,
    *,
    workload: str = DEFAULT_WORKLOAD,
    json_output: bool = False,
    rounds: int = 3,
    **search_options: Any,
) -> list[dict[str, Any]]:
    """Run the demo for ``workload`` (a name or ``"all"``) and print a table (or JSON)."""
    from yirage._registry import resolve_backend
    from yirage._workloads import workload_names

    be = resolve_backend(backend)
    names = workload_names() if workload == "all" else [workload]
    rows = [_one(be, n, rounds, search_options) for n in names]
    if json_output:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return rows
    first = rows[0]
    print(f"yirage demo on {first['backend']} ({first['device']})")
    tc = first["toolchain"]
    if tc:
        print("toolchain: " + ", ".join(f"{k}: {v}" for k, v in tc.items()))
    head = (
        f"{'workload':<16} {'search s':>8} {'compile s':>9} {'total s':>8} "
        f"{'yirage µs':>10} {first['baseline'] + ' µs':>17} {'speedup':>8} {'max rel err':>11}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        cached = "*" if r["from_cache"] else " "
        print(
            f"{r['workload']:<16} {r['search_s']:>8.2f} {r['codegen_compile_s']:>9.2f} "
            f"{r['superoptimize_s']:>7.2f}{cached} {r['yirage_us']:>10.1f} "
            f"{r['baseline_us']:>17.1f} {r['speedup']:>7.2f}x {r['max_rel_err']:>11.1e}"
        )
    for r in rows:
        print(
            f"  {r['workload']}: {r['shapes']}; best of {r['rounds']} rounds: yirage "
            f"{r['yirage_best_us']:.1f} µs, {r['baseline']} {r['baseline_best_us']:.1f} µs; "
            f"chosen: {r['candidate']}"
        )
    if any(r["from_cache"] for r in rows):
        print("  * decision from the disk cache (search and profiling skipped)")
    return rows
