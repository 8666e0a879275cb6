"""CUDA toolchain wrapper: versions, device properties, compiling and caching artifacts.

* Triton: printed modules are written to the yirage cache (``cuda-triton`` entries, keyed by
  the source hash, the codegen version and the Triton/torch versions) and imported with
  importlib (``@triton.jit`` needs a real source file). ``aot_compile_triton`` compiles every
  kernel of a module for an explicit ``sm_XY`` target (no GPU needed: Triton ships ptxas),
  which is how CI checks that printed kernels compile for the H100.
* CUDA C++: compiled to a cubin (and PTX) with NVRTC through ``cuda.bindings.nvrtc`` when
  importable, else ``nvcc`` from PATH/CUDA_HOME; cached as ``cuda-cubin`` entries keyed by
  {source hash, compiler + version, arch}.

Every cached file is stored with its checksum (``yirage.plugin.store_artifact``) and verified
before it is used: a damaged module, cubin or PTX is reported once and written again.

Nothing here imports torch/triton/cuda-python at module import time.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from yirage import plugin
from yirage.plugin import BackendError

__all__ = [
    "CompiledCuda",
    "DeviceInfo",
    "ToolchainError",
    "aot_compile_triton",
    "compile_cuda",
    "device_info",
    "interpret_mode",
    "load_triton_module",
    "nvrtc_available",
    "toolchain_versions",
    "write_triton_module",
]


class ToolchainError(BackendError):
    """A compiler is missing or rejected generated code (the message carries its log)."""


# ---------------------------------------------------------------------------------------------
# versions


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except Exception:
        return None


def _nvrtc_module() -> Any | None:
    for name in ("cuda.bindings.nvrtc", "cuda.nvrtc"):  # cuda-python ≥ 12.6, older layout
        try:
            return importlib.import_module(name)
        except Exception:
            continue
    return None


def nvrtc_version() -> str | None:
    nvrtc = _nvrtc_module()
    if nvrtc is None:
        return None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
        if int(err) != 0:
            return None
        return f"{major}.{minor}"
    except Exception:
        return None


def nvrtc_available() -> bool:
    return nvrtc_version() is not None


def _nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    return None


def _first_line(cmd: list[str], needle: str) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except Exception:
        return None
    for line in (proc.stdout + proc.stderr).splitlines():
        if needle in line:
            return line.strip()
    return None


@functools.lru_cache(maxsize=1)
def _nvcc_version() -> str | None:
    path = _nvcc_path()
    return _first_line([path, "--version"], "release") if path else None


def _triton_ptxas() -> str | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        p = Path(base, "backends", "nvidia", "bin", "ptxas")
        if p.is_file():
            return str(p)
    return None


@functools.lru_cache(maxsize=1)
def _ptxas_version() -> str | None:
    path = _triton_ptxas() or shutil.which("ptxas")
    return _first_line([path, "--version"], "release") if path else None


def driver_version() -> str | None:
    """CUDA driver API version through libcuda (None without a driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except Exception:
        return None


def toolchain_versions() -> dict[str, str]:
    """Every CUDA-related tool yirage-cuda can use, with its version (absent: not found)."""
    out: dict[str, str] = {}
    for dist in (
        "triton",
        "torch",
        "cuda-python",
        "cuda-bindings",
        "cupy-cuda12x",
        "cupy-cuda13x",
        "numba",
    ):
        v = _dist_version(dist)
        if v:
            out[dist] = v
    if "torch" in out and importlib.util.find_spec("torch") is not None:
        with contextlib.suppress(Exception):
            import torch

            if torch.version.cuda:
                out["torch.cuda"] = str(torch.version.cuda)
    v = nvrtc_version()
    if v:
        out["nvrtc"] = v
    v = _nvcc_version()
    if v:
        out["nvcc"] = v
    v = _ptxas_version()
    if v:
        out["ptxas"] = v
    v = driver_version()
    if v:
        out["driver"] = v
    return out


# ---------------------------------------------------------------------------------------------
# device


@dataclass(frozen=True)
class DeviceInfo:
    """Live properties of one CUDA device."""

    index: int
    name: str
    cc: tuple[int, int]
    sm_count: int
    smem_per_block_optin: int
    smem_per_sm: int | None
    l2_bytes: int | None
    warp_size: int
    total_memory: int

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


def _attr_optin_smem(index: int) -> int | None:
    """cudaDevAttrMaxSharedMemoryPerBlockOptin through cuda-bindings, else libcuda."""
    with contextlib.suppress(Exception):
        cudart = importlib.import_module("cuda.bindings.runtime")

        err, value = cudart.cudaDeviceGetAttribute(
            cudart.cudaDeviceAttr.cudaDevAttrMaxSharedMemoryPerBlockOptin, index
        )
        if int(err) == 0:
            return int(value)
    with contextlib.suppress(Exception):
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuInit(0)
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), index) == 0:
            v = ctypes.c_int()
            if lib.cuDeviceGetAttribute(ctypes.byref(v), 97, dev) == 0:
                return int(v.value)
    return None


