"""The search's disk cache: layout, hits, keys, corrupt entries, concurrency."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
from _search_graphs import CPU2, gated_mlp, rmsnorm_linear, search


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _entries(root: Path) -> list[Path]:
    return sorted((root / "v1" / "search").glob("*.json"))


def test_second_search_is_a_cache_hit(cache_dir: Path) -> None:
    g = rmsnorm_linear(8, 256, 256)
    first = search(g, device_spec=CPU2)
    assert not first.report.cache_hit
    (entry,) = _entries(cache_dir)
    assert not list(entry.parent.glob(".*.tmp"))  # atomic write left no temp file
    t = time.perf_counter()
    second = search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    elapsed = time.perf_counter() - t
    print(f"cache hit in {elapsed * 1e3:.1f} ms")
    assert second.report.cache_hit
    assert "cache" in str(second.report)
    assert elapsed < 0.1
    assert [c.hash for c in second.candidates] == [c.hash for c in first.candidates]
    assert [c.label for c in second.candidates] == [c.label for c in first.candidates]
    assert (
        second.candidates[0].kernel_plan().to_json() == first.candidates[0].kernel_plan().to_json()
    )
    assert second.report.stop_reason == first.report.stop_reason


def test_key_depends_on_graph_options_and_device(cache_dir: Path) -> None:
    search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    assert search(rmsnorm_linear(8, 256, 512), device_spec=CPU2).report.cache_hit is False
    assert search(rmsnorm_linear(8, 256, 256), device_spec=CPU2, seed=1).report.cache_hit is False
    assert search(rmsnorm_linear(8, 256, 256), device_spec=CPU2, top_k=2).report.cache_hit is False
    other = json.loads(CPU2)
    other["compute_units"] = 4
    assert (
        search(rmsnorm_linear(8, 256, 256), device_spec=json.dumps(other)).report.cache_hit is False
    )
    # The thread count does not change the result, so it is not part of the key.
    assert search(rmsnorm_linear(8, 256, 256), device_spec=CPU2, threads=1).report.cache_hit
    assert len(_entries(cache_dir)) == 5


def test_cache_false_bypasses(cache_dir: Path) -> None:
    search(rmsnorm_linear(8, 256, 256), device_spec=CPU2, cache=False)
    assert _entries(cache_dir) == []


@pytest.mark.parametrize("garbage", [b"{not json", b"[1, 2]", b'{"format": "other"}'])
def test_corrupt_entry_is_rebuilt(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    (entry,) = _entries(cache_dir)
    entry.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="yirage"):
        res = search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    assert not res.report.cache_hit
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert json.loads(entry.read_text())["format"] == "yirage.search_cache"
    assert search(rmsnorm_linear(8, 256, 256), device_spec=CPU2).report.cache_hit


def test_concurrent_identical_searches_search_once(cache_dir: Path) -> None:
    results: list[object] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(search(gated_mlp(8, 256, 256), device_spec=CPU2))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    hits = sorted(r.report.cache_hit for r in results)  # type: ignore[attr-defined]
    assert hits == [False, True]
    assert len(_entries(cache_dir)) == 1
