"""Running compiled CPU programs: ctypes loading, argument checks, library kernels, timing.

A :class:`CpuLauncher` runs a printed plan: it checks the caller's tensors (numpy arrays or
torch CPU tensors, used in place without copies), allocates the outputs (torch tensors when
the inputs are torch tensors, numpy arrays otherwise) and float32 intermediates, then runs
the plan's kernels in order: generated kernels and the library kernels the printer turns into
C (elementwise, reductions, rms_norm, softmax, matmul) through their C function, the other
library kernels (concat, chunk, all_reduce) through numpy.
"""

from __future__ import annotations

import abc
import ctypes
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from yirage import plugin
from yirage.plugin import BackendError, DTypeError, ShapeError
from yirage_cpu import _threads
from yirage_cpu._codegen import CpuSource
from yirage_cpu._toolchain import CompiledLibrary

__all__ = [
    "CpuLauncher",
    "KernelLaunchError",
    "ProfileResult",
    "TensorArgumentError",
    "profile",
    "random_inputs",
    "run_library_kernel",
]

_NP_DTYPE: dict[str, np.dtype[Any]] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
}
_TORCH_DTYPE_NAME = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


class TensorArgumentError(BackendError):
    """A tensor given to a CPU kernel is on the wrong device or has an unusable layout."""


class KernelLaunchError(BackendError):
    """A generated kernel reported a failure (e.g. its scratch memory could not be allocated)."""


@dataclass(frozen=True)
class _BufSpec:
    id: int
    dims: tuple[int, ...]
    dtype: str
    role: str
    index: int


def _specs(plan: Mapping[str, Any]) -> list[_BufSpec]:
    out = []
    for b in plan["buffers"]:
        out.append(
            _BufSpec(
                int(b["id"]),
                tuple(int(d) for d in b["dims"]),
                str(b["dtype"]),
                str(b["role"]),
                int(b.get("index", -1)),
            )
        )
    return sorted(out, key=lambda s: s.id)


def _np_ptr(x: np.ndarray) -> int:
    """The data pointer of a numpy array (the buffer protocol is ~3x faster than
    ``__array_interface__``; read-only arrays take the slower route)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(x))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):
        return int(x.__array_interface__["data"][0])


#: Alignment of the buffers the runtime allocates: a full 512-bit vector, so the generated
#: kernels' vector loads never split a cache line (numpy aligns to 16 bytes only).
_ALIGN = 64


def _aligned_empty(dims: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a :data:`_ALIGN` boundary."""
    n = math.prod(dims) * dtype.itemsize
    raw = np.empty(n + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + n].view(dtype).reshape(tuple(dims))


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPE_NAME[name])


def _is_torch(x: object) -> bool:
    # never import torch just to check; while another thread imports it, it has no Tensor yet
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor is not None and not isinstance(x, np.ndarray) and isinstance(x, tensor)


def _as_numpy(x: object, spec: _BufSpec, what: str) -> tuple[np.ndarray, bool]:
    """A numpy view (no copy) of the caller's tensor after checking it against ``spec``."""
    if _is_torch(x):
        import torch

        t = cast("torch.Tensor", x)
        if t.device.type != "cpu":
            hint = (
                'backend="cuda"'
                if t.device.type == "cuda"
                else f"the backend for {t.device.type!r} tensors"
            )
            raise TensorArgumentError(
                f"{what} is a {t.device.type} tensor ({t.device}) but this kernel was built "
                "for the "
                f"CPU backend: move it with .cpu(), or superoptimize with {hint}"
            )
        if tuple(t.shape) != spec.dims:
            raise ShapeError(f"{what} has shape {tuple(t.shape)}; expected {spec.dims}")
        want = getattr(torch, _TORCH_DTYPE_NAME[spec.dtype])
        if t.dtype != want:
            raise DTypeError(
                f"{what} has dtype {t.dtype}; expected {want} (convert with .to({want}))"
            )
        if not t.is_contiguous():
            raise TensorArgumentError(f"{what} is not contiguous: pass tensor.contiguous()")
        t = t.detach()
        if spec.dtype == "bfloat16":
            return t.view(torch.int16).numpy().view(np.uint16), True
        return t.numpy(), True
    if not isinstance(x, np.ndarray):
        raise TensorArgumentError(
            f"{what} is a {type(x).__name__}; expected a numpy array or a torch CPU tensor"
        )
    if x.shape != spec.dims:
        raise ShapeError(f"{what} has shape {x.shape}; expected {spec.dims}")
    if spec.dtype == "bfloat16":
        raise DTypeError(
            f"{what}: this kernel takes bfloat16, which numpy cannot hold; "
            "pass a torch.bfloat16 tensor"
        )
    if x.dtype != _NP_DTYPE[spec.dtype]:
        raise DTypeError(
            f"{what} has dtype {x.dtype}; expected {spec.dtype} "
            f"(convert with .astype(np.{spec.dtype}))"
        )
    if not x.flags.c_contiguous:
        raise TensorArgumentError(f"{what} is not C-contiguous: pass np.ascontiguousarray(array)")
    if not x.flags.aligned:
        raise TensorArgumentError(f"{what} is not aligned: pass a copy (array.copy())")
    return x, False