def device_info(index: int | None = None) -> DeviceInfo | None:
    """Properties of CUDA device ``index`` (default: torch's current device); None without one."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        idx = torch.cuda.current_device() if index is None else index
        p = torch.cuda.get_device_properties(idx)
    except Exception:
        return None
    optin = _attr_optin_smem(idx) or getattr(p, "shared_memory_per_block_optin", None)
    return DeviceInfo(
        index=idx,
        name=str(p.name),
        cc=(int(p.major), int(p.minor)),
        sm_count=int(p.multi_processor_count),
        smem_per_block_optin=int(optin or 48 * 1024),
        smem_per_sm=getattr(p, "shared_memory_per_multiprocessor", None),
        l2_bytes=getattr(p, "L2_cache_size", None),
        warp_size=int(getattr(p, "warp_size", 32)),
        total_memory=int(p.total_memory),
    )


# ---------------------------------------------------------------------------------------------
# Triton modules

_IMPORT_LOCK = threading.Lock()


@functools.cache
def triton_has_pdl() -> bool:
    """Whether the installed Triton prints programmatic dependent launch (``gdc_wait`` and
    ``gdc_launch_dependents`` in ``triton.language.extra.cuda``, Triton 3.3 and newer)."""
    try:
        cuda = importlib.import_module("triton.language.extra.cuda")
    except Exception:
        return False
    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def pin_triton_defaults() -> None:
    """Pin Triton knobs whose defaults are announced to change (Triton 3.9 warns about
    TRITON_DEFAULT_FP_FUSION), so printed kernels compile the same way across Triton
    releases. Only sets what the user has not set."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


_MODULES: dict[tuple[str, bool], ModuleType] = {}


def _triton_key(text: str, codegen_version: str) -> dict[str, str]:
    return {
        "source": hashlib.sha256(text.encode()).hexdigest(),
        "codegen": codegen_version,
        "triton": _dist_version("triton") or "none",
        "torch": _dist_version("torch") or "none",
    }


def write_triton_module(text: str, codegen_version: str) -> Path:
    """Write a printed Triton module into the cache (once) and return its path; an entry that
    fails its checksum is reported and written again."""
    path = plugin.entry_path("cuda-triton", _triton_key(text, codegen_version), ".py")
    data = text.encode()
    with plugin.locked(path):
        if plugin.load_verified_artifact(path) != data:
            plugin.store_artifact(path, data)
    return path


_STDLIB_LOCK = threading.RLock()
_STDLIB_WRAPPERS: dict[int, Any] = {}


