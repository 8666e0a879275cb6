"""GPU: the Triton runtime's profiler stops after its probe launches when they and one
graph replay are all over ``give_up_us`` (the race's screen), and times in full otherwise,
also when only the host's time put the launches over it (``pytest -m cuda``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from yirage_triton._runtime import profile

pytestmark = pytest.mark.cuda


class _Spin:
    """A launcher that keeps the GPU busy for about ``cycles`` clock cycles per call."""

    interpret = False

    def __init__(self, cycles: int, host_s: float = 0.0) -> None:
        self.cycles = cycles
        self.host_s = host_s

    def check(self, inputs: list[Any]) -> list[Any]:
        return inputs

    def run_unchecked(self, inputs: list[Any]) -> None:
        import torch

        time.sleep(self.host_s)  # a busy host: the device idles meanwhile
        torch.cuda._sleep(self.cycles)


def test_a_contender_over_the_give_up_time_stops_after_its_probe(gpu: Any) -> None:
    import torch

    x = [torch.zeros(16, device="cuda")]
    slow = _Spin(20_000_000)  # about 10 ms at 2 GHz
    stopped = profile(slow, x, min_time_s=0.002, min_repeats=3, give_up_us=100.0)
    assert stopped.repeats == 2 and "stopped after 2 launches and one cuda graph" in stopped.method
    assert stopped.median_us == stopped.graph_median_us and stopped.median_us > 100.0
    full = profile(_Spin(200_000), x, min_time_s=0.002, min_repeats=3, give_up_us=1e7)
    assert full.graph_median_us is not None and "stopped" not in full.method


@pytest.mark.parametrize("steps", [1, 2])
def test_launches_slow_only_on_the_host_are_not_given_up(gpu: Any, steps: int) -> None:
    """Eager launches that take long because the host does (a busy host, or the gaps
    between a plan's steps) are no reason to stop: the replay shows the device time."""
    import torch

    from yirage.plan import parse_plan

    fast_on_device = _Spin(2_000, host_s=0.005)  # ~1 µs on the device, 5 ms on the host
    if steps == 2:
        fast_on_device.plan = parse_plan(_library_plan())  # type: ignore[attr-defined]
    x = [torch.zeros(16, device="cuda")]
    timed = profile(fast_on_device, x, min_time_s=0.002, min_repeats=3, give_up_us=1000.0)
    assert timed.launch_median_us > 1000.0  # the eager times alone would have given up
    assert timed.graph_median_us is not None and "stopped" not in timed.method


def _library_plan() -> dict[str, Any]:
    return {
        "format": "yirage.kernel_plan",
        "version": 3,
        "graph_hash": "two-library-steps",
        "buffers": [
            {"id": 0, "dims": [4, 4], "dtype": "float32", "role": "input", "index": 0},
            {"id": 1, "dims": [4, 4], "dtype": "float32", "role": "intermediate"},
            {"id": 2, "dims": [4, 4], "dtype": "float32", "role": "output", "index": 0},
        ],
        "kernels": [
            {
                "kind": "library",
                "op": "unary",
                "inputs": [0],
                "outputs": [1],
                "params": {"op": "exp"},
            },
            {
                "kind": "library",
                "op": "unary",
                "inputs": [1],
                "outputs": [2],
                "params": {"op": "neg"},
            },
        ],
    }
