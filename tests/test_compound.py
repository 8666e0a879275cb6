"""Compound-op builders: each evaluates to its float64 definition, refuses bad shapes with the
shape it expected, and is found fused by the search at CI size."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr

RNG = np.random.default_rng(7)


def _arr(*dims: int, scale: float = 1.0) -> np.ndarray:
    return RNG.standard_normal(dims) * scale


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _silu(a: np.ndarray) -> np.ndarray:
    return a / (1 + np.exp(-a))


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def _graph(*dims: tuple[int, ...]) -> tuple[yr.KernelGraph, list[yr.DTensor]]:
    g = yr.new_kernel_graph()
    return g, [g.new_input(d, yr.float32) for d in dims]


def test_rms_norm_linear_with_and_without_weight() -> None:
    x, w, s = _arr(4, 64), _arr(64, 32), _arr(64)
    g, (tx, tw, ts) = _graph((4, 64), (64, 32), (64,))
    g.mark_output(g.rms_norm_linear(tx, tw))
    g.mark_output(g.rms_norm_linear(tx, tw, weight=ts, eps=1e-5))
    plain, weighted = g.evaluate([x, w, s])
    np.testing.assert_allclose(plain, _rms(x, 1e-6) @ w, rtol=1e-9)
    np.testing.assert_allclose(weighted, (_rms(x, 1e-5) * s) @ w, rtol=1e-9)


@pytest.mark.parametrize("activation", ["silu", "relu"])
def test_gated_mlp(activation: str) -> None:
    x, w1, w2 = _arr(4, 64), _arr(64, 32), _arr(64, 32)
    g, (tx, t1, t2) = _graph((4, 64), (64, 32), (64, 32))
    g.mark_output(g.gated_mlp(tx, t1, t2, activation))
    (out,) = g.evaluate([x, w1, w2])
    act = _silu if activation == "silu" else (lambda a: np.maximum(a, 0))
    np.testing.assert_allclose(out, act(x @ w1) * (x @ w2), rtol=1e-9, atol=1e-12)


def test_lora_linear_scales_the_adapter() -> None:
    x, w, a, b = _arr(4, 64), _arr(64, 32), _arr(64, 8), _arr(8, 32)
    g, (tx, tw, ta, tb) = _graph((4, 64), (64, 32), (64, 8), (8, 32))
    g.mark_output(g.lora_linear(tx, tw, ta, tb, scale=0.5))
    (out,) = g.evaluate([x, w, a, b])
    np.testing.assert_allclose(out, x @ w + 0.5 * (x @ a) @ b, rtol=1e-9)


def test_gemm_softmax() -> None:
    a, b = _arr(4, 16), _arr(16, 32)
    g, (ta, tb) = _graph((4, 16), (16, 32))
    g.mark_output(g.gemm_softmax(ta, tb, scale=0.25))
    (out,) = g.evaluate([a, b])
    np.testing.assert_allclose(out, _softmax(0.25 * (a @ b)), rtol=1e-9)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_self_attention_grouped_queries(qk_norm: bool) -> None:
    """Two key/value heads with four query heads each along the rows (GQA)."""
    q, kt, v = _arr(2, 4, 16), _arr(2, 16, 64), _arr(2, 64, 16)
    g, (tq, tk, tv) = _graph((2, 4, 16), (2, 16, 64), (2, 64, 16))
    g.mark_output(g.self_attention(tq, tk, tv, qk_norm=qk_norm))
    (out,) = g.evaluate([q, kt, v])
    if qk_norm:
        q = _rms(q, 1e-6)
        kt = kt / np.sqrt((kt * kt).mean(axis=-2, keepdims=True) + 1e-6)
    want = _softmax((q @ kt) / math.sqrt(16)) @ v
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12)


def test_gemm_layernorm() -> None:
    x, w, s, b = _arr(4, 64), _arr(64, 32), _arr(32), _arr(32)
    g, (tx, tw, ts, tb) = _graph((4, 64), (64, 32), (32,), (32,))
    g.mark_output(g.gemm_layernorm(tx, tw, ts, tb, eps=1e-5))
    (out,) = g.evaluate([x, w, s, b])
    y = x @ w
    c = y - y.mean(axis=-1, keepdims=True)
    want = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5) * s + b
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12)


def test_builders_name_the_shape_they_expected() -> None:
    g, (x, w, w_bad) = _graph((4, 64), (64, 32), (32, 32))
    with pytest.raises(
        yr.ShapeError, match=r"\[\.\.\., m, k\] @ \[\.\.\., k, n\], got \[4, 64\] @ \[32, 32\]"
    ):
        g.rms_norm_linear(x, w_bad)
    with pytest.raises(yr.ShapeError, match="one shape"):
        g.gated_mlp(x, w, g.new_input((64, 16), yr.float32))
    with pytest.raises(yr.GraphError, match="choose from silu, gelu, relu"):
        g.gated_mlp(x, w, w, activation="swish")


def test_the_search_fuses_each_builder() -> None:
    """At CI size the best candidate of each block is one generated kernel (one pass over the
    weights), with the search preset the bench uses for that block."""
    cases = []
    g, (x, w) = _graph((8, 512), (512, 256))
    g.mark_output(g.rms_norm_linear(x, w))
    cases.append((g, None))
    g, (x, w1, w2) = _graph((8, 512), (512, 256), (512, 256))
    g.mark_output(g.gated_mlp(x, w1, w2))
    cases.append((g, "mlp"))
    g, (x, w, a, b) = _graph((8, 512), (512, 256), (512, 16), (16, 256))
    g.mark_output(g.lora_linear(x, w, a, b))
    cases.append((g, "lora"))
    g, (q, kt, v) = _graph((4, 4, 64), (4, 64, 512), (4, 512, 64))
    g.mark_output(g.self_attention(q, kt, v))
    cases.append((g, "attention"))
    g, (x, w, s, b) = _graph((8, 512), (512, 256), (256,), (256,))
    g.mark_output(g.gemm_layernorm(x, w, s, b))
    cases.append((g, "mlp"))
    g, (x, w) = _graph((8, 512), (512, 256))
    g.mark_output(g.gemm_softmax(x, w))
    cases.append((g, None))
    for graph, config in cases:
        res = yr.search(
            graph, backend="cpu", config=config, device_spec=REFERENCE_CPU, deterministic=True
        )
        best = res.candidates[0]
        one_kernel = best.label.startswith("custom[") and ";" not in best.label
        assert not best.baseline and one_kernel, (config, best.label)
