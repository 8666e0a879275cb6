"""Apple probe: macOS on Apple silicon, torch.backends.mps (imported lazily), toolchain."""

from __future__ import annotations

import importlib.util
import platform

from yirage import Backend, ProbeResult


def chip_name() -> str | None:
    """'Apple M2 Ultra' etc. on macOS (sysctl), else None."""
    if platform.system() != "Darwin":
        return None
    return Backend._command_version("sysctl", "-n", "machdep.cpu.brand_string")


def torch_mps() -> tuple[bool | None, str]:
    """(torch's verdict or None when torch is absent, note)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed"
    try:
        import torch

        ok = bool(torch.backends.mps.is_available())
    except Exception as exc:
        return False, f"torch.backends.mps failed: {exc}"
    if not ok:
        return False, (
            "torch.backends.mps.is_available() is False: this torch cannot use the GPU "
            "(MPS needs macOS 12.3 or later and an arm64 build of torch)"
        )
    return True, "torch.backends.mps.is_available() is True"


def toolchain() -> dict[str, str]:
    found: dict[str, str] = {}
    if platform.system() == "Darwin":
        metal = Backend._command_version("xcrun", "-sdk", "macosx", "metal", "--version")
        if metal and "error" not in metal.lower():
            found["metal"] = metal
        found["macos"] = platform.mac_ver()[0]
    version = Backend._distribution_version("torch")
    if version:
        found["torch"] = version
    return found


#: Why a Mac without torch is still "available" (docs/backends.md: available means the probe
#: found the hardware, as for a TPU without libtpu), and what is missing.
NO_TORCH = (
    "Apple silicon GPU found, but torch is not installed: yirage-mps runs on PyTorch's MPS "
    "backend (pip install torch)"
)


def probe() -> ProbeResult:
    """Never raises. Available on macOS/Apple silicon unless torch says MPS is unusable;
    without torch the reason says that the runtime yirage-mps needs is missing."""
    try:
        if platform.system() != "Darwin":
            return ProbeResult(False, f"not macOS (platform is {platform.system()})")
        if platform.machine() != "arm64":
            return ProbeResult(False, f"not Apple silicon (machine is {platform.machine()})")
        tools = toolchain()
        hardware = chip_name() or "Apple silicon"
        ok, note = torch_mps()
        if ok is None:
            return ProbeResult(True, NO_TORCH, hardware, tools)
        if ok is False:
            return ProbeResult(False, note, hardware, tools)
        return ProbeResult(True, f"Apple silicon GPU; {note}", hardware, tools)
    except Exception as exc:  # never raise from a probe
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
