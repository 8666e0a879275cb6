"""Ascend DeviceSpecs: a table of the 910B variants and the 910C with the sources of each
figure, and a live spec from torch_npu.

Every Atlas A2 (910B) and A3 (910C) AI Core has the same buffers (CANN's open-source CATLASS
templates, ``include/*/arch/arch.hpp``, ``AtlasA2``): a 192 KiB Unified Buffer per vector core
(``shared_mem_per_block``: the per-program budget the search and the printer respect), L1
512 KiB, L0A/L0B 64 KiB, L0C 128 KiB, and the 16x16x16 FP16 cube unit (``matrix_tile``).
AI-core counts (cube cores; each has two vector cores) and HBM sizes of the 910B2/B3/B4 are
those of the Ascend device configs of the HAMi scheduler (``aiCore``, ``memoryCapacity``); the
910B3's L2 of 192 MiB is CATLASS's ``AscendC910B3``. The 910C is two 910B-class dies, and
torch_npu shows each die as one device: the entry describes a die (24 AI cores, as the 910B2).
Huawei publishes no per-SKU HBM bandwidth or peak TFLOPS in a source we could check: those
stay None rather than guesses. An AI Core has no warps or thread blocks (those fields are
None) and runs one program on tiles in its buffers (``execution_model="tile"``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from yirage import Backend, DeviceSpec
from yirage_ascend._probe import torch_npu_device
from yirage_ascend._rules import ATLAS_A2


def _spec(name: str, arch: str, ai_cores: int | None, l2: int | None = None) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        vendor="Huawei",
        arch=arch,
        compute_units=ai_cores,
        warp_size=None,
        max_threads_per_block=None,
        shared_mem_per_block=ATLAS_A2.ub_bytes,
        l2_bytes=l2,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=(16, 16, 16),
        execution_model="tile",
    )


ASCEND_910B2 = _spec("Huawei Ascend 910B2", "Ascend910B2", 24)
ASCEND_910B3 = _spec("Huawei Ascend 910B3", "Ascend910B3", 20, l2=192 * 2**20)
ASCEND_910B4 = _spec("Huawei Ascend 910B4", "Ascend910B4", 20)
ASCEND_910C = _spec("Huawei Ascend 910C (one die)", "Ascend910_93", 24)

KNOWN_DEVICES: dict[str, DeviceSpec] = {
    "Ascend 910B2": ASCEND_910B2,
    "Ascend 910B3": ASCEND_910B3,
    "Ascend 910B4": ASCEND_910B4,
    "Ascend 910C": ASCEND_910C,
}
# (needles in torch_npu's device name, table entry); the 910C's dies report "Ascend910_93xx"
_MATCH = (
    (("910B2",), ASCEND_910B2),
    (("910B3",), ASCEND_910B3),
    (("910B4",), ASCEND_910B4),
    (("910_93",), ASCEND_910C),
    (("910C",), ASCEND_910C),
)


def _npu_properties() -> dict[str, Any]:
    """What torch_npu reports of NPU 0 (cube/vector core counts, L2) where it has them."""
    try:
        import torch_npu

        props = torch_npu.npu.get_device_properties(0)
    except Exception:
        return {}
    out: dict[str, Any] = {}
    for key, attr in (("compute_units", "cube_core_num"), ("l2_bytes", "L2_cache_size")):
        value = getattr(props, attr, None)
        if isinstance(value, int) and value > 0:
            out[key] = value
    return out


def device_spec() -> DeviceSpec | None:
    """The table entry for the NPU that torch_npu names, refined with what torch_npu reports;
    a live spec (the AI Core's buffers, cores from torch_npu) for an NPU not in the table;
    None when torch_npu sees no NPU (the device nodes alone do not say which chip it is)."""
    name, _ = torch_npu_device()
    if name is None:
        return None
    live = {"name": name, **_npu_properties()}
    table = Backend._match_device(name, _MATCH)
    if table is not None:
        return table.with_live(**live)
    spec = _spec(name, name.replace(" ", ""), live.get("compute_units"), live.get("l2_bytes"))
    return replace(spec, source="live")
