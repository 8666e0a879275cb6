"""The environment-variable registry is the only reader of YIRAGE_* and is documented."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import yirage as yr
import yirage_cpu
from yirage import _env

REPO = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = [Path(yr.__file__).parent, *(REPO / "packages").glob("yirage-*/yirage_*")]


def test_every_variable_is_documented() -> None:
    import yirage_cuda._env  # noqa: F401  (registers the cuda backend's variables)

    doc = (REPO / "docs" / "env.md").read_text(encoding="utf-8")
    assert "YIRAGE_CUDA_PDL" in {v.name for v in _env.all_env_vars()}
    for var in _env.all_env_vars():
        assert f"`{var.name}`" in doc, var.name
        assert var.description.split(".")[0][:40] in doc, var.name


def test_nothing_else_reads_yirage_variables() -> None:
    pattern = re.compile(
        r"(os\.environ|getenv)[^\n]*YIRAGE_|YIRAGE_\w+[\"']\s*\]?\s*(in os\.environ)"
    )
    offenders = []
    for root in PACKAGE_ROOTS:
        for path in root.rglob("*.py"):
            if path.name == "_env.py":
                continue
            if pattern.search(path.read_text(encoding="utf-8")):
                offenders.append(str(path))
    assert not offenders, f"read YIRAGE_* through yirage._env: {offenders}"
    assert yirage_cpu.__file__  # the vendor packages were scanned too


def test_backends_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("YIRAGE_BACKENDS", raising=False)
    assert _env.backends() is None
    monkeypatch.setenv("YIRAGE_BACKENDS", " CUDA, cpu ,,cuda ")
    assert _env.backends() == ("cuda", "cpu")
    monkeypatch.setenv("YIRAGE_BACKENDS", " , ")
    assert _env.backends() is None


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("YIRAGE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _env.cache_dir() == tmp_path / "xdg" / "yirage"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _env.cache_dir() == Path.home() / ".cache" / "yirage"
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path / "mine"))
    assert _env.cache_dir() == tmp_path / "mine"


def test_threads_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YIRAGE_THREADS", "3")
    assert _env.threads() == 3
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("YIRAGE_THREADS", bad)
        with pytest.raises(yr.ConfigError, match="YIRAGE_THREADS"):
            _env.threads()
    monkeypatch.setenv("YIRAGE_REQUIRE_DEVICE", "1")
    assert _env.require_device()
    monkeypatch.setenv("YIRAGE_REQUIRE_DEVICE", "off")
    assert not _env.require_device()
    monkeypatch.setenv("YIRAGE_REQUIRE_DEVICE", "maybe")
    with pytest.raises(yr.ConfigError):
        _env.require_device()
    from yirage_cuda._env import pdl_enabled  # a variable a vendor package registers

    monkeypatch.delenv("YIRAGE_CUDA_PDL", raising=False)
    assert pdl_enabled()  # on unless turned off
    monkeypatch.setenv("YIRAGE_CUDA_PDL", "0")
    assert not pdl_enabled()
    monkeypatch.setenv("YIRAGE_CUDA_PDL", "sometimes")
    with pytest.raises(yr.ConfigError, match="YIRAGE_CUDA_PDL='sometimes': expected 1 or 0"):
        pdl_enabled()
    monkeypatch.setenv("YIRAGE_LOGS", "debug")
    assert _env.log_level() == logging.DEBUG
    monkeypatch.setenv("YIRAGE_LOGS", "chatty")
    with pytest.raises(yr.ConfigError, match="YIRAGE_LOGS"):
        _env.log_level()


def test_bad_threads_value_surfaces_through_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    g = yr.new_kernel_graph()
    g.mark_output(g.exp(g.new_input((2, 2))))
    monkeypatch.setenv("YIRAGE_THREADS", "zero")
    with pytest.raises(yr.ConfigError):
        g.fingerprint()
    assert g.fingerprint(threads=1)  # an explicit argument wins
