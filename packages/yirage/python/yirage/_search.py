"""``yirage.search``: the superoptimizer's search, with its disk cache.

The search itself is Rust (``yirage._core.search``, see ``crates/yirage-core/src/search``):
it runs with the GIL released, Ctrl-C raises ``KeyboardInterrupt`` within a second, and the
optional progress callback receives a dict of counters every 50 ms. This module resolves the
backend to a DeviceSpec, builds the options, and caches results on disk:

* cache entry ``<cache root>/v1/search/<key>.json`` (``yirage._cache``: root from
  ``YIRAGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/yirage``, else ``~/.cache/yirage``);
* the key hashes the named parts ``graph_hash``, ``core_version``, ``fingerprint_scheme``,
  ``search_config`` (every option that changes the result, and the DeviceSpec) and
  ``backend``;
* writes are atomic and serialised by a per-entry lock file; a corrupt entry is reported
  with a warning and rebuilt; a second identical call is answered from the entry
  (``report.cache_hit``) in well under 0.1 s.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from yirage import _cache, _core, _env
from yirage._errors import BackendUnavailableError, ConfigError
from yirage._graph import KernelGraph

__all__ = [
    "PRESETS",
    "Candidate",
    "KernelPlan",
    "PlanKernel",
    "SearchReport",
    "SearchResult",
    "device_spec_json",
    "search",
]

_log = logging.getLogger("yirage.search")

#: Presets accepted by ``config=``: they narrow the space for a workload family (the
#: defaults find every family without one).
PRESETS = ("attention", "mlp", "lora")

_CACHE_FORMAT = "yirage.search_cache"
#: 2: candidates whose unshifted exp feeds a generated kernel are no longer offered.
#: 3: the enumeration deepens by kernel count and cuts mixed dims (it finds forms that 2 missed).
#: 4: the last of the top-k goes to another family of fused kernels when one is close.
#: 5: a loop matmul fused into its accumulator takes no block memory (wider prefill tiles fit).
#: 6: GPU loops over dims like 3000 also walk power-of-two tiles (24 x 128 rather than 8 x 375).
_CACHE_VERSION = 6
#: Fused candidates verified (and, in ``superoptimize``, built, checked and raced) by default:
#: the leading family's four tilings and one slot the last rule of the verification gives to
#: another close family (the model errs most between families; see the core's
#: ``held_for_other_family``).
DEFAULT_TOP_K = 5
#: States the enumeration explores by default (``max_states``): see the core's
#: ``DEFAULT_MAX_STATES`` for why a count and why this one.
DEFAULT_MAX_STATES = 500_000
#: Optional link figures of the core's spec (collective costs); power stays in Python.
_LINK_FIELDS = ("link_bandwidth_gbps", "link_latency_us")
#: Optional cache sizes of a CPU (the core's CPU cost terms).
_CACHE_FIELDS = ("l1d_bytes", "l3_bytes")
_SPEC_FIELDS = (
    "compute_units",
    "warp_size",
    "max_threads_per_block",
    "shared_mem_per_block",
    "l2_bytes",
    "mem_bandwidth_gbps",
    "peak_tflops_fp16",
    "peak_tflops_fp32",
    "matrix_tile",
    "vendor",
)
_GPU_VENDORS = ("cuda", "rocm", "mps", "ascend", "tpu")


# -- KernelPlan ---------------------------------------------------------------------------------


class PlanKernel(Mapping[str, Any]):
    """One kernel of a :class:`KernelPlan` (a read-only mapping of its JSON fields)."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self._doc = dict(doc)

    def __getitem__(self, key: str) -> Any:
        return self._doc[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc)

    def __len__(self) -> int:
        return len(self._doc)

    @property
    def kind(self) -> str:
        """``"generated"`` or ``"library"``."""
        return str(self._doc["kind"])

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._doc))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        what = self._doc.get("name") if self.kind == "generated" else self._doc.get("op")
        return f"PlanKernel({self.kind} {what})"


