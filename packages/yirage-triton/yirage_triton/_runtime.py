"""Runtime of the Triton layer: input checks, launchers, and profiling on the device.

Launchers take torch tensors: on one device of the backend's torch device type (``cuda`` for
NVIDIA and ROCm, ``npu`` …), with the plan's dtypes and shapes, contiguous. Outputs are
allocated on the inputs' device; kernels run on torch's current stream. Interpreter launchers
(Triton interpreter, no device) take CPU tensors.

Profiling (:func:`profile`) times with the device's events (``torch.<device>.Event``):
warm-up launches, then ``repeats`` timed launches, each after an L2 flush (a write over a
buffer twice the L2 size, outside the timed region) and on rotating sets of fresh random
inputs; the median is reported. It also captures the launcher in a device graph
(``torch.<device>.graph``) and reports the median graph-replay time (launch overhead
excluded), which is how the benchmark targets are stated.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from yirage.plan import LibraryKernel, Plan
from yirage.plugin import BackendError, DTypeError, ShapeError
from yirage_triton._toolchain import interpret_mode

__all__ = [
    "InputError",
    "Launcher",
    "ProfileResult",
    "TimingSession",
    "TritonLauncher",
    "check_inputs",
    "matmul_fp32",
    "profile",
    "time_callable",
]


_FP32_OUT_MATMUL: list[bool] = []  # [supported] once probed


def matmul_fp32(a: Any, b: Any) -> Any:
    """``a @ b`` of 16-bit operands with a float32 result, for library matmuls writing a
    float32 intermediate: on CUDA straight from cuBLAS (``torch.mm``/``torch.bmm`` with
    ``out_dtype``, torch ≥ 2.8), saving the rounding to 16 bits and a conversion kernel;
    elsewhere (CPU tensors, other ranks, older torch) ``torch.matmul(a, b).float()``."""
    torch = _torch()
    if a.is_cuda and a.dim() == b.dim() and a.dim() in (2, 3) and _FP32_OUT_MATMUL != [False]:
        fn = torch.mm if a.dim() == 2 else torch.bmm
        try:
            out = fn(a, b, out_dtype=torch.float32)
        except TypeError:  # a torch without out_dtype: probed once
            _FP32_OUT_MATMUL[:] = [False]
        else:
            _FP32_OUT_MATMUL[:] = [True]
            return out
    return torch.matmul(a, b).float()


class InputError(BackendError):
    """Tensors handed to a kernel that it cannot take (the message says what to do)."""


_TORCH_NAMES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}


def _torch() -> Any:
    import torch

    return torch


def _device_api(dev: Any) -> Any:
    """torch's namespace of a device type: ``torch.cuda`` for "cuda", ``torch.npu`` …"""
    return getattr(_torch(), dev.type if hasattr(dev, "type") else str(dev))


