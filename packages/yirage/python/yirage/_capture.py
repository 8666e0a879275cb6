"""Device-graph capture of a kernel call (private; the public entry point is
:meth:`yirage.OptimizedKernel.capture`).

A kernel call on a GPU costs host time per launch (Python, argument checks, each generated
kernel's and each library call's launch) on top of the device time. Captured once into a
device graph (``torch.cuda.CUDAGraph``; ``torch.npu`` where that backend has one), a call
replays every launch of the plan, collectives included (NCCL all_reduce can be captured once
its communicator exists), with one host call.

The graph reads its inputs from, and writes its outputs to, fixed addresses: the captured
call's tensors. Calling the captured kernel with other tensors copies them into those
inputs first; the outputs it returns are the same tensors at every replay, overwritten by the
next one (``torch.cuda.graphs`` has the same contract): clone what must outlive a replay.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from yirage import _collectives
from yirage._errors import BackendError, ShapeError
from yirage._logging import get_logger

__all__ = ["CapturedKernel", "RepeatGraphs", "capture"]

_log = get_logger("yirage.kernel")

#: Calls run on a side stream before capture: they compile what is left to compile and make
#: collectives create their communicators, neither of which can happen inside a capture.
WARMUP_CALLS = 3


def _graph_api(device_type: str | None, backend: str) -> tuple[Any, Any]:
    """torch's namespace with graph capture for ``device_type`` (``torch.cuda`` …) and its
    graph type."""
    if device_type is None:
        raise BackendError(
            f"the {backend} backend runs on host arrays, which have no device graphs: "
            "capture() needs a GPU backend (backend='cuda' or 'rocm'); call the kernel directly"
        )
    import torch

    api = getattr(torch, device_type, None)
    graph_type = getattr(api, "CUDAGraph", None) or getattr(api, "NPUGraph", None)
    if api is None or graph_type is None:
        raise BackendError(
            f"torch.{device_type} has no graph capture, so the {backend} backend's kernels "
            "cannot be captured: call the kernel directly"
        )
    return api, graph_type


class CapturedKernel:
    """A kernel call captured into a device graph: ``captured()`` replays it on the captured
    inputs, ``captured(*tensors)`` copies ``tensors`` into them first (same shapes and dtypes
    as at capture); both return the captured outputs (overwritten by the next replay)."""

    def __init__(self, api: Any, graph: Any, inputs: list[Any], outputs: list[Any]) -> None:
        self._api = api
        self._graph = graph
        self.inputs = inputs
        self.outputs = outputs

    def __call__(self, *tensors: Any) -> list[Any]:
        if self._graph is None:
            raise BackendError("this captured kernel was released: capture the kernel again")
        if tensors:
            self._load(tensors)
        self._graph.replay()
        return self.outputs

    def release(self) -> None:
        """Free the graph and its memory now (before ``torch.distributed.
        destroy_process_group()`` when it holds a captured all_reduce: while such a graph
        lives, destroying the group waits for it)."""
        self._graph = None
        self.outputs = []

    def _load(self, tensors: Sequence[Any]) -> None:
        if len(tensors) != len(self.inputs):
            raise ShapeError(
                f"the captured kernel takes {len(self.inputs)} inputs (or none, to replay on "
                f"the captured ones), got {len(tensors)}"
            )
        for i, (new, static) in enumerate(zip(tensors, self.inputs, strict=True)):
            if new is static:
                continue
            if tuple(new.shape) != tuple(static.shape) or new.dtype != static.dtype:
                raise ShapeError(
                    f"input {i} is {tuple(new.shape)} {new.dtype}; the kernel was captured for "
                    f"{tuple(static.shape)} {static.dtype}: capture it again for these inputs"
                )
            static.copy_(new)

    def __repr__(self) -> str:
        return f"<CapturedKernel: {len(self.inputs)} inputs, {len(self.outputs)} outputs>"


def capture(
    call: Callable[..., list[Any]], inputs: Sequence[Any], device_type: str | None, backend: str
) -> CapturedKernel:
    """Capture ``call(*inputs)`` (a kernel call on ``backend``'s ``device_type`` tensors)."""
    api, graph_type = _graph_api(device_type, backend)
    ins = list(inputs)
    devices = {str(t.device) for t in ins if hasattr(t, "device")}
    if len(devices) != 1 or len(ins) != sum(hasattr(t, "device") for t in ins):
        raise BackendError(
            f"capture() takes the kernel's inputs as {device_type} tensors on one device, got "
            f"{sorted(devices) or [type(t).__name__ for t in ins]}"
        )
    dev = ins[0].device
    side = api.Stream(dev)
    side.wait_stream(api.current_stream(dev))
    with api.stream(side):
        for _ in range(WARMUP_CALLS):
            call(*ins)
    api.current_stream(dev).wait_stream(side)
    api.synchronize(dev)
    g = graph_type()
    with api.graph(g):
        outputs = list(call(*ins))
    api.synchronize(dev)
    return CapturedKernel(api, g, ins, outputs)


# -- graphs of repeated calls ----------------------------------------------------------------------

#: Device graphs kept per kernel (one per set of input addresses and stream, least recently
#: used dropped first: each holds its intermediates' memory).
MAX_GRAPHS = 4


#: Input sets seen once that are remembered (a call on one of them again is captured).
MAX_SEEN = 64


def _call_key(tensors: Sequence[Any]) -> tuple[Any, ...] | None:
    """What a captured graph depends on: every input's address, shape, strides, dtype and
    device, and the current stream; None where an input is not a device tensor."""
    import torch

    key: list[Any] = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
            return None
        key.append((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device))
    if not key:
        return None
    device = key[0][4]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) if device.type == "cuda" else None
    if raw is not None and device.index is not None:
        key.append(raw(device.index))  # the stream's handle, without a Stream object
    else:
        key.append(getattr(torch, device.type).current_stream(device).cuda_stream)
    return tuple(key)


