"""Collectives of multi-device kernels (private).

A kernel graph with ``world_size`` N > 1 is one rank's program (SPMD). Its ``all_reduce``
library kernels call :func:`all_reduce`, which sums over the ranks through the collective
bound to the calling thread:

* by default :class:`TorchDistributed`: ``torch.distributed``'s default process group, which
  must be initialised with world size N (``torchrun --nproc-per-node N`` or
  ``torch.distributed.init_process_group(...)`` in every rank);
* :func:`run_ranks` runs all N ranks of a callable in this process, one thread per rank,
  each bound to a :class:`SimulatedRank` of one :class:`SimulatedGroup`: the ranks meet at a
  barrier and every rank sums the N values in rank order (deterministic). This is how
  ``superoptimize`` checks every rank numerically and what ``OptimizedKernel.run_ranks``
  uses;
* :class:`StandIn` (timing only): N times the local value, with no communication. The
  candidates of one graph differ only in their collective-free parts (every all_reduce is
  the same library call), so profiling them with the stand-in ranks them correctly.

Values are numpy arrays (CPU runtime) or torch tensors (CUDA runtime); a collective returns
the sum as the same kind of object and may reuse the argument's memory.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import numpy as np

from yirage._errors import BackendError

__all__ = [
    "Collective",
    "SimulatedGroup",
    "SimulatedRank",
    "StandIn",
    "TorchDistributed",
    "all_reduce",
    "bound",
    "current",
    "run_ranks",
    "stand_in",
]

T = TypeVar("T")

#: Seconds a simulated rank waits at the barrier for the others before giving up.
BARRIER_TIMEOUT_S = 120.0


class Collective(Protocol):
    """What an all_reduce library kernel needs: the group's size, this rank, and a sum."""

    world_size: int
    rank: int

    def all_reduce(self, x: Any) -> Any:
        """The sum of ``x`` over the ranks (same kind, dims and dtype as ``x``)."""
        ...


_local = threading.local()


def current() -> Collective | None:
    """The collective bound to the calling thread (None: torch.distributed is used)."""
    return getattr(_local, "collective", None)


@contextmanager
def bound(collective: Collective) -> Iterator[Collective]:
    """Bind ``collective`` to the calling thread for the duration of the block."""
    previous = current()
    _local.collective = collective
    try:
        yield collective
    finally:
        _local.collective = previous


def all_reduce(x: Any, world_size: int) -> Any:
    """Sum ``x`` over the ``world_size`` ranks with the calling thread's collective (the
    default: torch.distributed). Called by the runtimes' all_reduce library kernels."""
    world_size = int(world_size)
    if world_size == 1:
        return x
    c = current()
    if c is None:
        c = _torch_distributed(world_size)
    if c.world_size != world_size:
        raise BackendError(
            f"the kernel's all_reduce spans {world_size} ranks but the collective in use has "
            f"{c.world_size}: run the kernel in a group of {world_size} ranks"
        )
    return c.all_reduce(x)


# -- torch.distributed ---------------------------------------------------------------------------


def _launch_hint(world_size: int) -> str:
    return (
        f"call torch.distributed.init_process_group(...) with world_size={world_size} in every "
        f"rank (or launch the script with `torchrun --nproc-per-node {world_size}`), or run all "
        "ranks in this process with OptimizedKernel.run_ranks(...)"
    )


#: The TorchDistributed of the default process group, per world size (a kernel call's
#: all_reduce is on the host path of every step: checking the group once saves its lookups).
_TORCH_GROUPS: dict[int, tuple[Any, TorchDistributed]] = {}


def _torch_distributed(world_size: int) -> TorchDistributed:
    """The cached :class:`TorchDistributed` while the default group is the one it was made
    for (a destroyed and re-initialised group gets a new one)."""
    try:
        import torch.distributed as dist

        group = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    except ImportError:
        group = None
    hit = _TORCH_GROUPS.get(world_size)
    if hit is not None and group is not None and hit[0] is group:
        return hit[1]
    made = TorchDistributed(world_size)  # raises with the fix when there is no group
    _TORCH_GROUPS[world_size] = (group, made)
    return made


def _direct_all_reduce(dist: Any) -> Callable[[Any], None] | None:
    """A blocking sum over the default group that calls the process group itself, as
    ``dist.all_reduce(t)`` does once its per-call checks are done (the group and options are
    looked up once: a kernel call's all_reduce is on the host path of every step); None when
    this torch lacks the pieces (``dist.all_reduce`` is used then)."""
    c10d = getattr(dist, "distributed_c10d", None)
    options = getattr(dist, "AllreduceOptions", None)
    default_group = getattr(c10d, "_get_default_group", None)
    if options is None or default_group is None:
        return None
    group = default_group()
    opts = options()
    opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    coalescing = getattr(getattr(c10d, "_world", None), "pg_coalesce_state", {})

    def run(t: Any) -> None:
        if group in coalescing:  # inside the caller's coalescing block: its bookkeeping
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            return
        work = group.allreduce([t], opts)
        if work is not None:
            work.wait()

    return run


