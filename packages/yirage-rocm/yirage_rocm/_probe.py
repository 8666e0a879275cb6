"""AMD probe: /dev/kfd and the KFD topology, torch for ROCm (imported lazily), toolchain."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from yirage import Backend, ProbeResult

_TOPOLOGY = Path("/sys/class/kfd/kfd/topology/nodes")


def gfx_name(target_version: int) -> str:
    """KFD gfx_target_version (e.g. 90402) -> LLVM target name (gfx942)."""
    major, minor, step = (
        target_version // 10000,
        (target_version // 100) % 100,
        target_version % 100,
    )
    return f"gfx{major}{minor:x}{step:x}"


def kfd_gpus(topology: Path = _TOPOLOGY) -> list[dict[str, int]]:
    """Properties of the GPU nodes of the KFD topology (CPU nodes have gfx_target_version 0)."""
    gpus: list[dict[str, int]] = []
    try:
        nodes = sorted(topology.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)
    except OSError:
        return gpus
    for node in nodes:
        try:
            text = (node / "properties").read_text()
        except OSError:
            continue
        props: dict[str, int] = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                props[parts[0]] = int(parts[1])
        if props.get("gfx_target_version", 0) > 0:
            gpus.append(props)
    return gpus


def torch_rocm_device() -> tuple[str | None, str]:
    """(device name or None, note) from torch built for ROCm, imported only if installed."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed"
    try:
        import torch
    except Exception as exc:
        return None, f"import torch failed: {exc}"
    if getattr(torch.version, "hip", None) is None:
        return None, "torch is not a ROCm build (torch.version.hip is None)"
    try:
        if not torch.cuda.is_available():
            return None, "torch (ROCm) sees no GPU"
        return str(torch.cuda.get_device_name(0)), "torch (ROCm) sees the GPU"
    except Exception as exc:
        return None, f"torch (ROCm) failed: {exc}"


def toolchain() -> dict[str, str]:
    found: dict[str, str] = {}
    hipcc = Backend._command_version("hipcc", "--version", match=r"(?i)hip version")
    if hipcc:
        found["hipcc"] = hipcc
    for dist in ("torch", "triton", "pytorch-triton-rocm"):
        version = Backend._distribution_version(dist)
        if version:
            found[dist] = version
    return found


def triton_has_amd_backend() -> bool:
    """Whether the installed triton carries its AMD backend (found on disk; triton is not
    imported)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        (Path(root) / "backends" / "amd" / "compiler.py").is_file()
        for root in spec.submodule_search_locations
    )


def probe() -> ProbeResult:
    """Never raises. Available when an AMD GPU is visible (/dev/kfd with GPU nodes, or torch)."""
    try:
        tools = toolchain()
        if os.path.exists("/dev/kfd"):
            gpus = kfd_gpus()
            if gpus:
                arch = gfx_name(gpus[0]["gfx_target_version"])
                return ProbeResult(
                    True, f"{len(gpus)} AMD GPU(s) in the KFD topology", f"AMD GPU {arch}", tools
                )
        name, note = torch_rocm_device()
        if name is not None:
            return ProbeResult(True, note, name, tools)
        return ProbeResult(
            False, f"no AMD GPU: /dev/kfd absent or without GPUs, and {note}", None, tools
        )
    except Exception as exc:  # never raise from a probe
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
