"""``yirage.estimate``: the cost model's terms for a candidate on a device.

The terms must add up to the total, the total must be the search's ``predicted_us`` for the
same candidate and device, and for library kernels the terms must match the model's
formula recomputed here in float64 from the pinned spec's figures."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import yirage as yr
from yirage import _core, devices
from yirage._estimate import TERMS
from yirage._search import device_spec_json

#: A SIMT device with pinned figures (no tiling rule, explicit launch gap).
PINNED = yr.DeviceSpec(
    name="pinned estimate GPU",
    vendor="Pinned",
    arch="test",
    compute_units=64,
    warp_size=32,
    max_threads_per_block=1024,
    shared_mem_per_block=48 * 1024,
    l2_bytes=4 * 2**20,
    mem_bandwidth_gbps=1000.0,
    peak_tflops_fp16=100.0,
    peak_tflops_fp32=10.0,
    matrix_tile=(16, 8, 16),
    execution_model="simt",
    launch_overhead_us=2.0,
)


def _silu_matmul(m: int, k: int, n: int) -> yr.KernelGraph:
    g = yr.KernelGraph()
    x = g.new_input((m, k), yr.float32)
    w = g.new_input((k, n), yr.float32)
    g.mark_output(g.silu(g.matmul(x, w)))
    return g


def _library_reference(m: int, k: int, n: int) -> list[tuple[float, float, float]]:
    """(memory_us, compute_us, total_us) of silu(X[m,k] @ W[k,n]) as two fp32 library
    kernels on PINNED: bytes over bandwidth; matmul flops at the fp32 peak (the tiles divide
    the matrix unit's 16x8x16); silu's 4 flops an element at a quarter of it; the smaller of
    memory and compute exposed over a library kernel's 8 pipeline stages; 2 us launch."""
    assert PINNED.mem_bandwidth_gbps is not None and PINNED.peak_tflops_fp32 is not None
    bw = PINNED.mem_bandwidth_gbps * 1e3
    fp32 = PINNED.peak_tflops_fp32 * 1e6
    mm_mem = 4.0 * (m * k + k * n + m * n) / bw
    mm_comp = 2.0 * m * n * k / fp32
    silu_mem = 4.0 * (2 * m * n) / bw
    silu_comp = 4.0 * m * n / (fp32 * 0.25)
    out = []
    for mem, comp in ((mm_mem, mm_comp), (silu_mem, silu_comp)):
        out.append((mem, comp, max(mem, comp) + min(mem, comp) / 8.0 + 2.0))
    return out


def test_library_terms_match_the_formula_recomputed_in_float64() -> None:
    m, k, n = 64, 512, 256
    est = yr.estimate(_silu_matmul(m, k, n), PINNED, best=False)
    assert est.kind == "model prediction"
    assert [k.op for k in est.kernels] == ["matmul", "silu"]
    for got, (mem, comp, total) in zip(est.kernels, _library_reference(m, k, n), strict=True):
        assert got.memory_us == pytest.approx(mem, rel=1e-12)
        assert got.compute_us == pytest.approx(comp, rel=1e-12)
        assert got.total_us == pytest.approx(total, rel=1e-12)
        assert got.launch_us == 2.0 and got.loop_us == 0.0 and got.combine_us == 0.0
        assert got.bound == ("memory" if mem >= comp else "compute")
    # the matmul's 16.8 MFLOP at 10 TFLOPS outlast its 0.66 MB at 1 TB/s
    assert est.kernels[0].bound == "compute"
    assert est.terms["compute"] == pytest.approx(est.kernels[0].compute_us, rel=1e-12)
    assert est.terms["launch"] == 4.0


def _assert_terms_add_up(est: yr.Estimate) -> None:
    for k in est.kernels:
        assert math.fsum(k.terms.values()) == pytest.approx(k.total_us, rel=1e-12, abs=1e-12)
        assert (k.terms["memory"] == 0.0) != (k.terms["compute"] == 0.0) or k.total_us == 0
    assert set(est.terms) == set(TERMS)
    assert math.fsum(est.terms.values()) == pytest.approx(est.total_us, rel=1e-12)
    assert math.fsum(k.total_us for k in est.kernels) == pytest.approx(est.total_us, rel=1e-12)


def test_the_estimate_of_the_best_candidate_is_the_searchs_prediction() -> None:
    g = _silu_matmul(8, 256, 256)
    result = yr.search(g, device_spec=PINNED, cache=False)
    est = yr.estimate(result)
    assert est.label == result.best.label and not result.best.baseline
    assert est.total_us == pytest.approx(result.best.predicted_us, rel=1e-12)
    assert est.total_us == pytest.approx(_core.predicted_us(est.graph._g, est.device_spec))
    _assert_terms_add_up(est)
    assert [k.op for k in est.kernels] == ["customized"]
    # every candidate, not just the best
    for cand in result.candidates:
        e = yr.estimate(cand)
        assert e.total_us == pytest.approx(cand.predicted_us, rel=1e-12)
        _assert_terms_add_up(e)


def test_estimate_of_a_graph_searches_for_the_named_device() -> None:
    g = _silu_matmul(8, 256, 256)
    est = yr.estimate(g, "MI300X", cache=False)
    searched = yr.search(g, device="MI300X", cache=False)
    assert est.device == "AMD Instinct MI300X" and est.backend == "rocm"
    assert est.label == searched.best.label
    assert est.total_us == pytest.approx(searched.best.predicted_us, rel=1e-12)
    assert any("cost model's predictions alone" in n for n in est.notes)
    _assert_terms_add_up(est)
    assert "model prediction" in str(est) and "MI300X" in str(est)


def test_a_split_loop_reports_its_combine_step() -> None:
    """A skinny fp16 matmul with a long K on the H100: 4 blocks for 132 SMs, so the fused
    kernel's loop is split 16 ways and pays the combine step."""
    g = yr.KernelGraph()
    x = g.new_input((16, 8192), yr.float16)
    w = g.new_input((8192, 128), yr.float16)
    g.mark_output(g.silu(g.matmul(x, w)))
    est = yr.estimate(g, "H100", cache=False)
    _assert_terms_add_up(est)
    (kernel,) = est.kernels
    assert kernel.op == "customized" and kernel.loop_split == 16
    assert kernel.combine_us > 1.0 and kernel.terms["combine"] == kernel.combine_us
    assert kernel.loop_us > 0.0
    unsplit = yr.estimate(g, "H100", best=False)
    assert all(k.loop_split == 1 and k.combine_us == 0.0 for k in unsplit.kernels)


def test_a_candidate_estimated_on_another_device_is_checked_to_fit() -> None:
    g = _silu_matmul(8, 256, 256)
    best = yr.search(g, device_spec=PINNED, cache=False).best
    other = yr.estimate(best, "H100")
    assert other.total_us != pytest.approx(best.predicted_us)
    assert any("another device spec" in n for n in other.notes)
    _assert_terms_add_up(other)
    tiny = dataclasses.replace(PINNED, name="tiny", shared_mem_per_block=64)
    with pytest.raises(yr.ConfigError, match="does not fit tiny"):
        yr.estimate(best, tiny)


def test_estimate_refuses_what_it_cannot_estimate() -> None:
    g = _silu_matmul(8, 256, 256)
    with pytest.raises(TypeError, match="KernelGraph, Candidate or SearchResult"):
        yr.estimate("graph")  # type: ignore[arg-type]
    with pytest.raises(yr.ConfigError, match="registry name"):
        yr.estimate(g, 3)  # type: ignore[arg-type]
    with pytest.raises(yr.ConfigError, match="search options"):
        yr.estimate(g, PINNED, best=False, time_limit=1)
    with pytest.raises(devices.UnknownDeviceError, match="close matches"):
        yr.estimate(g, "H1000", best=False)


def test_no_energy_figure_is_invented() -> None:
    est = yr.estimate(_silu_matmul(8, 256, 256), PINNED, best=False)
    assert est.energy_uj is None and est.to_dict()["energy_uj"] is None
    assert est.to_dict()["energy_model"] is None and "energy" not in str(est)
    assert set(est.to_dict()["terms"]) == set(TERMS)


# -- collectives, energy, compare_variants ---------------------------------------------------------

#: PINNED with an interconnect (GB/s per direction, µs per ring step) and a board power.
LINKED = dataclasses.replace(
    PINNED,
    name="pinned linked GPU",
    link_bandwidth_gbps=200.0,
    link_latency_us=1.5,
    power_watts=400.0,
)


def _ring_all_reduce_us(nbytes: float, p: int, gbps: float, step_us: float) -> float:
    """Ring all-reduce: 2(p-1) steps of nbytes/p each (reduce-scatter, then all-gather)."""
    return 2.0 * (p - 1) / p * nbytes / (gbps * 1e3) + 2.0 * (p - 1) * step_us


def _tp_mlp(p: int, b: int = 8, h: int = 1024) -> yr.KernelGraph:
    """One rank of a tensor-parallel MLP over p ranks: X @ W1[:, shard] -> silu -> @ W2[shard]
    and an all_reduce of the fp16 [b, h] partial sums."""
    g = yr.KernelGraph(world_size=p)
    x = g.new_input((b, h), yr.float16)
    w1 = g.new_input((h, 4 * h // p), yr.float16)
    w2 = g.new_input((4 * h // p, h), yr.float16)
    g.mark_output(g.all_reduce(g.matmul(g.silu(g.matmul(x, w1)), w2)))
    return g


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_the_collective_term_is_the_ring_all_reduce_formula(p: int) -> None:
    est = yr.estimate(_tp_mlp(p), LINKED, best=False)
    want = _ring_all_reduce_us(8 * 1024 * 2, p, 200.0, 1.5)
    assert est.world_size == p
    assert est.collective_us == pytest.approx(want, rel=1e-12, abs=0.0)
    assert (est.collective_us == 0.0) == (p == 1)
    (ar,) = [k for k in est.kernels if k.op == "all_reduce"]
    assert ar.collective_us == est.collective_us == ar.terms["collective"]
    assert all(k.collective_us == 0.0 for k in est.kernels if k.op != "all_reduce")
    _assert_terms_add_up(est)
    assert not any("PCIe" in n for n in est.notes)


def test_the_search_ranks_multi_device_candidates_with_the_collective_term() -> None:
    g = _tp_mlp(2, h=256)
    result = yr.search(g, device_spec=LINKED, cache=False)
    est = yr.estimate(result)
    want = _ring_all_reduce_us(8 * 256 * 2, 2, 200.0, 1.5)
    assert est.collective_us == pytest.approx(want, rel=1e-12)
    assert est.total_us == pytest.approx(result.best.predicted_us, rel=1e-12)
    for cand in result.candidates:
        assert yr.estimate(cand).collective_us == pytest.approx(want, rel=1e-12)
    # the same graph on one rank: the same kernels but no link time
    single = dataclasses.replace(LINKED, link_bandwidth_gbps=1e9, link_latency_us=0.0)
    free = yr.estimate(g, single, best=False)
    linked = yr.estimate(g, LINKED, best=False)
    assert linked.total_us - free.total_us == pytest.approx(want, rel=1e-6)


def test_a_spec_without_links_prices_collectives_as_pcie_and_says_so() -> None:
    est = yr.estimate(_tp_mlp(4), PINNED, best=False)
    assert est.collective_us == pytest.approx(_ring_all_reduce_us(8 * 1024 * 2, 4, 32.0, 5.0))
    (note,) = [n for n in est.notes if "PCIe" in n]
    assert "link_bandwidth_gbps" in note and PINNED.name in note
    assert not any("PCIe" in n for n in yr.estimate(_tp_mlp(1), PINNED, best=False).notes)


def test_energy_is_time_times_power_times_ranks_and_labelled_a_model() -> None:
    for p in (1, 4):
        est = yr.estimate(_tp_mlp(p), LINKED, best=False)
        assert est.energy_uj == pytest.approx(est.total_us * 400.0 * p, rel=1e-12)
        d = est.to_dict()
        assert d["energy_uj"] == est.energy_uj and d["power_watts"] == 400.0
        assert "model" in d["energy_model"] and "model" in str(est)


def test_link_and_power_figures_are_checked() -> None:
    for field, bad in (
        ("link_bandwidth_gbps", 0.0),
        ("link_latency_us", -1.0),
        ("power_watts", math.inf),
    ):
        with pytest.raises(yr.ConfigError, match=field):
            dataclasses.replace(PINNED, **{field: bad})
    # the core checks the JSON it is sent, too
    spec = json.loads(device_spec_json(LINKED)[0])
    assert spec["link_bandwidth_gbps"] == 200.0 and "power_watts" not in spec
    spec["link_bandwidth_gbps"] = -3
    with pytest.raises(_core.YirageError, match="link_bandwidth_gbps"):
        _core.device_spec_json(json.dumps(spec))


def test_the_registry_carries_interconnects_and_power_with_sources() -> None:
    for name, gbps, needle in (
        ("H100", 450.0, "NVLink"),
        ("MI300X", 448.0, "Infinity Fabric"),
        ("v5e", 200.0, "ICI"),
        ("L4", 32.0, "PCIe"),
    ):
        entry = devices.get_device(name)
        assert entry.spec.link_bandwidth_gbps == gbps
        assert any(needle in s for s in entry.sources), entry.sources
    assert devices.get_device("H100").spec.power_watts == 700.0
    assert devices.get_device("v5e").spec.power_watts is None  # not published
    est = yr.estimate(_tp_mlp(8), "H100", best=False)
    assert est.collective_us == pytest.approx(_ring_all_reduce_us(8 * 1024 * 2, 8, 450.0, 1.0))


def test_compare_variants_ranks_tensor_parallel_degrees_by_predicted_time() -> None:
    cmp = yr.compare_variants(_tp_mlp, LINKED, values=[1, 2, 4, 8], best=False)
    singles = {p: yr.estimate(_tp_mlp(p), LINKED, best=False).total_us for p in (1, 2, 4, 8)}
    want = sorted(singles, key=lambda p: singles[p])
    assert [v.value for v in cmp] == want and len(cmp) == 4
    assert [v.rank for v in cmp] == [1, 2, 3, 4]
    assert [v.label for v in cmp] == [f"_tp_mlp({p})" for p in want]
    for v in cmp:
        assert v.total_us == pytest.approx(singles[v.value], rel=1e-12)
        assert v.relative == pytest.approx(singles[v.value] / singles[want[0]], rel=1e-12)
        assert v.terms["collective"] == pytest.approx(
            _ring_all_reduce_us(16384, v.value, 200.0, 1.5)
        )
    assert cmp.best is cmp.variants[0] and cmp.device == LINKED.name
    text = str(cmp)
    assert "model prediction" in text and "_tp_mlp(8)" in text
    assert [d["rank"] for d in cmp.to_dict()["variants"]] == [1, 2, 3, 4]


def test_compare_variants_takes_lists_and_dicts_and_names_the_fix() -> None:
    small, large = _silu_matmul(8, 256, 256), _silu_matmul(64, 1024, 1024)
    by_list = yr.compare_variants([large, small], PINNED, best=False)
    assert [v.label for v in by_list] == ["variant 1", "variant 0"]
    by_dict = yr.compare_variants({"large": large, "small": small}, PINNED, best=False)
    assert [v.label for v in by_dict] == ["small", "large"]
    with pytest.raises(yr.ConfigError, match="values="):
        yr.compare_variants(_tp_mlp, PINNED, best=False)
    with pytest.raises(yr.ConfigError, match="values= applies to a builder"):
        yr.compare_variants([small], PINNED, values=[1], best=False)
    with pytest.raises(yr.ConfigError, match=r"yirage\.estimate"):
        yr.compare_variants(small, PINNED, best=False)
    with pytest.raises(yr.ConfigError, match="no variants"):
        yr.compare_variants([], PINNED, best=False)
