"""The benchmark harness (``yirage bench``): timing, roofline, report, correctness flags.

CPU and fast: tiny shapes through workload copies with a test-only ``"cpu"`` preset, fixed
device rates, torch.compile off except in one test. The GPU timing paths are marked ``cuda``
(``nox -s tests-cuda``)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

import yirage as yr  # noqa: E402
from yirage import _env, _workloads  # noqa: E402
from yirage._bench import _harness, _report, _roofline, _timing  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RATES = _roofline.DeviceRates(copy_bw_Bps=20e9, matmul_flops=100e9, detail={"fixed": True})

TINY = {
    "rmsnorm_linear": {"b": 4, "h": 64, "n": 48, "dtype": yr.float32},
    "rms_norm": {"b": 4, "h": 64, "dtype": yr.float32},
    "norm_transformer": {"b": 4, "h": 64, "dtype": yr.float32},
    "gated_mlp": {"b": 4, "h": 64, "n": 32, "dtype": yr.float32},
    "lora": {"b": 4, "h": 64, "n": 32, "r": 4, "dtype": yr.float32},
    "gqa_decode": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 16, "kv": 64, "dtype": yr.float32},
    "qknorm_gqa": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 16, "kv": 64, "dtype": yr.float32},
    "attention_prefill": {
        "b": 2,
        "q_heads": 3,
        "kv_heads": 3,
        "d": 8,
        "kv": 24,
        "q_len": 16,
        "dtype": yr.float32,
    },
}


def tiny(name: str, **replace: Any) -> _workloads.Workload:
    """The workload ``name`` with only a tiny "cpu" preset (test-only shape override)."""
    return dataclasses.replace(_workloads.get_workload(name), shapes={"cpu": TINY[name]}, **replace)


class _FakeReport:
    search_s = 0.5
    codegen_compile_s = 0.25
    check_s = 0.01
    profile_s = 0.02
    predicted_us = 1.0
    measured_us = 2.0
    max_rel_err = 0.0
    chosen_description = "fake: the workload's torch reference"
    chosen_variant = "fake_variant"
    chosen_is_library_baseline = True
    verification_level = "test double"

    def __init__(self, from_cache: bool) -> None:
        self.from_cache = from_cache


class FakeOptimizer:
    """Stands in for superoptimize in harness-mechanics tests: the "kernel" runs the torch
    reference of the workload whose graph it was given; the second call per graph reports a
    cache hit; it records the YIRAGE_CACHE_DIR it saw and the options of each call."""

    def __init__(self, workloads: list[_workloads.Workload]) -> None:
        self.by_hash = {w.graph("cpu").hash(): w for w in workloads}
        self.calls: dict[str, int] = {}
        self.cache_dirs: list[str | None] = []
        self.options: list[dict[str, Any]] = []

    def __call__(self, graph: yr.KernelGraph, backend: str, **options: Any) -> Any:
        assert backend == "cpu"
        assert set(options) <= {"config", "cache_noisy"}
        self.options.append(options)
        h = graph.hash()
        self.calls[h] = self.calls.get(h, 0) + 1
        self.cache_dirs.append(_env.YIRAGE_CACHE_DIR.raw())
        wl = self.by_hash[h]

        class Kernel:
            report = _FakeReport(from_cache=self.calls[h] > 1)

            def __call__(self, *tensors: Any) -> list[Any]:
                return wl.reference(*tensors)

        return Kernel()


def _cfg(tmp_path: Path, **kw: Any) -> _harness.BenchConfig:
    base: dict[str, Any] = {
        "backend": "cpu",
        "out": tmp_path / "results",
        "compile_mode": None,
        "rates": RATES,
        "cpu_rounds": 1,
        "cpu_min_time_s": 0.01,
        "cpu_min_repeats": 3,
    }
    base.update(kw)
    return _harness.BenchConfig(**base)


# -- timing ------------------------------------------------------------------------------------


def test_wall_median_counts_repeats_and_time() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        time.sleep(0.002)

    t = _timing.wall_median(fn, warmup=2, min_repeats=5, min_time_s=0.0)
    assert t.method == "wall"
    assert t.repeats == 5 and len(calls) == 7
    assert 2000 <= t.median_us < 200_000
    assert t.min_us <= t.median_us
    t = _timing.wall_median(lambda: None, warmup=0, min_repeats=1, min_time_s=0.02)
    assert t.repeats > 1 and sum(t.samples_us) >= 0
    with pytest.raises(ValueError):
        _timing.wall_median(lambda: None, min_repeats=0)
    with pytest.raises(TypeError):
        _timing.wall_median(42)  # type: ignore[arg-type]


def test_wall_median_is_the_median(monkeypatch: pytest.MonkeyPatch) -> None:
    # a scripted clock: the three measured calls take 1, 10 and 3 ms
    ticks = iter([0, 1_000_000, 1_000_000, 11_000_000, 11_000_000, 14_000_000])
    monkeypatch.setattr(_timing.time, "perf_counter_ns", lambda: next(ticks))
    t = _timing.wall_median(lambda: None, warmup=2, min_repeats=3, min_time_s=0.0)
    assert t.samples_us == (1000.0, 10000.0, 3000.0)
    assert t.median_us == 3000.0


def test_timing_quartiles_and_spread() -> None:
    t = _timing.Timing("wall", 3.0, (5.0, 1.0, 3.0, 2.0, 4.0))
    assert t.quantile_us(0.25) == 2.0 and t.quantile_us(0.75) == 4.0
    assert t.spread == 2.0 and t.min_us == 1.0
    d = t.to_dict()
    assert d["q1_us"] == 2.0 and d["q3_us"] == 4.0 and d["repeats"] == 5
    assert _timing.Timing("wall", 1.0, (1.0, 1.0, 1.0)).spread == 1.0


# -- roofline ----------------------------------------------------------------------------------


def test_roofline_against_hand_computation() -> None:
    wl = _workloads.get_workload("rmsnorm_linear")
    g = wl.graph("cpu")  # X[8,1024] @ W[1024,1536], float32
    b, h, n = 8, 1024, 1536
    nbytes = 4 * (b * h + h * n + b * n)
    flops = 2 * b * h * n
    assert _roofline.graph_min_bytes(g, 4) == nbytes
    assert _roofline.graph_flops(g) == flops
    # memory-bound at 20 GB/s and 100 GFLOP/s: 6 373 376 B / 20 GB/s = 318.67 µs > 251.7 µs
    expected = max(nbytes / 20e9, flops / 100e9) * 1e6
    assert expected == pytest.approx(318.6688)
    assert _roofline.roofline_us(nbytes, flops, 20e9, 100e9) == pytest.approx(expected)
    # compute-bound when the matmul rate is low
    assert _roofline.roofline_us(nbytes, flops, 20e9, 1e9) == pytest.approx(flops / 1e9 * 1e6)
    with pytest.raises(ValueError):
        _roofline.roofline_us(1, 1, 0, 1)


def test_roofline_flops_of_batched_matmuls() -> None:
    wl = _workloads.get_workload("gqa_decode")
    g = wl.graph("gpu")  # Q[16,4,128] Kt[16,128,4096] V[16,4096,128]
    bb, grp, d, kv = 16, 4, 128, 4096
    assert _roofline.graph_flops(g) == 2 * (2 * bb * grp * d * kv)
    assert _roofline.graph_min_bytes(g, 2) == 2 * (bb * grp * d * 2 + 2 * bb * d * kv)
    lora = _workloads.get_workload("lora").graph("cpu")  # X[8,1024] W[1024,1024] A[1024,16]
    assert _roofline.graph_flops(lora) == 2 * (8 * 1024 * 1024 + 8 * 1024 * 16 + 8 * 16 * 1024)


def test_measured_rates_are_positive() -> None:
    bw, detail = _roofline.measure_copy_bandwidth("cpu", nbytes=8 << 20)
    assert bw > 1e8 and detail["copy_bytes"] == 8 << 20
    rate, mm = _roofline.measure_matmul_rate("cpu", "float32", n=128)
    assert rate > 1e7 and mm["n"] == 128


# -- cases -------------------------------------------------------------------------------------


def test_cases_follow_targets() -> None:
    cases, notes = _harness.select_cases("all", "gpu")
    assert [c.name for c in cases] == [
        "rmsnorm_linear_b8",
        "rmsnorm_linear_b1",
        "rmsnorm_linear_b16",
        "rms_norm_b8",
        "rms_norm_b1",
        "rms_norm_b16",
        "norm_transformer_b8",
        "norm_transformer_b1",
        "norm_transformer_b16",
        "gated_mlp_b8",
        "gated_mlp_b1",
        "gated_mlp_b16",
        "lora_b16",
        "lora_b1",
        "gqa_decode_b8_kv4096",
        "gqa_decode_b8_kv16384",
        "qknorm_gqa_b8_kv4096",
    ]
    assert notes == [
        "attention_prefill: no 'gpu' shape preset (presets: cpu, prefill_1024, prefill_4096, "
        "ragged_prime); "
        "not run"
    ]
    cpu, _ = _harness.select_cases(["all"], "cpu")
    assert [c.name for c in cpu] == [
        "rmsnorm_linear_b8",
        "rms_norm_b8",
        "norm_transformer_b8",
        "gated_mlp_b8",
        "lora_b8",
        "gqa_decode_b2_kv1024",
        "attention_prefill_b1_q64_kv256",
        "qknorm_gqa_b2_kv1024",
    ]
    one, _ = _harness.select_cases(["gqa_decode_b8_kv16384"], "gpu")
    assert [(c.workload.name, c.preset) for c in one] == [("gqa_decode", "gpu_kv16384")]
    paper, notes = _harness.select_cases(["lora", "gqa_decode"], "paper")
    assert [c.name for c in paper] == ["lora_b16"]
    assert len(notes) == 1 and "gqa_decode" in notes[0]
    with pytest.raises(yr.ConfigError):
        _harness.select_cases(["no_such_workload"], "cpu")


def test_model_presets_are_cpu_model_sizes_in_float32_and_bfloat16() -> None:
    """``--shapes model``: the four model-size cases of issue #32, each in float32 and
    bfloat16 (named apart), at hidden 4096 and GQA decode kv 8192, and RMSNorm + Linear and
    gated MLP at a prime hidden size and at an odd output size (named by them)."""
    cases, notes = _harness.select_cases("all", "model")
    assert [c.name for c in cases] == [
        "rmsnorm_linear_b8",
        "rmsnorm_linear_b8_bf16",
        "rmsnorm_linear_b8_h4099",
        "rmsnorm_linear_b8_h4096_n6151",
        "gated_mlp_b8",
        "gated_mlp_b8_bf16",
        "gated_mlp_b8_h4099",
        "gated_mlp_b8_h4096_n11003",
        "lora_b8",
        "lora_b8_bf16",
        "gqa_decode_b1_kv8192",
        "gqa_decode_b1_kv8192_bf16",
    ]
    # rms_norm, norm_transformer, attention_prefill, qknorm_gqa have no model preset
    assert len(notes) == 4
    dims = {c.name: c.workload.input_dims(c.preset) for c in cases}
    assert dims["rmsnorm_linear_b8"] == [(8, 4096), (4096, 6144)]
    assert dims["gated_mlp_b8_bf16"] == [(8, 4096), (4096, 11008), (4096, 11008)]
    assert dims["rmsnorm_linear_b8_h4099"] == [(8, 4099), (4099, 6144)]
    assert dims["gated_mlp_b8_h4096_n11003"] == [(8, 4096), (4096, 11003), (4096, 11003)]
    assert dims["lora_b8"] == [(8, 4096), (4096, 4096), (4096, 16), (16, 4096)]
    assert dims["gqa_decode_b1_kv8192"] == [(2, 4, 128), (2, 128, 8192), (2, 8192, 128)]
    assert {c.workload.dtype(c.preset).name for c in cases} == {"float32", "bfloat16"}
    assert all(
        c.workload.dtype(c.preset).name == ("bfloat16" if c.name.endswith("_bf16") else "float32")
        for c in cases
    )


def test_batch_overrides_every_preset() -> None:
    cases, _ = _harness.select_cases(["rms_norm", "gqa_decode"], "gpu")
    batched = _harness.with_batch(cases, 4)
    # gpu, gpu_b1 and gpu_b16 of rms_norm coincide at b=4 and run once; the two kv presets
    # of gqa_decode stay apart
    assert [c.name for c in batched] == [
        "rms_norm_b4",
        "gqa_decode_b4_kv4096",
        "gqa_decode_b4_kv16384",
    ]
    assert batched[0].workload.input_dims("gpu") == [(4, 4096), (4096,)]
    # GQA's first dim holds b·kv_heads rows
    assert batched[1].workload.input_dims("gpu")[0] == (4 * 2, 4, 128)
    for bad in (0, -1, True):
        with pytest.raises(yr.ConfigError, match="positive int"):
            _harness.with_batch(cases, bad)


def test_dims_and_dtype_override_every_selected_preset() -> None:
    """``--dims h=3000 n=5000 --dtype bfloat16``: the graph, its inputs and the case name take
    the sizes; a size some workload lacks and a bad dtype are refused with what exists."""
    cases, _ = _harness.select_cases(["rmsnorm_linear", "gated_mlp"], "ragged")
    sized = _harness.with_shape(cases, {"h": 3000, "n": 5000}, "bfloat16")
    assert [c.name for c in sized] == [
        "rmsnorm_linear_b8_h3000_n5000_bf16",
        "gated_mlp_b8_h3000_n5000_bf16",
    ]
    assert sized[0].workload.input_dims("ragged") == [(8, 3000), (3000, 5000)]
    assert sized[1].workload.dtype("ragged").name == "bfloat16"
    # the two ragged presets of a workload coincide once both sizes are set: one case each
    lora, _ = _harness.select_cases(["lora"], "gpu")
    ranked = _harness.with_shape(lora, {"r": 8}, "float32")
    assert [c.name for c in ranked] == ["lora_b16_r8_f32", "lora_b1_r8_f32"]
    assert ranked[0].workload.input_dims("gpu")[2] == (4096, 8)
    with pytest.raises(yr.ConfigError, match=r"has no size 'n'; its sizes: b, h\b"):
        _harness.with_shape(_harness.select_cases(["rms_norm"], "gpu")[0], {"n": 64})
    with pytest.raises(yr.ConfigError, match="must be one of float16, bfloat16, float32"):
        _harness.with_shape(cases, {}, "int8")
    with pytest.raises(yr.ConfigError, match="h must be a positive int"):
        _harness.with_shape(cases, {"h": 0})
    gqa, _ = _harness.select_cases(["gqa_decode"], "gpu")
    with pytest.raises(yr.ConfigError, match="cannot take"):
        _harness.with_shape(gqa, {"q_heads": 3})  # 3 query heads over 2 KV heads


def test_prefill_presets_list_the_attention_prefill_cases() -> None:
    """``--shapes prefill``: RMSNorm + Linear and gated MLP at 256/1024/4096 rows and attention
    prefill at 1024 and 4096 query rows (32 heads, d 128, float16); each preset alone too."""
    cases, _ = _harness.select_cases("all", "prefill")
    names = [c.name for c in cases]
    assert names[-2:] == ["attention_prefill_b1_q1024_kv1024", "attention_prefill_b1_q4096_kv4096"]
    assert sum(n.startswith("rmsnorm_linear") for n in names) == 3
    assert sum(n.startswith("gated_mlp") for n in names) == 3
    one, notes = _harness.select_cases(["attention_prefill"], "prefill_4096")
    assert [c.name for c in one] == ["attention_prefill_b1_q4096_kv4096"] and not notes
    wl = one[0].workload
    assert wl.input_dims("prefill_4096") == [(32, 4096, 128), (32, 128, 4096), (32, 4096, 128)]
    assert wl.dtype("prefill_4096") == yr.float16 and wl.has_expert
    assert wl.input_dims("prefill_1024")[0] == (32, 1024, 128)


def _np_attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(Q·Kt/√d)·V per head (the leading dim), max-shifted, in float64."""
    s = np.einsum("hqd,hdk->hqk", q, kt) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("hqk,hkd->hqd", p / p.sum(axis=-1, keepdims=True), v)


