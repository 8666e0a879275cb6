"""What the safe-softmax exp clamp (``tl.exp(tl.minimum(x - m, 0.0))``) costs on the GPU.

Prints the fused GQA decode candidates' split printing with the clamp and the same text
without it, loads both, checks they agree on random inputs, and times them interleaved
(CUDA-graph replay medians). Run on a CUDA machine:
``python benchmarks/probes/clamp_cost_probe.py``.
"""

from __future__ import annotations

import importlib.util
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import triton.testing

import yirage as yr
import yirage_cuda
from yirage._workloads import get_workload

CLAMP = re.compile(r"tl\.exp\(tl\.minimum\((.+?) - (m\d+), 0\.0\)\)")


def load(text: str, name: str) -> Any:
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    be = yirage_cuda.register()
    w = get_workload("gqa_decode")
    for preset in ("gpu", "gpu_kv16384"):
        g = w.graph(preset)
        res = yr.search(g, backend="cuda", config="attention", deterministic=True, top_k=6)
        inputs = w.inputs(preset, device="cuda")
        for c in res.candidates[:4]:
            printed = be.codegen(c)
            src = printed.triton_variants.get("triton_split")
            if src is None or "tl.minimum(" not in src.text:
                continue
            clamped = load(src.text, f"clamped_{id(c)}")
            plain = load(CLAMP.sub(r"tl.exp(\1 - \2)", src.text), f"plain_{id(c)}")
            a, b = clamped.launch(inputs)[0], plain.launch(inputs)[0]
            same = torch.equal(a, b)
            times: dict[str, list[float]] = {"clamp": [], "plain": []}
            for _ in range(7):
                for tag, mod in (("clamp", clamped), ("plain", plain)):
                    run = lambda m=mod, x=inputs: m.launch(x)  # noqa: E731
                    times[tag].append(triton.testing.do_bench_cudagraph(run, rep=200))
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(
                f"{preset} {c.label[:70]}: clamp {med['clamp']:.2f} us, plain "
                f"{med['plain']:.2f} us ({(med['clamp'] / med['plain'] - 1) * 100:+.1f}%), "
                f"outputs identical: {same}",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
