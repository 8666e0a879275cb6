"""GPU: superoptimized softmax and attention stay finite at logits past the exp overflow of
their dtype (``pytest -m cuda tests/cuda/test_gpu_overflow.py``; needs the device)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import yirage as yr

pytestmark = pytest.mark.cuda


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax_of_large_logits_on_the_gpu(gpu: Any, dtype: str) -> None:
    import torch

    g = yr.new_kernel_graph()
    x = g.new_input((64, 1024), getattr(yr, dtype))
    g.mark_output(g.softmax(x))
    xs = torch.randn(64, 1024, device="cuda", dtype=getattr(torch, dtype)) * 40
    x64 = xs.double().cpu().numpy()
    ref = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    for _ in range(3):
        k = g.superoptimize(backend="cuda", cache=False)
        (out,) = k(xs)
        got = out.double().cpu().numpy()
        assert np.isfinite(got).all(), str(k.report)
        assert _rel(got, ref) < (1e-5 if dtype == "float32" else 2e-3), str(k.report)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_with_large_scores_on_the_gpu(gpu: Any, dtype: str) -> None:
    import torch

    g = yr.new_kernel_graph()
    dt = getattr(yr, dtype)
    q = g.new_input((32, 16, 64), dt)
    kt = g.new_input((32, 64, 4096), dt)
    v = g.new_input((32, 4096, 64), dt)
    g.mark_output(g.matmul(g.softmax(g.matmul(q, kt)), v))
    k = g.superoptimize(backend="cuda", cache=False)
    tdt = getattr(torch, dtype)
    ins = [torch.randn(*t.dims, device="cuda", dtype=tdt) * 3 for t in g.inputs]
    q64, k64, v64 = (t.double().cpu().numpy() for t in ins)
    s = q64 @ k64
    assert s.max() > 150
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = (p / p.sum(axis=-1, keepdims=True)) @ v64
    (out,) = k(*ins)
    got = out.double().cpu().numpy()
    assert np.isfinite(got).all(), str(k.report)
    assert _rel(got, ref) < (1e-4 if dtype == "float32" else 2e-2), str(k.report)
