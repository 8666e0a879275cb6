"""Every bad input raises the specific YirageError subclass with a message that names the
expected shape or the fix."""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest

import yirage as yr


def _raises(error: type[BaseException], *fragments: str) -> Callable[[Callable[[], object]], None]:
    def check(fn: Callable[[], object]) -> None:
        with pytest.raises(error) as info:
            fn()
        message = str(info.value)
        for fragment in fragments:
            assert fragment in message, (fragment, message)

    return check


@pytest.fixture
def g() -> yr.KernelGraph:
    return yr.new_kernel_graph()


def test_error_hierarchy() -> None:
    for cls in (
        yr.ShapeError,
        yr.DTypeError,
        yr.GraphError,
        yr.MappingError,
        yr.SerializationError,
        yr.EvaluationError,
        yr.BackendError,
        yr.ConfigError,
    ):
        assert issubclass(cls, yr.YirageError)
    for cls in (yr.BackendUnavailableError, yr.PluginAPIError, yr.NotImplementedBackendError):
        assert issubclass(cls, yr.BackendError)
    assert issubclass(yr.YirageError, Exception)


def test_matmul_mismatch_names_both_shapes(g: yr.KernelGraph) -> None:
    a, b = g.new_input((8, 64)), g.new_input((32, 16))
    _raises(yr.ShapeError, "[8,64]", "[32,16]", "64", "32")(lambda: g.matmul(a, b))


def test_wrong_rank(g: yr.KernelGraph) -> None:
    a, v = g.new_input((8, 64)), g.new_input((64,))
    _raises(yr.ShapeError, "at least 2 dims")(lambda: g.matmul(v, a))
    assert g.add(a, v).dims == (8, 64)  # numpy broadcasting promotes the rank
    u = g.new_input((32,))
    _raises(yr.ShapeError, "[8,64]", "[32]", "aligned from the right")(lambda: g.add(a, u))
    _raises(yr.ShapeError, "rank 2", "-2 to 1")(lambda: g.reduction(a, 2))
    _raises(yr.ShapeError, "trailing dims", "[8,64]")(lambda: g.rms_norm(a, (32,)))


@pytest.mark.parametrize(
    ("dims", "fragments"),
    [
        ((1, 2, 3, 4, 5), ("rank 5", "1 to 4")),
        ((), ("rank 0", "1 to 4")),
        ((8, 0), ("contain 0", "≥ 1")),
        ((8, -3), ("contain -3", "≥ 1")),
    ],
)
def test_bad_dims(g: yr.KernelGraph, dims: tuple[int, ...], fragments: tuple[str, ...]) -> None:
    _raises(yr.ShapeError, *fragments)(lambda: g.new_input(dims))


@pytest.mark.parametrize("dims", [(8, 2.5), "8x4", None, (8, True)])
def test_dims_of_wrong_type(g: yr.KernelGraph, dims: object) -> None:
    _raises(yr.ShapeError, "int")(lambda: g.new_input(dims))  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float16", np.float16, np.dtype("float32"), None, 16])
def test_unsupported_dtype_lists_valid_ones(g: yr.KernelGraph, dtype: object) -> None:
    _raises(yr.DTypeError, "yirage.float16", "yirage.bfloat16", "yirage.float32")(
        lambda: g.new_input((4, 4), dtype=dtype)  # type: ignore[arg-type]
    )


def test_mixed_dtypes(g: yr.KernelGraph) -> None:
    a, b = g.new_input((4, 4), yr.float16), g.new_input((4, 4), yr.float32)
    _raises(yr.DTypeError, "float16", "float32")(lambda: g.add(a, b))


def test_tensor_from_another_graph(g: yr.KernelGraph) -> None:
    other = yr.new_kernel_graph()
    a, b = g.new_input((4, 4)), other.new_input((4, 4))
    _raises(yr.GraphError, "different KernelGraph", "created by this graph")(lambda: g.add(a, b))
    _raises(yr.GraphError, "different KernelGraph")(lambda: g.mark_output(b))
    _raises(yr.GraphError, "different KernelGraph")(lambda: g.concat([a, b], 0))


