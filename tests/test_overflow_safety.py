"""Overflow safety: a superoptimized kernel is finite wherever the graph's value is.

Two layers are tested: by construction (library exps that feed a normalising sum are shifted
by their maximum, and candidates whose unshifted exp enters a generated kernel are not
offered) and by the stress check (inputs scaled until a naive exp overflows; a candidate
must match the float64 reference on them before it may win)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr
from yirage import _core, _stress
from yirage._kernel import CandidateReport, Shapes, SuperoptimizeReport
from yirage._search import device_spec_json
from yirage._superoptimize import _stress_check

FAST_PROFILE = {"min_time_s": 0.01, "min_repeats": 5}


def _superoptimize(g: yr.KernelGraph) -> yr.OptimizedKernel:
    return g.superoptimize(
        backend="cpu", cache=False, device_spec=REFERENCE_CPU, profile_options=FAST_PROFILE
    )


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _softmax_graph(written_out: bool) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((64, 1024), yr.float32)
    if written_out:
        e = g.exp(x)
        g.mark_output(g.div(e, g.reduction(e, 1)))
    else:
        g.mark_output(g.softmax(x))
    return g


@pytest.mark.parametrize("written_out", [False, True])
def test_softmax_of_large_logits_is_finite_on_every_run(written_out: bool) -> None:
    """X[64, 1024] x 40: logits past float32's exp overflow. Which candidate wins depends
    on profiling, so three runs must all give the reference's numbers."""
    g = _softmax_graph(written_out)
    x = (np.random.default_rng(1).standard_normal((64, 1024)) * 40).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    for _ in range(3):
        k = _superoptimize(g)
        (out,) = k(x)
        assert np.isfinite(out).all(), str(k.report)
        assert _rel(np.asarray(out, dtype=np.float64), ref) < 1e-5, str(k.report)
        assert any("exp stress" in n for n in k.report.notes), str(k.report)


def test_attention_with_large_scores_is_finite() -> None:
    """Q[32,16,64]·K[32,64,4096]·V with inputs of std 3: scores up to ~250."""
    g = yr.new_kernel_graph()
    q = g.new_input((32, 16, 64), yr.float32)
    kt = g.new_input((32, 64, 4096), yr.float32)
    v = g.new_input((32, 4096, 64), yr.float32)
    g.mark_output(g.matmul(g.softmax(g.matmul(q, kt)), v))
    k = _superoptimize(g)
    rng = np.random.default_rng(2)
    ins = [(rng.standard_normal(t.dims) * 3).astype(np.float32) for t in g.inputs]
    s = np.matmul(ins[0].astype(np.float64), ins[1].astype(np.float64))
    assert s.max() > 150  # naive exp overflows float32 here
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = np.matmul(p / p.sum(axis=-1, keepdims=True), ins[2].astype(np.float64))
    (out,) = k(*ins)
    assert np.isfinite(out).all(), str(k.report)
    assert _rel(np.asarray(out, dtype=np.float64), ref) < 1e-4, str(k.report)


def test_library_exp_of_a_written_out_softmax_is_shifted_in_the_plan() -> None:
    g = _softmax_graph(written_out=True)
    spec, _ = device_spec_json(REFERENCE_CPU, "cpu")
    plan = json.loads(_core.kernel_plan(g._g, spec))
    exps = [k for k in plan["kernels"] if k.get("params", {}).get("op") == "exp"]
    assert [k["params"].get("shift_dims") for k in exps] == [[1]]


def test_an_overflow_of_the_graph_itself_does_not_reject_every_candidate() -> None:
    """exp(X) · exp(-X) is 1, but computed as written it is inf · 0 = NaN in float32 once
    X passes 88.7: the library baseline fails the stress set too, so it is reported and not
    enforced (every candidate would be rejected otherwise)."""
    g = yr.new_kernel_graph()
    x = g.new_input((16, 128), yr.float32)
    g.mark_output(g.mul(g.exp(x), g.exp(g.neg(x))))
    k = _superoptimize(g)
    assert any("exp stress" in n and "not enforced" in n for n in k.report.notes), str(k.report)
    xs = np.random.default_rng(3).standard_normal((16, 128)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(k(xs)[0], dtype=np.float64), 1.0, rtol=1e-6)


