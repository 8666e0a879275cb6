"""CUDA toolchain wrapper: versions, device properties, compiling and caching CUDA C++.

CUDA C++ is compiled to a cubin (and PTX) with NVRTC through ``cuda.bindings.nvrtc`` when
importable, else ``nvcc`` from PATH/CUDA_HOME; cached as ``cuda-cubin`` entries keyed by
{source hash, compiler + version, arch}, stored with their checksum
(``yirage.plugin.store_artifact``) and verified before use: a damaged cubin or PTX is
reported once and written again. Triton's side (printed modules, the interpreter,
ahead-of-time compiles) lives in yirage-triton.

Nothing here imports torch/triton/cuda-python at module import time.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yirage import plugin
from yirage_triton import ToolchainError, dist_version

__all__ = [
    "CompiledCuda",
    "DeviceInfo",
    "ToolchainError",
    "compile_cuda",
    "device_info",
    "nvrtc_available",
    "toolchain_versions",
]


# ---------------------------------------------------------------------------------------------
# versions


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
        v = dist_version(dist)
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