def check_inputs(
    tensors: Sequence[Any],
    specs: Sequence[tuple[Sequence[int], str]],
    *,
    interpret: bool = False,
    device: str = "cuda",
) -> list[Any]:
    """Validate ``tensors`` against the plan's input ``specs`` ((dims, dtype) per input):
    torch tensors on one ``device``-type device (CPU tensors with ``interpret``)."""
    torch = _torch()
    if len(tensors) != len(specs):
        raise InputError(f"the kernel takes {len(specs)} input tensors, got {len(tensors)}")
    first = None
    out = []
    for i, (t, (dims, dtype)) in enumerate(zip(tensors, specs, strict=True)):
        if not isinstance(t, torch.Tensor):
            kind = type(t).__module__ + "." + type(t).__name__
            raise InputError(
                f"input {i} is a {kind}; the kernel takes torch tensors on a {device} device "
                f"(torch.as_tensor(x).to({device!r})), or build the kernel with backend='cpu' "
                "for host arrays"
            )
        if interpret:
            if t.device.type != "cpu":
                raise InputError(
                    f"input {i} is on {t.device}; the Triton interpreter runs on CPU tensors"
                )
        elif t.device.type != device:
            raise InputError(
                f"input {i} is on {t.device}; the kernel runs on {device} tensors: move it with "
                f"tensor.to({device!r}) (or build the kernel with backend='cpu')"
            )
        if first is None:
            first = t.device
        elif t.device != first:
            raise InputError(
                f"inputs are on {first} and {t.device} (input {i}); put every input on one device"
            )
        want = getattr(torch, _TORCH_NAMES[dtype])
        if t.dtype != want:
            raise DTypeError(
                f"input {i} has dtype {t.dtype}, the kernel was built for {want}: "
                f"convert with .to({want})"
            )
        if tuple(t.shape) != tuple(dims):
            raise ShapeError(
                f"input {i} has shape {tuple(t.shape)}, the kernel was built for {tuple(dims)}"
            )
        if not t.is_contiguous():
            raise InputError(
                f"input {i} is not contiguous (strides {tuple(t.stride())}): "
                "pass tensor.contiguous()"
            )
        out.append(t)
    return out


class Launcher:
    """A loaded plan: ``launcher(*tensors)`` or ``launcher(inputs=[...])`` → list of outputs.
    ``device``: the torch device type it runs on (CPU tensors with ``interpret``)."""

    language: str = ""

    def __init__(
        self,
        plan: Plan,
        source: str,
        module: ModuleType,
        *,
        interpret: bool = False,
        device: str = "cuda",
    ) -> None:
        self.plan = plan
        self.source = source
        self.module = module
        self.interpret = interpret
        self.device = device
        self.input_specs = [(tuple(b.dims), b.dtype) for b in plan.inputs]
        self.output_specs = [(tuple(b.dims), b.dtype) for b in plan.outputs]

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        if inputs is not None and tensors:
            raise InputError("pass the tensors either positionally or as inputs=[...], not both")
        args = list(inputs) if inputs is not None else list(tensors)
        return self.run_unchecked(self.check(args))

    def check(self, tensors: Sequence[Any]) -> list[Any]:
        """``tensors`` validated against the plan's inputs (see :func:`check_inputs`)."""
        return check_inputs(tensors, self.input_specs, interpret=self.interpret, device=self.device)

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        """Launch without checks (for profiling loops and graph capture)."""
        if not self.interpret and inputs:
            dev = inputs[0].device
            api = _device_api(dev)
            if dev.index is None or dev.index == api.current_device():
                return list(self.module.launch(list(inputs)))  # no device switch on the host path
            with api.device(dev):
                return list(self.module.launch(list(inputs)))
        with interpret_mode(True):  # Triton consults TRITON_INTERPRET while running, too
            return list(self.module.launch(list(inputs)))

    def __repr__(self) -> str:
        mode = "interpreter" if self.interpret else "gpu"
        return (
            f"<{type(self).__name__} {self.language} plan {self.plan.graph_hash or '?'} ({mode})>"
        )


class TritonLauncher(Launcher):
    """Runs a printed Triton module. When Triton reports that a kernel's pipelined tiles do
    not fit in shared memory (OutOfResources at its first compilation), the software-pipelining
    depth of every kernel is lowered step by step and the launch retried; ``notes`` says so."""

    language = "triton"

    def __init__(
        self,
        plan: Plan,
        source: str,
        module: ModuleType,
        *,
        interpret: bool = False,
        device: str = "cuda",
    ) -> None:
        super().__init__(plan, source, module, interpret=interpret, device=device)
        self.notes: list[str] = []

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        while True:
            try:
                return super().run_unchecked(inputs)
            except Exception as exc:
                if type(exc).__name__ != "OutOfResources" or not self._fewer_stages():
                    raise
                self.notes.append(f"lowered num_stages after: {exc}")

    def _fewer_stages(self) -> bool:
        kernels = getattr(self.module, "KERNELS", {})
        lowered = False
        for info in kernels.values():
            if int(info.get("num_stages", 1)) > 1:
                info["num_stages"] = int(info["num_stages"]) - 1
                lowered = True
        return lowered


