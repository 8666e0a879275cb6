"""The search's baseline (a plan of library kernels alone) runs the torch calls PyTorch eager
runs for the same graph, in the graph's dtype: its outputs are bit-identical to eager's, so
choosing it is never slower than eager. Plans with a generated kernel keep float32
intermediates between library calls."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from yirage.plan import parse_plan

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import plans

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="torch and triton are not installed (pip install torch triton runs these tests)",
)


def _launch(raw: dict[str, Any]) -> Any:
    """The printed host function of ``raw`` (generated kernels print nothing here)."""
    import torch

    from yirage_triton import launcher_lines

    lines = launcher_lines(parse_plan(raw), lambda k, names: [f"pass  # kernel {k.name}"])
    src = "\n".join(lines)
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(src, "<host>", "exec"), scope)
    return scope["launch"], src


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
def test_the_baseline_is_bit_identical_to_eager(dtype: str) -> None:
    import torch

    launch, src = _launch(_rmsnorm_linear_plan(8, 96, 40, dtype))
    assert "float32" not in src  # no float32 copies of the 16-bit tensors
    g = torch.Generator().manual_seed(0)
    td = getattr(torch, dtype)
    x = torch.randn(8, 96, generator=g).to(td)
    w = (torch.randn(96, 40, generator=g) / 10).to(td)
    (out,) = launch([x, w])
    want = torch.nn.functional.rms_norm(x, (96,), eps=1e-6) @ w
    assert out.dtype == td and torch.equal(out, want)


def test_a_plan_with_a_generated_kernel_keeps_float32_intermediates() -> None:
    _, src = _launch(plans.mixed_library(8, 64, 64, dtype="float16").plan)
    assert "_yr_matmul_fp32" in src  # 16-bit operands into a float32 intermediate
    assert ".to(torch.float32)" in src
