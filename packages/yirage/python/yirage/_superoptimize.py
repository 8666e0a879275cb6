"""``superoptimize``: search → lower → codegen → compile → load → numeric check → profile →
pick the fastest passing candidate. Vendor-neutral: every backend goes through this.

Nothing falls back silently. A candidate that fails to print, compile or load, or whose
numbers disagree with the float64 reference evaluator (NaN never passes), is reported and
dropped; when none passes, :class:`SuperoptimizeError` lists why. The report records the
backend, its toolchain and the chosen candidate — including when that is the unfused
library baseline.

Warm path: the decision (chosen plan + report) is cached on disk under the graph hash, the
backend and its version, the DeviceSpec (and the one the search was pinned to, if any), the
core version and the search options. A warm call re-prints the plan, finds the compiled code
in the cache and re-runs the numeric check, but skips search and profiling
(``report.from_cache``). Pass ``cache=False`` to redo it all. A decision whose profiling was
noisy (a candidate's best round not reproduced: other load on the device) is not cached
unless the caller passes ``cache_noisy=True``: a loaded machine must not fix a choice that a
quiet one would make differently.

Shapes: candidates are built for the graph's equal-rank form (numpy rank promotion made
explicit, see ``yirage._kernel.Shapes``); check inputs are drawn in the graph's shapes and
viewed in the kernel's. Multi-device graphs (``world_size`` N > 1): every candidate is checked
by running all N ranks in this process (``yirage._collectives.run_ranks``) against the
reference evaluator's N ranks, and profiled on rank 0's inputs with the collective replaced by
a local stand-in (every candidate makes the same all_reduce library calls).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from yirage import _cache, _collectives, _stress
from yirage._backend import Backend
from yirage._errors import BackendUnavailableError, GraphError, YirageError
from yirage._graph import KernelGraph
from yirage._kernel import (
    CandidateReport,
    OptimizedKernel,
    Shapes,
    SuperoptimizeReport,
    arrays_to_backend,
    check_arrays,
    check_input_generator,
    check_tensors,
    reference_outputs,
    run_check,
    to_backend_tensors,
    to_numpy32,
    tolerance_for,
)
from yirage._logging import get_logger

__all__ = ["SuperoptimizeError", "resolve_backend", "superoptimize"]

_log = get_logger("yirage.superoptimize")
DECISION_VERSION = "8"
#: Interleaved profiling rounds per candidate (``profile_options={"rounds": n}``).
PROFILE_ROUNDS = 8


class SuperoptimizeError(YirageError):
    """No candidate passed codegen, compilation and the numeric check; ``report`` says why."""

    def __init__(self, message: str, report: SuperoptimizeReport) -> None:
        super().__init__(message)
        self.report = report


_K = TypeVar("_K")


def resolve_backend(backend: str | Backend | None) -> Backend:
    """A Backend object: the given one, the named one, or the best available one that has a
    code generator (a backend that only probes its hardware cannot superoptimize)."""
    from yirage import _registry

    if isinstance(backend, Backend):
        return backend
    if backend is None:
        names = _registry.get_available_backends()
        usable = [n for n in names if _registry.get_backend_info(n).codegen_implemented]
        if not usable:
            found = f" ({', '.join(names)} found, without a code generator yet)" if names else ""
            raise BackendUnavailableError(
                "any",
                f"no backend with a code generator is available{found}: "
                'pip install "yirage[cpu]" (from a checkout: pip install ./packages/yirage-cpu) '
                "and a C compiler, or see `yirage doctor`",
            )
        skipped = names[: names.index(usable[0])]
        if skipped:
            _log.info("using %s: %s has no code generator yet", usable[0], ", ".join(skipped))
        backend = usable[0]
    name = str(backend).lower()
    be = _registry._get_backend(name)
    if not _registry.is_backend_available(name):  # the registry caches the probe
        raise BackendUnavailableError(name, _registry.get_backend_info(name).reason)
    return be


# -- the search (yirage.search) ------------------------------------------------------------


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


def _search(
    graph: KernelGraph, backend: Backend, config: Any, options: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    from yirage import _search

    kwargs = dict(options)
    if config is not None:
        kwargs["config"] = config
    result: Any = _search.search(graph, backend=backend, **kwargs)
    cands = list(getattr(result, "candidates", result))
    return cands, _report_dict(getattr(result, "report", None))


# -- the decision cache ------------------------------------------------------------------------


def _decision_path(
    graph: KernelGraph,
    be: Backend,
    spec_json: str,
    pinned_json: str,
    top_k: int,
    config: Any,
    options: dict[str, Any],
) -> Any:
    from yirage import __version__, _core

    parts = {
        "graph": graph.hash(),
        "backend": be.name,
        "backend_version": be.package_version,
        "device": spec_json,
        "searched_for": pinned_json,
        "core": _core.__version__,
        "yirage": __version__,
        "top_k": str(top_k),
        "config": repr(config),
        "options": json.dumps(options, sort_keys=True, default=repr),
        "decision": DECISION_VERSION,
    }
    return _cache.entry_path("superoptimize", parts, ".json")


def _toolchain(be: Backend) -> dict[str, str]:
    try:
        return {str(k): str(v) for k, v in be.toolchain().items()}
    except BackendUnavailableError:
        raise
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _median_us(result: Any) -> float:
    for attr in ("median_us",):
        v = getattr(result, attr, None)
        if v is not None:
            return float(v)
    if isinstance(result, Mapping) and "median_us" in result:
        return float(result["median_us"])
    return float(result)


# -- superoptimize -----------------------------------------------------------------------------


def superoptimize(
    graph: KernelGraph,
    backend: str | Backend | None = None,
    config: Any = None,
    top_k: int = 4,
    check: bool = True,
    *,
    cache: bool = True,
    cache_noisy: bool = False,
    device_spec: Any = None,
    profile_options: Mapping[str, Any] | None = None,
    **search_options: Any,
) -> OptimizedKernel:
    """Superoptimize ``graph`` on ``backend`` and return the fastest candidate that passes
    the numeric check, as an :class:`~yirage.OptimizedKernel` (call it on tensors; its
    ``report`` says what was tried, measured and chosen).

    Steps: search (:func:`yirage.search`) → KernelPlan → codegen → compile → numeric check
    against the float64 reference evaluator → profiling of the passing candidates and the
    unfused library baseline → the fastest one.

    Args:
        graph: the kernel graph; it needs at least one output (``mark_output``).
        backend: a backend name (``"cpu"``, ``"cuda"`` …), a :class:`~yirage.Backend`, or
            None for the best available backend that has a code generator.
        config: what to search: a preset (``"attention"``, ``"mlp"``, ``"lora"``: they
            narrow the space for a workload family) or a mapping of search options; passed
            to :func:`yirage.search` as its ``config``.
        top_k: how many fused candidates (best predicted first) are built, checked and
            profiled; the library baseline is always profiled too.
        check: run the numeric check (fresh random inputs; relative Frobenius error ≤ 1e-4
            for float32, 1e-2 float16, 2e-2 bfloat16). Without it a wrong kernel can win.
        cache: use the on-disk decision cache (``YIRAGE_CACHE_DIR``): a warm call with the
            same graph, backend, device, versions and options skips search and profiling,
            re-builds the cached plan and re-runs the numeric check
            (``report.from_cache``). ``cache=False`` neither reads nor writes the decision,
            so every candidate is profiled again (the search's own cache and compiled code
            are still reused).
        cache_noisy: also cache a decision whose profiling was noisy (a candidate's best
            round was not reproduced, e.g. other load on the device). By default such a
            decision is returned but not cached, so the next call profiles again; the
            report's notes say which happened.
        device_spec: search for this DeviceSpec (a :class:`~yirage.DeviceSpec`, a mapping
            or JSON, as :func:`yirage.search` takes) instead of the backend's live one, so
            what the search finds does not depend on the host (tests pin it). The
            candidates are still built, checked and timed on the backend's device, and
            code is printed for that device; the spec is part of the decision cache key.
        profile_options: go to the backend's ``profile`` (e.g. ``min_time_s``;
            ``rounds`` sets the number of interleaved profiling turns, default
            ``PROFILE_ROUNDS``). Each candidate's time is its best turn's median, so load
            from other processes hits every candidate alike; candidates far behind after
            ``PRUNE_AFTER_ROUNDS`` turns are dropped from the race.
        **search_options: further :func:`yirage.search` options (``time_limit``,
            ``max_states``, ``threads``, ``seed``, ``deterministic``, ``max_kernel_ops`` …).

    Raises:
        GraphError: the graph has no outputs.
        BackendUnavailableError: the backend is not installed or cannot run here (the
            message names the fix, e.g. the package or compiler to install).
        ConfigError: an unknown preset or search option, or an unusable ``device_spec``.
        SuperoptimizeError: the search found no candidate, or none passed codegen,
            compilation and the numeric check; its ``report`` lists each one's error.
        KeyboardInterrupt: Ctrl-C (the search stops within a second).
    """
    if not isinstance(graph, KernelGraph):
        raise TypeError(f"superoptimize() takes a yirage.KernelGraph, got {type(graph).__name__}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if not graph.outputs:
        raise GraphError(
            "the graph has no outputs, so there is nothing to superoptimize: "
            "call mark_output on the tensor(s) it should compute"
        )
    t_start = time.perf_counter()
    be = resolve_backend(backend)
    spec = be.device_spec()
    pinned_json, pinned_note = _pinned_spec(device_spec, be)
    toolchain = _toolchain(be)
    tol = tolerance_for(graph)
    shapes = Shapes(graph)
    ws = shapes.world_size
    seed = int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]
    report = SuperoptimizeReport(
        backend=be.name,
        backend_version=be.package_version,
        verification_level=str(be.verification_level),
        device=spec.name,
        toolchain=toolchain,
        tolerance=tol,
        check_seed=seed,
    )
    if pinned_note:
        report.notes.append(pinned_note)

    def reference_for(
        seed: int = seed, stored: list[np.ndarray] | None = None
    ) -> tuple[list[Any], list[Any]]:
        tensors = check_tensors(be, graph, shapes, seed)
        if stored is not None:
            if ws == 1:
                return tensors, stored
            n = len(shapes.kernel_out)
            return tensors, [stored[r * n : (r + 1) * n] for r in range(ws)]
        return tensors, reference_outputs(graph, shapes, tensors)

    decision = (
        _decision_path(graph, be, spec.to_json(), pinned_json, top_k, config, dict(search_options))
        if cache
        else None
    )
    if decision is not None:
        cached = _cache.read_json(decision)
        if cached is not None:
            kernel = _from_decision(
                decision, graph, be, cached, report, reference_for, check, t_start
            )
            if kernel is not None:
                return kernel

    # The check inputs are drawn on the device (milliseconds) or, where the backend cannot,
    # with numpy while the search runs; their float64 reference is evaluated while the
    # candidates build and compile (seconds for GQA decode at kv 16384): both release the GIL.
    # The backend's tensors are made here, on the caller's thread (and its device).
    on_device = be.check_input_generator() is not None
    arrays = None if on_device else _in_background(check_arrays, graph, shapes, seed)
    t0 = time.perf_counter()
    pin = {} if device_spec is None else {"device_spec": device_spec}
    candidates, search_report = _search(
        graph, be, config, {"top_k": top_k, **pin, **search_options}
    )
    report.search_s = time.perf_counter() - t0
    report.search = search_report
    if arrays is None:
        tensors = check_tensors(be, graph, shapes, seed)
    else:
        tensors = arrays_to_backend(be, graph, shapes, arrays.result())
    ref_future = _in_background(reference_outputs, graph, shapes, tensors) if check else None
    stress_future = (
        _in_background(_exp_stress_set, graph, shapes, tensors) if check and ws == 1 else None
    )
    to_build = _to_profile(candidates, top_k)
    for index, cand in enumerate(to_build):
        report.candidates.append(
            CandidateReport(
                index=index,
                hash=_cand_attr(cand, "hash", "graph_hash"),
                description=str(_cand_attr(cand, "label") or ""),
                predicted_us=_num(_cand_attr(cand, "predicted_us", "cost_us", "cost")),
            )
        )

    def build(index: int) -> tuple[int, dict[str, Any], Any, Any]:
        cr = report.candidates[index]
        plan = _plan_dict(to_build[index].kernel_plan())
        kernels, _ = _describe_plan(plan)
        cr.description = f"{cr.description} [{kernels}]" if cr.description else kernels
        cr.hash = cr.hash or plan.get("graph_hash")
        tc = time.perf_counter()
        source = be.codegen(plan)
        artifact = be.compile(source)
        launcher = be.load(artifact)
        cr.codegen_compile_s = time.perf_counter() - tc
        cr.cache_hit = getattr(artifact, "cache_hit", None)
        return index, plan, source, launcher

    # candidates are built side by side: toolchains (nvrtc, cc, Triton) run outside the GIL
    tc = time.perf_counter()
    built: list[tuple[int, dict[str, Any], Any, Any]] = []
    workers = max(1, min(len(to_build), os.cpu_count() or 1, 16))
    with ThreadPoolExecutor(workers, thread_name_prefix="yirage-build") as pool:
        futures = [pool.submit(build, i) for i in range(len(to_build))]
        for index, fut in enumerate(futures):
            try:
                built.append(fut.result())
            except BackendUnavailableError:
                raise  # no toolchain: every candidate would fail the same way
            except Exception as exc:
                cr = report.candidates[index]
                cr.status = "error"
                cr.error = f"{type(exc).__name__}: {exc}"
                _log.warning("candidate %d failed to build on %s: %s", index, be.name, cr.error)
    report.codegen_compile_s += time.perf_counter() - tc
    if built and ws == 1:
        # all candidates at once (e.g. Triton's JIT in a thread pool), before their first runs
        tc = time.perf_counter()
        try:
            be.precompile([b[3] for b in built], tensors)
        except Exception as exc:  # an optimisation only: the first runs compile what is left
            _log.warning("precompile on %s failed: %s", be.name, exc)
        report.codegen_compile_s += time.perf_counter() - tc
    tc = time.perf_counter()
    reference = ref_future.result() if ref_future is not None else []
    report.check_s += time.perf_counter() - tc  # what building and compiling did not hide
    passing: list[tuple[float, int, dict[str, Any], Any, Any]] = []
    for index, plan, source, launcher in built:
        cr = report.candidates[index]
        if check:
            tc = time.perf_counter()
            try:
                err = run_check(shapes, launcher, tensors, reference)
            except Exception as exc:
                cr.status = "error"
                cr.error = f"run failed: {type(exc).__name__}: {exc}"
                report.check_s += time.perf_counter() - tc
                continue
            report.check_s += time.perf_counter() - tc
            cr.max_rel_err = err if math.isfinite(err) else None
            if not err <= tol:
                cr.status = "rejected"
                cr.error = (
                    f"numeric check failed: max relative error {err:.3g} > {tol:g}"
                    if math.isfinite(err)
                    else "numeric check failed: non-finite output"
                )
                _log.warning("candidate %d on %s rejected: %s", index, be.name, cr.error)
                continue
        cr.status = "ok"
        passing.append((0.0, index, plan, source, launcher))
    if stress_future is not None:
        tc = time.perf_counter()
        baseline = {i for i, c in enumerate(to_build) if _is_baseline(c)}
        passing = _stress_check(be, graph, stress_future.result(), passing, baseline, report)
        report.check_s += time.perf_counter() - tc
    # Profile round-robin: every candidate gets `rounds` short turns, interleaved, and keeps
    # its best round's median, so bursts of load from other processes hit all alike.
    tp = time.perf_counter()
    spread: dict[int, list[float]] = {}
    popts = dict(profile_options or {})
    rounds = int(popts.pop("rounds", PROFILE_ROUNDS))
    popts.setdefault("min_time_s", 0.2 / rounds)
    popts.setdefault("min_repeats", max(1, 30 // rounds))
    # a multi-device kernel is timed on rank 0's inputs with a local stand-in collective
    timed = tensors if ws == 1 else tensors[0]

    def stand_in() -> contextlib.AbstractContextManager[Any]:
        return _collectives.bound(_collectives.StandIn(ws)) if ws > 1 else contextlib.nullcontext()

    if ws > 1:
        report.notes.append(
            f"the graph runs on {ws} ranks: every candidate was checked by running all ranks in "
            "this process; timings are one rank's with the all_reduce collective replaced by a "
            "local stand-in (no communication)"
        )
    pruned: set[int] = set()
    with be.profiling_session():
        for turn in range(max(1, rounds)):
            if turn >= PRUNE_AFTER_ROUNDS:
                pruned |= _out_of_the_race(report, [p[1] for p in passing])
            for _, index, _, _, launcher in passing:
                cr = report.candidates[index]
                if cr.status != "ok" or index in pruned:
                    continue
                try:
                    with stand_in():
                        us = _median_us(be.profile(launcher, timed, **popts))
                except Exception as exc:
                    cr.status = "error"
                    cr.error = f"profiling failed: {type(exc).__name__}: {exc}"
                    continue
                cr.measured_us = us if cr.measured_us is None else min(cr.measured_us, us)
                spread.setdefault(index, []).append(us)
    report.profile_s += time.perf_counter() - tp
    for _, index, _, _, launcher in passing:
        # backends with several code paths per plan (e.g. cuda: triton, triton_split, cuda)
        timings = getattr(launcher, "timings", None)
        if isinstance(timings, dict) and len(timings) > 1:
            times = ", ".join(f"{n} {t:.1f} µs" for n, t in sorted(timings.items()))
            report.candidates[index].description += f" (variant {launcher.variant}: {times})"
    noisy = _noisy({i: ts for i, ts in spread.items() if i not in pruned})
    if noisy:
        report.notes.append(_noisy_note(cache=decision is not None, cache_noisy=cache_noisy))
    passing = [
        (report.candidates[i].measured_us or math.inf, i, plan, source, launcher)
        for _, i, plan, source, launcher in passing
        if report.candidates[i].status == "ok"
    ]
    if not candidates:
        report.total_s = time.perf_counter() - t_start
        raise SuperoptimizeError(
            f"the search found no candidate for this graph on {be.name}\n{report}", report
        )
    if not passing:
        report.total_s = time.perf_counter() - t_start
        raise SuperoptimizeError(f"no candidate passed on {be.name}:\n{report}", report)
    passing.sort(key=lambda p: (p[0], p[1]))
    with stand_in():
        passing = _break_cold_ties(be, passing, timed, report)
    _, best_index, plan, source, launcher = passing[0]
    chosen = report.candidates[best_index]
    _choose(report, chosen, plan)
    report.total_s = time.perf_counter() - t_start
    if decision is not None and (cache_noisy or not noisy):
        with _cache.locked(decision):
            _cache.write_json(decision, {"plan": plan, "report": report.to_dict()})
            if check:
                flat = reference if ws == 1 else [a for rank in reference for a in rank]
                _save_reference(decision, seed, check_input_generator(be), flat)
    return OptimizedKernel(
        graph=graph, backend=be, plan=plan, source=source, launcher=launcher, report=report
    )


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


def pick_cold_tie(
    cold_us: Mapping[_K, float], warm_us: Callable[[_K], float | None]
) -> tuple[_K, dict[_K, float]]:
    """The key with the lowest cold-cache time, or, among the keys within ``COLD_TIE_RATIO``
    of it, the one ``warm_us`` (time with the inputs left in cache) finds fastest; with the
    warm times used (empty when nothing tied or ``warm_us`` gave None). Shared by
    ``superoptimize``'s choice between candidates and backends' choice between variants."""
    best = min(cold_us, key=lambda k: cold_us[k])
    tied = [k for k in cold_us if cold_us[k] <= COLD_TIE_RATIO * cold_us[best]]
    if len(tied) < 2:
        return best, {}
    warm: dict[_K, float] = {}
    for k in tied:
        us = warm_us(k)
        if us is None:
            return best, {}
        warm[k] = us
    return min(tied, key=lambda k: warm[k]), warm


def _break_cold_ties(
    be: Backend,
    passing: list[tuple[float, int, Any, Any, Any]],
    inputs: Any,
    report: SuperoptimizeReport,
) -> list[tuple[float, int, Any, Any, Any]]:
    """``passing`` (sorted by cold time) with :func:`pick_cold_tie`'s candidate first."""
    launchers = {p[1]: p[4] for p in passing}
    try:
        pick, warm = pick_cold_tie(
            {p[1]: p[0] for p in passing}, lambda i: be.warm_time_us(launchers[i], inputs)
        )
    except Exception as exc:  # a timing failure only forgoes the tie-break
        report.notes.append(f"warm timing failed, candidates ordered by cold time: {exc}")
        return passing
    if pick != passing[0][1]:
        report.notes.append(
            f"candidates {', '.join(str(i) for i in warm)} were within {COLD_TIE_RATIO:g}x of "
            f"each other with a cold cache; candidate {pick} was chosen as the fastest with "
            f"its inputs in cache ({warm[pick]:.1f} µs against {warm[passing[0][1]]:.1f} µs)"
        )
    return sorted(passing, key=lambda p: (p[1] != pick, p[0], p[1]))


