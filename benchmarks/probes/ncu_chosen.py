"""What limits the kernels yirage chooses: superoptimize each case (decision cache as set by
YIRAGE_CACHE_DIR), then run the chosen kernel once inside a profiler range for Nsight Compute.
Run it once without ncu first: profiling under ncu times every candidate far slower than in
use and would choose other kernels; the second run takes the first run's choices from the cache.

    python benchmarks/probes/ncu_chosen.py rmsnorm_linear:gpu_b16 qknorm_gqa:gpu
    ncu --clock-control none --profile-from-start off --csv \\
        --metrics $(python benchmarks/probes/ncu_chosen.py --metrics) \\
        python benchmarks/probes/ncu_chosen.py rmsnorm_linear:gpu_b16 qknorm_gqa:gpu

ncu flushes the caches before each profiled kernel, so DRAM figures are for a cold L2; without
``--clock-control none`` it locks the clocks to base and the kernels run slower than in use.
"""

from __future__ import annotations

import argparse

METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="workload:preset, e.g. gqa_decode:gpu_kv16384")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu")
    args = ap.parse_args()
    if args.metrics:
        print(",".join(METRICS))
        return
    import torch

    import yirage as yr
    from yirage._workloads import get_workload

    for case in args.cases:
        name, preset = case.split(":")
        w = get_workload(name)
        kernel = yr.superoptimize(w.graph(preset), backend="cuda", config=w.search_config)
        xs = w.inputs(preset, device="cuda")
        for _ in range(3):
            kernel(*xs)
        torch.cuda.synchronize()
        print(f"== {case}: {kernel.report.chosen_description}", flush=True)
        torch.cuda.profiler.start()
        kernel(*xs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
