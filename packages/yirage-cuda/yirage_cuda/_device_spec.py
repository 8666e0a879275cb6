"""NVIDIA DeviceSpecs: datasheet table + live query (CUDA driver API via ctypes, or torch).

Table figures are NVIDIA's published dense numbers: peak_tflops_fp16 is the dense FP16 Tensor
Core peak (the datasheets' headline figures with sparsity are twice that), peak_tflops_fp32
the non-tensor FP32 peak; shared_mem_per_block is the opt-in maximum per block (CUDA C
Programming Guide, "Features and Technical Specifications" table); warp_size 32;
matrix_tile is the warp-level mma.sync shape m16n8k16 available on all of them. Every NVIDIA
GPU is a SIMT machine (``execution_model="simt"``); launch_overhead_us stays None (the
core's SIMT default of about 2 µs per kernel: NVIDIA publishes no such figure).
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from typing import Any

from yirage import Backend, DeviceSpec
from yirage_cuda._probe import device_nodes, smi_gpu_names

_MMA = (16, 8, 16)

H100_SXM = DeviceSpec(
    name="NVIDIA H100 SXM5 80GB",
    vendor="NVIDIA",
    arch="sm_90",
    compute_units=132,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=227 * 1024,
    l2_bytes=50 * 2**20,
    mem_bandwidth_gbps=3350.0,
    peak_tflops_fp16=989.4,
    peak_tflops_fp32=67.0,
    matrix_tile=_MMA,
    execution_model="simt",
)
H200 = DeviceSpec(
    name="NVIDIA H200 SXM 141GB",
    vendor="NVIDIA",
    arch="sm_90",
    compute_units=132,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=227 * 1024,
    l2_bytes=50 * 2**20,
    mem_bandwidth_gbps=4800.0,
    peak_tflops_fp16=989.4,
    peak_tflops_fp32=67.0,
    matrix_tile=_MMA,
    execution_model="simt",
)
A100_80GB = DeviceSpec(
    name="NVIDIA A100 SXM4 80GB",
    vendor="NVIDIA",
    arch="sm_80",
    compute_units=108,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=163 * 1024,
    l2_bytes=40 * 2**20,
    mem_bandwidth_gbps=2039.0,
    peak_tflops_fp16=312.0,
    peak_tflops_fp32=19.5,
    matrix_tile=_MMA,
    execution_model="simt",
)

# NVIDIA L4 datasheet: 121 TFLOPS dense FP16 Tensor Core (242 with sparsity), 30.3 TFLOPS
# FP32, 300 GB/s GDDR6; 58 SMs and 48 MiB L2 (Ada whitepaper); 99 KiB opt-in per block (cc 8.9).
L4 = DeviceSpec(
    name="NVIDIA L4",
    vendor="NVIDIA",
    arch="sm_89",
    compute_units=58,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=99 * 1024,
    l2_bytes=48 * 2**20,
    mem_bandwidth_gbps=300.0,
    peak_tflops_fp16=121.0,
    peak_tflops_fp32=30.3,
    matrix_tile=_MMA,
    execution_model="simt",
)

KNOWN_DEVICES: dict[str, DeviceSpec] = {
    "H100 SXM": H100_SXM,
    "H200": H200,
    "A100 80GB": A100_80GB,
    "L4": L4,
}

# (needles in the runtime's device name, table entry); "!x" = must not contain x.
_MATCH = (
    (("H200", "!NVL"), H200),
    (("H100", "!PCIe", "!NVL"), H100_SXM),
    (("A100", "80GB", "!PCIe"), A100_80GB),
    (("L4", "!L40"), L4),
)

# CUdevice_attribute values of the CUDA driver API.
_ATTR = {
    "max_threads_per_block": 1,
    "warp_size": 10,
    "compute_units": 16,
    "l2_bytes": 38,
    "cc_major": 75,
    "cc_minor": 76,
    "shared_mem_per_block": 97,  # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
}


def _query_driver() -> dict[str, Any] | None:
    """Properties of device 0 through libcuda (no SDK import); None when unavailable."""
    if sys.platform != "linux":
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if lib.cuInit(0) != 0:
        return None
    dev = ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    buf = ctypes.create_string_buffer(256)
    if lib.cuDeviceGetName(buf, 256, dev) != 0:
        return None
    props: dict[str, Any] = {"name": buf.value.decode(errors="replace")}
    for key, attr in _ATTR.items():
        value = ctypes.c_int()
        if lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0:
            props[key] = value.value
    return props


def _query_torch() -> dict[str, Any] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if getattr(torch.version, "cuda", None) is None or not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return {
        "name": str(p.name),
        "compute_units": int(p.multi_processor_count),
        "cc_major": int(p.major),
        "cc_minor": int(p.minor),
        "shared_mem_per_block": getattr(p, "shared_memory_per_block_optin", None),
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "warp_size": getattr(p, "warp_size", None),
    }


def live_properties() -> dict[str, Any] | None:
    for query in (_query_driver, _query_torch):
        try:
            props = query()
        except Exception:
            props = None
        if props:
            return props
    return None


def device_spec() -> DeviceSpec | None:
    """Spec of GPU 0: the table entry refined live, or live only, or the table by the
    nvidia-smi name; None without a GPU."""
    props = live_properties()
    if props is None:
        names = smi_gpu_names() if device_nodes() else []
        return Backend._match_device(names[0], _MATCH) if names else None
    arch = None
    if "cc_major" in props and "cc_minor" in props:
        arch = f"sm_{props['cc_major']}{props['cc_minor']}"
    live = {
        "name": props["name"],
        "arch": arch,
        "compute_units": props.get("compute_units"),
        "warp_size": props.get("warp_size"),
        "max_threads_per_block": props.get("max_threads_per_block"),
        "shared_mem_per_block": props.get("shared_mem_per_block"),
        "l2_bytes": props.get("l2_bytes"),
    }
    table = Backend._match_device(props["name"], _MATCH)
    if table is not None:
        return table.with_live(**live)
    return DeviceSpec(
        name=props["name"],
        vendor="NVIDIA",
        arch=arch or "unknown",
        compute_units=live["compute_units"],
        warp_size=live["warp_size"] or 32,
        max_threads_per_block=live["max_threads_per_block"],
        shared_mem_per_block=live["shared_mem_per_block"],
        l2_bytes=live["l2_bytes"],
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=_MMA if (props.get("cc_major") or 0) >= 8 else None,
        execution_model="simt",
        source="live",
    )
