"""A tensor-parallel step on several GPUs: yirage's kernel of ``rms_norm(all_reduce(X_r @ W_r))``
against the same step written in PyTorch (``x @ w``, ``torch.distributed.all_reduce``,
``torch.nn.functional.rms_norm``), one process per GPU, NCCL, in the same run.

    torchrun --nproc-per-node 2 benchmarks/tensor_parallel.py --out results/tp

Every rank superoptimizes its graph cold (its own cache directory), checks its output against
the float64 reference evaluator run on every rank's inputs (gathered), then times, interleaved
over ``--rounds`` rounds (median of each round's per-step median):

- ``yirage``: ``kernel(x, w)`` called step after step, as a user calls it (repeated calls
  on the same tensors replay device graphs split at the all_reduce, which NCCL runs from the
  host in between);
- ``yirage launches``: the same with ``YIRAGE_DEVICE_GRAPHS=0`` (every kernel launched from
  the host);
- ``torch``: the PyTorch step called the same way;
- ``yirage graph`` / ``torch graph``: each step captured into a CUDA graph (for yirage
  :meth:`yirage.OptimizedKernel.capture`; for PyTorch ``torch.cuda.graph``), replayed;
- with ``--cold-l2``, the captured steps again, each after a 256 MiB write that evicts W
  from L2 (as in a model with many layers), less the time of the write alone.

Each timed sample is ``--steps`` back-to-back steps between two CUDA events on rank 0's
stream, after a barrier; the step time is the sample over ``--steps``. Rank 0 writes
``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import yirage as yr

DTYPES = {"float16": (yr.float16, torch.float16), "bfloat16": (yr.bfloat16, torch.bfloat16)}


def build_graph(world: int, rows: int, k: int, n: int, dtype: Any, eps: float) -> yr.KernelGraph:
    """Row-parallel linear then RMSNorm: rank r holds X[:, r-th K slice] and W[r-th slice]."""
    g = yr.new_kernel_graph(world_size=world)
    x = g.new_input((rows, k), dtype)
    w = g.new_input((k, n), dtype)
    g.mark_output(g.rms_norm(g.all_reduce(g.matmul(x, w)), (n,), eps=eps))
    return g


def torch_step(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The same step as a PyTorch user writes it."""
    y = x @ w
    dist.all_reduce(y)
    return torch.nn.functional.rms_norm(y, (y.shape[-1],), eps=eps)


