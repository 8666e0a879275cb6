"""What each part of the printed fused-attention kernel costs: the kernel yirage prints for
attention prefill at 4096 queries (its best-ranked plan, the CUDA backend's default options),
and that text with one edit each, timed side by side on one GPU (CUDA-graph medians over
interleaved rounds). A diagnostic of the printer, not a bench; edits that drop a numeric
safeguard are timed only, never used: `python benchmarks/attention_print_edits.py`."""

import re

import torch
from triton_kernel_forms import bench

import yirage as yr
from yirage._workloads import get_workload
from yirage.plan import parse_plan
from yirage_cuda import CudaBackend
from yirage_triton import CODEGEN_VERSION, generate_triton
from yirage_triton._toolchain import load_triton_module, write_triton_module

_GROUPED = r"pid = .*\n.*first = .*\n.*size = .*\n.*local = .*\n.*bx = .*\n.*by = .*\n"


def main() -> None:
    be = CudaBackend()
    wl = get_workload("attention_prefill")
    res = yr.search(wl.graph("prefill_4096"), backend=be)
    ins = wl.inputs("prefill_4096", device="cuda")
    plan = parse_plan(res.candidates[0].kernel_plan().to_dict())
    base = generate_triton(plan, be.default_options(plan)).text
    forms = {
        "as printed": base,
        "with contraction": base.replace(", enable_fp_fusion=False", "").replace(
            "'enable_fp_fusion': False", ""
        ),
        "no clamp of the shift": re.sub(r"tl\.minimum\((x\d+ - m\d+), 0\.0\)", r"\1", base),
        "no rounding before the sum": base.replace(".to(tl.float16).to(tl.float32)", ""),
        "no grouped tile order": re.sub(
            _GROUPED, "bx = tl.program_id(0)\n    by = tl.program_id(1)\n", base
        ),
    }
    unchanged = [name for name, text in forms.items() if text == base and name != "as printed"]
    if unchanged:
        raise SystemExit(f"these edits no longer apply to the printing: {unchanged}")
    paths = {name: write_triton_module(text, CODEGEN_VERSION) for name, text in forms.items()}
    mods = {name: load_triton_module(path) for name, path in paths.items()}
    times: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(3):
        for name, mod in mods.items():
            times[name].append(bench(lambda m=mod: m.launch(ins)))
    print(torch.cuda.get_device_name(), res.candidates[0])
    for name, ts in times.items():
        print(f"{name}: {sorted(ts)[1]:.1f} us")


if __name__ == "__main__":
    main()
