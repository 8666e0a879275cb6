"""Apple DeviceSpecs: a datasheet table of the M1-M4 families matched by chip name.

Every Apple GPU has 32 KiB of threadgroup memory (``shared_mem_per_block``), 32-wide
SIMD-groups (``warp_size``), at most 1024 threads per threadgroup and 8x8 ``simdgroup_matrix``
(``matrix_tile``): Apple's Metal feature-set tables. GPU core counts and memory bandwidth are
Apple's own figures for the top GPU configuration of each chip (a binned part has fewer cores;
the M3 Max with 30 cores and the M4 Max with 32 have 300 and 410 GB/s): :data:`SOURCES` names
the page of each entry. Apple publishes an fp32 throughput only for M1 (2.6 TFLOPS); no fp16
or matrix peak, cache size or clock, so those fields are None rather than estimates. Apple GPUs
are SIMT machines (``execution_model="simt"``); launch_overhead_us is 5 µs, an estimate of a
Metal command-buffer dispatch and wait (Apple publishes no figure), above a CUDA launch.
"""

from __future__ import annotations

from yirage import Backend, DeviceSpec
from yirage_mps._probe import chip_name

_SIMDGROUP_MATRIX = (8, 8, 8)
_METAL_LAUNCH_US = 5.0
_FEATURE_TABLES = "developer.apple.com/metal/Metal-Feature-Set-Tables.pdf"
_NEWSROOM = "apple.com/newsroom/"


def _apple(chip: str, arch: str, cores: int, gbps: float, fp32: float | None = None) -> DeviceSpec:
    return DeviceSpec(
        name=f"Apple {chip} ({cores}-core GPU)",
        vendor="Apple",
        arch=arch,
        compute_units=cores,
        warp_size=32,
        max_threads_per_block=1024,
        shared_mem_per_block=32 * 1024,
        l2_bytes=None,
        mem_bandwidth_gbps=gbps,
        peak_tflops_fp16=None,
        peak_tflops_fp32=fp32,
        matrix_tile=_SIMDGROUP_MATRIX,
        execution_model="simt",
        launch_overhead_us=_METAL_LAUNCH_US,
    )


#: Metal GPU families: M1 apple7, M2 apple8, M3 and M4 apple9. M1's 68.25 GB/s is its
#: LPDDR4X-4266 on a 128-bit bus (Apple: M2's 100 GB/s is "50 percent more" than M1's).
KNOWN_DEVICES: dict[str, DeviceSpec] = {
    "M1": _apple("M1", "apple7", 8, 68.25, fp32=2.6),
    "M1 Pro": _apple("M1 Pro", "apple7", 16, 200.0),
    "M1 Max": _apple("M1 Max", "apple7", 32, 400.0),
    "M1 Ultra": _apple("M1 Ultra", "apple7", 64, 800.0),
    "M2": _apple("M2", "apple8", 10, 100.0),
    "M2 Pro": _apple("M2 Pro", "apple8", 19, 200.0),
    "M2 Max": _apple("M2 Max", "apple8", 38, 400.0),
    "M2 Ultra": _apple("M2 Ultra", "apple8", 76, 800.0),
    "M3": _apple("M3", "apple9", 10, 100.0),
    "M3 Pro": _apple("M3 Pro", "apple9", 18, 150.0),
    "M3 Max": _apple("M3 Max", "apple9", 40, 400.0),
    "M3 Ultra": _apple("M3 Ultra", "apple9", 80, 819.0),
    "M4": _apple("M4", "apple9", 10, 120.0),
    "M4 Pro": _apple("M4 Pro", "apple9", 20, 273.0),
    "M4 Max": _apple("M4 Max", "apple9", 40, 546.0),
}

