"""The one-race contract (plugin API 1.2), with a numpy stand-in backend.

A backend may print several code paths (variants) for one plan: ``Backend.variants`` names
them. ``superoptimize`` takes every variant of every candidate as a contender, checks each
one against the float64 reference before it may win, races the passing ones once (a
``profile`` call times one launcher, nothing else), reports the winner's variant, and the
decision cache stores its name: a warm call takes ``variants()[name]`` again, and an entry
whose name the backend no longer offers is stale (a fresh run, said in the notes).

The stand-in computes ``x @ w`` with numpy. Its variants: "right" (correct), "wrong" (1%
too large, and the fastest by far: it must never win), "crash" (raises when run), "slow"
(correct, far behind: the screen drops it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import yirage as yr
from yirage import _race, _search, _superoptimize
from yirage.plugin import DEFAULT_VARIANT, ProbeResult, VerificationLevel

_SPEC = yr.DeviceSpec(
    name="Numpy stand-in",
    vendor="Fake",
    arch="numpy",
    compute_units=1,
    warp_size=None,
    max_threads_per_block=None,
    shared_mem_per_block=None,
    l2_bytes=None,
    mem_bandwidth_gbps=10.0,
    peak_tflops_fp16=None,
    peak_tflops_fp32=0.1,
)
#: Each variant's time in µs as the stand-in's profiler reports it (steady: no noise).
TIMES = {
    "right": 10.0,
    "wrong": 1.0,
    "crash": 0.5,
    "slow": 100.0,
    "fixed": 20.0,
    "close": 11.0,
    "closer": 12.0,
}
#: What each variant multiplies ``x @ w`` by (1: correct).
SCALES = {"wrong": 1.01}


class _Launcher:
    """One variant of one candidate: ``x @ w`` (times ``scale``), or a crash."""

    def __init__(self, plan: Mapping[str, Any], variant: str) -> None:
        self.plan = plan
        self.variant = variant
        self.input_specs = [((8, 64), "float32"), ((64, 32), "float32")]
        self.output_specs = [((8, 32), "float32")]

    def __call__(self, x: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
        if self.variant == "crash":
            raise RuntimeError("the crash variant always crashes")
        return [(x @ w) * np.float32(SCALES.get(self.variant, 1.0))]

    def run_unchecked(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        return self(*inputs)


class _NumpyBackend(yr.Backend):
    name = "numpy-stand-in"
    verification_level = VerificationLevel.EMULATED

    def __init__(self, variant_names: Sequence[str] = ("right", "wrong", "crash")) -> None:
        self.variant_names = list(variant_names)
        self.profiled: list[tuple[Any, dict[str, Any]]] = []
        self.precompiled: list[Any] = []

    def probe(self) -> ProbeResult:
        return ProbeResult(available=True, reason="numpy")

    def device_spec(self) -> yr.DeviceSpec:
        return _SPEC

    def codegen(self, plan: Any) -> Any:
        return dict(plan)

    def compile(self, source: Any) -> Any:
        return source

    def load(self, artifact: Any) -> Any:
        return _Launcher(artifact, self.variant_names[0])

    def variants(self, launcher: Any) -> Mapping[str, Any]:
        return {n: _Launcher(launcher.plan, n) for n in self.variant_names}

    def from_numpy(self, arrays: Sequence[Any], dtypes: Sequence[str]) -> list[Any]:
        return [np.asarray(a, dtype=np.float32) for a in arrays]

    def precompile(self, launchers: Sequence[Any], inputs: Sequence[Any]) -> None:
        self.precompiled += list(launchers)

    def profile(self, launcher: Any, inputs: Any, **options: Any) -> Any:
        assert isinstance(launcher, _Launcher), f"profile got {type(launcher).__name__}"
        self.profiled.append((launcher, dict(options)))
        return SimpleNamespace(median_us=TIMES[launcher.variant])


def _plan(name: str, generated: bool) -> dict[str, Any]:
    kernel = {"kind": "generated"} if generated else {"kind": "library", "op": "matmul"}
    return {"format": "yirage.kernel_plan", "graph_hash": name, "kernels": [kernel]}


class _Cand:
    def __init__(self, plan: dict[str, Any], baseline: bool) -> None:
        self._plan, self.baseline, self.hash, self.predicted_us = plan, baseline, None, 1.0

    def kernel_plan(self) -> Any:
        return SimpleNamespace(to_json=lambda: json.dumps(self._plan))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The search replaced by one offering a fused candidate and the library baseline."""
    calls: list[int] = []

    def search(graph: Any, backend: Any = None, **options: Any) -> Any:
        calls.append(1)
        cands = [_Cand(_plan("fused", True), False), _Cand(_plan("baseline", False), True)]
        return SimpleNamespace(candidates=cands, report={})

    monkeypatch.setattr(_search, "search", search)
    return calls


