"""DeviceSpec: what the search and the cost model know about a device.

Re-exported by ``yirage``, ``yirage.plugin`` and ``yirage._backend`` under the same name. The
core's cost model reads capabilities from it (the execution model, warp width, matrix-unit
shape, on-chip memory, launch overhead), never the vendor name.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

from yirage._errors import ConfigError

__all__ = ["EXECUTION_MODELS", "DeviceSpec", "ExecutionModel"]

#: How a device runs one block of a generated kernel (selects the cost model's terms):
#: ``"simt"`` warps/wavefronts of threads with latency hidden by resident blocks (NVIDIA,
#: AMD, Apple GPUs); ``"cpu"`` one single-threaded task per core, SIMD inside the thread;
#: ``"tile"`` one program per core driving vector and matrix units on tiles in a
#: software-managed buffer (TPU TensorCore, Ascend AI Core).
ExecutionModel = Literal["simt", "cpu", "tile"]

#: The allowed values of :attr:`DeviceSpec.execution_model`.
EXECUTION_MODELS: tuple[str, ...] = get_args(ExecutionModel)


@dataclass(frozen=True)
class DeviceSpec:
    """What the search and cost model know about a device.

    ``shared_mem_per_block`` is the fast on-chip memory one block may use, in bytes (shared
    memory on NVIDIA/AMD LDS, threadgroup memory on Apple, the unified buffer on Ascend, VMEM
    on TPU, L1d per core on CPUs). ``warp_size`` is the warp / wavefront / SIMD-group width
    and ``matrix_tile`` the matrix unit's ``(m, n, k)`` shape. A field is None when the
    concept does not apply or the figure is not published; ``source`` says whether the
    figures come from yirage's datasheet table, a live query of the runtime, or both.

    ``execution_model`` (one of :data:`EXECUTION_MODELS`) says how a block runs; every table
    of yirage's vendor packages sets it. None is accepted for specs written before the field
    existed: the core then derives it from the backend name for the six backends of that
    time (``cpu``; ``cuda``/``rocm``/``mps`` are ``simt``; ``tpu``/``ascend`` are ``tile``)
    and refuses any other name. ``launch_overhead_us`` is the per-kernel launch/sync gap in
    µs; None: the execution model's default (simt 2, cpu 1, tile 3).
    """

    name: str
    vendor: str
    arch: str
    compute_units: int | None
    warp_size: int | None
    max_threads_per_block: int | None
    shared_mem_per_block: int | None
    l2_bytes: int | None
    mem_bandwidth_gbps: float | None
    peak_tflops_fp16: float | None
    peak_tflops_fp32: float | None
    matrix_tile: tuple[int, int, int] | None = None
    simd_width_bits: int | None = None
    execution_model: ExecutionModel | None = None
    launch_overhead_us: float | None = None
    source: Literal["table", "live", "table+live"] = "table"

    def __post_init__(self) -> None:
        model = self.execution_model
        if model is not None and model not in EXECUTION_MODELS:
            allowed = ", ".join(repr(m) for m in EXECUTION_MODELS)
            raise ConfigError(
                f"DeviceSpec {self.name!r}: execution_model must be one of {allowed} "
                f"(or None for an old spec), got {model!r}"
            )
        launch = self.launch_overhead_us
        if launch is not None and not (math.isfinite(launch) and launch >= 0):
            raise ConfigError(
                f"DeviceSpec {self.name!r}: launch_overhead_us must be a finite number of "
                f"microseconds >= 0 (or None for the execution model's default), got {launch!r}"
            )

    def with_live(self, **live: Any) -> DeviceSpec:
        """This (table) spec updated with the live-queried fields that are not None."""
        found = {k: v for k, v in live.items() if v is not None}
        return replace(self, **found, source="table+live") if found else self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.matrix_tile is not None:
            d["matrix_tile"] = list(self.matrix_tile)
        return d

    def to_json(self) -> str:
        """Stable JSON (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def summary(self) -> str:
        """One line for ``yirage doctor``."""
        parts = [f"{self.name} ({self.vendor} {self.arch})"]
        if self.execution_model is not None:
            parts.append(f"{self.execution_model} execution")
        if self.compute_units is not None:
            parts.append(f"{self.compute_units} compute units")
        if self.shared_mem_per_block is not None:
            parts.append(f"{self.shared_mem_per_block // 1024} KiB on-chip per block")
        if self.l2_bytes is not None:
            parts.append(f"L2 {self.l2_bytes / 2**20:g} MiB")
        if self.mem_bandwidth_gbps is not None:
            parts.append(f"{self.mem_bandwidth_gbps:g} GB/s")
        if self.peak_tflops_fp16 is not None:
            parts.append(f"{self.peak_tflops_fp16:g} TFLOPS fp16")
        if self.simd_width_bits is not None:
            parts.append(f"SIMD {self.simd_width_bits} bit")
        parts.append(f"source: {self.source}")
        return ", ".join(parts)