def _exp_stress_set(graph: KernelGraph, shapes: Shapes, tensors: list[Any]) -> Any:
    """The exp-overflow stress set for ``graph`` (None when it has no exp to stress)."""
    arrays = [to_numpy32(t).reshape(u) for t, u in zip(tensors, shapes.user_in, strict=True)]
    return _stress.exp_stress(
        graph, shapes, arrays, lambda ins: reference_outputs(graph, shapes, ins)
    )


def _stress_check(
    be: Backend,
    graph: KernelGraph,
    stress: _stress.StressSet | None,
    passing: list[tuple[float, int, dict[str, Any], Any, Any]],
    baseline: set[int],
    report: SuperoptimizeReport,
) -> list[tuple[float, int, dict[str, Any], Any, Any]]:
    """``passing`` without the candidates that fail the stress set (see ``yirage._stress``).
    When the library baseline fails it too, the overflow is the graph's own in its dtype:
    the set is not enforced and the report says so."""
    if stress is None:
        return passing
    dtypes = [t.dtype.name for t in graph.outputs]
    tol = max(_stress.stress_tolerance(d) for d in dtypes)
    tensors = to_backend_tensors(be, stress.arrays, [t.dtype.name for t in graph.inputs])
    verdicts: dict[int, str | None] = {}
    for _, index, _, _, launcher in passing:
        try:
            err, why = _stress.stress_error(launcher(*tensors), stress.reference, dtypes)
        except Exception as exc:
            err, why = math.inf, f"run failed: {type(exc).__name__}: {exc}"
        if why is None and not err <= tol:
            why = f"max relative error {err:.3g} > {tol:g}"
        verdicts[index] = why
    failed_baseline = [verdicts[i] for i in baseline if verdicts.get(i)]
    if failed_baseline:
        report.notes.append(
            f"{stress.name}: the library baseline fails it too ({failed_baseline[0]}), so the "
            "overflow is the graph's own in its dtype; the stress check was not enforced"
        )
        return passing
    kept = []
    for entry in passing:
        why = verdicts[entry[1]]
        if why is None:
            kept.append(entry)
            continue
        cr = report.candidates[entry[1]]
        cr.status = "rejected"
        cr.error = f"stress check failed ({stress.name}): {why}"
        _log.warning("candidate %d on %s rejected: %s", entry[1], be.name, cr.error)
    report.notes.append(f"{stress.name}: checked every candidate against the float64 reference")
    return kept