class KernelPlan:
    """A KernelPlan (format ``yirage.kernel_plan`` v1, see ``docs/kernel-plan.md``): the
    vendor-neutral schedule a backend's code generator prints."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._doc: dict[str, Any] = json.loads(text)

    @property
    def kernels(self) -> list[PlanKernel]:
        return [PlanKernel(k) for k in self._doc["kernels"]]

    @property
    def buffers(self) -> list[dict[str, Any]]:
        return [dict(b) for b in self._doc["buffers"]]

    @property
    def graph_hash(self) -> str:
        return str(self._doc["graph_hash"])

    def to_json(self) -> str:
        """Canonical JSON text (as produced by the core)."""
        return self._text

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self._text)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        kinds = [k.kind for k in self.kernels]
        return f"KernelPlan({len(kinds)} kernels: {', '.join(kinds)})"


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchReport:
    """What the search did. ``str(report)`` is a readable summary.

    ``stop_reason`` is ``exhausted``, ``time_limit`` (the time limit left candidates
    unenumerated or unverified; a note counts the latter), ``state_limit``,
    ``candidate_limit``, ``verify_limit`` (``verify_work_limit`` left candidates unverified,
    or ``max_verify`` tests ran with fewer than ``top_k`` verified; a note says which),
    ``cancelled`` or ``no_candidates: <why>``."""

    states_explored: int = 0
    states_pruned: int = 0
    fingerprint_tests: int = 0
    verified: int = 0
    rejected: int = 0
    elapsed_s: float = 0.0
    enumerate_s: float = 0.0
    verify_s: float = 0.0
    threads: int = 0
    stop_reason: str = ""
    candidates_found: int = 0
    concretisations: int = 0
    smem_rejected: int = 0
    block_programs: int = 0
    egraph_nodes: int = 0
    egraph_classes: int = 0
    pruning: bool = True
    deterministic: bool = False
    cache_hit: bool = False
    notes: tuple[str, ...] = ()
    backend: str = ""
    device_spec: str = ""
    #: ``executor="ray"``: per-shard runs, stragglers, retried shards, the longest shard's
    #: share of the shards' total time (see ``yirage._distributed``); None for a local search.
    distribution: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **extra: Any) -> SearchReport:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw.update(extra)
        if "notes" in kw:
            kw["notes"] = tuple(kw["notes"])
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["notes"] = list(self.notes)
        return d

    def __str__(self) -> str:
        src = " (from the disk cache)" if self.cache_hit else ""
        lines = [
            f"search {self.stop_reason} after {self.elapsed_s:.2f} s ({self.enumerate_s:.2f} s "
            f"enumerating, {self.verify_s:.2f} s verifying) on {self.threads} threads{src}, "
            f"backend {self.backend or '?'}, pruning {'on' if self.pruning else 'off'}",
            f"  states explored {self.states_explored}, pruned by abstract expressions "
            f"{self.states_pruned}, block programs {self.block_programs}, concretisations "
            f"{self.concretisations} ({self.smem_rejected} over shared memory)",
            f"  candidates {self.candidates_found}, fingerprint tests {self.fingerprint_tests}, "
            f"verified {self.verified}, rejected {self.rejected}; e-graph {self.egraph_nodes} "
            f"nodes / {self.egraph_classes} classes",
        ]
        if self.distribution is not None:
            d = self.distribution
            lines.append(
                f"  ray: {len(d['shards'])} shards in {d['wall_s']:.2f} s, longest shard "
                f"{d['longest_share']:.0%} of the shards' time, stragglers {d['stragglers']}, "
                f"retried {d['retried']}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class Candidate:
    """A verified µGraph: ``graph`` (a :class:`yirage.KernelGraph`), ``predicted_us`` (cost
    model), ``hash``, ``label`` (its structure), ``baseline`` (True for the original graph
    as library kernels) and :meth:`kernel_plan`."""

    def __init__(
        self,
        graph: KernelGraph,
        predicted_us: float,
        hash: str,
        label: str,
        baseline: bool,
        spec_json: str,
    ) -> None:
        self.graph = graph
        self.predicted_us = float(predicted_us)
        self.hash = hash
        self.label = label
        self.baseline = bool(baseline)
        self._spec_json = spec_json
        self._plan: KernelPlan | None = None

    def kernel_plan(self) -> KernelPlan:
        """The KernelPlan of this candidate, validated against the search's DeviceSpec."""
        if self._plan is None:
            self._plan = KernelPlan(_core.kernel_plan(self.graph._g, self._spec_json))
        return self._plan

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph._g.to_json(),
            "predicted_us": self.predicted_us,
            "hash": self.hash,
            "label": self.label,
            "baseline": self.baseline,
        }

    def __repr__(self) -> str:
        return f"Candidate({self.predicted_us:.2f} us, {self.label})"


@dataclass(frozen=True)
class SearchResult:
    """Candidates (verified, best predicted first; the baseline is always among them) and
    the report."""

    candidates: list[Candidate]
    report: SearchReport
    device_spec: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def __repr__(self) -> str:
        return f"SearchResult({len(self.candidates)} candidates, {self.report.stop_reason})"


# -- DeviceSpec ---------------------------------------------------------------------------------


