"""DeviceSpec capability fields: the dataclass, the core's parsing, and the cost model reading
capabilities (execution model, launch overhead) instead of the vendor name."""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

import pytest
from _search_graphs import H100, gated_mlp

import yirage as yr
from yirage import _core
from yirage._device_spec import EXECUTION_MODELS
from yirage._search import device_spec_json

#: backend name -> the execution model its tables must state
_MODELS = {
    "cpu": "cpu",
    "cuda": "simt",
    "rocm": "simt",
    "mps": "simt",
    "ascend": "tile",
    "tpu": "tile",
}


def _tables(backend: str) -> dict[str, yr.DeviceSpec]:
    module = importlib.import_module(f"yirage_{backend}._device_spec")
    table: dict[str, yr.DeviceSpec] = module.KNOWN_DEVICES
    return table


def _spec(**changes: Any) -> yr.DeviceSpec:
    base = yr.DeviceSpec(
        name="test GPU",
        vendor="Test",
        arch="t1",
        compute_units=64,
        warp_size=32,
        max_threads_per_block=1024,
        shared_mem_per_block=96 * 1024,
        l2_bytes=8 * 2**20,
        mem_bandwidth_gbps=1000.0,
        peak_tflops_fp16=100.0,
        peak_tflops_fp32=20.0,
        matrix_tile=(16, 8, 16),
        execution_model="simt",
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("backend", sorted(_MODELS))
def test_every_table_states_its_execution_model_and_the_core_reads_it(backend: str) -> None:
    table = _tables(backend)
    if backend == "cpu":
        from yirage_cpu._device_spec import device_spec

        table = {"live": device_spec()}
    assert table, backend
    for key, spec in table.items():
        assert spec.execution_model == _MODELS[backend], (backend, key)
        core = json.loads(device_spec_json(spec, backend)[0])
        assert core["execution_model"] == _MODELS[backend], (backend, key)
        assert core.get("launch_overhead_us") == spec.launch_overhead_us


def test_to_json_round_trips_through_the_core() -> None:
    spec = _spec(launch_overhead_us=4.5, execution_model="tile")
    assert yr.DeviceSpec(**_from_json(spec.to_json())) == spec
    core, notes = device_spec_json(spec, "test")
    assert not notes
    parsed = json.loads(core)
    assert parsed["execution_model"] == "tile"
    assert parsed["launch_overhead_us"] == 4.5
    assert parsed["matrix_tile"] == [16, 8, 16]
    # canonical: parsing the core's own JSON gives it back unchanged
    assert _core.device_spec_json(core) == core


def _from_json(text: str) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(text)
    for key in ("matrix_tile", "isa_features"):
        if d[key] is not None:
            d[key] = tuple(d[key])
    return d


def test_isa_features_are_recorded_shown_and_kept_from_the_core() -> None:
    spec = _spec(execution_model="cpu", isa_features=("avx512f", "avx512_bf16"))
    assert yr.DeviceSpec(**_from_json(spec.to_json())) == spec
    assert json.loads(spec.to_json())["isa_features"] == ["avx512f", "avx512_bf16"]
    assert "ISA avx512f avx512_bf16" in spec.summary()
    core, _ = device_spec_json(spec, "cpu")
    assert "isa_features" not in json.loads(core)  # the search does not read them
    assert json.loads(_spec().to_json())["isa_features"] is None


def test_a_bad_execution_model_is_refused_naming_the_field_and_the_values() -> None:
    with pytest.raises(yr.ConfigError, match="execution_model") as exc:
        _spec(execution_model="gpu")  # type: ignore[arg-type]
    for model in EXECUTION_MODELS:
        assert repr(model) in str(exc.value)
    assert "'gpu'" in str(exc.value)
    with pytest.raises(yr.ConfigError, match="launch_overhead_us"):
        _spec(launch_overhead_us=-1.0)
    with pytest.raises(yr.ConfigError, match="launch_overhead_us"):
        _spec(launch_overhead_us=float("nan"))
    # the core checks a JSON that bypasses the dataclass the same way
    raw = json.loads(H100)
    raw["execution_model"] = "warp"
    with pytest.raises(yr.ConfigError, match=r'execution_model must be one of "simt", "cpu"'):
        device_spec_json(json.dumps(raw))


def test_a_spec_without_execution_model_is_derived_only_for_the_old_backend_names() -> None:
    old = _spec(execution_model=None)
    assert json.loads(device_spec_json(old, "cuda")[0])["execution_model"] == "simt"
    assert json.loads(device_spec_json(old, "tpu")[0])["execution_model"] == "tile"
    cpu = _spec(execution_model=None, warp_size=None, max_threads_per_block=None)
    assert json.loads(device_spec_json(cpu, "cpu")[0])["execution_model"] == "cpu"
    with pytest.raises(yr.ConfigError, match="execution_model is missing") as exc:
        device_spec_json(old, "newchip")
    assert '"simt", "cpu", "tile"' in str(exc.value)
    # with the field, any backend name is fine
    assert json.loads(device_spec_json(_spec(), "newchip")[0])["execution_model"] == "simt"


def _predicted(spec: yr.DeviceSpec, backend: str) -> float:
    graph = gated_mlp(8, 256, 256)
    return _core.predicted_us(graph._g, device_spec_json(spec, backend)[0])


def test_the_cost_model_reads_capabilities_not_the_vendor_name() -> None:
    spec = _spec()
    assert _predicted(spec, "cuda") == _predicted(dataclasses.replace(spec, vendor="X"), "x")
    # the launch overhead alone changes the prediction (two library kernels: twice)
    quick = _predicted(_spec(launch_overhead_us=0.0), "x")
    slow = _predicted(_spec(launch_overhead_us=10.0), "x")
    assert slow > quick
    # and so does the execution model alone (a tile machine: its own default launch gap)
    assert _predicted(_spec(execution_model="tile"), "x") != _predicted(spec, "x")


def test_search_decisions_follow_the_launch_overhead_not_the_vendor_name() -> None:
    g = yr.KernelGraph()
    x = g.new_input((8, 256), yr.float32)
    w = g.new_input((256, 256), yr.float32)
    g.mark_output(g.silu(g.matmul(x, w)))

    def best(spec: yr.DeviceSpec, backend: str) -> tuple[bool, str]:
        res = yr.search(g, backend=backend, device_spec=spec, cache=False)
        return res.best.baseline, res.best.label

    default = best(_spec(), "x")
    assert default == best(dataclasses.replace(_spec(), vendor="Other"), "y")
    assert not default[0], default
    # with free launches the two library kernels of the baseline win
    assert best(_spec(launch_overhead_us=0.0), "x")[0]


def test_summary_names_the_execution_model() -> None:
    assert "simt execution" in _spec().summary()