def test_attention_prefill_matches_a_float64_reference() -> None:
    """The graph the search gets, the torch reference and the SDPA expert all compute
    softmax(Q·Kᵀ/√d)·V per head over q_len query rows (2 batches of 3 heads, 16 by 24)."""
    wl = tiny("attention_prefill")
    assert wl.input_dims("cpu") == [(6, 16, 8), (6, 8, 24), (6, 24, 8)]
    arrays = [a.astype(np.float64) for a in wl.inputs("cpu", seed=5, numpy=True)]
    expected = _np_attention(*arrays)
    tensors = [torch.from_numpy(a) for a in arrays]
    (ref,) = wl.reference(*tensors)
    np.testing.assert_allclose(ref.numpy(), expected, rtol=1e-12, atol=1e-12)
    (sdpa,) = wl.expert(*tensors)
    np.testing.assert_allclose(sdpa.numpy(), expected, rtol=1e-10, atol=1e-12)
    (ev,) = wl.graph("cpu").evaluate(arrays)
    np.testing.assert_allclose(ev, expected, rtol=1e-10, atol=1e-12)


def test_bench_searches_without_presets_unless_asked(tmp_path: Path) -> None:
    """The default search, as a user calls it; ``--search-presets`` passes each workload's
    preset (recorded in the row and in run.json's settings and command)."""
    wl = tiny("gated_mlp")
    assert wl.search_config == "mlp"
    fake = FakeOptimizer([wl])
    results, folder = _harness.run_bench([wl], _cfg(tmp_path, superoptimize=fake))
    assert all("config" not in o for o in fake.options)
    assert results["rows"][0]["yirage_search_config"] is None
    run = json.loads((folder / "run.json").read_text())
    assert run["settings"]["search_presets"] is False
    fake.options.clear()
    results, folder = _harness.run_bench(
        [wl], _cfg(tmp_path, superoptimize=fake, search_presets=True)
    )
    assert [o.get("config") for o in fake.options] == ["mlp", "mlp"]
    assert results["rows"][0]["yirage_search_config"] == "mlp"
    run = json.loads((folder / "run.json").read_text())
    assert run["settings"]["search_presets"] is True and "--search-presets" in run["command"]


