"""Apple DeviceSpecs: datasheet table matched by chip name.

Apple publishes GPU core counts and memory bandwidth, not FLOPS, cache sizes or a matrix
peak, so those fields are None rather than estimates. shared_mem_per_block is the 32 KiB
threadgroup memory, warp_size the 32-wide SIMD-group and max_threads_per_block 1024 (Metal
feature-set tables); matrix_tile is simdgroup_matrix 8x8. The table describes the top GPU
configuration of each chip; a binned part has fewer cores. Apple GPUs are SIMT machines
(``execution_model="simt"``); launch_overhead_us is 5 µs, an estimate of a Metal
command-buffer dispatch and wait (Apple publishes no figure), above a CUDA launch.
"""

from __future__ import annotations

from yirage import Backend, DeviceSpec
from yirage_mps._probe import chip_name

_SIMDGROUP_MATRIX = (8, 8, 8)
_METAL_LAUNCH_US = 5.0

M2_ULTRA = DeviceSpec(
    name="Apple M2 Ultra (76-core GPU)",
    vendor="Apple",
    arch="apple8",
    compute_units=76,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=32 * 1024,
    l2_bytes=None,
    mem_bandwidth_gbps=800.0,
    peak_tflops_fp16=None,
    peak_tflops_fp32=None,
    matrix_tile=_SIMDGROUP_MATRIX,
    execution_model="simt",
    launch_overhead_us=_METAL_LAUNCH_US,
)
M3_MAX = DeviceSpec(
    name="Apple M3 Max (40-core GPU)",
    vendor="Apple",
    arch="apple9",
    compute_units=40,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=32 * 1024,
    l2_bytes=None,
    mem_bandwidth_gbps=400.0,
    peak_tflops_fp16=None,
    peak_tflops_fp32=None,
    matrix_tile=_SIMDGROUP_MATRIX,
    execution_model="simt",
    launch_overhead_us=_METAL_LAUNCH_US,
)

KNOWN_DEVICES: dict[str, DeviceSpec] = {"M2 Ultra": M2_ULTRA, "M3 Max": M3_MAX}
_MATCH = ((("M2 Ultra",), M2_ULTRA), (("M3 Max",), M3_MAX))


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
