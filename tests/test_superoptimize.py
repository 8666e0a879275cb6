"""superoptimize end to end on the CPU backend: search → plan → codegen → compile → run,
numeric check against the float64 reference evaluator, profiling, the decision cache,
save/load, and rejection of broken candidates.

Two layers: tests with a stand-in search (hand-written KernelPlans of docs/kernel-plan.md,
so the pipeline around the search is pinned down exactly), and tests through the real
``yirage.search`` for every bundled workload (``yirage._workloads``) at its CPU shape. The
latter pin the DeviceSpec they search for (``_pinned_spec.REFERENCE_CPU``): what the search
finds must not depend on the host.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr
from yirage import _race, _registry, _search, _superoptimize
from yirage._check import check_scale
from yirage._kernel import NumericCheckError, load_kernel
from yirage._superoptimize import SuperoptimizeError, superoptimize
from yirage._workloads import WORKLOADS, get_workload

PLAN_FILE = Path(__file__).parent / "cpu" / "plans" / "rmsnorm_matmul.json"
FAST_PROFILE = {"min_time_s": 0.01, "min_repeats": 5}

cpu_backend = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)
pytestmark = cpu_backend


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh cache per test."""
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _rms_graph(dtype: yr.DType = yr.float32) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 512), dtype)
    w = g.new_input((512, 768), dtype)
    g.mark_output(g.matmul(g.rms_norm(x, (512,), eps=1e-6), w))
    return g


def _fused_plan(dtype: str = "float32") -> dict[str, Any]:
    plan = json.loads(PLAN_FILE.read_text())
    for b in plan["buffers"]:
        b["dtype"] = dtype
    return plan


def _baseline_plan(dtype: str = "float32") -> dict[str, Any]:
    return {
        "format": "yirage.kernel_plan",
        "version": 3,
        "graph_hash": "baseline",
        "buffers": [
            {"id": 0, "dims": [8, 512], "dtype": dtype, "role": "input", "index": 0},
            {"id": 1, "dims": [512, 768], "dtype": dtype, "role": "input", "index": 1},
            {"id": 2, "dims": [8, 768], "dtype": dtype, "role": "output", "index": 0},
            {"id": 3, "dims": [8, 512], "dtype": "float32", "role": "intermediate"},
        ],
        "kernels": [
            {
                "kind": "library",
                "op": "rms_norm",
                "inputs": [0],
                "outputs": [3],
                "params": {"num_normalized_dims": 1, "eps": 1e-6, "has_weight": False},
            },
            {"kind": "library", "op": "matmul", "inputs": [3, 1], "outputs": [2], "params": {}},
        ],
    }


def _broken_plan() -> dict[str, Any]:
    plan = _fused_plan()
    plan["graph_hash"] = "broken"
    plan["kernels"][0]["ops"][5]["binop"] = "mul"  # multiplies by the rms instead of dividing
    return plan


class _Cand:
    def __init__(self, plan: dict[str, Any], predicted: float) -> None:
        self._plan = plan
        self.predicted_us = predicted
        self.hash = plan["graph_hash"]
        self.baseline = plan["graph_hash"] == "baseline"  # as the search marks its baseline

    def kernel_plan(self) -> Any:
        text = json.dumps(self._plan)
        return SimpleNamespace(to_json=lambda: text)


def _fake_search(monkeypatch: pytest.MonkeyPatch, plans: list[dict[str, Any]]) -> list[int]:
    """``yirage.search`` replaced by one that offers ``plans`` (best predicted first)."""
    calls: list[int] = []

    def search(graph: Any, backend: Any = None, **options: Any) -> Any:
        calls.append(1)
        return SimpleNamespace(
            candidates=[_Cand(p, 10.0 + i) for i, p in enumerate(plans)],
            report={"states_explored": 3, "stop_reason": "fake"},
        )

    monkeypatch.setattr(_search, "search", search)
    return calls


def _corrupt(code: str) -> str:
    """Make every generated matmul 1% too large (both the micro-kernel and the row path)."""
    code = re.sub(r"(yr_c[\d_]+ \+= yr_s[\d_]+) \* (yr_b[\d_]+);", r"\1 * \2 * 1.01f;", code)
    return code.replace("+= yr_a * yr_br[", "+= 1.01f * yr_a * yr_br[")


def _inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((8, 512), dtype=np.float32),
        rng.standard_normal((512, 768), dtype=np.float32) / 20,
    ]


