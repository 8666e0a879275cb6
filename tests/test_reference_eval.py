"""The float64 reference evaluator against numpy implementations written here."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from _graphs import rmsnorm_linear, rmsnorm_linear_ugraph

import yirage as yr

Array = np.ndarray

_erf = np.vectorize(math.erf)


def _sigmoid(x: Array) -> Array:
    return 1.0 / (1.0 + np.exp(-x))


UNARY: dict[str, Callable[[Array], Array]] = {
    "exp": np.exp,
    "square": np.square,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "silu": lambda x: x * _sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "neg": np.negative,
}
POSITIVE_ONLY = {"sqrt", "rsqrt"}

BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
}


def _close(got: Array, want: Array, rel: float = 1e-12) -> None:
    assert got.shape == want.shape
    assert got.dtype == np.float64
    scale = max(1.0, float(np.max(np.abs(want))))
    assert float(np.max(np.abs(got - want))) <= rel * scale, (got, want)


def _run(build: Callable[[yr.KernelGraph, list[yr.DTensor]], yr.DTensor], *arrays: Array) -> Array:
    g = yr.new_kernel_graph()
    ins = [g.new_input(a.shape, dtype=yr.float32) for a in arrays]
    g.mark_output(build(g, ins))
    (out,) = g.evaluate(list(arrays))
    return out


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str, rng: np.random.Generator) -> None:
    x = rng.uniform(0.1, 3.0, (3, 5)) if op in POSITIVE_ONLY else rng.normal(0, 2, (3, 5))
    got = _run(lambda g, t: getattr(g, op)(t[0]), x)
    _close(got, UNARY[op](x))


def test_mul_scalar_and_clamp(rng: np.random.Generator) -> None:
    x = rng.normal(0, 2, (4, 6))
    s = float(rng.normal())
    _close(_run(lambda g, t: g.mul_scalar(t[0], s), x), x * s)
    _close(_run(lambda g, t: g.clamp(t[0], -0.5, 1.25), x), np.clip(x, -0.5, 1.25))


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_with_size1_broadcasting(op: str, rng: np.random.Generator) -> None:
    positive = op in ("pow", "div")
    a = rng.uniform(0.5, 2.0, (4, 1, 6)) if positive else rng.normal(size=(4, 1, 6))
    b = rng.uniform(0.5, 2.0, (1, 3, 6)) if positive else rng.normal(size=(1, 3, 6))
    got = _run(lambda g, t: getattr(g, op)(t[0], t[1]), a, b)
    _close(got, BINARY[op](a, b))


@pytest.mark.parametrize(
    ("a_dims", "b_dims"),
    [((5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3)), ((2, 3, 4, 5), (2, 3, 5, 6))],
)
def test_matmul_batched(a_dims: tuple[int, ...], b_dims: tuple[int, ...], rng) -> None:
    a, b = rng.normal(size=a_dims), rng.normal(size=b_dims)
    _close(_run(lambda g, t: g.matmul(t[0], t[1]), a, b), a @ b)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_reduction_keeps_dim(dim: int, rng: np.random.Generator) -> None:
    x = rng.normal(size=(3, 4, 5))
    _close(_run(lambda g, t: g.reduction(t[0], dim), x), x.sum(axis=dim, keepdims=True))


def test_rms_norm_with_weight_and_eps(rng: np.random.Generator) -> None:
    x, w = rng.normal(size=(4, 16)), rng.normal(size=(16,))
    eps = float(rng.uniform(1e-6, 1e-1))
    got = _run(lambda g, t: g.rms_norm(t[0], (16,), weight=t[1], eps=eps), x, w)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    _close(got, want)


def test_rms_norm_over_two_dims(rng: np.random.Generator) -> None:
    x = rng.normal(size=(2, 3, 8))
    got = _run(lambda g, t: g.rms_norm(t[0], (3, 8)), x)
    want = x / np.sqrt(np.mean(x * x, axis=(1, 2), keepdims=True) + 1e-6)
    _close(got, want)


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax(dim: int, rng: np.random.Generator) -> None:
    x = rng.normal(size=(4, 7))
    e = np.exp(x)
    _close(_run(lambda g, t: g.softmax(t[0], dim=dim), x), e / e.sum(axis=dim, keepdims=True))


def test_concat_and_chunk(rng: np.random.Generator) -> None:
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(2, 5))
    _close(_run(lambda g, t: g.concat([t[0], t[1]], dim=-1), a, b), np.concatenate([a, b], 1))

    x = rng.normal(size=(6, 4))
    g = yr.new_kernel_graph()
    t = g.new_input(x.shape, dtype=yr.float32)
    parts = g.chunk(t, 3, dim=0)
    assert [p.dims for p in parts] == [(2, 4)] * 3
    for p in parts:
        g.mark_output(p)
    for got, want in zip(g.evaluate([x]), np.split(x, 3, axis=0), strict=True):
        _close(got, want)


def test_inputs_of_any_real_dtype_are_accepted(rng: np.random.Generator) -> None:
    x = rng.normal(size=(3, 4))
    g = yr.new_kernel_graph()
    t = g.new_input((3, 4), dtype=yr.float16)
    g.mark_output(g.mul_scalar(t, 2.0))
    for arr in (
        x.astype(np.float16),
        x.astype(np.float32),
        x.T.copy().T,
        np.arange(12).reshape(3, 4),
    ):
        (out,) = g.evaluate([arr])
        _close(out, np.asarray(arr, dtype=np.float64) * 2.0)
        out[0, 0] = 1.0  # outputs are ordinary writable arrays


def test_non_contiguous_input(rng: np.random.Generator) -> None:
    x = rng.normal(size=(8, 6))[::2, ::-1]  # strided view
    assert not x.flags.c_contiguous
    _close(_run(lambda g, t: g.neg(t[0]), x), -x)


def test_customized_rmsnorm_linear_matches_numpy(rng: np.random.Generator) -> None:
    x, w = rng.normal(size=(8, 512)), rng.normal(size=(512, 768))
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) @ w
    (ref,) = rmsnorm_linear(8, 512, 768).evaluate([x, w])
    (fused,) = rmsnorm_linear_ugraph(8, 512, 768).evaluate([x, w])
    scale = np.max(np.abs(want))
    assert np.max(np.abs(ref - want)) / scale < 1e-10
    assert np.max(np.abs(fused - want)) / scale < 1e-10


def test_an_explicit_loop_tile_walks_a_prime_dim_in_power_of_two_tiles(
    rng: np.random.Generator,
) -> None:
    """RMSNorm + Linear over K = 67 walked in 5 tiles of 16 (the last owning 3) instead of
    ceil(67 / 5) = 14: numpy's values, the same fingerprint, the tile kept by JSON; a tile
    that leaves an iteration empty is refused with the range that works."""
    x, w = rng.normal(size=(4, 67)), rng.normal(size=(67, 24))
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) @ w

    def fused(tile: int | None) -> yr.KernelGraph:
        g = yr.new_kernel_graph()
        tx, tw = g.new_input((4, 67), yr.float16), g.new_input((67, 24), yr.float16)
        tb = yr.new_threadblock_graph((1, 1, 1), (128, 1, 1), 5, 1, forloop_tile=tile)
        bx = tb.new_input(tx, input_map=(-1, -1, -1), forloop_dim=1)
        bw = tb.new_input(tw, input_map=(-1, -1, -1), forloop_dim=0)
        out = tb.div(tb.forloop_accum(tb.matmul(bx, bw)), tb.forloop_accum(bx, "rms"))
        tb.new_output(out, output_map=(-1, -1, -1))
        assert tb.forloop_tile == (None if tile in (None, 14) else tile)
        (o,) = g.customized([tx, tw], tb)
        g.mark_output(o)
        return g

    g16 = fused(16)
    (got,) = g16.evaluate([x, w])
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-10
    assert yr.equivalent(g16, rmsnorm_linear(4, 67, 24))
    assert '"forloop_tile":16' in g16.to_json()
    assert yr.KernelGraph.from_json(g16.to_json()).hash() == g16.hash() != fused(None).hash()
    assert fused(14).hash() == fused(None).hash()  # the default tile, set explicitly
    with pytest.raises(yr.MappingError, match="leaving the last iteration"):
        fused(17)


def _block_graph_eval(
    x: Array,
    build: Callable[[yr.ThreadBlockGraph, yr.STensor], yr.STensor],
    *,
    grid: int,
    forloop: int,
    imap: tuple[int, int, int],
    fmap: int,
    omap: tuple[int, int, int],
    dimx: int = 4,
) -> Array:
    g = yr.new_kernel_graph()
    t = g.new_input(x.shape, dtype=yr.float32)
    tb = yr.new_threadblock_graph((grid, 1, 1), (32, 1, 1), forloop, dimx)
    tb.new_output(build(tb, tb.new_input(t, input_map=imap, forloop_dim=fmap)), output_map=omap)
    (o,) = g.customized([t], tb)
    g.mark_output(o)
    (out,) = g.evaluate([x])
    return out


def test_accumulators(rng: np.random.Generator) -> None:
    # X[4, 32]: grid splits rows (4 blocks of 1 row), the loop walks 4 slices of 8 columns.
    x = rng.normal(size=(4, 32))
    kw = {"grid": 4, "forloop": 4, "imap": (0, -1, -1), "fmap": 1, "omap": (0, -1, -1)}
    slices = x.reshape(4, 4, 8)  # [row, iteration, column]

    got = _block_graph_eval(x, lambda tb, b: tb.forloop_accum(b), **kw)
    _close(got, slices.sum(axis=1))  # sum over iterations, tile [1, 8]

    got = _block_graph_eval(x, lambda tb, b: tb.forloop_accum(b, "sum"), **kw)
    _close(got, x.sum(axis=1, keepdims=True))

    eps = 0.25
    got = _block_graph_eval(x, lambda tb, b: tb.forloop_accum(b, "rms", eps=eps), **kw)
    _close(got, np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps))

    got = _block_graph_eval(x, lambda tb, b: tb.forloop_accum(b, "sum_todimx"), **kw)
    _close(got, slices.sum(axis=1).reshape(4, 2, 4).sum(axis=1))  # strided groups down to 4


def test_block_ops_after_loop(rng: np.random.Generator) -> None:
    x = rng.uniform(0.5, 2.0, size=(4, 16))
    kw = {"grid": 2, "forloop": 2, "imap": (0, -1, -1), "fmap": 1, "omap": (0, -1, -1)}

    def build(tb: yr.ThreadBlockGraph, b: yr.STensor) -> yr.STensor:
        acc = tb.forloop_accum(tb.exp(b))  # [2, 8]
        return tb.rms_norm(tb.reduction_to_dimx(tb.sqrt(acc), 1), eps=0.5)

    got = _block_graph_eval(x, build, **kw)
    acc = np.sqrt(np.exp(x).reshape(4, 2, 8).sum(axis=1)).reshape(4, 2, 4).sum(axis=1)
    _close(got, acc / np.sqrt(np.mean(acc * acc, axis=-1, keepdims=True) + 0.5))