# -- the stress set ----------------------------------------------------------------------


def _stress_set(g: yr.KernelGraph) -> _stress.StressSet | None:
    shapes = Shapes(g)
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(t.dims) * (0.1 if len(t.dims) > 1 else 1) for t in g.inputs]
    return _stress.exp_stress(g, shapes, arrays, lambda ins: g.evaluate(ins))


def test_stress_scale_reaches_the_target_for_linear_and_quadratic_arguments() -> None:
    g = _softmax_graph(written_out=False)
    s = _stress_set(g)
    assert s is not None
    assert np.abs(s.arrays[0]).max() > 88.7  # the argument is the input itself
    assert np.isfinite(s.reference[0]).all()
    a = yr.new_kernel_graph()
    q = a.new_input((2, 8, 16), yr.float16)
    kt = a.new_input((2, 16, 32), yr.float16)
    a.mark_output(a.softmax(a.matmul(q, kt)))
    s = _stress_set(a)
    assert s is not None
    scores = np.matmul(s.arrays[0].astype(np.float64), s.arrays[1].astype(np.float64))
    assert 0.5 * _stress.EXP_TARGET <= np.abs(scores).max() <= 5 * _stress.EXP_TARGET
    # float16 inputs hold values exact in float16
    assert all(np.array_equal(x, x.astype(np.float16).astype(np.float32)) for x in s.arrays)


def test_stress_scale_of_an_argument_that_is_not_homogeneous() -> None:
    """softmax(x + x·x): no single degree, so the scale is found by evaluating."""
    g = yr.new_kernel_graph()
    x = g.new_input((8, 64), yr.float32)
    g.mark_output(g.softmax(g.add(x, g.mul(x, x))))
    assert _stress._homogeneous_degree(_stress._exp_argument_graph(g)) is None  # type: ignore[arg-type]
    s = _stress_set(g)
    assert s is not None
    x64 = s.arrays[0].astype(np.float64)
    assert 0.5 * _stress.EXP_TARGET <= np.abs(x64 + x64 * x64).max() <= 5 * _stress.EXP_TARGET


def test_no_stress_set_without_exp_or_for_a_normalised_argument() -> None:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 64), yr.float32)
    g.mark_output(g.mul(x, x))
    assert _stress_set(g) is None
    g = yr.new_kernel_graph()
    x = g.new_input((8, 64), yr.float32)
    g.mark_output(g.softmax(g.rms_norm(x, normalized_shape=(64,))))
    assert _stress_set(g) is None  # rms_norm(c·x) = rms_norm(x): no scale reaches overflow


def test_stress_error_compares_the_finite_pattern_in_the_output_dtype() -> None:
    ref = np.array([[1.0, 2.0, 1e5]])  # 1e5 overflows float16
    ok = np.array([[1.0, 2.0, np.inf]], dtype=np.float16)
    assert _stress.stress_error([ok], [ref], ["float16"]) == (0.0, None)
    nan = np.array([[1.0, np.nan, np.inf]], dtype=np.float32)
    err, why = _stress.stress_error([nan], [ref], ["float16"])
    assert err == np.inf and why is not None and "NaN/Inf" in why
    finite = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    _, why = _stress.stress_error([finite], [ref], ["float16"])
    assert why is not None and "overflows float16" in why


def _report(n: int) -> SuperoptimizeReport:
    rep = SuperoptimizeReport(
        backend="cpu", backend_version="0", verification_level="x", device="d"
    )
    rep.candidates = [CandidateReport(index=i, hash=None, description="") for i in range(n)]
    for c in rep.candidates:
        c.status = "ok"
    return rep


