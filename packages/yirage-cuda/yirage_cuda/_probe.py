"""NVIDIA probe: device nodes, the driver, torch.cuda (imported lazily), toolchain versions."""

from __future__ import annotations

import glob
import importlib.util

from yirage import Backend, ProbeResult


def device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def smi_gpu_names() -> list[str]:
    """GPU names reported by nvidia-smi (empty when it is missing or fails)."""
    first = Backend._command_version("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
    return [first] if first and "fail" not in first.lower() else []


def torch_cuda_device() -> tuple[str | None, str]:
    """(device name or None, note) from torch.cuda, importing torch only if it is installed."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed"
    try:
        import torch
    except Exception as exc:
        return None, f"import torch failed: {exc}"
    if getattr(torch.version, "cuda", None) is None:
        return None, "torch has no CUDA support"
    try:
        if not torch.cuda.is_available():
            return None, "torch.cuda.is_available() is False"
        return str(torch.cuda.get_device_name(0)), "torch.cuda sees the GPU"
    except Exception as exc:
        return None, f"torch.cuda failed: {exc}"


def toolchain() -> dict[str, str]:
    found: dict[str, str] = {}
    nvcc = Backend._command_version("nvcc", "--version", match=r"release")
    if nvcc:
        found["nvcc"] = nvcc
    driver = Backend._command_version(
        "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"
    )
    if driver and "fail" not in driver.lower():
        found["driver"] = driver
    for dist in ("torch", "triton", "nvidia-cuda-nvrtc-cu12"):
        version = Backend._distribution_version(dist)
        if version:
            found[dist] = version
    return found


def probe() -> ProbeResult:
    """Never raises. Available when an NVIDIA GPU is visible (device nodes or torch.cuda)."""
    try:
        tools = toolchain()
        nodes = device_nodes()
        if nodes:
            names = smi_gpu_names()
            hardware = names[0] if names else f"NVIDIA GPU ({nodes[0]})"
            return ProbeResult(True, f"{len(nodes)} NVIDIA device node(s) found", hardware, tools)
        name, note = torch_cuda_device()
        if name is not None:
            return ProbeResult(True, note, name, tools)
        return ProbeResult(False, f"no NVIDIA GPU: /dev/nvidia* absent and {note}", None, tools)
    except Exception as exc:  # never raise from a probe
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
