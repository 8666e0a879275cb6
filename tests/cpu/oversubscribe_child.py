"""Child process of test_cpu_threads' oversubscription test (and a manual probe).

Builds the fused RMSNorm + Linear fixture plan (float32) with the CPU backend, prints
``{"single_us": ...}``: the median of ``--calls`` calls on one thread (YIRAGE_CPU_THREADS=1)
while the machine is as the parent left it, then waits for a line on stdin (the parent loads
the machine meanwhile) and prints ``{"loaded_us": ..., "threads": ..., "wait": ...}``: the
median of ``--calls`` calls with the thread policy the environment gives. Both as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PLAN = Path(__file__).parent / "plans" / "rmsnorm_matmul.json"


def median_us(launcher: Any, ins: list[Any], calls: int) -> float:
    for _ in range(20):
        launcher(*ins)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        launcher(*ins)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    from yirage_cpu._backend import CpuBackend

    be = CpuBackend()
    artifact = be.compile(be.codegen(PLAN.read_text(encoding="utf-8")))
    preset = os.environ.get("YIRAGE_CPU_THREADS")
    os.environ["YIRAGE_CPU_THREADS"] = "1"
    single = be.load(artifact)
    if preset is None:
        del os.environ["YIRAGE_CPU_THREADS"]
    else:
        os.environ["YIRAGE_CPU_THREADS"] = preset
    chosen = be.load(artifact)
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(dims, dtype=np.float32) for dims, _ in chosen.input_specs]
    print(json.dumps({"single_us": median_us(single, ins, args.calls)}), flush=True)
    sys.stdin.readline()
    loaded = median_us(chosen, ins, args.calls)
    policy = getattr(chosen, "thread_policy", None)
    report = {
        "loaded_us": loaded,
        "threads": policy.describe() if policy is not None else None,
        "wait": getattr(chosen, "wait_policy", None),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
