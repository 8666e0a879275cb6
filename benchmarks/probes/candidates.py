"""Diagnostics for the cuda backend: CUDA-graph replay time of a workload's top search
candidates under several Triton printings (loop splits, pipeline depths), each checked
against the workload's PyTorch reference.

    python benchmarks/probes/candidates.py gqa_decode --preset gpu --top 4 --splits 1 4 16
    python benchmarks/probes/candidates.py gqa_decode --preset gpu_kv16384 --match "grid=16x1x1"
    python benchmarks/probes/candidates.py qknorm_gqa --top 1 --splits 8 16 --warps 4 8
    python benchmarks/probes/candidates.py qknorm_gqa --top 3 --splits 16 --scale-after-dot on off

Prints one line per (candidate, split, stages, warps, printing): median µs, relative error,
the split chosen by ``loop_split`` for comparison. Needs a CUDA GPU, torch and triton.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json

import torch

import yirage as yr
from yirage import _workloads
from yirage._bench._timing import cuda_graph_median
from yirage_cuda import CudaBackend
from yirage_cuda._plan import parse_plan
from yirage_cuda._runtime import profile
from yirage_cuda._subtile import loop_subtile
from yirage_cuda._toolchain import device_info
from yirage_cuda._triton_codegen import DEEP_STAGES, DEFAULT_STAGES, TritonOptions, loop_split


def _rel_err(outs: list[torch.Tensor], refs: list[torch.Tensor]) -> float:
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o64, r64 = o.double(), r.double()
        worst = max(worst, float((o64 - r64).norm() / r64.norm().clamp_min(1e-30)))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument(
        "--match",
        nargs="+",
        default=[],
        help="search this many more candidates (--search) and keep those whose label contains "
        "one of these strings, e.g. 'grid=16x1x1 loop=128'",
    )
    ap.add_argument("--search", type=int, default=60)
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--stages", type=int, nargs="+", default=[0], help="0: the printer's choice")
    ap.add_argument(
        "--warps", type=int, nargs="+", default=[0], help="warps per block; 0: the plan's"
    )
    ap.add_argument(
        "--scale-after-dot",
        nargs="+",
        choices=["on", "off"],
        default=["off"],
        help="print a normalised dot operand raw and scale the product (on, the backend's "
        "*_scaled variants), or as a quotient (off)",
    )
    ap.add_argument(
        "--fine",
        nargs="+",
        choices=["on", "off"],
        default=["off"],
        help="cut the loop chunks as the backend's triton_fine* variants do (on) or not",
    )
    ap.add_argument(
        "--pdl",
        nargs="+",
        choices=["on", "off"],
        default=["off"],
        help="programmatic dependent launch (on, sm_90+) or not",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="also time each printing as superoptimize's profiler does (rotated input sets, "
        "L2 flushed)",
    )
    args = ap.parse_args()

    w = _workloads.get_workload(args.workload)
    g = w.graph(args.preset)
    info = device_info()
    sms, smem = info.sm_count, info.smem_per_block_optin
    k = args.search if args.match else args.top
    res = yr.search(g, backend="cuda", config=w.search_config, top_k=k, cache=False)
    chosen_cands = [
        (rank, c)
        for rank, c in enumerate(res.candidates)
        if not args.match or any(m in str(c) for m in args.match)
    ][: args.top + 1]
    xs = w.inputs(args.preset, device="cuda")
    refs = w.reference(*[x.float() for x in xs])
    print(f"{args.workload} {args.preset} on {torch.cuda.get_device_name()} ({sms} SMs)")
    for rank, cand in chosen_cands:
        plan = json.loads(cand.kernel_plan().to_json())
        p = parse_plan(plan)
        auto = {k.name: loop_split(k, sms) for k in p.generated}
        print(f"#{rank} predicted {cand.predicted_us:.1f} µs: {cand} (loop_split {auto})")
        for split in args.splits:
            chosen = tuple(
                (k.name, split)
                for k in p.generated
                if split > 1
                and k.forloop_range % split == 0
                and any(o.op == "accum" for o in k.ops)
            )
            if split > 1 and not chosen:
                continue
            for stages, warps, sad, fine, pdl in itertools.product(
                args.stages, args.warps, args.scale_after_dot, args.fine, args.pdl
            ):
                cut = tuple((k.name, f) for k in p.generated if (f := loop_subtile(k)) > 1)
                if fine == "on" and not cut:
                    continue
                opts = TritonOptions(
                    split_loop=chosen,
                    num_stages=stages or None,
                    scale_after_dot=sad == "on",
                    smem_limit=smem,  # the stage counts the backend prints
                    subtile=cut if fine == "on" else (),
                    max_stages=DEEP_STAGES if fine == "on" else DEFAULT_STAGES,
                    pdl=pdl == "on",
                )
                be = CudaBackend(cuda_cpp=False, triton_options=dataclasses.replace(opts))
                printed = copy.deepcopy(plan)
                for kd in printed["kernels"]:
                    if warps and kd.get("kind") != "library":
                        kd["warps"] = warps
                what = (
                    f"split {split:3d} stages {stages or '-':>2} warps {warps or '-':>2} "
                    f"scale-after-dot {sad} fine {fine} pdl {pdl}"
                )
                try:
                    kern = be.load(be.compile(be.codegen(printed)))
                    err = _rel_err(kern(*xs), refs)
                    t = cuda_graph_median(lambda kern=kern: kern.run_unchecked(xs))
                    cold = ""
                    if args.cold:
                        c = profile(kern.built_variants["triton"], xs)
                        cold = f"  cold {c.median_us:8.1f} µs"
                    print(f"    {what}: {t.median_us:8.1f} µs{cold}  rel err {err:.1e}")
                except Exception as exc:  # diagnostics: report and go on
                    print(f"    {what}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
