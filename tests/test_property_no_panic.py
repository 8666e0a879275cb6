"""Property: random (often invalid) graph-building sequences raise YirageError subclasses and
nothing else — never a Rust panic (pyo3 PanicException), TypeError, OverflowError …"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yirage as yr

T = TypeVar("T")

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

UNARY = ["exp", "square", "sqrt", "rsqrt", "silu", "gelu", "relu", "sigmoid", "tanh", "neg"]
BINARY = ["add", "sub", "mul", "div", "pow"]
ACCS = [None, "sum", "rms", "sum_todimx", "max"]


def _mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> Any:
    """``common``, with ``rare`` drawn about one time in eight."""
    return st.integers(0, 7).flatmap(lambda k: rare if k == 0 else common)


# Ints beyond int64 and beyond float64 (10**400 overflows float(); 10**5000 cannot even be
# printed: Python refuses int-to-str conversions of more than 4300 digits). Built, not
# listed, so that hypothesis can print the strategies.
huge_ints = st.one_of(
    st.sampled_from([2**63, -(2**63) - 1]),
    st.builds(
        lambda sign, exp: sign * 10**exp,
        st.sampled_from([1, -1]),
        st.sampled_from([19, 309, 400, 5000]),
    ),
)
huge_reals = st.one_of(huge_ints, st.builds(Fraction, huge_ints, st.integers(1, 3)))
small = _mostly(st.integers(-2, 5), huge_ints)
dims = st.one_of(
    st.lists(_mostly(st.integers(-1, 4), huge_ints), min_size=0, max_size=5),
    _mostly(st.integers(-1, 4), huge_ints),
)
dtype = st.sampled_from([yr.float16, yr.bfloat16, yr.float32, "float32", None])
reals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 3),
    st.just("1.0"),
    huge_reals,
)
triple = st.tuples(small, small, small)
# evaluate() inputs that are not arrays of floats: ragged nested lists, huge ints, complex
# numbers, strings, None.
leaves = st.one_of(
    st.floats(), st.integers(-3, 3), huge_ints, st.complex_numbers(), st.just("x"), st.none()
)
nested = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3), max_leaves=8)


def attempt(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Call ``fn``; a YirageError is an acceptable outcome, anything else propagates."""
    try:
        return fn(*args, **kwargs)
    except yr.YirageError:
        return None


def _block_op(tb: yr.ThreadBlockGraph, data: st.DataObject, x: Any, y: Any) -> Any:
    kind = data.draw(st.integers(0, 8))
    if kind == 0:
        return tb.matmul(x, y)
    if kind == 1:
        return getattr(tb, data.draw(st.sampled_from(UNARY)))(x)
    if kind == 2:
        return getattr(tb, data.draw(st.sampled_from(BINARY)))(x, y)
    if kind == 3:
        return tb.reduction(x, data.draw(small))
    if kind == 4:
        return tb.reduction_to_dimx(x, data.draw(small))
    if kind == 5:
        return tb.rms_norm(x, data.draw(reals))
    if kind == 6:
        return tb.concat([x, y], data.draw(small))
    if kind == 7:
        acc = data.draw(st.sampled_from(ACCS))
        return tb.forloop_accum(x, acc, data.draw(st.one_of(st.none(), reals)))
    return tb.new_output(x, data.draw(triple))


def _random_block_graph(data: st.DataObject, pool: list[Any]) -> yr.ThreadBlockGraph | None:
    tb = attempt(
        yr.new_threadblock_graph,
        data.draw(triple),
        data.draw(triple),
        data.draw(small),
        data.draw(small),
    )
    if tb is None:
        return None
    tiles: list[Any] = ["not a tile"]
    for _ in range(data.draw(st.integers(1, 3))):
        src = data.draw(st.sampled_from(pool))
        tile = attempt(tb.new_input, src, data.draw(triple), data.draw(small))
        if tile is not None:
            tiles.append(tile)
    for _ in range(data.draw(st.integers(0, 6))):
        x, y = data.draw(st.sampled_from(tiles)), data.draw(st.sampled_from(tiles))
        out = attempt(_block_op, tb, data, x, y)
        if isinstance(out, yr.STensor):
            tiles.append(out)
    return tb


