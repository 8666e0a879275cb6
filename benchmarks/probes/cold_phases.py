"""Where a cold ``superoptimize`` spends its time on the cuda backend: the report's phases,
the backend's codegen / compile / load / precompile / profile calls, and the span of every
Triton compile in the precompile thread pool (which kernel bounds the wall time), and within
profiling the time in eager timed launches, graph capture, graph replays and input drawing.

    python benchmarks/probes/cold_phases.py qknorm_gqa:gpu gqa_decode:gpu_kv16384

Needs a CUDA GPU, torch and triton; runs without the decision cache.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import triton
import triton.compiler

import yirage as yr
from yirage._workloads import get_workload
from yirage_cuda import _backend, _runtime

_spans: list[tuple[float, float, str, str]] = []
_calls: dict[str, list[float]] = {}


def _wrap_compile() -> None:
    """Time every ``triton.compile`` (the JIT imports it from ``triton.compiler``)."""
    original = triton.compiler.compile

    def timed(src: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(src, *args, **kwargs)
        finally:
            name = getattr(getattr(src, "fn", None), "__name__", "?")
            _spans.append((t0, time.perf_counter(), name, threading.current_thread().name))

    triton.compiler.compile = timed


def _wrap_backend() -> None:
    """Time the backend's steps and, inside profile, the eager timed launches, graph capture,
    graph replays and fresh input sets (a function's time is recorded under its label)."""
    backend = [(_backend.CudaBackend, n, n) for n in ("codegen", "compile", "load")]
    backend += [(_backend.CudaBackend, n, n) for n in ("precompile", "profile")]
    backend += [(_backend.CudaBackend, n, n) for n in ("_contenders", "_checked")]
    for owner, name, label in (
        *backend,
        (_runtime, "_launch_times", "launches"),
        (_runtime.GraphTimer, "__init__", "capture"),
        (_runtime.GraphTimer, "times", "replays"),
        (_runtime, "_fresh_like", "fresh sets"),
    ):
        fn = getattr(owner, name)

        def timed(*args: Any, _f: Any = fn, _n: str = label, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _f(*args, **kw)
            finally:
                _calls.setdefault(_n, []).append(time.perf_counter() - t0)

        setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="workload:preset, e.g. gqa_decode:gpu_kv16384")
    args = ap.parse_args()
    _wrap_compile()
    _wrap_backend()
    for case in args.cases:
        name, preset = case.split(":")
        _spans.clear()
        _calls.clear()
        w = get_workload(name)
        k = yr.superoptimize(w.graph(preset), backend="cuda", config=w.search_config, cache=False)
        r = k.report
        print(
            f"== {case}: total {r.total_s:.2f} s, search {r.search_s:.2f}, codegen+compile "
            f"{r.codegen_compile_s:.2f}, check {r.check_s:.2f}, profile {r.profile_s:.2f}"
        )
        sr = r.search or {}
        if "enumerate_s" in sr:
            print(
                f"   search: enumerate {sr['enumerate_s']:.2f} s, verify {sr['verify_s']:.2f} s "
                f"({sr.get('fingerprint_tests')} fingerprint tests, {sr.get('rejected')} rejected)"
            )
        for call, times in _calls.items():
            print(
                f"   {call:10s} x{len(times):2d}  sum {sum(times):6.2f} s  max {max(times):5.2f} s"
            )
        if _spans:
            s0 = min(s[0] for s in _spans)
            print(f"   {len(_spans)} Triton compiles over {max(s[1] for s in _spans) - s0:.2f} s")
            for a, b, kernel, thread in sorted(_spans):
                print(f"     {a - s0:5.2f}..{b - s0:5.2f} ({b - a:4.2f} s) {kernel} [{thread}]")


if __name__ == "__main__":
    main()
