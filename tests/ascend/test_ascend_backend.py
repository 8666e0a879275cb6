"""The Ascend backend without an NPU: its target, the DeviceSpec table and the live spec from
torch_npu, the toolchain wrapper (CANN, BiSheng, triton-ascend found with versions, or named
with the fix), the probe, and what ``yirage doctor`` says on a machine like this one."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from yirage.plugin import VerificationLevel


def test_the_target_is_triton_ascend_s() -> None:
    from yirage_ascend._backend import TARGET

    assert TARGET.torch_device == "npu" and TARGET.warp_size == 1 and not TARGET.pdl
    assert TARGET.fp32_dot_precisions == ("ieee", "hf32")
    assert TARGET.default_stages == TARGET.deep_stages == 1
    assert TARGET.variant_families == frozenset({"split"}) and TARGET.aot_backend is None


def test_table_has_the_910b_variants_and_910c_with_the_ai_core_buffers() -> None:
    from yirage_ascend._backend import AscendBackend
    from yirage_ascend._rules import ATLAS_A2

    table = AscendBackend().known_devices()
    assert set(table) == {"Ascend 910B2", "Ascend 910B3", "Ascend 910B4", "Ascend 910C"}
    assert {s.compute_units for s in table.values()} == {20, 24}
    for spec in table.values():
        assert spec.shared_mem_per_block == ATLAS_A2.ub_bytes == 192 * 1024
        assert spec.execution_model == "tile" and spec.warp_size is None
        assert spec.matrix_tile == (16, 16, 16) and spec.source == "table"
    assert AscendBackend(interpret=True).device_spec().arch == "Ascend910B3"


def _fake_torch_npu(monkeypatch: pytest.MonkeyPatch, name: str, **props: int) -> None:
    npu = types.SimpleNamespace(
        is_available=lambda: True,
        get_device_name=lambda i: name,
        get_device_properties=lambda i: types.SimpleNamespace(**props),
    )
    module = types.ModuleType("torch_npu")
    module.npu = npu  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "torch_npu" else real(n, *a)
    )


def test_live_spec_from_torch_npu_refines_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from yirage_ascend import _device_spec

    _fake_torch_npu(monkeypatch, "Ascend910B3", cube_core_num=20, L2_cache_size=96 * 2**20)
    spec = _device_spec.device_spec()
    assert spec is not None and spec.source == "table+live"
    assert spec.arch == "Ascend910B3" and spec.l2_bytes == 96 * 2**20
    _fake_torch_npu(monkeypatch, "Ascend910_9999", cube_core_num=30)
    other = _device_spec.device_spec()
    assert other is not None and other.source == "live" and other.compute_units == 30
    assert other.shared_mem_per_block == 192 * 1024


def _fake_cann(root: Path) -> Path:
    home = root / "ascend-toolkit" / "latest"
    (home / "compiler" / "bishengir" / "bin").mkdir(parents=True)
    (home / "x86_64-linux").mkdir()
    (home / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.2.RC1\n"
    )
    tool = home / "compiler" / "bishengir" / "bin" / "bishengir-compile"
    tool.write_text("#!/bin/sh\necho 'bishengir-compile version 8.2.0'\n")
    tool.chmod(0o755)
    return home


def test_toolchain_finds_cann_and_bishengir_with_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yirage_ascend import _toolchain

    home = _fake_cann(tmp_path)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(home))
    monkeypatch.delenv("TRITON_NPU_COMPILER_PATH", raising=False)
    tools = _toolchain.toolchain_versions()
    assert tools["CANN"] == f"8.2.RC1 at {home} (ASCEND_HOME_PATH)"
    assert tools["bishengir-compile"] == "bishengir-compile version 8.2.0"
    missing = _toolchain.missing()
    assert "CANN" not in missing and "bishengir-compile" not in missing


def test_missing_pieces_are_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from yirage_ascend import _toolchain

    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "TRITON_NPU_COMPILER_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_toolchain, "DEFAULT_CANN_HOMES", ())
    monkeypatch.setenv("PATH", "/nonexistent")
    missing = _toolchain.missing()
    assert "set_env.sh" in missing["CANN"] and "ASCEND_HOME_PATH" in missing["CANN"]
    assert "TRITON_NPU_COMPILER_PATH" in missing["bishengir-compile"]
    if _toolchain.triton_flavour() != "triton-ascend":
        assert "triton-ascend" in missing["triton-ascend"]


def test_an_unsourced_toolkit_is_found_and_the_fix_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yirage_ascend import _toolchain

    home = _fake_cann(tmp_path)
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setattr(_toolchain, "DEFAULT_CANN_HOMES", (str(home),))
    assert "set_env.sh not sourced" in _toolchain.toolchain_versions()["CANN"]
    assert "ASCEND_HOME_PATH is unset" in _toolchain.missing()["CANN"]


def test_doctor_shows_ascend_installed_unavailable_with_reason_and_level(tmp_path: Path) -> None:
    """On a machine without an NPU (this one, CI's): installed, not available, why, and the
    level reached (emulated)."""
    from yirage_ascend._probe import device_nodes

    if device_nodes():
        pytest.skip("this machine has an Ascend NPU")
    env = dict(os.environ, YIRAGE_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "yirage", "doctor"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    block = proc.stdout.split("\n  ascend\n", 1)[1].split("\n  ")[0:6]
    lines = {ln.split(":", 1)[0].strip(): ln for ln in block}
    assert "installed: yes" in lines["installed"] and "available: no" in lines["installed"]
    assert "no Ascend NPU" in lines["why not"]
    assert f"verified:  {VerificationLevel.EMULATED}" in lines["verified"]
    assert "CANN" in lines["toolchain"] and "fix:" in lines["toolchain"]


def test_probe_never_raises_and_the_npu_path_needs_torch_npu() -> None:
    from yirage.plugin import BackendUnavailableError
    from yirage_ascend import AscendBackend
    from yirage_ascend._probe import device_nodes

    backend = AscendBackend()
    result = backend.probe()
    if device_nodes():
        pytest.skip("this machine has an Ascend NPU")
    assert not result.available and "davinci" in result.reason
    assert backend.verification_level is VerificationLevel.EMULATED
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailableError, match="pip install torch-npu"):
            backend._device_api()
