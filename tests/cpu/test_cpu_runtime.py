"""The CPU runtime: argument checks, torch/numpy in place, outputs, profiling."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err
from cpu_plan_tools import PLANS

import yirage as yr
from yirage_cpu._runtime import TensorArgumentError, random_inputs


@pytest.fixture(scope="module")
def launcher(build: Any) -> Any:
    return build(json.loads((PLANS / "rmsnorm_matmul.json").read_text()))


def _inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((8, 512), dtype=np.float32),
        rng.standard_normal((512, 768), dtype=np.float32),
    ]


def _expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)) @ w.astype(np.float64)


def test_numpy_in_numpy_out_positional_and_keyword(launcher: Any) -> None:
    x, w = _inputs()
    (a,) = launcher(x, w)
    (b,) = launcher(inputs=[x, w])
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert rel_err(a, _expected(x, w)) < 1e-5


def test_torch_in_torch_out_without_copies(launcher: Any) -> None:
    torch = pytest.importorskip("torch")
    x, w = _inputs(1)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)  # share memory with the numpy arrays
    (y,) = launcher(tx, tw)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.device.type == "cpu"
    x[0, :] = 0.0  # the kernel reads the tensor's own memory: a change is visible
    (y2,) = launcher(tx, tw)
    assert not torch.equal(y[0], y2[0]) and torch.equal(y[1:], y2[1:])
    assert rel_err(y.numpy(), _expected(_inputs(1)[0], w)) < 1e-5
    rg = tx.clone().requires_grad_(True)
    (y3,) = launcher(rg, tw)  # tensors that require grad are read without autograd
    assert not y3.requires_grad


def test_preallocated_outputs(launcher: Any) -> None:
    x, w = _inputs(2)
    out = np.full((8, 768), np.nan, dtype=np.float32)
    (y,) = launcher.run([x, w], outputs=[out])
    assert y is out and np.isfinite(out).all()


def test_wrong_count_shape_and_dtype(launcher: Any) -> None:
    x, w = _inputs()
    with pytest.raises(yr.ShapeError, match="takes 2 inputs"):
        launcher(x)
    with pytest.raises(
        yr.ShapeError, match=r"input 1 has shape \(768, 512\); expected \(512, 768\)"
    ):
        launcher(x, np.ascontiguousarray(w.T))
    with pytest.raises(yr.DTypeError, match=r"input 0 has dtype float64; expected float32.*astype"):
        launcher(x.astype(np.float64), w)
    with pytest.raises(TensorArgumentError, match="numpy array or a torch CPU tensor"):
        launcher(x.tolist(), w)
    with pytest.raises(TensorArgumentError, match="either positionally or as inputs"):
        launcher(x, inputs=[x, w])


def test_non_contiguous_inputs_name_the_fix(launcher: Any) -> None:
    x, w = _inputs()
    wt = np.asfortranarray(w)
    with pytest.raises(TensorArgumentError, match=r"not C-contiguous: pass np\.ascontiguousarray"):
        launcher(x, wt)
    torch = pytest.importorskip("torch")
    tw = torch.from_numpy(np.ascontiguousarray(w.T)).t()
    assert tw.shape == (512, 768) and not tw.is_contiguous()
    with pytest.raises(TensorArgumentError, match=r"not contiguous: pass tensor\.contiguous\(\)"):
        launcher(torch.from_numpy(x), tw)
    with pytest.raises(yr.DTypeError, match=r"torch\.float16"):
        launcher(torch.from_numpy(x).half(), torch.from_numpy(w))


def test_gpu_tensors_are_refused_with_the_backend_to_use(launcher: Any) -> None:
    torch = pytest.importorskip("torch")

    class FakeCuda(torch.Tensor):
        @property
        def device(self) -> Any:  # what a CUDA tensor reports
            return torch.device("cuda", 0)

    x, w = _inputs()
    fake = torch.from_numpy(x).as_subclass(FakeCuda)
    with pytest.raises(TensorArgumentError, match=r'cuda tensor.*\.cpu\(\).*backend="cuda"'):
        launcher(fake, torch.from_numpy(w))
    meta = torch.empty((8, 512), device="meta")
    with pytest.raises(TensorArgumentError, match="meta tensor"):
        launcher(meta, torch.from_numpy(w))


def test_profile_reports_medians(launcher: Any) -> None:
    from yirage_cpu._backend import CpuBackend

    backend = CpuBackend()
    result = backend.profile(launcher, _inputs(), min_time_s=0.01, min_repeats=5)
    assert result.repeats >= 5 and result.warmup >= 3
    assert 0 < result.min_us <= result.median_us
    assert set(result.to_dict()) == {"median_us", "min_us", "mean_us", "repeats", "warmup"}
    fresh = backend.profile(launcher, None, min_time_s=0.0, min_repeats=3)  # its own random inputs
    assert fresh.repeats >= 3


def test_random_inputs_match_specs() -> None:
    ins = random_inputs([((2, 3), "float32"), ((4,), "float16")], seed=3)
    assert ins[0].dtype == np.float32 and ins[0].shape == (2, 3)
    assert ins[1].dtype == np.float16 and ins[1].shape == (4,)
    again = random_inputs([((2, 3), "float32"), ((4,), "float16")], seed=3)
    np.testing.assert_array_equal(ins[0], again[0])
    torch = pytest.importorskip("torch")
    (bf,) = random_inputs([((5,), "bfloat16")])
    assert bf.dtype == torch.bfloat16
