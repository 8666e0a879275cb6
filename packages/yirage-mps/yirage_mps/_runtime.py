"""Launchers of printed MSL: on ``torch.mps`` (``torch.mps.compile_shader``) or in the
emulator on CPU tensors, and MPS-side timing.

A launcher runs a plan (library kernels through torch, generated kernels as Metal dispatches
of ``grid`` threadgroups of the printed thread count) and checks its inputs first: count,
shapes, dtypes, the device. ``profile`` times launches with ``torch.mps.Event`` pairs
(synchronised with ``torch.mps.synchronize``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from yirage.plan import Plan
from yirage.plugin import BackendError, BackendUnavailableError
from yirage_mps._host import run_plan, torch_dtype
from yirage_mps._msl_codegen import MslSource

__all__ = ["EmulatedLauncher", "MpsLauncher", "MslLauncher", "ProfileResult", "profile"]


def _torch() -> Any:
    import torch

    return torch


class MslLauncher:
    """A loaded plan: ``launcher(*tensors)`` or ``launcher(inputs=[...])`` → list of outputs.
    ``device``: the torch device type of its tensors."""

    language = "msl"
    device = "mps"

    def __init__(self, src: MslSource) -> None:
        self.src = src
        self.plan: Plan = src.plan
        self.source = src.text
        self.input_specs = [(tuple(b.dims), b.dtype) for b in self.plan.inputs]
        self.output_specs = [(tuple(b.dims), b.dtype) for b in self.plan.outputs]

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        if inputs is not None and tensors:
            raise BackendError("pass the tensors either positionally or as inputs=[...], not both")
        return self.run_unchecked(self.check(list(inputs) if inputs is not None else tensors))

    def check(self, tensors: Sequence[Any]) -> list[Any]:
        """``tensors`` validated against the plan's inputs (count, shape, dtype, device)."""
        if len(tensors) != len(self.input_specs):
            raise BackendError(
                f"the plan takes {len(self.input_specs)} inputs, got {len(tensors)}: pass one "
                "tensor per graph input, in order"
            )
        for i, (t, (dims, dtype)) in enumerate(zip(tensors, self.input_specs, strict=True)):
            if tuple(t.shape) != dims or t.dtype != torch_dtype(dtype):
                raise BackendError(
                    f"input {i}: expected shape {list(dims)} {dtype}, got {list(t.shape)} "
                    f"{t.dtype}: convert it with .to(torch.{dtype}) or reshape it"
                )
            if t.device.type != self.device:
                raise BackendError(
                    f"input {i} is on {t.device}, this launcher runs on {self.device}: "
                    f"move it with .to('{self.device}')"
                )
        return list(tensors)

    def launch_kernel(self, name: str, grid: Sequence[int], tensors: Sequence[Any]) -> None:
        raise NotImplementedError

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        return run_plan(self.plan, inputs, self.src.params, self.launch_kernel)


class MpsLauncher(MslLauncher):
    """The printed kernels compiled by Metal through ``torch.mps.compile_shader``."""

    def __init__(self, src: MslSource, library: Any) -> None:
        super().__init__(src)
        self.library = library

    def launch_kernel(self, name: str, grid: Sequence[int], tensors: Sequence[Any]) -> None:
        threads = int(self.src.kernels[name]["threads"])
        fn = getattr(self.library, name)
        fn(*tensors, threads=(grid[0] * threads, grid[1], grid[2]), group_size=(threads, 1, 1))


class EmulatedLauncher(MslLauncher):
    """The printed kernels in the emulator (:mod:`yirage_mps._emulate`), on CPU tensors."""

    language = "msl (emulated)"
    device = "cpu"

    def __init__(self, src: MslSource) -> None:
        from yirage_mps._emulate import EmulatedMsl

        super().__init__(src)
        self.emulated = EmulatedMsl(src)

    def launch_kernel(self, name: str, grid: Sequence[int], tensors: Sequence[Any]) -> None:
        self.emulated.launch_kernel(name, grid, tensors)


def compile_on_mps(src: MslSource) -> Any:
    """The Metal library of ``src`` (``torch.mps.compile_shader``); BackendUnavailableError
    without MPS, BackendError with Metal's message when the source does not compile."""
    torch = _torch()
    if not torch.backends.mps.is_available():
        raise BackendUnavailableError(
            "mps",
            "torch.backends.mps.is_available() is False: compiling MSL needs an Apple-silicon "
            "Mac with an MPS build of torch (MpsBackend(emulate=True) runs the printed MSL in "
            "the C++ emulator instead)",
        )
    try:
        return torch.mps.compile_shader(src.text)
    except Exception as exc:
        raise BackendError(f"Metal did not compile the printed MSL: {exc}") from exc


@dataclass(frozen=True)
class ProfileResult:
    """Median/min of ``repeats`` timed launches in microseconds (after ``warmup``);
    ``method``: "mps-events" on the GPU, "wall-clock (emulator)" under the emulator."""

    median_us: float
    min_us: float
    repeats: int
    warmup: int
    method: str

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "median_us": self.median_us,
            "min_us": self.min_us,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "method": self.method,
        }


def _timed_run(launcher: MslLauncher, inputs: Sequence[Any]) -> float:
    """One run's time in microseconds: MPS events around it on the GPU, else wall clock."""
    if launcher.device != "mps":
        t0 = time.perf_counter()
        launcher.run_unchecked(inputs)
        return (time.perf_counter() - t0) * 1e6
    torch = _torch()
    start = torch.mps.Event(enable_timing=True)
    end = torch.mps.Event(enable_timing=True)
    start.record()
    launcher.run_unchecked(inputs)
    end.record()
    torch.mps.synchronize()
    return float(start.elapsed_time(end)) * 1000.0


def profile(
    launcher: MslLauncher,
    inputs: Sequence[Any],
    *,
    warmup: int = 2,
    min_repeats: int = 3,
    min_time_s: float = 0.2,
    max_time_s: float = 5.0,
    **_other: Any,
) -> ProfileResult:
    """Time ``launcher`` on ``inputs`` after ``warmup`` runs: at least ``min_repeats`` runs
    and ``min_time_s`` seconds (bounded by ``max_time_s``); MPS events on the GPU, wall clock
    in the emulator. Options meant for other backends' profilers are accepted and ignored."""
    checked = launcher.check(inputs)
    for _ in range(warmup):
        launcher.run_unchecked(checked)
    if launcher.device == "mps":
        _torch().mps.synchronize()
    times: list[float] = []
    t0 = time.perf_counter()
    while True:
        times.append(_timed_run(launcher, checked))
        elapsed = time.perf_counter() - t0
        if (len(times) >= min_repeats and elapsed >= min_time_s) or elapsed >= max_time_s:
            break
    method = "mps-events" if launcher.device == "mps" else "wall-clock (emulator)"
    return ProfileResult(statistics.median(times), min(times), len(times), warmup, method)
