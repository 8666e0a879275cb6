"""Diagnostics: what qknorm_gqa's key norms cost inside the fused kernel. Prints the top
candidate's kernel (split, scaled), whose sum of squares over d is two ``tl.dot`` with a ones
matrix in tf32, then times edited copies of its source that sum with two bfloat16 dots
(high and low part), one bfloat16 dot, or ``tl.sum``.

    python benchmarks/probes/qknorm_probe.py --splits 8 16

Needs a CUDA GPU, torch and triton; CUDA-graph replay medians as in the benchmark report.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import torch

import yirage as yr
from yirage import _workloads
from yirage._bench._timing import cuda_graph_median
from yirage_cuda._plan import parse_plan
from yirage_cuda._toolchain import device_info, load_triton_module
from yirage_cuda._triton_codegen import TritonOptions, generate_triton

DOT_SUM = re.compile(
    r"(?P<ind> +)(?P<out>t\d+) = tl\.reshape\(tl\.dot\((?P<ones>tl\.full\(\[\d+, \d+\], "
    r"1\.0, )tl\.float32\), (?P<s>s\d+), input_precision='tf32'\), (?P<shape>\[[\d, ]+\])\)\n"
)


def variants(text: str) -> dict[str, str]:
    """The printed kernel (key norms summed by a tf32 dot) and copies summing them by two
    bfloat16 dots (high and low part), one bfloat16 dot, or tl.sum (the printing before)."""
    m = DOT_SUM.search(text)
    if m is None:
        raise SystemExit("the printed kernel sums no squares with tl.dot; nothing to edit")
    ind, s, out, ones, shape = m["ind"], m["s"], m["out"], m["ones"], m["shape"]

    def sub(expr: str) -> str:
        return text[: m.start()] + f"{ind}{out} = {expr}\n" + text[m.end() :]

    rows = shape.strip("[]").split(", ")
    return {
        "printed_tf32": text,
        "bf16_hi_lo": sub(
            f"tl.reshape(tl.dot({ones}tl.bfloat16), ({s} - {s}.to(tl.bfloat16).to(tl.float32))"
            f".to(tl.bfloat16), tl.dot({ones}tl.bfloat16), {s}.to(tl.bfloat16))), {shape})"
        ),
        "bf16_one_dot": sub(
            f"tl.reshape(tl.dot({ones}tl.bfloat16), {s}.to(tl.bfloat16)), {shape})"
        ),
        "tl_sum": sub(
            f"tl.broadcast_to(tl.reshape(tl.sum({s}, axis=0, keep_dims=True), "
            f"[1, 1, {rows[-1]}]), {shape})"
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, nargs="+", default=[16])
    ap.add_argument("--show", action="store_true", help="print each edited source")
    a = ap.parse_args()
    w = _workloads.get_workload("qknorm_gqa")
    res = yr.search(w.graph("gpu"), backend="cuda", config=w.search_config, top_k=1, cache=False)
    cand = res.candidates[0]
    plan = parse_plan(json.loads(cand.kernel_plan().to_json()))
    xs = w.inputs("gpu", device="cuda")
    ref = w.reference(*[x.double() for x in xs])[0]
    print(f"qknorm_gqa on {torch.cuda.get_device_name()}: {cand}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="qknorm_probe_"))
    smem = device_info().smem_per_block_optin
    for split in a.splits:
        names = tuple((k.name, split) for k in plan.generated)
        opts = TritonOptions(smem_limit=smem, split_loop=names, scale_after_dot=True)
        for name, text in variants(generate_triton(plan, opts).text).items():
            if a.show:
                print(text)
            path = tmp / f"qk_{split}_{name}.py"
            path.write_text(text)
            try:
                mod = load_triton_module(path)
                out = mod.launch(list(xs))[0]
                torch.cuda.synchronize()
                err = float((out.double() - ref).norm() / ref.norm())
                us = cuda_graph_median(lambda mod=mod: mod.launch(list(xs))).median_us
            except Exception as exc:  # a probe reports and goes on
                print(f"  split {split:2d} {name:16s}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            print(f"  split {split:2d} {name:16s}: {us:6.1f} µs  rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
