"""Numpy-style broadcasting with rank promotion: kernel-level binary ops and rms_norm
weights of lower rank, the reference evaluator and fingerprints on them, the equal-rank form
the search works on (``KernelGraph._g.promote_ranks``), and superoptimize end to end on CPU
with the caller's original shapes."""

from __future__ import annotations

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr
from yirage._kernel import Shapes

F32 = yr.float32
FAST = {"profile_options": {"rounds": 1, "min_time_s": 0.005, "min_repeats": 3}}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _canonical(g: yr.KernelGraph) -> yr.KernelGraph:
    return yr.KernelGraph._wrap(g._g.promote_ranks())


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("add", np.add),
        ("sub", np.subtract),
        ("mul", np.multiply),
        ("div", np.divide),
    ],
)
@pytest.mark.parametrize(
    ("a_dims", "b_dims"),
    [((8, 64), (64,)), ((64,), (8, 64)), ((2, 8, 64), (8, 1)), ((3, 1, 5), (4, 1)), ((1,), (4, 3))],
)
def test_binary_ops_follow_numpy(
    rng: np.random.Generator,
    op: str,
    fn: np.ufunc,
    a_dims: tuple[int, ...],
    b_dims: tuple[int, ...],
) -> None:
    g = yr.new_kernel_graph()
    a, b = g.new_input(a_dims, F32), g.new_input(b_dims, F32)
    out = getattr(g, op)(a, b)
    want_dims = np.broadcast_shapes(a_dims, b_dims)
    assert out.dims == want_dims
    g.mark_output(out)
    x, y = rng.standard_normal(a_dims), rng.standard_normal(b_dims) + 3.0
    (got,) = g.evaluate([x, y])
    np.testing.assert_allclose(got, fn(x, y), rtol=1e-14, atol=1e-14)
    # JSON round trip and hash
    back = yr.KernelGraph.from_json(g.to_json())
    assert back.hash() == g.hash() and back.to_json() == g.to_json()


def test_pow_broadcasts(rng: np.random.Generator) -> None:
    g = yr.new_kernel_graph()
    a, b = g.new_input((4, 8), F32), g.new_input((8,), F32)
    g.mark_output(g.pow(a, b))
    x, y = np.abs(rng.standard_normal((4, 8))) + 0.5, rng.standard_normal(8)
    np.testing.assert_allclose(g.evaluate([x, y])[0], np.power(x, y), rtol=1e-13)


def test_rank1_bias_add_against_numpy(rng: np.random.Generator) -> None:
    g = yr.new_kernel_graph()
    x, w, b = g.new_input((8, 64), F32), g.new_input((64, 32), F32), g.new_input((32,), F32)
    g.mark_output(g.add(g.matmul(x, w), b))
    X, W, B = rng.standard_normal((8, 64)), rng.standard_normal((64, 32)), rng.standard_normal(32)
    np.testing.assert_allclose(g.evaluate([X, W, B])[0], X @ W + B, rtol=1e-12, atol=1e-12)


def test_rank1_rms_weight_against_numpy(rng: np.random.Generator) -> None:
    X, w = rng.standard_normal((2, 8, 64)), rng.standard_normal(64)
    want = X / np.sqrt(np.mean(X**2, axis=-1, keepdims=True) + 1e-6) * w
    for w_dims in [(64,), (1, 64), (1, 1, 64)]:  # normalized_shape, optionally with leading 1s
        g = yr.new_kernel_graph()
        x, wt = g.new_input((2, 8, 64), F32), g.new_input(w_dims, F32)
        g.mark_output(g.rms_norm(x, (64,), weight=wt))
        (got,) = g.evaluate([X, w.reshape(w_dims)])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    g = yr.new_kernel_graph()
    x = g.new_input((8, 64), F32)
    for bad in [(2, 64), (1, 1, 64), (32,)]:
        wt = g.new_input(bad, F32)
        with pytest.raises(yr.ShapeError, match=r"normalized_shape \[64\]") as e:
            g.rms_norm(x, (64,), weight=wt)
        assert "leading size-1 dims" in str(e.value)


def test_fingerprints_of_rank1_and_promoted_bias_agree() -> None:
    def graph(b_dims: tuple[int, ...], op: str = "add") -> yr.KernelGraph:
        g = yr.new_kernel_graph()
        x, b = g.new_input((8, 64), F32), g.new_input(b_dims, F32)
        g.mark_output(getattr(g, op)(x, b))
        return g

    rank1, full = graph((64,)), graph((1, 64))
    # same bytes in, same function: equal digests (yr.equivalent compares signatures, which
    # differ by the leading 1)
    assert rank1.fingerprint(trials=3, seed=4) == full.fingerprint(trials=3, seed=4)
    assert rank1.fingerprint(trials=3, seed=4) != graph((64,), "sub").fingerprint(trials=3, seed=4)
    with pytest.raises(yr.ShapeError, match="input signatures"):
        yr.equivalent(rank1, full)
    # the equal-rank form is the promoted graph, equivalent to it
    assert _canonical(rank1).hash() == full.hash()
    assert yr.equivalent(_canonical(rank1), full)


