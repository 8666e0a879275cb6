"""Cold ``yr.search`` time per bench workload and GPU preset, with the default options
(``python -m yirage._bench._search_times``).

Each case is searched once with ``cache=False`` (cold) for a registry chip's DeviceSpec
(``--device``, default H100), so the numbers do not depend on the host's GPU; one JSON line
per case goes to ``--out`` and a summary line to stdout. See benchmarks/README.md
("Default search time").

    python -m yirage._bench._search_times --threads 2 --out search_times.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yirage as yr
from yirage import _workloads

#: Presets of the GPU bench families (decode, prefill, ragged, the LoRA paper size).
GPU_FAMILIES = ("gpu", "prefill", "ragged", "paper")


def cases(names: list[str]) -> list[tuple[str, str]]:
    """(workload, preset) of every GPU preset, of the workloads in ``names`` (all if empty)."""
    return [
        (w.name, p)
        for w in _workloads.WORKLOADS.values()
        if not names or w.name in names
        for p in w.shapes
        if p.startswith(GPU_FAMILIES)
    ]


def measure(name: str, preset: str, device: str, threads: int | None) -> dict[str, object]:
    """One cold search of ``name`` at ``preset`` and what its report says."""
    g = _workloads.get_workload(name).graph(preset)
    t0 = time.perf_counter()
    res = yr.search(g, device=device, threads=threads, cache=False)
    wall = time.perf_counter() - t0
    rep = res.report
    return {
        "case": f"{name}:{preset}",
        "wall_s": round(wall, 2),
        "stop_reason": rep.stop_reason,
        "enumerate_s": round(rep.enumerate_s, 2),
        "verify_s": round(rep.verify_s, 2),
        "threads": rep.threads,
        "fingerprint_tests": rep.fingerprint_tests,
        "best": res.best.label,
        "fused": any(not c.baseline and "custom[" in c.label for c in res.candidates),
        "notes": list(rep.notes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="cold yr.search time per bench workload and preset")
    ap.add_argument("--device", default="H100", help="registry chip (default H100)")
    ap.add_argument("--threads", type=int, default=None, help="search threads (default all)")
    ap.add_argument("--workloads", nargs="*", default=[], help="workload names (default all)")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = ap.parse_args()
    for name, preset in cases(args.workloads):
        row = measure(name, preset, args.device, args.threads)
        if args.out is not None:
            with args.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        print(
            f"{row['case']:34} {row['wall_s']:7.2f} s  {row['stop_reason']:12} "
            f"enumerate {row['enumerate_s']:6.2f} s  verify {row['verify_s']:6.2f} s  "
            f"fused {row['fused']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
