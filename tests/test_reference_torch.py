"""The float64 reference on a torch device (``yirage._reference_torch``) against the core
evaluator (``KernelGraph.evaluate``): every op it mirrors, on random and extreme inputs, the
graphs it refuses, and the wiring (torch tensors on a GPU take it, numpy arrays and the CPU
backend keep the core evaluator). Run on CPU torch here, with "cpu" admitted as a device
where a test needs the wiring; ``tests/cuda/test_reference_gpu.py`` runs it on the GPU.

Values agree to 1e-12 relative, plus what a 1e-12 relative change of the inputs does to the
core's own result (:func:`allowance`: torch sums in another order than the core's index
order, which matters only where a result is ill-conditioned; elements so ill-conditioned
that rounding decides them are compared for NaN/inf only), and NaN, +inf and -inf sit at the
same positions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from _graphs import rmsnorm_linear_ugraph

import yirage as yr
from yirage import _check, _reference_torch, _stress, _superoptimize
from yirage._shapes import Shapes
from yirage._workloads import WORKLOADS

torch = pytest.importorskip("torch")

RTOL = 1e-12

#: Inputs whose values pass every op's edge: float16/float32 extremes, signed zeros, exp
#: arguments past float64's overflow (709.8), negative values (sqrt, rsqrt, pow), tiny ones.
EXTREMES = np.array(
    [
        65504.0,
        -65504.0,
        float(np.finfo(np.float32).max),
        -float(np.finfo(np.float32).max),
        0.0,
        -0.0,
        800.0,
        -800.0,
        1000.0,
        -1000.0,
        -4.0,
        -0.5,
        2.0**-149,
        -(2.0**-24),
        30.0,
        -30.0,
        4.5,
        -5.5,
    ]
)
NONFINITE = np.array([np.inf, -np.inf, np.nan])
#: Absolute difference allowed anywhere: float64's smallest normal (see :func:`assert_same`).
SUBNORMAL_SLACK = float(np.finfo(np.float64).tiny)


def assert_same(
    got: np.ndarray, want: np.ndarray, what: str = "", allowed: np.ndarray | None = None
) -> None:
    """``got`` equals ``want`` to :data:`RTOL` relative plus ``allowed`` (see
    :func:`allowance`), with NaN and ±inf at the same positions. Results below float64's
    smallest normal may differ by :data:`SUBNORMAL_SLACK` absolute: libraries round there
    differently (the GPU's ``pow`` gives 0 where the core gives 2^-1074), and a value that
    small is 0 in every dtype a kernel computes in."""
    assert got.shape == want.shape, what
    assert got.dtype == np.float64, what
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN positions differ"
    for sign in (1, -1):
        assert np.array_equal(got == sign * np.inf, want == sign * np.inf), (
            f"{what}: {'+' if sign > 0 else '-'}inf positions differ"
        )
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite])
    bound = np.maximum(RTOL * np.abs(want[finite]), SUBNORMAL_SLACK)
    if allowed is not None:
        bound = bound + allowed.reshape(want.shape)[finite]
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} elements off, e.g. {got[finite][bad][:3]} for "
        f"{want[finite][bad][:3]} (allowed {bound[bad][:3]})"
    )


#: Relative input change at which :func:`allowance` measures the core's sensitivity, the
#: largest relative move there of a result still compared in value (an amplification of
#: 1000), and the number of random moves measured (see :func:`allowance`).
ETA = 1e-9
ILL = 1e-6
MOVES = 16


def allowance(
    graph: yr.KernelGraph, arrays: Sequence[np.ndarray], want: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Per output element, the error allowed beyond :data:`RTOL` relative: how far the core's
    own result moves when every input moves by a random relative :data:`RTOL` (measured at
    :data:`ETA`, scaled down; the largest of :data:`MOVES` moves), which covers another
    summation order (its backward error is below n·2^-53 of each term, far below 1e-12 here).
    Unbounded where the result is ill-conditioned (a move changes it by more than :data:`ILL`
    of itself: e.g. attention weights that float64 rounding of huge tied scores decides, or a
    sum whose float32-sized extremes cancel): such elements are compared for NaN/inf only.
    Several moves, as one may land where the result does not change (ties broken towards a
    zero value), or where a cancelling sum keeps its sign: a sum whose extremes cancel below
    its terms' rounding has its sign set by the summation order, which a move flips with
    probability about one half. With 3 moves, torch's float64 matmul on an Intel Xeon (another
    order than the core's) flipped 5 of 8192 gated-MLP pre-activations that no move had, and
    silu then gave 4e118 where the core gave -0; 16 moves miss such an element with
    probability 2^-16."""
    worst = [np.zeros(w.shape) for w in want]
    for seed in range(MOVES):
        rng = np.random.default_rng(seed)
        moved = graph.evaluate([a * (1 + ETA * rng.uniform(-1, 1, a.shape)) for a in arrays])
        with np.errstate(invalid="ignore", over="ignore"):
            for i, (m, w) in enumerate(zip(moved, want, strict=True)):
                d = np.abs(m - w)
                worst[i] = np.maximum(worst[i], np.where(d <= ILL * np.abs(w), d, np.inf))
    return [d * (RTOL / ETA) for d in worst]


def on_torch(graph: yr.KernelGraph, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    outs = _reference_torch.evaluate_numpy(graph, arrays, "cpu")
    assert outs is not None, "the torch reference refused the graph"
    return outs


def check_graph(graph: yr.KernelGraph, arrays: Sequence[np.ndarray], what: str) -> None:
    want = graph.evaluate(list(arrays))
    got = on_torch(graph, arrays)
    assert len(got) == len(want)
    allowed = allowance(graph, arrays, want)
    for i, (g, w, m) in enumerate(zip(got, want, allowed, strict=True)):
        assert_same(g, w, f"{what}, output {i}", m)


# -- input sets --------------------------------------------------------------------------------


def random_inputs(graph: yr.KernelGraph, rng: np.random.Generator) -> list[np.ndarray]:
    return [2.0 * rng.standard_normal(t.dims) for t in graph.inputs]


def sprinkled(
    graph: yr.KernelGraph, rng: np.random.Generator, values: np.ndarray, density: float
) -> list[np.ndarray]:
    """Random inputs with ``density`` of their elements replaced by ``values``."""
    out = []
    for x in random_inputs(graph, rng):
        where = rng.random(x.shape) < density
        x[where] = values[rng.integers(0, len(values), int(where.sum()))]
        out.append(x)
    return out


INPUT_SETS: dict[str, Callable[[yr.KernelGraph, np.random.Generator], list[np.ndarray]]] = {
    "random": random_inputs,
    "extremes": lambda g, rng: sprinkled(g, rng, EXTREMES, 0.25),
    "dense extremes": lambda g, rng: sprinkled(g, rng, EXTREMES, 0.9),
    "non-finite": lambda g, rng: sprinkled(g, rng, np.concatenate([EXTREMES, NONFINITE]), 0.1),
}


# -- graphs covering every op ------------------------------------------------------------------


def elementwise_graph() -> yr.KernelGraph:
    """Every unary op, and every binary op under each broadcasting rule."""
    g = yr.new_kernel_graph()
    x = g.new_input((4, 8, 16), yr.float32)
    y = g.new_input((8, 16), yr.float32)
    z = g.new_input((16,), yr.float32)
    col = g.new_input((4, 8, 1), yr.float32)
    for op in ("exp", "square", "sqrt", "rsqrt", "silu", "gelu", "relu", "sigmoid", "tanh"):
        g.mark_output(getattr(g, op)(x))
    g.mark_output(g.neg(x))
    g.mark_output(g.mul_scalar(x, 0.3))
    g.mark_output(g.add_scalar(x, -1.5))
    g.mark_output(g.clamp(x, -1.0, 2.0))
    g.mark_output(g.clamp(x, 0.0, 6.0))
    for op in ("add", "sub", "mul", "div", "pow"):
        for a, b in ((x, y), (y, x), (x, z), (col, y), (x, col), (x, x)):
            g.mark_output(getattr(g, op)(a, b))
    one = g.exp(g.sub(z, z))  # 1 (NaN where z is not finite)
    for op in ("relu", "sqrt", "square"):
        g.mark_output(g.div(one, getattr(g, op)(x)))  # the sign of a zero, as ±inf
    g.mark_output(g.div(one, g.clamp(x, 0.0, 6.0)))
    g.mark_output(g.div(one, g.clamp(x, -6.0, 0.0)))
    return g


def reduction_graph() -> yr.KernelGraph:
    """Sums, maxima, softmax and rms_norm over every dim (and the trailing two)."""
    g = yr.new_kernel_graph()
    x = g.new_input((3, 5, 7), yr.float32)
    w = g.new_input((5, 7), yr.float32)
    w1 = g.new_input((1, 7), yr.float32)
    one = g.exp(g.sub(w1, w1))
    for d in (0, 1, 2, -1):
        g.mark_output(g.reduction(x, d))
        g.mark_output(g.reduce_max(x, d))
        g.mark_output(g.softmax(x, d))
        g.mark_output(g.div(one, g.reduce_max(x, d)))  # the sign of a zero maximum
    g.mark_output(g.rms_norm(x, (7,), eps=1e-6))
    g.mark_output(g.rms_norm(x, (7,), weight=w1, eps=0.0))
    g.mark_output(g.rms_norm(x, (5, 7), weight=w, eps=1e-5))
    minus_zero = g.mul_scalar(g.relu(g.neg(g.square(x))), -1.0)  # -0 (but for NaN)
    g.mark_output(g.div(one, g.reduction(minus_zero, 2)))  # a sum of -0 is +0
    return g


def layout_graph() -> yr.KernelGraph:
    """Matmuls (plain and batched), concat, chunk, permute, transpose and reshape."""
    g = yr.new_kernel_graph()
    a = g.new_input((2, 6, 8), yr.float32)
    b = g.new_input((2, 8, 5), yr.float32)
    m = g.new_input((6, 8), yr.float32)
    n = g.new_input((8, 4), yr.float32)
    ab = g.matmul(a, b)
    g.mark_output(ab)
    g.mark_output(g.matmul(m, n))
    g.mark_output(g.concat([a, g.permute(b, (0, 2, 1))], 1))
    g.mark_output(g.concat([m, m], 0))
    for piece in g.chunk(a, 2, 2):
        g.mark_output(g.exp(piece))
    g.mark_output(g.permute(ab, (2, 0, 1)))
    g.mark_output(g.transpose(a, 1, 2))
    g.mark_output(g.reshape(g.permute(a, (1, 0, 2)), (6, 16)))
    g.mark_output(g.matmul(g.reshape(a, (12, 8)), n))
    mn = g.matmul(m, n)
    minus_zero = g.mul_scalar(g.relu(g.neg(g.square(m))), -1.0)  # -0 (but for NaN)
    g.mark_output(g.div(g.exp(g.sub(mn, mn)), g.matmul(minus_zero, g.relu(n))))  # +0: +inf
    return g


def compound_graphs() -> dict[str, yr.KernelGraph]:
    """The compound builders (layer_norm, attention with QK-norm, ...) at small sizes."""
    out: dict[str, yr.KernelGraph] = {}
    g = yr.new_kernel_graph()
    x = g.new_input((4, 32), yr.float16)
    w = g.new_input((32, 24), yr.float16)
    g.mark_output(g.layer_norm(x, (32,)))
    g.mark_output(g.gemm_softmax(x, w))
    out["layer_norm, gemm_softmax"] = g
    g = yr.new_kernel_graph()
    q = g.new_input((2, 8, 16), yr.float16)
    kt = g.new_input((2, 16, 32), yr.float16)
    v = g.new_input((2, 32, 16), yr.float16)
    g.mark_output(g.self_attention(q, kt, v, qk_norm=True))
    out["self_attention(qk_norm)"] = g
    for name, w in WORKLOADS.items():
        out[f"workload {name}"] = w.graph("cpu")
    return out


GRAPHS: dict[str, Callable[[], yr.KernelGraph]] = {
    "elementwise": elementwise_graph,
    "reductions": reduction_graph,
    "layout": layout_graph,
}


@pytest.mark.parametrize("inputs", list(INPUT_SETS))
@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_op_matches_the_core(name: str, inputs: str, rng: np.random.Generator) -> None:
    graph = GRAPHS[name]()
    for _ in range(2):
        check_graph(graph, INPUT_SETS[inputs](graph, rng), f"{name} on {inputs} inputs")


@pytest.mark.parametrize("inputs", ["random", "extremes"])
def test_compound_graphs_and_workloads_match_the_core(
    inputs: str, rng: np.random.Generator
) -> None:
    for name, graph in compound_graphs().items():
        check_graph(graph, INPUT_SETS[inputs](graph, rng), f"{name} on {inputs} inputs")


def test_special_values_elementwise() -> None:
    """The core's NaN handling and edges, value by value (not torch's functions): relu and
    clamp map NaN to 0 and lo, softmax shifts by the largest finite value, silu of -inf is
    NaN, gelu uses the core's erf across its three branches."""
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 709.0, 710.0, -745.5, 3.0, -3.0, 27.0, -27.5]
    xs = np.concatenate([edges, np.linspace(-12.0, 12.0, 97)])[None, :]
    g = yr.new_kernel_graph()
    x = g.new_input(xs.shape, yr.float32)
    for op in ("exp", "sqrt", "rsqrt", "silu", "gelu", "relu", "sigmoid", "tanh"):
        g.mark_output(getattr(g, op)(x))
    g.mark_output(g.clamp(x, -1.0, 1.0))
    g.mark_output(g.softmax(x, -1))
    g.mark_output(g.pow(x, x))
    g.mark_output(g.div(x, x))
    check_graph(g, [xs], "special values")
    got = on_torch(g, [xs])
    assert got[5][0, 0] == 0.0 and got[8][0, 0] == -1.0  # relu(NaN), clamp(NaN)
    gelu_want = g.evaluate([xs])[4]
    assert np.array_equal(got[4], gelu_want, equal_nan=True)  # the core's erf, bit for bit


def test_softmax_rows_past_exp_range_and_without_finite_values() -> None:
    g = yr.new_kernel_graph()
    x = g.new_input((4, 3), yr.float32)
    g.mark_output(g.softmax(x, -1))
    xs = np.array(
        [
            [1000.0, 1000.0 + np.log(2.0), -1000.0],  # finite: the max is subtracted
            [np.inf, 0.0, 1.0],  # exp(inf)/inf: NaN; the rest 0
            [np.inf, -np.inf, np.nan],  # no finite value: unshifted
            [-np.inf, -np.inf, -np.inf],  # 0/0
        ]
    )
    (got,) = on_torch(g, [xs])
    assert_same(got, g.evaluate([xs])[0], "softmax rows")
    assert abs(got[0, 1] - 2.0 / 3.0) < 1e-12 and np.isnan(got[1, 0]) and got[1, 1] == 0.0


def test_reduce_max_keeps_the_first_of_equal_maxima_and_propagates_nan() -> None:
    """The sign of a zero maximum is the first zero's (f64 ``>`` keeps the first of equal
    values), which ``1 / max`` turns into ±inf; a NaN anywhere in a row wins."""
    g = yr.new_kernel_graph()
    x = g.new_input((5, 3), yr.float32)
    one = g.exp(g.sub(x, x))
    g.mark_output(g.reduce_max(x, 1))
    g.mark_output(g.div(g.reduce_max(one, 1), g.reduce_max(x, 1)))
    g.mark_output(g.div(g.reduce_max(one, 0), g.reduce_max(x, 0)))
    xs = np.array(
        [
            [-0.0, 0.0, -1.0],
            [0.0, -0.0, -1.0],
            [-1.0, -0.0, 0.0],
            [-2.0, np.nan, 5.0],
            [-np.inf, -0.0, -3.0],
        ]
    )
    got = on_torch(g, [xs])
    for i, (a, b) in enumerate(zip(got, g.evaluate([xs]), strict=True)):
        assert_same(a, b, f"output {i}")
    assert list(got[1][:, 0])[:3] == [-np.inf, np.inf, -np.inf] and np.isnan(got[1][3, 0])


# -- refusals ----------------------------------------------------------------------------------


def test_fused_and_multi_device_graphs_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="yirage.check")
    fused = rmsnorm_linear_ugraph(4, 64, 32, grid=2, forloop=2)
    arrays = [np.ones((4, 64)), np.ones((64, 32))]
    assert _reference_torch.evaluate(fused, arrays, "cpu") is None
    assert "'customized' is not mirrored" in caplog.text
    ranks = yr.new_kernel_graph(world_size=2)
    ranks.mark_output(ranks.all_reduce(ranks.new_input((4, 4), yr.float32)))
    assert _reference_torch.evaluate(ranks, [np.ones((4, 4))], "cpu") is None
    assert "a graph of 2 ranks" in caplog.text