@pytest.mark.parametrize(
    ("a_dims", "b_dims", "axis"),
    [((8, 64), (32,), "dim -1 (64 vs 32)"), ((2, 8, 64), (4, 64), "dim -2 (8 vs 4)")],
)
def test_incompatible_shapes_name_both_and_the_rule(
    a_dims: tuple[int, ...], b_dims: tuple[int, ...], axis: str
) -> None:
    g = yr.new_kernel_graph()
    a, b = g.new_input(a_dims, F32), g.new_input(b_dims, F32)
    with pytest.raises(yr.ShapeError) as e:
        g.mul(a, b)
    msg = str(e.value)
    for frag in (
        "[" + ",".join(map(str, a_dims)) + "]",
        "[" + ",".join(map(str, b_dims)) + "]",
        axis,
        "aligned from the right",
        "equal or one of them 1",
    ):
        assert frag in msg, msg


def test_equal_rank_form() -> None:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 64), F32)
    b = g.new_input((64,), F32)
    s = g.softmax(g.add(x, g.exp(b)), -1)
    r = g.reduction(g.mul(b, b), 0)  # dim 0 of [64] is dim 1 of [1, 64]
    g.mark_output(s)
    g.mark_output(r)
    h = _canonical(g)
    assert [t.dims for t in h.inputs] == [(8, 64), (1, 64)]
    assert [t.dims for t in h.outputs] == [(8, 64), (1, 1)]
    shapes = Shapes(g)
    assert not shapes.identity
    assert shapes.user_out == [(8, 64), (1,)]
    # an equal-rank graph is its own form
    assert _canonical(h).hash() == h.hash()
    # a tensor used at two ranks takes the larger one (its partners follow, exactly)
    g2 = yr.new_kernel_graph()
    b2 = g2.new_input((64,), F32)
    x2, x3 = g2.new_input((8, 64), F32), g2.new_input((2, 8, 64), F32)
    g2.mark_output(g2.add(x2, b2))
    g2.mark_output(g2.add(x3, b2))
    assert [t.dims for t in _canonical(g2).inputs] == [(1, 1, 64), (1, 8, 64), (2, 8, 64)]


def test_promotion_into_a_customized_operator_is_an_error() -> None:
    g = yr.new_kernel_graph()
    x, v = g.new_input((8, 64), F32), g.new_input((64,), F32)
    tb = yr.new_threadblock_graph((1, 1, 1), (32, 1, 1), 1, 1)
    ti = tb.new_input(v)
    tb.new_output(tb.forloop_accum(ti), (-1, -1, -1))
    (c,) = g.customized([v], tb)
    g.mark_output(g.add(x, c))
    with pytest.raises(yr.ShapeError, match="leading size-1 dims") as e:
        yr.search(g, backend="cpu", time_limit=5, cache=False)
    assert "customized" in str(e.value) and "t2[64]" in str(e.value)


cpu_only = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)


@cpu_only
def test_superoptimize_rms_norm_with_rank1_weight(rng: np.random.Generator) -> None:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 256), F32)
    w = g.new_input((256,), F32)
    W = g.new_input((256, 128), F32)
    g.mark_output(g.matmul(g.rms_norm(x, (256,), weight=w), W))
    k = yr.superoptimize(g, backend="cpu", time_limit=30, device_spec=REFERENCE_CPU, **FAST)
    assert k.report.max_rel_err is not None and k.report.max_rel_err <= 1e-4
    # the weight in [1, 256] form lets the search fuse the whole op
    assert any("accum_rms" in c.description for c in k.report.candidates), k.report
    X = rng.standard_normal((8, 256), dtype=np.float32)
    wv = rng.standard_normal(256, dtype=np.float32)
    Wv = (rng.standard_normal((256, 128)) / 16).astype(np.float32)
    (out,) = k(X, wv, Wv)
    (ref,) = g.evaluate([X, wv, Wv])
    assert out.shape == (8, 128)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-4
    # the kernel's own (promoted) shape is accepted too; a wrong one names the graph's shape
    (out2,) = k(X, wv.reshape(1, 256), Wv)
    np.testing.assert_array_equal(out, out2)
    with pytest.raises(yr.ShapeError, match=r"expected \(256,\)"):
        k(X, wv[:128], Wv)


@cpu_only
def test_superoptimize_keeps_the_callers_shapes(rng: np.random.Generator, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    g = yr.new_kernel_graph()
    x, b, W = g.new_input((8, 64), F32), g.new_input((64,), F32), g.new_input((64, 32), F32)
    c = g.new_input((32,), F32)
    g.mark_output(g.add(g.matmul(g.mul(x, b), W), c))
    g.mark_output(g.exp(b))  # a rank-1 output
    k = yr.superoptimize(g, backend="cpu", time_limit=30, **FAST)
    ins = [rng.standard_normal(d, dtype=np.float32) for d in [(8, 64), (64,), (64, 32), (32,)]]
    outs = k(*ins)
    refs = g.evaluate(ins)
    assert [o.shape for o in outs] == [(8, 32), (64,)]
    for o, r in zip(outs, refs, strict=True):
        assert np.linalg.norm(o - r) / np.linalg.norm(r) < 1e-4
    touts = k(*[torch.from_numpy(a) for a in ins])
    assert [tuple(t.shape) for t in touts] == [(8, 32), (64,)]
    # saved and loaded: still the caller's shapes
    k2 = yr.load_kernel(k.save(tmp_path / "k"))
    assert [o.shape for o in k2(*ins)] == [(8, 32), (64,)]
