"""The system C compiler: discovery, flag probing and cached compilation to shared objects.

Compiler choice: ``CC`` (may carry a launcher and arguments, e.g. ``"ccache gcc"``), else the
first of ``cc``, ``gcc``, ``clang`` on ``PATH``. Flags: ``-O3 -march=native -fopenmp -fPIC
-shared -Wall -Wextra -Werror`` plus ``-std=gnu11 -fno-math-errno -fno-trapping-math`` (the
generated code never reads ``errno`` or the floating-point exception flags: the first lets
``sqrtf`` vectorise, the second lets the compiler if-convert the selects of the float16
conversions, which it otherwise vectorises only with AVX-512 masks). A compiler that rejects
``-march=native`` gets the portable flags; one without OpenMP is an error naming the package
to install. Apple clang has no ``-fopenmp`` of its own: it gets ``-Xpreprocessor -fopenmp
-lomp`` with Homebrew's libomp (``brew --prefix libomp``) or whatever ``CPATH`` and
``LIBRARY_PATH`` point at.

SIMD width: :func:`simd_width_bits_for` is the one place that decides how wide the printed
vector types may be — the detected width when the flags target the host (``-march=native``),
else :data:`PORTABLE_SIMD_BITS`, the width the portable flags guarantee. The CPU DeviceSpec,
and so the search's cost model, the printer and the cache keys, all take it from there.

Artifacts live in the yirage disk cache (``cpu-so`` entries), keyed by the source hash, the
compiler identity, the flags, the vector width they allow, the host CPU, and the versions of
the core, yirage-cpu and the printer; writes are atomic and locked, so concurrent processes
compile once. Each shared object is stored with its checksum (``yirage.plugin.store_artifact``)
and verified before it is reused or loaded: a damaged one is reported and compiled again
rather than handed to ``dlopen``.
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

from yirage import plugin
from yirage.plugin import Backend, BackendError, BackendUnavailableError
from yirage_cpu import _codegen
from yirage_cpu._codegen import CODEGEN_VERSION
from yirage_cpu._probe import _COMPILERS

__all__ = [
    "PORTABLE_SIMD_BITS",
    "CompileError",
    "CompiledLibrary",
    "Compiler",
    "CompilerNotFoundError",
    "OpenMPUnavailableError",
    "compile_shared",
    "find_compiler",
    "float16_path",
    "host_cpu_id",
    "host_simd_width_bits",
    "isa_features",
    "isa_report",
    "libomp_dirs",
    "matmul_half_path",
    "openmp_flags",
    "simd_width_bits_for",
]

_CANDIDATES = _COMPILERS
_BASE_FLAGS = (
    "-O3",
    "-fPIC",
    "-shared",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-std=gnu11",
    "-fno-math-errno",
    "-fno-trapping-math",
)
_NATIVE = ("-march=native",)
_OPENMP = ("-fopenmp",)
#: Apple clang's driver has no OpenMP: the preprocessor takes the pragmas, libomp the runtime.
_APPLE_OPENMP = ("-Xpreprocessor", "-fopenmp")
#: Where libomp lives when ``brew`` is not on PATH: (include dir, lib dir) of Homebrew on
#: Apple silicon, Homebrew on Intel, MacPorts.
_LIBOMP_DIRS = (
    ("/opt/homebrew/opt/libomp/include", "/opt/homebrew/opt/libomp/lib"),
    ("/usr/local/opt/libomp/include", "/usr/local/opt/libomp/lib"),
    ("/opt/local/include/libomp", "/opt/local/lib/libomp"),
)
#: Vector width (bits) code built with the portable flags (no ``-march``) may use: SSE2 is
#: part of x86-64 and NEON (ASIMD) of AArch64, both 16 bytes; elsewhere GCC and Clang lower
#: 16-byte generic vectors to what the target has.
PORTABLE_SIMD_BITS = 128
_COMPILE_TIMEOUT_S = 600.0
_APPLE_OPENMP_HINT = (
    "Apple clang has no OpenMP runtime of its own: install libomp (brew install libomp; "
    "yirage finds it through `brew --prefix libomp`), or put libomp's include and lib "
    "directories on CPATH and LIBRARY_PATH, or set CC to a compiler with OpenMP (e.g. "
    "brew install gcc, then CC=gcc-14)"
)
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
    """A C compiler: ``command`` is the argv prefix (launcher + compiler + CC's arguments);
    ``kind`` is ``gcc``, ``clang``, ``apple-clang`` (Xcode's, whose version string says
    "Apple clang") or ``cc``."""

    command: tuple[str, ...]
    path: str
    kind: str
    version: str
    from_env: bool = False

    @property
    def apple_clang(self) -> bool:
        return self.kind == "apple-clang"

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
    #: The vector width the flags guarantee (:func:`simd_width_bits_for`).
    simd_width_bits: int | None = None

    def toolchain(self) -> dict[str, str]:
        info = {"compiler": self.compiler.describe(), "flags": " ".join(self.flags)}
        if self.simd_width_bits is not None:
            info["simd_width_bits"] = str(self.simd_width_bits)
        return info


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
        "apple-clang"
        if "apple clang" in low or "apple llvm" in low
        else "clang"
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
    return plugin.CORE_VERSION


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


def libomp_dirs() -> tuple[str, str] | None:
    """(include dir, lib dir) of libomp for Apple clang: ``brew --prefix libomp`` when
    ``brew`` is on PATH, else the usual Homebrew / MacPorts places; None when none holds
    ``omp.h`` (``CPATH`` / ``LIBRARY_PATH`` may still provide it)."""
    return _libomp_dirs(os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=4)
def _libomp_dirs(path: str) -> tuple[str, str] | None:
    del path  # part of the memo key: `brew` is looked up on PATH
    candidates: list[tuple[str, str]] = []
    prefix = Backend._command_version("brew", "--prefix", "libomp", match=r"^/", timeout=30)
    if prefix:
        candidates.append((f"{prefix}/include", f"{prefix}/lib"))
    candidates.extend(_LIBOMP_DIRS)
    for include, lib in candidates:
        if Path(include, "omp.h").is_file():
            return include, lib
    return None


def openmp_flags(compiler: Compiler) -> tuple[str, ...]:
    """The flags that build and link OpenMP code with ``compiler``: ``-fopenmp``, or for Apple
    clang ``-Xpreprocessor -fopenmp`` + libomp's include and lib dirs (with an rpath, so the
    shared object finds ``libomp.dylib`` when loaded) + ``-lomp``."""
    if not compiler.apple_clang:
        return _OPENMP
    dirs = libomp_dirs()
    extra = () if dirs is None else (f"-I{dirs[0]}", f"-L{dirs[1]}", f"-Wl,-rpath,{dirs[1]}")
    return (*_APPLE_OPENMP, *extra, "-lomp")


def simd_width_bits_for(flags: tuple[str, ...], detected_bits: int | None) -> int | None:
    """The vector width (bits) code compiled with ``flags`` may use: the host's detected width
    (None: unknown) when the flags target the host (``-march=native``), else
    :data:`PORTABLE_SIMD_BITS` (the printer must not size vector types for an ISA the compile
    does not enable)."""
    if all(f in flags for f in _NATIVE):
        return detected_bits
    return PORTABLE_SIMD_BITS


def host_simd_width_bits(detected_bits: int | None, compiler: Compiler | None = None) -> int:
    """:func:`simd_width_bits_for` the flags ``compiler`` (default :func:`find_compiler`) gets
    on this host. Without a usable compiler the detected width (nothing can be built then,
    and the compile step raises the error that names the fix)."""
    try:
        cc = compiler or find_compiler()
        flags, _ = select_flags(cc, detected_bits)
    except (BackendUnavailableError, OSError):
        return detected_bits or PORTABLE_SIMD_BITS
    return simd_width_bits_for(flags, detected_bits) or PORTABLE_SIMD_BITS


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
    omp = openmp_flags(compiler)
    parts = {
        "compiler": compiler.ident,
        "cpu": host_cpu_id(),
        "extra": " ".join(extra),
        "openmp": " ".join(omp),
        "probe": "2",
    }
    path = plugin.entry_path("cpu-toolchain", parts, ".json")
    cached = plugin.read_json(path)
    if cached:
        flags_c, notes_c = cached.get("flags"), cached.get("notes", [])
        if isinstance(flags_c, list) and isinstance(notes_c, list):
            return tuple(str(f) for f in flags_c), tuple(str(n) for n in notes_c)
    notes: list[str] = []
    full = (*_BASE_FLAGS, *_NATIVE, *extra, *omp)
    ok, err = _try_compile(compiler, full, _PROBE_SOURCE)
    if ok:
        flags = full
    else:
        portable = (*_BASE_FLAGS, *omp)
        ok2, err2 = _try_compile(compiler, portable, _PROBE_SOURCE)
        if ok2:
            flags = portable
            notes.append(
                f"{compiler.describe()} rejected -march=native; using portable flags "
                f"({err.splitlines()[0] if err else ''})"
            )
        else:
            ok3, _ = _try_compile(compiler, _BASE_FLAGS, "int yr_probe(void) { return 1; }\n")
            if ok3 and compiler.apple_clang:
                raise OpenMPUnavailableError(
                    f"{compiler.describe()} cannot build OpenMP code "
                    f"({' '.join(omp)}): {err2[:300]}. {_APPLE_OPENMP_HINT}"
                )
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
    with plugin.locked(path):
        plugin.write_json(path, {"flags": list(flags), "notes": notes})
    return flags, tuple(notes)


#: Predefined macros of the vector ISA features the float16/bfloat16 and dot-product code
#: cares about, and the names reports give them (/proc/cpuinfo's spelling on x86).
ISA_MACROS = (
    ("__F16C__", "f16c"),
    ("__FMA__", "fma"),
    ("__AVX2__", "avx2"),
    ("__AVX512F__", "avx512f"),
    ("__AVX512BF16__", "avx512_bf16"),
    ("__AVX512FP16__", "avx512_fp16"),
    ("__AVX512VNNI__", "avx512_vnni"),
    ("__AMX_TILE__", "amx_tile"),
    ("__AMX_BF16__", "amx_bf16"),
    ("__ARM_NEON", "neon"),
    ("__ARM_FEATURE_FP16_VECTOR_ARITHMETIC", "fp16"),
    ("__ARM_FEATURE_BF16", "bf16"),
    ("__ARM_FEATURE_SVE", "sve"),
)


def isa_features(macros: set[str]) -> tuple[str, ...]:
    """The features of :data:`ISA_MACROS` among the predefined ``macros``."""
    return tuple(name for macro, name in ISA_MACROS if macro in macros)


def float16_path(features: tuple[str, ...]) -> str:
    """The float16 conversion path the printed code takes with ``features`` (the printer's
    ``YR_HALF_PATH``): ``avx512f``, ``f16c`` (with AVX), ``neon`` or ``portable``."""
    if "avx512f" in features:
        return "avx512f"
    if "f16c" in features:
        return "f16c"
    if "neon" in features and platform.machine().lower() in ("arm64", "aarch64"):
        return "neon"
    return "portable"


def matmul_half_path(features: tuple[str, ...], simd_width_bits: int | None = None) -> str:
    """How the printed matmuls multiply float16/bfloat16 B tiles with ``features`` (the
    printer's ``yr_matmul_half_path()``): bfloat16 by AVX512-BF16 dot products
    (``avx512_bf16``, 512-bit registers; where A is bfloat16, else widened as with AVX-512),
    by AVX2 / AVX-512 zero extensions (``avx2``, registers of 256 bits or more) or portable
    vector code; float16 widened by :func:`float16_path`'s instructions."""
    wide = simd_width_bits is None or simd_width_bits >= 256
    bf16 = "avx2" if wide and ("avx2" in features or "avx512f" in features) else "portable"
    if _codegen.bf16_dot_enabled(simd_width_bits or 512, features):
        bf16 = "avx512_bf16"
    return f"bfloat16 {bf16}, float16 {float16_path(features)}"


@functools.lru_cache(maxsize=8)
def predefined_macros(compiler: Compiler, flags: tuple[str, ...]) -> frozenset[str]:
    """The macros ``compiler`` predefines with ``flags`` (``-dM -E`` on an empty C file);
    empty when it cannot say."""
    with tempfile.TemporaryDirectory(prefix="yirage-cc-") as tmp:
        src = Path(tmp) / "empty.c"
        src.write_text("\n", encoding="utf-8")
        keep = [f for f in flags if f.startswith(("-m", "-f", "-std", "-D", "-O"))]
        try:
            proc = subprocess.run(
                [*compiler.command, *keep, "-dM", "-E", str(src)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return frozenset()
    words = (line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define "))
    return frozenset(words)


def isa_report(
    compiler: Compiler, flags: tuple[str, ...], simd_width_bits: int | None = None
) -> dict[str, str]:
    """What reports record about the vector ISA generated code is compiled for: the
    features the flags enable, the float16 conversion path and how matmuls widen 16-bit
    B tiles."""
    feats = isa_features(set(predefined_macros(compiler, flags)))
    return {
        "isa": " ".join(feats) or "(baseline)",
        "float16_path": float16_path(feats),
        "matmul_half_path": matmul_half_path(feats, simd_width_bits),
    }


def compile_shared(
    source: str,
    *,
    compiler: Compiler | None = None,
    simd_width_bits: int | None = None,
    name: str = "kernel",
    extra_flags: tuple[str, ...] = (),
) -> CompiledLibrary:
    """Compile ``source`` to a shared object in the disk cache (or find it there).

    ``simd_width_bits`` is the vector width ``source`` was printed for (the width of
    :func:`host_simd_width_bits`, when it came from the CpuBackend); ``extra_flags`` are
    appended to the probed flags (tests use ``-DYR_SOFT_HALF``)."""
    t0 = time.perf_counter()
    cc = compiler or find_compiler()
    flags, notes = select_flags(cc, simd_width_bits)
    vector_bits = simd_width_bits_for(flags, simd_width_bits)
    if simd_width_bits is not None and vector_bits is not None and simd_width_bits > vector_bits:
        notes = (
            *notes,
            f"the source was printed for {simd_width_bits}-bit vectors but the flags only "
            f"guarantee {vector_bits}-bit ones: the compiler splits them",
        )
    flags = (*flags, *extra_flags)
    parts = {
        "source": hashlib.sha256(source.encode("utf-8")).hexdigest(),
        "compiler": cc.ident,
        "flags": " ".join(flags),
        "simd": str(vector_bits or ""),
        "cpu": host_cpu_id(),
        "core": _core_version(),
        "yirage_cpu": _package_version(),
        "codegen": CODEGEN_VERSION,
    }
    path = plugin.entry_path("cpu-so", parts, ".so")
    src_path = path.with_suffix(".c")

    def done(cache_hit: bool) -> CompiledLibrary:
        seconds = time.perf_counter() - t0
        return CompiledLibrary(
            path, cache_hit, seconds, cc, flags, path.stem, src_path, notes, vector_bits
        )

    if plugin.verified_path(path) is not None:
        return done(True)
    with plugin.locked(path):
        if plugin.verified_path(path) is not None:  # another process built it meanwhile
            return done(True)
        _compile_into(cc, flags, source, path, name)
    return done(False)


def _compile_into(cc: Compiler, flags: tuple[str, ...], source: str, path: Path, name: str) -> None:
    """Compile ``source`` and store the shared object at ``path`` with its checksum (the
    caller holds the entry's lock); the source is kept beside it for error reports."""
    src_path = path.with_suffix(".c")
    plugin.atomic_write_bytes(src_path, source.encode("utf-8"))
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
        plugin.store_artifact(path, tmp.read_bytes())
    except subprocess.TimeoutExpired:
        raise CompileError(
            f"{cc.describe()} did not finish within {_COMPILE_TIMEOUT_S:.0f} s on {name}",
            command=command,
            stderr="",
            source_path=src_path,
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def forget(library: CompiledLibrary) -> None:
    """Remove a cache entry that turned out to be corrupt (it is rebuilt on the next compile)."""
    with plugin.locked(library.path):
        plugin.discard(library.path)
