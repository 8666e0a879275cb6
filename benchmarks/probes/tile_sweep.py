"""Diagnostics for the Triton printer: CUDA-graph replay time of hand-tiled fixture plans
(tests/cuda/plans.py) over tile sizes, loop splits, warps and pipeline depths, at the
bench shapes. Tells which configurations the search and cost model should reach.

    python benchmarks/probes/tile_sweep.py rmsnorm_linear --tn 32 48 64 --tk 256 512 --stages 3 5

Needs a CUDA GPU, torch and triton.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "cuda"))
import plans
import torch

from yirage._bench._timing import cuda_graph_median
from yirage_cuda import CudaBackend
from yirage_cuda._triton_codegen import TritonOptions


def sweep_cases(name: str, a: argparse.Namespace) -> list[tuple[str, plans.Case]]:
    out = []
    for tn, tk, w in itertools.product(a.tn, a.tk, a.warps):
        label = f"b={a.b} tn={tn} tk={tk} warps={w}"
        if name == "rmsnorm_linear":
            c = plans.rmsnorm_linear(b=a.b, h=4096, n=6144, tn=tn, tk=tk, dtype="float16", warps=w)
        elif name == "gated_mlp":
            c = plans.gated_mlp(b=a.b, h=4096, n=4096, tn=tn, tk=tk, dtype="float16", warps=w)
        elif name == "lora":
            c = plans.lora(b=a.b, h=4096, n=4096, tn=tn, tk=tk, dtype="float16", warps=w)
        elif name == "gqa_decode":
            c = plans.attention_fused(batch=16, rows=4, d=128, kv_len=a.kv, tl=tk, dtype="float16")
            label = f"kv={a.kv} tl={tk}"
        else:
            raise SystemExit(f"unknown sweep {name!r}")
        out.append((label, c))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--kv", type=int, default=4096)
    ap.add_argument("--tn", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tk", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 5])
    a = ap.parse_args()
    for name in a.names:
        print(f"== {name} on {torch.cuda.get_device_name()}", flush=True)
        for label, case in sweep_cases(name, a):
            xs = case.random_inputs(0)
            dts = [d for _, d in case.inputs]
            gen = [k for k in case.plan["kernels"] if k.get("kind", "generated") != "library"]
            main_k = max(gen, key=lambda k: int(np.prod(k["grid"])))
            loop, kname = int(main_k["forloop_range"]), main_k["name"]
            best = None
            for split, stages in itertools.product(a.splits, a.stages):
                if split > 1 and (loop % split or loop // split < 1):
                    continue
                opts = TritonOptions(
                    num_stages=stages, split_loop=((kname, split),) if split > 1 else ()
                )
                be = CudaBackend(cuda_cpp=False, triton_options=opts)
                try:
                    kern = be.load(be.compile(be.codegen(case.plan)))
                    t = be.from_numpy([x.astype(np.float32) for x in xs], dts)
                    out = kern(*t)[0].double().cpu().numpy()
                    ref = case.reference(*[x.double().cpu().numpy() for x in t])[0]
                    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                    us = cuda_graph_median(lambda kern=kern, t=t: kern.run_unchecked(t)).median_us
                except Exception as exc:
                    print(f"  {label} split {split} stages {stages}: {type(exc).__name__}: {exc}")
                    continue
                flag = "" if err < 3e-3 else f" WRONG {err:.1e}"
                print(f"  {label} split {split:2d} stages {stages}: {us:7.1f} µs{flag}", flush=True)
                if not flag and (best is None or us < best[0]):
                    best = (us, split, stages)
            print(f"  -> best {label}: {best}", flush=True)


if __name__ == "__main__":
    main()
