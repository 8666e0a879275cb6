"""The disk cache: layout, hits, keys, concurrency, and damaged entries — every entry is checked
against its checksum, and a damaged one (search result, superoptimize decision, its check
reference, any stored artifact) is reported once and rebuilt."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cache_damage import DAMAGES, corrupt_warnings, damage
from _plan_ref import rel_err, run_plan
from _search_graphs import CPU2, gated_mlp, rmsnorm_linear, search

import yirage as yr
from yirage import _cache


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


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


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


# -- the verified-artifact helpers --------------------------------------------------------------


def test_stored_artifact_round_trips_with_its_checksum(cache_dir: Path) -> None:
    path = _cache.entry_path("test-blob", {"name": "a"}, ".bin")
    data = bytes(range(256)) * 7
    _cache.store_artifact(path, data)
    assert _cache.load_verified_artifact(path) == data
    assert _cache.verified_path(path) == path
    line = _cache.checksum_path(path).read_text()
    assert line.startswith("sha256 ") and line.endswith(f" {len(data)}\n")
    assert not list(path.parent.glob(".*.tmp"))
    missing = path.with_name("absent.bin")
    assert _cache.load_verified_artifact(missing) is None and _cache.verified_path(missing) is None


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_artifact_is_reported_once_and_removed(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    path = _cache.entry_path("test-blob", {"name": how}, ".bin")
    _cache.store_artifact(path, b"0123456789" * 100)
    damage(path, how)
    with caplog.at_level(logging.WARNING, logger="yirage"):
        assert _cache.load_verified_artifact(path) is None
        assert _cache.verified_path(path) is None  # now missing: nothing more to report
    (warned,) = corrupt_warnings(_messages(caplog))
    assert str(path) in warned and "rebuilding" in warned
    assert not path.exists() and not _cache.checksum_path(path).exists()
    _cache.store_artifact(path, b"rebuilt")
    assert _cache.load_verified_artifact(path) == b"rebuilt"


def test_an_interrupted_rewrite_is_not_trusted(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """New content without its checksum (the writer died between the two renames) fails the
    old checksum: it is never used."""
    path = _cache.entry_path("test-blob", {"name": "rewrite"}, ".bin")
    _cache.store_artifact(path, b"old content")
    _cache.atomic_write_bytes(path, b"new content")
    with caplog.at_level(logging.WARNING, logger="yirage"):
        assert _cache.load_verified_artifact(path) is None
    (warned,) = corrupt_warnings(_messages(caplog), path)
    assert "does not match its checksum" in warned


def test_a_reader_waits_for_a_writer_between_entry_and_checksum(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that meets a half-committed entry takes the entry's lock and checks again
    instead of reporting it: it gets the new content, and nothing is removed."""
    path = _cache.entry_path("test-blob", {"name": "race"}, ".bin")
    _cache.store_artifact(path, b"old content")
    checked = threading.Event()
    verify = _cache._verify

    def verify_and_signal(p: Path) -> tuple[bytes | None, str | None]:
        result = verify(p)
        checked.set()
        return result

    monkeypatch.setattr(_cache, "_verify", verify_and_signal)
    got: list[bytes | None] = []
    with caplog.at_level(logging.WARNING, logger="yirage"):
        with _cache.locked(path):
            _cache.atomic_write_bytes(path, b"new content")  # checksum not yet written
            reader = threading.Thread(
                target=lambda: got.append(_cache.load_verified_artifact(path))
            )
            reader.start()
            assert checked.wait(60)  # the reader saw the mismatch and now waits for the lock
            _cache.store_artifact(path, b"new content")  # re-entrant: this thread holds it
        reader.join(60)
    assert got == [b"new content"]
    assert not corrupt_warnings(_messages(caplog))


def test_a_json_entry_with_a_good_checksum_but_no_object_is_rebuilt(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _cache.entry_path("test-json", {"name": "list"}, ".json")
    _cache.store_artifact(path, b"[1, 2]")
    with caplog.at_level(logging.WARNING, logger="yirage"):
        assert _cache.read_json(path) is None
    (warned,) = corrupt_warnings(_messages(caplog), path)
    assert "not an object" in warned and not path.exists()


# -- search results -----------------------------------------------------------------------------


def _flip_a_digit(path: Path) -> None:
    """Change one digit: the entry is still valid JSON, only the checksum can tell."""
    text = path.read_text()
    i = next(i for i, c in enumerate(text) if c.isdigit() and text[i - 1] == " ")
    path.write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :])
    json.loads(path.read_text())


