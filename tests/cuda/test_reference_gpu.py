"""GPU: the check's float64 reference evaluated on the device (``yirage._reference_torch``)
equals the core evaluator (``pytest -m cuda tests/cuda/test_reference_gpu.py``; needs the
device). The prefill-sized graph is compared on slices the core evaluates in moments: one
head's first and last query rows against all 4096 keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_reference_torch import GRAPHS, INPUT_SETS, allowance, assert_same

import yirage as yr
from yirage import _check, _compare_torch, _reference_torch, _stress, _superoptimize
from yirage._shapes import Shapes
from yirage._workloads import WORKLOADS, _gqa_graph, _prefill_shapes

pytestmark = pytest.mark.cuda

#: Query rows per slice, and the (head, first row) of each slice of the 32 x 4096 prefill.
ROWS = 64
SLICES = ((0, 0), (31, 4096 - ROWS))


def _slice_graph() -> yr.KernelGraph:
    """Attention prefill of one head and :data:`ROWS` query rows against 4096 keys."""
    return _gqa_graph(_prefill_shapes(ROWS, yr.float16, heads=1, kv=4096), yr.float16)


def _check_slices(
    reference: list[np.ndarray], q: np.ndarray, kt: np.ndarray, v: np.ndarray, what: str
) -> None:
    """``reference`` (the prefill's output, heads x rows x d) on :data:`SLICES` against the
    core evaluator on the sliced inputs."""
    small = _slice_graph()
    for head, row in SLICES:
        ins = [q[head : head + 1, row : row + ROWS], kt[head : head + 1], v[head : head + 1]]
        (want,) = small.evaluate(ins)
        (allowed,) = allowance(small, ins, [want])
        got = reference[0][head : head + 1, row : row + ROWS]
        assert_same(got, want, f"{what}: head {head}, rows {row}..{row + ROWS}", allowed)


def test_prefill_reference_on_the_gpu_matches_the_core_on_slices(
    gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 heads x 4096 x 4096 x d128 (float16): the check's reference and both stress sets'
    (exp overflow, dtype extremes) run on the GPU, never in the core evaluator."""
    graph = WORKLOADS["attention_prefill"].graph("prefill_4096")
    shapes = Shapes(graph)
    tensors = _check.check_tensors(gpu, graph, shapes, 3)
    assert _reference_torch.device_of(tensors) is not None
    core_calls: list[int] = []
    real_core = yr.KernelGraph.evaluate

    def spy(g: yr.KernelGraph, inputs: Any) -> Any:
        core_calls.append(1)
        return real_core(g, inputs)

    monkeypatch.setattr(yr.KernelGraph, "evaluate", spy)
    reference = _check.reference_outputs(graph, shapes, tensors)
    stress = _superoptimize._stress_sets(graph, shapes, tensors, 3)
    perturbed = stress[0].perturbed
    assert perturbed is not None
    moved = perturbed(1e-3, 1)
    assert core_calls == []
    monkeypatch.undo()

    q, kt, v = (t.double().cpu().numpy() for t in tensors)
    _check_slices(reference, q, kt, v, "check inputs")
    assert [s.name.split(":")[0] for s in stress] == ["exp stress", "dtype extremes"]
    for s in stress:
        _check_slices(s.reference, *s.arrays, what=s.name)
    # the inputs ``perturbed`` moved on the GPU (the same generator and seed draw them again)
    device = tensors[0].device
    arrays = [m.cpu().numpy() for m in _stress._moved_on(stress[0].arrays, 1e-3, 1, device)]
    _check_slices(moved, *arrays, what="exp stress, perturbed")


@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_op_on_the_gpu_matches_the_core(
    gpu: Any, name: str, rng: np.random.Generator
) -> None:
    """The CPU suite's op graphs and input sets (extremes, NaN, ±inf) on the GPU."""
    graph = GRAPHS[name]()
    for inputs, make in INPUT_SETS.items():
        arrays = make(graph, rng)
        got = _reference_torch.evaluate_numpy(graph, arrays, "cuda")
        assert got is not None
        want = graph.evaluate(arrays)
        allowed = allowance(graph, arrays, want)
        for i, (g, w, a) in enumerate(zip(got, want, allowed, strict=True)):
            assert_same(g, w, f"{name} on {inputs} inputs, output {i}", a)


def test_zero_signs_of_long_rows_on_the_gpu(gpu: Any) -> None:
    """Reductions over 4096 (tree reductions on the GPU): a zero maximum keeps the first
    zero's sign, sums and matmuls of -0 are +0, as in the core."""
    n = 4096
    g = yr.new_kernel_graph()
    x = g.new_input((4, n), yr.float32)
    w = g.new_input((n, 8), yr.float32)
    ones = g.exp(g.sub(g.reduction(x, 1), g.reduction(x, 1)))
    g.mark_output(g.div(ones, g.reduce_max(x, 1)))
    g.mark_output(g.div(ones, g.reduction(x, 1)))
    g.mark_output(g.matmul(x, w))
    xs = np.zeros((4, n))
    xs[0, :] = -0.0
    xs[1, n // 2 :] = -0.0
    xs[2, : n // 2] = -0.0
    xs[3, ::2] = -0.0
    ws = np.ones((n, 8))
    got = _reference_torch.evaluate_numpy(g, [xs, ws], "cuda")
    assert got is not None
    want = g.evaluate([xs, ws])
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_same(a, b, f"output {i}")
        assert np.array_equal(np.signbit(a), np.signbit(b)), f"output {i}: zero signs differ"


def test_comparisons_on_the_gpu_match_numpy(gpu: Any) -> None:
    """The check's comparisons run where a kernel's outputs live (``yirage._compare_torch``):
    on the GPU they give numpy's verdicts and errors, on a 4096 x 4096 float16 output with a
    NaN, an overflow at the dtype's edge and a reference NaN."""
    import torch

    rng = np.random.default_rng(5)
    ref = rng.standard_normal((4096, 4096))
    ref[0, 0], ref[0, 1] = 65504.0 * (1 + 1e-3), np.nan
    rounded = _stress.rounded_reference([ref], ["float16"])
    like = [torch.zeros(1, device="cuda")]
    on_gpu = _compare_torch.to_device([ref], like)
    rounded_gpu = _compare_torch.to_device(rounded, like)
    assert on_gpu[0].device.type == "cuda"
    with np.errstate(over="ignore", invalid="ignore"):
        out = (ref * (1 + 1e-3 * rng.standard_normal(ref.shape))).astype(np.float16)
    bad = out.copy()
    bad[7, 9] = np.nan
    for o in (out, bad):
        want = _stress.stress_error([o], [ref], ["float16"], 1e-2, None, rounded)
        got = _stress.stress_error(
            [torch.from_numpy(o).cuda()], on_gpu, ["float16"], 1e-2, None, rounded_gpu
        )
        assert got[1] == want[1]
        assert got[0] == pytest.approx(want[0], rel=1e-9)
    finite = np.nan_to_num(ref, nan=0.0, posinf=0.0)
    want_err = _check.rel_frobenius(out.astype(np.float64), finite)
    got_err = _check.rel_frobenius(
        torch.from_numpy(out).cuda(), _compare_torch.to_device([finite], like)[0]
    )
    assert got_err == pytest.approx(want_err, rel=1e-9)