class TorchDistributed:
    """``torch.distributed``'s default process group (gloo for CPU tensors, NCCL for CUDA)."""

    def __init__(self, world_size: int) -> None:
        try:
            import torch.distributed as dist
        except ImportError as exc:
            raise BackendError(
                f"this kernel runs on {world_size} ranks and sums over them with "
                f"torch.distributed, which cannot be imported ({exc}): install torch, or run "
                "all ranks in this process with OptimizedKernel.run_ranks(...)"
            ) from None
        if not dist.is_available() or not dist.is_initialized():
            raise BackendError(
                f"this kernel runs on {world_size} ranks and sums over them with "
                f"torch.distributed, which is not initialised: {_launch_hint(world_size)}"
            )
        size = dist.get_world_size()
        if size != world_size:
            raise BackendError(
                f"torch.distributed is initialised with world size {size}, but this kernel's "
                f"graph runs on {world_size} ranks: {_launch_hint(world_size)}"
            )
        self._dist = dist
        self.world_size = world_size
        self.rank = int(dist.get_rank())
        self._direct = _direct_all_reduce(dist)

    def all_reduce(self, x: Any) -> Any:
        import torch

        dist = self._dist
        if isinstance(x, np.ndarray):
            arr = np.ascontiguousarray(x)
            t = torch.from_numpy(arr)  # shares memory: the sum lands in ``arr``
        else:
            arr, t = None, x
        try:
            if self._direct is not None and type(t) is torch.Tensor and not t.is_complex():
                self._direct(t)
            else:
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
        except RuntimeError as exc:
            raise BackendError(
                f"torch.distributed all_reduce of a {t.device.type} tensor failed ({exc}); the "
                f"process group's backend ({dist.get_backend()}) must support that device "
                "(gloo: CPU tensors, nccl: CUDA tensors)"
            ) from exc
        return arr if arr is not None else t


# -- one process, every rank ---------------------------------------------------------------------


class SimulatedGroup:
    """``world_size`` ranks in one process: all_reduce meets at a barrier, and every rank
    sums the ranks' values in rank order (so every rank gets the same, deterministic sum)."""

    def __init__(self, world_size: int, timeout: float = BARRIER_TIMEOUT_S) -> None:
        if world_size < 1:
            raise BackendError(f"world_size must be ≥ 1, got {world_size}")
        self.world_size = world_size
        self._slots: list[Any] = [None] * world_size
        self._timeout = timeout
        self._barrier = threading.Barrier(world_size, timeout=timeout)

    def all_reduce(self, rank: int, x: Any) -> Any:
        self._slots[rank] = x
        try:
            self._barrier.wait()  # every rank has deposited its value
            total = functools.reduce(operator.add, self._slots[1:], _copy(self._slots[0]))
            self._barrier.wait()  # every rank has read the values: the slots may be reused
        except threading.BrokenBarrierError:
            raise BackendError(
                "simulated all_reduce: another rank failed or did not reach the collective "
                f"within {self._timeout:g} s"
            ) from None
        return total

    def abort(self) -> None:
        """Release the ranks waiting at the barrier (after one rank failed)."""
        self._barrier.abort()


def _copy(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


class SimulatedRank:
    """Rank ``rank`` of a :class:`SimulatedGroup`."""

    def __init__(self, group: SimulatedGroup, rank: int) -> None:
        self.group = group
        self.world_size = group.world_size
        self.rank = rank

    def all_reduce(self, x: Any) -> Any:
        return self.group.all_reduce(self.rank, x)


class StandIn:
    """Timing only: ``world_size`` times the local value, no communication."""

    def __init__(self, world_size: int, rank: int = 0) -> None:
        self.world_size = world_size
        self.rank = rank

    def all_reduce(self, x: Any) -> Any:
        return x * self.world_size


def stand_in(world_size: int) -> contextlib.AbstractContextManager[Any]:
    """For timing one rank: its all_reduce replaced by a :class:`StandIn` (nothing to do
    for a single device)."""
    return bound(StandIn(world_size)) if world_size > 1 else contextlib.nullcontext()


def run_ranks(fn: Callable[[int], T], world_size: int) -> list[T]:
    """Run ``fn(rank)`` for every rank of a :class:`SimulatedGroup` of ``world_size``, one
    thread per rank; returns the results in rank order. If a rank raises, the others are
    released from the collective and the first rank's error (in rank order) is raised."""
    group = SimulatedGroup(world_size)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        try:
            with bound(SimulatedRank(group, rank)):
                results[rank] = fn(rank)
        except BaseException as exc:
            errors[rank] = exc
            group.abort()

    threads = [
        threading.Thread(target=body, args=(r,), name=f"yirage-rank-{r}", daemon=True)
        for r in range(world_size)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None]
    if failed:
        # a rank's own error beats the "another rank failed" it caused elsewhere
        own = [e for e in failed if "another rank failed" not in str(e)]
        raise (own or failed)[0]
    return results