def _rms_linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 numpy reference of RMSNorm (eps 1e-6) + Linear."""
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)) @ w.astype(np.float64)


def _check_search_result(res: Any) -> None:
    """The best candidate's plan computes RMSNorm + Linear (float64 plan interpreter against a
    float64 numpy reference)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    (got,) = run_plan(res.candidates[0].kernel_plan().to_dict(), [x, w])
    assert rel_err(got, _rms_linear(x, w)) < 1e-6


@pytest.mark.parametrize("how", [*DAMAGES, "digit"])
def test_damaged_search_entry_is_reported_once_and_rebuilt(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    (entry,) = _entries(cache_dir)
    _flip_a_digit(entry) if how == "digit" else damage(entry, how)
    with caplog.at_level(logging.WARNING, logger="yirage"):
        res = search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    assert not res.report.cache_hit
    (warned,) = corrupt_warnings(_messages(caplog))
    assert str(entry) in warned
    _check_search_result(res)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="yirage"):
        again = search(rmsnorm_linear(8, 256, 256), device_spec=CPU2)
    assert again.report.cache_hit and not corrupt_warnings(_messages(caplog))
    _check_search_result(again)


# -- superoptimize decisions and their check references -----------------------------------------

needs_cpu = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)


@pytest.fixture
def steady_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reproducible timings, so the decision is cached whatever the load on this machine."""
    from yirage_cpu._backend import CpuBackend
    from yirage_cpu._runtime import ProfileResult

    def steady(self: Any, launcher: Any, inputs: Any = None, **kw: Any) -> ProfileResult:
        return ProfileResult(100.0, 100.0, 100.0, 30, 3)

    monkeypatch.setattr(CpuBackend, "profile", steady)


def _rms_graph() -> yr.KernelGraph:
    g = yr.KernelGraph()
    x = g.new_input((8, 256), yr.float32)
    w = g.new_input((256, 192), yr.float32)
    g.mark_output(g.matmul(g.rms_norm(x, (256,), eps=1e-6), w))
    return g


def _check_kernel(kernel: Any) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    w = rng.standard_normal((256, 192)).astype(np.float32)
    (got,) = kernel(x, w)
    assert rel_err(got, _rms_linear(x, w)) < 1e-5


def _superoptimize(caplog: pytest.LogCaptureFixture) -> tuple[Any, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="yirage"):
        kernel = yr.superoptimize(_rms_graph(), backend="cpu")
    _check_kernel(kernel)
    return kernel, _messages(caplog)


@needs_cpu
@pytest.mark.usefixtures("steady_profile")
@pytest.mark.parametrize("how", [*DAMAGES, "digit"])
def test_damaged_decision_is_reported_once_and_rebuilt(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    cold, _ = _superoptimize(caplog)
    assert not cold.report.from_cache
    (decision,) = (cache_dir / "v1" / "superoptimize").glob("*.json")
    _flip_a_digit(decision) if how == "digit" else damage(decision, how)
    rebuilt, messages = _superoptimize(caplog)
    assert not rebuilt.report.from_cache
    (warned,) = corrupt_warnings(messages)
    assert str(decision) in warned
    warm, messages = _superoptimize(caplog)
    assert warm.report.from_cache and not corrupt_warnings(messages)


@needs_cpu
@pytest.mark.usefixtures("steady_profile")
@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage"])
def test_damaged_check_reference_never_fails_a_good_kernel(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A damaged ``.ref.bin`` next to a decision: the warm call reports it once, evaluates the
    reference afresh and keeps the cached kernel."""
    _superoptimize(caplog)
    (ref,) = (cache_dir / "v1" / "superoptimize").glob("*.ref.bin")
    damage(ref, how)
    warm, messages = _superoptimize(caplog)
    assert warm.report.from_cache and warm.report.max_rel_err is not None
    assert len([m for m in messages if "reference" in m]) == 1, messages