def _graph() -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 64), yr.float32)
    w = g.new_input((64, 32), yr.float32)
    g.mark_output(g.matmul(x, w))
    return g


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [
        rng.standard_normal((8, 64), dtype=np.float32),
        rng.standard_normal((64, 32), dtype=np.float32),
    ]


def test_a_wrong_variant_never_wins_however_fast(searches: list[int]) -> None:
    be = _NumpyBackend()
    k = yr.superoptimize(_graph(), backend=be, cache_noisy=True)
    rep = k.report
    assert rep.chosen_variant == "right" and k.variant == "right"
    x, w = _inputs()
    (y,) = k(x, w)
    ref = x.astype(np.float64) @ w
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-6  # not the 1% "wrong" one
    for cand in rep.candidates:  # both candidates: the right variant races, the others drop
        assert cand.status == "ok" and cand.variant == "right"
        assert cand.variant_us == {"right": TIMES["right"]}
        assert "numeric check failed" in cand.dropped_variants["wrong"]
        assert "run failed: RuntimeError" in cand.dropped_variants["crash"]
        assert cand.max_rel_err is not None and cand.max_rel_err <= 1e-4
    assert rep.measured_us == TIMES["right"] and rep.max_rel_err is not None
    # profile only ever timed single launchers of checked variants; precompile got them all
    assert {launcher.variant for launcher, _ in be.profiled} == {"right"}
    assert sorted(v.variant for v in be.precompiled) == sorted(["right", "wrong", "crash"] * 2)
    text = str(rep)
    assert "wrong dropped: numeric check failed" in text and "variant right" in text


def test_every_variant_failing_fails_the_candidate(searches: list[int]) -> None:
    be = _NumpyBackend(["wrong", "crash"])
    with pytest.raises(yr.SuperoptimizeError, match="no candidate passed") as info:
        yr.superoptimize(_graph(), backend=be)
    for cand in info.value.report.candidates:
        assert cand.status in ("rejected", "error") and cand.error
        assert set(cand.dropped_variants) == {"wrong", "crash"}
    assert not be.profiled


def test_the_screen_drops_contenders_far_behind(searches: list[int]) -> None:
    """With several variants per plan a cheap first turn (a few repeats) drops contenders
    over SCREEN_FACTOR times the fastest: "slow" is timed once, with the screen's options."""
    be = _NumpyBackend(["right", "slow"])
    k = yr.superoptimize(_graph(), backend=be, cache=False)
    slow = [opts for launcher, opts in be.profiled if launcher.variant == "slow"]
    assert len(slow) == 2  # one screen turn for each candidate's slow variant
    assert all(o["min_repeats"] == _race.SCREEN_OPTIONS["min_repeats"] for o in slow)
    right = [opts for launcher, opts in be.profiled if launcher.variant == "right"]
    assert len(right) == 2 * (1 + _race.PROFILE_ROUNDS)  # the screen, then every round
    cand = k.report.candidates[k.report.chosen_index or 0]
    assert "screened out" in cand.dropped_variants["slow"]
    assert cand.variant_us == {"right": TIMES["right"], "slow": TIMES["slow"]}


def test_the_screen_keeps_each_candidates_fastest_variants(searches: list[int]) -> None:
    """Variants all within SCREEN_FACTOR: each candidate races its SCREEN_VARIANTS fastest,
    the others are timed in the screen only and say why they left."""
    assert _race.SCREEN_VARIANTS == 2
    be = _NumpyBackend(["closer", "right", "close"])
    k = yr.superoptimize(_graph(), backend=be, cache=False)
    turns = {v: sum(1 for launcher, _ in be.profiled if launcher.variant == v) for v in TIMES}
    assert turns["closer"] == 2  # one screen turn for each of the two candidates
    assert turns["right"] == turns["close"] == 2 * (1 + _race.PROFILE_ROUNDS)
    cand = k.report.candidates[k.report.chosen_index or 0]
    assert cand.variant == "right"
    assert "2 faster variants race" in cand.dropped_variants["closer"]


def test_the_screen_lets_a_profiler_give_up_far_past_the_fastest(searches: list[int]) -> None:
    """After the first screened contender, every screen turn carries ``give_up_us`` =
    SCREEN_GIVE_UP times the fastest screen time so far; the rounds never do."""
    be = _NumpyBackend(["right", "slow"])
    yr.superoptimize(_graph(), backend=be, cache=False)
    screen = [o for _, o in be.profiled if o["min_time_s"] == _race.SCREEN_OPTIONS["min_time_s"]]
    assert len(screen) == 4 and "give_up_us" not in screen[0]
    assert all(o["give_up_us"] == _race.SCREEN_GIVE_UP * TIMES["right"] for o in screen[1:])
    rounds = [o for _, o in be.profiled if o["min_time_s"] != _race.SCREEN_OPTIONS["min_time_s"]]
    assert rounds and all("give_up_us" not in o for o in rounds)


