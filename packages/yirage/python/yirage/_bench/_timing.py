"""Timing utilities of the benchmark harness: medians only, every method named.

Three methods, one per kind of measurement:

- :func:`wall_median` (CPU): warm-up calls, then ``perf_counter_ns`` around each call until at
  least ``min_repeats`` calls *and* ``min_time_s`` seconds were measured (capped by
  ``max_repeats``); the median of the per-call times.
- :func:`cuda_events_median` (GPU, "events"): one CUDA event pair around each call, with an
  L2-sized buffer (at least 2x L2) zeroed before every call so each call starts with a cold L2; the
  median of the per-call times. Includes launch overhead.
- :func:`cuda_graph_median` (GPU, "cudagraph"): ``launches`` calls captured into one CUDA graph
  (after warm-up on a side stream, as torch requires), the graph replayed ``replays`` times with
  an event pair around each replay; the median replay time divided by ``launches``. Launch
  overhead is excluded; L2 is not flushed between the launches of one replay.

torch is imported lazily so ``import yirage`` never needs it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Timing",
    "cuda_events_median",
    "cuda_graph_median",
    "l2_flush_bytes",
    "wall_median",
]


def _torch() -> Any:
    """torch, imported on first use (typed as Any: its stubs are optional here)."""
    import torch

    return torch


Method = Literal["wall", "events", "cudagraph"]


@dataclass(frozen=True)
class Timing:
    """A median over ``len(samples_us)`` measurements, in microseconds."""

    method: Method
    median_us: float
    samples_us: tuple[float, ...] = field(repr=False)
    #: calls per sample (``launches`` for CUDA-graph replay, else 1)
    calls_per_sample: int = 1

    @property
    def repeats(self) -> int:
        return len(self.samples_us)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    def quantile_us(self, q: float) -> float:
        """The q-quantile of the samples (linear interpolation)."""
        s = sorted(self.samples_us)
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def spread(self) -> float:
        """Third quartile / first quartile of the samples (1.0 = perfectly steady)."""
        q1 = self.quantile_us(0.25)
        return self.quantile_us(0.75) / q1 if q1 > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "median_us": self.median_us,
            "min_us": self.min_us,
            "q1_us": self.quantile_us(0.25),
            "q3_us": self.quantile_us(0.75),
            "repeats": self.repeats,
            "calls_per_sample": self.calls_per_sample,
        }


def _check(fn: object, **counts: float) -> None:
    if not callable(fn):
        raise TypeError(f"expected a callable, got {type(fn).__name__}")
    for name, value in counts.items():
        if value < 0:
            raise ValueError(f"{name} must be ≥ 0, got {value}")


def wall_median(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    min_repeats: int = 10,
    min_time_s: float = 0.25,
    max_repeats: int = 100_000,
) -> Timing:
    """Median wall-clock time of ``fn()`` (CPU work; the call must be synchronous)."""
    _check(fn, warmup=warmup, min_repeats=min_repeats, min_time_s=min_time_s)
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError("need 1 ≤ min_repeats ≤ max_repeats")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    clock = time.perf_counter_ns
    budget_ns = int(min_time_s * 1e9)
    spent = 0
    while len(samples) < max_repeats and (len(samples) < min_repeats or spent < budget_ns):
        t0 = clock()
        fn()
        dt = clock() - t0
        spent += dt
        samples.append(dt / 1e3)
    return Timing("wall", statistics.median(samples), tuple(samples))


def l2_flush_bytes(device: Any = None) -> int:
    """Size of the L2-flush buffer: 2x the device's L2 (at least 64 MiB when unknown)."""
    torch = _torch()
    props = torch.cuda.get_device_properties(device if device is not None else 0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return max(2 * l2, 64 * 2**20)


def cuda_events_median(
    fn: Callable[[], object],
    *,
    warmup: int = 10,
    repeats: int = 100,
    flush_l2: bool = True,
    device: Any = None,
) -> Timing:
    """Median CUDA-event time of ``fn()`` on the current stream, L2 flushed before each call."""
    torch = _torch()
    _check(fn, warmup=warmup, repeats=repeats)
    if repeats < 1:
        raise ValueError("repeats must be ≥ 1")
    flush = (
        torch.empty(l2_flush_bytes(device) // 4, dtype=torch.float32, device="cuda")
        if flush_l2
        else None
    )
    torch.cuda.synchronize()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    samples = tuple(float(s.elapsed_time(e)) * 1e3 for s, e in zip(starts, ends, strict=True))
    del flush
    return Timing("events", statistics.median(samples), samples)


def cuda_graph_median(
    fn: Callable[[], object],
    *,
    launches: int = 20,
    replays: int = 50,
    warmup: int = 3,
) -> Timing:
    """Median time of one ``fn()`` by CUDA-graph replay: ``launches`` calls are captured into
    one graph, each replay is timed with events, and the median replay time is divided by
    ``launches``. ``fn`` must be capturable (no host synchronisation, no CPU-side reads of
    device data, no allocation outside torch's caching allocator); otherwise capture raises
    and the caller falls back to :func:`cuda_events_median`."""
    torch = _torch()
    _check(fn, launches=launches, replays=replays, warmup=warmup)
    if launches < 1 or replays < 1:
        raise ValueError("launches and replays must be ≥ 1")
    torch.cuda.synchronize()
    # Warm-up on a side stream (lazy initialisation, autotuning, allocator pools), as torch
    # requires before capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captures on its own side stream
        for _ in range(launches):
            fn()
    torch.cuda.synchronize()
    for _ in range(max(warmup, 1)):
        graph.replay()
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = tuple(
        float(s.elapsed_time(e)) * 1e3 / launches for s, e in zip(starts, ends, strict=True)
    )
    del graph
    return Timing("cudagraph", statistics.median(samples), samples, calls_per_sample=launches)