def test_stress_check_rejects_a_candidate_that_overflows_and_keeps_the_rest() -> None:
    from yirage_cpu._backend import CpuBackend

    g = _softmax_graph(written_out=False)
    stress = _stress_set(g)
    assert stress is not None
    good = [np.asarray(r, dtype=np.float32) for r in stress.reference]

    def correct(*_: Any) -> list[np.ndarray]:
        return good

    def naive(*args: Any) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            e = np.exp(np.asarray(args[0], dtype=np.float32))
            return [e / e.sum(axis=1, keepdims=True)]

    passing = [(0.0, 0, {}, None, naive), (0.0, 1, {}, None, correct)]
    rep = _report(2)
    kept = _stress_check(CpuBackend(), g, stress, passing, {1}, rep)
    assert [p[1] for p in kept] == [1]
    assert rep.candidates[0].status == "rejected"
    assert "NaN/Inf" in (rep.candidates[0].error or "")
    # a baseline that fails too: the overflow is the graph's own, nothing is rejected
    rep = _report(2)
    kept = _stress_check(CpuBackend(), g, stress, passing, {0}, rep)
    assert [p[1] for p in kept] == [0, 1]
    assert any("not enforced" in n for n in rep.notes)


def test_a_baseline_printing_that_loses_values_its_sibling_keeps_is_dropped() -> None:
    """A stress set every printing of the library baseline fails is not enforced, but a
    printing that gives NaN/Inf where another printing of the baseline and the reference are
    finite (16-bit intermediates overflowing where float32 ones do not) is still dropped;
    the most finite printing stays, and a fused candidate is not judged by this rule."""
    from yirage_cpu._backend import CpuBackend

    g = _softmax_graph(written_out=False)
    stress = _stress_set(g)
    assert stress is not None
    good = [np.asarray(r, dtype=np.float32) for r in stress.reference]

    def losing(rows: int) -> Any:
        def run(*_: Any) -> list[np.ndarray]:
            out = good[0].copy()
            out[:rows] = np.nan  # fails the set on its own
            return [out]

        return run

    passing = [
        (0.0, 0, {}, None, losing(1), "default"),
        (0.0, 0, {}, None, losing(3), "eager"),
        (0.0, 1, {}, None, losing(5)),
    ]
    rep = _report(2)
    kept = _stress_check(CpuBackend(), g, stress, passing, {0}, rep)
    assert [(p[1], p[5] if len(p) > 5 else None) for p in kept] == [(0, "default"), (1, None)]
    why = rep.candidates[0].dropped_variants["eager"]
    assert "NaN/Inf where the float64 reference and the baseline's default printing" in why
    assert any("not enforced beyond the baseline's own printings" in n for n in rep.notes)
    # printings that each keep values the other loses: neither is the worse one
    crossed = [np.asarray(good[0]).copy() for _ in range(2)]
    crossed[0][0], crossed[1][1] = np.nan, np.nan
    passing = [
        (0.0, 0, {}, None, lambda *_: [crossed[0]], "default"),
        (0.0, 0, {}, None, lambda *_: [crossed[1]], "eager"),
    ]
    kept = _stress_check(CpuBackend(), g, stress, passing, {0}, _report(1))
    assert len(kept) == 2


# -- the dtype-extremes set ----------------------------------------------------------------


def _extremes(g: yr.KernelGraph, seed: int = 7) -> _stress.StressSet:
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(t.dims) for t in g.inputs]
    return _stress.extremes_stress(g, Shapes(g), arrays, lambda ins: g.evaluate(ins), seed)


def _rms_norm_graph(dtype: str) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((32, 512), getattr(yr, dtype))
    g.mark_output(g.rms_norm(x, normalized_shape=(512,)))
    return g


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtype_extremes_are_the_dtypes_own_and_sprinkled_sparsely(dtype: str) -> None:
    values = _stress.dtype_extremes(dtype)
    assert np.array_equal(_stress._round_to(values, dtype), values)  # exact in the dtype
    big, _, normal, _, sub, _, zero, neg_zero = values.astype(np.float64)
    if dtype == "float16":  # the dtype's own largest value: the next one is past its range
        assert big == 65504.0
        assert np.isinf(_stress._round_to(np.array([big * (1 + 2.0**-7)], np.float32), dtype)[0])
    else:  # capped so that its square stays inside float32, where kernels compute
        assert big == _stress.LARGEST_CAP and np.isfinite(np.float32(big) * np.float32(big))
    assert 0 < sub < normal and _stress._round_to(np.array([sub / 2], np.float32), dtype)[0] == 0
    assert zero == 0 and np.signbit(neg_zero)
    g = _rms_norm_graph(dtype)
    s = _extremes(g)
    x = s.arrays[0]
    hit = np.isin(x, values) & (x != 0)
    assert 0.5 * _stress.EXTREMES_DENSITY < hit.mean() * 8 / 6 < 2 * _stress.EXTREMES_DENSITY
    assert set(np.unique(x[hit])) == set(values[values != 0])
    assert np.array_equal(_extremes(g).arrays[0], x)  # the same for the same seed
    assert not np.array_equal(_extremes(g, seed=8).arrays[0], x)


