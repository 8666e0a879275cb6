"""Roofline of a workload from on-the-spot measurements of the device.

roofline_us = max(min_bytes / copy_bw, flops / matmul_rate), where

- ``min_bytes`` is the unfused minimum traffic: every graph input read once and every graph
  output written once, at the element size of the benchmarked dtype;
- ``flops`` counts the kernel-level matmul operators, 2·batch·m·k·n each (element-wise ops,
  norms and softmax are not counted: they are negligible next to the matmuls at these shapes
  and are not executed at the matmul rate anyway);
- ``copy_bw`` is measured by a large device copy, counting bytes read + bytes written (on the
  CPU the better of torch's and numpy's copy);
- ``matmul_rate`` is measured by a large matmul (fp16 and bf16 on GPUs, the better of the two;
  fp32 on the CPU, the better of torch and numpy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yirage._bench import _timing

if TYPE_CHECKING:
    from yirage._graph import KernelGraph

__all__ = [
    "DeviceRates",
    "graph_flops",
    "graph_min_bytes",
    "measure_copy_bandwidth",
    "measure_matmul_rate",
    "measure_rates",
    "roofline_us",
]


def _numel(dims: Iterable[int]) -> int:
    return math.prod(int(d) for d in dims)


def min_bytes(
    input_dims: Sequence[Sequence[int]], output_dims: Sequence[Sequence[int]], elem_bytes: int
) -> int:
    """Each input read once and each output written once."""
    return elem_bytes * (sum(_numel(d) for d in input_dims) + sum(_numel(d) for d in output_dims))


def graph_min_bytes(g: KernelGraph, elem_bytes: int) -> int:
    """:func:`min_bytes` of a kernel graph's inputs and outputs."""
    return min_bytes([t.dims for t in g.inputs], [t.dims for t in g.outputs], elem_bytes)


def graph_flops(g: KernelGraph) -> int:
    """2·batch·m·k·n summed over the graph's kernel-level matmul operators."""
    from yirage._graph import DTensor

    total = 0
    for op in json.loads(g.to_json())["ops"]:
        if op.get("op") != "matmul":
            continue
        a = DTensor(g, int(op["a"])).dims
        b = DTensor(g, int(op["b"])).dims
        batch = max(_numel(a[:-2]), _numel(b[:-2]))
        total += 2 * batch * a[-2] * a[-1] * b[-1]
    return total


def roofline_us(nbytes: float, flops: float, copy_bw_Bps: float, matmul_flops: float) -> float:
    """max(bytes / copy bandwidth, flops / matmul rate), in microseconds."""
    if copy_bw_Bps <= 0 or matmul_flops <= 0:
        raise ValueError("the copy bandwidth and the matmul rate must be positive")
    return max(nbytes / copy_bw_Bps, flops / matmul_flops) * 1e6


@dataclass(frozen=True)
class DeviceRates:
    """Measured copy bandwidth (bytes/s, read + written) and matmul rate (flop/s)."""

    copy_bw_Bps: float
    matmul_flops: float
    detail: dict[str, Any]


def _sync(device: str) -> None:
    if device == "cuda":
        _timing._torch().cuda.synchronize()


def _median_us(fn: Any, device: str, *, repeats: int) -> _timing.Timing:
    if device == "cuda":
        return _timing.cuda_events_median(fn, warmup=3, repeats=repeats, flush_l2=False)
    return _timing.wall_median(fn, warmup=2, min_repeats=repeats, min_time_s=0.5)


def measure_copy_bandwidth(device: str, nbytes: int | None = None) -> tuple[float, dict[str, Any]]:
    """Bytes read + written per second of a copy of a large buffer: ``dst.copy_(src)``; on
    the CPU also ``numpy.copyto`` (torch's CPU copy reaches about half of it), the better
    of the two."""
    torch = _timing._torch()
    if nbytes is None:
        if device == "cuda":
            l2 = _timing.l2_flush_bytes() // 2
            nbytes = max(1 << 30, 16 * l2)
        else:
            nbytes = 256 << 20
    n = nbytes // 4
    moved = 2 * n * 4
    src = torch.rand(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    _sync(device)
    t = _median_us(lambda: dst.copy_(src), device, repeats=20)
    detail: dict[str, Any] = {"copy_bytes": n * 4, "torch_copy_us": t.median_us}
    best = t.median_us
    if device == "cpu":
        import numpy as np

        a, b = src.numpy(), dst.numpy()
        tn = _median_us(lambda: np.copyto(b, a), device, repeats=20)
        detail["numpy_copy_us"] = tn.median_us
        best = min(best, tn.median_us)
    detail["method"] = t.method
    return moved / (best * 1e-6), detail


def measure_matmul_rate(
    device: str, dtype: str, n: int | None = None
) -> tuple[float, dict[str, Any]]:
    """flop/s of an n x n x n matmul (``dtype`` "float16", "bfloat16" or "float32"); on the
    CPU the better of torch and numpy."""
    torch = _timing._torch()
    if n is None:
        n = 8192 if device == "cuda" else 2048
    tdtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=device).to(tdtype)
    b = torch.randn(n, n, device=device).to(tdtype)
    c = torch.empty(n, n, device=device, dtype=tdtype)
    _sync(device)
    repeats = 20 if device == "cuda" else 5
    t = _median_us(lambda: torch.matmul(a, b, out=c), device, repeats=repeats)
    detail: dict[str, Any] = {"n": n, "dtype": dtype, "torch_us": t.median_us}
    best = t.median_us
    if device == "cpu" and dtype == "float32":
        import numpy as np

        na, nb, nc = a.numpy(), b.numpy(), c.numpy()
        tn = _median_us(lambda: np.matmul(na, nb, out=nc), device, repeats=repeats)
        detail["numpy_us"] = tn.median_us
        best = min(best, tn.median_us)
    detail["method"] = t.method
    return 2.0 * n**3 / (best * 1e-6), detail


def measure_rates(device: str) -> DeviceRates:
    """Copy bandwidth and the best matmul rate of ``device`` ("cpu" or "cuda")."""
    bw, copy_detail = measure_copy_bandwidth(device)
    dtypes = ("float16", "bfloat16") if device == "cuda" else ("float32",)
    rates: dict[str, Any] = {}
    for dt in dtypes:
        rate, mm_detail = measure_matmul_rate(device, dt)
        rates[dt] = {"TFLOPs": rate / 1e12, **mm_detail}
    best = max(r["TFLOPs"] for r in rates.values()) * 1e12
    return DeviceRates(bw, best, {"copy": copy_detail, "matmul": rates})
