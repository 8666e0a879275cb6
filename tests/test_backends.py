"""Backend discovery, the plugin contract, probes and DeviceSpecs of the vendor packages."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import yirage as yr
from yirage import _registry

pytestmark = pytest.mark.usefixtures("fresh_registry")

VENDORS = ("cuda", "rocm", "tpu", "ascend", "mps", "cpu")
REPO = Path(__file__).resolve().parents[1]


class _FakeEntryPoint:
    def __init__(self, name: str, load: Callable[[], Any], version: str = "9.9.9") -> None:
        self.name = name
        self._load = load
        self.dist = SimpleNamespace(version=version)

    def load(self) -> Any:
        return self._load()


_SPEC = yr.DeviceSpec(
    name="Fake GPU",
    vendor="Fake",
    arch="fake1",
    compute_units=10,
    warp_size=32,
    max_threads_per_block=256,
    shared_mem_per_block=64 * 1024,
    l2_bytes=2**20,
    mem_bandwidth_gbps=100.0,
    peak_tflops_fp16=10.0,
    peak_tflops_fp32=5.0,
    matrix_tile=(16, 8, 16),
)


class _FakeBackend(yr.Backend):
    name = "fake"
    distribution = "yirage-fake-not-installed"

    def __init__(self, available: bool = True) -> None:
        self._available = available

    def probe(self) -> yr.ProbeResult:
        return yr.ProbeResult(self._available, "fake probe", "Fake GPU", {"fakecc": "1.0"})

    def device_spec(self) -> yr.DeviceSpec:
        return _SPEC


def _with_fakes(monkeypatch: pytest.MonkeyPatch, *fakes: _FakeEntryPoint) -> None:
    real = _registry._entry_points()
    monkeypatch.setattr(_registry, "_entry_points", lambda: [*real, *fakes])
    _registry._reset()


def test_all_vendor_packages_are_installed() -> None:
    missing = [v for v in VENDORS if not yr.get_backend_info(v).installed]
    assert not missing, f"install the vendor packages (nox -s tests does): missing {missing}"


def test_cpu_is_available_with_a_live_spec() -> None:
    assert yr.is_backend_available("cpu")
    backends = yr.get_available_backends()
    assert "cpu" in backends
    rank = {n: i for i, n in enumerate(VENDORS)}
    assert backends == sorted(backends, key=lambda n: rank.get(n, 99))  # best first
    info = yr.get_backend_info("cpu")
    assert info.installed and info.available and info.error is None
    # written for this plugin API major and a minor this yirage speaks (1.1 plugins run on 1.2)
    assert info.plugin_api is not None and info.plugin_api[0] == yr.PLUGIN_API[0]
    assert info.plugin_api[1] <= yr.PLUGIN_API[1]
    assert info.package_version == "0.1.0"
    spec = info.device_spec
    assert spec is not None and spec.source == "live"
    assert spec.compute_units is not None and spec.compute_units >= 1
    assert json.loads(spec.to_json())["name"] == spec.name
    assert json.dumps(info.to_dict())  # serialisable for `yirage doctor --json`


def test_verification_levels_are_honest() -> None:
    """A backend without a code generator says so; one with a level above NONE has one."""
    for name in VENDORS:
        info = yr.get_backend_info(name)
        assert info.verification_level is not None, name
        if info.codegen_implemented:
            assert info.verification_level is not yr.VerificationLevel.NONE, name
        else:
            assert info.verification_level is yr.VerificationLevel.NONE, name


def test_unavailable_vendors_say_why() -> None:
    unavailable = [v for v in VENDORS if not yr.is_backend_available(v)]
    if not unavailable:
        pytest.skip("every vendor's hardware is present on this machine")
    for name in unavailable:
        info = yr.get_backend_info(name)
        assert not info.available
        assert len(info.reason) > 10, (name, info.reason)
        assert info.device_spec is None


def test_not_installed_backend_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = [ep for ep in _registry._entry_points() if ep.name != "rocm"]
    monkeypatch.setattr(_registry, "_entry_points", lambda: real)
    _registry._reset()
    info = yr.get_backend_info("rocm")
    assert not info.installed and "pip install yirage[rocm]" in info.reason
    monkeypatch.setenv("YIRAGE_BACKENDS", "rocm")
    with pytest.raises(yr.BackendUnavailableError, match=re.escape("pip install yirage[rocm]")):
        yr.get_available_backends()


def test_explicit_selection_of_an_unavailable_backend_raises(monkeypatch) -> None:
    if yr.is_backend_available("rocm"):
        pytest.skip("an AMD GPU is present")
    reason = yr.get_backend_info("rocm").reason
    monkeypatch.setenv("YIRAGE_BACKENDS", "rocm")
    _registry._reset()
    with pytest.raises(yr.BackendUnavailableError) as info:
        yr.get_available_backends()
    assert info.value.name == "rocm" and info.value.reason == reason
    monkeypatch.setenv("YIRAGE_BACKENDS", "cpu,rocm")
    with pytest.raises(yr.BackendUnavailableError, match="rocm"):
        yr.get_available_backends()


def test_explicit_selection_keeps_the_given_order(monkeypatch, fresh_registry) -> None:
    _with_fakes(monkeypatch, _FakeEntryPoint("fake", lambda: lambda: _FakeBackend()))
    monkeypatch.setenv("YIRAGE_BACKENDS", " CPU , fake ")
    assert yr.get_available_backends() == ["cpu", "fake"]
    monkeypatch.setenv("YIRAGE_BACKENDS", "fake,cpu")
    assert yr.get_available_backends() == ["fake", "cpu"]
    monkeypatch.setenv("YIRAGE_BACKENDS", "nosuch")
    with pytest.raises(yr.BackendUnavailableError, match="no backend called 'nosuch'"):
        yr.get_available_backends()


def test_third_party_backend_is_discovered(monkeypatch) -> None:
    _with_fakes(monkeypatch, _FakeEntryPoint("fake", lambda: lambda: _FakeBackend()))
    assert yr.get_available_backends()[-1] == "fake"  # unknown names after yirage's own
    info = yr.get_backend_info("fake")
    assert info.available and info.device_spec == _SPEC and info.toolchain == {"fakecc": "1.0"}
    assert info.package_version == "0+unknown"


def test_plugin_api_major_mismatch_is_reported_not_raised(monkeypatch) -> None:
    class FutureBackend(_FakeBackend):
        plugin_api = (2, 0)

    _with_fakes(monkeypatch, _FakeEntryPoint("fake", lambda: FutureBackend, version="2.0.0"))
    assert "fake" not in yr.get_available_backends()
    assert "cpu" in yr.get_available_backends()
    assert not yr.is_backend_available("fake")
    info = yr.get_backend_info("fake")
    assert info.installed and not info.available
    assert info.error is not None and "plugin API 2.0" in info.error and "1.2" in info.error
    assert "pip install -U yirage yirage-fake" in info.reason
    monkeypatch.setenv("YIRAGE_BACKENDS", "fake")
    with pytest.raises(yr.BackendUnavailableError) as err:
        yr.get_available_backends()
    assert isinstance(err.value.__cause__, yr.PluginAPIError)


def test_vendor_packages_declare_their_own_plugin_api(monkeypatch) -> None:
    """Each vendor backend class states the plugin API it was written for in its own body.
    Inherited from yirage.Backend it would always equal the installed yirage's PLUGIN_API,
    and the mismatch check could never fire for a real vendor package."""
    for name in VENDORS:
        cls = type(_registry._get_backend(name))
        assert cls.__module__.startswith(f"yirage_{name}."), (name, cls)
        assert "plugin_api" in vars(cls), f"{cls.__qualname__} inherits plugin_api: declare it"
        api = vars(cls)["plugin_api"]
        assert isinstance(api, tuple) and len(api) == 2, (name, api)
        assert all(type(v) is int for v in api) and api[0] == yr.PLUGIN_API[0], (name, api)
    # and the check fires for a real vendor package that speaks another major version
    rocm = type(_registry._get_backend("rocm"))
    monkeypatch.setattr(rocm, "plugin_api", (yr.PLUGIN_API[0] + 1, 0))
    _registry._reset()
    info = yr.get_backend_info("rocm")
    assert not info.available and info.error is not None
    assert f"plugin API {yr.PLUGIN_API[0] + 1}.0" in info.error
    assert "pip install -U yirage yirage-rocm" in info.error


@pytest.mark.parametrize(
    ("loader", "fragment"),
    [
        (lambda: (_ for _ in ()).throw(ImportError("no module named vendor_sdk")), "vendor_sdk"),
        (lambda: lambda: 42, "not a yirage.Backend"),
        (lambda: lambda: (_ for _ in ()).throw(RuntimeError("register exploded")), "exploded"),
    ],
)
def test_broken_plugins_are_collected(monkeypatch, loader, fragment: str) -> None:
    _with_fakes(monkeypatch, _FakeEntryPoint("fake", loader))
    assert "cpu" in yr.get_available_backends()
    info = yr.get_backend_info("fake")
    assert info.installed and not info.available
    assert info.error is not None and fragment in info.error


def test_a_raising_probe_is_contained(monkeypatch) -> None:
    class Raising(_FakeBackend):
        def probe(self) -> yr.ProbeResult:
            raise OSError("driver on fire")

    _with_fakes(monkeypatch, _FakeEntryPoint("fake", lambda: Raising))
    assert "fake" not in yr.get_available_backends()
    assert "driver on fire" in yr.get_backend_info("fake").reason


def test_unimplemented_steps_raise_and_name_the_backend() -> None:
    steps = (("codegen", (None,)), ("compile", ("",)), ("load", (None,)), ("profile", (None, [])))
    for step, args in steps:
        with pytest.raises(yr.NotImplementedBackendError, match=rf"'fake'.*0\+unknown.*{step}"):
            getattr(_FakeBackend(), step)(*args)
    for name in VENDORS:
        backend = _registry._get_backend(name)
        if not backend.codegen_implemented:
            with pytest.raises(yr.NotImplementedBackendError, match=rf"'{name}'.*0\.1\.0"):
                backend.codegen(None)


def test_probes_never_raise(monkeypatch) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    for vendor, attr in (
        ("cuda", "device_nodes"),
        ("rocm", "toolchain"),
        ("ascend", "device_nodes"),
        ("tpu", "device_nodes"),
        ("mps", "toolchain"),
        ("cpu", "cpu_model"),
    ):
        probe_mod = importlib.import_module(f"yirage_{vendor}._probe")
        monkeypatch.setattr(probe_mod, attr, boom)
        result = probe_mod.probe()
        assert isinstance(result, yr.ProbeResult)
        if vendor == "cpu":
            assert result.available  # the CPU is always there
        elif vendor != "mps":  # not macOS here: mps fails before reaching toolchain()
            assert not result.available and "boom" in result.reason


def test_device_tables_hold_the_known_chips() -> None:
    want = {
        "cuda": {"H100 SXM", "H200", "A100 80GB"},
        "rocm": {"MI300X", "MI250X"},
        "mps": {"M2 Ultra", "M3 Max"},
        "ascend": {"Ascend 910B2", "Ascend 910B3", "Ascend 910B4", "Ascend 910C"},
        "tpu": {"TPU v4", "TPU v5e"},
    }
    for vendor, chips in want.items():
        table = _registry._get_backend(vendor).known_devices()
        assert chips <= set(table), vendor
        for spec in table.values():
            assert spec.source == "table"
            for value in (spec.compute_units, spec.shared_mem_per_block, spec.l2_bytes):
                assert value is None or value > 0
            assert spec.matrix_tile is None or all(d > 0 for d in spec.matrix_tile)
    h100 = _registry._get_backend("cuda").known_devices()["H100 SXM"]
    assert (h100.compute_units, h100.arch, h100.warp_size) == (132, "sm_90", 32)


@pytest.mark.parametrize(
    ("live_name", "table_key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_cuda_name_matching(live_name: str, table_key: str | None) -> None:
    from yirage_cuda import _device_spec

    table = _device_spec.KNOWN_DEVICES
    got = yr.Backend._match_device(live_name, _device_spec._MATCH)
    assert got == (table[table_key] if table_key else None)


def test_table_spec_refined_live_keeps_provenance() -> None:
    from yirage_cuda._device_spec import H100_SXM

    live = H100_SXM.with_live(name="NVIDIA H100 80GB HBM3", compute_units=132, l2_bytes=None)
    assert live.source == "table+live" and live.name == "NVIDIA H100 80GB HBM3"
    assert live.l2_bytes == H100_SXM.l2_bytes
    assert H100_SXM.with_live(l2_bytes=None) is H100_SXM


def test_rocm_kfd_topology(tmp_path: Path, monkeypatch) -> None:
    from yirage_rocm import _device_spec, _probe

    assert _probe.gfx_name(90402) == "gfx942" and _probe.gfx_name(90010) == "gfx90a"
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "properties").write_text("cpu_cores_count 64\ngfx_target_version 0\n")
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "properties").write_text(
        "simd_count 1216\nsimd_per_cu 4\nlds_size_in_kb 64\nwave_front_size 64\n"
        "gfx_target_version 90402\n"
    )
    gpus = _probe.kfd_gpus(tmp_path)
    assert len(gpus) == 1
    monkeypatch.setattr(_device_spec, "kfd_gpus", lambda: gpus)
    spec = _device_spec.device_spec()
    assert spec is not None and spec.name == "AMD Instinct MI300X" and spec.source == "table+live"


def test_cpu_live_helpers(tmp_path: Path) -> None:
    from yirage_cpu import _device_spec

    assert _device_spec.parse_size("48K") == 48 * 1024
    assert _device_spec.parse_size("2M") == 2 * 2**20
    assert _device_spec.parse_size("junk") is None
    for index, (level, kind, size) in enumerate(
        [("1", "Data", "32K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K")]
    ):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(level)
        (d / "type").write_text(kind)
        (d / "size").write_text(size)
    assert _device_spec.cache_sizes(tmp_path) == {"L1d": 32 * 1024, "L2": 2**20}
    assert _device_spec.simd_width_bits({"sse2", "avx2", "avx512f"}, "x86_64") == 512
    assert _device_spec.simd_width_bits({"sse2", "avx2"}, "x86_64") == 256
    assert _device_spec.simd_width_bits({"fp", "asimd"}, "aarch64") == 128
    assert _device_spec.simd_width_bits(set(), "riscv64") is None


def test_doctor_reports_everything() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "yirage.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = proc.stdout
    for vendor in VENDORS:
        assert f"\n  {vendor}\n" in out
    for vendor in VENDORS:
        level = yr.get_backend_info(vendor).verification_level
        assert level is not None and f"verified:  {level.value}" in out
    assert "Cache dir:" in out
    for var in yr.ENV_VARS:
        assert var.name in out

    proc = subprocess.run(
        [sys.executable, "-m", "yirage.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    data = json.loads(proc.stdout)
    by_name = {b["name"]: b for b in data["backends"]}
    assert set(VENDORS) <= set(by_name)
    assert by_name["cpu"]["available"] and "cpu" in data["selected_backends"]


def test_doctor_console_script_and_version() -> None:
    exe = Path(sys.executable).with_name("yirage")
    assert exe.exists(), "the `yirage` console script is installed with the package"
    proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert "yirage: " in proc.stdout and "plugin_api: {}.{}".format(*yr.PLUGIN_API) in proc.stdout


def _pci(root: Path, slot: str, vendor: str, device: str, pci_class: str) -> None:
    d = root / slot
    d.mkdir()
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(device + "\n")
    (d / "class").write_text(pci_class + "\n")


@pytest.fixture
def tpu_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """yirage_tpu._probe on a fake machine: an empty PCI bus under tmp_path, a /dev/vfio
    group, no /dev/accel, no jax or libtpu (tests add what they need)."""
    from yirage_tpu import _probe

    monkeypatch.setattr(_probe, "_PCI_DEVICES", tmp_path)
    monkeypatch.setattr(_probe, "accel_nodes", lambda: [])
    monkeypatch.setattr(_probe, "vfio_nodes", lambda: ["/dev/vfio/0"])
    monkeypatch.setattr(_probe, "toolchain", lambda: {})
    monkeypatch.setattr(_probe, "runtime_installed", lambda tools: False)

    def no_jax() -> tuple[str | None, str]:
        raise AssertionError("jax must not be asked without a TPU runtime")

    monkeypatch.setattr(_probe, "jax_tpu_kind", no_jax)
    return _probe


def test_tpu_probe_vfio_of_other_devices_is_no_tpu(tpu_probe: Any, tmp_path: Path) -> None:
    """A server with VFIO passthrough (an Intel NIC, Google's gVNIC and NVMe on a Compute
    Engine VM) has /dev/vfio/<n> but no TPU."""
    _pci(tmp_path, "0000:00:03.0", "0x8086", "0x1572", "0x020000")
    _pci(tmp_path, "0000:00:04.0", "0x1ae0", "0x0042", "0x020000")  # gVNIC
    _pci(tmp_path, "0000:00:05.0", "0x1ae0", "0x001f", "0x010802")  # Google NVMe
    assert tpu_probe.tpu_pci_devices() == []
    assert tpu_probe.device_nodes() == []
    result = tpu_probe.probe()
    assert not result.available, result
    assert "no Google TPU on the PCI bus" in result.reason
    assert "libtpu not installed" in result.reason


@pytest.mark.parametrize(
    ("device", "pci_class", "hardware"),
    [("0x0063", "0x120000", "TPU v5e"), ("0x0099", "0x120000", "Google TPU (PCI device 0x0099)")],
)
def test_tpu_probe_vfio_with_a_google_tpu(
    tpu_probe: Any, tmp_path: Path, device: str, pci_class: str, hardware: str
) -> None:
    _pci(tmp_path, "0000:00:04.0", "0x1ae0", "0x0042", "0x020000")  # gVNIC: not counted
    _pci(tmp_path, "0000:00:05.0", "0x1ae0", device, pci_class)
    assert tpu_probe.tpu_pci_devices() == [hardware]
    result = tpu_probe.probe()
    assert result.available, result
    assert result.hardware == f"{hardware} (1 chip(s))"
    assert "pip install jax[tpu]" in result.reason  # found, but no runtime to use it


def test_tpu_probe_accel_nodes_need_no_pci_info(tpu_probe: Any, monkeypatch) -> None:
    monkeypatch.setattr(tpu_probe, "accel_nodes", lambda: ["/dev/accel0", "/dev/accel1"])
    monkeypatch.setattr(tpu_probe, "vfio_nodes", lambda: [])
    result = tpu_probe.probe()
    assert result.available and result.hardware == "TPU (2 device node(s))"


def test_tpu_probe_asks_jax_where_libtpu_is_installed(tpu_probe: Any, monkeypatch) -> None:
    """No device nodes yirage recognises, but jax with libtpu sees a TPU: available."""
    monkeypatch.setattr(tpu_probe, "vfio_nodes", lambda: [])
    monkeypatch.setattr(tpu_probe, "runtime_installed", lambda tools: True)
    monkeypatch.setattr(tpu_probe, "jax_tpu_kind", lambda: ("TPU v5 lite", "jax sees 4 TPU(s)"))
    result = tpu_probe.probe()
    assert result.available and result.hardware == "TPU v5 lite"
    assert "jax sees 4 TPU(s)" in result.reason
    monkeypatch.setattr(tpu_probe, "jax_tpu_kind", lambda: (None, "jax not installed"))
    result = tpu_probe.probe()
    assert not result.available and "jax not installed" in result.reason


def test_tpu_runtime_check_imports_nothing(monkeypatch) -> None:
    from yirage_tpu import _probe

    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    before = set(sys.modules)
    installed = _probe.runtime_installed({})
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("jax", "libtpu")}
    assert installed == (importlib.util.find_spec("libtpu") is not None)
    assert _probe.runtime_installed({"libtpu": "0.0.1"})
    monkeypatch.setenv("TPU_LIBRARY_PATH", "/lib/libtpu.so")
    assert _probe.runtime_installed({})


@pytest.mark.parametrize(
    ("torch_verdict", "available", "fragment"),
    [
        ((None, "torch not installed"), True, "pip install torch"),
        ((False, "torch.backends.mps.is_available() is False: ..."), False, "is False"),
        ((True, "torch.backends.mps.is_available() is True"), True, "is True"),
    ],
)
def test_mps_probe_says_what_the_runtime_lacks(
    monkeypatch, torch_verdict: tuple[bool | None, str], available: bool, fragment: str
) -> None:
    """On Apple silicon the GPU is there (available, as docs/backends.md defines it); without
    torch the reason names the runtime yirage-mps needs, with torch's MPS unusable the backend
    is unavailable."""
    from yirage_mps import _probe

    mac = SimpleNamespace(system=lambda: "Darwin", machine=lambda: "arm64")
    monkeypatch.setattr(_probe, "platform", mac)
    monkeypatch.setattr(_probe, "toolchain", lambda: {})
    monkeypatch.setattr(_probe, "chip_name", lambda: "Apple M3 Max")
    monkeypatch.setattr(_probe, "torch_mps", lambda: torch_verdict)
    result = _probe.probe()
    assert result.available is available, result
    assert fragment in result.reason and result.hardware == "Apple M3 Max"
    if torch_verdict[0] is None:
        assert "torch is not installed" in result.reason and "MPS" in result.reason