#: Where each entry's figures come from (the threadgroup limits: the Metal feature-set tables).
SOURCES: dict[str, str] = {
    "M1": _NEWSROOM
    + "2020/11/apple-unleashes-m1/; "
    + _NEWSROOM
    + "2022/06/apple-unveils-m2-with-breakthrough-performance-and-capabilities/",
    "M1 Pro": _NEWSROOM
    + "2021/10/introducing-m1-pro-and-m1-max-the-most-powerful-chips-apple-has-ever-built/",
    "M1 Max": _NEWSROOM
    + "2021/10/introducing-m1-pro-and-m1-max-the-most-powerful-chips-apple-has-ever-built/",
    "M1 Ultra": _NEWSROOM
    + "2022/03/apple-unveils-m1-ultra-the-worlds-most-powerful-chip-for-a-personal-computer/",
    "M2": _NEWSROOM + "2022/06/apple-unveils-m2-with-breakthrough-performance-and-capabilities/",
    "M2 Pro": _NEWSROOM + "2023/01/apple-unveils-m2-pro-and-m2-max-next-generation-chips-for-"
    "next-level-workflows/",
    "M2 Max": _NEWSROOM + "2023/01/apple-unveils-m2-pro-and-m2-max-next-generation-chips-for-"
    "next-level-workflows/",
    "M2 Ultra": _NEWSROOM + "2023/06/apple-introduces-m2-ultra/",
    "M3": _NEWSROOM + "2023/10/apple-unveils-m3-m3-pro-and-m3-max-the-most-advanced-chips-for-"
    "a-personal-computer/",
    "M3 Pro": _NEWSROOM + "2023/10/apple-unveils-m3-m3-pro-and-m3-max-the-most-advanced-chips-"
    "for-a-personal-computer/",
    "M3 Max": _NEWSROOM + "2023/10/apple-unveils-m3-m3-pro-and-m3-max-the-most-advanced-chips-"
    "for-a-personal-computer/",
    "M3 Ultra": _NEWSROOM + "2025/03/apple-reveals-m3-ultra-taking-apple-silicon-to-a-new-extreme/",
    "M4": _NEWSROOM + "2024/05/apple-introduces-m4-chip/",
    "M4 Pro": _NEWSROOM + "2024/10/apple-introduces-m4-pro-and-m4-max/",
    "M4 Max": _NEWSROOM + "2024/10/apple-introduces-m4-pro-and-m4-max/",
}

M2_ULTRA = KNOWN_DEVICES["M2 Ultra"]
M3_MAX = KNOWN_DEVICES["M3 Max"]

# longest names first, so "M2 Max" is not matched as "M2"
_MATCH = tuple(
    ((name,), spec) for name, spec in sorted(KNOWN_DEVICES.items(), key=lambda kv: -len(kv[0]))
)


def gpu_core_count() -> int | None:
    """GPU cores from the IORegistry (macOS only), or None."""
    line = Backend._command_version(
        "ioreg", "-rc", "AGXAccelerator", "-d", "1", match=r"gpu-core-count"
    )
    if line is None:
        return None
    digits = line.rsplit("=", 1)[-1].strip()
    return int(digits) if digits.isdigit() else None


def device_spec() -> DeviceSpec | None:
    """The table entry of this Mac's chip when its GPU core count matches, else a live spec
    with the Metal limits; None when not on Apple silicon."""
    name = chip_name()
    if name is None:
        return None
    cores = gpu_core_count()
    table = Backend._match_device(name, _MATCH)
    if table is not None and cores in (None, table.compute_units):
        return table.with_live(compute_units=cores)
    return DeviceSpec(
        name=f"{name} ({cores}-core GPU)" if cores else name,
        vendor="Apple",
        arch="apple",
        compute_units=cores,
        warp_size=32,
        max_threads_per_block=1024,
        shared_mem_per_block=32 * 1024,
        l2_bytes=None,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=_SIMDGROUP_MATRIX,
        execution_model="simt",
        launch_overhead_us=_METAL_LAUNCH_US,
        source="live",
    )
