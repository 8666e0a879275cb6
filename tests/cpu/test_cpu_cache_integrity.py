"""Damaged CPU cache entries (the compiled shared object, the probed flags) are reported once and
rebuilt, never loaded: each damage is followed by a run in a fresh process, where a truncated
shared object handed to ``dlopen`` would die with SIGBUS."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cache_damage import DAMAGES, corrupt_warnings, damage, run_child
from _plan_ref import rel_err, run_plan
from cpu_plan_tools import PLANS

from yirage import _cache
from yirage_cpu import _codegen, _runtime, _toolchain
from yirage_cpu._backend import CpuBackend

PLAN = PLANS / "rmsnorm_matmul.json"

_CHILD = """
import numpy as np
from yirage_cpu._backend import CpuBackend
backend = CpuBackend()
artifact = backend.compile(backend.codegen(json.loads(open(sys.argv[1]).read())))
launcher = backend.load(artifact)
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 512), dtype=np.float32)
w = rng.standard_normal((512, 768), dtype=np.float32)
(y,) = launcher(x, w)
np.save(sys.argv[2], y)
print(json.dumps({"cache_hit": artifact.library.cache_hit, "warnings": WARNINGS}))
"""


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal((8, 512), dtype=np.float32),
        rng.standard_normal((512, 768), dtype=np.float32),
    ]


def _run(cache: Path, out: Path) -> dict[str, Any]:
    """Compile, load and run the plan in a fresh process; check its numbers in float64."""
    report = run_child(_CHILD, cache, str(PLAN), str(out))
    (ref,) = run_plan(json.loads(PLAN.read_text()), _inputs())
    assert rel_err(np.load(out), ref) < 1e-5
    return report


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the plan's shared object and the compiler's probed flags."""
    root = tmp_path_factory.mktemp("warm")
    first = _run(root, root / "y.npy")
    assert not first["cache_hit"] and not first["warnings"]
    return root


def _entry(cache: Path, kind: str) -> Path:
    (path,) = (cache / "v1" / kind).glob("*.so" if kind == "cpu-so" else "*.json")
    return path


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", ["cpu-so", "cpu-toolchain"])
def test_damaged_entry_is_reported_once_and_rebuilt_in_a_fresh_process(
    warm_cache: Path, tmp_path: Path, kind: str, how: str
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    path = _entry(cache, kind)
    damage(path, how)
    rebuilt = _run(cache, tmp_path / "y.npy")
    warned = corrupt_warnings(rebuilt["warnings"])
    assert len(warned) == 1 and str(path) in warned[0], rebuilt["warnings"]
    # The shared object is compiled again for its own damage only (the flags key it).
    assert rebuilt["cache_hit"] is (kind != "cpu-so")
    assert _cache.verified_path(path) == path
    again = _run(cache, tmp_path / "y2.npy")
    assert again["cache_hit"] and not again["warnings"]


def test_compile_shared_never_returns_a_damaged_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    src = _codegen.generate(json.loads(PLAN.read_text()))
    lib = _toolchain.compile_shared(src.code)
    good = lib.path.read_bytes()
    damage(lib.path, "truncated")
    with caplog.at_level(logging.WARNING, logger="yirage"):
        again = _toolchain.compile_shared(src.code)
    assert not again.cache_hit and again.path == lib.path and again.path.read_bytes() == good
    assert len(corrupt_warnings([r.getMessage() for r in caplog.records], lib.path)) == 1


def test_the_launcher_refuses_a_damaged_library_and_load_rebuilds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage between compile and load: the launcher checks before ``dlopen`` and raises an
    OSError naming the fix; ``CpuBackend.load`` compiles again and the kernel works."""
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    backend = CpuBackend()
    plan = json.loads(PLAN.read_text())
    artifact = backend.compile(backend.codegen(plan))
    damage(artifact.library.path, "truncated")
    with pytest.raises(_cache.DamagedEntryError, match="compile the source again"):
        _runtime.CpuLauncher(artifact.source, artifact.library)
    damage(_toolchain.compile_shared(artifact.source.code).path, "garbage")
    with caplog.at_level(logging.WARNING, logger="yirage"):
        launcher = backend.load(artifact)
    messages = [r.getMessage() for r in caplog.records]
    assert len(corrupt_warnings(messages, artifact.library.path)) == 1, messages
    (y,) = launcher(*_inputs())
    assert rel_err(y, run_plan(plan, _inputs())[0]) < 1e-5
