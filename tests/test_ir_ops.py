"""IR ops for real model blocks: add_scalar, permute/transpose, reshape, reduce_max, layer_norm
(a compound of primitives) and RoPE written with chunk/neg/concat/mul/add. Each is checked against a
float64 numpy reference in the evaluator and on the CPU backend, by fingerprints that must
agree and must disagree, and by errors that name the fix."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr

RNG = np.random.default_rng(31)
FAST_PROFILE = {"min_time_s": 0.01, "min_repeats": 3}
cpu_backend = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="torch and triton are not installed",
)


def _graph(*dims: tuple[int, ...]) -> tuple[yr.KernelGraph, list[yr.DTensor]]:
    g = yr.new_kernel_graph()
    return g, [g.new_input(d, yr.float32) for d in dims]


def _layer_norm(x: np.ndarray, n: int, w: Any = 1.0, b: Any = 0.0, eps: float = 1e-5) -> Any:
    axes = tuple(range(x.ndim - n, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rel(a: Any, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# -- add_scalar ---------------------------------------------------------------------------------


def test_add_scalar_evaluates_and_is_exact_in_fingerprints() -> None:
    g, (x,) = _graph((4, 8))
    g.mark_output(g.add_scalar(g.add_scalar(x, 0.5), -0.25))
    a = RNG.standard_normal((4, 8))
    np.testing.assert_array_equal(g.evaluate([a])[0], a + 0.5 - 0.25)
    h, (y,) = _graph((4, 8))
    h.mark_output(g_add := h.add_scalar(y, 0.25))
    assert g_add.dims == (4, 8)
    assert yr.equivalent(g, h)
    k, (z,) = _graph((4, 8))
    k.mark_output(k.add_scalar(z, 0.5))
    assert not yr.equivalent(g, k)
    with pytest.raises(yr.GraphError, match="scalar"):
        k.add_scalar(z, float("nan"))


def test_key_norm_of_qk_norm_attention_uses_eps() -> None:
    """The transposed keys are normalised as k / sqrt(mean(k²) + eps) now that the IR has a
    scalar add."""
    q, kt, v = (RNG.standard_normal(d) * 0.05 for d in ((2, 4, 16), (2, 16, 32), (2, 32, 16)))
    g, (tq, tk, tv) = _graph((2, 4, 16), (2, 16, 32), (2, 32, 16))
    g.mark_output(g.self_attention(tq, tk, tv, qk_norm=True, eps=1e-3))
    (out,) = g.evaluate([q, kt, v])
    qn = q / np.sqrt((q * q).mean(-1, keepdims=True) + 1e-3)
    kn = kt / np.sqrt((kt * kt).mean(-2, keepdims=True) + 1e-3)
    s = qn @ kn / 4.0
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-9, atol=1e-12)


# -- permute / transpose / reshape ---------------------------------------------------------------


def test_permute_transpose_reshape_evaluate() -> None:
    g, (x,) = _graph((2, 3, 4))
    g.mark_output(g.permute(x, (2, 0, 1)))
    g.mark_output(g.transpose(x, -1, -2))
    g.mark_output(g.reshape(g.transpose(x, 0, 1), (3, 8)))
    a = RNG.standard_normal((2, 3, 4))
    p, t, r = g.evaluate([a])
    np.testing.assert_array_equal(p, a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t, a.swapaxes(-1, -2))
    np.testing.assert_array_equal(r, a.swapaxes(0, 1).reshape(3, 8))
    back = yr.KernelGraph.from_json(g.to_json())
    assert back.to_json() == g.to_json() and back.hash() == g.hash()


def _permuted(perms: list[tuple[int, ...]]) -> yr.KernelGraph:
    g, (x,) = _graph((3, 3, 3))
    for p in perms:
        x = g.permute(x, p)
    g.mark_output(g.mul_scalar(x, 1.0))
    return g


def test_permute_fingerprints_agree_and_disagree() -> None:
    identity = _permuted([])
    assert yr.equivalent(identity, _permuted([(1, 2, 0), (2, 0, 1)]))  # p then p⁻¹
    assert not yr.equivalent(identity, _permuted([(1, 2, 0), (1, 2, 0)]))  # p twice
    assert not yr.equivalent(_permuted([(1, 0, 2)]), _permuted([(0, 2, 1)]))
    g, (x,) = _graph((2, 3, 4))
    g.mark_output(g.mul_scalar(g.reshape(g.reshape(x, (4, 6)), (2, 3, 4)), 1.0))
    h, (y,) = _graph((2, 3, 4))
    h.mark_output(h.mul_scalar(y, 1.0))
    assert yr.equivalent(g, h)
    r, (z,) = _graph((2, 3, 4))
    r.mark_output(r.reshape(z, (2, 4, 3)))
    t, (w,) = _graph((2, 3, 4))
    t.mark_output(t.transpose(w, 1, 2))
    assert not yr.equivalent(r, t)  # same dims, elements in other places


def test_layout_errors_name_the_fix() -> None:
    g, (x,) = _graph((2, 3, 4))
    with pytest.raises(yr.ShapeError, match=r"exactly once, e\.g\. \[2, 1, 0\]"):
        g.permute(x, (0, 0, 1))
    with pytest.raises(yr.ShapeError, match="exactly once"):
        g.permute(x, (1, 0))
    with pytest.raises(yr.ShapeError, match="out of range"):
        g.transpose(x, 0, 3)
    with pytest.raises(yr.ShapeError, match="choose dims whose product is 24"):
        g.reshape(x, (5, 5))


# -- reduce_max --------------------------------------------------------------------------------


def test_reduce_max_matches_numpy_and_the_safe_softmax_is_the_softmax() -> None:
    g, (x,) = _graph((3, 5, 7))
    g.mark_output(g.reduce_max(x, 1))
    g.mark_output(g.reduce_max(x, -1))
    a = RNG.standard_normal((3, 5, 7))
    a[0, 0, 0] = np.nan
    m1, m2 = g.evaluate([a])
    np.testing.assert_array_equal(m1, np.max(a, axis=1, keepdims=True))
    np.testing.assert_array_equal(m2, np.max(a, axis=-1, keepdims=True))
    s, (y,) = _graph((4, 16))
    e = s.exp(s.sub(y, s.reduce_max(y, -1)))
    s.mark_output(s.div(e, s.reduction(e, -1)))
    p, (z,) = _graph((4, 16))
    p.mark_output(p.softmax(z, -1))
    assert yr.equivalent(s, p)
    q, (w,) = _graph((4, 16))
    q.mark_output(q.reduce_max(w, 0))  # another dim
    r, (v,) = _graph((4, 16))
    r.mark_output(r.reduction(v, 0))
    assert not yr.equivalent(q, r)
    with pytest.raises(yr.ShapeError, match="out of range"):
        q.reduce_max(w, 2)


# -- layer_norm ---------------------------------------------------------------------------------


def test_layer_norm_matches_numpy() -> None:
    g, (x, w, b, w2) = _graph((3, 4, 16), (16,), (1, 16), (4, 16))
    g.mark_output(g.layer_norm(x, 16, w, b))
    g.mark_output(g.layer_norm(x, (4, 16), w2, eps=1e-3))
    g.mark_output(g.layer_norm(x, (16,), eps=0.0))
    a, wa, ba, w2a = (RNG.standard_normal(d) for d in ((3, 4, 16), (16,), (1, 16), (4, 16)))
    a = a * 3.0 + 1.5  # a mean and a scale the norm must remove
    one, two, plain = g.evaluate([a, wa, ba, w2a])
    np.testing.assert_allclose(one, _layer_norm(a, 1, wa, ba), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(two, _layer_norm(a, 2, w2a, eps=1e-3), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(plain, _layer_norm(a, 1, eps=0.0), rtol=1e-9, atol=1e-12)


def test_layer_norm_fingerprint_equals_the_written_out_formula() -> None:
    """rms_norm of the centred value against mean/var/rsqrt(var + eps) written out: the field
    models both exactly (the root is of a value the sign analysis proves > 0)."""
    g, (x,) = _graph((8, 64))
    g.mark_output(g.layer_norm(x, 64, eps=1e-5))
    h, (y,) = _graph((8, 64))
    c = h.sub(y, h.mul_scalar(h.reduction(y, -1), 1 / 64))
    var = h.mul_scalar(h.reduction(h.square(c), -1), 1 / 64)
    h.mark_output(h.mul(c, h.rsqrt(h.add_scalar(var, 1e-5))))
    assert yr.equivalent(g, h)
    k, (z,) = _graph((8, 64))
    k.mark_output(k.layer_norm(z, 64, eps=1e-6))
    assert not yr.equivalent(g, k)
    r, (u,) = _graph((8, 64))
    r.mark_output(r.rms_norm(u, 64, eps=1e-5))  # no centring
    assert not yr.equivalent(g, r)


def test_layer_norm_errors_name_the_fix() -> None:
    g, (x, w_bad) = _graph((4, 16), (8,))
    with pytest.raises(yr.ShapeError, match=r"must be a suffix .* e\.g\. normalized_shape=\[16\]"):
        g.layer_norm(x, (4,))
    with pytest.raises(yr.GraphError, match=r"eps \(-1e-05\) must be ≥ 0"):
        g.layer_norm(x, 16, eps=-1e-5)
    with pytest.raises(yr.ShapeError, match=r"bias must have dims normalized_shape \[16\]"):
        g.layer_norm(x, 16, bias=w_bad)
    with pytest.raises(yr.ShapeError, match=r"\[\.\.\., m, k\] @ \[\.\.\., k, n\]"):
        g.gemm_layernorm(x, w_bad)


def test_gemm_layernorm_matches_numpy() -> None:
    x, w, s, b = RNG.standard_normal((4, 32)), RNG.standard_normal((32, 16)), *RNG.random((2, 16))
    g, (tx, tw, ts, tb) = _graph((4, 32), (32, 16), (16,), (16,))
    g.mark_output(g.gemm_layernorm(tx, tw, ts, tb, eps=1e-5))
    (out,) = g.evaluate([x, w, s, b])
    np.testing.assert_allclose(out, _layer_norm(x @ w, 1, s, b), rtol=1e-9, atol=1e-12)


# -- RoPE ---------------------------------------------------------------------------------------


def _rope_graph(heads: int, seq: int, d: int) -> yr.KernelGraph:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = concat(-x2, x1)`` (the halves
    of the head dim), as in Llama; cos/sin tables are inputs [seq, d]."""
    g, (x, cos, sin) = _graph((heads, seq, d), (seq, d), (seq, d))
    x1, x2 = g.chunk(x, 2, -1)
    rotated = g.concat([g.neg(x2), x1], -1)
    g.mark_output(g.add(g.mul(x, cos), g.mul(rotated, sin)))
    return g


