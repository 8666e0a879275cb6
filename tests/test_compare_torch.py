"""The check's comparisons on a torch device (``yirage._compare_torch``) against the numpy
ones (``_check.rel_frobenius``, ``_stress.stress_error``): the same verdicts, errors to
rounding, the same messages, on outputs with NaN, infinities, overflow at the dtype's edge
and exempt elements; and the wiring (references copied to the device once, only where the
check tensors live on a GPU). Runs on CPU torch here, with "cpu" admitted as a GPU where the
wiring needs one; ``tests/cuda/test_reference_gpu.py`` runs the same comparisons on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from yirage import _check, _compare_torch, _reference_torch, _stress

torch = pytest.importorskip("torch")


@pytest.fixture
def cpu_as_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_reference_torch, "DEVICE_TYPES", ("cuda", "cpu"))
    yield


def _outputs(rng: np.random.Generator, ref: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """Kernel outputs in ``dtype`` near ``ref`` (float64), each a way a kernel can be off."""
    np_dtype = np.float16 if dtype == "float16" else np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        close = (ref * (1 + 1e-3 * rng.standard_normal(ref.shape))).astype(np_dtype)
        far = (ref * (1 + 0.2 * rng.standard_normal(ref.shape))).astype(np_dtype)
    nan = close.copy()
    nan.flat[5] = np.nan
    inf = close.copy()
    inf.flat[7] = -np.inf
    back = close.copy()
    back.flat[0] = np.finfo(np_dtype).max  # the reference just past it: may stay finite
    return {
        "close": close,
        "far": far,
        "nan": nan,
        "inf": inf,
        "back from the edge": back,
        "wrong shape": close[:-1],
    }


def _reference(rng: np.random.Generator, dtype: str) -> np.ndarray:
    ref = rng.standard_normal((16, 33))
    largest = 65504.0 if dtype == "float16" else float(np.finfo(np.float32).max)
    ref.flat[0] = largest * (1 + 1e-3)  # rounds to inf in the dtype: may come out as inf
    ref.flat[1] = np.nan  # undefined in float64 too: not compared
    ref.flat[2] = np.inf  # must be non-finite in the output
    ref.flat[3] = 1e-30
    return ref


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_stress_error_on_the_device_matches_numpy(dtype: str) -> None:
    rng = np.random.default_rng(3)
    ref = [_reference(rng, dtype)]
    rounded = _stress.rounded_reference(ref, [dtype])
    exempt = [rng.random(ref[0].shape) < 0.1]
    exempt[0].flat[5] = exempt[0].flat[7] = True
    unbounded = [np.zeros_like(exempt[0])]
    unbounded[0].flat[7] = True
    on_device = [torch.from_numpy(a) for a in ref]
    rounded_dev = [torch.from_numpy(a) for a in rounded]
    exempt_dev = [torch.from_numpy(a) for a in exempt]
    unbounded_dev = [torch.from_numpy(a) for a in unbounded]
    verdicts = set()
    for name, out in _outputs(rng, ref[0], dtype).items():
        for ex, ex_dev, un, un_dev in (
            (None, None, None, None),
            (exempt, exempt_dev, None, None),
            (exempt, exempt_dev, unbounded, unbounded_dev),
        ):
            for edge in (0.0, 1e-2):
                want = _stress.stress_error([out], ref, [dtype], edge, ex, rounded, un)
                got = _stress.stress_error(
                    [torch.from_numpy(out)], on_device, [dtype], edge, ex_dev, rounded_dev, un_dev
                )
                assert got[1] == want[1], (name, edge)
                assert got[0] == pytest.approx(want[0], rel=1e-12), (name, edge)
                verdicts.add((name, un is not None, want[1] is None))
    # the NaN at 5 is refused however exempt; the -inf at 7 is allowed where unbounded
    assert ("nan", True, False) in verdicts and ("inf", True, True) in verdicts
    assert np.isinf(_stress.stress_error([_outputs(rng, ref[0], dtype)["nan"]], ref, [dtype])[0])
    # the largest value where the reference is just past it: allowed within the tolerance only
    back = [torch.from_numpy(_outputs(rng, ref[0], dtype)["back from the edge"])]
    assert _stress.stress_error(back, on_device, [dtype], 1e-2, None, rounded_dev)[1] is None
    assert "overflows" in str(
        _stress.stress_error(back, on_device, [dtype], 0.0, None, rounded_dev)[1]
    )


def test_stress_error_on_the_device_needs_its_rounded_reference() -> None:
    ref = [torch.zeros(3, dtype=torch.float64)]
    with pytest.raises(ValueError, match="rounded reference"):
        _stress.stress_error([torch.zeros(3)], ref, ["float32"])


def test_rel_frobenius_on_the_device_matches_numpy() -> None:
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((8, 40))
    cases: list[Any] = [
        ref.astype(np.float32),
        (ref * 1.01).astype(np.float16),
        np.zeros_like(ref),
        ref[:-1],
    ]
    nan = ref.copy()
    nan[2, 3] = np.nan
    cases.append(nan)
    for out in cases:
        want = _check.rel_frobenius(_check.to_numpy64(out), ref)
        got = _check.rel_frobenius(torch.from_numpy(out), torch.from_numpy(ref))
        assert got == pytest.approx(want, rel=1e-12) or (np.isinf(got) and np.isinf(want))
    assert _check.rel_frobenius(np.zeros(3), torch.zeros(3, dtype=torch.float64)) == 0.0
    assert np.isinf(_check.rel_frobenius(torch.zeros(3), torch.full((3,), np.inf)))


def test_references_go_to_the_device_of_gpu_check_tensors_only(cpu_as_gpu: None) -> None:
    ref = [np.arange(6.0).reshape(2, 3), np.ones(2, dtype=np.bool_)]
    on_numpy = _compare_torch.to_device(ref, [np.zeros(2)])
    assert all(isinstance(a, np.ndarray) for a in on_numpy)
    moved = _compare_torch.to_device(ref, [torch.zeros(2)])
    assert [m.dtype for m in moved] == [torch.float64, torch.bool]
    assert np.array_equal(moved[0].numpy(), ref[0])
    assert _compare_torch.to_device(moved, [torch.zeros(2)]) == moved  # already there


def test_references_stay_on_the_host_for_cpu_tensors() -> None:
    ref = [np.arange(3.0)]
    assert isinstance(_compare_torch.to_device(ref, [torch.zeros(2)])[0], np.ndarray)


class _TorchTensors:
    """A backend as far as the stress check needs one: its tensors are torch tensors."""

    def from_numpy(self, arrays: Any, dtypes: Any) -> list[Any]:
        return [torch.from_numpy(np.asarray(a, dtype=np.float32)) for a in arrays]


def test_the_stress_check_compares_on_the_device_and_exempts_as_on_the_host(
    cpu_as_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end through ``_stress_check`` with the check tensors on a (stand-in) GPU: the
    comparisons run there, the same contender passes as on the host, and the report counts
    the exempt elements."""
    from test_overflow_safety import _cancelling_stress, _report

    from yirage._superoptimize import _stress_check

    calls: list[int] = []
    real = _compare_torch.stress_error

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_compare_torch, "stress_error", spy)
    g, stress = _cancelling_stress()

    def contender(index: int, out: list[list[float]]) -> tuple[Any, ...]:
        return (0.0, index, {}, None, lambda *_: [torch.tensor(out)])

    rep = _report(2)
    entries = [contender(0, [[0.0, 2.0]]), contender(1, [[0.0, 3.0]])]
    kept = _stress_check(_TorchTensors(), g, stress, entries, set(), rep)  # type: ignore[arg-type]
    assert [e[1] for e in kept] == [0]
    assert calls, "the comparisons did not run on the device"
    assert any("checked for finiteness only" in n for n in rep.notes), rep.notes