def test_extremes_set_catches_a_sum_of_squares_in_float16() -> None:
    """A float16 RMSNorm whose sum of squares is taken in float16 overflows at 65504 and
    returns zeros where the graph's values are ordinary; one that sums in float32 passes."""
    g = _rms_norm_graph("float16")
    s = _extremes(g)
    tol = _stress.stress_tolerance("float16")

    def rms(x: np.ndarray, acc: type) -> list[np.ndarray]:
        v = np.asarray(x).astype(acc)
        with np.errstate(all="ignore"):
            r = np.sqrt((v * v).mean(axis=-1, keepdims=True, dtype=acc) + acc(1e-6))
            return [(v / r).astype(np.float16)]

    err, why = _stress.stress_error(rms(s.arrays[0], np.float32), s.reference, ["float16"])
    assert why is None and err <= tol
    err, why = _stress.stress_error(rms(s.arrays[0], np.float16), s.reference, ["float16"])
    assert why is not None or err > tol


def test_a_nan_of_the_reference_is_not_compared_but_an_inf_is() -> None:
    """A NaN reference is undefined (a float64 exp that overflowed, inf/inf): a shifted
    kernel's number there is accepted; an infinite reference needs a non-finite output."""
    ref = np.array([[np.nan, 1.0, np.inf]])
    assert _stress.stress_error([np.array([[0.5, 1.0, np.nan]])], [ref], ["float32"]) == (
        0.0,
        None,
    )
    err, why = _stress.stress_error([np.array([[0.5, 1.0, 3.0]])], [ref], ["float32"])
    assert err == np.inf and why is not None and "overflows float32" in why


def test_stress_check_rejects_a_float16_sum_of_squares_on_the_extremes_set() -> None:
    from yirage_cpu._backend import CpuBackend

    g = _rms_norm_graph("float16")
    s = _extremes(g)

    def rms(acc: type) -> Any:
        def run(x: Any) -> list[np.ndarray]:
            v = np.asarray(x).astype(acc)
            with np.errstate(all="ignore"):
                r = np.sqrt((v * v).mean(axis=-1, keepdims=True, dtype=acc) + acc(1e-6))
                return [(v / r).astype(np.float16)]

        return run

    passing = [(0.0, 0, {}, None, rms(np.float16)), (0.0, 1, {}, None, rms(np.float32))]
    rep = _report(2)
    kept = _stress_check(CpuBackend(), g, s, passing, {1}, rep)
    assert [p[1] for p in kept] == [1]
    assert rep.candidates[0].status == "rejected"
    assert "dtype extremes" in (rep.candidates[0].error or "")


def test_superoptimize_checks_every_contender_on_the_dtype_extremes() -> None:
    """float16 RMSNorm + Linear on the CPU: the extremes set runs, every generated kernel
    accumulates in float32 and passes it, and the result matches float64 on ordinary inputs."""
    g = yr.new_kernel_graph()
    x = g.new_input((8, 256), yr.float16)
    w = g.new_input((256, 128), yr.float16)
    g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(256,)), w))
    k = _superoptimize(g)
    notes = [n for n in k.report.notes if n.startswith("dtype extremes")]
    assert any("checked every contender" in n for n in notes), str(k.report)
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((8, 256)).astype(np.float16)
    ws = (rng.standard_normal((256, 128)) / 16).astype(np.float16)
    (ref,) = g.evaluate([xs.astype(np.float64), ws.astype(np.float64)])
    (out,) = k(xs, ws)
    assert _rel(np.asarray(out, dtype=np.float64), ref) < 1e-2