@pytest.mark.parametrize("thing", [5, "t0", np.zeros(3), None])
def test_marking_a_non_tensor(g: yr.KernelGraph, thing: object) -> None:
    g.new_input((4, 4))
    _raises(yr.GraphError, "must be a DTensor", type(thing).__name__)(
        lambda: g.mark_output(thing)  # type: ignore[arg-type]
    )


def test_operator_parameters(g: yr.KernelGraph) -> None:
    a = g.new_input((8, 64))
    _raises(yr.ShapeError, "size 64", "divisible by chunks")(lambda: g.chunk(a, 3, 1))
    _raises(yr.GraphError, "eps", "≥ 0")(lambda: g.rms_norm(a, (64,), eps=-1.0))
    _raises(yr.GraphError, "lo (2)", "hi (1)")(lambda: g.clamp(a, 2, 1))
    _raises(yr.GraphError, "finite")(lambda: g.mul_scalar(a, float("nan")))
    _raises(yr.GraphError, "real number")(lambda: g.mul_scalar(a, "2"))  # type: ignore[arg-type]
    _raises(yr.GraphError, "at least one")(lambda: g.concat([], 0))
    _raises(yr.GraphError, "list of DTensors")(lambda: g.concat(a, 0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "big",
    [10**400, -(10**400), 2**1024, Fraction(10**400, 3), 10**5000],
    ids=["1e400", "-1e400", "2**1024", "fraction", "1e5000"],
)
def test_numbers_beyond_float64_are_graph_errors(g: yr.KernelGraph, big: object) -> None:
    """float() overflows on these (OverflowError); 10**5000 cannot even be printed."""
    a = g.new_input((8, 64))
    expected = ("too large for a float", "finite real number")
    _raises(yr.GraphError, "scalar", *expected)(lambda: g.mul_scalar(a, big))  # type: ignore[arg-type]
    _raises(yr.GraphError, "clamp min", *expected)(lambda: g.clamp(a, big, 1.0))  # type: ignore[arg-type]
    _raises(yr.GraphError, "clamp max", *expected)(lambda: g.clamp(a, 0.0, big))  # type: ignore[arg-type]
    _raises(yr.GraphError, "eps", *expected)(lambda: g.rms_norm(a, (64,), eps=big))  # type: ignore[arg-type]
    tb = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2, 64)
    bx = tb.new_input(a, input_map=(0, -1, -1), forloop_dim=1)
    _raises(yr.GraphError, "eps", *expected)(lambda: tb.forloop_accum(bx, "rms", eps=big))  # type: ignore[arg-type]
    _raises(yr.GraphError, "eps", *expected)(lambda: tb.rms_norm(bx, eps=big))  # type: ignore[arg-type]


def test_ints_beyond_int64_are_described(g: yr.KernelGraph) -> None:
    _raises(yr.ShapeError, "out of range", "-2**63..2**63-1")(lambda: g.new_input((8, 2**63)))
    _raises(yr.ShapeError, "about 5001 digits", "out of range")(lambda: g.new_input((8, 10**5000)))
    a = g.new_input((8, 64))
    _raises(yr.ShapeError, "dim", "out of range")(lambda: g.reduction(a, -(10**5000)))


@pytest.mark.parametrize(
    ("array", "fragments"),
    [
        ([[1.0, 2.0], [3.0]], ("input 0", "not a rectangular array", "equal lengths", "(2, 2)")),
        ([[10**400, 1.0], [1.0, 1.0]], ("input 0", "too large for float64", "finite real")),
        ([[-(10**5000), 1.0], [1.0, 1.0]], ("input 0", "too large for float64")),
        ([[1.0, 2j], [1.0, 1.0]], ("input 0", "complex", "real numbers")),
        ([[1.0, "x"], [1.0, 1.0]], ("input 0", "not a numeric array", "(2, 2)")),
    ],
    ids=["ragged", "1e400", "-1e5000", "complex", "string"],
)
def test_evaluate_rejects_what_float64_cannot_hold(
    array: object, fragments: tuple[str, ...]
) -> None:
    g = yr.new_kernel_graph()
    g.mark_output(g.exp(g.new_input((2, 2))))
    _raises(yr.EvaluationError, *fragments)(lambda: g.evaluate([array]))  # type: ignore[list-item]
    assert g.evaluate([[[1, 2], [3, 4]]])[0].shape == (2, 2)  # nested lists of ints are fine


