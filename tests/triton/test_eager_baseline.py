"""The search's baseline (a plan of library kernels alone) is printed twice: with float32
intermediates (the graph's values where a 16-bit intermediate would overflow) and *eagerly*,
the torch calls PyTorch eager runs for the same graph in the graph's dtype, bit-identical to
eager. The backend races both as variants; plans with a generated kernel print only the
float32 form."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from _interp_backend import host_launch, needs_triton

from yirage.plan import parse_plan

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import plans

pytestmark = needs_triton


def _rmsnorm_linear_plan(b: int, h: int, n: int, dtype: str) -> dict[str, Any]:
    """rms_norm then matmul as library kernels, the intermediate declared float32 (as the
    core's lowering declares it)."""
    pb = plans.PlanBuilder(f"fixture-baseline-{b}x{h}x{n}-{dtype}")
    x, w = pb.buf([b, h], dtype, "input"), pb.buf([h, n], dtype, "input")
    y = pb.buf([b, n], dtype, "output")
    xn = pb.buf([b, h], "float32", "intermediate")
    pb.library("rms_norm", [x], xn, num_normalized_dims=1, eps=1e-6, has_weight=False)
    pb.library("matmul", [xn, w], y)
    return pb.plan


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_eager_printing_is_bit_identical_to_eager(dtype: str) -> None:
    import torch

    launch, src = host_launch(_rmsnorm_linear_plan(8, 96, 40, dtype), eager_library=True)
    assert "float32" not in src  # no float32 copies of the 16-bit tensors
    g = torch.Generator().manual_seed(0)
    td = getattr(torch, dtype)
    x = torch.randn(8, 96, generator=g).to(td)
    w = (torch.randn(96, 40, generator=g) / 10).to(td)
    (out,) = launch([x, w])
    want = torch.nn.functional.rms_norm(x, (96,), eps=1e-6) @ w
    assert out.dtype == td and torch.equal(out, want)


def test_the_float32_printing_keeps_a_finite_value_that_eager_loses() -> None:
    """square(x) * z with x = 300 (90000 overflows float16) and z = 0: the eager printing
    gives NaN (inf * 0), the float32 one the graph's value 0."""
    import torch

    pb = plans.PlanBuilder("fixture-baseline-overflow")
    x, z = pb.buf([1, 4], "float16", "input"), pb.buf([1, 4], "float16", "input")
    y = pb.buf([1, 4], "float16", "output")
    sq = pb.buf([1, 4], "float32", "intermediate")
    for op, ins, out, name in (("unary", [x], sq, "square"), ("binary", [sq, z], y, "mul")):
        kernel = {"kind": "library", "op": op, "inputs": ins, "outputs": [out]}
        pb.raw["kernels"].append({**kernel, "params": {"op": name}})
    inputs = [
        torch.full((1, 4), 300.0, dtype=torch.float16),
        torch.zeros(1, 4, dtype=torch.float16),
    ]
    (fp32,) = host_launch(pb.plan, eager_library=False)[0](inputs)
    (eager,) = host_launch(pb.plan, eager_library=True)[0](inputs)
    assert torch.isnan(eager).all()
    assert torch.equal(fp32, torch.zeros(1, 4, dtype=torch.float16))


def test_only_a_library_plan_gets_the_eager_variant() -> None:
    from yirage_triton import TritonOptions, TritonTarget, is_library_plan
    from yirage_triton._backend import TritonBackend

    lib = parse_plan(_rmsnorm_linear_plan(8, 96, 40, "float16"))
    mixed = parse_plan(plans.mixed_library(8, 64, 64, dtype="float16").plan)
    assert is_library_plan(lib) and not is_library_plan(mixed)

    class Thin(TritonBackend):
        name = "thin"
        target = TritonTarget("thin", "cuda", variant_families=frozenset())

        def compute_units(self) -> int:
            return 100

    be = Thin(interpret=True)
    assert set(be.printings(lib, TritonOptions())) == {"triton_eager"}
    assert "triton_eager" not in be.printings(mixed, TritonOptions())
    _, src = host_launch(plans.mixed_library(8, 64, 64, dtype="float16").plan, eager_library=True)
    assert "_yr_matmul_fp32" in src  # mixed plans keep float32 intermediates