def test_a_value_at_the_dtypes_edge_may_round_to_its_infinity() -> None:
    """65504 is float16's largest value: a kernel within the tolerance of it may round past it
    to +inf (not to -inf or NaN); further from the edge it must stay finite."""
    ref = np.array([[65504.0 * (1 - 1e-3), 1.0]])
    got = np.array([[np.inf, 1.0]])
    assert _stress.stress_error([got], [ref], ["float16"], edge=1e-2) == (0.0, None)
    assert _stress.stress_error([got], [ref], ["float16"])[1] is not None  # no edge given
    assert _stress.stress_error([-got], [ref], ["float16"], edge=1e-2)[1] is not None
    far = np.array([[60000.0, 1.0]])
    assert _stress.stress_error([got], [far], ["float16"], edge=1e-2)[1] is not None


def test_a_value_just_past_the_dtypes_edge_may_stay_finite() -> None:
    """-65527.5 rounds to float16's -inf; PyTorch eager, rounding the normalised row to
    float16 before its matmul, gave -65504 there: within the tolerance, so finite is allowed.
    Further past the edge, or of the other sign, a finite value is still an error, and so is a
    finite value where float64 itself overflowed."""
    ref = np.array([[-65527.5, 1.0]])
    got = np.array([[-65504.0, 1.0]])
    assert _stress.stress_error([got], [ref], ["float16"], edge=1e-2) == (0.0, None)
    assert _stress.stress_error([got], [ref], ["float16"])[1] is not None  # no edge given
    assert _stress.stress_error([-got], [ref], ["float16"], edge=1e-2)[1] is not None
    far = np.array([[-70000.0, 1.0]])
    assert _stress.stress_error([got], [far], ["float16"], edge=1e-2)[1] is not None
    beyond = np.array([[-np.inf, 1.0]])
    assert _stress.stress_error([got], [beyond], ["float16"], edge=1e-2)[1] is not None


def _matmul_stress(
    xs: list[list[float]], ws: list[list[float]]
) -> tuple[yr.KernelGraph, _stress.StressSet]:
    """A float16 X[1,3] @ W[3,2] and the stress set of the given values."""
    g = yr.new_kernel_graph()
    x = g.new_input((1, 3), yr.float16)
    w = g.new_input((3, 2), yr.float16)
    g.mark_output(g.matmul(x, w))
    arrays = [np.array(xs, dtype=np.float32), np.array(ws, dtype=np.float32)]

    def reference(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return g.evaluate([a.astype(np.float64) for a in arrays])

    return g, _stress.StressSet(
        "a cancelling set", arrays, reference(arrays), _stress._perturbed(reference, arrays)
    )


@pytest.mark.parametrize("on_device", [False, True])
def test_perturbed_inputs_move_by_eta_and_mirror(on_device: bool) -> None:
    """The perturbed references see each input element times ``1 + eta·v``, ``|v| <= 1``:
    the same ``v`` for ``eta`` and ``-eta`` (a draw and its mirror), another for another
    seed, the same again for the same seed; drawn on the host, or on the torch device the
    references run on (CPU torch stands in for a GPU here)."""
    device = None
    if on_device:
        torch = pytest.importorskip("torch")
        device = torch.device("cpu")
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((33, 7)).astype(np.float32), np.ones(5, np.float32)]
    seen: list[list[np.ndarray]] = []

    def reference(moved: list[Any]) -> list[np.ndarray]:
        out = [np.asarray(m.cpu().numpy() if hasattr(m, "cpu") else m) for m in moved]
        assert all(o.dtype == np.float64 for o in out)
        seen.append(out)
        return out

    run = _stress._perturbed(reference, arrays, device)
    eta = 1e-3
    up, down, again, other = run(eta, 1), run(-eta, 1), run(eta, 1), run(eta, 2)
    for i, a in enumerate(arrays):
        v = up[i] / a - 1
        assert np.all(np.abs(v) <= eta * (1 + 1e-6)) and np.abs(v).max() > eta / 2
        np.testing.assert_allclose(up[i] + down[i], 2 * a, rtol=1e-12)
        np.testing.assert_array_equal(again[i], up[i])
        assert not np.array_equal(other[i], up[i])
    assert len(seen) == 4


