"""Cold ``superoptimize`` with compiling and profiling in this process (one GPU) against worker
processes on every GPU of the host (``yirage._spread``), interleaved, on the bench workloads:

    python benchmarks/spread_cold.py --out results/spread [--rounds 2] [--workloads ...] [--warm]
        [--settle S]

With ``--warm`` the timed call is the process's second (a small graph is superoptimized
first, so the imports are done), as in a process that superoptimizes several graphs; the
workers start with the first call and may still be starting (``--settle S`` waits S seconds
before the timed call, so they are ready).

Each run is a fresh Python process with empty yirage and Triton caches (what a first call
costs, the workers' start included); ``YIRAGE_PROFILE_WORKERS=0`` is the one-GPU run, the GPU
count the spread one. Records the wall time of the call, the report's phases, the chosen kernel
and its measured time, and writes ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ONE_RUN = r"""
import json, sys, time
import yirage as yr
from yirage._workloads import get_workload
if sys.argv[3] == "warm":  # a first call in this process: workers started, imports done
    w = yr.new_kernel_graph()
    w.mark_output(w.exp(w.new_input((64, 256), yr.float16)))
    yr.superoptimize(w, backend="cuda", top_k=8)
    time.sleep(float(sys.argv[4]))  # --settle: the workers finish starting meanwhile
wl = get_workload(sys.argv[1])
g = wl.graph(sys.argv[2])
t = time.perf_counter()
k = yr.superoptimize(g, backend="cuda", config=wl.search_config)
wall = time.perf_counter() - t
r = k.report
print(json.dumps({"wall_s": wall, "search_s": r.search_s, "compile_s": r.codegen_compile_s,
    "check_s": r.check_s, "profile_s": r.profile_s, "chosen": r.chosen_description,
    "measured_us": r.measured_us, "profiled_on": r.profiled_on, "notes": r.notes}))
"""

CASES = (
    ("rmsnorm_linear", "gpu"),
    ("gated_mlp", "gpu"),
    ("lora", "gpu"),
    ("gqa_decode", "gpu"),
    ("qknorm_gqa", "gpu"),
    ("norm_transformer", "gpu"),
)


def run_once(
    workload: str, preset: str, spread: bool, workers: int, warm: bool, settle: float = 0.0
) -> dict[str, Any]:
    env = dict(os.environ)
    env["YIRAGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="yr-cold-")
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    env["YIRAGE_PROFILE_WORKERS"] = str(workers) if spread else "0"
    out = subprocess.run(
        [sys.executable, "-c", ONE_RUN, workload, preset, "warm" if warm else "cold", str(settle)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/spread"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", nargs="*", default=[c[0] for c in CASES])
    ap.add_argument(
        "--warm",
        action="store_true",
        help="time a second call in the process (a small graph superoptimized first)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="with --warm: seconds to wait after the first call (workers finish starting)",
    )
    args = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for _ in range(args.rounds):
        for workload, preset in CASES:
            if workload not in args.workloads:
                continue
            row = rows.setdefault(f"{workload}:{preset}", {"one": [], "spread": []})
            for mode in ("one", "spread"):
                res = run_once(workload, preset, mode == "spread", gpus, args.warm, args.settle)
                row[mode].append(res)
                print(workload, preset, mode, json.dumps(res)[:300], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "gpus": gpus, "warm": args.warm, "rows": rows}
    (args.out / "results.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    lines = [
        f"# {'Second' if args.warm else 'First'} superoptimize in a process: one GPU vs "
        f"{gpus} x {meta['device']}",
        "",
        "| case | one GPU s | spread s | speed-up | one: compile / profile s "
        "| spread: compile / profile s | chosen (one; spread) µs |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for name, row in rows.items():
        ok = {m: [r for r in row[m] if "wall_s" in r] for m in row}
        if not ok["one"] or not ok["spread"]:
            lines.append(f"| {name} | failed: see results.json | | | | | |")
            continue
        one = statistics.median(r["wall_s"] for r in ok["one"])
        spread = statistics.median(r["wall_s"] for r in ok["spread"])
        o, s = ok["one"][-1], ok["spread"][-1]
        lines.append(
            f"| {name} | {one:.1f} | {spread:.1f} | {one / spread:.2f}x "
            f"| {o['compile_s']:.1f} / {o['profile_s']:.1f} "
            f"| {s['compile_s']:.1f} / {s['profile_s']:.1f} "
            f"| {o['measured_us']:.1f}; {s['measured_us']:.1f} |"
        )
    (args.out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