def _rel(a: Any, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - b) / np.linalg.norm(b))


def _assert_the_choice_follows_the_race_rules(rep: Any, indices: tuple[int, ...]) -> None:
    """The fastest of ``indices`` was chosen, or a slower one within the race's tie factors
    (cold-cache tie, or library kernels kept against a fused kernel within the baseline
    margin) with a note that says why."""
    fastest = min(indices, key=lambda i: rep.candidates[i].measured_us)
    if rep.chosen_index == fastest:
        return
    ratio = rep.candidates[rep.chosen_index].measured_us / rep.candidates[fastest].measured_us
    assert ratio <= max(_race.BASELINE_MARGIN, _race.COLD_TIE_RATIO), ratio
    assert any("were kept" in n or "within" in n for n in rep.notes), rep.notes


# -- with a stand-in search --------------------------------------------------------------------


def test_broken_candidate_is_rejected_and_the_fastest_passing_one_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_search(monkeypatch, [_broken_plan(), _fused_plan(), _baseline_plan()])
    g = _rms_graph()
    k = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE)
    rep = k.report
    statuses = [c.status for c in rep.candidates]
    assert statuses[0] == "rejected" and "numeric check failed" in (rep.candidates[0].error or "")
    assert rep.candidates[0].max_rel_err is not None and rep.candidates[0].max_rel_err > 1e-4
    assert statuses[1:] == ["ok", "ok"]
    assert rep.chosen_index in (1, 2)
    _assert_the_choice_follows_the_race_rules(rep, (1, 2))
    assert rep.backend == "cpu" and rep.verification_level == "ran on hardware"
    assert "-fopenmp" in rep.toolchain["flags"] and rep.toolchain["compiler"]
    assert rep.search == {"states_explored": 3, "stop_reason": "fake"}
    assert rep.max_rel_err is not None and rep.max_rel_err <= 1e-4 and rep.tolerance == 1e-4
    assert k.backend == "cpu" and isinstance(k.plan, dict)
    x, w = _inputs()
    (ref,) = g.evaluate([x, w])
    (y,) = k(x, w)
    (y2,) = k(inputs=[x, w])
    np.testing.assert_array_equal(y, y2)
    assert _rel(y, ref) < 1e-5
    assert "candidate" in str(rep) and "rejected" in str(rep)


def test_check_data_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check inputs are drawn during the search and their float64 reference evaluated
    during the builds, on another thread; the backend's tensors are made on the caller's
    (a GPU's current device is per thread). An error there reaches the caller."""
    import threading

    _fake_search(monkeypatch, [_fused_plan()])
    threads: dict[str, str] = {}

    def spy(name: str, fn: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            threads[name] = threading.current_thread().name
            return fn(*args)

        monkeypatch.setattr(_superoptimize, name, wrapped)
        return wrapped

    for name in ("check_arrays", "arrays_to_backend", "reference_outputs"):
        spy(name, getattr(_superoptimize, name))
    k = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE, cache=False)
    assert k.report.max_rel_err is not None and k.report.max_rel_err <= 1e-4
    main = threading.current_thread().name
    assert threads["arrays_to_backend"] == main
    assert threads["check_arrays"] != main and threads["reference_outputs"] != main

    def broken(*args: Any) -> Any:
        raise ValueError("reference evaluator failed")

    monkeypatch.setattr(_superoptimize, "reference_outputs", broken)
    with pytest.raises(ValueError, match="reference evaluator failed"):
        superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE, cache=False)


def test_codegen_emitting_wrong_code_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from yirage_cpu._backend import CpuBackend

    original = CpuBackend.codegen

    def wrong(self: CpuBackend, plan: Any) -> Any:
        src = original(self, plan)
        return dataclasses.replace(src, code=_corrupt(src.code))

    monkeypatch.setattr(CpuBackend, "codegen", wrong)
    _fake_search(monkeypatch, [_fused_plan()])
    with pytest.raises(SuperoptimizeError, match="no candidate passed") as info:
        superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    (cand,) = info.value.report.candidates
    assert cand.status == "rejected" and cand.max_rel_err is not None and cand.max_rel_err > 1e-3


