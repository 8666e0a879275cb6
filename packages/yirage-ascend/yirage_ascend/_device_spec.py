"""Ascend DeviceSpecs: a deliberately sparse table.

Huawei publishes few per-chip figures for the 910B family and the SKUs (910B1..910B4)
differ in AI-core count and clocks, so core count, L2, bandwidth and peaks are None rather
than guesses. What the CANN documentation states for Atlas A2 (910B) parts is kept: a
192 KiB Unified Buffer per AI Core (``shared_mem_per_block``) and the 16x16x16 FP16 Cube
unit (``matrix_tile``). Ascend has no warps or thread blocks: those fields are None, and an
AI Core runs one program on tiles in its buffers (``execution_model="tile"``);
launch_overhead_us stays None (the core's tile default: no published figure).
"""

from __future__ import annotations

from yirage import Backend, DeviceSpec
from yirage_ascend._probe import torch_npu_device

ASCEND_910B = DeviceSpec(
    name="Huawei Ascend 910B",
    vendor="Huawei",
    arch="ascend910b",
    compute_units=None,
    warp_size=None,
    max_threads_per_block=None,
    shared_mem_per_block=192 * 1024,
    l2_bytes=None,
    mem_bandwidth_gbps=None,
    peak_tflops_fp16=None,
    peak_tflops_fp32=None,
    matrix_tile=(16, 16, 16),
    execution_model="tile",
)

KNOWN_DEVICES: dict[str, DeviceSpec] = {"Ascend 910B": ASCEND_910B}
_MATCH = ((("910B",), ASCEND_910B),)


def device_spec() -> DeviceSpec | None:
    """The table entry for the NPU that torch_npu names (refined with that name), a minimal
    live spec for an NPU not in the table, or None when torch_npu sees no NPU (the device
    nodes alone do not say which chip it is)."""
    name, _ = torch_npu_device()
    if name is None:
        return None
    table = Backend._match_device(name, _MATCH)
    if table is not None:
        return table.with_live(name=name)
    return DeviceSpec(
        name=name,
        vendor="Huawei",
        arch="ascend",
        compute_units=None,
        warp_size=None,
        max_threads_per_block=None,
        shared_mem_per_block=None,
        l2_bytes=None,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        execution_model="tile",
        source="live",
    )
