"""Host emulation of the printed CUDA C++ (for tests on machines without a GPU).

The C++ printer emits every block as a sequence of data-parallel steps separated by
barriers, so running each step over all of its elements on one host thread, block after
block, computes what the GPU computes. ``#if defined(__CUDACC__)`` keeps the GPU-only
pieces (thread indices, warp shuffles, the ``mma.sync`` fragments) out of the host build;
the host branch multiplies the same staged MMA operand tiles with scalar code. Shared memory
is filled with 0xFF (NaN) before every block, so reading a slot before it is written — or a
slot the allocator let another value overwrite — shows up as NaN.

What this does not check: the ``mma.sync`` fragment layout and the warp-level code (only
the GPU runs those).
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from yirage import plugin
from yirage_cuda._cuda_codegen import CudaCppSource
from yirage_triton import Launcher, ToolchainError

__all__ = ["EmulatedCudaCpp", "host_compiler"]


def host_compiler() -> str | None:
    for cxx in ("g++", "c++", "clang++"):
        path = shutil.which(cxx)
        if path:
            return path
    return None


class EmulatedCudaCpp:
    """Build the host branch of a printed CUDA C++ source and run its kernels on CPU tensors."""

    def __init__(self, src: CudaCppSource) -> None:
        self.src = src
        cxx = host_compiler()
        if cxx is None:
            raise ToolchainError("no host C++ compiler (g++/c++/clang++) to emulate CUDA C++ with")
        key = {
            "source": hashlib.sha256(src.text.encode()).hexdigest(),
            "cxx": cxx,
            "kind": "emulation",
        }
        path = plugin.entry_path("cuda-emulation", key, ".so")
        with plugin.locked(path):
            if plugin.verified_path(path) is None:  # never dlopen a damaged library
                with tempfile.TemporaryDirectory(prefix="yirage-cuda-emu-") as tmp:
                    cpp = Path(tmp, "k.cpp")
                    cpp.write_text(src.text)
                    out = Path(tmp, "k.so")
                    proc = subprocess.run(
                        [
                            cxx,
                            "-std=c++17",
                            "-O1",
                            "-shared",
                            "-fPIC",
                            "-fno-strict-aliasing",
                            "-w",
                            "-o",
                            str(out),
                            str(cpp),
                        ],
                        capture_output=True,
                        text=True,
                        timeout=300,
                        check=False,
                    )
                    if proc.returncode != 0:
                        raise ToolchainError(
                            f"host build of the CUDA C++ emulation failed:\n{proc.stderr}"
                        )
                    plugin.store_artifact(path, out.read_bytes())
        self.lib = ctypes.CDLL(str(path))

    def launch_kernel(self, name: str, grid: tuple[int, int, int], *tensors: Any) -> None:
        import numpy as np

        fn = getattr(self.lib, name)
        info = self.src.kernels[name]
        nbytes = int(info["smem"]) + 64
        raw = np.empty(nbytes, dtype=np.uint8)
        pad = (-raw.ctypes.data) % 16
        smem = raw[pad:]
        ptrs = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
        for bz in range(grid[2]):
            for by in range(grid[1]):
                for bx in range(grid[0]):
                    smem.fill(0xFF)
                    fn(
                        *ptrs,
                        ctypes.c_int(bx),
                        ctypes.c_int(by),
                        ctypes.c_int(bz),
                        ctypes.c_void_p(smem.ctypes.data),
                    )

    def launcher(self) -> Launcher:
        import types

        mod = types.ModuleType(f"yirage_cuda_emu_{self.src.digest[:16]}")
        exec(
            compile(self.src.host, f"<yirage-cuda emulated host {self.src.digest[:16]}>", "exec"),
            mod.__dict__,
        )
        mod.__dict__["_yr_launch"] = self.launch_kernel
        launcher = Launcher(self.src.plan, self.src.text, mod, interpret=True)
        launcher.language = "cuda (host emulation)"
        return launcher