def test_torch_still_being_imported_holds_no_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """While one thread imports torch, another sees it in ``sys.modules`` without its
    ``Tensor`` (the check's background threads met it that way and failed with
    AttributeError): nothing is a torch tensor then."""
    import sys
    import types

    from yirage_cpu import _runtime

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    arrays = [np.zeros(3), np.ones(2)]
    assert _reference_torch.device_of(arrays) is None
    assert not _compare_torch.is_torch_tensor(arrays[0])
    assert not _runtime._is_torch(arrays[0])


def test_perturbed_references_of_gpu_check_tensors_are_drawn_there(
    cpu_as_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stress sets built from check tensors on a (stand-in) GPU move their inputs on that
    device for the exemptions' perturbed references, not on the host."""
    import yirage as yr
    from yirage._kernel import Shapes
    from yirage._superoptimize import _stress_sets

    drawn: list[Any] = []
    real = _stress._moved_on

    def spy(arrays: Any, eta: float, seed: int, device: Any) -> Any:
        drawn.append(device)
        return real(arrays, eta, seed, device)

    monkeypatch.setattr(_stress, "_moved_on", spy)
    g = yr.new_kernel_graph()
    x = g.new_input((4, 16), yr.float16)
    w = g.new_input((16, 8), yr.float16)
    g.mark_output(g.matmul(x, w))
    rng = np.random.default_rng(2)
    tensors = [
        torch.from_numpy(rng.standard_normal(d).astype(np.float32)) for d in ((4, 16), (16, 8))
    ]
    (extremes,) = _stress_sets(g, Shapes(g), tensors, 3)
    assert extremes.perturbed is not None
    (moved,) = extremes.perturbed(1e-3, 1)
    assert drawn == [torch.device("cpu")] and moved.shape == (4, 8)
    (ref,) = extremes.reference
    assert np.abs(moved - ref).max() <= 1e-2 * np.abs(ref).max()
