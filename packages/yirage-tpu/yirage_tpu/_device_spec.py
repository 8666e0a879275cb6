"""TPU DeviceSpecs: datasheet table matched by jax's device_kind.

Figures from Google Cloud's TPU pages: peak bf16 compute per chip (in peak_tflops_fp16,
which for TPUs holds the bf16 MXU peak: there is no separate fp16 path) and HBM bandwidth;
fp32 peak is not published (None). compute_units counts TensorCores per chip, matrix_tile
is the 128x128 MXU, shared_mem_per_block the 16 MiB default scoped-VMEM limit that Mosaic
kernels get (physical VMEM is larger). TPUs have no warps or thread blocks (None): a
TensorCore runs one program on tiles in VMEM (``execution_model="tile"``);
launch_overhead_us stays None (the core's tile default: no published figure).
"""

from __future__ import annotations

from yirage import Backend, DeviceSpec
from yirage_tpu._probe import jax_tpu_kind

_MXU = (128, 128, 128)

TPU_V4 = DeviceSpec(
    name="Google TPU v4",
    vendor="Google",
    arch="tpu_v4",
    compute_units=2,
    warp_size=None,
    max_threads_per_block=None,
    shared_mem_per_block=16 * 2**20,
    l2_bytes=None,
    mem_bandwidth_gbps=1200.0,
    peak_tflops_fp16=275.0,
    peak_tflops_fp32=None,
    matrix_tile=_MXU,
    execution_model="tile",
)
TPU_V5E = DeviceSpec(
    name="Google TPU v5e",
    vendor="Google",
    arch="tpu_v5e",
    compute_units=1,
    warp_size=None,
    max_threads_per_block=None,
    shared_mem_per_block=16 * 2**20,
    l2_bytes=None,
    mem_bandwidth_gbps=819.0,
    peak_tflops_fp16=197.0,
    peak_tflops_fp32=None,
    matrix_tile=_MXU,
    execution_model="tile",
)

KNOWN_DEVICES: dict[str, DeviceSpec] = {"TPU v4": TPU_V4, "TPU v5e": TPU_V5E}
_MATCH = (
    (("v4",), TPU_V4),
    (("v5 lite",), TPU_V5E),
    (("v5e",), TPU_V5E),
    (("v5litepod",), TPU_V5E),
)


def device_spec() -> DeviceSpec | None:
    """The table entry for the chip jax reports, a minimal live spec for an unknown chip,
    or None when jax sees no TPU."""
    kind, _ = jax_tpu_kind()
    if kind is None:
        return None
    table = Backend._match_device(kind, _MATCH)
    if table is not None:
        return table.with_live(name=f"Google {kind}")
    return DeviceSpec(
        name=f"Google {kind}",
        vendor="Google",
        arch="tpu",
        compute_units=None,
        warp_size=None,
        max_threads_per_block=None,
        shared_mem_per_block=None,
        l2_bytes=None,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=_MXU,
        execution_model="tile",
        source="live",
    )