@contextlib.contextmanager
def _interpreted_stdlib() -> Iterator[None]:
    """Make Triton's own ``@jit`` library functions (tl.zeros, tl.sum, tl.sigmoid …)
    interpretable while an interpreted kernel runs.

    Triton decides at *its* import whether those are compiled (JITFunction) or interpreted
    functions; when triton was imported without TRITON_INTERPRET (e.g. by torch, or by a GPU
    kernel earlier in the process), an interpreted kernel calling them fails. They are swapped
    for interpreter wrappers for the duration of the run and restored afterwards."""
    try:
        InterpretedFunction = importlib.import_module(
            "triton.runtime.interpreter"
        ).InterpretedFunction
        JITFunction = importlib.import_module("triton.runtime.jit").JITFunction
    except Exception:
        yield
        return
    with _STDLIB_LOCK:
        owners: list[Any] = [
            m
            for n, m in list(sys.modules.items())
            if m is not None and n.startswith("triton.language")
        ]
        classes = {
            id(v): v
            for m in owners
            for v in vars(m).values()
            if isinstance(v, type) and getattr(v, "__module__", "").startswith("triton.language")
        }
        owners += list(classes.values())
        # Snapshot everything: the interpreter patches language builtins for device-function
        # calls without undoing it, which would break later compilation for the GPU.
        snapshot = [(owner, dict(vars(owner))) for owner in owners]
        for owner in owners:
            for name, value in list(vars(owner).items()):
                if isinstance(value, JITFunction):
                    wrapper = _STDLIB_WRAPPERS.get(id(value))
                    if wrapper is None:
                        wrapper = _STDLIB_WRAPPERS[id(value)] = InterpretedFunction(value.fn)
                    setattr(owner, name, wrapper)
        try:
            yield
        finally:
            # Names the interpreter *added* to module globals (its helpers, which cached
            # rewritten functions refer to) stay; everything that existed is restored.
            for owner, before in snapshot:
                now = dict(vars(owner))
                for name, value in before.items():
                    if now.get(name, _MISSING) is not value:
                        with contextlib.suppress(AttributeError, TypeError):
                            setattr(owner, name, value)


_MISSING = object()


@contextlib.contextmanager
def interpret_mode(enabled: bool) -> Iterator[None]:
    """TRITON_INTERPRET on (or off) while importing or running printed modules; when on,
    Triton's library functions are made interpretable too (see ``_interpreted_stdlib``)."""
    old = os.environ.get("TRITON_INTERPRET")
    if enabled:
        os.environ["TRITON_INTERPRET"] = "1"
    elif old is not None:
        os.environ["TRITON_INTERPRET"] = "0"
    try:
        if enabled and "triton.language" in sys.modules:
            with _interpreted_stdlib():
                yield
        else:
            yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def load_triton_module(path: Path, interpret: bool = False) -> ModuleType:
    """Import a printed module; ``interpret`` makes its kernels run in the Triton interpreter
    (CPU tensors). Modules are cached per (file, mode) in this process."""
    key = (str(path), interpret)
    pin_triton_defaults()
    if "triton.language" not in sys.modules:
        # Import Triton itself in compiled mode, so its library stays usable by GPU kernels
        # in this process; interpreted runs swap in interpreter wrappers as they go.
        with interpret_mode(False):
            importlib.import_module("triton.language")
    with _IMPORT_LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        if plugin.verified_path(Path(path)) is None:
            raise ToolchainError(
                f"the generated Triton module {path} is missing or damaged and was not "
                "imported; compile the source again (write_triton_module restores it)"
            )
        name = f"yirage_cuda_gen_{Path(path).stem}_{'i' if interpret else 'c'}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ToolchainError(f"cannot import generated module {path}")
        mod = importlib.util.module_from_spec(spec)
        try:
            with interpret_mode(interpret):
                spec.loader.exec_module(mod)
        except Exception as exc:
            raise ToolchainError(f"generated Triton module {path} failed to import: {exc}") from exc
        sys.modules[name] = mod
        _MODULES[key] = mod
        return mod


_TRITON_PTR = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}