def _jittery_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiling whose best round is never reproduced (every round twice as slow)."""
    from yirage_cpu._backend import CpuBackend
    from yirage_cpu._runtime import ProfileResult

    calls_of: dict[int, int] = {}

    def jittery(self: CpuBackend, launcher: Any, inputs: Any = None, **kw: Any) -> ProfileResult:
        n = calls_of[id(launcher)] = calls_of.get(id(launcher), 0) + 1
        t = 100.0 * 2.0**n
        return ProfileResult(t, t, t, 30, 3)

    monkeypatch.setattr(CpuBackend, "profile", jittery)


def test_noisy_decisions_are_not_cached_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decision made on noisy timings (other load on the machine) is returned with a note
    but not cached, so a quieter later call profiles again; ``cache_noisy=True`` caches it,
    and the warm calls keep saying the timings were noisy."""
    _jittery_profiling(monkeypatch)
    calls = _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    k = superoptimize(_rms_graph(), backend="cpu")
    (note,) = [n for n in k.report.notes if "timings were noisy" in n]
    assert "not cached" in note and "cache_noisy=True" in note
    again = superoptimize(_rms_graph(), backend="cpu")
    assert len(calls) == 2 and not again.report.from_cache  # profiled again
    assert not list(Path(os.environ["YIRAGE_CACHE_DIR"]).glob("v1/superoptimize/*.json"))

    kept = superoptimize(_rms_graph(), backend="cpu", cache_noisy=True)
    (note,) = [n for n in kept.report.notes if "timings were noisy" in n]
    assert "cached all the same (cache_noisy=True)" in note
    warm = superoptimize(_rms_graph(), backend="cpu")
    assert len(calls) == 3 and warm.report.from_cache  # not searched or profiled again
    assert any("cached all the same" in n for n in warm.report.notes)

    uncached = superoptimize(_rms_graph(), backend="cpu", cache=False)
    assert any(n.endswith("nothing was cached (cache=False)") for n in uncached.report.notes)
    assert len(calls) == 4


def test_quiet_decisions_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steady timings: no note, and the decision is cached without ``cache_noisy``."""
    from yirage_cpu._backend import CpuBackend
    from yirage_cpu._runtime import ProfileResult

    def steady(self: CpuBackend, launcher: Any, inputs: Any = None, **kw: Any) -> ProfileResult:
        return ProfileResult(100.0, 100.0, 100.0, 30, 3)

    monkeypatch.setattr(CpuBackend, "profile", steady)
    calls = _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    k = superoptimize(_rms_graph(), backend="cpu")
    assert not any("noisy" in n for n in k.report.notes)
    assert superoptimize(_rms_graph(), backend="cpu").report.from_cache and len(calls) == 1


def test_noise_rule() -> None:
    assert _race._noisy({0: [100.0, 120.0, 900.0], 1: [50.0, 51.0]}) is False
    assert _race._noisy({0: [100.0, 300.0, 900.0]}) is True
    assert _race._noisy({0: [100.0]}) is False  # one round: nothing to reproduce


def test_a_graph_without_outputs_is_a_graph_error() -> None:
    """As ``yr.search`` does: a GraphError naming the fix, before any backend work."""
    g = yr.new_kernel_graph()
    g.exp(g.new_input((4, 8), yr.float32))  # computed, never marked as an output
    with pytest.raises(yr.GraphError, match=r"no outputs.*call mark_output"):
        superoptimize(g, backend="cpu")
    with pytest.raises(yr.GraphError, match="mark_output"):
        g.superoptimize(backend="nosuch")  # the graph is checked before the backend
    with pytest.raises(yr.GraphError, match="mark_output"):
        yr.search(g, backend="cpu", cache=False)


def test_device_spec_pins_the_search_and_keys_the_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``device_spec=`` reaches the search, keys the decision cache (a pinned and an
    unpinned call do not share a decision) and is stated in the report; an unusable spec
    is a ConfigError before anything is built."""
    seen: list[Any] = []

    def search(graph: Any, backend: Any = None, **options: Any) -> Any:
        seen.append(options.get("device_spec"))
        return SimpleNamespace(candidates=[_Cand(_fused_plan(), 10.0)], report={})

    monkeypatch.setattr(_search, "search", search)
    pinned = superoptimize(
        _rms_graph(),
        backend="cpu",
        device_spec=REFERENCE_CPU,
        profile_options=FAST_PROFILE,
        cache_noisy=True,
    )
    assert seen == [REFERENCE_CPU]
    assert any(
        "DeviceSpec given as device_spec=" in n and "128 KiB on-chip per block" in n
        for n in pinned.report.notes
    )
    assert pinned.report.device == yr.get_backend_info("cpu").device_spec.name  # ran here
    host = superoptimize(
        _rms_graph(), backend="cpu", profile_options=FAST_PROFILE, cache_noisy=True
    )
    assert seen == [REFERENCE_CPU, None] and not host.report.from_cache
    assert not any("device_spec=" in n for n in host.report.notes)
    warm = superoptimize(
        _rms_graph(),
        backend="cpu",
        device_spec=REFERENCE_CPU.to_dict(),
        profile_options=FAST_PROFILE,
    )
    assert warm.report.from_cache and len(seen) == 2  # the same spec as a mapping: same key
    with pytest.raises(yr.ConfigError, match="device_spec"):
        superoptimize(_rms_graph(), backend="cpu", device_spec="{not json")
    assert len(seen) == 2