def _in_background(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` on a thread of its own; the future re-raises its error."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="yirage-check")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


#: A candidate's best round counts as reproduced when another round is within this factor.
NOISE_TOLERANCE = 1.25
#: Candidates whose (cold-cache) times are within this factor of the best one are not told
#: apart by them (on the H100 one fused LoRA kernel's cold time ranged 16.5-17.7 µs over
#: runs); among those the backend's :meth:`~yirage.Backend.warm_time_us` decides, where it
#: has one: fused LoRA at b16 ran 19.3 and 19.5 µs cold in two forms, 14.5 and 9.9 µs with
#: its 32 MB weight in L2.
COLD_TIE_RATIO = 1.05
#: After this many profiling rounds, candidates slower than ``PRUNE_RATIO`` times the best so far
#: are not profiled further (they cannot win; cold superoptimize spent 4-5 s profiling).
PRUNE_AFTER_ROUNDS = 2
PRUNE_RATIO = 1.25


def _out_of_the_race(report: Any, indices: list[int]) -> set[int]:
    """Candidates among ``indices`` whose best time is over ``PRUNE_RATIO`` times the best one."""
    times = {
        i: report.candidates[i].measured_us
        for i in indices
        if report.candidates[i].status == "ok" and report.candidates[i].measured_us is not None
    }
    if not times:
        return set()
    best = min(times.values())
    return {i for i, t in times.items() if t > best * PRUNE_RATIO}


def _noisy(spread: Mapping[int, list[float]]) -> bool:
    """True when some candidate's best round was not reproduced by another round: its
    time (the best round's median) may then be inflated by load from other processes."""
    for rounds in spread.values():
        if len(rounds) < 2:
            continue
        best = min(rounds)
        if sum(1 for r in rounds if r <= best * NOISE_TOLERANCE) < 2:
            return True
    return False


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _choose(report: SuperoptimizeReport, chosen: CandidateReport, plan: Mapping[str, Any]) -> None:
    report.chosen_index = chosen.index
    report.chosen_hash = chosen.hash
    kernels, report.chosen_is_library_baseline = _describe_plan(plan)
    report.chosen_description = chosen.description or kernels
    report.max_rel_err = chosen.max_rel_err
    report.measured_us = chosen.measured_us
    report.predicted_us = chosen.predicted_us
    if report.chosen_is_library_baseline:
        report.notes.append(
            "the winner is the unfused library baseline: "
            "no fused candidate was faster on this device"
        )


def _reference_path(decision: Path) -> Path:
    return decision.with_name(decision.stem + ".ref.bin")


_REF_MAGIC = b"YRREF1\n"


def _save_reference(decision: Path, seed: int, generator: str, reference: list[np.ndarray]) -> None:
    """Keep the reference outputs of the cold run's check next to the decision, so a warm
    call re-checks the kernel on the same (regenerated) inputs without re-evaluating.

    Format: magic, one JSON header line (seed, input generator, output shapes), then the
    outputs as little-endian float64 — no dependence on numpy's file formats."""
    arrays = [np.ascontiguousarray(r, dtype="<f8") for r in reference]
    header = {
        "seed": int(seed),
        "generator": generator,
        "shapes": [list(a.shape) for a in arrays],
    }
    blob = _REF_MAGIC + json.dumps(header).encode() + b"\n" + b"".join(a.tobytes() for a in arrays)
    try:
        _cache.store_artifact(_reference_path(decision), blob)
    except OSError as exc:
        _log.warning("yirage cache: could not store the check reference (%s)", exc)


def _load_reference(
    decision: Path, generator: str, n_outputs: int
) -> tuple[int, list[np.ndarray]] | None:
    blob = _cache.load_verified_artifact(_reference_path(decision))
    if blob is None:  # missing, or damaged (reported and removed): evaluate afresh
        return None
    try:
        if not blob.startswith(_REF_MAGIC):
            raise ValueError("bad magic")
        line_end = blob.index(b"\n", len(_REF_MAGIC))
        header = json.loads(blob[len(_REF_MAGIC) : line_end])
        if header["generator"] != generator:
            return None  # made with another input generator: re-evaluate
        shapes = [tuple(int(d) for d in sh) for sh in header["shapes"]]
        if len(shapes) != n_outputs:
            raise ValueError(f"{len(shapes)} outputs stored, {n_outputs} expected")
        outs, pos = [], line_end + 1
        for shape in shapes:
            n = int(np.prod(shape, dtype=np.int64)) * 8
            if pos + n > len(blob):
                raise ValueError("truncated")
            outs.append(np.frombuffer(blob, dtype="<f8", count=n // 8, offset=pos).reshape(shape))
            pos += n
        if pos != len(blob):
            raise ValueError("trailing bytes")
        return int(header["seed"]), [o.astype(np.float64) for o in outs]
    except (ValueError, KeyError, TypeError) as exc:  # corrupt entry: evaluate afresh
        _log.warning("yirage cache: unreadable check reference (%s); re-evaluating", exc)
        return None


def _from_decision(
    decision: Path,
    graph: KernelGraph,
    be: Backend,
    cached: Mapping[str, Any],
    report: SuperoptimizeReport,
    reference_for: Any,
    check: bool,
    t_start: float,
) -> OptimizedKernel | None:
    """Rebuild the cached decision; None (redo everything) when it no longer works."""
    try:
        plan = dict(cached["plan"])
        old = SuperoptimizeReport.from_dict(cached["report"])
        tc = time.perf_counter()
        source = be.codegen(plan)
        launcher = be.load(be.compile(source))
        old.codegen_compile_s = time.perf_counter() - tc
        old.search_s = 0.0
        old.profile_s = 0.0
        old.check_s = 0.0
        if check:
            tk = time.perf_counter()
            n_out = len(graph.outputs) * graph.world_size
            stored = _load_reference(decision, check_input_generator(be), n_out)
            if stored is not None:  # the cold run's reference on regenerated inputs
                tensors, reference = reference_for(stored[0], stored[1])
                old.check_seed = stored[0]
            else:
                tensors, reference = reference_for()
                old.check_seed = report.check_seed
            err = run_check(Shapes(graph), launcher, tensors, reference)
            if stored is not None and not err <= report.tolerance:  # type: ignore[operator]
                # regenerated inputs that differ from the cold run's (a generator that is not
                # reproducible here) must not discard a good kernel: evaluate afresh
                _log.warning("stored check reference does not match (%.3g); re-evaluating", err)
                reference = reference_outputs(graph, Shapes(graph), tensors)
                err = run_check(Shapes(graph), launcher, tensors, reference)
            old.check_s = time.perf_counter() - tk
            if not err <= report.tolerance:  # type: ignore[operator]
                _log.warning("cached decision fails the numeric check (%.3g); searching again", err)
                return None
            old.max_rel_err = err
    except BackendUnavailableError:
        raise
    except Exception as exc:
        _log.warning(
            "cached superoptimize decision unusable (%s: %s); searching again",
            type(exc).__name__,
            exc,
        )
        return None
    old.from_cache = True
    old.toolchain = report.toolchain
    old.total_s = time.perf_counter() - t_start
    return OptimizedKernel(
        graph=graph, backend=be, plan=plan, source=source, launcher=launcher, report=old
    )
