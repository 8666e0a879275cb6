"""``yirage.estimate``: the cost model's terms for a candidate on a device.

The terms must add up to the total, the total must be the search's ``predicted_us`` for the
same candidate and device, and for library kernels the terms must match the model's
formula recomputed here in float64 from the pinned spec's figures."""

from __future__ import annotations

import dataclasses
import math

import pytest

import yirage as yr
from yirage import _core, devices
from yirage._estimate import TERMS

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
    assert not any("energy" in key or "joule" in key for key in est.to_dict())
    assert set(est.to_dict()["terms"]) == set(TERMS)
