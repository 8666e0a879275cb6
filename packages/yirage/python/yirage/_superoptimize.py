"""``superoptimize``: search → build → check → race → choose → persist, one named stage
function each. Vendor-neutral: every backend goes through this.

- **search** (:func:`search_stage`): :func:`yirage.search` finds the candidates; the first
  ``top_k`` fused ones and the unfused library baseline go on.
- **build** (:func:`build_stage`): each candidate's KernelPlan is printed, compiled and
  loaded (side by side: toolchains run outside the GIL); every variant the backend printed for
  the plan (:meth:`~yirage.Backend.variants`) is a *contender* of its own. Precompile gets
  every variant.
- **check** (:func:`check_stage`, then :func:`_stress_check`): every contender against the
  float64 reference evaluator at the documented tolerance (``yirage._check``), then on the
  stress sets (``yirage._stress``). NaN never passes.
- **race** (:func:`race_stage`): the passing contenders are timed once, together
  (``yirage._race``: screen, interleaved rounds, pruning).
- **choose** (:func:`choose`): the fastest, cold-cache ties broken by the warm time.
- **persist** (:func:`persist`): the decision (plan, variant name, report) and the check
  reference go into the decision cache (``yirage._decision``).

Nothing falls back silently. A contender that fails to print, compile, load, run, or whose
numbers disagree with the reference, is reported (under its candidate, per variant) and
dropped; when none is left, :class:`SuperoptimizeError` lists why. The report records the
backend, its toolchain and the chosen candidate and variant — including when that is the
unfused library baseline.

Warm path: a cached decision is re-built (the plan printed and compiled again, the cached
variant taken from :meth:`~yirage.Backend.variants`) and re-checked, skipping search and the
race (``report.from_cache``). Pass ``cache=False`` to redo it all. A decision whose profiling
was noisy (a contender's best round not reproduced: other load on the device) is not cached
unless the caller passes ``cache_noisy=True``: a loaded machine must not fix a choice that a
quiet one would make differently.

Multi-device graphs (``world_size`` N > 1): every contender is checked by running all N ranks
in this process against the reference evaluator's N ranks, and timed on rank 0's inputs with
the collective replaced by a local stand-in (every candidate makes the same all_reduce calls).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from yirage import (
    _collectives,
    _compare_torch,
    _decision,
    _race,
    _reference_torch,
    _search,
    _spread,
    _stress,
)
from yirage._backend import Backend
from yirage._check import (
    arrays_to_backend,
    check_arrays,
    check_failure,
    check_input_generator,
    check_tensors,
    new_check_seed,
    reference_outputs,
    run_check,
    to_backend_tensors,
    to_numpy32,
    tolerance_for,
)
from yirage._errors import BackendUnavailableError, ConfigError, GraphError, YirageError
from yirage._graph import KernelGraph, _register_superoptimizer
from yirage._kernel import OptimizedKernel
from yirage._logging import get_logger
from yirage._race import (
    Contender,
    Key,
    RaceResult,
    _noisy,
    build_contenders,
    contender_key,
    label,
    variants_of,
)
from yirage._registry import resolve_backend
from yirage._report import CandidateReport, SuperoptimizeReport
from yirage._shapes import Shapes

__all__ = [
    "SuperoptimizeError",
    "build_stage",
    "check_stage",
    "choose",
    "persist",
    "race_stage",
    "resolve_backend",
    "search_stage",
    "superoptimize",
]

_log = get_logger("yirage.superoptimize")


class SuperoptimizeError(YirageError):
    """No contender passed codegen, compilation, the checks and profiling; ``report`` says
    why."""

    def __init__(self, message: str, report: SuperoptimizeReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class _Run:
    """One ``superoptimize`` call: what every stage reads, the report they fill in, and each
    contender's check error."""

    graph: KernelGraph
    be: Backend
    shapes: Shapes
    report: SuperoptimizeReport
    seed: int
    check: bool
    t_start: float
    #: the device's DeviceSpec and the one the search is pinned to ("" when none), as JSON
    spec_json: str = ""
    pinned_json: str = ""
    errs: dict[Key, float] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.shapes.world_size

    def stand_in(self) -> contextlib.AbstractContextManager[Any]:
        """A multi-device kernel's collective replaced by a local stand-in (for timing)."""
        return _collectives.stand_in(self.world_size)

    def fail(self, message: str) -> SuperoptimizeError:
        self.report.total_s = time.perf_counter() - self.t_start
        return SuperoptimizeError(f"{message}\n{self.report}", self.report)


# -- superoptimize -----------------------------------------------------------------------------


