"""DeviceSpec: what the search and the cost model know about a device.

Re-exported by ``yirage``, ``yirage.plugin`` and ``yirage._backend`` under the same name. The
core's cost model reads capabilities from it (the execution model, warp width, matrix-unit
shape, on-chip memory, launch overhead), never the vendor name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
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
#: Bytes per element of the dtypes a block may hold (for :meth:`DeviceSpec.block_error`).
_ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "float64": 8}


@dataclass(frozen=True)
class DeviceSpec:
    """What the search and cost model know about a device.

    ``link_bandwidth_gbps`` (GB/s per direction, per device) and ``link_latency_us`` (µs per
    ring step) price the collectives of multi-device graphs (None: PCIe 4.0 x16 figures);
    ``power_watts`` (board power, W) gives ``yirage.estimate`` an energy figure. The search
    never reads the power.

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

    ``tiling`` is the block-shape rule of a tile machine, ``(sublane, lane)`` for 32-bit
    elements (TPU: ``(8, 128)``): the last dim of every block a generated kernel loads or
    stores is a multiple of ``lane`` or the whole dim, the second-to-last a multiple of
    ``sublane * 4 // element bytes`` (16 for 16-bit) or the whole dim. The search proposes
    only such tiles and :meth:`block_error` names the rule a block breaks. None: any tile
    that divides the tensor.

    ``l1d_bytes`` and ``l3_bytes`` (CPUs) are a core's L1 data cache and the L3 all cores
    share (``l2_bytes`` is then the per-core L2); the core's CPU cost terms read them. None:
    not known. ``isa_features`` (CPUs) names the vector ISA features generated code is
    compiled for, in ``/proc/cpuinfo``'s spelling (``avx512f``, ``avx512_bf16``, ``f16c``,
    ``asimd``, …): the printer's paths follow them (the bfloat16 dot products need
    ``avx512_bf16``). None: not recorded (datasheet specs); the search does not read them.
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
    tiling: tuple[int, int] | None = None
    l1d_bytes: int | None = None
    l3_bytes: int | None = None
    #: Device-to-device link bandwidth (GB/s per direction) and per-step latency (µs) of a
    #: collective's ring, and the board power (W); see :func:`_check_links`.
    link_bandwidth_gbps: float | None = None
    link_latency_us: float | None = None
    power_watts: float | None = None
    isa_features: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _check_links(self)
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

        tiling = self.tiling
        if tiling is not None and not (
            len(tiling) == 2 and all(isinstance(t, int) and t >= 1 for t in tiling)
        ):
            raise ConfigError(
                f"DeviceSpec {self.name!r}: tiling must be (sublane, lane), two ints >= 1 "
                f"(TPU: (8, 128)), or None for no block-shape rule; got {tiling!r}"
            )

    def block_error(self, tile: Sequence[int], full: Sequence[int], dtype: str) -> str | None:
        """Why a block of ``tile`` elements of a ``dtype`` tensor of ``full`` dims breaks
        :attr:`tiling`, naming the rule; None when it is legal (or there is no rule)."""
        if self.tiling is None:
            return None
        sublane, lane = self.tiling
        width = _ELEM_BYTES.get(dtype, 4)
        rows = sublane * 4 // min(max(width, 1), 4)
        checks = [(1, lane, "last")]
        if len(tile) >= 2:
            checks.append((2, rows, "second-to-last"))
        for back, multiple, which in checks:
            t, f = tile[-back], full[-back]
            if t != f and t % multiple:
                return (
                    f"block {list(tile)} of a {dtype} tensor {list(full)} breaks the "
                    f"{self.name} tiling rule: the {which} dim of a block must be a multiple "
                    f"of {multiple} or the whole dim ({f}); the last two dims must be multiples "
                    f"of ({rows}, {lane}) for {8 * width}-bit elements"
                )
        return None

    def with_live(self, **live: Any) -> DeviceSpec:
        """This (table) spec updated with the live-queried fields that are not None."""
        found = {k: v for k, v in live.items() if v is not None}
        return replace(self, **found, source="table+live") if found else self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.matrix_tile is not None:
            d["matrix_tile"] = list(self.matrix_tile)
        if self.tiling is not None:
            d["tiling"] = list(self.tiling)
        if self.isa_features is not None:
            d["isa_features"] = list(self.isa_features)
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
        if self.isa_features:
            parts.append("ISA " + " ".join(self.isa_features))
        if self.tiling is not None:
            parts.append(f"blocks of ({self.tiling[0]}, {self.tiling[1]}) x 32-bit")
        parts.append(f"source: {self.source}")
        return ", ".join(parts)


def _check_links(spec: DeviceSpec) -> None:
    """The optional link and power figures, when given, are finite and positive (the
    latency may be 0)."""
    for name, value, least in (
        ("link_bandwidth_gbps", spec.link_bandwidth_gbps, "> 0"),
        ("link_latency_us", spec.link_latency_us, ">= 0"),
        ("power_watts", spec.power_watts, "> 0"),
    ):
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        if not ok or value < 0 or (value == 0 and least == "> 0"):
            raise ConfigError(
                f"DeviceSpec {spec.name!r}: {name} must be a finite number {least} (or None "
                f"when not known), got {value!r}"
            )