# the workloads' torch references against numpy in float64, written out independently
def _np_rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + _workloads.EPS)


def _np_rms_norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _np_rms(x) * w


def _np_norm_transformer(h: np.ndarray, a: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return h + _np_rms(a) * alpha


@pytest.mark.parametrize(
    ("name", "numpy_ref"),
    [("rms_norm", _np_rms_norm), ("norm_transformer", _np_norm_transformer)],
)
def test_norm_workloads_match_float64_references(name: str, numpy_ref: Any) -> None:
    wl = tiny(name)
    arrays = wl.inputs("cpu", seed=3, numpy=True)
    expected = numpy_ref(*[a.astype(np.float64) for a in arrays])
    (ref,) = wl.reference(*[torch.from_numpy(a.astype(np.float64)) for a in arrays])
    np.testing.assert_allclose(ref.numpy(), expected, rtol=1e-12, atol=1e-12)
    # the graph the search is given computes the same thing (its float64 evaluator)
    (ev,) = wl.graph("cpu").evaluate(arrays)
    np.testing.assert_allclose(ev, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["rms_norm", "norm_transformer"])
def test_norm_workloads_search_finds_one_fused_kernel(name: str) -> None:
    """Each chain is one generated kernel among the candidates (pinned spec)."""
    from _pinned_spec import REFERENCE_CPU

    wl = tiny(name)
    res = yr.search(wl.graph("cpu"), device_spec=REFERENCE_CPU, backend="cpu", cache=False)
    fused = [c for c in res.candidates if not c.baseline and ";" not in c.label]
    assert fused, [c.label for c in res.candidates]
    ops = {"rms_norm": ["accum_rms", "div", "mul"], "norm_transformer": ["accum_rms", "add"]}
    assert all(op in fused[0].label for op in ops[name])


# -- the harness end to end (fake yirage) --------------------------------------------------------


def _check_schema(results: dict[str, Any]) -> None:
    assert set(results) == set(_report.TOP_LEVEL_KEYS)
    _report.validate_results(results)
    for row in results["rows"]:
        for key in _report.REQUIRED_ROW_KEYS:
            assert key in row


def test_harness_writes_schema_report_and_png(tmp_path: Path) -> None:
    wls = [tiny("rmsnorm_linear"), tiny("gqa_decode"), tiny("lora")]
    fake = FakeOptimizer(wls)
    results, folder = _harness.run_bench(wls, _cfg(tmp_path, superoptimize=fake))

    assert folder.parent == tmp_path / "results"
    on_disk = json.loads((folder / "results.json").read_text())
    assert on_disk == results
    _check_schema(on_disk)
    assert on_disk["backend"] == "cpu"
    assert on_disk["copy_bw_TBps"] == pytest.approx(0.02)
    assert on_disk["matmul_TFLOPs"] == pytest.approx(0.1)
    assert "torch" in on_disk["versions"] and "yirage" in on_disk["versions"]

    rows = {r["workload"]: r for r in on_disk["rows"]}
    assert set(rows) == {"rmsnorm_linear_b4", "gqa_decode_b1_kv64", "lora_b4"}
    for row in rows.values():
        assert row["timing"] == "wall"
        assert row["yirage_us"] > 0 and row["eager_us"] > 0 and row["roofline_us"] > 0
        assert row["compile_us"] is None and "disabled" in row["skipped"]["compile"]
        assert 0 <= row["max_rel_err"] <= row["tolerance"] == 1e-4
        assert all(row["correct"].values())
        assert row["search_s"] == 0.5 and row["codegen_compile_s"] == 0.25
        assert row["warm_s"] >= 0 and row["yirage_warm_from_cache"] is True
        assert row["roofline_fraction"]["yirage"] == pytest.approx(
            row["roofline_us"] / row["yirage_us"]
        )
    assert rows["gqa_decode_b1_kv64"]["expert_us"] > 0  # SDPA
    assert rows["gqa_decode_b1_kv64"]["correct"]["expert"] is True
    assert rows["lora_b4"]["expert_us"] is None

    # geomean consistent with the rows; no compile rows → null
    ratios = [r["eager_us"] / r["yirage_us"] for r in rows.values()]
    assert on_disk["geomean_speedup_vs_eager"] == pytest.approx(math.exp(np.mean(np.log(ratios))))
    assert on_disk["geomean_speedup_vs_compile"] is None

    # cold in a fresh cache dir per workload, warm in the same one
    assert len(fake.cache_dirs) == 6 and all(fake.cache_dirs)
    assert fake.cache_dirs[0] == fake.cache_dirs[1] != fake.cache_dirs[2]
    assert not Path(str(fake.cache_dirs[0])).exists()  # temporary, removed after the run
    # the cold call caches its decision even when profiling was noisy: the warm call must
    # measure the warm path
    assert [o.get("cache_noisy") for o in fake.options] == [True, None] * 3

    png = folder / "results.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
    md = (folder / "results.md").read_text()
    assert on_disk["device"] in md and "yirage bench --backend cpu" in md
    assert "gqa_decode_b1_kv64" in md and "torch" in md
    # each row names the chosen kernel and the variant of it that runs
    chosen = "- gqa_decode_b1_kv64: fake: the workload's torch reference (variant `fake_variant`)"
    assert chosen in md
    run = json.loads((folder / "run.json").read_text())
    assert run["command"].startswith("yirage bench") and run["date"]


def test_wrong_contestant_is_flagged_not_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("YIRAGE_CUDA_PDL", "0")  # recorded: it changes how kernels launch
    from yirage._registry import get_backend_info

    get_backend_info("cuda")  # yirage-cuda registers YIRAGE_CUDA_PDL when its plugin loads

    def garbage(*tensors: Any) -> list[Any]:
        return [torch.randn(4, 48)]

    good = tiny("rmsnorm_linear")
    bad = dataclasses.replace(good, _reference=garbage)
    fake = FakeOptimizer([good])  # yirage itself is right: it runs the true reference
    results, folder = _harness.run_bench(
        [bad], _cfg(tmp_path, superoptimize=fake, compile_mode="default", fresh_torch_cache=False)
    )
    (row,) = results["rows"]
    assert row["correct"]["yirage"] is True and row["yirage_us"] > 0
    assert row["correct"]["eager"] is False and row["eager_us"] is None
    assert row["rel_err"]["eager"] > row["tolerance"]
    # torch.compile of the same garbage reference is wrong too
    assert row["correct"]["compile"] is False and row["compile_us"] is None
    assert row["torch_compile_s"] > 0
    assert "eager" not in row["times_us"] and "yirage" in row["times_us"]
    assert results["geomean_speedup_vs_eager"] is None
    md = (folder / "results.md").read_text()
    assert "WRONG" in md and "INCORRECT" in md
    assert "- YIRAGE_* variables set: " in md and "YIRAGE_CUDA_PDL=0" in md
    run = json.loads((folder / "run.json").read_text())
    assert run["yirage_env"]["YIRAGE_CUDA_PDL"] == "0"


def test_wrong_yirage_is_flagged(tmp_path: Path) -> None:
    wl = tiny("lora")

    def wrong_optimizer(graph: yr.KernelGraph, backend: str, **options: Any) -> Any:
        kernel = FakeOptimizer([wl])(graph, backend, **options)
        kernel.__class__.__call__ = lambda self, *t: [torch.zeros(4, 32)]
        return kernel

    results, _ = _harness.run_bench([wl], _cfg(tmp_path, superoptimize=wrong_optimizer))
    (row,) = results["rows"]
    assert row["correct"]["yirage"] is False and row["yirage_us"] is None
    assert row["max_rel_err"] == pytest.approx(1.0)  # zeros: |0 - r| / |r|
    assert row["eager_us"] > 0
    assert results["geomean_speedup_vs_eager"] is None


def test_workload_yirage_cannot_run_is_left_out_with_a_note(tmp_path: Path) -> None:
    wls = [tiny("rmsnorm_linear"), tiny("gated_mlp")]
    fake = FakeOptimizer(wls[:1])  # KeyError for gated_mlp

    results, folder = _harness.run_bench(wls, _cfg(tmp_path, superoptimize=fake))
    assert [r["workload"] for r in results["rows"]] == ["rmsnorm_linear_b4"]
    run = json.loads((folder / "run.json").read_text())
    assert any("gated_mlp_b4" in n and "left out" in n for n in run["notes"])
    assert "gated_mlp_b4" in (folder / "results.md").read_text()


def test_expert_inputs_are_prepared_once_outside_the_timing(tmp_path: Path) -> None:
    base = tiny("gqa_decode")

    class WithPreparedExpert:
        """A workload whose expert takes its inputs in another layout."""

        prepared = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(base, name)

        def expert_inputs(self, q: Any, kt: Any, v: Any) -> list[Any]:
            type(self).prepared += 1
            return [q, kt.transpose(-1, -2).contiguous().transpose(-1, -2), v]

    fake = FakeOptimizer([base])
    results, _ = _harness.run_bench([WithPreparedExpert()], _cfg(tmp_path, superoptimize=fake))
    (row,) = results["rows"]
    assert WithPreparedExpert.prepared == 1
    assert row["expert_prepared_inputs"] is True and row["correct"]["expert"] is True
    assert row["expert_us"] > 0


def test_time_budget_and_append(tmp_path: Path) -> None:
    a, b = tiny("rmsnorm_linear"), tiny("lora")
    fake = FakeOptimizer([a, b])
    results, folder = _harness.run_bench(
        [a, b], _cfg(tmp_path, superoptimize=fake, time_budget_s=0)
    )
    assert results["rows"] == []  # the budget was spent before the first case
    run = json.loads((folder / "run.json").read_text())
    assert any("not run: rmsnorm_linear_b4, lora_b4" in n for n in run["notes"])

    first, _ = _harness.run_bench([a], _cfg(tmp_path, superoptimize=fake))
    second, _ = _harness.run_bench([b], _cfg(tmp_path, superoptimize=fake, append=True))
    assert [r["workload"] for r in second["rows"]] == ["rmsnorm_linear_b4", "lora_b4"]
    assert second["rows"][0]["yirage_us"] == first["rows"][0]["yirage_us"]
    assert second["rows"][0]["run_date"]  # an appended row says which run measured it
    alone, _ = _harness.run_bench([b], _cfg(tmp_path, superoptimize=fake))
    assert [r["workload"] for r in alone["rows"]] == ["lora_b4"]  # no --append: replaced


def _results(rows: list[dict[str, Any]]) -> dict[str, Any]:
    full = [
        {
            "workload": f"w{i}",
            "yirage_us": 10.0,
            "eager_us": 20.0,
            "compile_us": 1760.0,
            "expert_us": None,
            "roofline_us": 1.0,
            "search_s": 0.1,
            "codegen_compile_s": 0.1,
            "warm_s": 0.01,
            "max_rel_err": 1e-7,
            "timing": "wall",
            **r,
        }
        for i, r in enumerate(rows)
    ]
    return _report.build_results(
        device="d", backend="cpu", versions={}, copy_bw_Bps=1e9, matmul_flops=1e9, rows=full
    )


def test_a_noisy_run_is_flagged_in_the_headline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ratio is only as good as its worse side: one noisy contestant (here only yirage's
    column, as in a loaded run that headlined 176x vs torch.compile), yirage's own noisy
    profiling or a run-level sign of load marks the headline NOISY, in results.md and in
    what `yirage bench` prints; a quiet run's headline has no flag."""
    quiet = _results([{}, {}])
    assert _report.noise_flags(quiet, {}) == []
    assert _report.headline(quiet, {}) == (
        "geomean speedup of yirage: 176.00x vs torch.compile, 2.00x vs eager"
    )
    noisy = _results([{"noisy": {"yirage": 2.4}}, {}])
    line = _report.headline(noisy, {})
    assert line.startswith("geomean speedup of yirage: 176.00x vs torch.compile")
    assert "NOISY, not a result to quote" in line and "w0 (yirage)" in line and "w1" not in line
    chosen = _results([{"yirage_notes": ["timings were noisy (…); the decision was cached"]}])
    assert _report.noise_flags(chosen, {}) == ["w0 (yirage's own profiling)"]
    run = {"noise": ["load average 3.10 on 2 cores at the start: other processes ran"]}
    assert "NOISY" in _report.headline(quiet, run) and "load average 3.10" in (
        _report.headline(quiet, run)
    )

    _report.write_all(noisy, {}, tmp_path, plot=False)
    md = (tmp_path / "results.md").read_text()
    (head,) = [ln for ln in md.splitlines() if "geomean speedup" in ln]
    assert "NOISY" in head and "w0 (yirage)" in head

    from yirage import cli

    monkeypatch.setattr(_harness, "run_bench", lambda workloads, cfg: (noisy, tmp_path))
    assert cli.main(["bench", "--out", str(tmp_path), "--no-plot"]) == 0
    (printed,) = [ln for ln in capsys.readouterr().out.splitlines() if "geomean" in ln]
    assert "176.00x vs torch.compile" in printed and "NOISY" in printed


def test_run_level_signs_of_load() -> None:
    assert _harness.busy_at_start(0.4, 2) == []
    assert _harness.busy_at_start(2.5, 2) == [
        "load average 2.50 on 2 cores at the start: other processes ran"
    ]
    a = _roofline.DeviceRates(copy_bw_Bps=20e9, matmul_flops=100e9, detail={})
    assert _harness.rates_moved(a, _roofline.DeviceRates(18e9, 90e9, {})) == []
    (note,) = _harness.rates_moved(a, _roofline.DeviceRates(20e9, 40e9, {}))
    assert "matmul rate by x2.50" in note and "copy" not in note


def test_report_rejects_bad_schema() -> None:
    good = _report.build_results(
        device="d",
        backend="cpu",
        versions={},
        copy_bw_Bps=1e9,
        matmul_flops=1e9,
        rows=[],
    )
    assert good["geomean_speedup_vs_compile"] is None
    for mutate in (
        lambda r: r.update(extra=1),
        lambda r: r.update(copy_bw_TBps=0.0),
        lambda r: r.update(rows=[{"workload": "w"}]),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        with pytest.raises(ValueError):
            _report.validate_results(bad)


def test_geomean_speedup() -> None:
    rows = [
        {"yirage_us": 10.0, "compile_us": 20.0, "eager_us": 40.0},
        {"yirage_us": 10.0, "compile_us": 5.0, "eager_us": None},
        {"yirage_us": None, "compile_us": 5.0, "eager_us": 5.0},
    ]
    assert _report.geomean_speedup(rows, "compile") == pytest.approx(1.0)
    assert _report.geomean_speedup(rows, "eager") == pytest.approx(4.0)


# -- with the real superoptimize on the CPU backend ---------------------------------------------


def test_cpu_backend_end_to_end(tmp_path: Path) -> None:
    if not yr.is_backend_available("cpu"):
        pytest.skip("the cpu backend is not available")
    pytest.importorskip("yirage._search", reason="the search is not in this build")
    wls = [tiny("rmsnorm_linear")]  # (attention searches take ~15 s even at tiny sizes)
    results, folder = _harness.run_bench(wls, _cfg(tmp_path))
    _check_schema(results)
    assert len(results["rows"]) == 1, json.loads((folder / "run.json").read_text())["notes"]
    for row in results["rows"]:
        assert row["yirage_us"] > 0 and row["correct"]["yirage"]
        assert row["max_rel_err"] <= row["tolerance"]
        assert row["search_s"] >= 0 and row["codegen_compile_s"] >= 0
        assert row["yirage_search_config"] is None  # the default search, no preset
        assert row["yirage_warm_from_cache"] and row["warm_s"] < row["yirage_cold_s"]


# -- CLI ----------------------------------------------------------------------------------------


def test_cli_has_bench_and_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    from yirage import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--backend", "--workloads", "--out", "--shapes"):
        assert flag in out
    assert cli.main(["doctor", "--json"]) == 0
    assert "backends" in json.loads(capsys.readouterr().out)


def test_cli_rejects_unsupported_backend(capsys: pytest.CaptureFixture[str]) -> None:
    from yirage import cli

    if yr.is_backend_available("tpu"):
        pytest.skip("a TPU is here: only the harness's own limit applies")
    assert cli.main(["bench", "--backend", "tpu", "--out", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    # the backend's own reason first, then the harness's limit
    assert "cannot run here: no TPU" in err and "not supported" in err


@pytest.mark.parametrize("backend", ["rocm", "cuda", "mps", "ascend", "no_such_backend"])
def test_bench_refuses_a_backend_that_cannot_run_here_with_its_reason(
    backend: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from yirage import cli
    from yirage._registry import get_backend_info

    info = get_backend_info(backend)
    if info.available:
        pytest.skip(f"{backend} can run on this machine")
    refusal = _harness.backend_refusal(backend)
    assert refusal is not None and info.reason in refusal
    assert refusal.startswith(f"backend {backend!r} cannot run here: ")
    assert cli.main(["bench", "--backend", backend, "--out", str(tmp_path)]) == 2
    assert info.reason in capsys.readouterr().err
    assert not (tmp_path).exists() or not any(tmp_path.iterdir())  # nothing measured


def test_cpu_backend_is_not_refused() -> None:
    assert yr.is_backend_available("cpu")
    assert _harness.backend_refusal("cpu") is None


def test_cli_batch_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from yirage import cli

    seen: list[_harness.BenchConfig] = []

    def fake_run(workloads: Any, cfg: _harness.BenchConfig) -> Any:
        seen.append(cfg)
        (tmp_path / "run.json").write_text("{}")
        return _results([{}]), tmp_path

    monkeypatch.setattr(_harness, "run_bench", fake_run)
    for argv in (["-b", "32"], ["--batch", "32"]):
        assert cli.main(["bench", *argv, "--out", str(tmp_path), "--no-plot"]) == 0
        assert seen[-1].batch == 32 and "--batch 32" in str(seen[-1].command)
    argv = ["--dims", "h=3000", "n=77", "--dtype", "bfloat16"]
    assert cli.main(["bench", *argv, "--out", str(tmp_path), "--no-plot"]) == 0
    assert seen[-1].dims == {"h": 3000, "n": 77} and seen[-1].dtype == "bfloat16"
    assert "--dims h=3000 n=77 --dtype bfloat16" in str(seen[-1].command)
    assert cli.main(["bench", "--out", str(tmp_path), "--no-plot"]) == 0
    assert seen[-1].batch is None
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["bench", "-b", "0"])
    assert "positive integer" in capsys.readouterr().err
    for bad in ("h", "h=0", "3=4"):
        with pytest.raises(SystemExit):
            cli.main(["bench", "--dims", bad])
        assert "--dims" in capsys.readouterr().err


def test_harness_runs_the_batch_it_is_given(tmp_path: Path) -> None:
    wls = [tiny("rms_norm"), tiny("norm_transformer")]
    batched = [dataclasses.replace(w, shapes={"cpu": {**TINY[w.name], "b": 2}}) for w in wls]
    fake = FakeOptimizer(batched)
    results, folder = _harness.run_bench(wls, _cfg(tmp_path, superoptimize=fake, batch=2))
    assert [r["workload"] for r in results["rows"]] == ["rms_norm_b2", "norm_transformer_b2"]
    for row in results["rows"]:
        assert row["shape"]["b"] == 2 and all(row["correct"].values())
    run = json.loads((folder / "run.json").read_text())
    assert run["batch"] == 2 and "--batch 2" in run["command"]


# -- GPU (nox -s tests-cuda) --------------------------------------------------------------------


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        if _env.require_device():
            pytest.fail("no CUDA device (YIRAGE_REQUIRE_DEVICE=1)")
        pytest.skip("no CUDA device")


@pytest.mark.cuda
def test_cuda_timers() -> None:
    _require_cuda()
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    ev = _timing.cuda_events_median(lambda: a @ a, repeats=20)
    gr = _timing.cuda_graph_median(lambda: a @ a, launches=5, replays=10)
    assert ev.method == "events" and gr.method == "cudagraph"
    assert ev.median_us > 0 and gr.median_us > 0 and gr.calls_per_sample == 5
    # 2·2048³ flop can't beat 5 PFLOP/s, nor take a second
    assert 3.0 < gr.median_us < 1e6
    assert _timing.l2_flush_bytes() >= 2 * torch.cuda.get_device_properties(0).L2_cache_size


@pytest.mark.cuda
def test_cuda_bench_smoke(tmp_path: Path) -> None:
    _require_cuda()
    wl = dataclasses.replace(
        _workloads.get_workload("gqa_decode"),
        shapes={"gpu": {**TINY["gqa_decode"], "kv": 256, "dtype": yr.float16}},
    )
    fake = FakeOptimizer([])
    fake.by_hash = {wl.graph("gpu").hash(): wl}  # the workload at its GPU preset

    def opt(graph: yr.KernelGraph, backend: str, **options: Any) -> Any:
        return fake(graph, "cpu", **options)

    cfg = _cfg(
        tmp_path,
        backend="cuda",
        superoptimize=opt,
        gpu_repeats=10,
        graph_launches=3,
        graph_replays=5,
    )
    results, _ = _harness.run_bench([wl], cfg)
    (row,) = results["rows"]
    assert row["timing"] == "cudagraph"
    assert set(row["times_us"]["yirage"]) == {"events", "cudagraph"}
    assert row["expert_us"] > 0 and row["max_rel_err"] < 1e-2


def test_expert_of_a_workload_without_one_is_a_yirage_error() -> None:
    from yirage._workloads import get_workload

    w = get_workload("rmsnorm_linear")
    assert not w.has_expert
    with pytest.raises(yr.YirageError, match="has no expert kernel"):
        w.expert()


@pytest.mark.cuda
def test_attention_experts_run_sdpa_fused_kernels() -> None:
    """The SDPA experts run a fused kernel (flash or memory-efficient attention), not SDPA's
    unfused math fallback: 3-D prefill inputs used to fall back and time 10-25x slower."""
    _require_cuda()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    cases = [
        ("attention_prefill", {"b": 1, "q_heads": 4, "kv_heads": 4, "d": 64, "kv": 200}),
        ("gqa_decode", {"b": 2, "q_heads": 8, "kv_heads": 2, "d": 128, "kv": 300}),
    ]
    for name, shape in cases:
        wl = _workloads.get_workload(name)
        if name == "attention_prefill":
            shape["q_len"] = 77
        wl = dataclasses.replace(wl, shapes={"gpu": {**shape, "dtype": yr.float16}})
        tensors = wl.inputs("gpu", seed=3, device="cuda")
        (want,) = wl.reference(*[t.double() for t in tensors])
        with sdpa_kernel(fused):  # raises when no fused kernel takes these inputs
            (got,) = wl.expert(*tensors)
        err = float((got.double() - want).norm() / want.norm())
        assert got.shape == want.shape and err < 2e-3, (name, err)
