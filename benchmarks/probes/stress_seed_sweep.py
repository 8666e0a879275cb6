"""Which contenders does the stress check reject, per bench workload and check seed? For
each workload at its ``cpu`` preset, in the given dtypes, ``superoptimize`` on the CPU with
check seeds ``--first`` … ``--first + --seeds - 1``; prints every contender (and variant)
the stress check rejected, once, and counts the library baseline's rejections.

Reading it: the library baseline's own C variant should never be rejected (it accumulates
as the generated kernels do); a rejection of it is a false alarm of the check to fix. Its
``torch_eager`` variant rounds every intermediate to the graph's dtype, as PyTorch does: in
float16 an intermediate that overflows (``x @ W`` with float16's largest value in W) gives
Inf or NaN where float64 gives a number, and the check rightly rejects it; inspect the
others. ``check_seed=`` fixes the inputs, so a printed seed reproduces.
``OMP_NUM_THREADS=2 python benchmarks/probes/stress_seed_sweep.py --seeds 10``; one
workload at other dims: ``--workloads rmsnorm_linear --dims b=8 h=256 n=128``."""

import argparse
from collections import Counter

import yirage as yr
from yirage._workloads import WORKLOADS, get_workload

DTYPES = {"float32": yr.float32, "float16": yr.float16, "bfloat16": yr.bfloat16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    ap.add_argument("--dims", nargs="*", default=[], help="k=v overriding the preset's dims")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (d.split("=") for d in args.dims)}
    counts: Counter[str] = Counter()
    for name in args.workloads:
        w = get_workload(name)
        for dname in args.dtypes:
            dt = DTYPES[dname]
            g = w._build({**w.shapes["cpu"], **dims, "dtype": dt}, dt)
            for seed in range(args.first, args.first + args.seeds):
                k = g.superoptimize(backend="cpu", cache=False, check_seed=seed)
                for c in k.report.candidates:
                    why = {"": c.error or "", **c.dropped_variants}
                    for variant, reason in why.items():
                        if "stress check failed" not in reason or (variant == "" and len(why) > 1):
                            continue
                        base = c.description.startswith("baseline")
                        counts[variant or "default"] += base
                        label = f"{'baseline' if base else 'generated'} {variant or 'default'}"
                        print(f"{name} {dname} seed {seed}: {label} #{c.index}: {reason}")
            print(f"{name} {dname}: {args.seeds} seeds done", flush=True)
    print(f"library baseline variants rejected by the stress check: {dict(counts)}")


if __name__ == "__main__":
    main()