def superoptimize(
    graph: KernelGraph,
    backend: str | Backend | None = None,
    config: Any = None,
    top_k: int = _search.DEFAULT_TOP_K,
    check: bool = True,
    *,
    cache: bool = True,
    cache_noisy: bool = False,
    device_spec: Any = None,
    check_seed: int | None = None,
    profile_options: Mapping[str, Any] | None = None,
    **search_options: Any,
) -> OptimizedKernel:
    """Superoptimize ``graph`` on ``backend`` and return the fastest candidate that passes
    the numeric check, as an :class:`~yirage.OptimizedKernel` (call it on tensors; its
    ``report`` says what was tried, measured and chosen).

    Stages: search (:func:`yirage.search`) → build (KernelPlan → codegen → compile → load,
    and every variant the backend printed for the plan, :meth:`~yirage.Backend.variants`)
    → check (every contender, i.e. every variant of every candidate, against the float64
    reference evaluator, then the stress sets) → race (the passing contenders and the
    unfused library baseline's, timed once, together) → choose (the fastest) → persist
    (the decision cache).

    Args:
        graph: the kernel graph; it needs at least one output (``mark_output``).
        backend: a backend name (``"cpu"``, ``"cuda"`` …), a :class:`~yirage.Backend`, or
            None for the best available backend that has a code generator.
        config: what to search: a preset (``"attention"``, ``"mlp"``, ``"lora"``: they
            narrow the space for a workload family) or a mapping of search options; passed
            to :func:`yirage.search` as its ``config``.
        top_k: how many fused candidates (best predicted first) are built, checked and
            profiled, each with every variant its backend offers; the library baseline is
            always profiled too.
        check: run the numeric check (fresh random inputs; relative Frobenius error ≤ 1e-4
            for float32, 1e-2 float16, 2e-2 bfloat16). Without it a wrong kernel can win.
        cache: use the on-disk decision cache (``YIRAGE_CACHE_DIR``): a warm call with the
            same graph, backend, device, versions and options skips search and profiling,
            re-builds the cached plan, takes the cached variant and re-runs the numeric
            check (``report.from_cache``); an entry whose variant the backend no longer
            offers is stale: everything is redone and the notes say so. ``cache=False``
            neither reads nor writes the decision, so every candidate is profiled again
            (the search's own cache and compiled code are still reused).
        cache_noisy: also cache a decision whose profiling was noisy (a candidate's best
            round was not reproduced, e.g. other load on the device). By default such a
            decision is returned but not cached, so the next call profiles again; the
            report's notes say which happened.
        device_spec: search for this DeviceSpec (a :class:`~yirage.DeviceSpec`, a mapping
            or JSON, as :func:`yirage.search` takes) instead of the backend's live one, so
            what the search finds does not depend on the host (tests pin it). The
            candidates are still built, checked and timed on the backend's device, and
            code is printed for that device; the spec is part of the decision cache key.
            ``device="MI300X"`` (a :mod:`yirage.devices` name) stands for that chip's spec.
        check_seed: the seed of the check and stress inputs (a non-negative int); fresh
            by default. The report prints it, so a candidate rejected on one draw can be
            rejected again: pass the printed seed back with ``cache=False``.
        profile_options: go to the backend's ``profile`` (e.g. ``min_time_s``;
            ``rounds`` sets the number of interleaved profiling turns, default
            ``PROFILE_ROUNDS``). Each contender's time is its best turn's median, so load
            from other processes hits every contender alike; where a backend offers several
            variants a cheap screening turn first drops those over ``SCREEN_FACTOR`` times
            the fastest, and contenders far behind after ``PRUNE_AFTER_ROUNDS`` turns are
            dropped from the race (see ``yirage._race``).
        **search_options: further :func:`yirage.search` options (``time_limit``,
            ``max_states``, ``threads``, ``seed``, ``deterministic``, ``max_kernel_ops``,
            ``executor="ray"`` for a search sharded over a Ray cluster …).

    Raises:
        GraphError: the graph has no outputs.
        BackendUnavailableError: the backend is not installed or cannot run here (the
            message names the fix, e.g. the package or compiler to install).
        ConfigError: an unknown preset or search option, or an unusable ``device_spec``.
        SuperoptimizeError: the search found no candidate, or no contender passed codegen,
            compilation, the numeric check and profiling; its ``report`` lists each one's
            error.
        KeyboardInterrupt: Ctrl-C (the search stops within a second).
    """
    _validate(graph, top_k)
    device = search_options.pop("device", None)
    if device is not None:  # a registry chip (yirage.devices): its spec, as device_spec=
        from yirage.devices import get_device_spec

        if device_spec is not None:
            raise ConfigError("superoptimize: pass device= or device_spec=, not both")
        device_spec = get_device_spec(str(device))
    t_start = time.perf_counter()
    run = _start(graph, resolve_backend(backend), check, device_spec, check_seed, t_start)
    decision = (
        _decision.decision_path(
            graph, run.be, run.spec_json, run.pinned_json, top_k, config, dict(search_options)
        )
        if cache
        else None
    )
    if decision is not None:
        cached = _decision.read(decision)
        if cached is not None:
            kernel, why = _from_decision(run, decision, cached)
            if kernel is not None:
                return kernel
            run.report.notes.append(why)

    # The check inputs are drawn on the device (milliseconds) or, where the backend cannot,
    # with numpy while the search runs; their float64 reference is evaluated while the
    # candidates build and compile (seconds for GQA decode at kv 16384): both release the GIL.
    # The backend's tensors are made here, on the caller's thread (and its device).
    be, shapes, seed = run.be, run.shapes, run.seed
    pool = _spread.pool_for(be, by_name=not isinstance(backend, Backend))  # starts meanwhile
    arrays = (
        None
        if be.check_input_generator() is not None
        else _in_background(check_arrays, graph, shapes, seed)
    )
    pin = {} if device_spec is None else {"device_spec": device_spec}
    candidates = search_stage(run, config, {"top_k": top_k, **pin, **search_options})
    if not candidates:
        raise run.fail(f"the search found no candidate for this graph on {be.name}")
    if arrays is None:
        tensors = check_tensors(be, graph, shapes, seed)
    else:
        tensors = arrays_to_backend(be, graph, shapes, arrays.result())
    ref_future = _in_background(reference_outputs, graph, shapes, tensors) if check else None
    stress_future = (
        _in_background(_stress_sets, graph, shapes, tensors, seed)
        if check and run.world_size == 1
        else None
    )
    to_build = _to_profile(candidates, top_k)
    report_candidates(run, to_build)
    baseline = {i for i, c in enumerate(to_build) if _is_baseline(c)}
    contenders: list[Contender] = []
    passing: list[Contender] = []
    for tier in _tiers(run, pool, to_build, baseline, profile_options):
        built = build_stage(run, to_build, tensors, tier)
        contenders += built
        tc = time.perf_counter()
        reference = ref_future.result() if ref_future is not None else []
        run.report.check_s += time.perf_counter() - tc  # what building did not hide
        passing = check_stage(run, built, tensors, reference)
        if stress_future is not None:
            tc = time.perf_counter()
            for stress in stress_future.result():
                passing = _stress_check(be, graph, stress, passing, baseline, run.report)
            run.report.check_s += time.perf_counter() - tc
        if passing:
            break
    if not passing:
        _settle(run, contenders, RaceResult(), None)
        raise run.fail(f"no candidate passed on {be.name}:")
    ranked, result = race_stage(run, passing, tensors, profile_options)
    if not ranked:
        _settle(run, contenders, result, None)
        raise run.fail(f"no candidate passed on {be.name}:")
    noisy = _noisy(result.spread_in_race())
    if noisy:
        run.report.notes.append(_noisy_note(cache=decision is not None, cache_noisy=cache_noisy))
    winner = choose(run, contenders, ranked, result, tensors)
    run.report.total_s = time.perf_counter() - run.t_start
    if decision is not None and (cache_noisy or not noisy):
        persist(run, decision, winner, reference)
    return OptimizedKernel(
        graph=graph,
        backend=be,
        plan=winner.plan,
        source=winner.source,
        launcher=winner.launcher,
        report=run.report,
    )