def _as_dict(spec: Any) -> dict[str, Any]:
    if isinstance(spec, str):
        try:
            d = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"device_spec is not valid JSON: {exc}") from exc
    elif isinstance(spec, Mapping):
        d = dict(spec)
    elif hasattr(spec, "to_dict"):
        d = dict(spec.to_dict())
    else:
        raise ConfigError(
            "device_spec must be a DeviceSpec, a mapping or a JSON string, got "
            f"{type(spec).__name__}"
        )
    if not isinstance(d, dict):
        raise ConfigError("device_spec JSON must be an object")
    return d


def device_spec_json(spec: Any, backend: str | None = None) -> tuple[str, list[str]]:
    """The core's DeviceSpec JSON for ``spec`` (a ``yirage.DeviceSpec``, mapping or JSON)
    and the notes on figures that were missing and filled with estimates.

    ``vendor`` becomes the backend name (``cpu``, ``cuda``, …) when given; the core reads
    ``execution_model`` instead, deriving it from that name only for specs without one."""
    d = _as_dict(spec)
    out: dict[str, Any] = {k: d.get(k) for k in _SPEC_FIELDS}
    for key in ("launch_overhead_us", "execution_model", "tiling", *_LINK_FIELDS, *_CACHE_FIELDS):
        if d.get(key) is not None:
            out[key] = d[key]
    vendor = (backend or out.get("vendor") or "unknown").lower()
    out["vendor"] = vendor
    if "execution_model" in out:
        cpu = out["execution_model"] == "cpu"
    else:
        cpu = vendor == "cpu" or (out.get("warp_size") in (None, 1) and vendor not in _GPU_VENDORS)
    cores = int(out.get("compute_units") or os.cpu_count() or 1)
    lanes = max(1, int(d.get("simd_width_bits") or 256) // 32)
    defaults: dict[str, Any]
    if cpu:
        peak = cores * lanes * 2 * 2 * 3.0e9 / 1e12  # 2 FMA units, 3 GHz
        defaults = {
            "compute_units": cores,
            "warp_size": 1,
            "max_threads_per_block": 1,
            "shared_mem_per_block": 32 * 1024,
            "l2_bytes": 1024 * 1024,
            "mem_bandwidth_gbps": float(min(200, 10 * cores)),
            "peak_tflops_fp16": peak,
            "peak_tflops_fp32": peak,
        }
    else:
        defaults = {
            "compute_units": 64,
            "warp_size": 32,
            "max_threads_per_block": 1024,
            "shared_mem_per_block": 48 * 1024,
            "l2_bytes": 4 * 1024 * 1024,
            "mem_bandwidth_gbps": 500.0,
            "peak_tflops_fp16": 50.0,
            "peak_tflops_fp32": 10.0,
        }
    notes = []
    for k, v in defaults.items():
        if out.get(k) is None:
            out[k] = v
            notes.append(f"device spec: {k} unknown, estimated as {v:g}")
    if out.get("matrix_tile") is not None:
        out["matrix_tile"] = [int(x) for x in out["matrix_tile"]]
    try:
        return _core.device_spec_json(json.dumps(out)), notes
    except _core.SerializationError as exc:
        raise ConfigError(str(exc)) from exc


def _backend_spec(backend: Any) -> tuple[str, Any]:
    """(backend name, DeviceSpec) of a backend given by name or object."""
    if hasattr(backend, "device_spec") and hasattr(backend, "name"):
        return str(backend.name), backend.device_spec()
    name = str(backend).lower()
    try:
        from yirage._registry import get_backend_info
    except ImportError as exc:  # pragma: no cover - the registry ships with yirage
        raise ConfigError("no backend registry: pass device_spec= explicitly") from exc
    info = get_backend_info(name)
    if info.device_spec is None:
        raise BackendUnavailableError(
            name,
            f"{info.reason or 'no DeviceSpec'}; pass device_spec= (a DeviceSpec or JSON) to "
            "search for this device without it",
        )
    return name, info.device_spec


# -- options and cache --------------------------------------------------------------------------


def _options(
    config: Any,
    time_limit: float | None,
    max_states: int | None,
    threads: int | None,
    seed: int,
    deterministic: bool,
    top_k: int,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if config is not None:
        if isinstance(config, str):
            if config not in PRESETS:
                raise ConfigError(
                    f"unknown search preset {config!r}; expected one of {', '.join(PRESETS)}"
                )
            opts["preset"] = config
        elif isinstance(config, Mapping):
            opts.update(config)
        else:
            raise ConfigError(
                f"config must be a preset name or a mapping of search options, got "
                f"{type(config).__name__}"
            )
    opts.update(extra)
    opts.update(
        time_limit_s=None if time_limit is None else float(time_limit),
        max_states=max_states,
        threads=threads,
        seed=int(seed),
        deterministic=bool(deterministic),
        top_k=int(top_k),
    )
    return opts


def _canonical_options(opts: Mapping[str, Any]) -> str:
    try:
        return _core.search_config_json(json.dumps(dict(opts)))
    except (_core.SerializationError, _core.GraphError) as exc:
        raise ConfigError(str(exc)) from exc


def _cache_path(graph: KernelGraph, backend: str, spec_json: str, config_json: str) -> Any:
    cfg = json.loads(config_json)
    cfg.pop("threads", None)  # the thread count does not change the result
    parts = {
        "graph_hash": graph._g.hash(),
        "core_version": str(_core.__version__),
        "fingerprint_scheme": _core.FINGERPRINT_SCHEME,
        "search_config": json.dumps({"config": cfg, "device_spec": spec_json}, sort_keys=True),
        "backend": backend,
    }
    return _cache.entry_path("search", parts, ".json")


def _from_cache(entry: Mapping[str, Any], spec_json: str, path: Any) -> SearchResult | None:
    t0 = time.perf_counter()
    try:
        if entry.get("format") != _CACHE_FORMAT or entry.get("version") != _CACHE_VERSION:
            raise ValueError("unknown cache format")
        cands = []
        for c in entry["candidates"]:
            g = KernelGraph._wrap(_core.KernelGraph.from_json(c["graph"]))
            if g._g.hash() != c["hash"]:
                raise ValueError("graph hash mismatch")
            cands.append(
                Candidate(g, c["predicted_us"], c["hash"], c["label"], c["baseline"], spec_json)
            )
        if not cands:
            raise ValueError("no candidates")
        rep = dict(entry["report"])
    except Exception as exc:
        _log.warning("yirage cache: corrupt search entry %s (%s); rebuilding it", path, exc)
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    report = SearchReport.from_dict(
        rep, cache_hit=True, elapsed_s=time.perf_counter() - t0, device_spec=spec_json
    )
    return SearchResult(cands, report, spec_json)


class _Progress:
    """Prints a one-line progress display on stderr (``progress=True``)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, c: Mapping[str, Any]) -> None:
        now = time.monotonic()
        if now - self.last < 0.25:
            return
        self.last = now
        sys.stderr.write(
            f"\ryirage search {c['elapsed_s']:6.1f}s  states {c['states_explored']:>10}  "
            f"pruned {c['states_pruned']:>10}  candidates {c['candidates_found']:>6}  "
            f"verified {c['verified']}/{c['fingerprint_tests']}"
        )
        sys.stderr.flush()


# -- the entry point ----------------------------------------------------------------------------


def search(
    graph: KernelGraph,
    backend: Any = None,
    config: str | Mapping[str, Any] | None = None,
    time_limit: float | None = 60,
    max_states: int | None = DEFAULT_MAX_STATES,
    threads: int | None = None,
    seed: int = 0,
    deterministic: bool = False,
    progress: bool | Callable[[dict[str, Any]], object] = False,
    top_k: int = DEFAULT_TOP_K,
    *,
    device_spec: Any = None,
    device: str | None = None,
    cache: bool = True,
    executor: str = "local",
    **options: Any,
) -> SearchResult:
    """Search µGraphs equivalent to ``graph`` for a device; return verified candidates, best
    predicted first (the original graph as library kernels is always among them, labelled).

    ``backend``: a backend name or Backend object whose DeviceSpec shapes the search
    (default ``"cpu"``), or pass ``device_spec=`` — a ``yirage.DeviceSpec``, mapping or JSON —
    to search for a device that is not present (its ``vendor`` then names the backend unless
    ``backend`` is given), or ``device=`` a chip of the registry (``"MI300X"``, ``"H100"``;
    see :mod:`yirage.devices`), whose notes then say the ranking is the cost model's alone.
    ``config``: a preset (``"attention"``, ``"mlp"``, ``"lora"``) or a
    mapping of search options; further options (``max_kernel_ops``, ``max_block_ops``,
    ``max_candidates``, ``prune``, ``trials``, ``verify_work_limit`` …) may be given as
    keywords. ``verify_work_limit`` (default 6·10⁹ units, about 2 s on a 16-core host;
    ``None``: no limit) bounds the work of large fingerprint checks: a check that would pass
    it is not started and ``stop_reason`` is ``verify_limit`` (docs/api.md, "Verification
    budget"). ``threads``
    defaults to ``YIRAGE_THREADS`` (else all cores). ``progress``: True for a progress line
    on stderr, or a callable receiving a dict of counters every 50 ms. ``cache=False``
    bypasses the disk cache. Ctrl-C cancels the search (``KeyboardInterrupt``).
    ``executor="ray"`` runs the search as shards on a Ray cluster (``YIRAGE_RAY_ADDRESS``,
    else a local one; needs ``pip install 'yirage[ray]'``) and verifies on this side; the
    report's ``distribution`` has the per-shard times."""
    if device is not None:  # a registry chip, searched as its device_spec
        from yirage.devices import _search_for_device

        return _search_for_device(search, dict(locals()))
    if not isinstance(graph, KernelGraph):
        raise TypeError(f"search() takes a yirage.KernelGraph, got {type(graph).__name__}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ConfigError(f"top_k must be a positive int, got {top_k!r}")
    if executor not in ("local", "ray"):
        raise ConfigError(f"executor must be 'local' or 'ray', got {executor!r}")
    if executor == "ray" and progress is not False:
        raise ConfigError("progress is not reported with executor='ray'; pass progress=False")
    if time_limit is not None and not time_limit >= 0:
        raise ConfigError(f"time_limit must be ≥ 0 seconds or None, got {time_limit!r}")
    work_limit = options.get("verify_work_limit")
    if work_limit is not None and (
        isinstance(work_limit, bool) or not isinstance(work_limit, int) or work_limit < 0
    ):
        raise ConfigError(
            f"verify_work_limit must be an int ≥ 0 (units of check work) or None (no limit), "
            f"got {work_limit!r}"
        )
    if device_spec is not None:
        name = str(backend).lower() if isinstance(backend, str) else getattr(backend, "name", None)
        spec_json, notes = device_spec_json(device_spec, name)
    else:
        name, spec = _backend_spec("cpu" if backend is None else backend)
        spec_json, notes = device_spec_json(spec, name)
    if threads is None:
        threads = _env.threads()
    opts = _options(config, time_limit, max_states, threads, seed, deterministic, top_k, options)
    config_json = _canonical_options(opts)
    backend_name = json.loads(spec_json)["vendor"]
    callback: Callable[[dict[str, Any]], object] | None
    if progress is True:
        callback = _Progress()
    elif callable(progress):
        callback = progress
    else:
        callback = None
    if not cache:
        return _run(
            graph, spec_json, config_json, callback, progress is True, backend_name, notes, executor
        )
    path = _cache_path(graph, backend_name, spec_json, config_json)
    # The lock is held across the search so a concurrent identical search waits and then
    # reads the entry instead of searching again.
    with _cache.locked(path):
        entry = _cache.read_json(path)
        if entry is not None:
            hit = _from_cache(entry, spec_json, path)
            if hit is not None:
                return hit
        result = _run(
            graph, spec_json, config_json, callback, progress is True, backend_name, notes, executor
        )
        if result.report.stop_reason != "cancelled":
            entry_doc = {
                "format": _CACHE_FORMAT,
                "version": _CACHE_VERSION,
                "device_spec": spec_json,
                "report": result.report.to_dict(),
                "candidates": [c.to_dict() for c in result.candidates],
            }
            try:
                _cache.write_json(path, entry_doc)
            except OSError as exc:
                _log.warning("yirage cache: could not write %s (%s)", path, exc)
    return result


def _run(
    graph: KernelGraph,
    spec_json: str,
    config_json: str,
    callback: Callable[[dict[str, Any]], object] | None,
    line: bool,
    backend_name: str,
    notes: list[str],
    executor: str = "local",
) -> SearchResult:
    distribution = None
    try:
        if executor == "ray":
            from . import _distributed

            raw, distribution = _distributed.run_sharded(graph._g, spec_json, config_json)
            notes = notes + [
                f"shard {s['index']} was retried by Ray after its worker died ({s['attempts']} "
                "attempts)"
                for s in distribution["shards"]
                if s["attempts"] > 1
            ]
        else:
            raw = _core.search(graph._g, spec_json, config_json, callback)
    finally:
        if line:
            sys.stderr.write("\n")
    rep = json.loads(raw.report_json)
    rep["notes"] = list(rep.get("notes", [])) + notes
    report = SearchReport.from_dict(
        rep, backend=backend_name, device_spec=spec_json, distribution=distribution
    )
    cands = [
        Candidate(
            KernelGraph._wrap(c.graph), c.predicted_us, c.hash, c.label, c.baseline, spec_json
        )
        for c in raw.candidates
    ]
    return SearchResult(cands, report, spec_json)
