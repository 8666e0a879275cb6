"""CPU probe: the CPU is always there, but the backend needs a C compiler to build its code.

The probe only resolves the compiler (``$CC``, else ``cc``/``gcc``/``clang`` on ``PATH``) and
asks it for its version; it compiles nothing. Without a compiler the backend is reported
unavailable, with the fix in the reason."""

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


_INSTALL = (
    "install a C compiler with OpenMP (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install "
    "gcc; macOS: xcode-select --install and brew install libomp)"
)


def missing_compiler_reason() -> str:
    """Why there is no compiler, naming the fix (``CC`` set to nothing runnable, or none on
    ``PATH``)."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        return (
            f"CC={cc!r} does not name an executable C compiler: fix or unset CC, or {_INSTALL}; "
            "the CPU backend compiles its kernels with it"
        )
    return (
        f"no C compiler found (tried $CC, {', '.join(_COMPILERS)} on PATH): {_INSTALL} or set "
        "CC to one; the CPU backend compiles its kernels with it"
    )


def probe() -> ProbeResult:
    """Never raises. Available when a C compiler resolves (nothing is compiled)."""
    try:
        try:
            hardware = cpu_model()
        except Exception:
            hardware = platform.machine() or "unknown CPU"
        compiler = find_compiler()
        if compiler is None:
            return ProbeResult(available=False, reason=missing_compiler_reason(), hardware=hardware)
        toolchain: dict[str, str] = {}
        version = Backend._command_version(compiler)
        toolchain["cc"] = f"{compiler} ({version})" if version else compiler
        reason = f"CPU always available; C compiler {compiler}"
        return ProbeResult(available=True, reason=reason, hardware=hardware, toolchain=toolchain)
    except Exception as exc:  # never raise from a probe
        return ProbeResult(available=True, reason=f"CPU always available (probe detail: {exc})")
