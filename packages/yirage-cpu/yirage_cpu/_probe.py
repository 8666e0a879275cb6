"""CPU probe: the CPU is always there; report the C compiler code generation will use."""

from __future__ import annotations

import os
import platform
import shlex
import shutil

from yirage import Backend, ProbeResult

_COMPILERS = ("cc", "gcc", "clang")


def find_compiler() -> str | None:
    """The C compiler: ``$CC`` if set (its first word), else the first of cc, gcc, clang."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        try:
            first = shlex.split(cc)[0]
        except (ValueError, IndexError):
            first = cc
        return shutil.which(first) or None
    for name in _COMPILERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo or sysctl), else the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        brand = Backend._command_version("sysctl", "-n", "machdep.cpu.brand_string")
        if brand:
            return brand
    return platform.processor() or platform.machine() or "unknown CPU"


def probe() -> ProbeResult:
    """Never raises."""
    try:
        hardware = cpu_model()
        toolchain: dict[str, str] = {}
        compiler = find_compiler()
        if compiler is not None:
            version = Backend._command_version(compiler)
            toolchain["cc"] = f"{compiler} ({version})" if version else compiler
            reason = f"CPU always available; C compiler {compiler}"
        else:
            reason = (
                "CPU always available; no C compiler found (set CC or install gcc/clang): "
                "code generation will need one"
            )
        return ProbeResult(available=True, reason=reason, hardware=hardware, toolchain=toolchain)
    except Exception as exc:  # never raise from a probe
        return ProbeResult(available=True, reason=f"CPU always available (probe detail: {exc})")
