"""The system C compiler: discovery, flag probing and cached compilation to shared objects.

Compiler choice: ``CC`` (may carry a launcher and arguments, e.g. ``"ccache gcc"``), else the
first of ``cc``, ``gcc``, ``clang`` on ``PATH``. Flags: ``-O3 -march=native -fopenmp -fPIC
-shared -Wall -Wextra -Werror`` plus ``-std=gnu11 -fno-math-errno`` (the generated code never
reads ``errno``; the flag lets ``sqrtf`` vectorise). A compiler that rejects
``-march=native`` gets the portable flags; one without OpenMP is an error naming the package
to install.

Artifacts live in the yirage disk cache (``cpu-so`` entries), keyed by the source hash, the
compiler identity, the flags, the host CPU, and the versions of the core, yirage-cpu and the
printer; writes are atomic and locked, so concurrent processes compile once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from yirage import _cache
from yirage._errors import BackendError, BackendUnavailableError
from yirage_cpu._codegen import CODEGEN_VERSION

__all__ = [
    "CompileError",
    "CompiledLibrary",
    "Compiler",
    "CompilerNotFoundError",
    "OpenMPUnavailableError",
    "compile_shared",
    "find_compiler",
    "host_cpu_id",
]

_CANDIDATES = ("cc", "gcc", "clang")
_BASE_FLAGS = (
    "-O3",
    "-fPIC",
    "-shared",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-std=gnu11",
    "-fno-math-errno",
)
_NATIVE = ("-march=native",)
_OPENMP = ("-fopenmp",)
_COMPILE_TIMEOUT_S = 600.0
_INSTALL_HINT = (
    "install a C compiler (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc; "
    "macOS: xcode-select --install) or set the CC environment variable to one"
)


class CompilerNotFoundError(BackendUnavailableError):
    """No usable C compiler: the message names the package to install and ``CC``."""

    def __init__(self, reason: str) -> None:
        super().__init__("cpu", reason)


class OpenMPUnavailableError(BackendUnavailableError):
    """The compiler cannot build OpenMP code (``-fopenmp`` rejected or libgomp/libomp missing)."""

    def __init__(self, reason: str) -> None:
        super().__init__("cpu", reason)


class CompileError(BackendError):
    """The compiler rejected generated code (a yirage-cpu bug: please report it)."""

    def __init__(
        self, message: str, *, command: list[str], stderr: str, source_path: Path | None
    ) -> None:
        super().__init__(message)
        self.command = command
        self.stderr = stderr
        self.source_path = source_path


@dataclass(frozen=True)
class Compiler:
    """A C compiler: ``command`` is the argv prefix (launcher + compiler + CC's arguments)."""

    command: tuple[str, ...]
    path: str
    kind: str
    version: str
    from_env: bool = False

    @property
    def ident(self) -> str:
        """Identity for cache keys and reports, e.g. ``gcc 12.2.0 (/usr/bin/gcc)``."""
        return f"{self.kind} {self.version} ({' '.join(self.command)})"

    def describe(self) -> str:
        return f"{self.kind} {self.version} at {self.path}" + (
            " (from CC)" if self.from_env else ""
        )


@dataclass(frozen=True)
class CompiledLibrary:
    """A compiled shared object in the cache."""

    path: Path
    cache_hit: bool
    compile_seconds: float
    compiler: Compiler
    flags: tuple[str, ...]
    key: str
    source_path: Path | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def toolchain(self) -> dict[str, str]:
        return {
            "compiler": self.compiler.describe(),
            "flags": " ".join(self.flags),
        }


def _version_of(command: tuple[str, ...]) -> tuple[str, str]:
    """(kind, version) from ``--version`` and ``-dumpversion``."""
    try:
        proc = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompilerNotFoundError(
            f"the C compiler {' '.join(command)!r} could not be run ({exc}); {_INSTALL_HINT}"
        ) from None
    text = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise CompilerNotFoundError(
            f"{' '.join(command)} --version failed (exit {proc.returncode}): "
            f"{text.strip()[:200]}; {_INSTALL_HINT}"
        )
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    low = text.lower()
    kind = (
        "clang"
        if "clang" in low
        else "gcc"
        if ("gcc" in low or "free software foundation" in low)
        else "cc"
    )
    try:
        dump = subprocess.run(
            [*command, "-dumpfullversion", "-dumpversion"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        dump = ""
    return kind, (dump.splitlines()[0] if dump else first)


def find_compiler() -> Compiler:
    """The C compiler to use (``CC`` first). Raises :class:`CompilerNotFoundError`.

    Memoised per (``CC``, ``PATH``): the version probe runs the compiler once per process."""
    return _find_compiler(os.environ.get("CC", "").strip(), os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=16)
def _find_compiler(cc: str, path: str) -> Compiler:
    del path  # part of the memo key: shutil.which() below reads PATH
    if cc:
        try:
            argv = shlex.split(cc)
        except ValueError as exc:
            raise CompilerNotFoundError(f"CC={cc!r} cannot be parsed ({exc})") from None
        exe = shutil.which(argv[0]) if argv else None
        if exe is None:
            raise CompilerNotFoundError(
                f"CC={cc!r} does not name an executable compiler; fix or unset CC, or "
                f"{_INSTALL_HINT.replace(' or set the CC environment variable to one', '')}"
            )
        command = (exe, *argv[1:])
        kind, version = _version_of(command)
        return Compiler(command, exe, kind, version, from_env=True)
    for name in _CANDIDATES:
        exe = shutil.which(name)
        if exe is not None:
            command = (exe,)
            kind, version = _version_of(command)
            return Compiler(command, exe, kind, version)
    raise CompilerNotFoundError(
        f"no C compiler found on PATH (tried {', '.join(_CANDIDATES)}); {_INSTALL_HINT}"
    )


@functools.lru_cache(maxsize=1)
def host_cpu_id() -> str:
    """The host CPU's identity (model and ISA flags): ``-march=native`` code is only reused on
    the CPU it was built for."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            seen = set()
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if (
                    key in ("model name", "flags", "Features", "CPU implementer", "CPU part")
                    and key not in seen
                ):
                    seen.add(key)
                    parts.append(value.strip())
    except OSError:
        pass
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _core_version() -> str:
    try:
        from yirage import _core

        return str(_core.__version__)
    except Exception:
        return "unknown"


def _package_version() -> str:
    try:
        import importlib.metadata

        return importlib.metadata.version("yirage-cpu")
    except Exception:
        return "0+unknown"


_PROBE_SOURCE = """#include <omp.h>
int yr_probe(void) { int n = 0;
#pragma omp parallel reduction(+:n)
  n += 1;
  return n + omp_get_max_threads(); }
"""


def _try_compile(compiler: Compiler, flags: tuple[str, ...], source: str) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="yirage-cc-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / "probe.so"
        try:
            proc = subprocess.run(
                [*compiler.command, *flags, str(src), "-o", str(out)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        return proc.returncode == 0 and out.exists(), (proc.stderr or proc.stdout or "").strip()


def _simd_flags(compiler: Compiler, simd_width_bits: int | None) -> tuple[str, ...]:
    if (
        simd_width_bits
        and simd_width_bits >= 512
        and compiler.kind == "gcc"
        and platform.machine() in ("x86_64", "AMD64")
    ):
        return ("-mprefer-vector-width=512",)
    return ()


def select_flags(
    compiler: Compiler, simd_width_bits: int | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flags, notes) for ``compiler``, probed once per compiler identity and cached on disk."""
    extra = _simd_flags(compiler, simd_width_bits)
    parts = {
        "compiler": compiler.ident,
        "cpu": host_cpu_id(),
        "extra": " ".join(extra),
        "probe": "1",
    }
    path = _cache.entry_path("cpu-toolchain", parts, ".json")
    cached = _cache.read_json(path)
    if cached:
        flags_c, notes_c = cached.get("flags"), cached.get("notes", [])
        if isinstance(flags_c, list) and isinstance(notes_c, list):
            return tuple(str(f) for f in flags_c), tuple(str(n) for n in notes_c)
    notes: list[str] = []
    full = (*_BASE_FLAGS, *_NATIVE, *extra, *_OPENMP)
    ok, err = _try_compile(compiler, full, _PROBE_SOURCE)
    if ok:
        flags = full
    else:
        portable = (*_BASE_FLAGS, *_OPENMP)
        ok2, err2 = _try_compile(compiler, portable, _PROBE_SOURCE)
        if ok2:
            flags = portable
            notes.append(
                f"{compiler.describe()} rejected -march=native; using portable flags "
                f"({err.splitlines()[0] if err else ''})"
            )
        else:
            ok3, _ = _try_compile(compiler, _BASE_FLAGS, "int yr_probe(void) { return 1; }\n")
            if ok3:
                raise OpenMPUnavailableError(
                    f"{compiler.describe()} cannot build OpenMP code (-fopenmp): {err2[:300]}. "
                    "Install the OpenMP runtime (Debian/Ubuntu: apt-get install libgomp1 for gcc, "
                    "apt-get install libomp-dev for clang; macOS: brew install libomp) or set CC "
                    "to a compiler with OpenMP support"
                )
            raise CompilerNotFoundError(
                f"{compiler.describe()} cannot build a shared library: {err2[:300]}; "
                f"{_INSTALL_HINT}"
            )
    with _cache.locked(path):
        _cache.write_json(path, {"flags": list(flags), "notes": notes})
    return flags, tuple(notes)


def compile_shared(
    source: str,
    *,
    compiler: Compiler | None = None,
    simd_width_bits: int | None = None,
    name: str = "kernel",
    extra_flags: tuple[str, ...] = (),
) -> CompiledLibrary:
    """Compile ``source`` to a shared object in the disk cache (or find it there).

    ``extra_flags`` are appended to the probed flags (tests use ``-DYR_SOFT_HALF``)."""
    t0 = time.perf_counter()
    cc = compiler or find_compiler()
    flags, notes = select_flags(cc, simd_width_bits)
    flags = (*flags, *extra_flags)
    parts = {
        "source": hashlib.sha256(source.encode("utf-8")).hexdigest(),
        "compiler": cc.ident,
        "flags": " ".join(flags),
        "cpu": host_cpu_id(),
        "core": _core_version(),
        "yirage_cpu": _package_version(),
        "codegen": CODEGEN_VERSION,
    }
    path = _cache.entry_path("cpu-so", parts, ".so")
    src_path = path.with_suffix(".c")
    if path.exists():
        return CompiledLibrary(
            path, True, time.perf_counter() - t0, cc, flags, path.stem, src_path, notes
        )
    with _cache.locked(path):
        if path.exists():  # another process built it while we waited for the lock
            return CompiledLibrary(
                path, True, time.perf_counter() - t0, cc, flags, path.stem, src_path, notes
            )
        _cache.atomic_write_bytes(src_path, source.encode("utf-8"))
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".so.tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        command = [*cc.command, *flags, str(src_path), "-o", str(tmp)]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False
            )
            if proc.returncode != 0:
                stderr = (proc.stderr or proc.stdout or "").strip()
                raise CompileError(
                    f"{cc.describe()} failed on the generated code for {name} "
                    f"(exit {proc.returncode}); "
                    f"source kept at {src_path}; command: {' '.join(command)}\n{stderr[:4000]}",
                    command=command,
                    stderr=stderr,
                    source_path=src_path,
                )
            os.replace(tmp, path)
        except subprocess.TimeoutExpired:
            raise CompileError(
                f"{cc.describe()} did not finish within {_COMPILE_TIMEOUT_S:.0f} s on {name}",
                command=command,
                stderr="",
                source_path=src_path,
            ) from None
        finally:
            if tmp.exists():
                tmp.unlink()
    return CompiledLibrary(
        path, False, time.perf_counter() - t0, cc, flags, path.stem, src_path, notes
    )


def forget(library: CompiledLibrary) -> None:
    """Remove a cache entry that turned out to be corrupt (it is rebuilt on the next compile)."""
    with _cache.locked(library.path):
        if library.path.exists():
            library.path.unlink()