def test_evaluate_checks_inputs(g: yr.KernelGraph) -> None:
    a, b = g.new_input((8, 64)), g.new_input((64, 4))
    g.mark_output(g.matmul(a, b))
    x, w = np.zeros((8, 64)), np.zeros((64, 4))
    _raises(yr.EvaluationError, "2 inputs", "(8, 64)", "(64, 4)", "1 arrays")(
        lambda: g.evaluate([x])
    )
    _raises(yr.EvaluationError, "input 1", "(4, 64)", "expected dims (64, 4)")(
        lambda: g.evaluate([x, w.T])
    )
    _raises(yr.EvaluationError, "list of 2 arrays")(lambda: g.evaluate(x))  # type: ignore[arg-type]
    _raises(yr.EvaluationError, "complex")(lambda: g.evaluate([x + 1j, w]))
    _raises(yr.EvaluationError, "input 0", "numeric")(
        lambda: g.evaluate([np.full((8, 64), "a"), w])
    )


def test_graph_without_outputs(g: yr.KernelGraph) -> None:
    g.new_input((4, 4))
    _raises(yr.GraphError, "mark_output")(lambda: g.evaluate([np.zeros((4, 4))]))
    _raises(yr.GraphError, "mark_output")(lambda: g.fingerprint())


def test_fingerprint_arguments(g: yr.KernelGraph) -> None:
    g.mark_output(g.exp(g.new_input((4, 4))))
    _raises(yr.EvaluationError, "trials", "positive")(lambda: g.fingerprint(trials=0))
    _raises(yr.EvaluationError, "seed")(lambda: g.fingerprint(seed=-1))
    _raises(yr.EvaluationError, "threads")(lambda: g.fingerprint(threads=0))
    _raises(yr.GraphError, "KernelGraph")(lambda: yr.equivalent(g, "g"))  # type: ignore[arg-type]


# -- thread-block graphs ----------------------------------------------------------------------


def test_non_dividing_imap(g: yr.KernelGraph) -> None:
    x = g.new_input((8, 64))
    # 64 over 3 blocks is a masked edge tile (22, 22, 20); over 40 the last blocks are empty
    tb = yr.new_threadblock_graph((40, 1, 1), (128, 1, 1), 4, 64)
    _raises(yr.MappingError, "grid_dim.x (40)", "size 64", "use at most 32 blocks")(
        lambda: tb.new_input(x, input_map=(1, -1, -1), forloop_dim=-1)
    )
    masked = yr.new_threadblock_graph((3, 1, 1), (128, 1, 1), 4, 64)
    _raises(yr.MappingError, "the loop may not walk a masked dim")(
        lambda: masked.new_input(x, input_map=(1, -1, -1), forloop_dim=1)
    )
    _raises(yr.MappingError, "input_map", "grid axis x is 5", "[8,64]")(
        lambda: tb.new_input(x, input_map=(5, -1, -1), forloop_dim=-1)
    )


def test_non_dividing_fmap(g: yr.KernelGraph) -> None:
    x = g.new_input((8, 64))
    tb = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 3, 64)
    _raises(
        yr.MappingError, "forloop_dim 1", "forloop_range (3)", "size 32", "no grid axis splits"
    )(lambda: tb.new_input(x, input_map=(1, -1, -1), forloop_dim=1))
    # a dim no grid axis splits may be walked by a masked loop; every iteration owns part
    tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    wide = yr.new_threadblock_graph((1, 1, 1), (128, 1, 1), 50, 64)
    _raises(yr.MappingError, "forloop_range (50)", "tiles of 2", "last iteration(s) empty")(
        lambda: wide.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    )
    _raises(yr.MappingError, "forloop_dim 2", "[8,64]")(
        lambda: tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=2)
    )


