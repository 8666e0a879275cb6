"""The public plugin surface, ``yirage.plugin``: vendor packages import nothing private."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import yirage as yr
from yirage import _env, _registry, plugin

REPO = Path(__file__).resolve().parents[1]
VENDOR_MODULES = sorted((REPO / "packages").glob("yirage-*/yirage_*/**/*.py"))


def _private_imports(path: Path) -> list[str]:
    """``yirage._x`` imports of a module, including those in the code it prints."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("yirage._") or (
                node.module == "yirage" and any(a.name.startswith("_") for a in node.names)
            ):
                found.append(f"{path.name}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.name}:{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("yirage._")
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.search(r"\b(from|import) yirage\._", node.value):
                found.append(f"{path.name}:{node.lineno}: printed code imports yirage._*")
    return found


def test_vendor_packages_import_only_the_public_surface() -> None:
    assert len(VENDOR_MODULES) > 20
    offenders = [hit for p in VENDOR_MODULES for hit in _private_imports(p)]
    assert not offenders, "\n".join(offenders)


def test_the_scan_sees_a_private_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from yirage import Backend, _cache\n"
        "from yirage._errors import BackendError\n"
        "import yirage._env\n"
        "CODE = 'from yirage._collectives import all_reduce'\n"
    )
    assert len(_private_imports(bad)) == 4


def test_every_public_name_resolves() -> None:
    for name in plugin.__all__:
        assert hasattr(plugin, name), name
    assert plugin.Backend is yr.Backend and plugin.PLUGIN_API == yr.PLUGIN_API
    assert plugin.CORE_VERSION == yr._core.__version__


def test_a_probe_only_backend_names_the_probe_reason() -> None:
    class Absent(plugin.ProbeOnlyBackend):
        name = "absent"

        def probe(self) -> plugin.ProbeResult:
            return plugin.ProbeResult(available=False, reason="no such device: plug one in")

        def live_spec(self) -> plugin.DeviceSpec | None:
            return None

    be = Absent()
    with pytest.raises(plugin.BackendUnavailableError, match="plug one in"):
        be.device_spec()
    assert not be.codegen_implemented
    with pytest.raises(plugin.NotImplementedBackendError, match="codegen"):
        be.codegen({})


def test_backends_register_their_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "_REGISTERED", dict(_env._REGISTERED))  # undone after the test
    var = plugin.EnvVar("YIRAGE_TESTVENDOR_KNOB", "1", "A knob of a test vendor.")
    assert plugin.register_env_var(var) is var
    assert plugin.register_env_var(var) is var  # idempotent
    assert var in _env.all_env_vars()
    with pytest.raises(plugin.ConfigError, match="registered differently"):
        plugin.register_env_var(plugin.EnvVar("YIRAGE_TESTVENDOR_KNOB", "0", "Other."))
    with pytest.raises(plugin.ConfigError, match="start with YIRAGE_"):
        plugin.register_env_var(plugin.EnvVar("TESTVENDOR_KNOB", None, "No prefix."))


def test_a_plugin_written_for_a_newer_minor_is_refused(fresh_registry: None) -> None:
    class Newer(plugin.ProbeOnlyBackend):
        name = "newer"
        plugin_api = (plugin.PLUGIN_API[0], plugin.PLUGIN_API[1] + 1)

        def probe(self) -> plugin.ProbeResult:
            return plugin.ProbeResult(available=True, reason="")

        def live_spec(self) -> plugin.DeviceSpec | None:
            return None

    class EntryPoint:
        name = "newer"
        dist = None

        def load(self) -> type[Newer]:
            return Newer

    entry = _registry._load(EntryPoint())
    assert isinstance(entry.error, yr.PluginAPIError)
    assert f"plugin API {plugin.PLUGIN_API[0]}.{plugin.PLUGIN_API[1] + 1}" in str(entry.error)
    assert "pip install -U yirage yirage-newer" in str(entry.error)
