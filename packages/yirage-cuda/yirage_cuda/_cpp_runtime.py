"""CUDA C++ kernels through the driver API (libcuda via ctypes: no SDK import needed)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from yirage.plan import Plan
from yirage.plugin import BackendError
from yirage_triton import Launcher

__all__ = ["CudaCppLauncher"]


def _torch() -> Any:
    import torch

    return torch


_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


#: CUresults of a faulted kernel, after which the context is unusable (illegal address,
#: hardware stack error, illegal instruction, misaligned address, invalid address space,
#: invalid PC, launch failed).
_STICKY = frozenset((700, 714, 715, 716, 717, 718, 719))
#: CUresults of a module image the driver cannot load (invalid image, no binary for the GPU,
#: invalid PTX, JIT compiler not found, unsupported PTX version).
_IMAGE = frozenset((200, 209, 218, 221, 222))


class _Driver:
    _lock = threading.Lock()
    _lib: Any = None

    @classmethod
    def lib(cls) -> Any:
        with cls._lock:
            if cls._lib is None:
                try:
                    lib = ctypes.CDLL("libcuda.so.1")
                except OSError as exc:
                    raise BackendError(
                        f"libcuda.so.1 (the CUDA driver) cannot be loaded: {exc}"
                    ) from exc
                cls.check(lib.cuInit(0), "cuInit")
                cls._lib = lib
            return cls._lib

    @classmethod
    def check(cls, code: int, what: str) -> None:
        if code == 0:
            return
        name = ""
        if cls._lib is not None:
            text = ctypes.c_char_p()
            if cls._lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
                name = f" ({text.value.decode()})"
        hint = ""
        if code in _STICKY:
            hint = (
                "; a kernel faulted earlier in this process (CUDA errors of this kind are "
                "sticky: every later CUDA call fails too), so the process must be restarted"
            )
        elif what.startswith("cuModuleLoadData") and code in _IMAGE:
            hint = (
                "; the cubin may come from a CUDA compiler newer than the driver "
                "(compare toolchain_versions()['nvrtc'/'nvcc'] with ['driver'])"
            )
        raise BackendError(f"CUDA driver call {what} failed with CUresult {code}{name}{hint}")


class CudaCppLauncher(Launcher):
    """Runs the CUDA C++ kernels of a plan: cubin loaded with cuModuleLoadData into the
    device's primary context (the one torch uses), launched with cuLaunchKernel on torch's
    current stream. The host module's ``launch`` calls :meth:`launch_kernel`."""

    language = "cuda"

    def __init__(
        self, plan: Plan, source: str, module: ModuleType, cubin: bytes, kernels: dict[str, Any]
    ) -> None:
        super().__init__(plan, source, module)
        self.cubin = cubin
        self.kernels = kernels  # name -> {"smem": bytes, "threads": n}
        self._functions: dict[tuple[int, str], Any] = {}
        self._modules: dict[int, Any] = {}
        self._contexts: dict[int, int] = {}  # device -> its primary context
        module.__dict__["_yr_launch"] = self.launch_kernel

    def _function(self, device_index: int, name: str) -> Any:
        key = (device_index, name)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        torch = _torch()
        lib = _Driver.lib()
        torch.cuda.init()
        with torch.cuda.device(device_index):
            torch.cuda.current_stream()  # makes the primary context current on this thread
            ctx = ctypes.c_void_p()
            _Driver.check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
            if not ctx.value:
                dev = ctypes.c_int()
                _Driver.check(lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
                _Driver.check(
                    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain"
                )
                _Driver.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            self._contexts[device_index] = ctx.value or 0
            mod = self._modules.get(device_index)
            if mod is None:
                mod = ctypes.c_void_p()
                _Driver.check(
                    lib.cuModuleLoadData(ctypes.byref(mod), self.cubin), "cuModuleLoadData"
                )
                self._modules[device_index] = mod
            fn = ctypes.c_void_p()
            _Driver.check(
                lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()),
                f"cuModuleGetFunction({name})",
            )
            smem = int(self.kernels[name]["smem"])
            if smem > 48 * 1024:
                _Driver.check(
                    lib.cuFuncSetAttribute(
                        fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
                    ),
                    f"cuFuncSetAttribute({name}, {smem} B dynamic shared memory)",
                )
        self._functions[key] = fn
        return fn

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        # The printed kernels use 16-byte vector loads: copy the (rare) misaligned input view
        # instead of faulting (a misaligned access would poison the CUDA context).
        aligned = [t if t.data_ptr() % 16 == 0 else t.clone() for t in inputs]
        return super().run_unchecked(aligned)

    def launch_kernel(self, name: str, grid: tuple[int, int, int], *tensors: Any) -> None:
        torch = _torch()
        dev = tensors[0].device
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        fn = self._function(index, name)
        info = self.kernels[name]
        ptrs = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
        params = (ctypes.c_void_p * len(ptrs))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs]
        )
        stream = ctypes.c_void_p(torch.cuda.current_stream(dev).cuda_stream)
        lib = _Driver.lib()
        # the driver launches into the calling thread's current context, which a thread that
        # made no CUDA runtime call yet (a rank thread of run_ranks, a pool thread) lacks
        current = ctypes.c_void_p()
        _Driver.check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value != self._contexts[index]:
            _Driver.check(
                lib.cuCtxSetCurrent(ctypes.c_void_p(self._contexts[index])), "cuCtxSetCurrent"
            )
        _Driver.check(
            lib.cuLaunchKernel(
                fn,
                ctypes.c_uint(grid[0]),
                ctypes.c_uint(grid[1]),
                ctypes.c_uint(grid[2]),
                ctypes.c_uint(int(info["threads"])),
                ctypes.c_uint(1),
                ctypes.c_uint(1),
                ctypes.c_uint(int(info["smem"])),
                stream,
                params,
                None,
            ),
            f"cuLaunchKernel({name})",
        )