def test_output_before_accumulator(g: yr.KernelGraph) -> None:
    x = g.new_input((8, 64))
    tb = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2, 64)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    _raises(yr.MappingError, "after forloop_accum", "wrap")(
        lambda: tb.new_output(tb.exp(bx), output_map=(0, -1, -1))
    )
    acc = tb.forloop_accum(bx)
    _raises(yr.MappingError, "output_map", "overwrite", "distinct output dim")(
        lambda: tb.new_output(acc, output_map=(-1, -1, -1))
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (((0, 1, 1), (128, 1, 1), 2, 64), "grid_dim"),
        (((1, 1, 1), (2048, 1, 1), 2, 64), "1024"),
        (((1, 1, 1), (128, 1, 1), 0, 64), "forloop_range"),
        (((1, 1), (128, 1, 1), 2, 64), "3 ints"),
        (((1, 1, 1), (128, 1, 1), 2.0, 64), "forloop_range must be an int"),
    ],
)
def test_block_graph_ranges(args: tuple, fragment: str) -> None:
    _raises(yr.MappingError, fragment)(lambda: yr.new_threadblock_graph(*args))


def test_accumulator_errors(g: yr.KernelGraph) -> None:
    x = g.new_input((8, 64))
    tb = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2, 64)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    _raises(yr.GraphError, "'max'", "'rms'", "'sum_todimx'")(lambda: tb.forloop_accum(bx, "max"))
    _raises(yr.GraphError, "eps only applies to acc='rms'")(
        lambda: tb.forloop_accum(bx, "sum", eps=1.0)
    )
    _raises(yr.ShapeError, "[4,32]", "reduction_dimx (64)")(
        lambda: tb.forloop_accum(bx, "sum_todimx")
    )
    _raises(yr.ShapeError, "reduction_dimx (64)")(lambda: tb.reduction_to_dimx(bx, -1))
    _raises(yr.GraphError, "eps")(lambda: tb.forloop_accum(bx, "rms", eps=-1.0))


def test_customized_errors(g: yr.KernelGraph) -> None:
    x, w, h = g.new_input((8, 64)), g.new_input((32, 16)), g.new_input((8, 64), yr.float32)
    tb = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2, 64)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    acc = tb.forloop_accum(bx)
    _raises(yr.GraphError, "no outputs", "new_output")(lambda: g.customized([x], tb))
    tb.new_output(acc, output_map=(0, -1, -1))
    _raises(yr.ShapeError, "[32,16]", "[8,64]")(lambda: g.customized([w], tb))
    _raises(yr.ShapeError, "[8,64]")(lambda: g.customized([x, x], tb))
    _raises(yr.DTypeError, "float32", "float16")(lambda: g.customized([h], tb))
    _raises(yr.GraphError, "ThreadBlockGraph")(lambda: g.customized([x], "tb"))  # type: ignore[arg-type]
    _raises(yr.GraphError, "DTensor")(lambda: tb.new_input("x"))  # type: ignore[arg-type]


def test_tile_from_another_block_graph(g: yr.KernelGraph) -> None:
    x = g.new_input((8, 64))
    tb1 = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2, 64)
    tb2 = yr.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2, 64)
    b2 = tb2.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    tb1.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    _raises(yr.GraphError, "different ThreadBlockGraph")(lambda: tb1.exp(b2))
    _raises(yr.GraphError, "STensor")(lambda: tb1.exp(x))  # type: ignore[arg-type]


def test_backend_errors_name_the_fix() -> None:
    err = yr.BackendUnavailableError("rocm", "not installed: pip install yirage[rocm]")
    assert "rocm" in str(err) and "pip install yirage[rocm]" in str(err)
    assert (err.name, err.reason) == ("rocm", "not installed: pip install yirage[rocm]")
    err2 = yr.NotImplementedBackendError("mps", "0.1.0", "codegen")
    assert re.search(r"'mps'.*0\.1\.0.*codegen.*no code generator", str(err2))
