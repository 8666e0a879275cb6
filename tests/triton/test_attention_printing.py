"""Attention with one head per block in the Triton printer: the softmax weights a 16-bit dot
reads are rounded once for every reader (run in the Triton interpreter against float64
numpy), and the shift is compiled without multiply-add contraction."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import plans
from _interp_backend import interp_backend, needs_triton, private_cache

pytestmark = needs_triton

F16_MAX = 65504.0


_private_cache = private_cache("yirage-attention-cache")


def _backend(**options: Any) -> Any:
    return interp_backend("attentiontest", **options)


def _run(case: plans.Case, xs: list[np.ndarray], **options: Any) -> tuple[np.ndarray, str]:
    be = _backend(**options)
    printed = be.codegen(case.plan)
    kernel = be.load(be.compile(printed))
    tensors = be.from_numpy(xs, [d for _, d in case.inputs])
    (out,) = kernel(*tensors)
    return out.double().numpy(), printed.triton.text


def _near_the_top_of_float16(case: plans.Case) -> list[np.ndarray]:
    """One query row whose scores give the first key weight 1 and every other key a weight
    just above 1/2 that float16 rounds up by almost half a unit; every value is float16's
    largest. The output is that largest value: its weights sum to their own total."""
    (_, rows, d), _ = case.inputs[0]
    kv = case.inputs[1][0][2]
    # a score a·b (float16 factors, exact in float32) whose weight exp(a·b) lies just above
    # a float16 rounding midpoint
    a = np.arange(0.9, 1.1, 2.0**-10, dtype=np.float16)
    b = np.arange(-0.77, -0.63, 2.0**-11, dtype=np.float16)
    s = np.outer(a.astype(np.float32), b.astype(np.float32))
    w = np.exp(s)
    gap = (w.astype(np.float16).astype(np.float32) - w) / w
    i, j = np.unravel_index(np.argmax(gap), gap.shape)
    assert gap[i, j] > 4e-4
    q = np.zeros((1, rows, d))
    q[0, :, 0] = a[i]
    kt = np.zeros((1, d, kv))
    kt[0, 0, 1:] = b[j]
    v = np.full((1, kv, d), F16_MAX)
    return [q, kt, v]


def test_softmax_weights_are_rounded_once_for_the_dot_and_the_sum() -> None:
    """Rounding the weights to float16 for the dot but summing them unrounded put the
    quotient up to 5e-4 above the largest value: inf in float16 where float64 gives 65504."""
    case = plans.attention_fused(batch=1, rows=16, d=16, kv_len=128, tl=32, dtype="float16")
    xs = _near_the_top_of_float16(case)
    (want,) = case.reference(*[x.astype(np.float16).astype(np.float64) for x in xs])
    assert np.isfinite(want).all() and np.allclose(want, F16_MAX)
    got, text = _run(case, xs)
    assert ".to(tl.float16).to(tl.float32)" in text
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() / F16_MAX <= 1e-3


def test_softmax_kernels_are_compiled_without_contraction_where_asked() -> None:
    """A contracted ``s * c - max(s * c)`` misses zero at the maximum by tens at scores of
    1e8 (measured on an H100: whole rows of NaN); only kernels with a safe-softmax group
    are compiled without contraction."""
    from yirage_triton import TritonOptions, generate_triton

    attention = plans.attention_fused(batch=2, rows=16, d=32, kv_len=64, tl=16).plan
    exact = generate_triton(attention, TritonOptions(exact_softmax_shift=True)).text
    assert exact.count("enable_fp_fusion=False") == 2  # the launch and the warm-up
    assert "'enable_fp_fusion': False" in exact  # KERNELS, for ahead-of-time compiles
    assert "enable_fp_fusion" not in generate_triton(attention, TritonOptions()).text
    mlp = generate_triton(plans.gated_mlp().plan, TritonOptions(exact_softmax_shift=True))
    assert "enable_fp_fusion" not in mlp.text


def test_self_contained_softmax_raises_scores_in_base_two() -> None:
    """A group whose max stays in the kernel multiplies each score once by scale·log2(e)
    and raises it with exp2 (its split parts rescale with exp2 too); a group that stores
    its max for another kernel keeps natural units, which that kernel's exp reads."""
    from yirage_triton import TritonOptions, generate_triton

    scale = 0.125
    fused = generate_triton(plans.attention_fused(scale=scale).plan).text
    assert "tl.exp(" not in fused
    assert f"* {scale * math.log2(math.e)!r}" in fused
    assert f"* {scale!r}" not in fused  # the scale is not printed apart from the fold
    split = generate_triton(
        plans.attention_fused(scale=scale).plan, TritonOptions(split_loop=(("attn", 2),))
    ).text
    assert "tl.exp(" not in split and "tl.exp2(" in split
    stored = generate_triton(plans.gqa_decode().plan).text
    assert "tl.exp2(" not in stored


def test_base_two_scores_match_float64_at_large_scales() -> None:
    """Scores of ±60·d after the scale: the base-2 shift stays exact at the row max."""
    case = plans.attention_fused(batch=2, rows=8, d=32, kv_len=256, tl=32, scale=60.0)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(dims) for dims, _ in case.inputs]
    (want,) = case.reference(*xs)
    got, text = _run(case, xs)
    assert "tl.exp2(" in text
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_a_unit_batch_dim_is_folded_into_the_rows() -> None:
    """Tiles [1, rows, d] of [B, A, d] buffers print as 2-D tiles of [B·A, d] views: no
    reshape around the dots, the batch offset A rows per batch (run against float64 in
    the interpreter over three batches); a masked row dim folds too, its mask compared with
    its own batch's end; a masked batch dim keeps the 3-D printing."""
    from yirage.plan import MaskedDim, parse_plan
    from yirage_triton import generate_triton
    from yirage_triton._fold import fold_unit_batch

    case = plans.attention_fused(batch=3, rows=16, d=16, kv_len=64, tl=16, scale=0.5)
    plan = parse_plan(case.plan)
    (k,) = plan.generated
    view, folded = fold_unit_batch(plan, k)
    assert {len(o.dims) for o in folded.ops} == {2}
    assert view.buffer(k.inputs[0].buffer).dims == (3 * 16, 16)
    assert plan.buffer(k.inputs[0].buffer).dims == (3, 16, 16)  # the plan itself is kept
    text = generate_triton(case.plan).text
    assert "tl.reshape" not in text and "bx * 16" in text
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(dims) for dims, _ in case.inputs]
    (want,) = case.reference(*xs)
    got, _ = _run(case, xs)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    from yirage_triton._fold import FoldedMask

    edge = replace(k.inputs[0], masked=(MaskedDim(1, 16),))
    _, rows = fold_unit_batch(plan, replace(k, inputs=(edge, *k.inputs[1:])))
    (m,) = rows.inputs[0].masked
    assert isinstance(m, FoldedMask) and (m.dim, m.extent) == (0, 16)
    assert [(t.var, t.stride) for t in m.base] == [("bx", 16)]  # 16 rows per batch
    edge = replace(k.inputs[0], masked=(MaskedDim(0, 3),))
    batch = replace(k, inputs=(edge, *k.inputs[1:]))
    assert fold_unit_batch(plan, batch) == (plan, batch)