def _rope_inputs(heads: int, seq: int, d: int) -> list[np.ndarray]:
    inv = 10000.0 ** (-np.arange(0, d, 2) / d)
    ang = np.arange(seq)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], -1)
    x = RNG.standard_normal((heads, seq, d)).astype(np.float32)
    return [x, np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]


def _rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> Any:
    x = x.astype(np.float64)
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def test_rope_evaluates_to_its_definition() -> None:
    xs = _rope_inputs(2, 8, 16)
    (out,) = _rope_graph(2, 8, 16).evaluate(xs)
    np.testing.assert_allclose(out, _rope_ref(*xs), rtol=1e-12, atol=1e-12)
    # RoPE preserves norms (up to the float32 rounding of the cos/sin tables)
    np.testing.assert_allclose(
        np.linalg.norm(out, axis=-1), np.linalg.norm(xs[0], axis=-1), rtol=1e-6
    )


# -- the CPU backend and the Triton interpreter --------------------------------------------------


def _layout_graph() -> yr.KernelGraph:
    """transpose, reshape, add_scalar, reduce_max and layer_norm in one graph (library
    kernels)."""
    g, (x, w, b) = _graph((4, 8, 16), (32,), (32,))
    t = g.reshape(g.transpose(x, 0, 1), (8, 4, 16))
    y = g.add_scalar(g.reshape(t, (8, 2, 32)), 0.5)
    y = g.sub(y, g.reduce_max(y, 1))
    g.mark_output(g.layer_norm(y, 32, w, b))
    return g