def _kernel_op(
    g: yr.KernelGraph, data: st.DataObject, x: Any, y: Any, pool: list[Any], choices: list[Any]
) -> Any:
    kind = data.draw(st.integers(0, 10))
    if kind == 0:
        return g.matmul(x, y)
    if kind == 1:
        return getattr(g, data.draw(st.sampled_from(UNARY)))(x)
    if kind == 2:
        return getattr(g, data.draw(st.sampled_from(BINARY)))(x, y)
    if kind == 3:
        return g.clamp(x, data.draw(reals), data.draw(reals))
    if kind == 4:
        return g.mul_scalar(x, data.draw(reals))
    if kind == 5:
        return g.reduction(x, data.draw(small))
    if kind == 6:
        return g.softmax(x, data.draw(small))
    if kind == 7:
        weight = data.draw(st.sampled_from([None, x, y]))
        return g.rms_norm(x, data.draw(dims), weight=weight, eps=data.draw(reals))
    if kind == 8:
        return g.concat([x, y], data.draw(small))
    if kind == 9:
        return g.chunk(x, data.draw(small), data.draw(small))
    tb = _random_block_graph(data, pool)
    ins = data.draw(st.lists(st.sampled_from(choices), max_size=3))
    return None if tb is None else g.customized(ins, tb)


@SETTINGS
@given(st.data())
def test_random_graphs_raise_only_yirage_errors(data: st.DataObject) -> None:
    g = yr.new_kernel_graph()
    stranger = yr.new_kernel_graph().new_input((2, 2))
    pool: list[Any] = []
    for _ in range(data.draw(st.integers(1, 3))):
        t = attempt(g.new_input, data.draw(dims), data.draw(dtype))
        if t is not None:
            pool.append(t)
    if not pool:
        return
    choices: list[Any] = [*pool, stranger, 3, None]
    for _ in range(data.draw(st.integers(0, 8))):
        x, y = data.draw(st.sampled_from(choices)), data.draw(st.sampled_from(choices))
        out = attempt(_kernel_op, g, data, x, y, pool, choices)
        for t in out if isinstance(out, list) else [out]:
            if isinstance(t, yr.DTensor):
                pool.append(t)
                choices.append(t)

    for t in data.draw(st.lists(st.sampled_from(choices), max_size=3)):
        attempt(g.mark_output, t)

    arrays = [np.ones(t.dims) * 0.5 for t in g.inputs]
    attempt(g.evaluate, arrays)
    attempt(g.evaluate, arrays[:-1])
    attempt(g.evaluate, [np.ones((9,) * len(a.shape)) for a in arrays])
    attempt(g.evaluate, [data.draw(nested) for _ in arrays])
    if arrays:  # the right shape, one entry a value float64 cannot hold
        bad = arrays[0].astype(object)
        bad[(0,) * bad.ndim] = data.draw(st.one_of(huge_ints, st.complex_numbers(), leaves))
        attempt(g.evaluate, [bad.tolist(), *arrays[1:]])
    digest = attempt(g.fingerprint, trials=1, seed=data.draw(st.integers(0, 2**64 - 1)))
    text = g.to_json()
    back = yr.KernelGraph.from_json(text)
    assert back.to_json() == text and back.hash() == g.hash()
    if digest is not None:
        assert back.fingerprint(trials=1, seed=0) == g.fingerprint(trials=1, seed=0)
        assert yr.equivalent(g, back, trials=1)


def _valid_json() -> str:
    g = yr.new_kernel_graph()
    x = g.new_input((4, 8), yr.float16)
    w = g.new_input((8, 8), yr.float16)
    tb = yr.new_threadblock_graph((2, 1, 1), (32, 1, 1), 2, 4)
    bx = tb.new_input(x, (-1, -1, -1), 1)
    bw = tb.new_input(w, (1, -1, -1), 0)
    tb.new_output(
        tb.div(tb.forloop_accum(tb.matmul(bx, bw)), tb.forloop_accum(bx, "rms")), (1, -1, -1)
    )
    (o,) = g.customized([x, w], tb)
    g.mark_output(g.softmax(o, -1))
    return g.to_json()


VALID_JSON = _valid_json()
NUMBER = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")


@SETTINGS
@given(st.data())
def test_mutated_json_raises_only_yirage_errors(data: st.DataObject) -> None:
    spans = [m.span() for m in NUMBER.finditer(VALID_JSON)]
    text = VALID_JSON
    for _ in range(data.draw(st.integers(1, 3))):
        start, end = data.draw(st.sampled_from(spans))
        value = data.draw(
            st.one_of(
                st.integers(-(2**70), 2**70),
                st.integers(-2, 9),
                st.sampled_from(["null", '"x"', "1.5", "[]"]),
            )
        )
        text = text[:start] + str(value) + text[end:]
        spans = [m.span() for m in NUMBER.finditer(text)]
    g = attempt(yr.KernelGraph.from_json, text)
    if g is not None:
        assert yr.KernelGraph.from_json(g.to_json()).hash() == g.hash()
        attempt(g.evaluate, [np.ones(t.dims) for t in g.inputs])
        attempt(g.fingerprint, trials=1)


@SETTINGS
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_serialization_errors(text: str) -> None:
    attempt(yr.KernelGraph.from_json, text)
