"""Diagnostics for the Triton printer: CUDA-graph replay time of hand-tiled fixture plans
(tests/cuda/plans.py) over tile sizes, loop splits, warps and pipeline depths, at the
TARGETS.md shapes. Tells which configurations the search and cost model should reach.

    python benchmarks/tile_sweep.py rmsnorm_linear gqa_decode

Needs a CUDA GPU, torch and triton.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "cuda"))
import plans

from yirage._bench._timing import cuda_graph_median
from yirage_cuda import CudaBackend
from yirage_cuda._triton_codegen import TritonOptions


def sweep_cases(name: str) -> list[tuple[str, plans.Case]]:
    out = []
    if name == "rmsnorm_linear":
        for tn, tk, w in itertools.product((64, 128, 256), (64, 128), (4,)):
            c = plans.rmsnorm_linear(b=8, h=4096, n=6144, tn=tn, tk=tk, dtype="float16", warps=w)
            out.append((f"tn={tn} tk={tk} warps={w}", c))
    elif name == "gated_mlp":
        for tn, tk, w in itertools.product((64, 128), (64, 128), (4,)):
            c = plans.gated_mlp(b=8, h=4096, n=4096, tn=tn, tk=tk, dtype="float16", warps=w)
            out.append((f"tn={tn} tk={tk} warps={w}", c))
    elif name == "gqa_decode":
        for tl in (32, 64, 128):
            c = plans.attention_fused(batch=16, rows=4, d=128, kv_len=4096, tl=tl, dtype="float16")
            out.append((f"fused tl={tl}", c))
    return out


def main() -> None:
    splits = (1, 2, 4, 8, 16, 32)
    for name in sys.argv[1:]:
        print(f"== {name} on {torch.cuda.get_device_name()}")
        for label, case in sweep_cases(name):
            xs = case.random_inputs(0)
            dts = [d for _, d in case.inputs]
            gen = [k for k in case.plan["kernels"] if k.get("kind", "generated") != "library"]
            loop = int(gen[0]["forloop_range"])
            kname = gen[0]["name"]
            best = None
            for split, stages in itertools.product(splits, (3, 5)):
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
                print(f"  {label} split {split:2d} stages {stages}: {us:7.1f} µs{flag}")
                if not flag and (best is None or us < best[0]):
                    best = (us, split, stages)
            print(f"  -> best {label}: {best}")


if __name__ == "__main__":
    main()
