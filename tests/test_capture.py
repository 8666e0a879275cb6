"""``OptimizedKernel.capture``: a kernel call captured into a device graph. What runs without
a GPU: the errors that name the fix. The replay itself is a GPU test
(tests/cuda/test_capture_gpu.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import yirage as yr
from yirage import _capture, _collectives

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


class _FakeGraph:
    """Records the fake launches made while it captures; replay runs them again."""

    capturing: ClassVar[list[_FakeGraph]] = []

    def __init__(self) -> None:
        self.ops: list[Any] = []

    def capture_begin(self, pool: Any = None) -> None:
        _FakeGraph.capturing.append(self)

    def capture_end(self) -> None:
        _FakeGraph.capturing.remove(self)

    def replay(self) -> None:
        for op in self.ops:
            op()


def _launch(op: Any) -> None:
    """A kernel launch: recorded into the graph being captured, else run."""
    if _FakeGraph.capturing:
        _FakeGraph.capturing[-1].ops.append(op)
    else:
        op()


class _FakeApi:
    CUDAGraph = _FakeGraph

    @staticmethod
    def graph_pool_handle() -> object:
        return object()

    @staticmethod
    def Stream(dev: Any) -> Any:
        return SimpleNamespace(wait_stream=lambda other: None)

    @staticmethod
    def current_stream(dev: Any) -> Any:
        return SimpleNamespace(wait_stream=lambda other: None)

    @staticmethod
    def synchronize(dev: Any) -> None:
        return None

    @staticmethod
    @contextlib.contextmanager
    def stream(s: Any) -> Iterator[None]:
        yield


def test_a_multi_device_call_is_captured_in_parts_split_at_its_collectives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Graph, host all_reduce, graph: the replay gives the eager call's sums every time, and
    the collective runs outside the graphs (in place on the captured buffer)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "fakedev", _FakeApi, raising=False)
    x = np.arange(4.0)
    buf = np.zeros(4)
    out = np.zeros(4)
    sums: list[int] = []

    class Doubling:  # the "other rank" holds the same values: the sum doubles them
        world_size, rank = 2, 0

        def all_reduce(self, v: np.ndarray) -> np.ndarray:
            sums.append(1)
            v *= 2
            return v

    def call(t: Any) -> list[Any]:
        _launch(lambda: np.copyto(buf, x + 1.0))  # kernel 1
        r = _collectives.all_reduce(buf, 2)
        _launch(lambda: np.copyto(out, r * 10.0))  # kernel 2 reads the summed buffer
        return [out]

    tensor = SimpleNamespace(device="fake:0")
    segments = _capture.capture_segments(call, [tensor], "fakedev", "test", 2)
    assert len(segments.graphs) == 2 and len(segments.reductions) == 1
    assert sums == []  # nothing was summed while capturing
    with _collectives.bound(Doubling()):
        for step in range(3):
            x[:] = step
            (got,) = segments()
            assert np.array_equal(got, (np.full(4, step) + 1.0) * 2 * 10.0)
    assert len(sums) == 3  # one host collective per replay
