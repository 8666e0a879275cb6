"""AMD DeviceSpecs: a datasheet table, refined live from the KFD topology or torch for ROCm.

Sources of the table (AMD's published figures, dense, without sparsity):

- MI300X: AMD Instinct MI300X data sheet and the CDNA3 white paper: 304 CUs in 8 XCDs, 4 MB
  L2 per XCD (32 MiB) plus 256 MB Infinity Cache, 5.3 TB/s HBM3, 1307.4 TFLOPS FP16/BF16
  matrix, 81.7 TFLOPS FP32 vector.
- MI325X: AMD Instinct MI325X data sheet: the MI300X's 304 CDNA3 CUs and caches with 6.0 TB/s
  HBM3E; 1307.4 TFLOPS FP16/BF16 matrix, 81.7 TFLOPS FP32 vector.
- MI250X: AMD Instinct MI250X data sheet (package: 220 CUs, 3.2768 TB/s, 383 TFLOPS FP16/BF16,
  47.9 TFLOPS FP32 vector); it shows up as two devices, one per GCD, so its entry is one GCD:
  110 CUs, 8 MB L2, half of the bandwidth and peaks.
- MI210: AMD Instinct MI210 data sheet: 104 CUs, 8 MB L2, 1.6384 TB/s HBM2e, 181 TFLOPS
  FP16/BF16 matrix, 22.6 TFLOPS FP32 vector.
- Radeon RX 7900 XTX: AMD product page and the RDNA3 ISA guide: 96 CUs, 6 MB L2 plus 96 MB
  Infinity Cache, 960 GB/s GDDR6, 122.8 TFLOPS FP16 (WMMA), 61.4 TFLOPS FP32; wave32 is the
  HIP wavefront on gfx11, WMMA 16x16x16.

Every AMD GPU here has 64 KiB of LDS per workgroup (CDNA2/CDNA3 ISA guides; RDNA3 per
workgroup in WGP mode) and 1024 threads per workgroup. ``matrix_tile`` is the 16x16x16
FP16 matrix instruction (``v_mfma_f32_16x16x16_f16`` on CDNA, ``v_wmma_f32_16x16x16_f16`` on
RDNA3) the printed kernels ask for (``matrix_instr_nonkdim=16``). AMD GPUs are SIMT machines;
launch_overhead_us stays None (the core's SIMT default: AMD publishes no such figure).
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any

from yirage import DeviceSpec
from yirage_rocm._probe import gfx_name, kfd_gpus

_MATRIX = (16, 16, 16)
_LDS = 64 * 1024


def _amd(name: str, arch: str, **figures: Any) -> DeviceSpec:
    fields: dict[str, Any] = {
        "warp_size": 64,
        "max_threads_per_block": 1024,
        "shared_mem_per_block": _LDS,
        "matrix_tile": _MATRIX,
        "execution_model": "simt",
        **figures,
    }
    return DeviceSpec(name=name, vendor="AMD", arch=arch, **fields)


MI300X = _amd(
    "AMD Instinct MI300X",
    "gfx942",
    compute_units=304,
    l2_bytes=32 * 2**20,  # 4 MB per XCD x 8 (the 256 MB Infinity Cache is not counted)
    mem_bandwidth_gbps=5300.0,
    peak_tflops_fp16=1307.4,
    peak_tflops_fp32=81.7,
)
MI325X = _amd(
    "AMD Instinct MI325X",
    "gfx942",
    compute_units=304,
    l2_bytes=32 * 2**20,
    mem_bandwidth_gbps=6000.0,
    peak_tflops_fp16=1307.4,
    peak_tflops_fp32=81.7,
)
MI250X_GCD = _amd(
    "AMD Instinct MI250X (one GCD)",
    "gfx90a",
    compute_units=110,
    l2_bytes=8 * 2**20,
    mem_bandwidth_gbps=1638.4,
    peak_tflops_fp16=191.5,
    peak_tflops_fp32=23.95,
)
MI210 = _amd(
    "AMD Instinct MI210",
    "gfx90a",
    compute_units=104,
    l2_bytes=8 * 2**20,
    mem_bandwidth_gbps=1638.4,
    peak_tflops_fp16=181.0,
    peak_tflops_fp32=22.6,
)
RX_7900_XTX = _amd(
    "AMD Radeon RX 7900 XTX",
    "gfx1100",
    compute_units=96,
    warp_size=32,
    l2_bytes=6 * 2**20,  # plus 96 MB Infinity Cache, not counted
    mem_bandwidth_gbps=960.0,
    peak_tflops_fp16=122.8,
    peak_tflops_fp32=61.4,
)

KNOWN_DEVICES: dict[str, DeviceSpec] = {
    "MI300X": MI300X,
    "MI325X": MI325X,
    "MI250X": MI250X_GCD,
    "MI210": MI210,
    "RX7900XTX": RX_7900_XTX,
}


def _table(arch: str, compute_units: int | None) -> DeviceSpec | None:
    """The table entry of this architecture and CU count (MI300X and MI325X share both:
    the first, MI300X, then stands for either)."""
    for spec in KNOWN_DEVICES.values():
        if spec.arch == arch and spec.compute_units == compute_units:
            return spec
    return None


def from_properties(
    arch: str,
    compute_units: int | None,
    warp_size: int | None,
    lds_bytes: int | None,
    l2_bytes: int | None = None,
    name: str | None = None,
) -> DeviceSpec:
    """A spec from live figures: the matching table entry refined by them, else live only."""
    table = _table(arch, compute_units)
    if table is not None:
        return table.with_live(
            arch=arch,
            compute_units=compute_units,
            warp_size=warp_size,
            shared_mem_per_block=lds_bytes,
        )
    return DeviceSpec(
        name=name or f"AMD GPU {arch}",
        vendor="AMD",
        arch=arch,
        compute_units=compute_units,
        warp_size=warp_size or (32 if arch.startswith("gfx1") else 64),
        max_threads_per_block=1024,
        shared_mem_per_block=lds_bytes,
        l2_bytes=l2_bytes,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=None,
        execution_model="simt",
        source="live",
    )


def kfd_spec() -> DeviceSpec | None:
    """Spec of the first GPU node of the KFD topology; None without one."""
    gpus = kfd_gpus()
    if not gpus:
        return None
    p = gpus[0]
    arch = gfx_name(p["gfx_target_version"])
    simd_per_cu = p.get("simd_per_cu") or 0
    cus = p["simd_count"] // simd_per_cu if simd_per_cu and p.get("simd_count") else None
    lds = p.get("lds_size_in_kb")
    return from_properties(arch, cus, p.get("wave_front_size"), lds * 1024 if lds else None)


def torch_spec() -> DeviceSpec | None:
    """Spec from ``torch.cuda.get_device_properties`` on a ROCm build of torch (None
    elsewhere): gcnArchName, CU count, wavefront, LDS and L2 as torch reports them."""
    if importlib.util.find_spec("torch") is None:
        return None
    with contextlib.suppress(Exception):
        import torch

        if getattr(torch.version, "hip", None) and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return spec_from_torch_properties(props)
    return None


def spec_from_torch_properties(props: Any) -> DeviceSpec:
    """A spec from a torch device-properties object of a ROCm device."""
    arch = str(getattr(props, "gcnArchName", "") or "gfx").split(":")[0]
    lds = getattr(props, "shared_memory_per_block", None)
    return from_properties(
        arch,
        getattr(props, "multi_processor_count", None),
        getattr(props, "warp_size", None),
        int(lds) if lds else None,
        getattr(props, "L2_cache_size", None) or None,
        str(getattr(props, "name", "")) or None,
    )


def device_spec() -> DeviceSpec | None:
    """The spec of the AMD GPU here: from the KFD topology, else from torch; None without
    one."""
    return kfd_spec() or torch_spec()
