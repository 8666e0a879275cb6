"""Running printed Pallas modules: the launcher (jax arrays, or torch tensors through DLPack)
and the timer (``block_until_ready``)."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from yirage.plan import Plan
from yirage.plugin import BackendError, DTypeError, ShapeError
from yirage_tpu._probe import JAX_HINT

__all__ = ["PallasLauncher", "ProfileResult", "load_module", "profile", "require_jax"]


def require_jax() -> Any:
    """The jax module, or BackendError naming the install command."""
    if importlib.util.find_spec("jax") is None:
        raise BackendError(f"the tpu backend needs jax, which is not installed: {JAX_HINT}")
    import jax

    return jax


def load_module(path: Path, name: str) -> ModuleType:
    """Import a printed module from ``path`` under a unique ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BackendError(f"cannot import the printed Pallas module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__")


def to_jax(x: Any) -> Any:
    """A jax array of ``x``: jax arrays as they are, torch tensors through DLPack (no copy
    where the device allows), anything else through ``jnp.asarray``."""
    jax = require_jax()
    import jax.numpy as jnp

    if isinstance(x, jax.Array):
        return x
    if _is_torch(x):
        return jax.dlpack.from_dlpack(x.contiguous())
    return jnp.asarray(x)


class PallasLauncher:
    """A loaded plan: ``launcher(*tensors)`` or ``launcher(inputs=[...])`` → list of outputs,
    jax arrays, or torch tensors (through DLPack) when the inputs were torch tensors.

    ``forward`` is jit-compiled once; jax keeps one executable per input shape and dtype."""

    language = "pallas"

    def __init__(self, plan: Plan, source: str, module: ModuleType, *, interpret: bool) -> None:
        jax = require_jax()
        self.plan = plan
        self.source = source
        self.module = module
        self.interpret = interpret
        self.input_specs = [(tuple(b.dims), b.dtype) for b in plan.inputs]
        self.output_specs = [(tuple(b.dims), b.dtype) for b in plan.outputs]
        self._fn: Callable[..., Any] = jax.jit(
            functools.partial(module.forward, interpret=interpret)
        )

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        if inputs is not None and tensors:
            raise ShapeError("pass the tensors either positionally or as inputs=[...], not both")
        args = list(inputs) if inputs is not None else list(tensors)
        torch_in = bool(args) and all(_is_torch(t) for t in args)
        outs = self.run_unchecked(self.check(args))
        if torch_in:
            import torch

            return [torch.utils.dlpack.from_dlpack(o) for o in outs]
        return outs

    def check(self, tensors: Sequence[Any]) -> list[Any]:
        """``tensors`` as jax arrays, checked against the plan's inputs."""
        if len(tensors) != len(self.input_specs):
            raise ShapeError(
                f"the kernel takes {len(self.input_specs)} inputs, got {len(tensors)}; pass "
                f"one tensor per graph input in order"
            )
        out = []
        for i, (t, (dims, dtype)) in enumerate(zip(tensors, self.input_specs, strict=True)):
            x = to_jax(t)
            if tuple(x.shape) != dims:
                raise ShapeError(
                    f"input {i} has shape {tuple(x.shape)}, the kernel was built for {dims}; "
                    f"superoptimize the graph for this shape"
                )
            if str(x.dtype) != dtype:
                raise DTypeError(f"input {i} is {x.dtype}, expected {dtype}; cast it first")
            out.append(x)
        return out

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        """Launch on jax arrays without checks (profiling loops); asynchronous like jax."""
        return list(self._fn(*inputs))

    def __repr__(self) -> str:
        mode = "interpret" if self.interpret else "tpu"
        return f"<PallasLauncher plan {self.plan.graph_hash[:12] or '?'} ({mode})>"


@dataclass(frozen=True)
class ProfileResult:
    """Median/min of ``repeats`` timed calls in µs, each waited for with
    ``block_until_ready`` (after ``warmup`` calls, the first of which compiles)."""

    median_us: float
    min_us: float
    repeats: int
    warmup: int
    device: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile(
    launcher: PallasLauncher,
    inputs: Sequence[Any],
    *,
    warmup: int = 3,
    min_repeats: int = 20,
    min_time_s: float = 0.1,
    max_time_s: float = 5.0,
    **_other: Any,
) -> ProfileResult:
    """Time ``launcher`` on ``inputs`` (jax arrays): every call waits for its outputs.
    Options meant for other backends' profilers are accepted and ignored."""
    jax = require_jax()
    args = launcher.check(inputs)
    for _ in range(max(1, warmup)):
        jax.block_until_ready(launcher.run_unchecked(args))
    times: list[float] = []
    t0 = time.perf_counter()
    while True:
        a = time.perf_counter_ns()
        jax.block_until_ready(launcher.run_unchecked(args))
        times.append((time.perf_counter_ns() - a) / 1000.0)
        elapsed = time.perf_counter() - t0
        if (len(times) >= min_repeats and elapsed >= min_time_s) or elapsed >= max_time_s:
            break
    times.sort()
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    device = str(args[0].devices().pop()) if args else "?"
    return ProfileResult(
        median_us=median if math.isfinite(median) else times[0],
        min_us=times[0],
        repeats=len(times),
        warmup=max(1, warmup),
        device=device,
    )
