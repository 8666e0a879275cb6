"""16-bit weights read in place by the matmul vs staged into a float tile, side by side.

The fused RMSNorm + Linear kernel at a model size (x [M, K] in the weight's dtype, W [K, N];
a grid over N tiles, the for-loop over K tiles: the form the search picks at 8x4096x6144),
printed and compiled five ways: float32, float16 and bfloat16 with the weight read in place
(the printer's default: bfloat16 by AVX512-BF16 dot products where the host has them),
bfloat16 widened (the ``bf16_widen`` variant: without the dot path), and bfloat16 with the
weight tile converted into a private float tile before the matmul (the printer before it
read 16-bit B tiles in place, kept here for the comparison). PyTorch's ``rms_norm(x) @ W``
in float32 and bfloat16 run beside them.
Everything is timed interleaved (``--rounds`` rounds, one call each per round) and the
medians are printed in microseconds. Run from the repository root, OMP_NUM_THREADS stated::

    OMP_NUM_THREADS=2 python packages/yirage-cpu/tools/bench_half_matmul.py --rounds 21
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from yirage_cpu import _backend, _codegen


def rmsnorm_linear_plan(dtype: str, m: int, k: int, n: int, grid: int, loop: int) -> dict[str, Any]:
    """rms_norm(x) @ W as one generated kernel: ``grid`` blocks over N, ``loop`` K tiles."""
    nt, kt = n // grid, k // loop
    walk_k = [{"var": "iter", "stride": kt}]
    walk_n = [{"var": "bx", "stride": nt}]
    kernel = {
        "kind": "generated",
        "name": "rmsnorm_linear",
        "grid": [grid, 1, 1],
        "block_threads": 1,
        "warps": 1,
        "forloop_range": loop,
        "inputs": [
            {"buffer": 0, "dims": [m, k], "tile": [m, kt], "offsets": [[], walk_k]},
            {"buffer": 1, "dims": [k, n], "tile": [kt, nt], "offsets": [walk_k, walk_n]},
        ],
        "ops": [
            {"id": 0, "op": "input", "input": 0, "dims": [m, kt], "phase": "loop"},
            {"id": 1, "op": "input", "input": 1, "dims": [kt, nt], "phase": "loop"},
            {
                "id": 2,
                "op": "accum",
                "acc": "rms",
                "args": [0],
                "eps": 1e-6,
                "extent": k,
                "dims": [m, 1],
                "phase": "accum",
            },
            {
                "id": 3,
                "op": "matmul",
                "args": [0, 1],
                "dims": [m, nt],
                "phase": "loop",
                "accumulate_into": 4,
            },
            {"id": 4, "op": "accum", "acc": "iter", "args": [3], "dims": [m, nt], "phase": "accum"},
            {
                "id": 5,
                "op": "binary",
                "binop": "div",
                "args": [4, 2],
                "dims": [m, nt],
                "phase": "epilogue",
            },
        ],
        "outputs": [{"buffer": 2, "src": 5, "tile": [m, nt], "offsets": [[], walk_n]}],
        "safe_softmax": [],
        "smem_bytes": 0,
        "loop_split": 1,
    }
    return {
        "format": "yirage.kernel_plan",
        "version": 3,
        "graph_hash": f"bench-half-matmul-{dtype}-{m}x{k}x{n}-{grid}-{loop}",
        "buffers": [
            {"id": 0, "dims": [m, k], "dtype": dtype, "role": "input", "index": 0},
            {"id": 1, "dims": [k, n], "dtype": dtype, "role": "input", "index": 1},
            {"id": 2, "dims": [m, n], "dtype": dtype, "role": "output", "index": 0},
        ],
        "kernels": [kernel],
    }


def _launcher(
    backend: _backend.CpuBackend, plan: dict[str, Any], staged: bool, bf16_dot: bool = True
) -> Any:
    """Compile ``plan``; ``staged``: with every 16-bit tile converted to a float tile first;
    ``bf16_dot=False``: without the AVX512-BF16 dot path (the ``bf16_widen`` variant)."""
    only_b = _codegen._KernelPrinter._only_matmul_b
    if staged:
        _codegen._KernelPrinter._only_matmul_b = lambda self, oid: False  # type: ignore[method-assign]
    try:
        return backend.load(backend.compile(backend.codegen(plan, bf16_dot=bf16_dot)))
    finally:
        _codegen._KernelPrinter._only_matmul_b = only_b  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--shape", type=int, nargs=3, default=[8, 4096, 6144], metavar=("M", "K", "N"))
    ap.add_argument("--grid", type=int, default=2, help="blocks over N")
    ap.add_argument("--loop", type=int, default=256, help="K tiles of the for-loop")
    args = ap.parse_args()
    import torch

    m, k, n = args.shape
    rng = np.random.default_rng(0)
    x32 = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
    w32 = torch.from_numpy(rng.standard_normal((k, n), dtype=np.float32) / np.float32(k**0.5))
    backend = _backend.CpuBackend()
    cases: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
    for label, dtype, staged, dot in (
        ("float32", "float32", False, True),
        ("float16 in place", "float16", False, True),
        ("bfloat16 in place", "bfloat16", False, True),
        ("bfloat16 widened", "bfloat16", False, False),
        ("bfloat16 staged", "bfloat16", True, True),
    ):
        plan = rmsnorm_linear_plan(dtype, m, k, n, args.grid, args.loop)
        tdt = getattr(torch, dtype)
        cases[label] = (_launcher(backend, plan, staged, dot), (x32.to(tdt), w32.to(tdt)))

    def torch_ref(x: Any, w: Any) -> Any:
        return torch.nn.functional.rms_norm(x, (k,), eps=1e-6) @ w

    cases["torch float32"] = (torch_ref, (x32, w32))
    cases["torch bfloat16"] = (torch_ref, (x32.bfloat16(), w32.bfloat16()))
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (fn, inputs) in cases.items():
            t0 = time.perf_counter()
            fn(*inputs)
            times[name].append((time.perf_counter() - t0) * 1e6)
    print(f"RMSNorm + Linear {m}x{k}x{n}, grid {args.grid}, loop {args.loop}: median µs")
    for name, ts in times.items():
        print(f"  {name:18s} {statistics.median(ts):10.1f}")


if __name__ == "__main__":
    main()
