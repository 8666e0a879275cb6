"""Compiling and profiling spread over a host's devices (private; used by ``superoptimize``).

With ``YIRAGE_PROFILE_WORKERS=N`` (on a host with several GPUs, one per GPU),
``superoptimize`` hands the candidates to N worker processes: each builds its share
(codegen, compile, load, the backend's precompile), draws the check inputs from the run's
seed on its device and races its share's contenders (``yirage._race``, timing only).
Compilers then run side by side, and profiling time is divided by the worker count.

The driver then builds, checks and races again, on its own device, the finalists: the
contenders within ``_race.PRUNE_RATIO`` of the fastest worker time (they share the compile
caches with the workers, so their builds are cache hits) and always the library baseline.
The winner's time therefore comes from one device; where every finalist fails the checks
the rest are built and checked in turn. Workers are started when ``superoptimize`` starts
(their start-up overlaps the search) and kept for later calls.

Workers are used only when ``YIRAGE_PROFILE_WORKERS`` asks for them, for backends given by
name (a worker builds its backend from the registry), for devices of the driver's model, and
never in a rank of a ``torch.distributed`` group (the other devices are the other ranks').
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from yirage import _collectives, _env, _race
from yirage._backend import Backend
from yirage._race import Contender, Key, build_contenders

__all__ = ["ShareResult", "WorkerError", "WorkerPool", "finalists", "pool_for"]


@dataclass
class ShareResult:
    """What one worker measured for its share of the candidates."""

    device: str
    best_us: dict[Key, float] = field(default_factory=dict)
    failed: dict[Key, str] = field(default_factory=dict)
    build_errors: dict[int, str] = field(default_factory=dict)
    build_s: float = 0.0
    precompile_s: float = 0.0
    profile_s: float = 0.0
    #: from the request read to the answer ready, in the worker
    total_s: float = 0.0
    #: wall-clock times (``time.time()``) the worker read the request and sent the answer
    received_at: float = 0.0
    answered_at: float = 0.0
    #: set by the driver: when it sent the request and when it had read the answer
    sent_at: float = 0.0
    delivered_at: float = 0.0


# -- the worker side -----------------------------------------------------------------------------


def _run_share(
    be: Backend,
    graph_json: str,
    seed: int,
    plans: list[tuple[int, dict[str, Any]]],
    profile_options: dict[str, Any] | None,
) -> ShareResult:
    """Build and race ``plans`` (candidate index, KernelPlan) on this worker's device."""
    from yirage._check import check_tensors
    from yirage._graph import KernelGraph
    from yirage._shapes import Shapes

    graph = KernelGraph.from_json(graph_json)
    shapes = Shapes(graph)
    out = ShareResult(device=be.device_spec().name)
    t0 = time.perf_counter()

    contenders: list[Contender] = []
    # side by side, as the driver builds (toolchains such as nvrtc and nvcc release the GIL)
    with ThreadPoolExecutor(max(1, min(len(plans), 8)), thread_name_prefix="yirage-build") as ex:
        futures = [(index, ex.submit(build_contenders, be, index, plan)) for index, plan in plans]
        for index, fut in futures:
            try:
                contenders += fut.result()[0]
            except Exception as exc:
                out.build_errors[index] = f"{type(exc).__name__}: {exc}"
    out.build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tensors = check_tensors(be, graph, shapes, seed)
    inputs = tensors if shapes.world_size == 1 else tensors[0]
    if contenders and shapes.world_size == 1:
        with contextlib.suppress(Exception):  # an optimisation: the first runs compile the rest
            be.precompile([c.launcher for c in contenders], inputs)
    out.precompile_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    result = _race.race(
        be,
        contenders,
        inputs,
        profile_options,
        stand_in=lambda: _collectives.stand_in(shapes.world_size),
    )
    out.profile_s = time.perf_counter() - t0
    out.best_us = dict(result.best_us)
    out.failed = dict(result.failed)
    return out


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the worker process ended")
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the worker process ended mid-answer")
    return pickle.loads(data)


def _serve(backend: str, device_index: int) -> None:
    """A worker's loop: its backend pinned to its device, then one share per request on
    stdin, one answer on (the original) stdout, until stdin closes. What the code prints
    goes to stderr, so it cannot corrupt the answers."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    from yirage._registry import resolve_backend

    be = resolve_backend(backend)
    be.use_device(device_index)
    while True:
        try:
            args = _receive(requests)
        except EOFError:
            return
        received, t0 = time.time(), time.perf_counter()
        try:
            share = _run_share(be, *args)
            share.total_s = time.perf_counter() - t0
            share.received_at, share.answered_at = received, time.time()
            answer: tuple[str, Any] = ("ok", share)
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        _send(answers, answer)


# -- the driver side -----------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker process failed or ended (the caller then profiles on its own device)."""