class _Segments:
    """A call captured as device graphs split at its all_reduce collectives: replaying it
    replays each graph and runs each collective from the host in between, in place on the
    buffer the captured code handed it (NCCL work is never captured: a graph holding it makes
    ``torch.distributed.destroy_process_group()`` wait while the graph lives)."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []
        self.reductions: list[tuple[Any, int]] = []
        self.outputs: list[Any] = []

    def __call__(self) -> list[Any]:
        for i, g in enumerate(self.graphs):
            g.replay()
            if i < len(self.reductions):
                buffer, world_size = self.reductions[i]
                summed = _collectives.all_reduce(buffer, world_size)
                if summed is not buffer:  # the next graph reads the buffer
                    buffer[...] = summed
        return self.outputs


class _SegmentBoundary:
    """The collective bound while a multi-device call is captured: each all_reduce ends
    the graph being captured, is remembered with its buffer, and starts the next graph."""

    def __init__(self, world_size: int, capture: _SegmentCapture) -> None:
        self.world_size = world_size
        self.rank = -1
        self._capture = capture

    def all_reduce(self, x: Any) -> Any:
        self._capture.cut(x, self.world_size)
        return x  # summed in place at replay, before the next graph reads it


class _SegmentCapture:
    """Captures one call into :class:`_Segments` (graphs sharing one memory pool, replayed
    in capture order as torch requires)."""

    def __init__(self, api: Any, graph_type: Any) -> None:
        self.api = api
        self.graph_type = graph_type
        self.pool = api.graph_pool_handle()
        self.segments = _Segments()
        self._open: Any = None

    def begin(self) -> None:
        g = self.graph_type()
        g.capture_begin(pool=self.pool)
        self._open = g

    def end(self) -> None:
        g, self._open = self._open, None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a segment may be empty (nothing after a collective)
            g.capture_end()
        self.segments.graphs.append(g)

    def cut(self, buffer: Any, world_size: int) -> None:
        self.end()
        self.segments.reductions.append((buffer, world_size))
        self.begin()

    def abandon(self) -> None:
        """End a capture left open by a failure (its graph is dropped)."""
        if self._open is not None:
            with contextlib.suppress(Exception):
                self._open.capture_end()
            self._open = None


def capture_segments(
    call: Callable[..., list[Any]],
    tensors: Sequence[Any],
    device_type: str,
    backend: str,
    world_size: int,
) -> _Segments:
    """``call(*tensors)`` captured as :class:`_Segments` (one graph when ``world_size`` is
    1). Collectives must have run eagerly before (their communicators exist)."""
    api, graph_type = _graph_api(device_type, backend)
    dev = tensors[0].device
    cap = _SegmentCapture(api, graph_type)
    side = api.Stream(dev)
    side.wait_stream(api.current_stream(dev))
    api.synchronize(dev)
    try:
        with api.stream(side), _collectives.bound(_SegmentBoundary(world_size, cap)):
            cap.begin()
            outputs = list(call(*tensors))
            cap.end()
    except BaseException:
        cap.abandon()
        raise
    api.current_stream(dev).wait_stream(side)
    cap.segments.outputs = outputs
    return cap.segments


class RepeatGraphs:
    """Device graphs of a kernel's repeated calls: the second call on the same input
    tensors (same addresses, shapes, strides, dtypes and stream) runs eagerly and is captured;
    later ones replay the capture and return fresh copies of its outputs, so a call costs one
    graph launch per collective-free part, the collectives and one copy per output on the
    host (see :class:`_Segments`). Calls inside another capture, calls whose collective is
    not ``torch.distributed`` and CPU tensors run eagerly. A capture that fails turns the
    graphs off for this kernel (logged once)."""

    def __init__(
        self, call: Callable[..., list[Any]], device_type: str, backend: str, world_size: int
    ) -> None:
        self._call = call
        self._device_type = device_type
        self._backend = backend
        self._world_size = world_size
        self._graphs: dict[tuple[Any, ...], _Segments] = {}
        self._seen: dict[tuple[Any, ...], None] = {}  # seen once, oldest first
        self._lock = threading.Lock()
        self.enabled = True
        self.failure: str | None = None

    def __call__(self, tensors: Sequence[Any]) -> list[Any]:
        key = self._key(tensors)
        if key is None:
            return list(self._call(*tensors))
        with self._lock:
            graph = self._graphs.pop(key, None)
            if graph is not None:
                self._graphs[key] = graph  # most recently used last
                return [o.clone() for o in graph()]
            if key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > MAX_SEEN:  # inputs at new addresses every call
                    del self._seen[next(iter(self._seen))]
                return list(self._call(*tensors))
            outputs = list(self._call(*tensors))  # this call's result, then the capture
            self._capture(key, tensors)
            return outputs

    def _key(self, tensors: Sequence[Any]) -> tuple[Any, ...] | None:
        if not self.enabled or _collectives.current() is not None:
            return None  # a simulated or stand-in collective cannot be captured
        import torch

        api = getattr(torch, self._device_type, None)
        capturing = getattr(api, "is_current_stream_capturing", None)
        if capturing is None or capturing():
            return None  # inside the caller's own capture: its graph takes the launches
        return _call_key(tensors)

    def _capture(self, key: tuple[Any, ...], tensors: Sequence[Any]) -> None:
        try:
            segments = capture_segments(
                self._call, tensors, self._device_type, self._backend, self._world_size
            )
        except Exception as exc:
            self.enabled = False
            self.failure = f"{type(exc).__name__}: {exc}"
            _log.warning(
                "%s kernel: capturing its calls into a device graph failed (%s); it runs "
                "eagerly from now on",
                self._backend,
                self.failure,
            )
            return
        self._graphs[key] = segments
        while len(self._graphs) > MAX_GRAPHS:
            del self._graphs[next(iter(self._graphs))]