def _one_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cpu backend with one printing per plan (no ``torch_eager`` beside the baseline's
    C): the race tests below count launchers, two candidates, one contender each."""
    from yirage_cpu._backend import CpuBackend

    monkeypatch.setattr(CpuBackend, "variants", lambda self, launcher: {"default": launcher})


def test_candidates_far_behind_stop_being_profiled(monkeypatch: pytest.MonkeyPatch) -> None:
    from yirage_cpu._backend import CpuBackend
    from yirage_cpu._runtime import ProfileResult

    calls_of: dict[int, int] = {}

    def steady(self: CpuBackend, launcher: Any, inputs: Any = None, **kw: Any) -> ProfileResult:
        first = not calls_of
        calls_of[id(launcher)] = calls_of.get(id(launcher), 0) + 1
        t = times.setdefault(id(launcher), 100.0 if first else 200.0)
        return ProfileResult(t, t, t, 30, 3)

    times: dict[int, float] = {}
    monkeypatch.setattr(CpuBackend, "profile", steady)
    _one_variant(monkeypatch)
    _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    k = superoptimize(_rms_graph(), backend="cpu")
    fast, slow = sorted(calls_of, key=lambda i: times[i])
    assert calls_of[fast] == _race.PROFILE_ROUNDS
    assert calls_of[slow] == _race.PRUNE_AFTER_ROUNDS  # 2x behind: dropped
    assert [c.measured_us for c in k.report.candidates] == [100.0, 200.0]
    assert not any("noisy" in n for n in k.report.notes)


@pytest.mark.parametrize("warm", [(50.0, 40.0), (40.0, 50.0), None])
def test_cold_ties_are_broken_by_the_warm_time(
    monkeypatch: pytest.MonkeyPatch, warm: tuple[float, float] | None
) -> None:
    """Candidates whose profiled (cold-cache) times are within COLD_TIE_RATIO of the best go
    to the one the backend's ``warm_time_us`` finds fastest, with a note when that changes
    the pick; a backend without warm timing (None) keeps the cold order."""
    from yirage_cpu._backend import CpuBackend
    from yirage_cpu._runtime import ProfileResult

    order: list[int] = []  # launchers by first profile call: candidate 0, then 1

    def cold(self: CpuBackend, launcher: Any, inputs: Any = None, **kw: Any) -> ProfileResult:
        if id(launcher) not in order:
            order.append(id(launcher))
        t = 100.0 if order.index(id(launcher)) == 0 else 100.0 * _race.COLD_TIE_RATIO
        return ProfileResult(t, t, t, 30, 3)

    def warm_time(self: CpuBackend, launcher: Any, inputs: Any) -> float | None:
        return None if warm is None else warm[order.index(id(launcher))]

    monkeypatch.setattr(CpuBackend, "profile", cold)
    monkeypatch.setattr(CpuBackend, "warm_time_us", warm_time)
    _one_variant(monkeypatch)
    _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    k = superoptimize(_rms_graph(), backend="cpu")
    switched = warm is not None and warm[1] < warm[0]
    assert k.report.chosen_index == (1 if switched else 0)
    notes = [n for n in k.report.notes if "with a cold cache" in n]
    assert len(notes) == int(switched)
    if switched:
        assert "candidate 1 was chosen" in notes[0] and "40.0 µs against 50.0 µs" in notes[0]


def test_no_warm_tie_break_beyond_the_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    from yirage_cpu._backend import CpuBackend
    from yirage_cpu._runtime import ProfileResult

    order: list[int] = []
    asked: list[int] = []

    def cold(self: CpuBackend, launcher: Any, inputs: Any = None, **kw: Any) -> ProfileResult:
        if id(launcher) not in order:
            order.append(id(launcher))
        # the library baseline second, beyond both the tie ratio and the baseline's warm window
        beyond = max(_race.COLD_TIE_RATIO, _race.BASELINE_WARM_WINDOW)
        t = 100.0 if order.index(id(launcher)) == 0 else 101.0 * beyond
        return ProfileResult(t, t, t, 30, 3)

    def warm_time(self: CpuBackend, launcher: Any, inputs: Any) -> float:
        asked.append(id(launcher))
        return 1.0

    monkeypatch.setattr(CpuBackend, "profile", cold)
    monkeypatch.setattr(CpuBackend, "warm_time_us", warm_time)
    _one_variant(monkeypatch)
    _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    k = superoptimize(_rms_graph(), backend="cpu")
    # no tie-break; the warm times are asked once each, for the baseline's warm-loss check
    # (equal warm times: the cold win stands)
    assert k.report.chosen_index == 0 and len(asked) == len(set(asked)) == 2
    assert not any("with its inputs in cache" in n for n in k.report.notes)


def test_library_baseline_winner_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_search(monkeypatch, [_baseline_plan()])
    k = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    assert k.report.chosen_is_library_baseline
    assert "unfused library baseline" in k.report.chosen_description
    assert any("runs library kernels only" in n for n in k.report.notes)


def test_float16_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_search(monkeypatch, [_fused_plan("float16"), _baseline_plan("float16")])
    g = _rms_graph(yr.float16)
    k = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE)
    assert k.report.tolerance == 1e-2
    assert all(c.status == "ok" for c in k.report.candidates)
    x, w = (a.astype(np.float16) for a in _inputs(3))
    (y,) = k(x, w)
    assert y.dtype == np.float16
    (ref,) = g.evaluate([x, w])
    assert _rel(y, ref) < 2e-3


def test_decision_cache_skips_search_and_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    g = _rms_graph()
    # cache_noisy: this test is about the warm path, and profiling on a loaded machine may
    # be noisy (such a decision is not cached by default)
    k1 = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE, cache_noisy=True)
    assert len(calls) == 1 and not k1.report.from_cache
    k2 = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    assert len(calls) == 1 and k2.report.from_cache  # no second search
    assert k2.plan == k1.plan and k2.report.search_s == 0.0 and k2.report.max_rel_err is not None
    assert k2.report.check_seed == k1.report.check_seed  # re-checked on the stored reference
    x, w = _inputs(4)
    np.testing.assert_array_equal(k1(x, w)[0], k2(x, w)[0])
    refs = list(Path(os.environ["YIRAGE_CACHE_DIR"]).glob("v1/superoptimize/*.ref.bin"))
    assert len(refs) == 1
    refs[0].write_bytes(b"corrupt")  # an unreadable reference: evaluated afresh instead
    k3 = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    assert k3.report.from_cache and k3.report.max_rel_err is not None and len(calls) == 1
    superoptimize(g, backend="cpu", cache=False, profile_options=FAST_PROFILE)
    assert len(calls) == 2


def test_a_new_printer_version_races_the_decision_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached decision was raced among kernels of the printers of its time: when a
    backend's printer version moves (the package version need not), the search and race run
    again; the same versions reuse the decision."""
    calls = _fake_search(monkeypatch, [_fused_plan(), _baseline_plan()])
    opts: dict[str, Any] = {"backend": "cpu", "profile_options": FAST_PROFILE, "cache_noisy": True}
    be = _registry.resolve_backend("cpu")
    assert be.codegen_versions  # the cpu printer's version keys its decisions
    superoptimize(_rms_graph(), **opts)
    assert superoptimize(_rms_graph(), **opts).report.from_cache and len(calls) == 1
    bumped = {k: v + "-next" for k, v in be.codegen_versions.items()}
    monkeypatch.setattr(type(be), "codegen_versions", property(lambda self: bumped))
    assert not superoptimize(_rms_graph(), **opts).report.from_cache and len(calls) == 2
    assert superoptimize(_rms_graph(), **opts).report.from_cache and len(calls) == 2


