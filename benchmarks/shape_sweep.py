"""Random shapes of the bundled workloads: superoptimize each (no cache) on ``--backend``
(cpu, or cuda on an NVIDIA GPU, with sizes of that regime), then compare the kernel on fresh
inputs at three scales (x1, x30, x0.001) with the float64 reference rounded to the output
dtype. A correctness sweep: it prints one line per shape and exits 1 if any shape failed.
With ``--time`` it also times the kernel against the workload in PyTorch eager on the same
inputs (CPU: interleaved calls, medians; GPU: the bench's CUDA-graph replay medians) and
counts the shapes where yirage is more than 5% slower; those do not fail the sweep (timings
on a shared machine are for the benchmark report, not a pass/fail).

    python benchmarks/shape_sweep.py --seed 23 --count 60 [--time] [--backend cuda] [--reports]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

import torch

import yirage as yr
from yirage import _workloads

DTYPES = {
    "f32": (yr.float32, torch.float32, 1e-4),
    "bf16": (yr.bfloat16, torch.bfloat16, 3e-2),
    "f16": (yr.float16, torch.float16, 5e-3),
}


def random_shape(name: str, rng: random.Random) -> dict[str, Any]:
    """CPU-sized dims (small enough that a sweep of dozens runs in minutes on 2 cores)."""
    r = rng.randint
    if name in ("rmsnorm_linear", "gated_mlp"):
        return {"b": r(1, 40), "h": r(17, 900), "n": r(5, 1200)}
    if name in ("rms_norm", "norm_transformer"):
        return {"b": r(1, 70), "h": r(3, 3000)}
    if name == "lora":
        return {"b": r(1, 40), "h": r(17, 700), "n": r(5, 900), "r": r(1, 24)}
    if name in ("gqa_decode", "qknorm_gqa"):
        kvh = r(1, 3)
        d = rng.choice([16, 32, 64, 80, 96, 128])
        return {"b": r(1, 3), "q_heads": kvh * r(1, 4), "kv_heads": kvh, "d": d, "kv": r(3, 1500)}
    heads = r(1, 3)  # attention_prefill
    d = rng.choice([16, 32, 64, 128])
    return {
        "b": 1,
        "q_heads": heads,
        "kv_heads": heads,
        "d": d,
        "kv": r(3, 700),
        "q_len": r(1, 300),
    }


def random_gpu_shape(name: str, rng: random.Random) -> dict[str, Any]:
    """GPU-sized dims: decode to prefill rows, hidden sizes up to model sizes, most of them
    no power of two."""
    r = rng.randint
    rows = rng.choice([r(1, 32), r(33, 300), r(301, 2500)])
    if name in ("rmsnorm_linear", "gated_mlp"):
        return {"b": rows, "h": r(64, 6000), "n": r(64, 8000)}
    if name in ("rms_norm", "norm_transformer"):
        return {"b": rows, "h": r(64, 12000)}
    if name == "lora":
        return {"b": rows, "h": r(256, 6000), "n": r(256, 6000), "r": r(1, 64)}
    if name in ("gqa_decode", "qknorm_gqa"):
        kvh = r(1, 8)
        d = rng.choice([64, 80, 128])
        return {"b": r(1, 8), "q_heads": kvh * r(1, 8), "kv_heads": kvh, "d": d, "kv": r(16, 20000)}
    heads = r(1, 16)  # attention_prefill
    d = rng.choice([64, 128])
    return {
        "b": 1,
        "q_heads": heads,
        "kv_heads": heads,
        "d": d,
        "kv": r(16, 3000),
        "q_len": r(16, 3000),
    }


def worst_error(
    wl: Any, kernel: Any, graph: yr.KernelGraph, tdt: Any, dev: str
) -> tuple[float, str]:
    """Largest relative error over the three input scales, and a note: inf where the kernel
    gives a non-finite value where the reference (rounded to the dtype) is finite, the note
    saying whether the workload in PyTorch eager (the graph op by op in its dtype) loses
    those values too."""
    worst = 0.0
    for scale in (1.0, 30.0, 1e-3):
        ins = [
            (torch.randn(*t.dims, dtype=torch.float64, device=dev) * scale).to(tdt)
            for t in graph.inputs
        ]
        ref = wl.reference(*[x.double() for x in ins])
        out = kernel(*ins)
        for i, (o, r) in enumerate(
            zip(out if isinstance(out, (list, tuple)) else [out], ref, strict=True)
        ):
            o64, rd = o.double(), r.to(tdt).double()
            finite = torch.isfinite(rd)
            lost = ~torch.isfinite(o64) & finite
            if lost.any():
                eager = wl.reference(*ins)[i].double()
                also = "" if (lost & torch.isfinite(eager)).any() else ", as PyTorch eager does"
                return float("inf"), f" {int(lost.sum())} NaN/Inf at x{scale:g}{also}"
            keep = finite & (rd.abs() >= torch.finfo(tdt).tiny)  # normal numbers of the dtype
            if keep.any():
                r_, o_ = torch.where(keep, r, 0.0), torch.where(keep, o64, 0.0)
                worst = max(worst, float((o_ - r_).norm() / r_.norm().clamp_min(1e-300)))
    return worst, ""


def eager_ratio(
    wl: Any, kernel: Any, graph: yr.KernelGraph, tdt: Any, dev: str
) -> tuple[float, float]:
    """(yirage µs, eager µs): on the CPU medians of 15 interleaved rounds of enough calls
    each for ~2 ms; on a GPU the bench's CUDA-graph replay medians."""
    ins = [torch.randn(*t.dims, device=dev).to(tdt) for t in graph.inputs]
    if dev != "cpu":  # the bench harness's method (CUDA-graph replays)
        from yirage._bench._timing import cuda_graph_median

        ours = cuda_graph_median(lambda: kernel(*ins)).median_us
        return ours, cuda_graph_median(lambda: wl.reference(*ins)).median_us

    def per_call(fn: Any) -> float:
        fn()
        n, t = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t = time.perf_counter() - t0
            if t > 2e-3 or n >= 4096:
                return t / n * 1e6
            n *= 2

    ours, theirs = [], []
    for _ in range(15):
        ours.append(per_call(lambda: kernel(*ins)))
        theirs.append(per_call(lambda: wl.reference(*ins)))
    return statistics.median(ours), statistics.median(theirs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--start", type=int, default=0, help="skip the first N shapes of the seed")
    ap.add_argument("--reports", action="store_true", help="print each kernel's full report")
    ap.add_argument("--time", action="store_true", help="time each kernel against eager")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    gpu = args.backend != "cpu"
    dev = "cuda" if gpu else "cpu"
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    names = _workloads.workload_names()
    failed, slower, ratios = 0, 0, []
    for i in range(args.start + args.count):
        dtypes = ["f16", "bf16", "bf16", "f32"] if gpu else ["f32", "f32", "bf16", "f16"]
        name, dk = rng.choice(names), rng.choice(dtypes)
        dt, tdt, tol = DTYPES[dk]
        shape = random_gpu_shape(name, rng) if gpu else random_shape(name, rng)
        if i < args.start:
            continue
        wl = _workloads.get_workload(name)
        graph = wl._build({**shape, "dtype": dt}, dt)
        t0 = time.perf_counter()
        kernel = yr.superoptimize(graph, backend=args.backend, cache=False)
        err, note = worst_error(wl, kernel, graph, tdt, dev)
        ok = err <= tol
        failed += not ok
        timing = ""
        if args.time:
            ours, eager = eager_ratio(wl, kernel, graph, tdt, dev)
            ratios.append(eager / ours)
            slower += ours > 1.05 * eager
            timing = f" {ours:.1f} µs vs eager {eager:.1f} µs ({eager / ours:.2f}x)"
        print(
            f"[{i}] {'ok ' if ok else 'BAD'} {name} {dk} {shape} err {err:.2e} "
            f"{time.perf_counter() - t0:.1f}s{timing} "
            f"{kernel.report.chosen_description[:70]} ({kernel.report.chosen_variant}){note}",
            flush=True,
        )
        if args.reports:
            print(kernel.report, flush=True)
    print(f"{failed} of {args.count} failed (shapes {args.start}..{args.start + args.count - 1})")
    if args.time:
        geo = statistics.geometric_mean(ratios)
        print(f"{slower} of {args.count} more than 5% slower than eager; geomean {geo:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
