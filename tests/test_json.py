"""Canonical JSON serialization and the stable content hash."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _graphs import rmsnorm_linear, rmsnorm_linear_ugraph

import yirage as yr


@pytest.mark.parametrize(
    "build", [lambda: rmsnorm_linear(8, 512, 768), lambda: rmsnorm_linear_ugraph(8, 512, 768)]
)
def test_round_trip_is_byte_identical(build, rng: np.random.Generator) -> None:
    g = build()
    s = g.to_json()
    json.loads(s)  # valid JSON
    back = yr.KernelGraph.from_json(s)
    assert back.to_json() == s
    assert back.hash() == g.hash()
    assert [t.dims for t in back.inputs] == [t.dims for t in g.inputs]
    assert [t.dtype for t in back.outputs] == [t.dtype for t in g.outputs]
    assert yr.equivalent(g, back)
    x, w = rng.normal(size=(8, 512)), rng.normal(size=(512, 768))
    np.testing.assert_array_equal(back.evaluate([x, w])[0], g.evaluate([x, w])[0])


def test_hash_is_that_of_the_graph_not_of_its_construction() -> None:
    def build(exp_first: bool, dead_op: bool) -> yr.KernelGraph:
        g = yr.new_kernel_graph()
        a, b = (g.new_input((4, 8), dtype=yr.float32) for _ in range(2))
        if exp_first:
            e = g.exp(a)
            q = g.square(b)
        else:
            q = g.square(b)
            e = g.exp(a)
        if dead_op:
            g.tanh(e)
        g.mark_output(g.add(e, q))
        return g

    base = build(True, False)
    for other in (build(False, False), build(True, True)):
        assert other.to_json() != base.to_json() and other.hash() == base.hash()


def test_hash_distinguishes_graphs() -> None:
    a, b = rmsnorm_linear(8, 64, 32), rmsnorm_linear(8, 64, 32, eps=1e-5)
    assert a.hash() == rmsnorm_linear(8, 64, 32).hash()
    assert a.hash() != b.hash()
    assert a.hash() != rmsnorm_linear_ugraph(8, 64, 32, grid=4).hash()
    assert (
        rmsnorm_linear_ugraph(8, 64, 32, grid=4).hash()
        != rmsnorm_linear_ugraph(8, 64, 32, grid=2).hash()
    )


def test_hash_is_stable_across_processes() -> None:
    code = textwrap.dedent(
        """
        import yirage as yr
        g = yr.new_kernel_graph()
        x = g.new_input(dims=(8, 512), dtype=yr.float16)
        w = g.new_input(dims=(512, 768), dtype=yr.float16)
        g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(512,), eps=1e-6), w))
        print(g.hash())
        print(g.fingerprint(trials=2, seed=0))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    ref = rmsnorm_linear(8, 512, 768)
    assert proc.stdout.split() == [ref.hash(), ref.fingerprint(trials=2, seed=0)]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        "{}",
        '{"format": "something.else", "version": 1, "ops": [], "outputs": []}',
        '{"format": "yirage.kernel_graph", "version": 999, "ops": [], "outputs": []}',
        '{"format": "yirage.kernel_graph", "version": 1, "ops": [{"op": "nope"}], "outputs": []}',
    ],
)
def test_malformed_json_raises_serialization_error(text: str) -> None:
    with pytest.raises(yr.SerializationError):
        yr.KernelGraph.from_json(text)


_INPUT = '{"op": "input", "dims": %s, "dtype": "float16"}'


@pytest.mark.parametrize(
    ("ops", "outputs", "error", "fragment"),
    [
        ([_INPUT % "[0]"], "[0]", yr.ShapeError, "≥ 1"),
        ([_INPUT % "[2]"], "[5]", yr.GraphError, "t5"),
        (
            [_INPUT % "[2, 3]", _INPUT % "[4, 3]", '{"op": "matmul", "a": 0, "b": 1}'],
            "[2]",
            yr.ShapeError,
            "[2,3]",
        ),
    ],
)
def test_well_formed_but_invalid_graph_raises_the_specific_error(
    ops: list[str], outputs: str, error: type[yr.YirageError], fragment: str
) -> None:
    body = ", ".join(ops)
    text = (
        f'{{"format": "yirage.kernel_graph", "version": 1, "ops": [{body}], "outputs": {outputs}}}'
    )
    with pytest.raises(error, match=re.escape(fragment)):
        yr.KernelGraph.from_json(text)


def test_from_json_needs_a_string() -> None:
    with pytest.raises(yr.SerializationError, match="str"):
        yr.KernelGraph.from_json(b"{}")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0.1, 1 / 3, 2.0**-30, 9.576836816141717e234, 5e-324, -1.5e-300])
def test_float_parameters_round_trip_exactly(value: float) -> None:
    g = yr.new_kernel_graph()
    x = g.new_input((2, 3))
    g.mark_output(g.rms_norm(g.mul_scalar(x, value), (3,), eps=abs(value)))
    back = yr.KernelGraph.from_json(g.to_json())
    assert back.to_json() == g.to_json()
    assert back.hash() == g.hash()
    assert np.array_equal(back.evaluate([np.ones((2, 3))])[0], g.evaluate([np.ones((2, 3))])[0])