def test_inputs_of_other_shapes_are_refused() -> None:
    g = elementwise_graph()
    arrays = [np.ones(t.dims) for t in g.inputs]
    arrays[1] = np.ones((16, 8))
    assert _reference_torch.evaluate(g, arrays, "cpu") is None
    assert _reference_torch.evaluate(g, arrays[:2], "cpu") is None


def test_out_of_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(op: Any, args: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory (test)")

    monkeypatch.setitem(_reference_torch._OPS, "matmul", oom)
    g = layout_graph()
    assert _reference_torch.evaluate(g, [np.ones(t.dims) for t in g.inputs], "cpu") is None


def test_a_graph_past_half_the_free_memory_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The footprint charged is four copies of the largest tensor plus the inputs, in
    float64: x [4, 8] and w [8, 16] in (w the largest): 8 * (4 * 128 + 160) bytes."""
    caplog.set_level(logging.DEBUG, logger="yirage.check")
    g = yr.new_kernel_graph()
    x = g.new_input((4, 8), yr.float32)
    w = g.new_input((8, 16), yr.float32)
    g.mark_output(g.softmax(g.matmul(x, w), -1))
    arrays = [np.ones((4, 8)), np.ones((8, 16))]
    need = 8 * (4 * 128 + 160)
    monkeypatch.setattr(_reference_torch, "_free_bytes", lambda device: 2 * need)
    assert _reference_torch.evaluate(g, arrays, "cpu") is not None
    monkeypatch.setattr(_reference_torch, "_free_bytes", lambda device: 2 * need - 2)
    assert _reference_torch.evaluate(g, arrays, "cpu") is None
    assert "over half of the" in caplog.text


# -- wiring ------------------------------------------------------------------------------------


class Calls:
    """Counts calls of the torch evaluator and of the core evaluator."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.torch: list[bool] = []
        self.core = 0
        real_torch, real_core = _reference_torch.evaluate, yr.KernelGraph.evaluate

        def spy_torch(*args: Any) -> Any:
            outs = real_torch(*args)
            self.torch.append(outs is not None)
            return outs

        def spy_core(graph: yr.KernelGraph, inputs: Any) -> Any:
            self.core += 1
            return real_core(graph, inputs)

        monkeypatch.setattr(_reference_torch, "evaluate", spy_torch)
        monkeypatch.setattr(yr.KernelGraph, "evaluate", spy_core)


@pytest.fixture
def cpu_as_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CPU torch tensors count as a GPU's (the wiring's test; the GPU test runs the same)."""
    monkeypatch.setattr(_reference_torch, "DEVICE_TYPES", ("cuda", "cpu"))
    yield


def test_device_of() -> None:
    t = torch.zeros(2)
    assert _reference_torch.device_of([np.zeros(2)]) is None
    assert _reference_torch.device_of([t]) is None  # the CPU keeps the core evaluator
    assert _reference_torch.device_of([]) is None


def test_device_of_admitted_devices(cpu_as_gpu: None) -> None:
    t = torch.zeros(2)
    assert _reference_torch.device_of([t, t]) == torch.device("cpu")
    assert _reference_torch.device_of([t, np.zeros(2)]) is None


def test_reference_outputs_takes_torch_for_device_tensors_and_the_core_for_numpy(
    cpu_as_gpu: None, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    graph = WORKLOADS["attention_prefill"].graph("cpu")
    shapes = Shapes(graph)
    arrays = _check.check_arrays(graph, shapes, 7)
    calls = Calls(monkeypatch)
    on_core = _check.reference_outputs(graph, shapes, arrays)
    assert calls.core == 1 and calls.torch == []
    tensors = [torch.from_numpy(a).to(torch.float16) for a in arrays]
    on_device = _check.reference_outputs(graph, shapes, tensors)
    assert calls.core == 1 and calls.torch == [True]
    # a graph the torch evaluator refuses: the core runs it, same numbers as without torch
    fused = rmsnorm_linear_ugraph(4, 64, 32, grid=2, forloop=2)
    fin = [rng.standard_normal(t.dims).astype(np.float32) for t in fused.inputs]
    got = _check.reference_outputs(fused, Shapes(fused), [torch.from_numpy(a) for a in fin])
    assert calls.torch == [True, False] and calls.core == 2
    assert np.array_equal(got[0], fused.evaluate(fin)[0])
    halves = [a.astype(np.float16).reshape(u) for a, u in zip(arrays, shapes.user_in, strict=True)]
    assert [o.shape for o in on_device] == [o.shape for o in on_core]
    wants = graph.evaluate(halves)
    for got, want, allowed in zip(on_device, wants, allowance(graph, halves, wants), strict=True):
        assert_same(got, want.reshape(got.shape), "attention prefill", allowed)


def test_stress_references_run_on_the_device(
    cpu_as_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stress sets built from device tensors (exp probe, references, perturbed
    re-evaluations) all run on the device and match those the core evaluator builds."""
    graph = WORKLOADS["attention_prefill"].graph("cpu")
    shapes = Shapes(graph)
    arrays = _check.check_arrays(graph, shapes, 11)
    core_sets = _superoptimize._stress_sets(graph, shapes, arrays, 5)
    calls = Calls(monkeypatch)
    tensors = [torch.from_numpy(a) for a in arrays]
    device_sets = _superoptimize._stress_sets(graph, shapes, tensors, 5)
    moved = [s.perturbed(1e-3, 1) for s in device_sets if s.perturbed is not None]
    assert calls.core == 0 and len(calls.torch) == 5 and all(calls.torch)  # 1 probe, 2 + 2 refs
    assert [s.name for s in device_sets] == [s.name for s in core_sets]
    assert len(device_sets) == len(moved) == 2  # exp overflow and extremes
    for dev, core, dev_moved in zip(device_sets, core_sets, moved, strict=True):
        for a, b in zip(dev.arrays, core.arrays, strict=True):
            assert np.array_equal(a, b)
        allowed = allowance(graph, core.arrays, core.reference)
        for got, want, a in zip(dev.reference, core.reference, allowed, strict=True):
            assert_same(got, want, dev.name, a)
        assert core.perturbed is not None
        # the inputs the device run moved (drawn there), evaluated by the core
        ins = [m.numpy() for m in _stress._moved_on(core.arrays, 1e-3, 1, torch.device("cpu"))]
        core_moved = _check.reference_outputs(graph, shapes, ins)
        allowed = allowance(graph, ins, core_moved)
        for got, want, a in zip(dev_moved, core_moved, allowed, strict=True):
            assert_same(got, want, f"{dev.name}, perturbed", a)