class _DeviceDraws:
    """Stands in for a backend's device generator on the cpu backend: records every draw
    (thread, seeds, scales) and can be made to give other values for the same seed."""

    def __init__(self) -> None:
        self.tag = "test-generator-1"
        self.shift = 0.0
        self.calls: list[tuple[str, list[tuple[Any, ...]]]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        cls = type(_registry.resolve_backend("cpu"))
        monkeypatch.setattr(cls, "check_input_generator", lambda be: self.tag)

        def draw(be: Any, specs: Any) -> list[np.ndarray]:
            self.calls.append((threading.current_thread().name, list(specs)))
            return [
                (np.random.default_rng(seed).standard_normal(dims) * scale + self.shift).astype(
                    np.float32
                )
                for dims, _, scale, seed in specs
            ]

        monkeypatch.setattr(cls, "draw_check_inputs", draw)


def test_check_inputs_drawn_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend with a device generator draws the check inputs itself (no numpy draw), on
    the caller's thread, one seed per input, scaled like numpy's; a warm call draws the same
    inputs again and checks against the stored reference. A reference stored for another
    generator, or one the regenerated inputs do not reproduce, is evaluated afresh: the
    cached kernel is kept, not searched again."""
    import threading

    calls = _fake_search(monkeypatch, [_fused_plan()])
    draws = _DeviceDraws()
    draws.install(monkeypatch)
    numpy_draws: list[int] = []
    monkeypatch.setattr(_superoptimize, "check_arrays", lambda *a: numpy_draws.append(1))
    evaluated: list[int] = []
    real_reference = _superoptimize.reference_outputs

    def reference(*args: Any) -> Any:
        evaluated.append(1)
        return real_reference(*args)

    monkeypatch.setattr(_superoptimize, "reference_outputs", reference)
    g = _rms_graph()
    k1 = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE, cache_noisy=True)
    assert k1.report.max_rel_err is not None and k1.report.max_rel_err <= 1e-4
    assert (
        not numpy_draws and len(draws.calls) == 1 and len(evaluated) == 2
    )  # the check inputs, the extremes set
    thread, specs = draws.calls[0]
    assert thread == threading.current_thread().name
    assert [s[0] for s in specs] == [(8, 512), (512, 768)]
    assert [s[2] for s in specs] == [check_scale((8, 512)), check_scale((512, 768))]
    assert specs[0][2] == 1.0 and specs[1][2] == pytest.approx(512**-0.5)
    assert specs[0][3] != specs[1][3]

    k2 = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    assert k2.report.from_cache and len(evaluated) == 2  # the stored reference served
    assert draws.calls[1][1] == specs and k2.report.check_seed == k1.report.check_seed

    draws.tag = "test-generator-2"  # stored for another generator: evaluated afresh
    k3 = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    assert k3.report.from_cache and len(evaluated) == 3 and len(calls) == 1

    draws.tag, draws.shift = "test-generator-1", 0.5  # same name, other values
    k4 = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE)
    assert k4.report.from_cache and len(evaluated) == 4 and len(calls) == 1
    assert k4.report.max_rel_err is not None and k4.report.max_rel_err <= 1e-4


def test_save_and_load_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_search(monkeypatch, [_fused_plan()])
    g = _rms_graph()
    k = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE)
    x, w = _inputs(5)
    (y,) = k(x, w)
    for target in (tmp_path / "saved_dir", tmp_path / "saved.yrk.json"):
        path = k.save(target)
        if path.is_dir():
            assert {p.name for p in path.iterdir()} == {
                "graph.json",
                "plan.json",
                "kernel.c",
                "metadata.json",
            }
            assert (path / "kernel.c").read_text() == k.source
        k2 = load_kernel(path)
        assert k2.backend == "cpu" and k2.plan == k.plan and k2.source == k.source
        np.testing.assert_array_equal(k2(x, w)[0], y)
        assert k2.report.chosen_index == k.report.chosen_index
        assert any("loaded from" in n for n in k2.report.notes)
    meta = json.loads((tmp_path / "saved_dir" / "metadata.json").read_text())
    meta["graph_hash"] = "0" * 16
    (tmp_path / "saved_dir" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(yr.SerializationError, match="recorded hash"):
        load_kernel(tmp_path / "saved_dir")
    with pytest.raises(yr.SerializationError, match="no saved yirage kernel"):
        load_kernel(tmp_path / "missing")


def test_load_checks_the_numbers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_search(monkeypatch, [_fused_plan()])
    path = superoptimize(_rms_graph(), backend="cpu", profile_options=FAST_PROFILE).save(
        tmp_path / "k"
    )
    plan = json.loads((path / "plan.json").read_text())
    plan["kernels"][0]["ops"][5]["binop"] = "mul"  # an edited plan computes something else
    (path / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(NumericCheckError, match="fails the numeric check"):
        load_kernel(path)


def _rmsnorm_linear_cpu_plan() -> dict[str, Any]:
    """The fused RMSNorm + Linear plan at the workload's CPU shape (two 768-wide blocks)."""
    plan = _fused_plan()
    plan["graph_hash"] = "demo"
    plan["buffers"][0]["dims"], plan["buffers"][1]["dims"] = [8, 1024], [1024, 1536]
    plan["buffers"][2]["dims"] = [8, 1536]
    k = plan["kernels"][0]
    k["grid"], k["forloop_range"] = [2, 1, 1], 32
    k["inputs"][0]["dims"], k["inputs"][1]["dims"] = [8, 1024], [1024, 1536]
    k["inputs"][1]["tile"] = [32, 768]
    k["inputs"][1]["offsets"][1][0]["stride"] = 768
    k["ops"][1]["dims"] = [32, 768]
    for i in (2, 3, 5):
        k["ops"][i]["dims"] = [8, 768]
    k["ops"][4]["extent"] = 1024
    k["outputs"][0]["tile"] = [8, 768]
    k["outputs"][0]["offsets"][1][0]["stride"] = 768
    return plan


def test_demo_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from yirage import cli

    _fake_search(monkeypatch, [_rmsnorm_linear_cpu_plan()])
    # the second demo must be warm: profiling on a loaded machine may be noisy, and a noisy
    # decision is not cached (test_noisy_decisions_are_not_cached_unless_asked)
    monkeypatch.setattr(_superoptimize, "_noisy", lambda spread: False)
    assert cli.main(["demo", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm_linear" in out and "PyTorch eager" in out and "speedup" in out
    assert cli.main(["demo", "--backend", "cpu", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["from_cache"] and row["max_rel_err"] < 1e-4
    assert row["yirage_us"] > 0 and row["baseline_us"] > 0 and row["backend"] == "cpu"


def test_the_default_backend_is_the_best_one_with_a_code_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from yirage import _registry

    # mps is ranked above cpu; here it stands for a backend that only probes its hardware
    info = _registry.get_backend_info

    def probe_only_mps(name: str) -> Any:
        got = info(name)
        return dataclasses.replace(got, codegen_implemented=False) if name == "mps" else got

    monkeypatch.setattr(_registry, "get_backend_info", probe_only_mps)
    monkeypatch.setattr(_registry, "get_available_backends", lambda: ["mps", "cpu"])
    assert _registry.resolve_backend(None).name == "cpu"
    monkeypatch.setattr(_registry, "get_available_backends", lambda: ["mps"])
    with pytest.raises(yr.BackendUnavailableError, match=r"mps found, without a code generator"):
        _registry.resolve_backend(None)


def test_unknown_backend_is_loud() -> None:
    with pytest.raises(yr.BackendUnavailableError, match="nosuch"):
        superoptimize(_rms_graph(), backend="nosuch")


# -- through the real search -------------------------------------------------------------------

_HAS_SEARCH = importlib.util.find_spec("yirage._search") is not None
needs_search = pytest.mark.skipif(
    not _HAS_SEARCH, reason="yirage.search is not available in this build"
)


@needs_search
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_end_to_end_on_cpu(name: str) -> None:
    torch = pytest.importorskip("torch")
    w = get_workload(name)
    g = w.graph("cpu")
    k = superoptimize(
        g,
        "cpu",
        w.search_config,
        profile_options=FAST_PROFILE,
        time_limit=30,
        device_spec=REFERENCE_CPU,
    )
    rep = k.report
    assert json.loads(rep.search["device_spec"])["shared_mem_per_block"] == 128 * 1024
    assert rep.chosen_index is not None and rep.max_rel_err is not None and rep.max_rel_err <= 1e-4
    # every candidate the search emits prints, compiles (-Werror) and passes the ordinary
    # check, and the fused form (one generated kernel) is among them, whichever profiling
    # picks. The dtype-extremes set may reject one on some draws: a sum the candidate splits
    # differently from the graph overflows where two extremes cancel in the graph's order
    # (tests/test_overflow_safety.py pins such a draw).
    for c in rep.candidates:
        extremes = (c.error or "").startswith("stress check failed (dtype extremes")
        assert c.status == "ok" or (c.status == "rejected" and extremes), str(rep)
    assert any(c.description.endswith("[1 generated kernel]") for c in rep.candidates), str(rep)
    assert k.source and k.plan["format"] == "yirage.kernel_plan"
    inputs = w.inputs("cpu", seed=7)
    outs = k(*inputs)  # torch tensors in, torch tensors out
    refs = g.evaluate([t.double().numpy() for t in inputs])
    theirs = w.reference(*inputs)
    for o, r, t in zip(outs, refs, theirs, strict=True):
        assert isinstance(o, torch.Tensor)
        assert _rel(o.numpy(), r) < 1e-4
        assert _rel(o.numpy(), t.double().numpy()) < 1e-4
    # NaN and ±Inf in the inputs reach the same outputs as in the reference
    inputs[0].view(-1)[0] = float("nan")
    inputs[-1].view(-1)[-1] = float("inf")
    inputs[-1].view(-1)[0] = -float("inf")
    outs = [o.double().numpy() for o in k(*inputs)]
    refs = g.evaluate([t.double().numpy() for t in inputs])
    for o, r in zip(outs, refs, strict=True):
        assert np.isnan(r).any()
        np.testing.assert_array_equal(np.isnan(o), np.isnan(r))
        np.testing.assert_array_equal(np.isinf(o) * np.sign(o), np.isinf(r) * np.sign(r))
        finite = np.isfinite(r)
        assert _rel(o[finite], r[finite]) < 1e-4


@needs_search
def test_wrong_codegen_is_rejected_with_the_real_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from yirage_cpu._backend import CpuBackend

    original = CpuBackend.codegen

    def wrong(self: CpuBackend, plan: Any) -> Any:
        src = original(self, plan)
        return dataclasses.replace(src, code=_corrupt(src.code))

    monkeypatch.setattr(CpuBackend, "codegen", wrong)
    g = get_workload("rmsnorm_linear").graph("cpu")
    try:
        k = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE, device_spec=REFERENCE_CPU)
    except SuperoptimizeError as exc:
        rep = exc.report
    else:
        rep = k.report
        assert rep.chosen_is_library_baseline  # only code without generated kernels survives
    generated = [c for c in rep.candidates if "generated" in c.description]
    assert generated and all(c.status == "rejected" for c in generated)


@needs_search
def test_save_load_round_trip_with_the_real_search(tmp_path: Path) -> None:
    w = get_workload("gqa_decode")
    g = w.graph("cpu")
    k = superoptimize(g, backend="cpu", profile_options=FAST_PROFILE, device_spec=REFERENCE_CPU)
    k2 = load_kernel(k.save(tmp_path / "gqa"))
    ins = w.inputs("cpu", seed=1, numpy=True)
    np.testing.assert_array_equal(k(*ins)[0], k2(*ins)[0])


def test_check_inputs_are_seeded_chunked_and_scaled() -> None:
    """Check inputs: the same seed gives the same values (whatever the thread count), another
    seed other values; N(0, 1) scaled by 1/√rows for matrix-like inputs; large inputs are
    drawn chunk by chunk from independent streams (no repeated chunk)."""
    from yirage._check import _CHECK_CHUNK, check_inputs

    g = yr.new_kernel_graph()
    x = g.new_input((4, 3 * _CHECK_CHUNK // 1024 + 7), yr.float32)
    w = g.new_input((3 * _CHECK_CHUNK // 1024 + 7, 1024), yr.float32)  # > 3 chunks
    g.mark_output(g.matmul(x, w))
    a = check_inputs(g, 7)
    b = check_inputs(g, 7)
    c = check_inputs(g, 8)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not any(np.array_equal(p, q) for p, q in zip(a, c, strict=True))
    assert [p.shape for p in a] == [(4, w.dims[0]), (w.dims[0], 1024)]
    assert a[0].std() == pytest.approx(1.0, rel=0.05)  # 4 rows: not matrix-like, unscaled
    assert a[1].std() == pytest.approx(1.0 / np.sqrt(w.dims[0]), rel=0.02)
    flat = a[1].reshape(-1)
    assert flat.size > 3 * _CHECK_CHUNK
    chunks = [flat[i : i + 1024] for i in range(0, 3 * _CHECK_CHUNK + 1, _CHECK_CHUNK)]
    assert len({c.tobytes() for c in chunks}) == len(chunks)
