"""Regenerate the plan fixtures of this folder with the installed core (run it after a plan
format change: ``python tests/cpu/plans/regenerate.py``); never edit their numbers by hand.

``rmsnorm_matmul.json`` is the example of docs/kernel-plan.md: ``rms_norm(X[8, 512]) @
W[512, 768]`` as one generated kernel of 48 blocks looping 16 times over the 512, lowered for
the CPU backend's default DeviceSpec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yirage as yr
from yirage import _core

HERE = Path(__file__).parent
#: The DeviceSpec the fixtures are lowered for (a CPU: no loop split).
CPU = {
    "compute_units": 2,
    "warp_size": 1,
    "max_threads_per_block": 1,
    "shared_mem_per_block": 1048576,
    "l2_bytes": 33554432,
    "mem_bandwidth_gbps": 20.0,
    "peak_tflops_fp16": 0.1,
    "peak_tflops_fp32": 0.1,
    "matrix_tile": None,
    "vendor": "cpu",
}


def rmsnorm_matmul() -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(8, 512), dtype=yr.float32)
    w = g.new_input(dims=(512, 768), dtype=yr.float32)
    tb = yr.new_threadblock_graph(
        grid_dim=(48, 1, 1), block_dim=(128, 1, 1), forloop_range=16, reduction_dimx=1
    )
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(bx, bw))
    tb.new_output(tb.div(acc, tb.forloop_accum(bx, "rms", eps=1e-6)), output_map=(1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g


def _text(plan: dict[str, Any]) -> str:
    """The plan as JSON with one buffer, input, op or output per line (readable diffs)."""

    def obj(o: dict[str, Any], pad: str) -> str:
        rows = []
        for key, val in o.items():
            if isinstance(val, list) and val and all(isinstance(x, dict) for x in val):
                items = f",\n{pad}  ".join(json.dumps(x) for x in val)
                rows.append(f"{json.dumps(key)}: [\n{pad}  {items}\n{pad}]")
            else:
                rows.append(f"{json.dumps(key)}: {json.dumps(val)}")
        return "{" + f",\n{pad}".join(rows) + "}"

    kernels = ",\n  ".join(obj(k, "   ") for k in plan["kernels"])
    head = obj({k: v for k, v in plan.items() if k != "kernels"}, " ")
    return head[:-1] + f',\n "kernels": [\n  {kernels}\n ]}}\n'


def main() -> None:
    plan = json.loads(_core.kernel_plan(rmsnorm_matmul()._g, json.dumps(CPU)))
    text = _text(plan)
    assert json.loads(text) == plan
    (HERE / "rmsnorm_matmul.json").write_text(text)


if __name__ == "__main__":
    main()
