"""The device registry (``yirage.devices``): the vendor tables and the CPU table with their
sources, lookup by name and alias, custom devices, and searching for a chip by name.

Nothing here reads the host's DeviceSpec: table entries are datasheet figures, and the
searches that compare decisions use pinned custom specs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import yirage as yr
from yirage import _core, devices
from yirage._registry import _get_backend
from yirage._search import device_spec_json

#: A SIMT device whose figures the tests pin (launch gap set explicitly).
PINNED_GPU = yr.DeviceSpec(
    name="pinned test GPU",
    vendor="Pinned",
    arch="test",
    compute_units=64,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=48 * 1024,
    l2_bytes=4 * 2**20,
    mem_bandwidth_gbps=500.0,
    peak_tflops_fp16=50.0,
    peak_tflops_fp32=10.0,
    matrix_tile=(16, 8, 16),
    execution_model="simt",
    launch_overhead_us=2.0,
)


@pytest.fixture(autouse=True)
def _no_custom_devices() -> Iterator[None]:
    """Every test starts and ends without custom devices."""
    devices._REGISTRY.custom.clear()
    yield
    devices._REGISTRY.custom.clear()


def _silu_matmul(m: int = 8, k: int = 256, n: int = 256) -> yr.KernelGraph:
    g = yr.KernelGraph()
    x = g.new_input((m, k), yr.float32)
    w = g.new_input((k, n), yr.float32)
    g.mark_output(g.silu(g.matmul(x, w)))
    return g


# -- the registry ---------------------------------------------------------------------------------


def test_the_registry_lists_at_least_25_chips_of_every_vendor_family() -> None:
    entries = devices.list_devices()
    assert len(entries) >= 25
    by_backend = {b: devices.list_devices(backend=b) for b in ("cuda", "rocm", "mps", "tpu")}
    by_backend |= {b: devices.list_devices(backend=b) for b in ("ascend", "cpu")}
    for backend, found in by_backend.items():
        assert found, f"no {backend} chips"
    vendors = {e.spec.vendor for e in entries}
    assert {"NVIDIA", "AMD", "Apple", "Huawei", "Google", "Intel"} <= vendors
    assert all(e.spec.execution_model is not None for e in entries)
    # registry names are unique per backend
    keys = [(e.backend, e.name) for e in entries]
    assert len(keys) == len(set(keys))


def test_the_registry_holds_every_vendor_table_entry_through_the_backend_api() -> None:
    for backend in ("cuda", "rocm", "mps", "ascend", "tpu"):
        table = _get_backend(backend).known_devices()
        listed = {e.name: e for e in devices.list_devices(backend=backend)}
        assert set(table) == set(listed), backend
        for key, spec in table.items():
            # the registry adds the link and power figures of yirage._interconnect
            added = {
                f: getattr(spec, f)
                for f in ("link_bandwidth_gbps", "link_latency_us", "power_watts")
            }
            assert dataclasses.replace(listed[key].spec, **added) == spec
            assert listed[key].origin == f"yirage-{backend} table"


def test_every_entry_names_its_sources() -> None:
    for e in devices.list_devices():
        assert e.sources, e.name
        # a table entry of yirage's own packages cites documents, not just its table
        assert not any(s.endswith(f", {e.spec.name}") for s in e.sources), (e.name, e.sources)
    assert any("MI300X data sheet" in s for s in devices.get_device("MI300X").sources)
    assert any("cloud.google.com/tpu/docs/v5e" in s for s in devices.get_device("v5e").sources)


def test_no_two_entries_answer_to_the_same_name() -> None:
    seen: dict[str, str] = {}
    for e in devices.list_devices():
        for n in e.names:
            key = devices._norm(n)
            assert seen.setdefault(key, e.name) == e.name, (n, seen[key], e.name)


def test_cpu_entries_follow_the_cpu_backends_block_budget_and_channel_bandwidth() -> None:
    from yirage_cpu._device_spec import block_bytes

    epyc = devices.get_device_spec("EPYC 9654")
    # 12 channels of DDR5-4800, 8 bytes a transfer: AMD's 460.8 GB/s per socket
    assert epyc.mem_bandwidth_gbps == pytest.approx(460.8)
    assert epyc.execution_model == "cpu" and epyc.compute_units == 96
    for e in devices.list_devices(backend="cpu"):
        l1d = {"Intel": 48 * 1024, "AMD": 32 * 1024, "Amazon": 64 * 1024}[e.spec.vendor]
        assert e.spec.l2_bytes is not None
        expected = block_bytes({"L1d": l1d, "L2": e.spec.l2_bytes})
        assert e.spec.shared_mem_per_block == expected, e.name


# -- lookup ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("MI300X", "MI300X"),
        ("mi300x", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD MI300X", "MI300X"),
        ("rocm:MI300X", "MI300X"),
        ("H100", "H100 SXM"),
        ("h100-sxm", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("A100", "A100 80GB"),
        ("tpu v5 lite", "TPU v5e"),
        ("v6e", "TPU v6e"),
        ("910B2", "Ascend 910B2"),
        ("apple m3 max", "M3 Max"),
        ("Radeon RX 7900 XTX", "RX7900XTX"),
        ("8480+", "Xeon Platinum 8480+"),
        ("graviton_3", "Graviton3"),
    ],
)
def test_lookup_is_case_insensitive_and_knows_aliases(name: str, key: str) -> None:
    assert devices.get_device(name).name == key
    assert yr.get_device_spec(name) == devices.get_device(key).spec


def test_an_unknown_name_lists_close_matches() -> None:
    with pytest.raises(devices.UnknownDeviceError) as exc:
        yr.get_device_spec("MI300")
    assert "MI300X" in exc.value.close_matches
    assert "close matches: MI300X" in str(exc.value)
    assert "register_custom_device" in str(exc.value)
    with pytest.raises(devices.UnknownDeviceError) as exc:
        yr.get_device_spec("H100 PCIe")
    assert exc.value.close_matches[0] == "H100 SXM"
    with pytest.raises(devices.UnknownDeviceError) as exc:
        yr.get_device_spec("qqqqqq")
    assert exc.value.close_matches == ()
    assert isinstance(exc.value, yr.ConfigError)
    with pytest.raises(yr.ConfigError, match="non-empty string"):
        yr.get_device_spec("  ")


def test_a_backend_prefix_restricts_the_lookup() -> None:
    with pytest.raises(devices.UnknownDeviceError):
        yr.get_device_spec("cuda:MI300X")


# -- custom devices -------------------------------------------------------------------------------


def test_a_custom_device_is_found_by_name_and_alias_and_can_be_removed() -> None:
    entry = yr.register_custom_device(
        PINNED_GPU, backend="pinned", aliases=("PTG",), sources=("test datasheet",)
    )
    assert entry.origin == "custom" and entry.backend == "pinned"
    assert devices.get_device("ptg") is entry
    assert yr.get_device_spec("Pinned Test GPU") == PINNED_GPU
    assert devices.list_devices()[0] is entry
    assert devices.unregister_custom_device("PTG") is entry
    with pytest.raises(devices.UnknownDeviceError):
        yr.get_device_spec("PTG")
    with pytest.raises(yr.ConfigError, match="no custom device"):
        devices.unregister_custom_device("MI300X")


def test_a_duplicate_name_is_refused_unless_replace() -> None:
    yr.register_custom_device(PINNED_GPU)
    with pytest.raises(yr.ConfigError, match="replace=True"):
        yr.register_custom_device(PINNED_GPU)
    faster = dataclasses.replace(PINNED_GPU, mem_bandwidth_gbps=900.0)
    yr.register_custom_device(faster, replace=True)
    assert yr.get_device_spec("pinned test GPU").mem_bandwidth_gbps == 900.0
    assert len([e for e in devices.list_devices() if e.origin == "custom"]) == 1
    # an alias that a table entry answers to clashes too
    with pytest.raises(yr.ConfigError, match="clashes with 'H100 SXM'"):
        yr.register_custom_device(dataclasses.replace(PINNED_GPU, name="x"), aliases=("H100",))


def test_replacing_a_table_entry_hides_it_until_the_custom_one_is_removed() -> None:
    table = yr.get_device_spec("H100")
    tuned = dataclasses.replace(table, launch_overhead_us=1.0)
    yr.register_custom_device(tuned, backend="cuda", aliases=("H100",), replace=True)
    assert yr.get_device_spec("H100").launch_overhead_us == 1.0
    assert len(devices.list_devices(backend="cuda")) == 4  # replaced, not added
    devices.unregister_custom_device("H100")
    assert yr.get_device_spec("H100") == table


def test_a_custom_device_is_validated_as_the_search_reads_it() -> None:
    with pytest.raises(yr.ConfigError, match="set execution_model"):
        yr.register_custom_device(dataclasses.replace(PINNED_GPU, execution_model=None))
    with pytest.raises(yr.ConfigError, match="compute_units must be ≥ 1"):
        yr.register_custom_device(dataclasses.replace(PINNED_GPU, compute_units=0))
    with pytest.raises(yr.ConfigError, match="mem_bandwidth_gbps must be a finite number"):
        yr.register_custom_device(dataclasses.replace(PINNED_GPU, mem_bandwidth_gbps=-1.0))
    with pytest.raises(yr.ConfigError, match=r"takes a yirage\.DeviceSpec"):
        yr.register_custom_device(PINNED_GPU.to_dict())  # type: ignore[arg-type]
    with pytest.raises(yr.ConfigError, match="needs a name"):
        yr.register_custom_device(dataclasses.replace(PINNED_GPU, name=" "))
    assert not [e for e in devices.list_devices() if e.origin == "custom"]
    # a figure left out is estimated by the search, which says so
    partial = dataclasses.replace(PINNED_GPU, name="partial GPU", mem_bandwidth_gbps=None)
    yr.register_custom_device(partial)
    notes = yr.search(_silu_matmul(), device="partial GPU", cache=False).report.notes
    assert any("mem_bandwidth_gbps unknown, estimated as 500" in n for n in notes), notes


# -- searching for a chip by name -----------------------------------------------------------------


def test_search_for_a_named_chip_uses_its_spec_and_says_it_is_a_prediction() -> None:
    g = _silu_matmul()
    by_name = yr.search(g, device="MI300X", cache=False)
    spec = devices.get_device_spec("MI300X")
    by_spec = yr.search(g, backend="rocm", device_spec=spec, cache=False)
    assert by_name.device_spec == device_spec_json(spec, "rocm")[0]
    assert by_name.report.backend == "rocm"
    assert [c.hash for c in by_name.candidates] == [c.hash for c in by_spec.candidates]
    assert [c.predicted_us for c in by_name.candidates] == [
        c.predicted_us for c in by_spec.candidates
    ]
    note = by_name.report.notes[-1]
    assert "MI300X" in note and "cost model's predictions alone" in note
    assert by_name.extra == {"device": "MI300X", "prediction_only": True}
    best = by_name.best
    assert best.predicted_us == pytest.approx(
        _core.predicted_us(best.graph._g, by_name.device_spec)
    )
    # a cached answer carries the note as well
    again = yr.search(g, device="MI300X")
    assert again.report.notes[-1] == note


def test_search_for_a_named_chip_chooses_by_its_figures() -> None:
    g = _silu_matmul()
    yr.register_custom_device(PINNED_GPU)
    free = dataclasses.replace(PINNED_GPU, name="pinned free-launch GPU", launch_overhead_us=0.0)
    yr.register_custom_device(free)
    fused = yr.search(g, device="pinned test GPU", cache=False).best
    library = yr.search(g, device="pinned free-launch GPU", cache=False).best
    # with free launches the two library kernels win; with 2 us each the fused kernel does
    assert library.baseline and not fused.baseline
    assert "matmul" in fused.label


def test_table_chips_differ_in_what_the_search_picks() -> None:
    g = _silu_matmul()
    picks = {d: yr.search(g, device=d, cache=False).best for d in ("MI300X", "TPU v5e", "M1")}
    # MI300X splits the 256 output columns over 16 blocks, the M1 over 8; the TPU v5e (one
    # TensorCore, blocks of 128 lanes) keeps one block
    assert picks["MI300X"].label.startswith("custom[grid=16x1x1"), picks
    assert picks["M1"].label.startswith("custom[grid=8x1x1"), picks
    assert picks["TPU v5e"].label.startswith("custom[grid=1x1x1"), picks
    assert len({c.predicted_us for c in picks.values()}) == 3, picks


def test_search_refuses_device_and_device_spec_together() -> None:
    with pytest.raises(yr.ConfigError, match="not both"):
        yr.search(_silu_matmul(), device="H100", device_spec=PINNED_GPU, cache=False)
    with pytest.raises(devices.UnknownDeviceError, match="close matches: MI300X"):
        yr.search(_silu_matmul(), device="MI300", cache=False)


def test_the_docs_table_lists_every_registry_name() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    section = docs.split("## Device registry")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 2 and cells[0] not in ("backend", "---"):
            rows[cells[0]] = [re.sub(r" \(.*\)$", "", n) for n in cells[1].split(", ")]
    listed = {}
    for e in devices.list_devices():
        listed.setdefault(e.backend, []).append(e.name)
    assert rows == listed


def test_superoptimize_takes_a_device_name_as_its_pinned_spec() -> None:
    """The chip's spec shapes the search; the candidates are built and timed here."""
    g = _silu_matmul()
    k = yr.superoptimize(
        g,
        backend="cpu",
        device="EPYC 9654",
        top_k=1,
        cache=False,
        profile_options={"min_time_s": 0.01, "min_repeats": 5},
    )
    assert any(
        "DeviceSpec given as device_spec=" in n and "AMD EPYC 9654" in n for n in k.report.notes
    ), k.report.notes
    assert k.report.device == yr.get_backend_info("cpu").device_spec.name  # ran here
    with pytest.raises(yr.ConfigError, match="not both"):
        yr.superoptimize(g, backend="cpu", device="EPYC 9654", device_spec=PINNED_GPU)
    with pytest.raises(devices.UnknownDeviceError):
        yr.superoptimize(g, backend="cpu", device="EPYC 965")
