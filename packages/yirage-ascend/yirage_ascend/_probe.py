"""Huawei Ascend probe: /dev/davinci*, torch_npu (imported lazily), CANN toolchain."""

from __future__ import annotations

import glob
import importlib.util

from yirage import Backend, ProbeResult


def device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/davinci[0-9]*"))


def torch_npu_device() -> tuple[str | None, str]:
    """(device name or None, note) from torch_npu, imported only if it is installed."""
    if importlib.util.find_spec("torch_npu") is None:
        return None, "torch_npu not installed"
    try:
        import torch_npu

        if not torch_npu.npu.is_available():
            return None, "torch_npu.npu.is_available() is False"
        return str(torch_npu.npu.get_device_name(0)), "torch_npu sees the NPU"
    except Exception as exc:
        return None, f"torch_npu failed: {exc}"


def toolchain() -> dict[str, str]:
    found: dict[str, str] = {}
    bisheng = Backend._command_version("bisheng", "--version")
    if bisheng:
        found["bisheng"] = bisheng
    smi = Backend._command_version("npu-smi", "-v")
    if smi:
        found["npu-smi"] = smi
    for dist in ("torch", "torch-npu", "triton-ascend"):
        version = Backend._distribution_version(dist)
        if version:
            found[dist] = version
    return found


def probe() -> ProbeResult:
    """Never raises. Available when an Ascend NPU is visible (/dev/davinci* or torch_npu)."""
    try:
        tools = toolchain()
        nodes = device_nodes()
        name, note = torch_npu_device() if nodes or "torch-npu" in tools else (None, "")
        if nodes:
            return ProbeResult(
                True,
                f"{len(nodes)} Ascend device node(s) found",
                name or f"Ascend NPU ({nodes[0]})",
                tools,
            )
        if name is not None:
            return ProbeResult(True, note, name, tools)
        why = note or "torch_npu not installed"
        return ProbeResult(False, f"no Ascend NPU: /dev/davinci* absent and {why}", None, tools)
    except Exception as exc:  # never raise from a probe
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
