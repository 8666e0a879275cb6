"""float32 vs float16 vs bfloat16 timings of the CPU backend's printed kernels.

Two cases: ``exp`` over 32K elements (a printed library unary kernel) and the fused
RMSNorm + Linear kernel of tests/cpu/plans/rmsnorm_matmul.json ([8, 512] x [512, 768]).
Every plan is built once per dtype, then the dtypes are timed interleaved (``--rounds``
rounds of ``yirage_cpu._runtime.profile`` each), and the median of the round medians is
printed in microseconds. Run from the repository root, OMP_NUM_THREADS stated, e.g.::

    OMP_NUM_THREADS=2 python packages/yirage-cpu/tools/bench_dtypes.py --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from yirage_cpu import _backend, _runtime

DTYPES = ("float32", "float16", "bfloat16")
PLAN = Path(__file__).resolve().parents[3] / "tests" / "cpu" / "plans" / "rmsnorm_matmul.json"


def exp_plan(dtype: str, n: int = 32768) -> dict[str, Any]:
    """A plan of one library ``exp`` over ``n`` elements of ``dtype``."""
    return {
        "format": "yirage.kernel_plan",
        "version": 3,
        "graph_hash": f"bench-exp-{dtype}",
        "buffers": [
            {"id": 0, "dims": [n], "dtype": dtype, "role": "input", "index": 0},
            {"id": 1, "dims": [n], "dtype": dtype, "role": "output", "index": 0},
        ],
        "kernels": [
            {
                "kind": "library",
                "op": "unary",
                "inputs": [0],
                "outputs": [1],
                "params": {"op": "exp", "params": []},
            }
        ],
    }


def rmsnorm_linear_plan(dtype: str) -> dict[str, Any]:
    """The fused RMSNorm + Linear fixture with its buffers in ``dtype``."""
    plan: dict[str, Any] = json.loads(PLAN.read_text(encoding="utf-8"))
    for b in plan["buffers"]:
        b["dtype"] = dtype
    plan["graph_hash"] = f"bench-rmsnorm-linear-{dtype}"
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per profile round")
    args = ap.parse_args()
    be = _backend.CpuBackend()
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    for case, make in (("exp 32K", exp_plan), ("rmsnorm+linear 8x512x768", rmsnorm_linear_plan)):
        runs = {}
        for dt in DTYPES:
            launcher = be.load(be.compile(be.codegen(make(dt))))
            runs[dt] = (launcher, _runtime.random_inputs(launcher.input_specs, seed=1))
        times: dict[str, list[float]] = {dt: [] for dt in DTYPES}
        for _ in range(args.rounds):
            for dt, (launcher, ins) in runs.items():
                res = _runtime.profile(launcher, ins, min_time_s=args.min_time)
                times[dt].append(res.median_us)
        med = {dt: statistics.median(v) for dt, v in times.items()}
        ratios = ", ".join(f"{dt}/f32 {med[dt] / med['float32']:.2f}x" for dt in DTYPES[1:])
        cells = ", ".join(f"{dt} {med[dt]:.1f} us" for dt in DTYPES)
        print(f"{case}: {cells} ({ratios})")


if __name__ == "__main__":
    main()