def aot_compile_triton(
    module: ModuleType, buffer_dtypes: Mapping[int, str], arch: int = 90
) -> dict[str, dict[str, Any]]:
    """Compile every kernel of a (non-interpreted) printed module for ``sm_<arch>`` ahead of
    time. Returns per kernel: shared memory bytes, stages, warps, the target and whether
    its PTX waits on the grid before (``pdl``: printed with programmatic dependent launch).
    Raises ToolchainError with Triton's message when a kernel does not compile."""
    pin_triton_defaults()
    try:
        triton = importlib.import_module("triton")
        GPUTarget = importlib.import_module("triton.backends.compiler").GPUTarget
        ASTSource = importlib.import_module("triton.compiler").ASTSource
    except Exception as exc:  # pragma: no cover - triton is a dependency on CUDA machines
        raise ToolchainError(f"triton is not importable: {exc}") from exc
    out: dict[str, dict[str, Any]] = {}
    for kname, info in module.KERNELS.items():
        fn = getattr(module, kname)
        if not hasattr(fn, "arg_names"):
            raise ToolchainError(
                f"{kname} is not a compiled @triton.jit kernel (interpreter mode?)"
            )
        sig: dict[str, str] = {}
        attrs: dict[tuple[int, ...], list[list[Any]]] = {}
        for i, arg in enumerate(fn.arg_names):
            if arg.startswith("buf"):
                sig[arg] = _TRITON_PTR[buffer_dtypes[int(arg[3:])]]
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif arg == "ws":  # fp32 workspace of split-loop kernels
                sig[arg] = "*fp32"
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif arg == "cnt":  # arrival counters of split-loop kernels
                sig[arg] = "*i32"
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                sig[arg] = "constexpr"
        stages = int(info["num_stages"])
        try:
            compiled = triton.compile(
                ASTSource(fn, sig, {"NUM_STAGES": stages}, attrs),
                target=GPUTarget("cuda", arch, 32),
                options={
                    "num_warps": int(info["num_warps"]),
                    "num_stages": stages,
                    "launch_pdl": bool(info.get("pdl", False)),
                },
            )
        except Exception as exc:
            raise ToolchainError(
                f"Triton could not compile kernel {kname} for sm_{arch}: {exc}"
            ) from exc
        out[kname] = {
            "shared": int(getattr(compiled.metadata, "shared", 0)),
            "num_stages": stages,
            "num_warps": int(info["num_warps"]),
            "target": f"sm_{arch}",
            "cubin_bytes": len(compiled.asm.get("cubin", b"")),
            "pdl": "griddepcontrol.wait" in str(compiled.asm.get("ptx", "")),
        }
    return out


# ---------------------------------------------------------------------------------------------
# CUDA C++


