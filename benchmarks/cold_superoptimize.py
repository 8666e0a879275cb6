"""Cold ``superoptimize`` time per bench case, with the report's stage split (search,
codegen + compile, check, profile), one fresh run each in this process (``cache=False``).

    python benchmarks/cold_superoptimize.py --backend cuda \\
        attention_prefill:prefill_1024 qknorm_gqa:gpu gated_mlp:prefill_4096

Use a fresh ``TRITON_CACHE_DIR`` for compiler-cold numbers. See benchmarks/README.md
("Search depth, a lost-variant bug, the reference on the GPU").
"""

from __future__ import annotations

import argparse
import time

import yirage as yr
from yirage._workloads import get_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("cases", nargs="+", help="workload:preset, e.g. qknorm_gqa:gpu")
    args = ap.parse_args()
    for case in args.cases:
        name, preset = case.split(":")
        graph = get_workload(name).graph(preset)
        t0 = time.perf_counter()
        kernel = yr.superoptimize(graph, backend=args.backend, cache=False)
        print(f"===== {case} cold {time.perf_counter() - t0:.1f} s", flush=True)
        print(kernel.report, flush=True)


if __name__ == "__main__":
    main()
