#!/usr/bin/env python3
"""Search time of the four fusions of the search issue (CI shapes), with and without e-graph
pruning, on whatever host runs it:  python benchmarks/search_times.py [--no-unpruned]

Uses the shapes and device specs of tests/_search_graphs.py (the search tests), so the times
are those of the µGraphs the tests assert on. Prints one line per run and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _search_graphs as sg

CASES = [
    ("rmsnorm_linear X[8,512]·W[512,768]", sg.rmsnorm_linear, sg.CPU2),
    ("gated_mlp X[8,512], W1,W2[512,512]", sg.gated_mlp, sg.CPU2),
    ("lora X[8,512] W[512,512] r16", sg.lora, sg.CPU2),
    ("attention Q[2,256,64] K[2,64,4096] V[2,4096,64]", sg.attention, sg.H100),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-unpruned", action="store_true", help="skip the runs without pruning")
    ap.add_argument("--unpruned-limit", type=float, default=30.0)
    args = ap.parse_args()
    rows = []
    for name, build, spec in CASES:
        for prune in (True, False) if not args.no_unpruned else (True,):
            t = time.perf_counter()
            res = sg.search(
                build(),
                device_spec=spec,
                cache=False,
                time_limit=120 if prune else args.unpruned_limit,
                prune=prune,
            )
            wall = time.perf_counter() - t
            rep = res.report
            best = res.candidates[0]
            row = {
                "case": name,
                "pruning": prune,
                "wall_s": round(wall, 2),
                "states_explored": rep.states_explored,
                "states_pruned": rep.states_pruned,
                "verified": rep.verified,
                "stop_reason": rep.stop_reason,
                "best": best.label,
                "threads": rep.threads,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"host_cpus": os.cpu_count(), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