def _cancelling_stress() -> tuple[yr.KernelGraph, _stress.StressSet]:
    """X @ W whose element (0, 0) is 65504² + 0.5 - 65504² = 0.5 exactly (no float32 sum keeps
    the 0.5 next to 4.3e9) and whose element (0, 1) is 2: well conditioned."""
    return _matmul_stress([[65504.0, 1.0, -65504.0]], [[65504.0, 0.0], [0.5, 2.0], [65504.0, 0.0]])


def test_an_element_float32_cannot_resolve_is_checked_for_finiteness_only() -> None:
    """A stress set's element that is the small difference of huge terms is exempt from the
    value comparison (every float32 summation order misses it: the float32 evaluation of the
    same sum gives 0, not 0.5) but not from the finite/non-finite one; a well-conditioned
    element is still compared."""
    g, stress = _cancelling_stress()
    (ref,) = stress.reference
    x32, w32 = stress.arrays
    float32_sum = np.float32(x32[0, 0] * w32[0, 0]) + np.float32(x32[0, 1] * w32[1, 0])
    float32_sum = np.float32(float32_sum + np.float32(x32[0, 2] * w32[2, 0]))
    assert ref[0, 0] == 0.5 and float32_sum == 0.0
    tol = _stress.stress_tolerance("float16")
    eta = _stress.rounding_bound(g, "float16")
    runs = [stress.perturbed(eta, seed) for seed in (1, 2)]  # type: ignore[misc]
    exempt = _stress.ill_conditioned(ref, [r[0] for r in runs], tol)
    assert exempt.tolist() == [[True, False]]
    in_float32 = np.array([[0.0, 2.0]])
    assert _stress.stress_error([in_float32], [ref], ["float16"])[0] > tol  # without exemption
    assert _stress.stress_error([in_float32], [ref], ["float16"], exempt=[exempt]) == (0.0, None)
    nan = np.array([[np.nan, 2.0]])
    assert _stress.stress_error([nan], [ref], ["float16"], exempt=[exempt])[1] is not None
    wrong = np.array([[0.5, 3.0]])
    assert _stress.stress_error([wrong], [ref], ["float16"], exempt=[exempt])[0] > tol


def test_an_exempt_element_may_stay_finite_where_the_reference_overflows() -> None:
    """Element (0, 0) is 65504² + 80000 - 65504²: 80000 overflows float16, but float32 cannot
    resolve it next to 4.3e9, so a kernel may sum it to a finite value (an order the library
    did not take): not a defect. Element (0, 1) = 40000 is well conditioned: a kernel that
    returned a finite value where it overflowed would still be refused."""
    g, stress = _matmul_stress(
        [[65504.0, 40000.0, -65504.0]], [[65504.0, 0.0], [2.0, 1.0], [65504.0, 0.0]]
    )
    (ref,) = stress.reference
    assert ref.tolist() == [[80000.0, 40000.0]]
    tol = _stress.stress_tolerance("float16")
    assert stress.perturbed is not None
    moved = stress.perturbed(_stress.rounding_bound(g, "float16"), 1)
    exempt = _stress.ill_conditioned(ref, [moved[0]], tol)
    assert exempt.tolist() == [[True, False]]
    finite = np.array([[60000.0, 40000.0]])
    _, why = _stress.stress_error([finite], [ref], ["float16"])
    assert why is not None and "finite where the float64 reference overflows" in why
    assert _stress.stress_error([finite], [ref], ["float16"], exempt=[exempt]) == (0.0, None)
    nothing = [np.zeros_like(exempt)]
    assert _stress.stress_error([finite], [ref], ["float16"], exempt=nothing)[1] is not None