def test_a_profiler_without_the_option_never_gets_it(searches: list[int]) -> None:
    class Explicit(_NumpyBackend):
        def profile(
            self, launcher: Any, inputs: Any, min_time_s: float = 0.2, min_repeats: int = 3
        ) -> Any:  # type: ignore[override]
            return super().profile(launcher, inputs, min_time_s=min_time_s, min_repeats=min_repeats)

    be = Explicit(["right", "slow"])
    yr.superoptimize(_graph(), backend=be, cache=False)
    assert be.profiled and all("give_up_us" not in o for _, o in be.profiled)
    assert _race.takes_option(_NumpyBackend().profile, "give_up_us")
    assert not _race.takes_option(be.profile, "give_up_us")


def test_one_variant_per_plan_means_no_screen(searches: list[int]) -> None:
    be = _NumpyBackend(["right"])
    k = yr.superoptimize(_graph(), backend=be, cache=False)
    assert len(be.profiled) == 2 * _race.PROFILE_ROUNDS
    assert all(c.dropped_variants == {} for c in k.report.candidates)
    assert "variant" not in str(k.report).split("chosen:")[0]  # no variant suffix in the rows


def test_the_default_variants_is_the_one_launcher() -> None:
    be = _NumpyBackend()
    launcher = object()
    assert yr.Backend.variants(be, launcher) == {DEFAULT_VARIANT: launcher}


def test_the_decision_cache_stores_and_reuses_the_variant(searches: list[int]) -> None:
    be = _NumpyBackend()
    cold = yr.superoptimize(_graph(), backend=be)
    assert not cold.report.from_cache and len(searches) == 1
    (entry,) = [
        p
        for p in Path(os.environ["YIRAGE_CACHE_DIR"]).glob("v1/superoptimize/*.json")
        if not p.name.endswith(".sha256.json")
    ]
    assert json.loads(entry.read_text())["variant"] == "right"
    be.profiled.clear()
    warm = yr.superoptimize(_graph(), backend=be)
    assert warm.report.from_cache and len(searches) == 1 and not be.profiled
    assert warm.variant == "right" and warm.launcher.variant == "right"
    assert warm.report.max_rel_err is not None and warm.report.max_rel_err <= 1e-4


def test_a_cached_variant_no_longer_offered_is_stale(searches: list[int]) -> None:
    """A decision naming a variant the backend does not print any more: a fresh run."""
    be = _NumpyBackend()
    yr.superoptimize(_graph(), backend=be)
    be.variant_names = ["fixed", "wrong"]  # the backend renamed its code paths
    k = yr.superoptimize(_graph(), backend=be)
    assert not k.report.from_cache and len(searches) == 2 and k.variant == "fixed"
    assert any("'right'" in n and "stale" in n for n in k.report.notes)