# ---------------------------------------------------------------------------------------------
# profiling


@dataclass(frozen=True)
class ProfileResult:
    """Timing of one launcher. ``median_us`` is the figure candidates are ranked by: the
    graph replay median when capture worked, else the event-timed launch median."""

    median_us: float
    launch_median_us: float
    launch_min_us: float
    graph_median_us: float | None
    graph_error: str | None
    repeats: int
    warmup: int
    input_sets: int
    l2_flush: bool
    method: str
    device: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fresh_like(inputs: Sequence[Any], seed: int) -> list[Any]:
    torch = _torch()
    gen = torch.Generator(device=inputs[0].device).manual_seed(seed) if inputs else None
    out = []
    for t in inputs:
        x = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
        out.append(x.to(t.dtype))
    return out


#: Calls captured in one graph by :func:`time_callable` (replay time / this = per call).
CALLS_PER_GRAPH = 10


def _l2_flush_buffer(dev: Any) -> Any:
    """A buffer twice the L2 size: writing it evicts the inputs from L2 before a timed run."""
    torch = _torch()
    props = _device_api(dev).get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
    return torch.empty(2 * l2, dtype=torch.int8, device=dev)


def host_gaps(launcher: Any) -> bool:
    """Whether a call of ``launcher`` leaves the device idle while the host enqueues its
    next step: a plan of several kernels or of library ops. Its eager launch times are then
    no device time (library contenders of RMSNorm + Linear took 100-350 µs eager and 17-20
    µs replayed on an H200), so the race's screen never gives up on them."""
    kernels = getattr(getattr(launcher, "plan", None), "kernels", ())
    return len(kernels) > 1 or any(isinstance(k, LibraryKernel) for k in kernels)


def _given_up(
    probe: list[float],
    replay_us: float | None,
    dev: Any,
    input_sets: int,
    flush_l2: bool,
    give_up_us: float,
) -> ProfileResult:
    """The result of a profile stopped after its probe launches and, where the call could
    be captured, the one graph replay that confirmed them (see ``give_up_us``)."""
    med = statistics.median(probe)
    confirmed = f" and one {dev.type} graph replay" if replay_us is not None else ""
    return ProfileResult(
        median_us=replay_us if replay_us is not None else med,
        launch_median_us=med,
        launch_min_us=min(probe),
        graph_median_us=replay_us,
        graph_error=None,
        repeats=len(probe),
        warmup=1,
        input_sets=max(1, input_sets),
        l2_flush=flush_l2,
        method=(
            f"{dev.type} events (stopped after {len(probe)} launches{confirmed} "
            f"over {give_up_us:.1f} µs)"
        ),
        device=str(_device_api(dev).get_device_name(dev)),
    )


def _replay_once(
    fn: Callable[[Sequence[Any]], Any], inputs: Sequence[Any], dev: Any, flush: Any
) -> float | None:
    """µs of one replay of ``fn(inputs)`` captured in a device graph (no host time in it);
    None where the call cannot be captured."""
    try:
        return GraphTimer(fn, [inputs], dev, calls_per_graph=1).times(flush, 0, 1)[0]
    except Exception:  # not capturable: the caller decides on the eager times
        _device_api(dev).synchronize(dev)
        return None


def _launch_times(
    fn: Callable[[Sequence[Any]], Any],
    input_sets: Sequence[Sequence[Any]],
    dev: Any,
    flush: Any,
    warmup: int,
    repeats: int,
) -> list[float]:
    """Event-timed eager calls of ``fn`` (µs each), cycling the input sets."""
    api = _device_api(dev)
    n = len(input_sets)
    for i in range(warmup):
        fn(input_sets[i % n])
    api.synchronize(dev)
    starts = [api.Event(enable_timing=True) for _ in range(repeats)]
    ends = [api.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        fn(input_sets[i % n])
        ends[i].record()
    api.synchronize(dev)
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends, strict=True)]