@dataclass(frozen=True)
class CompiledCuda:
    """A compiled CUDA C++ translation unit."""

    cubin: bytes
    ptx: str
    arch: str
    compiler: str  # "nvrtc 13.2" / "nvcc …"
    log: str = ""
    path: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _nvrtc_compile(text: str, arch: str, name: str) -> tuple[bytes, str, str]:
    nvrtc = _nvrtc_module()
    if nvrtc is None:
        raise ToolchainError("NVRTC is not importable (pip install cuda-python)")

    def check(result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise ToolchainError(f"NVRTC {what} failed: {err}")
        return result

    _, prog = check(
        nvrtc.nvrtcCreateProgram(text.encode(), f"{name}.cu".encode(), 0, [], []), "create"
    )
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device"]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        # NVRTC writes into these buffers: they must be fresh mutable objects. (`b" " * 1`
        # is CPython's shared one-byte bytes object; writing a NUL into it corrupted every
        # later b" " in the process.)
        log_b = bytearray(max(1, size))
        nvrtc.nvrtcGetProgramLog(prog, log_b)
        log = bytes(log_b).decode(errors="replace").rstrip("\x00 \n")
        if int(err) != 0:
            raise ToolchainError(f"NVRTC rejected the generated CUDA C++ ({arch}):\n{log}")
        _, psize = check(nvrtc.nvrtcGetPTXSize(prog), "PTX size")
        ptx_b = bytearray(max(1, psize))
        check(nvrtc.nvrtcGetPTX(prog, ptx_b), "PTX")
        cubin = b""
        if arch.startswith("sm_"):
            _, csize = check(nvrtc.nvrtcGetCUBINSize(prog), "CUBIN size")
            cubin_b = bytearray(max(1, csize))
            check(nvrtc.nvrtcGetCUBIN(prog, cubin_b), "CUBIN")
            cubin = bytes(cubin_b)
        return cubin, bytes(ptx_b).decode(errors="replace").rstrip("\x00"), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvcc_compile(text: str, arch: str, name: str) -> tuple[bytes, str, str]:
    nvcc = _nvcc_path()
    if nvcc is None:
        raise ToolchainError("neither NVRTC (cuda-python) nor nvcc is available")
    with tempfile.TemporaryDirectory(prefix="yirage-nvcc-") as tmp:
        src = Path(tmp, f"{name}.cu")
        src.write_text(text)
        logs = []
        outs = {}
        for kind in ("cubin", "ptx"):
            out = Path(tmp, f"{name}.{kind}")
            proc = subprocess.run(
                [nvcc, f"-arch={arch}", f"--{kind}", "-std=c++17", "-o", str(out), str(src)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            logs.append(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                raise ToolchainError(
                    f"nvcc rejected the generated CUDA C++ ({arch}):\n{proc.stderr}"
                )
            outs[kind] = out.read_bytes()
        return outs["cubin"], outs["ptx"].decode(), "\n".join(logs).strip()


def _version_tuple(text: str | None) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def compiler_order(prefer: str | None = None) -> list[str]:
    """NVRTC first, unless it is newer than the installed driver (whose loader may then
    refuse its cubins) and an nvcc the driver supports exists; ``prefer`` overrides."""
    if prefer in ("nvrtc", "nvcc"):
        return [prefer, "nvcc" if prefer == "nvrtc" else "nvrtc"]
    drv = _version_tuple(driver_version())
    nvrtc = _version_tuple(nvrtc_version())
    nvcc = _version_tuple(_nvcc_version())
    if drv and nvrtc and nvcc and nvrtc > drv >= nvcc:
        return ["nvcc", "nvrtc"]
    return ["nvrtc", "nvcc"]


def _cached_cuda(path: Path, arch: str, compiler: str) -> CompiledCuda | None:
    """The cached compilation at ``path`` (cubin, PTX and metadata, each checked against its
    checksum before the cubin can reach the driver); None when any part is missing or damaged
    (a damaged part is reported and removed)."""
    parts = (
        plugin.read_json(path.with_suffix(".json")),
        plugin.load_verified_artifact(path),
        plugin.load_verified_artifact(path.with_suffix(".ptx")),
    )
    meta, cubin, ptx = parts
    if meta is None or cubin is None or ptx is None:
        return None
    log = str(meta.get("log", ""))
    return CompiledCuda(cubin, ptx.decode(errors="replace"), arch, compiler, log, path, dict(meta))


def compile_cuda(
    text: str, arch: str = "sm_90", name: str = "yirage", prefer: str | None = None
) -> CompiledCuda:
    """Compile CUDA C++ ``text`` for ``arch`` (e.g. "sm_90"), cached on disk."""
    compilers = compiler_order(prefer)
    errors = []
    for comp in compilers:
        version = nvrtc_version() if comp == "nvrtc" else _nvcc_version()
        if version is None:
            errors.append(f"{comp}: not available")
            continue
        key = {
            "source": hashlib.sha256(text.encode()).hexdigest(),
            "compiler": f"{comp} {version}",
            "arch": arch,
        }
        path = plugin.entry_path("cuda-cubin", key, ".cubin")
        cached = _cached_cuda(path, arch, f"{comp} {version}")
        if cached is not None:
            return cached
        fn = _nvrtc_compile if comp == "nvrtc" else _nvcc_compile
        cubin, ptx, log = fn(text, arch, name)
        with plugin.locked(path):  # the metadata goes last: it commits the entry
            plugin.store_artifact(path, cubin)
            plugin.store_artifact(path.with_suffix(".ptx"), ptx.encode())
            plugin.write_json(
                path.with_suffix(".json"),
                {"log": log, "compiler": f"{comp} {version}", "arch": arch},
            )
        return CompiledCuda(cubin, ptx, arch, f"{comp} {version}", log, path, {"compiler": comp})
    raise ToolchainError("no CUDA C++ compiler: " + "; ".join(errors))
