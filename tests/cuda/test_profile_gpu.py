"""GPU: the Triton runtime's profiler stops after its probe launches when they are all over
``give_up_us`` (the race's screen), and times in full otherwise (``pytest -m cuda``)."""

from __future__ import annotations

from typing import Any

import pytest

from yirage_triton._runtime import profile

pytestmark = pytest.mark.cuda


class _Spin:
    """A launcher that keeps the GPU busy for about ``cycles`` clock cycles per call."""

    interpret = False

    def __init__(self, cycles: int) -> None:
        self.cycles = cycles

    def check(self, inputs: list[Any]) -> list[Any]:
        return inputs

    def run_unchecked(self, inputs: list[Any]) -> None:
        import torch

        torch.cuda._sleep(self.cycles)


def test_a_contender_over_the_give_up_time_stops_after_its_probe(gpu: Any) -> None:
    import torch

    x = [torch.zeros(16, device="cuda")]
    slow = _Spin(20_000_000)  # about 10 ms at 2 GHz
    stopped = profile(slow, x, min_time_s=0.002, min_repeats=3, give_up_us=100.0)
    assert stopped.repeats == 2 and stopped.graph_median_us is None
    assert "stopped after" in stopped.method and stopped.median_us > 100.0
    full = profile(_Spin(200_000), x, min_time_s=0.002, min_repeats=3, give_up_us=1e7)
    assert full.graph_median_us is not None and "stopped" not in full.method