def _layout_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> Any:
    y = x.astype(np.float64).swapaxes(0, 1).reshape(8, 2, 32) + 0.5
    return _layer_norm(y - y.max(axis=1, keepdims=True), 1, w, b)


def _layout_inputs() -> list[np.ndarray]:
    return [RNG.standard_normal(d).astype(np.float32) for d in ((4, 8, 16), (32,), (32,))]


@cpu_backend
@pytest.mark.parametrize("case", ["layout", "rope"])
def test_cpu_backend_runs_the_new_ops(case: str) -> None:
    """Layout ops and reduce_max run through the CPU backend's library path (the search
    splits the graph at them); whatever superoptimize picks matches float64."""
    g, xs, ref = (
        (_layout_graph(), _layout_inputs(), _layout_ref)
        if case == "layout"
        else (_rope_graph(2, 8, 16), _rope_inputs(2, 8, 16), _rope_ref)
    )
    k = yr.superoptimize(
        g,
        backend="cpu",
        config="mlp",  # narrows the parts' search space (a time limit would make it vary)
        device_spec=REFERENCE_CPU,
        profile_options=FAST_PROFILE,
        cache=False,
    )
    (out,) = k(*xs)
    assert _rel(out, ref(*xs)) < 1e-5


def _run_plan(backend: Any, plan: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a KernelPlan through ``backend`` (codegen → compile → load) on ``xs``, reshaped to
    the plan's input buffers (the search's plans are of the equal-rank form)."""
    bufs = sorted(
        (b for b in json.loads(plan)["buffers"] if b["role"] == "input"), key=lambda b: b["index"]
    )
    kernel = backend.load(backend.compile(backend.codegen(plan)))
    args = [x.reshape(b["dims"]) for x, b in zip(xs, bufs, strict=True)]
    outs = kernel(*backend.from_numpy(args, [b["dtype"] for b in bufs]))
    return [np.asarray(o.double().numpy() if hasattr(o, "double") else o, np.float64) for o in outs]


@needs_triton
def test_triton_interpreter_runs_the_layout_ops() -> None:
    """The baseline plan of the layout graph (library kernels: permute, reshape, add_scalar,
    rms_norm …) through the CUDA backend's torch host code in Triton-interpreter mode."""
    from yirage_cuda import CudaBackend

    res = yr.search(_layout_graph(), backend="cpu", config="mlp", device_spec=REFERENCE_CPU)
    baseline = next(c for c in res.candidates if c.baseline)
    xs = _layout_inputs()
    (out,) = _run_plan(CudaBackend(interpret=True), baseline.kernel_plan().to_json(), xs)
    assert _rel(out.reshape(8, 2, 32), _layout_ref(*xs)) < 1e-5


