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
#: What a vendor package may import of yirage's: the public modules, and the shared layers
#: (their top-level package only).
PUBLIC = {"yirage", "yirage.plugin", "yirage.plan", "yirage.cfamily"}
LAYERS = {"yirage_triton"}


def _allowed(module: str, own: str) -> bool:
    """Whether the package ``own`` may import ``module`` (anything not yirage's is)."""
    top = module.split(".")[0]
    if not top.startswith("yirage") or top == own:
        return True
    return module in PUBLIC or module in LAYERS


def _private_imports(path: Path) -> list[str]:
    """Imports of yirage's private modules (``yirage._x``), of other vendor packages or of a
    layer's private modules, by a module of a vendor package, including in the code it
    prints."""
    own = path.parent.name if path.parent.name.startswith("yirage_") else path.parent.parent.name
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if not _allowed(node.module, own) or (
                node.module == "yirage" and any(a.name.startswith("_") for a in node.names)
            ):
                found.append(f"{path.name}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.name}:{node.lineno}: import {a.name}"
                for a in node.names
                if not _allowed(a.name, own)
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in re.finditer(r"\b(?:from|import) (yirage[\w.]*)", node.value):
                if not _allowed(m.group(1), own):
                    found.append(f"{path.name}:{node.lineno}: printed code imports {m.group(1)}")
    return found


def test_vendor_packages_import_only_the_public_surface() -> None:
    assert len(VENDOR_MODULES) > 20
    scanned = {p.parent.name for p in VENDOR_MODULES}
    assert {"yirage_triton", "yirage_cuda", "yirage_cpu"} <= scanned
    offenders = [hit for p in VENDOR_MODULES for hit in _private_imports(p)]
    assert not offenders, "\n".join(offenders)


def test_the_scan_sees_a_private_import(tmp_path: Path) -> None:
    pkg = tmp_path / "yirage_fake"
    pkg.mkdir()
    bad = pkg / "bad.py"
    bad.write_text(
        "from yirage import Backend, _cache\n"
        "from yirage._errors import BackendError\n"
        "import yirage._env\n"
        "CODE = 'from yirage._collectives import all_reduce'\n"
        "from yirage_triton._runtime import profile\n"
        "from yirage_cuda import CudaBackend\n"
        "import yirage_cpu\n"
    )
    assert len(_private_imports(bad)) == 7
    good = pkg / "good.py"
    good.write_text(
        "from yirage import Backend\n"
        "from yirage.plan import parse_plan\n"
        "from yirage.plugin import BackendError\n"
        "import yirage_triton\n"
        "from yirage_triton import TritonBackend\n"
        "from yirage_fake._other import thing\n"
        "CODE = 'from yirage_triton import matmul_fp32'\n"
    )
    assert _private_imports(good) == []


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