def _gated_stress() -> tuple[yr.KernelGraph, _stress.StressSet]:
    """silu(x·W1)·(x·W3) in float32, x [1, 3]. Element (0, 0): x·W1 is 2^112 + 3·2^40 -
    2^112, which float64 sums to 0 (the 3·2^40 is absorbed next to 2^112), so the reference
    is silu(0)·2^112 = 0, while the exact value 3·2^40 · 2^112 overflows float32. Element
    (0, 1): silu(3)·3, well conditioned."""
    g = yr.new_kernel_graph()
    x = g.new_input((1, 3), yr.float32)
    w1 = g.new_input((3, 2), yr.float32)
    w3 = g.new_input((3, 2), yr.float32)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w3)))
    arrays = [
        np.array([[2.0**56, 3.0, 2.0**56]], dtype=np.float32),
        np.array([[2.0**56, 0.0], [2.0**40, 1.0], [-(2.0**56), 0.0]], dtype=np.float32),
        np.array([[2.0**56, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=np.float32),
    ]

    def reference(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return g.evaluate([a.astype(np.float64) for a in arrays])

    return g, _stress.StressSet(
        "a gated set", arrays, reference(arrays), _stress._perturbed(reference, arrays)
    )


def test_an_element_the_float64_reference_cannot_bound_need_not_be_finite() -> None:
    """Where float64's own rounding of a cancelled sum, times a large factor, decides
    whether the value overflows, a kernel may return infinity; a well-conditioned element
    must still be finite, and without the exemption the infinity is refused."""
    g, stress = _gated_stress()
    (ref,) = stress.reference
    assert ref[0, 0] == 0.0 and np.isfinite(ref[0, 1])
    tol = _stress.stress_tolerance("float32")
    ex = _stress.Exemptions(g, stress, tol, list(stress.arrays))
    exempt, unbounded = ex.step(2)
    assert unbounded is not None and exempt[0].tolist() == [[True, False]]
    assert unbounded[0].tolist() == [[True, False]]
    overflowed = np.array([[np.inf, ref[0, 1]]])
    _, why = _stress.stress_error([overflowed], [ref], ["float32"], exempt=exempt)
    assert why is not None and "NaN/Inf where the float64 reference is finite" in why
    err, why = _stress.stress_error(
        [overflowed], [ref], ["float32"], exempt=exempt, unbounded=unbounded
    )
    assert why is None and err < 1e-6
    both = np.array([[np.inf, np.inf]])
    _, why = _stress.stress_error([both], [ref], ["float32"], exempt=exempt, unbounded=unbounded)
    assert why is not None


def test_the_stress_check_lets_such_an_element_overflow_and_says_so() -> None:
    from yirage_cpu._backend import CpuBackend

    g, stress = _gated_stress()
    (ref,) = stress.reference

    def contender(index: int, out: list[list[float]]) -> tuple[Any, ...]:
        return (0.0, index, {}, None, lambda *_: [np.array(out)])

    rep = _report(2)
    entries = [contender(0, [[np.inf, ref[0, 1]]]), contender(1, [[0.0, np.inf]])]
    kept = _stress_check(CpuBackend(), g, stress, entries, set(), rep)
    assert [e[1] for e in kept] == [0]
    assert any("float64 reference cannot tell" in n for n in rep.notes), rep.notes


def test_a_well_scaled_cancellation_stays_bounded() -> None:
    """The cancelling matmul of the float16 sets: float64 resolves it, so its element is
    exempt from the value comparison but must still be finite."""
    g, stress = _cancelling_stress()
    ex = _stress.Exemptions(g, stress, _stress.stress_tolerance("float16"), list(stress.arrays))
    assert ex.step(0)[0][0].tolist() == [[True, False]] and ex.step(0)[1] is None
    exempt, unbounded = ex.step(2)
    assert exempt[0].tolist() == [[True, False]]
    assert unbounded is not None and unbounded[0].tolist() == [[False, False]]


def test_the_stress_check_exempts_cancellation_and_says_so() -> None:
    """End to end through the check: a contender that sums in float32 passes the cancelling
    set, the report names the exempt elements; one wrong where float32 is exact fails."""
    g, stress = _cancelling_stress()

    from yirage_cpu._backend import CpuBackend

    def contender(index: int, out: list[list[float]]) -> tuple[Any, ...]:
        return (0.0, index, {}, None, lambda *_: [np.array(out)])

    rep = _report(2)
    entries = [contender(0, [[0.0, 2.0]]), contender(1, [[0.0, 3.0]])]
    kept = _stress_check(CpuBackend(), g, stress, entries, set(), rep)
    assert [e[1] for e in kept] == [0]
    assert any("checked for finiteness only" in n for n in rep.notes), rep.notes


def _lora_extremes(seed: int) -> list[np.ndarray]:
    """The LoRA workload's check inputs of ``seed`` with the extremes set's sprinkle (what
    superoptimize's dtype-extremes stress set holds for that check seed)."""
    from yirage._check import check_inputs
    from yirage._workloads import get_workload

    g = get_workload("lora").graph("cpu")
    sset = _stress.extremes_stress(g, Shapes(g), check_inputs(g, seed), g.evaluate, seed)
    return sset.arrays


def _chunked_lora_overflows(arrays: list[np.ndarray], chunk: int) -> bool:
    """Whether x·w + (x·a)·b computed in float32 as a sum over ``chunk``-wide slices of the
    contraction, (x_k·a_k)·b per slice, is NaN/Inf somewhere the graph's order (x·a first)
    and the float64 reference are finite."""
    x, w, a, b = arrays
    with np.errstate(all="ignore"):
        ref = (x.astype(np.float64) @ w + (x.astype(np.float64) @ a) @ b).astype(np.float32)
        graph_order = x @ w + (x @ a) @ b
        chunked = np.zeros_like(graph_order)
        for k in range(0, x.shape[1], chunk):
            s = slice(k, k + chunk)
            chunked += x[:, s] @ w[s] + (x[:, s] @ a[s]) @ b
    finite = np.isfinite(ref) & np.isfinite(graph_order)
    return bool((finite & ~np.isfinite(chunked)).any())


def test_a_product_distributed_over_loop_slices_is_rejected_on_cancelling_extremes() -> None:
    """LoRA's candidate that multiplies each slice's partial x_k·a_k by b inside the loop
    overflows where two extremes' products (±2^112) cancel in the graph's x·a but not slice
    by slice: a check seed whose extremes do that (found with a float32 model of that order)
    rejects exactly that candidate, the report prints the seed, and the seed repeats it."""
    from yirage._workloads import get_workload

    w = get_workload("lora")
    seed = next(s for s in range(2000) if _chunked_lora_overflows(_lora_extremes(s), 64))
    opts: dict[str, Any] = dict(
        profile_options=FAST_PROFILE, cache=False, device_spec=REFERENCE_CPU, check_seed=seed
    )
    rep = yr.superoptimize(w.graph("cpu"), "cpu", w.search_config, time_limit=30, **opts).report
    form = "loop=64: matmul,matmul,matmul,add,accum_iter]"
    distributed = [c for c in rep.candidates if form in c.description]
    assert distributed, str(rep)
    for c in rep.candidates:
        if c in distributed:
            assert c.status == "rejected", str(rep)
            assert (c.error or "").startswith("stress check failed (dtype extremes"), str(rep)
        else:
            assert c.status == "ok", str(rep)
    assert f"check seed: {seed} " in str(rep)
    again = yr.superoptimize(w.graph("cpu"), "cpu", w.search_config, time_limit=30, **opts)
    assert [c.status for c in again.report.candidates] == [c.status for c in rep.candidates]


@pytest.mark.parametrize("bad", [-1, 1.5, "7", True])
def test_a_check_seed_that_is_not_a_non_negative_int_is_refused(bad: Any) -> None:
    g = _softmax_graph(written_out=False)
    with pytest.raises(yr.ConfigError, match="check_seed must be a non-negative int"):
        yr.superoptimize(g, "cpu", cache=False, device_spec=REFERENCE_CPU, check_seed=bad)
