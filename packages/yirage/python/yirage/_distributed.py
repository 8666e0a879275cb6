"""The search sharded over a Ray cluster (``search(..., executor="ray")``).

The Rust core splits the kernel-level search at its first-level moves: shard ``i`` of ``n``
explores every ``n``-th move (``_core.search_shard``) and returns its candidates as JSON;
the driver merges every shard, de-duplicates and fingerprint-verifies them
(``_core.merge_search_shards``), so a search that runs to exhaustion returns exactly the
local search's candidates. Workers run :func:`_shard_task`, a function of this installed
module: Ray ships a reference to it, and each worker imports ``yirage._core`` from its own
installed ``yirage`` wheel (the same version must be installed on every node). A task whose
worker dies is retried by Ray (``max_retries``); the report counts the attempts, and a shard
that still fails fails the search — a partial result is never returned.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from . import _core, _env
from ._errors import ConfigError, YirageError

__all__ = ["ShardRun", "install_hint", "projected_speedup", "run_sharded"]

#: Ray's retries of a shard whose worker process died.
MAX_RETRIES = 3
#: A shard is a straggler when it took this many times the median shard's time.
STRAGGLER_RATIO = 2.0

_INSTALL = "pip install 'yirage[ray]'"


def install_hint() -> str:
    """How to get Ray for ``executor="ray"``."""
    return _INSTALL


@dataclass(frozen=True)
class ShardRun:
    """One shard as it ran: ``elapsed_s`` inside the worker (``enumerate_s`` of it in the
    search levels, ``realise_s`` building the candidate graphs it sends), ``attempts`` (above
    1 when Ray retried it after its worker died), the worker's ``node`` and ``pid``, the
    skeletons it found and why it stopped."""

    index: int
    elapsed_s: float
    enumerate_s: float
    realise_s: float
    attempts: int
    node: str
    pid: int
    skeletons: int
    stop: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "elapsed_s": self.elapsed_s,
            "enumerate_s": self.enumerate_s,
            "realise_s": self.realise_s,
            "attempts": self.attempts,
            "node": self.node,
            "pid": self.pid,
            "skeletons": self.skeletons,
            "stop": self.stop,
        }


def _import_ray() -> Any:
    try:
        ray = importlib.import_module("ray")
    except ImportError as exc:
        raise ConfigError(f"executor='ray' needs Ray, which is not installed: {_INSTALL}") from exc
    return ray


def _connect(ray: Any) -> None:
    """Join ``YIRAGE_RAY_ADDRESS``'s cluster, or the Ray already initialised here, or start a
    local one."""
    if ray.is_initialized():
        return
    address = _env.ray_address()
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except Exception as exc:
        where = f"YIRAGE_RAY_ADDRESS={address!r}" if address else "a local Ray"
        raise YirageError(
            f"executor='ray': could not connect to {where} ({exc}); check the address or unset "
            "YIRAGE_RAY_ADDRESS to start a local cluster"
        ) from exc


class _Attempts:
    """A Ray actor counting the attempts of each shard (a retried task starts again)."""

    def __init__(self) -> None:
        self.starts: dict[int, int] = {}

    def start(self, index: int) -> int:
        self.starts[index] = self.starts.get(index, 0) + 1
        return self.starts[index]

    def counts(self) -> dict[int, int]:
        return dict(self.starts)


def _shard_task(
    graph_json: str,
    spec_json: str,
    config_json: str,
    index: int,
    count: int,
    attempts: Any,
    crash_first_attempt: bool,
) -> tuple[str, str, int]:
    """Run one shard on a worker: (shard JSON, node id, pid). ``crash_first_attempt`` ends
    the worker process on the shard's first attempt (the tests' lost worker)."""
    ray = importlib.import_module("ray")
    attempt = ray.get(attempts.start.remote(index))
    if crash_first_attempt and attempt == 1:
        os._exit(1)
    graph = _core.KernelGraph.from_json(graph_json)
    out = _core.search_shard(graph, spec_json, config_json, index, count)
    node = str(ray.get_runtime_context().get_node_id())
    return out, node, os.getpid()


def projected_speedup(shard_s: list[float], workers: int, merge_s: float = 0.0) -> float:
    """Projected speed-up of ``workers`` workers over one that runs every shard: the shards
    (measured times ``shard_s``) go longest first to the least loaded worker, the slowest
    worker's total is the sharded phase's time, and the driver's merge (``merge_s``) adds
    to both sides unchanged. Transfer and scheduling costs are left out."""
    if workers < 1:
        raise ConfigError(f"workers must be ≥ 1, got {workers}")
    loads = [0.0] * workers
    for t in sorted(shard_s, reverse=True):
        loads[loads.index(min(loads))] += t
    one = sum(shard_s) + merge_s
    many = max(loads) + merge_s
    return one / many if many > 0 else 1.0


def _stragglers(times: list[float]) -> list[int]:
    """Shards that took over ``STRAGGLER_RATIO`` times the median shard's time."""
    ordered = sorted(times)
    median = ordered[len(ordered) // 2] if ordered else 0.0
    return [i for i, t in enumerate(times) if median > 0 and t > STRAGGLER_RATIO * median]


def run_sharded(
    graph: Any,
    spec_json: str,
    config_json: str,
    shards: int | None = None,
    *,
    _crash_shards: tuple[int, ...] = (),
) -> tuple[Any, dict[str, Any]]:
    """Search ``graph`` (a ``_core.KernelGraph``) in ``shards`` Ray tasks (default: twice the
    cluster's CPUs) and merge on this side: the ``_core.SearchResult`` and a summary of the
    distribution (per-shard runs, stragglers, retries, the longest shard's share)."""
    ray = _import_ray()
    _connect(ray)
    if shards is None:
        shards = max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ConfigError(f"shards must be a positive int, got {shards!r}")
    graph_json = graph.to_json()
    attempts = ray.remote(num_cpus=0)(_Attempts).remote()
    task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_shard_task)
    t0 = time.perf_counter()
    refs = [
        task.remote(graph_json, spec_json, config_json, i, shards, attempts, i in _crash_shards)
        for i in range(shards)
    ]
    outs = []
    for i, ref in enumerate(refs):
        try:
            outs.append(ray.get(ref))
        except Exception as exc:
            for r in refs:
                ray.cancel(r, force=True)
            raise YirageError(
                f"executor='ray': shard {i} of {shards} failed after up to {MAX_RETRIES + 1} "
                f"attempts ({type(exc).__name__}: {exc}); no partial result is returned — fix "
                "the workers or search with executor='local'"
            ) from exc
    wall = time.perf_counter() - t0
    counts = ray.get(attempts.counts.remote())
    ray.kill(attempts)
    t1 = time.perf_counter()
    result = _core.merge_search_shards(graph, spec_json, config_json, [o[0] for o in outs], wall)
    return result, _summary(outs, counts, wall, time.perf_counter() - t1)


def _summary(
    outs: list[tuple[str, str, int]], counts: dict[int, int], wall: float, merge_s: float
) -> dict[str, Any]:
    """The report's ``distribution`` entry."""
    runs = []
    for i, (text, node, pid) in enumerate(outs):
        doc = json.loads(text)
        runs.append(
            ShardRun(
                index=i,
                elapsed_s=float(doc["elapsed_s"]),
                enumerate_s=float(doc["enumerate_s"]),
                realise_s=float(doc["realise_s"]),
                attempts=int(counts.get(i, 1)),
                node=node,
                pid=pid,
                skeletons=len(doc["skeletons"]),
                stop=str(doc["stop"]),
            )
        )
    times = [r.elapsed_s for r in runs]
    total = sum(times)
    return {
        "executor": "ray",
        "shards": [r.to_dict() for r in runs],
        "wall_s": wall,
        "merge_s": merge_s,
        "longest_share": max(times) / total if total > 0 else 0.0,
        "projected_speedup": {str(n): projected_speedup(times, n, merge_s) for n in (2, 4, 8, 16)},
        "stragglers": _stragglers(times),
        "retried": [r.index for r in runs if r.attempts > 1],
    }
