"""Compiling and profiling in worker processes (``yirage._spread``), on the CPU backend:
``YIRAGE_PROFILE_WORKERS`` workers share the host (on a GPU host each gets a device). The
chosen kernel must be checked and correct, the report must name the workers' devices, a
lost worker must leave a complete local run (never a partial one), and when every finalist
fails the check the slower candidates are built and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_superoptimize import FAST_PROFILE, _baseline_plan, _broken_plan, _fake_search, _fused_plan

import yirage as yr
from yirage import _spread

pytestmark = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("YIRAGE_PROFILE_WORKERS", "2")


def _graph() -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 512), yr.float32)
    w = g.new_input((512, 768), yr.float32)
    g.mark_output(g.matmul(g.rms_norm(x, (512,), eps=1e-6), w))
    return g


def _rel_err(k: Any, g: yr.KernelGraph) -> float:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(t.dims).astype(np.float32) for t in g.inputs]
    (ref,) = g.evaluate(xs)
    (out,) = k(*xs)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def test_workers_compile_and_profile_and_the_winner_is_checked_here() -> None:
    g = _graph()
    k = yr.superoptimize(g, backend="cpu", profile_options=FAST_PROFILE)
    rep = k.report
    assert len(rep.profiled_on) == 2 and all(rep.profiled_on)
    assert any("2 worker processes" in n for n in rep.notes)
    chosen = rep.candidates[rep.chosen_index]
    assert chosen.status == "ok" and chosen.max_rel_err is not None
    assert {c.status for c in rep.candidates} <= {"ok", "slower", "rejected", "error"}
    assert _rel_err(k, g) < 1e-4


def test_finalists_are_the_near_fastest_and_the_baseline() -> None:
    fast = _spread.ShareResult("d0", best_us={(0, "a"): 10.0, (1, "a"): 12.4, (2, "a"): 30.0})
    other = _spread.ShareResult(
        "d1", best_us={(3, "a"): 9.0, (4, "a"): 8.0}, failed={(4, "a"): "profiling failed"}
    )
    # 4 failed; the fastest is 3 (9 µs); 0 and 1 are within 1.25x of it; 5 is the baseline
    assert _spread.finalists([fast, other], {5}) == [0, 3, 5]


def test_a_lost_worker_leaves_a_complete_local_run(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = _spread.WorkerPool("no-such-backend", devices=1, workers=1)
    with pytest.raises(_spread.WorkerError, match="worker"):
        broken.run("{}", 0, [[(0, {})]], None)
    broken.shutdown()
    monkeypatch.setattr(
        _spread,
        "pool_for",
        lambda be, by_name: _spread.WorkerPool("no-such-backend", devices=1, workers=2),
    )
    g = _graph()
    k = yr.superoptimize(g, backend="cpu", profile_options=FAST_PROFILE)
    assert any("profiling workers failed" in n for n in k.report.notes)
    assert k.report.profiled_on == []
    assert all(c.status in ("ok", "rejected", "error") for c in k.report.candidates)
    assert _rel_err(k, g) < 1e-4


def test_when_every_finalist_fails_the_rest_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_search(monkeypatch, [_broken_plan(), _fused_plan(), _baseline_plan()])
    monkeypatch.setattr(_spread, "finalists", lambda results, baseline: [0])  # the broken one
    g = _graph()
    k = yr.superoptimize(g, backend="cpu", profile_options=FAST_PROFILE)
    statuses = [c.status for c in k.report.candidates]
    assert statuses[0] == "rejected" and "ok" in statuses[1:]
    assert k.report.chosen_index in (1, 2)
    assert _rel_err(k, g) < 1e-4


def test_the_worker_count_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YIRAGE_PROFILE_WORKERS", "two")
    with pytest.raises(yr.ConfigError, match="YIRAGE_PROFILE_WORKERS"):
        yr.superoptimize(_graph(), backend="cpu", profile_options=FAST_PROFILE)
