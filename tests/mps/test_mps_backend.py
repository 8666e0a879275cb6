"""The mps backend on any machine: doctor fields, the DeviceSpec table, errors that name the
fix, the printed MSL's structure (threadgroups, barriers, SIMD-group reductions and
matrices, 16-bit types); and, marked ``mps``, the printed kernels on an Apple GPU."""

from __future__ import annotations

import importlib.util
import platform

import numpy as np
import plans
import pytest
from _mps_support import rel_err, to_torch

import yirage as yr
from yirage.cfamily import CFamilyPrinter
from yirage.plugin import BackendUnavailableError, VerificationLevel
from yirage_mps import _device_spec
from yirage_mps._backend import MpsBackend
from yirage_mps._msl_codegen import MslKernelPrinter, MslOptions, generate_msl

ON_MAC = platform.system() == "Darwin" and platform.machine() == "arm64"


def test_doctor_shows_mps_installed_unavailable_with_reason_and_level() -> None:
    info = yr.get_backend_info("mps")
    assert info.installed
    assert info.verification_level == VerificationLevel.EMULATED
    if not ON_MAC:
        assert not info.available
        assert "not macOS" in info.reason


@pytest.mark.skipif(ON_MAC, reason="checks the errors of a machine without an Apple GPU")
def test_without_a_mac_the_errors_name_the_fix() -> None:
    be = MpsBackend()
    with pytest.raises(BackendUnavailableError, match="not macOS"):
        be.device_spec()
    src = be.codegen(plans.gated_mlp().plan)  # printing needs no Mac
    with pytest.raises(BackendUnavailableError, match=r"emulate=True"):
        be.compile(src)


def test_device_table_covers_m1_to_m4_with_sources() -> None:
    table = _device_spec.KNOWN_DEVICES
    for gen in ("M1", "M2", "M3", "M4"):
        for tier in ("", " Pro", " Max"):
            assert f"{gen}{tier}" in table
    assert {"M1 Ultra", "M2 Ultra", "M3 Ultra"} <= set(table)
    assert set(_device_spec.SOURCES) == set(table)
    for name, spec in table.items():
        assert _device_spec.SOURCES[name].startswith("apple.com/newsroom/"), name
        assert spec.shared_mem_per_block == 32 * 1024 and spec.warp_size == 32
        assert spec.matrix_tile == (8, 8, 8) and spec.execution_model == "simt"
        assert spec.compute_units and spec.mem_bandwidth_gbps, name
    # Pro/Max/Ultra differ from the base chip
    assert table["M4 Max"].mem_bandwidth_gbps != table["M4"].mem_bandwidth_gbps
    assert table["M2 Ultra"].compute_units == 2 * table["M2 Max"].compute_units


@pytest.mark.parametrize(
    "brand,entry", [("Apple M2 Max", "M2 Max"), ("Apple M2", "M2"), ("Apple M3 Ultra", "M3 Ultra")]
)
def test_chip_names_match_the_longest_entry(brand: str, entry: str) -> None:
    spec = yr.Backend._match_device(brand, _device_spec._MATCH)
    assert spec is _device_spec.KNOWN_DEVICES[entry]


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="yirage-cuda needs triton (not on macOS)"
)
def test_one_c_family_printer_serves_cuda_and_metal() -> None:
    from yirage_cuda._cuda_codegen import _CudaKernelPrinter

    assert issubclass(MslKernelPrinter, CFamilyPrinter)
    assert issubclass(_CudaKernelPrinter, CFamilyPrinter)


def test_printed_msl_has_the_metal_structure() -> None:
    text = generate_msl(plans.rmsnorm_linear(dtype="float16").plan).text
    assert "#include <metal_stdlib>" in text
    assert "kernel void rms_mm(" in text
    assert "uint3 yr_group [[threadgroup_position_in_grid]]" in text
    assert "device const half* g0 [[buffer(0)]]" in text and "device half* g2" in text
    assert "YR_THREADGROUP_MEMORY(yr_tg, " in text
    assert "threadgroup half* s0 = reinterpret_cast<threadgroup half*>(yr_tg + " in text
    assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in text
    assert "a = simd_sum(a);" in text  # the rms row reduction, one SIMD-group per row
    assert "simdgroup_multiply_accumulate(acc, ma, mb, acc);" in text
    bf = generate_msl(plans.rmsnorm_linear(dtype="bfloat16").plan).text
    assert "device const bfloat* g0 [[buffer(0)]]" in bf and "bfloat(" in bf


def test_simdgroup_matrix_only_where_shapes_allow() -> None:
    odd = generate_msl(plans.zoo_odd().plan).text  # 6x48 · 48x20: not multiples of 8
    assert "simdgroup_multiply_accumulate" not in odd
    assert "for (int k = 0; k < 48; ++k) acc +=" in odd
    loop = generate_msl(plans.rmsnorm_linear().plan, MslOptions(use_simdgroup_matrix=False))
    assert "simdgroup_multiply_accumulate" not in loop.text


def test_safe_softmax_prints_the_running_max_and_rescale() -> None:
    text = generate_msl(plans.attention_fused(dtype="float16").plan).text
    assert "simd_max(a)" in text
    assert "rowmax0[r] = mn;" in text and "rowalpha0[r] = exp(rowmax0[r] - mn);" in text
    assert "* rowalpha0[" in text  # the accumulators rescaled by exp(m_old - m_new)


@pytest.mark.mps
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_printed_kernels_run_on_the_apple_gpu(dtype: str) -> None:
    from yirage import _env

    torch = pytest.importorskip("torch")
    if not torch.backends.mps.is_available():
        if _env.require_device():
            pytest.fail("YIRAGE_REQUIRE_DEVICE=1 but torch.backends.mps is not available")
        pytest.skip("no Apple GPU with torch's MPS backend")
    be = MpsBackend()
    tol = {"float32": 2e-5, "float16": 3e-3}[dtype]
    for case in plans.small_cases(dtype):
        try:
            src = be.codegen(case.plan)
        except yr.BackendError:
            continue  # a fixture tiled beyond 32 KiB (see test_mps_emulated.TOO_BIG)
        kernel = be.load(be.compile(src))
        tensors = to_torch(case.random_inputs(2), [d for _, d in case.inputs], "mps")
        outs = kernel(*tensors)
        ref = case.reference(*[t.double().cpu().numpy() for t in tensors])
        for o, r in zip(outs, ref, strict=True):
            assert rel_err(o.double().cpu().numpy(), np.asarray(r)) <= tol, case.name
        assert be.profile(kernel, tensors).method == "mps-events"
