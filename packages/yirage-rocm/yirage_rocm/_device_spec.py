"""AMD DeviceSpecs: datasheet table + live query of the KFD topology.

Table figures from AMD's datasheets: peak_tflops_fp16 is the dense FP16 matrix peak,
peak_tflops_fp32 the FP32 vector peak (without matrix cores); shared_mem_per_block is the
64 KiB LDS per workgroup; warp_size the 64-wide wavefront (CDNA ISA guides); matrix_tile
the MFMA 32x32x8 FP16 shape. An MI250X shows up as two devices (one per GCD), so its entry
describes one GCD (half the package figures). AMD GPUs are SIMT machines
(``execution_model="simt"``); launch_overhead_us stays None (the core's SIMT default).
"""

from __future__ import annotations

from yirage import DeviceSpec
from yirage_rocm._probe import gfx_name, kfd_gpus

_MFMA = (32, 32, 8)

MI300X = DeviceSpec(
    name="AMD Instinct MI300X",
    vendor="AMD",
    arch="gfx942",
    compute_units=304,
    warp_size=64,
    max_threads_per_block=1024,
    shared_mem_per_block=64 * 1024,
    l2_bytes=32 * 2**20,  # 4 MiB per XCD x 8 (plus 256 MiB Infinity Cache, not counted)
    mem_bandwidth_gbps=5300.0,
    peak_tflops_fp16=1307.4,
    peak_tflops_fp32=81.7,
    matrix_tile=_MFMA,
    execution_model="simt",
)
MI250X_GCD = DeviceSpec(
    name="AMD Instinct MI250X (one GCD)",
    vendor="AMD",
    arch="gfx90a",
    compute_units=110,
    warp_size=64,
    max_threads_per_block=1024,
    shared_mem_per_block=64 * 1024,
    l2_bytes=8 * 2**20,
    mem_bandwidth_gbps=1638.4,
    peak_tflops_fp16=191.5,
    peak_tflops_fp32=23.95,
    matrix_tile=_MFMA,
    execution_model="simt",
)

KNOWN_DEVICES: dict[str, DeviceSpec] = {"MI300X": MI300X, "MI250X": MI250X_GCD}


def _table(arch: str, compute_units: int | None) -> DeviceSpec | None:
    for spec in KNOWN_DEVICES.values():
        if spec.arch == arch and spec.compute_units == compute_units:
            return spec
    return None


def device_spec() -> DeviceSpec | None:
    """Spec of the first KFD GPU node (table entry refined live, or live only); None without
    a GPU."""
    gpus = kfd_gpus()
    if not gpus:
        return None
    p = gpus[0]
    arch = gfx_name(p["gfx_target_version"])
    simd_per_cu = p.get("simd_per_cu") or 0
    cus = p["simd_count"] // simd_per_cu if simd_per_cu and p.get("simd_count") else None
    lds = p.get("lds_size_in_kb")
    shared = lds * 1024 if lds else None
    wave = p.get("wave_front_size")
    table = _table(arch, cus)
    if table is not None:
        return table.with_live(
            arch=arch, compute_units=cus, warp_size=wave, shared_mem_per_block=shared
        )
    return DeviceSpec(
        name=f"AMD GPU {arch}",
        vendor="AMD",
        arch=arch,
        compute_units=cus,
        warp_size=wave or 64,
        max_threads_per_block=1024,
        shared_mem_per_block=shared,
        l2_bytes=None,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=None,
        execution_model="simt",
        source="live",
    )
