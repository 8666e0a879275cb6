"""benchmarks/calibration.py: the agreement statistics against hand-checked examples, and the
table a tiny CPU run writes (its numbers recomputed from its own CSV)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "calibration", REPO / "benchmarks" / "calibration.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibration"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


cal = _load()


def test_spearman_matches_the_hand_computed_coefficients() -> None:
    # no ties: rank differences 1, -1, 1, -1, 0 -> 1 - 6 * 4 / (5 * 24) = 0.8
    assert cal.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8, abs=1e-15)
    # ties share the mean rank: ranks (1.5, 1.5, 3) against (1, 2, 3) -> 1.5 / sqrt(1.5 * 2)
    assert cal.ranks([1.0, 1.0, 2.0]) == [1.5, 1.5, 3.0]
    assert cal.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0), abs=1e-15)
    # order, not scale: any increasing map gives 1, a decreasing one -1
    xs = [0.3, 7.0, 2.5, 40.0]
    assert cal.spearman(xs, [x**3 + 1 for x in xs]) == pytest.approx(1.0)
    assert cal.spearman(xs, [-x for x in xs]) == pytest.approx(-1.0)
    # too few pairs or a constant side: undefined
    assert cal.spearman([1, 2], [2, 1]) is None
    assert cal.spearman([1, 2, 3], [5, 5, 5]) is None
    with pytest.raises(ValueError, match="3 predictions but 2 measurements"):
        cal.spearman([1, 2, 3], [1, 2])


def test_relative_errors_and_the_summary() -> None:
    assert cal.rel_error(3.0, 4.0) == 0.25 and cal.rel_error(6.0, 4.0) == 0.5
    assert cal.median([0.1, 0.5, 0.3]) == 0.3 and cal.median([4.0, 1.0, 2.0, 3.0]) == 2.5

    def row(i: int, pred: float, meas: float) -> object:
        return cal.Row("w", "cpu", i, False, False, pred, meas, cal.rel_error(pred, meas), "c")

    # the model's pick (predicted 1 us) is the slowest measured (30 us): measured rank 3
    s = cal.summarize([row(0, 3.0, 10.0), row(1, 1.0, 30.0), row(2, 2.0, 20.0)])
    assert s.candidates == 3 and s.model_pick_measured_rank == 3
    assert s.spearman == pytest.approx(-1.0)
    assert s.median_rel_err == pytest.approx(0.9) and s.max_rel_err == pytest.approx(1 - 1 / 30)


def test_repeated_runs_keep_the_median_time_of_candidates_profiled_in_all() -> None:
    def row(i: int, meas: float) -> object:
        return cal.Row("w", "cpu", i, False, False, 2.0, meas, cal.rel_error(2.0, meas), f"c{i}")

    runs = [[row(0, 1.0), row(1, 5.0)], [row(0, 4.0), row(1, 6.0)], [row(0, 3.0)]]
    (only,) = cal.repeated(runs)  # candidate 1 was not profiled in the third run
    assert only.index == 0 and only.measured_us == 3.0 and only.rel_err == pytest.approx(1 / 3)
    assert cal.repeated([runs[0]]) == runs[0]


def test_a_tiny_cpu_run_writes_the_table_of_its_own_rows(tmp_path: Path) -> None:
    folder = cal.main(
        ["--backend", "cpu", "--workloads", "rms_norm", "--top-k", "2", "--out", str(tmp_path)]
    )
    assert folder.parent == tmp_path
    with open(folder / "calibration.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 2 and {r["workload"] for r in rows} == {"rms_norm"}
    assert any(r["baseline"] == "True" for r in rows)  # the library baseline is profiled too
    pred = [float(r["predicted_us"]) for r in rows]
    meas = [float(r["measured_us"]) for r in rows]
    assert all(p > 0 for p in pred) and all(m > 0 for m in meas)
    for r, p, m in zip(rows, pred, meas, strict=True):
        assert float(r["rel_err"]) == pytest.approx(abs(p - m) / m, rel=1e-12)
    doc = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    (summary,) = doc["summaries"]
    assert summary["candidates"] == len(rows)
    want = cal.spearman(pred, meas)
    assert summary["spearman"] == (None if want is None else pytest.approx(want))
    assert summary["median_rel_err"] == pytest.approx(
        cal.median([abs(p - m) / m for p, m in zip(pred, meas, strict=True)])
    )
    assert doc["backend"] == "cpu" and doc["device_spec"]["execution_model"] == "cpu"
    text = (folder / "summary.md").read_text(encoding="utf-8")
    assert "| rms_norm | cpu |" in text and "--top-k 2" in text and "OMP_NUM_THREADS=" in text
    assert str(tmp_path) not in text  # the --out folder is left out of the command