def gather(t: torch.Tensor) -> np.ndarray:
    """Every rank's ``t`` stacked along a leading rank axis (float64, on every rank)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return np.stack([p.double().cpu().numpy() for p in parts])


def rel_err(got: torch.Tensor, want: np.ndarray) -> float:
    g = got.double().cpu().numpy()
    return float(np.linalg.norm(g - want) / np.linalg.norm(want))


def timed(fn: Callable[[], Any], steps: int) -> float:
    """µs per step of ``steps`` back-to-back calls, between CUDA events, all ranks aligned."""
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / steps


def host_profile(cases: dict[str, Callable[[], Any]], steps: int) -> str:
    """cProfile of ``steps`` plain steps of yirage and of torch (every rank profiles, so the
    ranks stay in step), the functions with the most own time first."""
    import cProfile
    import io
    import pstats

    out = io.StringIO()
    for name in ("yirage", "torch"):
        prof = cProfile.Profile()
        dist.barrier()
        prof.enable()
        for _ in range(steps):
            cases[name]()
        torch.cuda.synchronize()
        prof.disable()
        out.write(f"## {name}: {steps} steps\n")
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured into a CUDA graph (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--k", type=int, default=2048, help="each rank's slice of the hidden dim")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path("results/tensor-parallel"))
    ap.add_argument(
        "--host-profile",
        action="store_true",
        help="also write host_profile.txt: cProfile of rank 0's plain yirage and torch steps",
    )
    ap.add_argument(
        "--cold-l2",
        action="store_true",
        help="also time the captured steps after a write of 256 MiB each (W no longer in L2, "
        "as in a model with many layers), less the time of that write alone",
    )
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    yr_dtype, t_dtype = DTYPES[args.dtype]
    g = build_graph(world, args.rows, args.k, args.n, yr_dtype, args.eps)
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    x = torch.randn(args.rows, args.k, device="cuda", generator=gen).to(t_dtype)
    w = (torch.randn(args.k, args.n, device="cuda", generator=gen) / args.k**0.5).to(t_dtype)

    os.environ["YIRAGE_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"yirage-tp-rank{rank}-")
    t0 = time.perf_counter()
    kernel = yr.superoptimize(g, backend="cuda")
    cold_s = time.perf_counter() - t0

    want = g.evaluate([gather(x), gather(w)])[0][rank]
    err_yirage = rel_err(kernel(x, w)[0], want)
    err_torch = rel_err(torch_step(x, w, args.eps), want)

    err_repeated = max(rel_err(kernel(x, w)[0], want) for _ in range(3))
    os.environ["YIRAGE_DEVICE_GRAPHS"] = "0"
    launches = yr.superoptimize(g, backend="cuda")  # the same decision, from the cache
    del os.environ["YIRAGE_DEVICE_GRAPHS"]
    cases: dict[str, Callable[[], Any]] = {
        "yirage": lambda: kernel(x, w),
        "yirage launches": lambda: launches(x, w),
        "torch": lambda: torch_step(x, w, args.eps),
    }
    captured = kernel.capture(x, w)
    err_graph = rel_err(captured()[0], want)
    cases["yirage graph"] = captured
    cases["torch graph"] = graphed(lambda: torch_step(x, w, args.eps))
    if args.cold_l2:
        flush = torch.empty(64 << 20, device="cuda")
        cases["L2 write"] = flush.zero_
        # looked up at each call: clearing ``cases`` must release the graphs (see below)
        cases["yirage graph, cold L2"] = lambda: (flush.zero_(), cases["yirage graph"]())
        cases["torch graph, cold L2"] = lambda: (flush.zero_(), cases["torch graph"]())
    for name in cases:  # warm-up, every case (no loop variable keeps a graph alive)
        timed(cases[name], 10)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name in cases:
            samples[name].append(timed(cases[name], args.steps))

    result = {
        "device": torch.cuda.get_device_name(),
        "world_size": world,
        "shape": {"rows": args.rows, "k_per_rank": args.k, "n": args.n, "dtype": args.dtype},
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "torch": torch.__version__,
        "cold_superoptimize_s": cold_s,
        "chosen": kernel.report.chosen_description,
        "max_rel_err": {
            "yirage": err_yirage,
            "yirage repeated": err_repeated,
            "yirage graph": err_graph,
            "torch": err_torch,
        },
        "median_us": {name: statistics.median(s) for name, s in samples.items()},
        "report": str(kernel.report),
        "samples_us": samples,
    }
    if args.host_profile:
        result["host_profile"] = host_profile(cases, args.steps)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, result)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(everyone, indent=1), encoding="utf-8")
        (args.out / "results.md").write_text(_table(everyone), encoding="utf-8")
        print(_table(everyone), flush=True)
        if args.host_profile:
            (args.out / "host_profile.txt").write_text(result["host_profile"], encoding="utf-8")
    cases.clear()  # a live graph holding NCCL work makes destroy_process_group wait
    captured.release()
    gc.collect()
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


def _table(ranks: list[dict[str, Any]]) -> str:
    r0 = ranks[0]
    s = r0["shape"]
    lines = [
        f"# Tensor-parallel step, {r0['world_size']} x {r0['device']} (NCCL {r0['nccl']}, "
        f"torch {r0['torch']})",
        "",
        f"`rms_norm(all_reduce(X_r @ W_r))`, X_r [{s['rows']}, {s['k_per_rank']}], W_r "
        f"[{s['k_per_rank']}, {s['n']}], {s['dtype']}; µs per step, median over rounds.",
        "",
        "| rank | yirage | yirage launches | torch | torch / yirage | yirage graph "
        "| torch graph | torch graph / yirage graph | cold s "
        "| max rel err (yirage first, repeated, graph; torch) | chosen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for i, r in enumerate(ranks):
        m, e = r["median_us"], r["max_rel_err"]
        lines.append(
            f"| {i} | {m['yirage']:.1f} | {m['yirage launches']:.1f} | {m['torch']:.1f} "
            f"| {m['torch'] / m['yirage']:.2f}x | {m['yirage graph']:.1f} "
            f"| {m['torch graph']:.1f} | {m['torch graph'] / m['yirage graph']:.2f}x "
            f"| {r['cold_superoptimize_s']:.1f} | {e['yirage']:.1e}, {e['yirage repeated']:.1e}, "
            f"{e['yirage graph']:.1e}; {e['torch']:.1e} | {r['chosen']} |"
        )
    if "L2 write" in r0["median_us"]:
        lines += [
            "",
            "Captured steps with W out of L2 (each step after a 256 MiB write, less that "
            "write's time):",
            "",
            "| rank | yirage graph | torch graph | torch / yirage |",
            "|---|---:|---:|---:|",
        ]
        for i, r in enumerate(ranks):
            m = r["median_us"]
            y = m["yirage graph, cold L2"] - m["L2 write"]
            t = m["torch graph, cold L2"] - m["L2 write"]
            lines.append(f"| {i} | {y:.1f} | {t:.1f} | {t / y:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
