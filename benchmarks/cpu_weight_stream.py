"""How close the CPU kernels of the model-size cases come to streaming their weights at the
machine's read bandwidth, side by side in one process.

For each case (``rmsnorm_linear``, ``gated_mlp``, ``lora``, ``gqa_decode`` at the ``model`` and
``model_bf16`` presets) the kernel ``superoptimize`` chooses is printed with and without the
matmul's software prefetch of its streamed B rows (``yirage_cpu._codegen.STREAM_PREFETCH``)
and, where the host has AVX512-BF16 and the plan has bfloat16 dot products, once more for a
target without it (the bfloat16 weights widened and multiplied by float FMAs), and timed
interleaved with PyTorch eager and with a plain read of the case's weight bytes (a C/OpenMP sum
over 1 and 2 threads, compiled with the backend's flags); each rate is also given as a share of
the copy bandwidth the bench's roofline uses (measured once at the start). Every call of a
round runs once per contestant; medians over ``--rounds`` rounds are printed in microseconds
with the weight bytes per second they mean. Thread counts are fixed (``--threads``, default 2:
the kernels through ``YIRAGE_CPU_THREADS``, torch through ``torch.set_num_threads``) so the
contestants share the machine alike. Run from the repository root, e.g.::

    python benchmarks/cpu_weight_stream.py --rounds 31 --cases rmsnorm_linear
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

READ_C = r"""
#include <string.h>
#include <omp.h>
typedef float yr_v16 __attribute__((vector_size(64)));
/* Sum of n floats (n a multiple of 64) on nt threads, each a contiguous share, four
 * independent vector accumulators: a plain read stream. */
float yr_read_sum(const float *p, long n, int nt) {
    float total = 0.0f;
#pragma omp parallel num_threads(nt) reduction(+:total)
    {
        yr_v16 a = {0}, b = {0}, c = {0}, d = {0}, x;
#pragma omp for schedule(static)
        for (long i = 0; i < n; i += 64) {
            memcpy(&x, p + i, 64); a += x;
            memcpy(&x, p + i + 16, 64); b += x;
            memcpy(&x, p + i + 32, 64); c += x;
            memcpy(&x, p + i + 48, 64); d += x;
        }
        a += b + c + d;
        for (int j = 0; j < 16; ++j) total += a[j];
    }
    return total;
}
"""


def _read_stream() -> Callable[[Any, int], float]:
    """``read(tensor, threads)``: a timed read of the tensor's bytes (built once)."""
    from yirage_cpu import _toolchain

    lib = _toolchain.compile_shared(READ_C, name="read-stream")
    dll = ctypes.CDLL(str(lib.path))
    fn = dll.yr_read_sum
    fn.restype = ctypes.c_float
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]

    def read(t: Any, threads: int) -> float:
        return float(fn(t.data_ptr(), t.numel() * t.element_size() // 256 * 64, threads))

    return read


def _source(backend: Any, plan: dict[str, Any], prefetch: bool, bf16_dot: bool) -> Any:
    """``plan`` printed with the stream prefetch on or off, for the backend's compile target
    or (``bf16_dot`` off) that target without AVX512-BF16."""
    from yirage_cpu import _codegen

    feats = tuple(f for f in backend.isa_features() if bf16_dot or f != "avx512_bf16")
    bits = int(backend.device_spec().simd_width_bits)
    saved = _codegen.STREAM_PREFETCH
    _codegen.STREAM_PREFETCH = prefetch
    try:
        return _codegen.generate(plan, simd_width_bits=bits, isa_features=feats)
    finally:
        _codegen.STREAM_PREFETCH = saved


def _launcher(backend: Any, source: Any) -> Any:
    return backend.load(backend.compile(source))


def _weights(tensors: list[Any]) -> list[Any]:
    """The inputs of 1 MiB or more: the weights (and KV) a case streams."""
    return [t for t in tensors if t.numel() * t.element_size() >= 1 << 20]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--cases", nargs="+", default=["rmsnorm_linear", "gated_mlp", "lora", "gqa_decode"]
    )
    ap.add_argument("--presets", nargs="+", default=["model", "model_bf16"])
    args = ap.parse_args()
    os.environ["YIRAGE_CPU_THREADS"] = str(args.threads)
    import torch

    import yirage
    from yirage._workloads import get_workload
    from yirage_cpu import _backend

    torch.set_num_threads(args.threads)
    backend = _backend.CpuBackend()
    read = _read_stream()
    from yirage._bench._roofline import measure_copy_bandwidth

    copy_bw, _ = measure_copy_bandwidth("cpu")
    print(f"copy bandwidth (the bench's roofline; read + written): {copy_bw / 1e9:.1f} GB/s")
    for name in args.cases:
        wl = get_workload(name)
        for preset in args.presets:
            if preset not in wl.shapes:
                continue
            kernel = yirage.superoptimize(wl.graph(preset), backend="cpu")
            inputs = wl.inputs(preset)
            weights = _weights(inputs)
            nbytes = sum(t.numel() * t.element_size() for t in weights)
            chosen = _source(backend, kernel.plan, True, True)
            widened = _source(backend, kernel.plan, True, False)
            cases: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
                "read, 1 thread": (lambda *ws: [read(w, 1) for w in ws], tuple(weights)),
                "read, 2 threads": (lambda *ws: [read(w, 2) for w in ws], tuple(weights)),
                "yirage": (_launcher(backend, chosen), tuple(inputs)),
            }
            if widened.code != chosen.code:
                cases["yirage, bf16 widen + FMA"] = (_launcher(backend, widened), tuple(inputs))
            no_pf = _source(backend, kernel.plan, False, True)
            cases["yirage, no prefetch"] = (_launcher(backend, no_pf), tuple(inputs))
            cases["torch eager"] = (wl.reference, tuple(inputs))
            times: dict[str, list[float]] = {k: [] for k in cases}
            for fn, ins in cases.values():
                fn(*ins)
            for _ in range(args.rounds):
                for label, (fn, ins) in cases.items():
                    t0 = time.perf_counter()
                    fn(*ins)
                    times[label].append((time.perf_counter() - t0) * 1e6)
            print(
                f"{name} {preset}: {nbytes / 1e6:.1f} MB streamed; chosen "
                f"{kernel.report.chosen_description}; load {os.getloadavg()[0]:.1f}"
            )
            for label, ts in times.items():
                med = statistics.median(ts)
                rate = nbytes / med / 1e3
                share = 100 * rate * 1e9 / copy_bw
                print(f"  {label:26s} {med:9.1f} µs  {rate:6.1f} GB/s  {share:4.0f}% of copy")


if __name__ == "__main__":
    main()