# -- dtype helpers for library kernels ---------------------------------------------------------


def _read(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr if arr.dtype == np.float32 else arr.astype(np.float32)


def _write(dst: np.ndarray, value: np.ndarray, dtype: str) -> None:
    value = np.broadcast_to(value, dst.shape)
    if dtype == "bfloat16":
        dst[...] = plugin.bfloat16_bits(value)
    else:
        np.copyto(dst, value, casting="unsafe")


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 (Abramowitz & Stegun 7.1.26 refined: |error| < 1.2e-7)."""
    x64 = x.astype(np.float64)
    t = 1.0 / (1.0 + 0.5 * np.abs(x64))
    y = 1.0 - t * np.exp(
        -x64 * x64
        - 1.26551223
        + t
        * (
            1.00002368
            + t
            * (
                0.37409196
                + t
                * (
                    0.09678418
                    + t
                    * (
                        -0.18628806
                        + t
                        * (
                            0.27886807
                            + t
                            * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))
                        )
                    )
                )
            )
        )
    )
    return np.where(x64 >= 0, y, -y)


def shift_of(x: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    """The max of ``x`` over ``dims`` (keepdims), 0 where it is not finite: a library exp
    with ``shift_dims`` computes ``exp(x - shift_of(x, dims))``."""
    with np.errstate(invalid="ignore"):
        m = np.max(x, axis=tuple(int(d) for d in dims), keepdims=True)
    shift: np.ndarray = np.where(np.isfinite(m), m, np.float32(0)).astype(x.dtype)
    return shift


def _unary_np(op: str, params: Sequence[float], x: np.ndarray) -> Any:
    with np.errstate(all="ignore"):
        if op == "exp":
            return np.exp(x)
        if op == "square":
            return x * x
        if op == "sqrt":
            return np.sqrt(x)
        if op == "rsqrt":
            return 1.0 / np.sqrt(x)
        if op == "silu":
            return x / (1.0 + np.exp(-x))
        if op == "gelu":
            return (0.5 * x * (1.0 + _erf(x * 0.7071067811865476))).astype(np.float32)
        if op == "relu":
            return np.where(x < 0, np.float32(0), x)
        if op == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if op == "tanh":
            return np.tanh(x)
        if op == "neg":
            return -x
        if op == "mul_scalar":
            return x * np.float32(params[0])
        if op == "add_scalar":
            return x + np.float32(params[0])
        if op == "clamp":
            lo, hi = np.float32(params[0]), np.float32(params[1])
            return np.where(x < lo, lo, np.where(x > hi, hi, x))
    raise BackendError(f"unknown unary op {op!r} in a library kernel")


_BINARY_NP: dict[str, np.ufunc] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
}


def _all_reduce(x: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
    """The all_reduce library kernel: the sum of ``x`` over the ranks through the calling
    thread's collective (``yirage.plugin.all_reduce``: torch.distributed by default)."""
    local = np.array(x, dtype=np.float32, copy=True)  # never reduce into an input buffer
    return np.asarray(plugin.all_reduce(local, int(params.get("world_size", 1))))


def run_library_kernel(
    kernel: Mapping[str, Any], bufs: Sequence[np.ndarray], specs: Sequence[_BufSpec]
) -> None:
    """Run one library kernel of a plan on numpy buffers (indexed by buffer id)."""
    op = kernel["op"]
    params = kernel.get("params", {}) or {}
    ins = [_read(bufs[i], specs[i].dtype) for i in kernel["inputs"]]
    outs = [int(o) for o in kernel["outputs"]]
    # A float32 output of the result's shape is written in place (no temporary + copy).
    direct = bufs[outs[0]] if len(outs) == 1 and specs[outs[0]].dtype == "float32" else None
    with np.errstate(all="ignore"):
        if op == "matmul":
            if direct is not None:
                np.matmul(ins[0], ins[1], out=direct)
                return
            res = np.matmul(ins[0], ins[1])
        elif op == "unary":
            x = ins[0]
            if "shift_dims" in params:  # exp(x - m): see the plan's shift_dims
                x = x - shift_of(x, params["shift_dims"])
            res = _unary_np(str(params["op"]), [float(p) for p in params.get("params", [])], x)
        elif op == "binary":
            fn = _BINARY_NP.get(str(params["op"]))
            if fn is None:
                raise BackendError(f"unknown binary op {params['op']!r} in a library kernel")
            if direct is not None and direct.shape == np.broadcast_shapes(
                ins[0].shape, ins[1].shape
            ):
                fn(ins[0], ins[1], out=direct)
                return
            res = fn(ins[0], ins[1])
        elif op == "reduction":
            if direct is not None:
                np.sum(ins[0], axis=int(params["dim"]), keepdims=True, out=direct)
                return
            res = np.sum(ins[0], axis=int(params["dim"]), keepdims=True, dtype=np.float32)
        elif op == "rms_norm":
            n = int(params["num_normalized_dims"])
            x = ins[0]
            axes = tuple(range(x.ndim - n, x.ndim))
            ms = np.mean(np.square(x, dtype=np.float32), axis=axes, keepdims=True, dtype=np.float32)
            res = x / np.sqrt(ms + np.float32(params["eps"]))
            if params.get("has_weight"):
                res = res * ins[1]
        elif op == "softmax":
            d = int(params["dim"])
            x = ins[0]
            e = np.subtract(x, np.max(x, axis=d, keepdims=True), out=direct)
            np.exp(e, out=e)
            e /= np.sum(e, axis=d, keepdims=True)
            if direct is not None:
                return
            res = e
        elif op == "concat":
            res = np.concatenate(ins, axis=int(params["dim"]))
        elif op == "chunk":
            res = np.split(ins[0], int(params["chunks"]), axis=int(params["dim"]))[
                int(params["index"])
            ]
        elif op == "reduce_max":
            res = np.max(ins[0], axis=int(params["dim"]), keepdims=True)
        elif op == "permute":
            res = np.transpose(ins[0], [int(d) for d in params["perm"]])
        elif op == "reshape":
            res = np.reshape(ins[0], [int(d) for d in params["dims"]])
        elif op == "all_reduce":
            res = _all_reduce(ins[0], params)
        else:
            raise BackendError(f"unknown library op {op!r} in the kernel plan")
    for o in outs:
        _write(bufs[o], res, specs[o].dtype)


# -- the launcher ------------------------------------------------------------------------------


def _load_library(path: Path) -> ctypes.CDLL:
    """``dlopen`` a compiled library after checking it against its cache checksum: a
    truncated shared object would kill the process with SIGBUS inside ``dlopen``. Raises
    :class:`yirage.plugin.DamagedEntryError` (an OSError, which ``CpuBackend.load`` answers by
    compiling again) when the entry is missing or damaged; the damage is logged once."""
    if plugin.verified_path(path) is None:
        raise plugin.DamagedEntryError(
            f"the compiled library {path} is missing or damaged and was not loaded; compile "
            "the source again (CpuBackend.load does so by itself)"
        )
    return ctypes.CDLL(str(path))


class CallsRun(abc.ABC):
    """``launcher(*tensors)`` or ``launcher(inputs=[...])`` → ``launcher.run(tensors)``: the
    call convention of every cpu launcher (the C one and the ``torch_eager`` one)."""

    @abc.abstractmethod
    def run(self, tensors: Sequence[Any], outputs: Sequence[Any] | None = None) -> list[Any]:
        """Run on ``tensors`` (into ``outputs`` when given); returns the outputs."""

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        if inputs is not None:
            if tensors:
                raise TensorArgumentError(
                    "pass the inputs either positionally or as inputs=[...], not both"
                )
            tensors = tuple(inputs)
        return self.run(tensors)


class CpuLauncher(CallsRun):
    """A loaded CPU program: call it with the graph's inputs, get the list of outputs."""

    backend = "cpu"

    def __init__(self, program: CpuSource, library: CompiledLibrary) -> None:
        self.program = program
        self.library = library
        #: How idle OpenMP threads wait (chosen before the first library is loaded).
        self.wait_policy = _threads.configure_openmp()
        #: How many threads each call runs on (:mod:`yirage_cpu._threads`).
        self.thread_policy = _threads.policy()
        self._dll = _load_library(library.path)
        self._fns: dict[str, Any] = {}
        for sym in program.symbols:
            fn = getattr(self._dll, sym)
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int
            self._fns[sym] = fn
        half_path = self._dll.yr_half_path
        half_path.restype = ctypes.c_char_p
        #: The float16 conversion path the compile took (avx512f, f16c, neon, portable).
        self.float16_path = (half_path() or b"").decode("ascii")
        mm_path = self._dll.yr_matmul_half_path
        mm_path.restype = ctypes.c_char_p
        #: How matmuls multiply 16-bit B tiles ("bfloat16 avx2, float16 f16c"; bfloat16
        #: "avx512_bf16": dot products where A is bfloat16 too).
        self.matmul_half_path = (mm_path() or b"").decode("ascii")
        self._nt = ctypes.c_int.in_dll(self._dll, "yr_nt")
        self._nt.value = self.thread_policy.current()
        #: The most threads a call uses.
        self.num_threads = self.thread_policy.max_threads
        self._specs = _specs(program.plan)
        self._inputs = sorted((s for s in self._specs if s.role == "input"), key=lambda s: s.index)
        self._outputs = sorted(
            (s for s in self._specs if s.role == "output"), key=lambda s: s.index
        )
        self._intermediates = [s for s in self._specs if s.role == "intermediate"]
        if [s.index for s in self._inputs] != list(range(len(self._inputs))):
            raise BackendError("kernel plan: input buffers must have indices 0..n-1")
        if [s.index for s in self._outputs] != list(range(len(self._outputs))):
            raise BackendError("kernel plan: output buffers must have indices 0..n-1")
        kernels = program.plan["kernels"]
        self._steps: list[tuple[str, Any]] = []
        for step in program.steps:
            if step.kind == "generated":
                self._steps.append(
                    (
                        "generated",
                        (
                            self._fns[str(step.symbol)],
                            kernels[step.index].get("name", step.symbol),
                        ),
                    )
                )
            else:
                self._steps.append(("library", kernels[step.index]))
        self._local = threading.local()
        self._needs_views = any(kind == "library" for kind, _ in self._steps)

    @property
    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [(s.dims, s.dtype) for s in self._inputs]

    @property
    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [(s.dims, s.dtype) for s in self._outputs]

    def _scratch(self) -> tuple[list[np.ndarray | None], Any]:
        """Per-thread intermediates and pointer array (reused across calls of one thread)."""
        st = getattr(self._local, "state", None)
        if st is None:
            bufs: list[np.ndarray | None] = [None] * len(self._specs)
            ptrs = (ctypes.c_void_p * max(1, len(self._specs)))()
            for s in self._intermediates:
                arr = _aligned_empty(s.dims, np.dtype(np.float32))
                bufs[s.id] = arr
                ptrs[s.id] = _np_ptr(arr)
            st = (bufs, ptrs)
            self._local.state = st
        return st

    def run(self, tensors: Sequence[Any], outputs: Sequence[Any] | None = None) -> list[Any]:
        n = len(self._inputs)
        if len(tensors) != n:
            raise ShapeError(
                f"this kernel takes {n} inputs with dims {[s.dims for s in self._inputs]}, "
                f"got {len(tensors)}"
            )
        bufs_t, ptrs = self._scratch()
        need_views = self._needs_views
        bufs = list(bufs_t) if need_views else bufs_t
        any_torch = False
        for s, x in zip(self._inputs, tensors, strict=True):
            ptr, view, is_t = self._arg(x, s, f"input {s.index}", need_views)
            any_torch |= is_t
            ptrs[s.id] = ptr
            if need_views:
                bufs[s.id] = view
        results: list[Any] = []
        if outputs is not None:
            if len(outputs) != len(self._outputs):
                raise ShapeError(
                    f"this kernel has {len(self._outputs)} outputs, "
                    f"got {len(outputs)} output tensors"
                )
            for s, y in zip(self._outputs, outputs, strict=True):
                ptr, view, _ = self._arg(y, s, f"output {s.index}", need_views)
                ptrs[s.id] = ptr
                if need_views:
                    bufs[s.id] = view
                results.append(y)
        elif any_torch:
            import torch

            for s in self._outputs:
                t = torch.empty(s.dims, dtype=getattr(torch, _TORCH_DTYPE_NAME[s.dtype]))
                results.append(t)
                ptrs[s.id] = t.data_ptr()
                if need_views:
                    bufs[s.id] = (
                        t.view(torch.int16).numpy().view(np.uint16)
                        if s.dtype == "bfloat16"
                        else t.numpy()
                    )
        else:
            for s in self._outputs:
                arr = _aligned_empty(s.dims, _NP_DTYPE[s.dtype])
                results.append(arr)
                ptrs[s.id] = _np_ptr(arr)
                if need_views:
                    bufs[s.id] = arr
        nt = self.thread_policy.current()
        if nt != self._nt.value:
            self._nt.value = nt
        for kind, payload in self._steps:
            if kind == "generated":
                fn, name = payload
                rc = fn(ptrs)
                if rc != 0:
                    raise KernelLaunchError(
                        f"generated kernel {name!r} failed (status {rc}): its per-thread scratch "
                        "memory could not be allocated"
                    )
            else:
                run_library_kernel(payload, bufs, self._specs)  # type: ignore[arg-type]
        return results

    @staticmethod
    def _arg(x: Any, spec: _BufSpec, what: str, need_view: bool) -> tuple[int, Any, bool]:
        """(data pointer, numpy view or None, is a torch tensor) after checking ``x``."""
        if type(x) is np.ndarray:
            if (
                x.shape == spec.dims
                and x.dtype == _NP_DTYPE[spec.dtype]
                and spec.dtype != "bfloat16"
                and x.flags.c_contiguous
                and x.flags.aligned
            ):
                return _np_ptr(x), x, False
        elif not need_view and _is_torch(x):
            # fast path: checks and the raw pointer, no numpy view
            if (
                x.device.type == "cpu"
                and x.shape == spec.dims
                and x.dtype is _torch_dtype(spec.dtype)
                and x.is_contiguous()
            ):
                return x.data_ptr(), None, True
        view, is_t = _as_numpy(x, spec, what)  # the slow path raises the precise error
        return _np_ptr(view), view, is_t


# -- inputs and timing -------------------------------------------------------------------------


def random_inputs(
    specs: Sequence[tuple[Sequence[int], str]], *, seed: int = 0, torch_tensors: bool = False
) -> list[Any]:
    """Fresh standard-normal inputs of the given (dims, dtype) (float32 for computing, then
    converted); torch tensors when ``torch_tensors`` (required for bfloat16). numpy arrays
    are 64-byte aligned like torch's CPU tensors, so profiling measures kernels on the
    layout models pass them."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for dims, dtype in specs:
        x = rng.standard_normal(tuple(dims), dtype=np.float32)
        if torch_tensors or dtype == "bfloat16":
            import torch

            t = torch.from_numpy(x).to(getattr(torch, _TORCH_DTYPE_NAME[dtype]), copy=True)
            out.append(t)
        else:
            a = _aligned_empty(tuple(dims), _NP_DTYPE[dtype])
            a[...] = x
            out.append(a)
    return out


@dataclass(frozen=True)
class ProfileResult:
    """Median/min/mean of ``repeats`` timed calls, in microseconds (after ``warmup`` calls)."""

    median_us: float
    min_us: float
    mean_us: float
    repeats: int
    warmup: int

    def to_dict(self) -> dict[str, float | int]:
        return {
            "median_us": self.median_us,
            "min_us": self.min_us,
            "mean_us": self.mean_us,
            "repeats": self.repeats,
            "warmup": self.warmup,
        }


def profile(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    warmup: int = 3,
    min_repeats: int = 30,
    min_time_s: float = 0.2,
    max_time_s: float = 5.0,
    max_repeats: int = 100_000,
    **_other: Any,
) -> ProfileResult:
    """Time ``fn(*inputs)``: ``warmup`` calls (at least 10 ms), then repeats until both
    ``min_repeats`` calls and ``min_time_s`` have passed (bounded by ``max_time_s``);
    per-call times from ``time.perf_counter_ns``. Options meant for other backends' profilers
    are accepted and ignored."""
    t_start = time.perf_counter()
    done = 0
    while done < warmup or (time.perf_counter() - t_start < 0.01 and done < 1000):
        fn(*inputs)
        done += 1
    times: list[int] = []
    t0 = time.perf_counter()
    while len(times) < max_repeats:
        a = time.perf_counter_ns()
        fn(*inputs)
        times.append(time.perf_counter_ns() - a)
        elapsed = time.perf_counter() - t0
        if (len(times) >= min_repeats and elapsed >= min_time_s) or elapsed >= max_time_s:
            break
    arr = np.sort(np.asarray(times, dtype=np.float64)) / 1000.0
    median = float(np.median(arr))
    return ProfileResult(
        median_us=median,
        min_us=float(arr[0]),
        mean_us=float(arr.mean()) if math.isfinite(float(arr.mean())) else median,
        repeats=len(times),
        warmup=done,
    )