def _fused_layernorm_plan() -> tuple[str, list[np.ndarray], Any]:
    """The search's best plan of ``layer_norm(x @ w) * s + 0.5`` (one generated kernel with
    reduction, sub, rms_norm, mul and add_scalar after the k loop), inputs and reference."""
    g, (x, w, s) = _graph((4, 64), (64, 32), (32,))
    g.mark_output(g.add_scalar(g.gemm_layernorm(x, w, s), 0.5))
    res = yr.search(g, backend="cpu", config="mlp", device_spec=REFERENCE_CPU, deterministic=True)
    best = res.candidates[0]
    assert best.label.startswith("custom[") and ";" not in best.label, best.label
    assert "add_scalar" in best.label
    xs = [RNG.standard_normal(d).astype(np.float32) for d in ((4, 64), (64, 32), (32,))]
    ref = _layer_norm(xs[0].astype(np.float64) @ xs[1], 1, xs[2]) + 0.5
    return best.kernel_plan().to_json(), xs, ref


@cpu_backend
def test_fused_layernorm_with_add_scalar_on_the_cpu() -> None:
    from yirage_cpu._backend import CpuBackend

    plan, xs, ref = _fused_layernorm_plan()
    (out,) = _run_plan(CpuBackend(), plan, xs)
    assert _rel(out.reshape(ref.shape), ref) < 1e-5


@needs_triton
def test_fused_layernorm_with_add_scalar_in_the_triton_interpreter() -> None:
    from yirage_cuda import CudaBackend

    plan, xs, ref = _fused_layernorm_plan()
    (out,) = _run_plan(CudaBackend(interpret=True), plan, xs)
    assert _rel(out.reshape(ref.shape), ref) < 1e-5


@cpu_backend
def test_the_search_fuses_around_a_transpose() -> None:
    """A transposed activation feeding gemm_layernorm: the search splits at the permute
    (a library kernel) and fuses the rest into one generated kernel; it runs on the CPU
    backend and matches float64."""
    from yirage_cpu._backend import CpuBackend

    g, (xt, w) = _graph((64, 8), (64, 32))
    g.mark_output(g.gemm_layernorm(g.transpose(xt, 0, 1), w))
    res = yr.search(g, backend="cpu", config="mlp", device_spec=REFERENCE_CPU, deterministic=True)
    best = res.candidates[0]
    assert "permute" in res.report.notes[0]
    assert not best.baseline and best.label.count("custom[") == 1, best.label
    xs = [RNG.standard_normal(d).astype(np.float32) for d in ((64, 8), (64, 32))]
    (out,) = _run_plan(CpuBackend(), best.kernel_plan().to_json(), xs)
    ref = _layer_norm(xs[0].T.astype(np.float64) @ xs[1], 1)
    assert _rel(out.reshape(ref.shape), ref) < 1e-5


def test_pallas_printer_prints_the_layout_ops() -> None:
    """The TPU backend's printer (no jax needed to print) writes the library kernels as
    jax.numpy; with jax installed, interpret mode runs them against float64."""
    from yirage_tpu import TpuBackend

    res = yr.search(_layout_graph(), backend="cpu", config="mlp", device_spec=REFERENCE_CPU)
    plan = next(c for c in res.candidates if c.baseline).kernel_plan().to_json()
    be = TpuBackend(interpret=True)
    text = be.codegen(plan).text
    for expr in ("jnp.transpose(", "jnp.reshape(", "jnp.max(", " + 0.5"):
        assert expr in text, expr
    if importlib.util.find_spec("jax") is None:
        return
    xs = _layout_inputs()
    (out,) = _run_plan(be, plan, xs)
    assert _rel(out.reshape(8, 2, 32), _layout_ref(*xs)) < 1e-5
