"""The emulator of printed MSL (test infrastructure: no Mac is needed).

The printed source is compiled, unchanged, as C++20 with the host compiler against the shim
header ``_shim/metal_stdlib`` (address spaces, kernel attributes, ``half``/``bfloat``,
threadgroup memory, ``threadgroup_barrier``, ``simd_sum``/``simd_max``,
``simdgroup_float8x8``); a generated wrapper adds one ``extern "C"`` launcher per kernel. Each
threadgroup's threads run as real threads that meet at the barriers, with the SIMD-groups of a
threadgroup split into two halves that run one after the other between barriers (the order
alternating): a legal Metal schedule under which a missing barrier makes a read precede its
write, and threadgroup memory is NaN before every threadgroup, so the read shows up as NaN.
Compiled libraries are cached by the hash of source, shim and compiler
(:func:`yirage.plugin.entry_path`).

What this does not check: that Metal compiles the source, Metal's rounding of ``exp`` and
fast math, the hardware's distribution of ``simdgroup_matrix`` elements over lanes.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from yirage import plugin
from yirage_mps._host import run_plan
from yirage_mps._msl_codegen import MslSource

__all__ = ["EmulatedMsl", "EmulatorError", "host_compiler", "shim_dir"]


class EmulatorError(plugin.BackendError):
    """The emulator could not build or run a printed kernel."""


def host_compiler() -> str | None:
    """A C++20 host compiler (g++ or clang++), or None."""
    for cxx in ("g++", "clang++", "c++"):
        path = shutil.which(cxx)
        if path:
            return path
    return None


def shim_dir() -> Path:
    """The folder holding the ``metal_stdlib`` shim header."""
    return Path(__file__).with_name("_shim")


def _wrapper(src: MslSource) -> str:
    lines = ['#include "kernels.metal"', ""]
    for name in src.kernels:
        lines += [
            f'extern "C" int yr_launch_{name}(void** bufs, int gx, int gy, int gz, int threads, '
            "unsigned long memory) {",
            f"  return yr_emu::launch({name}, bufs, gx, gy, gz, threads, memory);",
            "}",
        ]
    return "\n".join(lines) + "\n"


#: Flags of every emulator build (a precompiled shim is used only with the same flags).
_FLAGS = ("-std=c++20", "-O1", "-fPIC", "-pthread", "-w")


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def precompiled_shim(cxx: str) -> Path:
    """A cached folder with the shim and, for g++, its precompiled header (the shim's standard
    headers dominate a kernel's build; a compiler that cannot use it reads the header)."""
    shim = (shim_dir() / "metal_stdlib").read_bytes()
    key = {"shim": hashlib.sha256(shim).hexdigest(), "cxx": cxx, "flags": " ".join(_FLAGS)}
    folder = plugin.entry_path("mps-emulation", key, ".shim")
    with plugin.locked(folder):
        header = folder / "metal_stdlib"
        if not header.is_file() or header.read_bytes() != shim:
            folder.mkdir(parents=True, exist_ok=True)
            staged = folder / "staged.h"
            staged.write_bytes(shim)
            if "g++" in Path(cxx).name:  # the header is renamed into place last
                gch = folder / "metal_stdlib.gch.tmp"
                if _run([cxx, *_FLAGS, "-x", "c++-header", str(staged), "-o", str(gch)]).returncode:
                    gch.unlink(missing_ok=True)
                else:
                    gch.replace(folder / "metal_stdlib.gch")
            staged.replace(header)
    return folder


def _build(src: MslSource, cxx: str, out: Path) -> None:
    include = precompiled_shim(cxx)
    with tempfile.TemporaryDirectory(prefix="yirage-mps-emu-") as tmp:
        Path(tmp, "kernels.metal").write_text(src.text)
        wrapper = Path(tmp, "wrapper.cpp")
        wrapper.write_text(_wrapper(src))
        lib = Path(tmp, "k.so")
        cmd = [cxx, *_FLAGS, "-shared", "-I", str(include), "-I", tmp, "-o", str(lib)]
        proc = _run([*cmd, str(wrapper)])
        if proc.returncode != 0:
            raise EmulatorError(
                f"the printed MSL does not compile as C++ against the emulator's shim:\n"
                f"{proc.stderr[-4000:]}"
            )
        out.write_bytes(lib.read_bytes())


class EmulatedMsl:
    """A printed MSL source built for the emulator; :meth:`launcher` runs its plan on CPU
    tensors (library kernels through torch, generated kernels in the emulator)."""

    def __init__(self, src: MslSource) -> None:
        self.src = src
        cxx = host_compiler()
        if cxx is None:
            raise EmulatorError("no host C++ compiler (g++ or clang++) to emulate MSL with")
        shim = (shim_dir() / "metal_stdlib").read_bytes()
        key = {
            "source": hashlib.sha256(src.text.encode()).hexdigest(),
            "shim": hashlib.sha256(shim).hexdigest(),
            "cxx": cxx,
            "kind": "msl-emulation",
        }
        path = plugin.entry_path("mps-emulation", key, ".so")
        with plugin.locked(path):
            if plugin.verified_path(path) is None:  # never dlopen a damaged library
                with tempfile.TemporaryDirectory(prefix="yirage-mps-lib-") as tmp:
                    built = Path(tmp, "k.so")
                    _build(src, cxx, built)
                    plugin.store_artifact(path, built.read_bytes())
        self.lib = ctypes.CDLL(str(path))

    def launch_kernel(self, name: str, grid: Sequence[int], tensors: Sequence[Any]) -> None:
        """Run kernel ``name`` over ``grid`` on contiguous CPU tensors (its buffers in
        :attr:`MslSource.params` order)."""
        info = self.src.kernels[name]
        fn = getattr(self.lib, f"yr_launch_{name}")
        fn.restype = ctypes.c_int
        ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
        rc = fn(
            ptrs,
            ctypes.c_int(grid[0]),
            ctypes.c_int(grid[1]),
            ctypes.c_int(grid[2]),
            ctypes.c_int(int(info["threads"])),
            ctypes.c_ulong(max(16, int(info["smem"]))),
        )
        if rc != 0:
            raise EmulatorError(
                f"kernel {name!r} failed in the emulator (code {rc}: -1 deadlock at a barrier or "
                "threadgroup memory overrun, -2 a thread count not a multiple of 32)"
            )

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """The plan's outputs for CPU tensors ``inputs``."""
        return run_plan(self.src.plan, inputs, self.src.params, self.launch_kernel)
