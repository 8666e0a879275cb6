"""Does the stress check reject the library baseline for some check seed? The baseline runs
the graph op by op as PyTorch eager does, so its rejection is a false alarm of the check
(or an overflow of the graph itself, which the report then names). For each bench workload
at its ``cpu`` preset, in the given dtypes, ``superoptimize`` on the CPU with check seeds
``--first`` … ``--first + --seeds - 1``; prints every contender the stress check rejected,
baseline or generated, and a count of baseline rejections. A check seed fails or passes the
same way on every run (``check_seed=`` fixes the inputs), so a printed seed reproduces.
``OMP_NUM_THREADS=2 python benchmarks/probes/stress_seed_sweep.py --seeds 20``"""

import argparse

import yirage as yr
from yirage._workloads import WORKLOADS, get_workload

DTYPES = {"float32": yr.float32, "float16": yr.float16, "bfloat16": yr.bfloat16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    args = ap.parse_args()
    baseline_rejected = 0
    for name in args.workloads:
        w = get_workload(name)
        for dname in args.dtypes:
            dt = DTYPES[dname]
            g = w._build({**w.shapes["cpu"], "dtype": dt}, dt)
            for seed in range(args.first, args.first + args.seeds):
                k = g.superoptimize(backend="cpu", cache=False, check_seed=seed)
                for c in k.report.candidates:
                    why = [c.error or "", *c.dropped_variants.values()]
                    for reason in (r for r in why if "stress check failed" in r):
                        base = c.description.startswith("baseline")
                        baseline_rejected += base
                        kind = "BASELINE" if base else "generated"
                        print(f"{name} {dname} seed {seed}: {kind} #{c.index}: {reason}")
            print(f"{name} {dname}: {args.seeds} seeds done", flush=True)
    print(f"baseline contenders rejected by the stress check: {baseline_rejected}")


if __name__ == "__main__":
    main()