def test_a_cached_variant_that_fails_its_recheck_is_not_used(
    searches: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm call re-checks the cached variant: when that name now prints wrong code the
    entry is not used; everything is redone (said in the notes) and another variant wins."""
    be = _NumpyBackend(["right", "fixed"])
    assert yr.superoptimize(_graph(), backend=be).variant == "right"
    monkeypatch.setitem(SCALES, "right", 1.5)
    k = yr.superoptimize(_graph(), backend=be)
    assert not k.report.from_cache and len(searches) == 2 and k.variant == "fixed"
    assert any("failed its re-check" in n for n in k.report.notes)


def test_race_ranks_contenders_and_prunes_those_far_behind() -> None:
    """The race on its own: interleaved rounds, a contender over PRUNE_RATIO behind after
    PRUNE_AFTER_ROUNDS stops being timed, ranking fastest first."""
    be = _NumpyBackend(["right", "wrong"])
    plan = _plan("p", True)
    fast = _race.Contender(0.0, 0, plan, plan, _Launcher(plan, "wrong"), "wrong")
    slow = _race.Contender(0.0, 1, plan, plan, _Launcher(plan, "right"), "right")
    result = _race.race(be, [slow, fast], [], {"rounds": 4})
    assert [c.key for c in result.ranked([slow, fast])] == [(0, "wrong"), (1, "right")]
    assert result.pruned == {(1, "right")}
    assert len(result.spread[(1, "right")]) == _race.PRUNE_AFTER_ROUNDS
    assert len(result.spread[(0, "wrong")]) == 4
    assert not _superoptimize._noisy(result.spread_in_race())


def test_the_stress_check_judges_each_variant(searches: list[int]) -> None:
    """A variant that fails a stress set leaves the race; its candidate stays in with the
    variant that passes."""
    from yirage._report import CandidateReport, SuperoptimizeReport
    from yirage._stress import StressSet

    g = _graph()
    x, w = _inputs()
    stress = StressSet("a stress set", [x, w], [x.astype(np.float64) @ w])
    plan = _plan("p", True)
    entries = [
        _race.Contender(0.0, 0, plan, plan, _Launcher(plan, n), n) for n in ("wrong", "right")
    ]
    rep = SuperoptimizeReport(backend="b", backend_version="0", verification_level="x", device="d")
    rep.candidates = [CandidateReport(index=0, hash=None, description="", status="ok")]
    kept = _superoptimize._stress_check(_NumpyBackend(), g, stress, entries, set(), rep)
    assert [c.variant for c in kept] == ["right"]
    assert rep.candidates[0].status == "ok"
    assert "stress check failed (a stress set)" in rep.candidates[0].dropped_variants["wrong"]


def test_a_saved_kernel_loads_its_variant(searches: list[int], tmp_path: Path) -> None:
    be = _NumpyBackend(["fixed", "right"])
    k = yr.superoptimize(_graph(), backend=be, cache=False)
    assert k.variant == "right"  # the faster of the two correct variants
    path = k.save(tmp_path / "kernel.json")
    loaded = yr.load_kernel(path, backend=be)
    assert loaded.variant == "right" and loaded.launcher.variant == "right"
    be.variant_names = ["fixed"]  # "right" is no longer printed: the first variant, noted
    again = yr.load_kernel(path, backend=be)
    assert again.variant == "fixed" and again.launcher.variant == "fixed"
    assert any("no longer offers" in n for n in again.report.notes)


def _contender(us: float, candidate: int, library: bool) -> _race.Contender:
    plan = {"kernels": [{"kind": "library" if library else "generated", "op": "matmul"}]}
    return _race.Contender(us, candidate, plan, None, None, "v")


def _is_library(c: _race.Contender) -> bool:
    return all(k["kind"] == "library" for k in c.plan["kernels"])


def test_library_kernels_are_kept_unless_clearly_beaten() -> None:
    fused, base = _contender(111.1, 0, False), _contender(112.1, 1, True)
    notes: list[str] = []
    # within the margin: the library kernels win, and the report says why
    assert _race.prefer_baseline([fused, base], _is_library, notes)[0] is base
    assert notes and "library kernels were kept" in notes[0]
    # beaten by more than the margin: the fused kernel stays first, no note
    notes.clear()
    fast = _contender(112.1 / (_race.BASELINE_MARGIN * 1.01), 0, False)
    assert _race.prefer_baseline([fast, base], _is_library, notes)[0] is fast
    assert not notes
    # the library kernels already first, or none raced: unchanged
    assert _race.prefer_baseline([base, fused], _is_library, notes) == [base, fused]
    assert _race.prefer_baseline([fused], _is_library, notes) == [fused]
    assert not notes


def test_a_close_cold_win_must_hold_with_the_inputs_in_cache() -> None:
    base = _contender(100.0, 1, True)
    close = _contender(100.0 / (_race.BASELINE_MARGIN * 1.01), 0, False)  # past the margin
    far = _contender(100.0 / (_race.BASELINE_WARM_WINDOW * 1.01), 2, False)
    notes: list[str] = []
    # slower warm: the library kernels are kept, and the note gives both pairs of times
    warm = {close.key: 23.7, base.key: 21.7, far.key: 30.0}

    def by_key(c: _race.Contender) -> float | None:
        return warm.get(c.key)

    assert _race.prefer_baseline([close, base], _is_library, notes, by_key)[0] is base
    assert len(notes) == 1 and "23.7" in notes[0] and "21.7" in notes[0]
    # faster warm too: the generated contender stays first, no note
    notes.clear()
    warm[close.key] = 20.0
    assert _race.prefer_baseline([close, base], _is_library, notes, by_key)[0] is close
    # outside the window the cold win stands unless the warm loss undoes it: 100/110 cold
    # against 30/21.7 warm is a product above 1, 27/21.7 one below
    assert _race.prefer_baseline([far, base], _is_library, notes, by_key)[0] is base
    assert len(notes) == 1 and "30.0" in notes[0] and "21.7" in notes[0]
    notes.clear()
    warm[far.key] = 23.0
    assert _race.prefer_baseline([far, base], _is_library, notes, by_key)[0] is far
    assert not notes
    # no warm times (the backend has none), or no warm function: the cold win stands
    assert _race.prefer_baseline([close, base], _is_library, notes, lambda c: None)[0] is close
    assert _race.prefer_baseline([close, base], _is_library, notes)[0] is close
    assert not notes

    def broken(c: _race.Contender) -> float:
        raise RuntimeError("timer gone")

    assert _race.prefer_baseline([close, base], _is_library, notes, broken)[0] is close
    assert len(notes) == 1 and "timer gone" in notes[0]
