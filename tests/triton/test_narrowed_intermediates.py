"""Host code of printed plans: a float32 intermediate that a library kernel writes and only
16-bit library matmuls read is stored in their dtype (they would round it to that dtype
first anyway), and a library RMSNorm is one kernel writing that dtype (torch's own norm on
the CPU, where these tests run it; tests/cuda runs the Triton kernel)."""

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


def _norm_then_matmul(dtype: str, w_dtype: str | None = None, *, also_add: bool = False) -> Any:
    """rms_norm(X) into a float32 intermediate, then X_n @ W (and X_n + X_n as a second
    output where ``also_add``)."""
    pb = plans.PlanBuilder(f"fixture-narrow-{dtype}-{w_dtype}-{also_add}")
    x = pb.buf([8, 96], dtype, "input")
    w = pb.buf([96, 40], w_dtype or dtype, "input")
    y = pb.buf([8, 40], dtype, "output")
    y2 = pb.buf([8, 96], dtype, "output") if also_add else None
    xn = pb.buf([8, 96], "float32", "intermediate")
    pb.library("rms_norm", [x], xn, num_normalized_dims=1, eps=1e-6, has_weight=False)
    pb.library("matmul", [xn, w], y)
    if y2 is not None:
        pb.raw["kernels"].append(
            {
                "kind": "library",
                "op": "binary",
                "inputs": [xn, xn],
                "outputs": [y2],
                "params": {"op": "add"},
            }
        )
    return parse_plan(pb.plan), xn


def test_an_intermediate_only_16bit_matmuls_read_is_stored_in_their_dtype() -> None:
    from yirage_triton import narrowed_intermediates

    plan, xn = _norm_then_matmul("bfloat16")
    assert narrowed_intermediates(plan) == {xn: "bfloat16"}
    # float32 W: the matmul multiplies in float32
    assert narrowed_intermediates(_norm_then_matmul("float32")[0]) == {}
    assert narrowed_intermediates(_norm_then_matmul("float16", "float32")[0]) == {}
    # another reader wants the float32 values
    assert narrowed_intermediates(_norm_then_matmul("float16", also_add=True)[0]) == {}
    # a generated kernel reads it
    mixed = parse_plan(plans.mixed_library(8, 64, 64, dtype="float16").plan)
    assert narrowed_intermediates(mixed) == {}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_narrowed_printing_gives_the_float32_printings_values(dtype: str) -> None:
    import torch

    launch, src = host_launch(_norm_then_matmul(dtype)[0])
    assert f"_yr_rms_norm_rows(buf0, 1, None, 1e-06, torch.{dtype})" in src
    g = torch.Generator().manual_seed(0)
    td = getattr(torch, dtype)
    x = (torch.randn(8, 96, generator=g) * 30).to(td)
    w = (torch.randn(96, 40, generator=g) / 10).to(td)
    (out,) = launch([x, w])
    # the float32 printing: norm in float32, rounded to the dtype by the matmul
    want = torch.matmul(torch.nn.functional.rms_norm(x.float(), (96,), None, 1e-6).to(td), w)
    assert out.dtype == td and torch.equal(out, want)
