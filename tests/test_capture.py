"""``OptimizedKernel.capture``: a kernel call captured into a device graph. What runs without
a GPU: the errors that name the fix. The replay itself is a GPU test
(tests/cuda/test_capture_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import yirage as yr
from yirage import _capture

cpu_only = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)


@cpu_only
def test_a_host_backend_kernel_cannot_be_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    g = yr.new_kernel_graph()
    x = g.new_input((4, 8), yr.float32)
    g.mark_output(g.exp(x))
    k = yr.superoptimize(g, backend="cpu", profile_options={"rounds": 1, "min_repeats": 3})
    with pytest.raises(yr.BackendError, match="backend='cuda'") as e:
        k.capture(np.ones((4, 8), np.float32))
    assert "call the kernel directly" in str(e.value)


def test_a_device_type_without_graphs_is_refused() -> None:
    pytest.importorskip("torch")
    with pytest.raises(yr.BackendError, match=r"torch\.cpu has no graph capture"):
        _capture.capture(lambda *a: list(a), [], "cpu", "test")