class WorkerPool:
    """Worker processes (``python -m yirage._spread_worker``: they never import the caller's main
    module), worker ``i`` on device ``i % devices``; started at once, so their imports
    overlap the search."""

    def __init__(self, backend: str, devices: int, workers: int) -> None:
        env = _env.worker_environment()  # no workers of workers
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "yirage._spread_worker", backend, str(i % devices)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            for i in range(workers)
        ]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.procs)

    def run(
        self,
        graph_json: str,
        seed: int,
        shares: Sequence[list[tuple[int, dict[str, Any]]]],
        profile_options: dict[str, Any] | None,
    ) -> list[ShareResult]:
        """Every non-empty share on its worker, side by side; any worker's failure raises
        :class:`WorkerError` (never a partial result)."""
        with self._lock:
            busy = []
            sent = time.time()
            for proc, share in zip(self.procs, shares, strict=False):
                if share:
                    assert proc.stdin is not None
                    try:
                        _send(proc.stdin, (graph_json, seed, share, profile_options))
                    except OSError as exc:
                        raise WorkerError(f"worker {proc.pid} is gone ({exc})") from None
                    busy.append(proc)
            results = []
            for proc in busy:
                assert proc.stdout is not None
                try:
                    status, value = _receive(proc.stdout)
                except EOFError as exc:
                    raise WorkerError(f"worker {proc.pid}: {exc} (exit {proc.poll()})") from None
                if status != "ok":
                    raise WorkerError(f"worker {proc.pid}: {value}")
                value.sent_at, value.delivered_at = sent, time.time()
                results.append(value)
            return results

    def shutdown(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                if proc.stdin is not None:
                    proc.stdin.close()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


_POOLS: dict[tuple[str, int, int], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def worker_count(be: Backend) -> tuple[int, int]:
    """(workers, devices) for ``be``: ``YIRAGE_PROFILE_WORKERS`` workers (none when unset:
    on 4 H100s a fresh process's first call took 3-5 s longer with a worker per GPU, the
    workers' start-up outweighing what they save on a few candidates); none in a rank of a
    ``torch.distributed`` group, whose other devices are the other ranks'."""
    devices = max(1, be.device_count())
    asked = _env.profile_workers()
    if asked is None or _in_process_group():
        return 0, devices
    return asked, devices


def _in_process_group() -> bool:
    """Whether this process is one rank of an initialised torch.distributed group."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:
        return False


def pool_for(be: Backend, by_name: bool) -> WorkerPool | None:
    """The (kept) worker pool for ``be``, or None where profiling stays in this process."""
    if not by_name:
        return None
    workers, devices = worker_count(be)
    if workers < 1:
        return None
    key = (be.name, devices, workers)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = WorkerPool(be.name, devices, workers)
        return pool


@atexit.register
def _shutdown_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown()


def drop_pool(pool: WorkerPool) -> None:
    """Forget a pool whose worker failed (the next call starts fresh workers)."""
    with _POOLS_LOCK:
        for key, p in list(_POOLS.items()):
            if p is pool:
                del _POOLS[key]
    pool.shutdown()


def split(
    plans: Sequence[tuple[int, dict[str, Any]]], n: int
) -> list[list[tuple[int, dict[str, Any]]]]:
    """``plans`` dealt round-robin into ``n`` shares."""
    shares: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(n)]
    for i, p in enumerate(plans):
        shares[i % n].append(p)
    return shares


def finalists(results: Sequence[ShareResult], baseline: set[int]) -> list[int]:
    """Candidate indices the driver builds, checks and races again: those with a contender
    within ``PRUNE_RATIO`` of the fastest time any worker measured, and the baseline."""
    best: dict[int, float] = {}
    for r in results:
        for key, us in r.best_us.items():
            if key not in r.failed:
                best[key[0]] = min(best.get(key[0], math.inf), us)
    if not best:
        return sorted(baseline)
    fastest = min(best.values())
    keep = {i for i, us in best.items() if us <= _race.PRUNE_RATIO * fastest}
    return sorted(keep | baseline)


def describe(results: Sequence[ShareResult], wall_s: float | None = None) -> str:
    """The report's note on where the candidates were built and profiled (``wall_s``: how
    long the driver waited for every answer)."""
    devices = [r.device for r in results]
    build = max((r.build_s for r in results), default=0.0)
    pre = max((r.precompile_s for r in results), default=0.0)
    prof = max((r.profile_s for r in results), default=0.0)
    return (
        f"compiled and profiled in {len(results)} worker processes, one per device "
        f"({', '.join(devices)}): {build:.2f} s building, {pre:.2f} s drawing inputs and "
        f"precompiling and {prof:.2f} s profiling at most per worker"
        + (
            f" ({max(r.total_s for r in results):.2f} s in all; the answers came "
            f"{wall_s:.2f} s after the requests, which reached the workers after "
            f"{max(r.received_at - r.sent_at for r in results):.2f} s, and took "
            f"{max(r.delivered_at - r.answered_at for r in results):.2f} s back)"
            if wall_s is not None and results
            else ""
        )
        + "; the finalists were checked and raced again on this process's device"
    )