class GraphTimer:
    """``fn`` captured in one device graph per input set (``calls_per_graph`` back-to-back calls
    each, cycling the sets), ready to be replayed and timed any number of times, so that
    profiling rounds after the first neither capture nor launch eagerly again."""

    def __init__(
        self,
        fn: Callable[[Sequence[Any]], Any],
        input_sets: Sequence[Sequence[Any]],
        dev: Any,
        calls_per_graph: int = CALLS_PER_GRAPH,
    ) -> None:
        api = self.api = _device_api(dev)
        graph_type = getattr(api, "CUDAGraph", None) or getattr(api, "NPUGraph", None)
        if graph_type is None or not hasattr(api, "graph"):
            raise BackendError(f"torch.{dev.type} has no graph capture")
        self.dev = dev
        self.calls = max(1, calls_per_graph)
        n = len(input_sets)
        side = api.Stream(dev)
        side.wait_stream(api.current_stream(dev))
        with api.stream(side):
            for s in input_sets:
                fn(s)  # warm-up on a side stream, as torch requires before capture
        api.current_stream(dev).wait_stream(side)
        api.synchronize(dev)
        self.graphs = []
        for j in range(n):
            g = graph_type()
            with api.graph(g):
                for c in range(self.calls):
                    fn(input_sets[(j + c) % n])
            self.graphs.append(g)

    def times(self, flush: Any, warmup: int, repeats: int) -> list[float]:
        """Per-call µs of ``repeats`` replays, L2 flushed before each replay (not between
        the calls of one replay)."""
        api = self.api
        n = len(self.graphs)
        for i in range(warmup):
            self.graphs[i % n].replay()
        api.synchronize(self.dev)
        starts = [api.Event(enable_timing=True) for _ in range(repeats)]
        ends = [api.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            if flush is not None:
                flush.zero_()
            starts[i].record()
            self.graphs[i % n].replay()
            ends[i].record()
        api.synchronize(self.dev)
        return [s.elapsed_time(e) * 1000.0 / self.calls for s, e in zip(starts, ends, strict=True)]


def time_callable(
    fn: Callable[[Sequence[Any]], Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    warmup: int = 10,
    repeats: int = 50,
    flush_l2: bool = True,
    graph: bool = True,
    calls_per_graph: int = CALLS_PER_GRAPH,
) -> tuple[list[float], list[float] | None, str | None]:
    """Event-timed launches and graph replays of ``fn(inputs)`` (µs per call).

    Each graph holds ``calls_per_graph`` back-to-back calls (cycling the input sets) and the
    replay time is divided by that count, so launch gaps are excluded as in the benchmark
    and its targets; L2 is flushed before each launch or replay, not between the calls of
    one replay. Returns (launch times, graph replay times or None, graph error or None)."""
    torch = _torch()
    dev = input_sets[0][0].device if input_sets and input_sets[0] else torch.device("cuda")
    flush = _l2_flush_buffer(dev) if flush_l2 else None
    launch = _launch_times(fn, input_sets, dev, flush, warmup, repeats)
    if not graph:
        return launch, None, None
    try:
        timer = GraphTimer(fn, input_sets, dev, calls_per_graph)
        return launch, timer.times(flush, warmup, repeats), None
    except Exception as exc:  # report, never hide: the caller records graph_error
        _device_api(dev).synchronize(dev)
        return launch, None, f"{type(exc).__name__}: {exc}"


def warm_median_us(launcher: Launcher, inputs: Sequence[Any], repeats: int = 20) -> float:
    """Median graph replay time (µs per call) of ``launcher`` on ``inputs`` alone with
    nothing flushed: the time when its inputs stay in L2 between calls, as in a benchmark
    that replays one input set (event-timed launches where capture fails)."""
    checked = launcher.check(list(inputs))
    launch, replay, _ = time_callable(
        launcher.run_unchecked, [checked], warmup=3, repeats=repeats, flush_l2=False
    )
    return statistics.median(replay or launch)


@dataclass
class _Timed:
    """What the first profiling round of one launcher leaves for the later ones."""

    repeats: int
    launch: list[float]
    timer: GraphTimer


class TimingSession:
    """State that the profiling rounds of one ``superoptimize`` share (see
    :meth:`TritonBackend.profiling_session`): the extra random input sets, drawn once for
    every launcher with the same inputs; the L2 flush buffer; and per launcher its captured
    graphs and fitted repeat count, so rounds after the first only replay. Dropping the
    session frees the graphs and the input sets."""

    def __init__(self) -> None:
        self._sets: dict[tuple[Any, ...], list[list[Any]]] = {}
        self._flush: dict[str, Any] = {}
        self._timed: dict[tuple[Any, ...], _Timed] = {}

    def input_sets(self, checked: list[Any], count: int) -> list[list[Any]]:
        key = (_inputs_key(checked), count)
        if key not in self._sets:
            self._sets[key] = _input_sets(checked, count)
        return self._sets[key]

    def flush_buffer(self, dev: Any) -> Any:
        if str(dev) not in self._flush:
            self._flush[str(dev)] = _l2_flush_buffer(dev)
        return self._flush[str(dev)]

    def timed(self, launcher: Any, key: tuple[Any, ...]) -> _Timed | None:
        return self._timed.get((launcher, key))  # launchers hash by identity

    def remember(self, launcher: Any, key: tuple[Any, ...], timed: _Timed) -> None:
        self._timed[(launcher, key)] = timed


def _input_sets(checked: list[Any], count: int) -> list[list[Any]]:
    """``checked`` and ``count - 1`` fresh random sets like it (fixed seeds)."""
    return [checked, *(_fresh_like(checked, 1000 + i) for i in range(count - 1))]


def _inputs_key(tensors: Sequence[Any]) -> tuple[Any, ...]:
    return tuple((t.data_ptr(), tuple(t.shape), str(t.dtype), str(t.device)) for t in tensors)


def profile(
    launcher: Launcher,
    inputs: Sequence[Any],
    *,
    warmup: int = 10,
    repeats: int = 50,
    input_sets: int = 4,
    flush_l2: bool = True,
    graph: bool = True,
    min_time_s: float | None = None,
    min_repeats: int = 3,
    session: TimingSession | None = None,
    give_up_us: float | None = None,
    **_other: Any,
) -> ProfileResult:
    """Time ``launcher`` on ``inputs`` plus ``input_sets - 1`` fresh random input sets.

    ``min_time_s`` bounds the timing work: a kernel whose warm-up shows that ``repeats``
    launches plus as many graph replays would take longer gets fewer repeats (never fewer
    than ``min_repeats``), so a slow candidate costs about as much time as a fast one.
    With a ``session`` (profiling rounds), the first call per launcher captures its graphs
    and fits the repeat count; later calls replay those graphs (the eager launch times are
    the first call's). ``give_up_us``: when the first three eager launches (one warm-up, two
    timed) all take longer and so does one replay of the call captured in a device graph,
    those times are the result and nothing more is run (the race's screen passes a multiple
    of the fastest contender's time: a 20 ms variant beside 0.4 ms ones costs about 100 ms,
    not the second and more a full timing takes). The replay keeps the host's time out of
    the decision: eager times hold it too (on an H200 the fastest LoRA variant, 13 µs
    replayed, took 100 µs per eager launch in the screen of a fresh process and was
    dropped). Where the call cannot be captured, the eager times decide, except for
    launchers whose eager times hold host gaps (:func:`host_gaps`).
    Options meant for other backends' profilers are accepted and ignored, so
    ``superoptimize(profile_options=...)`` works with any backend."""
    checked = launcher.check(list(inputs))
    if launcher.interpret:
        times = []
        for _ in range(max(1, min(repeats, 3))):
            t0 = time.perf_counter()
            launcher.run_unchecked(checked)
            times.append((time.perf_counter() - t0) * 1e6)
        med = statistics.median(times)
        return ProfileResult(
            med,
            med,
            min(times),
            None,
            "interpreter: no device graphs",
            len(times),
            0,
            1,
            False,
            "wall clock (Triton interpreter on the CPU; not a device time)",
            "cpu (interpreter)",
        )
    torch = _torch()
    dev = checked[0].device if checked else torch.device("cuda")
    key = (_inputs_key(checked), input_sets, flush_l2, graph, min_time_s, min_repeats)
    before = session.timed(launcher, key) if session is not None else None
    flush = None
    if flush_l2:
        flush = session.flush_buffer(dev) if session is not None else _l2_flush_buffer(dev)
    replay: list[float] | None = None
    gerr: str | None = None
    if before is not None:
        # a later round: the graphs are captured and the repeat count fitted; replay only
        repeats, warmup, launch = before.repeats, min(2, warmup), before.launch
        replay = before.timer.times(flush, warmup, repeats)
    else:
        sets = (
            session.input_sets(checked, input_sets)
            if session is not None
            else _input_sets(checked, input_sets)
        )
        run = launcher.run_unchecked
        probe = None
        if give_up_us is not None or (min_time_s is not None and min_time_s > 0):
            probe = _launch_times(run, sets, dev, flush, 1, 2)
        if probe is not None and give_up_us is not None and min(probe) > give_up_us:
            # eager times hold the host's time too (a busy host, the gaps between steps):
            # one replay of a captured call must confirm the device time before giving up
            replay_us = _replay_once(run, sets[0], dev, flush)
            if replay_us is None and not host_gaps(launcher):
                return _given_up(probe, None, dev, input_sets, flush_l2, give_up_us)
            if replay_us is not None and replay_us > give_up_us:
                return _given_up(probe, replay_us, dev, input_sets, flush_l2, give_up_us)
        if probe is not None and min_time_s is not None and min_time_s > 0:
            # one repeat = a launch plus a replay of CALLS_PER_GRAPH calls
            per_repeat_s = min(probe) * 1e-6 * (1 + CALLS_PER_GRAPH)
            fit = int(min_time_s / max(per_repeat_s, 1e-9))
            repeats = max(min(repeats, fit), max(1, min_repeats))
            warmup = min(warmup, repeats)
        launch = _launch_times(run, sets, dev, flush, warmup, repeats)
        timer = None
        if graph:
            try:
                timer = GraphTimer(run, sets, dev)
                replay = timer.times(flush, warmup, repeats)
            except Exception as exc:  # report, never hide: recorded as graph_error
                _device_api(dev).synchronize(dev)
                timer, gerr = None, f"{type(exc).__name__}: {exc}"
        if session is not None and timer is not None:  # without graphs: every round in full
            session.remember(launcher, key, _Timed(repeats, launch, timer))
    lmed = statistics.median(launch)
    gmed = statistics.median(replay) if replay else None
    return ProfileResult(
        median_us=gmed if gmed is not None else lmed,
        launch_median_us=lmed,
        launch_min_us=min(launch),
        graph_median_us=gmed,
        graph_error=gerr,
        repeats=repeats,
        warmup=warmup,
        input_sets=max(1, input_sets),
        l2_flush=flush_l2,
        method=f"{dev.type} events" + (f" + {dev.type} graph replay" if gmed is not None else ""),
        device=str(_device_api(dev).get_device_name(dev) if checked else dev.type),
    )