def _validate(graph: Any, top_k: Any) -> None:
    if not isinstance(graph, KernelGraph):
        raise TypeError(f"superoptimize() takes a yirage.KernelGraph, got {type(graph).__name__}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if not graph.outputs:
        raise GraphError(
            "the graph has no outputs, so there is nothing to superoptimize: "
            "call mark_output on the tensor(s) it should compute"
        )


def _start(
    graph: KernelGraph,
    be: Backend,
    check: bool,
    device_spec: Any,
    check_seed: int | None,
    t_start: float,
) -> _Run:
    """The run's fixed parts and its empty report (an unusable ``device_spec`` or
    ``check_seed`` raises ConfigError here, before anything is built)."""
    if check_seed is not None and (
        isinstance(check_seed, bool) or not isinstance(check_seed, int) or check_seed < 0
    ):
        raise ConfigError(
            f"superoptimize: check_seed must be a non-negative int (the seed a report "
            f"prints), got {check_seed!r}"
        )
    pinned_json, pinned_note = _pinned_spec(device_spec, be)
    spec = be.device_spec()
    report = SuperoptimizeReport(
        backend=be.name,
        backend_version=be.package_version,
        verification_level=str(be.verification_level),
        device=spec.name,
        toolchain=_toolchain(be),
        tolerance=tolerance_for(graph),
        check_seed=new_check_seed() if check_seed is None else check_seed,
    )
    if pinned_note:
        report.notes.append(pinned_note)
    assert report.check_seed is not None
    return _Run(
        graph,
        be,
        Shapes(graph),
        report,
        report.check_seed,
        check,
        t_start,
        spec.to_json(),
        pinned_json,
    )


# -- search ------------------------------------------------------------------------------------


def search_stage(run: _Run, config: Any, options: dict[str, Any]) -> list[Any]:
    """The search's candidates (the report records its own report and time)."""
    t0 = time.perf_counter()
    kwargs = dict(options)
    if config is not None:
        kwargs["config"] = config
    result: Any = _search.search(run.graph, backend=run.be, **kwargs)
    run.report.search_s = time.perf_counter() - t0
    run.report.search = _report_dict(getattr(result, "report", None))
    return list(getattr(result, "candidates", result))


def _plan_dict(plan: Any) -> dict[str, Any]:
    if isinstance(plan, Mapping):
        return dict(plan)
    if isinstance(plan, (str, bytes)):
        return dict(json.loads(plan))
    return dict(json.loads(plan.to_json()))


def _cand_attr(cand: Any, *names: str) -> Any:
    for n in names:
        v = getattr(cand, n, None)
        if callable(v):
            with contextlib.suppress(Exception):
                v = v()
        if v is not None:
            return v
    return None


def _is_baseline(cand: Any) -> bool:
    return bool(getattr(cand, "baseline", False))


def _to_profile(candidates: list[Any], top_k: int) -> list[Any]:
    """The first ``top_k`` fused candidates plus the library baseline (always measured, so
    the report says whether fusion paid off on this device). The search already drops
    candidates that differ from a kept one only in how an op is spelled."""
    fused = [c for c in candidates if not _is_baseline(c)][:top_k]
    return fused + [c for c in candidates if _is_baseline(c)]


def _describe_plan(plan: Mapping[str, Any]) -> tuple[str, bool]:
    kernels = plan.get("kernels", [])
    gen = sum(1 for k in kernels if k.get("kind") == "generated")
    lib = [k.get("op", "?") for k in kernels if k.get("kind") == "library"]
    if gen == 0:
        return f"unfused library baseline ({', '.join(lib) or 'no kernels'})", True
    parts = [f"{gen} generated kernel{'s' if gen != 1 else ''}"]
    if lib:
        parts.append(f"{len(lib)} library ({', '.join(lib)})")
    return " + ".join(parts), False


def _report_dict(report: Any) -> dict[str, Any]:
    if report is None:
        return {}
    if isinstance(report, Mapping):
        return dict(report)
    for attr in ("to_dict", "as_dict"):
        fn = getattr(report, attr, None)
        if callable(fn):
            return dict(fn())
    if hasattr(report, "__dict__"):
        return {k: v for k, v in vars(report).items() if not k.startswith("_")}
    return {"report": str(report)}


# -- build -------------------------------------------------------------------------------------


def report_candidates(run: _Run, to_build: list[Any]) -> None:
    """One report entry per candidate to build, in ``to_build``'s order."""
    for index, cand in enumerate(to_build):
        run.report.candidates.append(
            CandidateReport(
                index=index,
                hash=_cand_attr(cand, "hash", "graph_hash"),
                description=str(_cand_attr(cand, "label") or ""),
                predicted_us=_num(_cand_attr(cand, "predicted_us", "cost_us", "cost")),
            )
        )


def _tiers(
    run: _Run,
    pool: _spread.WorkerPool | None,
    to_build: list[Any],
    baseline: set[int],
    profile_options: Mapping[str, Any] | None,
) -> list[list[int]]:
    """The candidate indices to build and check, in turns: all at once, or, where worker
    processes compiled and profiled them first (``yirage._spread``), the finalists and then
    the rest (built and checked only when every finalist fails)."""
    everything = list(range(len(to_build)))
    if pool is None or len(to_build) < 2:
        return [everything]
    tp = time.perf_counter()
    plans = [(i, _plan_dict(c.kernel_plan())) for i, c in enumerate(to_build)]
    tw = time.perf_counter()
    try:
        results = pool.run(
            run.graph.to_json(), run.seed, _spread.split(plans, len(pool)), _opts(profile_options)
        )
    except Exception as exc:  # a lost worker: everything is redone here, never in part
        _spread.drop_pool(pool)
        run.report.notes.append(
            f"the profiling workers failed ({type(exc).__name__}: {exc}); every candidate was "
            "compiled and profiled in this process instead"
        )
        return [everything]
    run.report.profile_s += time.perf_counter() - tp
    run.report.profiled_on = [r.device for r in results]
    run.report.notes.append(_spread.describe(results, time.perf_counter() - tw))
    for r in results:
        for index, why in r.build_errors.items():
            cr = run.report.candidates[index]
            cr.status, cr.error = "error", why
    first = _spread.finalists(results, baseline)
    slower = [
        i for i in everything if i not in first and run.report.candidates[i].status != "error"
    ]
    for i in slower:
        times = [us for r in results for (j, _), us in r.best_us.items() if j == i]
        cr = run.report.candidates[i]
        cr.status = "slower"
        cr.measured_us = min(times) if times else None
        cr.error = (
            "not a finalist: over the race's pruning ratio of the fastest time in the "
            "profiling workers; built and checked only if every finalist fails"
        )
    return [first, slower] if slower else [first]


def _opts(profile_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if profile_options is None else dict(profile_options)


def build_stage(
    run: _Run, to_build: list[Any], tensors: list[Any], indices: Sequence[int] | None = None
) -> list[Contender]:
    """Every variant of the candidates of ``to_build`` at ``indices`` (default: all), built
    side by side (toolchains such as nvrtc, cc and Triton run outside the GIL), then
    precompiled together. A candidate that fails to build is reported and dropped; no
    toolchain at all raises."""
    report, be = run.report, run.be
    todo = list(range(len(to_build))) if indices is None else list(indices)
    tc = time.perf_counter()
    contenders: list[Contender] = []
    workers = max(1, min(len(todo), os.cpu_count() or 1, 16))
    with ThreadPoolExecutor(workers, thread_name_prefix="yirage-build") as pool:
        futures = {i: pool.submit(_build, run, i, to_build[i]) for i in todo}
        for index, fut in futures.items():
            try:
                contenders += fut.result()
            except BackendUnavailableError:
                raise  # no toolchain: every candidate would fail the same way
            except Exception as exc:
                cr = report.candidates[index]
                cr.status = "error"
                cr.error = f"{type(exc).__name__}: {exc}"
                _log.warning("candidate %d failed to build on %s: %s", index, be.name, cr.error)
    report.codegen_compile_s += time.perf_counter() - tc
    if contenders and run.world_size == 1:
        # every variant at once (e.g. Triton's JIT in a thread pool), before their first runs
        tc = time.perf_counter()
        try:
            be.precompile([c.launcher for c in contenders], tensors)
        except Exception as exc:  # an optimisation only: the first runs compile what is left
            _log.warning("precompile on %s failed: %s", be.name, exc)
        report.codegen_compile_s += time.perf_counter() - tc
    return contenders


def _build(run: _Run, index: int, cand: Any) -> list[Contender]:
    """Print, compile and load one candidate; its contenders, one per variant."""
    cr = run.report.candidates[index]
    plan = _plan_dict(cand.kernel_plan())
    kernels, _ = _describe_plan(plan)
    cr.description = f"{cr.description} [{kernels}]" if cr.description else kernels
    cr.hash = cr.hash or plan.get("graph_hash")
    tc = time.perf_counter()
    contenders, artifact = build_contenders(run.be, index, plan)
    cr.codegen_compile_s = time.perf_counter() - tc
    cr.cache_hit = getattr(artifact, "cache_hit", None)
    return contenders


# -- check -------------------------------------------------------------------------------------


def check_stage(
    run: _Run, contenders: list[Contender], tensors: list[Any], reference: list[Any]
) -> list[Contender]:
    """The contenders whose outputs match the float64 reference within the tolerance; the
    others are reported under their candidate (per variant) and dropped."""
    report = run.report
    alive = {c.key for c in contenders}
    passing = []
    if run.check and run.world_size == 1:  # compared where the outputs are: once per tier
        reference = _compare_torch.to_device(reference, tensors)
    for c in contenders:
        cr = report.candidates[c.candidate]
        if run.check:
            tc = time.perf_counter()
            try:
                err = run_check(run.shapes, c.launcher, tensors, reference)
            except Exception as exc:
                _drop(report, c.key, "error", f"run failed: {type(exc).__name__}: {exc}", alive)
                continue
            finally:
                report.check_s += time.perf_counter() - tc
            run.errs[c.key] = err
            if cr.status != "ok":  # the first passing variant's, else the last failure's
                cr.max_rel_err = err if math.isfinite(err) else None
            why = check_failure(err, report.tolerance or 0.0)
            if why is not None:
                _drop(report, c.key, "rejected", why, alive)
                continue
        cr.status = "ok"
        passing.append(c)
    return passing


def _drop(report: SuperoptimizeReport, key: Key, status: str, why: str, alive: set[Key]) -> None:
    """Contender ``key`` leaves the race: recorded under its candidate's variants, and as the
    candidate's status and error when it was the candidate's last one in ``alive``."""
    alive.discard(key)
    cr = report.candidates[key[0]]
    cr.dropped_variants[key[1]] = why
    if not any(k[0] == key[0] for k in alive):
        cr.status, cr.error = status, why
    _log.warning("%s on %s dropped: %s", label(key), report.backend, why)


def _stress_sets(
    graph: KernelGraph, shapes: Shapes, tensors: list[Any], seed: int
) -> list[_stress.StressSet]:
    """The stress sets for ``graph``: exp overflow (when it has an exp to stress) and the
    dtype's extremes, built from the check inputs."""
    arrays = [to_numpy32(t).reshape(u) for t, u in zip(tensors, shapes.user_in, strict=True)]
    device = _reference_torch.device_of(tensors)  # the references run there (a GPU) or on CPU

    def reference(ins: list[np.ndarray]) -> list[np.ndarray]:
        return reference_outputs(graph, shapes, ins, device)

    exp = _stress.exp_stress(graph, shapes, arrays, reference, device)
    extremes = _stress.extremes_stress(graph, shapes, arrays, reference, seed, device)
    sets = [extremes] if exp is None else [exp, extremes]
    dtypes = [t.dtype.name for t in graph.outputs]
    for s in sets:  # here, in the background, not while the check waits (a second at 16M)
        s.rounded = _stress.rounded_reference(s.reference, dtypes)
    return sets


def _finite(outputs: Sequence[Any]) -> np.ndarray:
    """Where ``outputs`` (numpy arrays or torch tensors, anywhere) are finite, flattened into
    one host array."""
    parts = []
    for o in outputs:
        if _compare_torch.is_torch_tensor(o):
            import torch

            parts.append(torch.isfinite(o).reshape(-1).cpu().numpy())
        else:
            parts.append(np.isfinite(np.asarray(o)).reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _worse_printings(finite: Mapping[Key, np.ndarray], reference: np.ndarray) -> dict[Key, str]:
    """Printings of the library baseline that give NaN/Inf on a stress set where the rounded
    reference and another printing of it are finite wherever they are (e.g. 16-bit
    intermediates overflowing where float32 ones do not), with the reason. Such a set is not
    enforced when every printing fails it, but a printing finite on fewer elements than its
    sibling still loses values the graph gives; the most finite printing always stays."""
    out: dict[Key, str] = {}
    for key, mine in finite.items():
        for other, theirs in finite.items():
            lost = int(np.count_nonzero(reference & theirs & ~mine))
            if other != key and lost and not np.any(reference & mine & ~theirs):
                out[key] = (
                    f"output: {lost} elements are NaN/Inf where the float64 reference and the "
                    f"baseline's {other[1]} printing are finite"
                )
                break
    return out


def _stress_check(
    be: Backend,
    graph: KernelGraph,
    stress: _stress.StressSet | None,
    passing: Sequence[Sequence[Any]],
    baseline: set[int],
    report: SuperoptimizeReport,
) -> list[Any]:
    """``passing`` (contenders, see ``yirage._race.Contender``) without those that fail the
    stress set (see ``yirage._stress``). When every contender of the library baseline fails
    it too, the graph itself does not keep these values in its dtype: the set is not enforced
    and the report says so, except that a printing of the baseline giving NaN/Inf where
    another printing of it is finite is dropped (:func:`_worse_printings`)."""
    if stress is None:
        return list(passing)
    dtypes = [t.dtype.name for t in graph.outputs]
    tol = max(_stress.stress_tolerance(d) for d in dtypes)
    tensors = to_backend_tensors(be, stress.arrays, [t.dtype.name for t in graph.inputs])
    # rounded once, not per contender; compared where the outputs are (a GPU) when they are
    if stress.rounded is None:
        stress.rounded = _stress.rounded_reference(stress.reference, dtypes)
    rounded = _compare_torch.to_device(stress.rounded, tensors)
    reference = _compare_torch.to_device(stress.reference, tensors)
    verdicts: dict[Key, str | None] = {}
    baseline_outputs: dict[Key, Any] = {}  # kept for _worse_printings, should it be needed
    ex = _stress.Exemptions(graph, stress, tol, tensors)
    for entry in passing:
        try:
            outputs = entry[4](*tensors)
            if contender_key(entry)[0] in baseline:
                baseline_outputs[contender_key(entry)] = outputs
            err, why = _stress.stress_error(outputs, reference, dtypes, edge=tol, rounded=rounded)
            for step in range(ex.STEPS if stress.perturbed is not None else 0):
                if why is None and (err <= tol or step == ex.STEPS - 1):
                    break  # (the last step only lets elements overflow)
                exempt, unbounded = ex.step(step)
                err, why = _stress.stress_error(
                    outputs,
                    reference,
                    dtypes,
                    edge=tol,
                    exempt=exempt,
                    rounded=rounded,
                    unbounded=unbounded,
                )
        except Exception as exc:
            err, why = math.inf, f"run failed: {type(exc).__name__}: {exc}"
        if why is None and not err <= tol:
            why = f"max relative error {err:.3g} > {tol:g}"
        verdicts[contender_key(entry)] = why
    if count := sum(int(np.count_nonzero(e)) for e in ex.exempt_host):
        report.notes.append(
            f"{stress.name}: {count} output elements are differences of terms too large for "
            "float32 to resolve to the tolerance (cancellation); they were checked for "
            "finiteness only"
        )
    if count := sum(int(np.count_nonzero(e)) for e in ex.unbounded_host):
        report.notes.append(
            f"{stress.name}: for {count} of those the float64 reference cannot tell whether "
            "they fit the output dtype (its own rounding of the cancelled sum times a large "
            "factor); they were not required to be finite"
        )
    failed_baseline = [why for (i, _), why in verdicts.items() if i in baseline]
    if failed_baseline and all(failed_baseline):
        report.notes.append(
            f"{stress.name}: the library baseline fails it too ({failed_baseline[0]}), so the "
            "graph itself does not keep these values in its dtype; this set was not enforced "
            "beyond the baseline's own printings"
        )
        finite = {key: _finite(outs) for key, outs in baseline_outputs.items()}
        worse = _worse_printings(finite, _finite(rounded))
        alive = set(verdicts)
        for key, why in worse.items():
            _drop(report, key, "rejected", f"stress check failed ({stress.name}): {why}", alive)
        return [e for e in passing if contender_key(e) not in worse]
    alive = set(verdicts)
    kept = []
    for entry in passing:
        why = verdicts[contender_key(entry)]
        if why is None:
            kept.append(entry)
        else:
            _drop(
                report,
                contender_key(entry),
                "rejected",
                f"stress check failed ({stress.name}): {why}",
                alive,
            )
    report.notes.append(f"{stress.name}: checked every contender against the float64 reference")
    return kept


# -- race and choice ---------------------------------------------------------------------------


def race_stage(
    run: _Run,
    passing: list[Contender],
    tensors: list[Any],
    profile_options: Mapping[str, Any] | None,
) -> tuple[list[Contender], RaceResult]:
    """Time the passing contenders once, together (``yirage._race``); the ones still in
    the race, fastest first, and what was measured."""
    if run.world_size > 1:
        run.report.notes.append(
            f"the graph runs on {run.world_size} ranks: every candidate was checked by running "
            "all ranks in this process; timings are one rank's with the all_reduce collective "
            "replaced by a local stand-in (no communication)"
        )
    tp = time.perf_counter()
    result = _race.race(
        run.be, passing, _timed_inputs(run, tensors), profile_options, stand_in=run.stand_in
    )
    run.report.profile_s += time.perf_counter() - tp
    alive = {c.key for c in passing}
    for key, why in result.failed.items():
        _drop(run.report, key, "error", why, alive)
    for (index, variant), why in result.screened.items():
        run.report.candidates[index].dropped_variants[variant] = why
    return result.ranked(passing), result


def _timed_inputs(run: _Run, tensors: list[Any]) -> list[Any]:
    """The inputs a contender is timed on: rank 0's for a multi-device kernel."""
    return tensors if run.world_size == 1 else tensors[0]


def choose(
    run: _Run,
    contenders: list[Contender],
    ranked: list[Contender],
    result: RaceResult,
    tensors: list[Any],
) -> Contender:
    """The winner: the fastest contender, or among those tied on cold-cache time the one
    fastest with its inputs in cache; library kernels unless a generated contender beats them
    by more than ``BASELINE_MARGIN`` (and, within ``BASELINE_WARM_WINDOW``, with its inputs in
    cache too; past it, by more than its warm loss). Fills in the report's per-candidate
    times and its choice."""
    inputs = _timed_inputs(run, tensors)
    with run.stand_in():
        ranked = _race.break_cold_ties(run.be, ranked, inputs, run.report.notes)

        def warm_us(c: Contender) -> float | None:
            return run.be.warm_time_us(c.launcher, inputs)

        ranked = _race.prefer_baseline(
            ranked, lambda c: _describe_plan(c.plan)[1], run.report.notes, warm_us
        )
    winner = ranked[0]
    _settle(run, contenders, result, winner)
    report = run.report
    chosen = report.candidates[winner.candidate]
    report.chosen_index = chosen.index
    report.chosen_hash = chosen.hash
    report.chosen_variant = winner.variant
    kernels, report.chosen_is_library_baseline = _describe_plan(winner.plan)
    report.chosen_description = chosen.description or kernels
    report.max_rel_err = run.errs.get(winner.key)
    report.measured_us = result.best_us[winner.key]
    report.predicted_us = chosen.predicted_us
    if report.chosen_is_library_baseline:
        report.notes.append(
            f"the winner runs library kernels only (variant {winner.variant!r}): "
            "no generated candidate was faster on this device"
        )
    return winner


def _settle(
    run: _Run, contenders: list[Contender], result: RaceResult, winner: Contender | None
) -> None:
    """Per candidate: its variants' times, its variant (the winner's for the winning
    candidate, else its fastest one that raced) with that variant's time and check error."""
    variants: dict[int, list[str]] = {}
    for c in contenders:
        variants.setdefault(c.candidate, []).append(c.variant)
    for index, names in variants.items():
        cr = run.report.candidates[index]
        timed = {n: result.best_us[(index, n)] for n in names if (index, n) in result.best_us}
        cr.variant_us = {n: t for n, t in timed.items() if (index, n) not in result.failed}
        racing = [n for n in cr.variant_us if (index, n) not in result.screened] or list(
            cr.variant_us
        )
        if winner is not None and winner.candidate == index:
            cr.variant = winner.variant
        elif racing:
            cr.variant = min(racing, key=lambda n: cr.variant_us[n])
        if cr.variant is not None and cr.variant in cr.variant_us:
            cr.measured_us = cr.variant_us[cr.variant]
            err = run.errs.get((index, cr.variant))
            cr.max_rel_err = err if err is not None and math.isfinite(err) else cr.max_rel_err
        if len(names) == 1 and cr.status != "ok":
            cr.dropped_variants = {}  # the error says it


# -- persist -----------------------------------------------------------------------------------


def persist(run: _Run, decision: Path, winner: Contender, reference: list[Any]) -> None:
    """The decision (the winner's plan and variant, the report) and, after a check, the
    check's float64 reference into the decision cache."""
    ref = None
    if run.check:
        flat = reference if run.world_size == 1 else [a for rank in reference for a in rank]
        ref = (run.seed, check_input_generator(run.be), flat)
    _decision.write(decision, winner.plan, winner.variant, run.report.to_dict(), ref)


# -- the warm path -----------------------------------------------------------------------------


def _from_decision(
    run: _Run, decision: Path, cached: Mapping[str, Any]
) -> tuple[OptimizedKernel | None, str]:
    """The cached decision rebuilt and re-checked; (None, why) when it no longer works, so
    everything is redone (the report's notes say why)."""
    be, graph = run.be, run.graph
    try:
        plan = dict(cached["plan"])
        name = str(cached["variant"])
        old = SuperoptimizeReport.from_dict(cached["report"])
        tc = time.perf_counter()
        source = be.codegen(plan)
        variants = variants_of(be, be.load(be.compile(source)))
        if name not in variants:
            why = (
                f"the cached decision's variant {name!r} is not among those {be.name} prints "
                f"for its plan now ({', '.join(variants)}): a stale entry, so everything was "
                "searched, checked and raced afresh"
            )
            _log.warning("%s", why)
            return None, why
        launcher = variants[name]
        old.codegen_compile_s = time.perf_counter() - tc
        old.search_s = old.profile_s = old.check_s = 0.0
        if run.check:
            tk = time.perf_counter()
            err = _warm_check(run, decision, launcher, old)
            old.check_s = time.perf_counter() - tk
            failure = check_failure(err, run.report.tolerance or 0.0)
            if failure is not None:
                _log.warning("cached decision fails the numeric check (%.3g); searching again", err)
                return None, f"the cached decision failed its re-check ({failure}): searched again"
            old.max_rel_err = err
    except BackendUnavailableError:
        raise
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        _log.warning("cached superoptimize decision unusable (%s); searching again", why)
        return None, f"the cached decision was unusable ({why}): searched again"
    old.from_cache = True
    old.toolchain = run.report.toolchain
    old.total_s = time.perf_counter() - run.t_start
    kernel = OptimizedKernel(
        graph=graph, backend=be, plan=plan, source=source, launcher=launcher, report=old
    )
    return kernel, ""


def _warm_check(run: _Run, decision: Path, launcher: Any, old: SuperoptimizeReport) -> float:
    """The cached kernel's check error: on the cold run's inputs (regenerated from its seed)
    against its stored reference where one is stored for this input generator, else on fresh
    inputs against a fresh reference."""
    graph, shapes = run.graph, run.shapes
    n_out = len(graph.outputs) * graph.world_size
    stored = _decision.load_reference(decision, check_input_generator(run.be), n_out)
    if stored is None:
        tensors = check_tensors(run.be, graph, shapes, run.seed)
        old.check_seed = run.seed
        return run_check(shapes, launcher, tensors, reference_outputs(graph, shapes, tensors))
    old.check_seed = stored[0]
    tensors = check_tensors(run.be, graph, shapes, stored[0])
    reference: list[Any] = stored[1]
    if run.world_size > 1:
        n = len(shapes.kernel_out)
        reference = [stored[1][r * n : (r + 1) * n] for r in range(run.world_size)]
    err = run_check(shapes, launcher, tensors, reference)
    if not err <= (run.report.tolerance or 0.0):
        # regenerated inputs that differ from the cold run's (a generator that is not
        # reproducible here) must not discard a good kernel: evaluate afresh
        _log.warning("stored check reference does not match (%.3g); re-evaluating", err)
        err = run_check(shapes, launcher, tensors, reference_outputs(graph, shapes, tensors))
    return err


# -- small helpers -----------------------------------------------------------------------------


def _pinned_spec(device_spec: Any, be: Backend) -> tuple[str, str]:
    """(canonical JSON, report note) of a DeviceSpec the search is pinned to; ("", "")
    without one. An unusable spec raises ConfigError here, before anything is built."""
    if device_spec is None:
        return "", ""
    from yirage._search import device_spec_json

    spec_json, _ = device_spec_json(device_spec, be.name)
    summary = device_spec.summary() if hasattr(device_spec, "summary") else spec_json
    return spec_json, (
        f"the search used the DeviceSpec given as device_spec= ({summary}), not this "
        f"device's; the candidates were built, checked and timed on {be.name}"
    )


def _noisy_note(*, cache: bool, cache_noisy: bool) -> str:
    """The report's note on noisy profiling, saying whether the decision was cached."""
    what = (
        "timings were noisy (a candidate's best profiling round was not reproduced: other "
        "load on the device?); "
    )
    if not cache:
        return what + "nothing was cached (cache=False)"
    if cache_noisy:
        return what + (
            "the decision was cached all the same (cache_noisy=True): call superoptimize "
            "with cache=False on a quieter device to profile again"
        )
    return what + (
        "the decision was not cached, so the next call profiles again; pass "
        "cache_noisy=True to cache it anyway"
    )


def _toolchain(be: Backend) -> dict[str, str]:
    try:
        return {str(k): str(v) for k, v in be.toolchain().items()}
    except BackendUnavailableError:
        raise
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _in_background(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` on a thread of its own; the future re-raises its error."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="yirage-check")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


_register_superoptimizer(superoptimize)