def test_superoptimize_on_the_cpu_backend_keeps_the_core_evaluator(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if not yr.is_backend_available("cpu"):
        pytest.skip("the cpu backend is not installed")
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    calls = Calls(monkeypatch)
    g = yr.new_kernel_graph()
    x = g.new_input((8, 256), yr.float32)
    w = g.new_input((256, 128), yr.float32)
    g.mark_output(g.matmul(g.rms_norm(x, (256,), eps=1e-6), w))
    k = _superoptimize.superoptimize(
        g, backend="cpu", cache=False, profile_options={"min_time_s": 0.01, "min_repeats": 3}
    )
    assert k.report.max_rel_err is not None and k.report.max_rel_err <= 1e-4
    assert calls.torch == [] and calls.core >= 2  # the check and the extremes set


def test_rounded_reference_once_gives_the_same_verdicts() -> None:
    """``_stress_check`` rounds a set's reference to the output dtype once, not per
    contender: the verdicts are those ``stress_error`` reaches rounding it itself."""
    ref = [np.array([1.0, 70000.0, -1e-9, np.nan, np.inf, 3.0 + 2.0**-12])]
    rounded = _stress.rounded_reference(ref, ["float16"])
    with np.errstate(over="ignore"):
        halves = [o.astype(np.float16) for o in (ref[0], ref[0] * (1 + 1e-3), ref[0] * 0.5)]
    assert np.array_equal(rounded[0], halves[0].astype(np.float64), equal_nan=True)
    for out in halves:
        outs = [out]
        assert _stress.stress_error(outs, ref, ["float16"], rounded=rounded) == (
            _stress.stress_error(outs, ref, ["float16"])
        )
