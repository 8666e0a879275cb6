"""The ROCm backend without an AMD GPU: its Triton target and compile options, the DeviceSpec
table and the live specs (a fake KFD topology, fake torch properties), the probe and
``yirage doctor``, the search choosing differently for an MI300X than for an H100, LDS
overflow refused with the limit named, bad input (unknown target, Triton too old), and the
parts of the torch runtime that need no GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import rocm_cases

import yirage as yr
import yirage_triton
from yirage._search import device_spec_json
from yirage.plan import CodegenError
from yirage.plugin import ConfigError, VerificationLevel
from yirage_rocm import TARGET, RocmBackend, _device_spec, _probe
from yirage_triton import ResourceError, ToolchainError

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import _search_graphs
import plans

needs_triton = pytest.mark.skipif(
    not (rocm_cases.have("triton") and rocm_cases.have("torch")),
    reason="torch and triton are not installed (pip install torch triton runs these tests)",
)


# -- target ------------------------------------------------------------------------------------
def test_amd_target() -> None:
    assert TARGET.name == "rocm" and TARGET.torch_device == "cuda"  # torch for ROCm is "cuda"
    assert TARGET.warp_size == 64 and TARGET.aot_backend == "hip" and not TARGET.pdl
    assert TARGET.fp32_dot_precisions == ("ieee",) and TARGET.dot_sum_precision == "ieee"
    assert (TARGET.default_stages, TARGET.deep_stages) == (2, 3)
    assert dict(TARGET.compile_options) == {
        "waves_per_eu": 0,
        "matrix_instr_nonkdim": 16,
        "kpack": 1,
    }
    wave = {t.name: t.warp_size for t in yirage_triton.AOT_TARGETS.values() if t.vendor == "rocm"}
    assert wave == {"gfx942": 64, "gfx90a": 64, "gfx1100": 32}


@needs_triton
def test_compile_options_exist_in_the_installed_triton() -> None:
    yirage_triton.check_compile_options("hip", dict(TARGET.compile_options))
    with pytest.raises(ConfigError, match=r"no hip compile option\(s\) \['waves_per_cu'\]"):
        yirage_triton.check_compile_options("hip", {"waves_per_cu": 2})


def test_printing_carries_the_options_and_no_tf32() -> None:
    """The AMD printing: compile options in every launch, IEEE sums of squares, no PDL."""
    import dataclasses

    be = RocmBackend(interpret=True)
    case = plans.gqa_decode(qk_norm=True, dtype="float16")
    plan = yirage_triton_plan_of(case)
    # the scaled printing (raced on a GPU) sums the K tile's squares with a dot
    opts = dataclasses.replace(be.default_options(plan), scale_after_dot=True)
    code = yirage_triton.generate_triton(plan, opts).text
    launches = [ln for ln in code.splitlines() if "num_warps=" in ln]
    # attention: its kernels also compile without multiply-add contraction
    assert launches and all(
        "waves_per_eu=0, matrix_instr_nonkdim=16, kpack=1, enable_fp_fusion=False" in ln
        for ln in launches
    )
    assert "input_precision='ieee'" in code and "tf32" not in code and "launch_pdl" not in code
    assert (
        "'options': {'waves_per_eu': 0, 'matrix_instr_nonkdim': 16, 'kpack': 1, "
        "'enable_fp_fusion': False}" in code
    )


# -- device specs ------------------------------------------------------------------------------
def test_device_table() -> None:
    table = _device_spec.KNOWN_DEVICES
    assert set(table) == {"MI300X", "MI325X", "MI250X", "MI210", "RX7900XTX"}
    arch = {n: (s.arch, s.warp_size, s.compute_units) for n, s in table.items()}
    assert arch == {
        "MI300X": ("gfx942", 64, 304),
        "MI325X": ("gfx942", 64, 304),
        "MI250X": ("gfx90a", 64, 110),
        "MI210": ("gfx90a", 64, 104),
        "RX7900XTX": ("gfx1100", 32, 96),
    }
    for spec in table.values():
        assert spec.vendor == "AMD" and spec.execution_model == "simt"
        assert spec.shared_mem_per_block == 64 * 1024 and spec.matrix_tile == (16, 16, 16)
        assert spec.peak_tflops_fp16 and spec.peak_tflops_fp32 and spec.mem_bandwidth_gbps
        core_json, _ = device_spec_json(spec, "rocm")  # the core accepts it
        assert json.loads(core_json)["warp_size"] == spec.warp_size
    assert table["MI325X"].mem_bandwidth_gbps > table["MI300X"].mem_bandwidth_gbps
    assert RocmBackend().known_devices() == table


def _topology(tmp_path: Path, **props: int) -> Path:
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "properties").write_text("cpu_cores_count 64\ngfx_target_version 0\n")
    (tmp_path / "1").mkdir()
    text = "".join(f"{k} {v}\n" for k, v in props.items())
    (tmp_path / "1" / "properties").write_text(text)
    return tmp_path


def test_live_spec_from_the_kfd_topology(tmp_path: Path, monkeypatch: Any) -> None:
    topo = _topology(
        tmp_path,
        gfx_target_version=90402,
        simd_count=1216,
        simd_per_cu=4,
        lds_size_in_kb=64,
        wave_front_size=64,
    )
    monkeypatch.setattr(_device_spec, "kfd_gpus", lambda: _probe.kfd_gpus(topo))
    spec = _device_spec.device_spec()
    assert spec is not None and spec.name == "AMD Instinct MI300X"
    assert spec.source == "table+live" and spec.compute_units == 304


def test_live_spec_from_torch_properties() -> None:
    props = SimpleNamespace(
        gcnArchName="gfx1100",
        multi_processor_count=96,
        warp_size=32,
        shared_memory_per_block=65536,
        L2_cache_size=6 * 2**20,
        name="Radeon RX 7900 XTX",
    )
    spec = _device_spec.spec_from_torch_properties(props)
    assert spec.name == "AMD Radeon RX 7900 XTX" and spec.source == "table+live"
    props.gcnArchName, props.multi_processor_count = "gfx1201:sramecc-", 64
    other = _device_spec.spec_from_torch_properties(props)
    assert (other.arch, other.source, other.warp_size, other.compute_units) == (
        "gfx1201",
        "live",
        32,
        64,
    )


# -- probe, level, doctor ----------------------------------------------------------------------
def test_probe_and_doctor_without_an_amd_gpu(capsys: Any) -> None:
    from yirage.cli import main

    probe = RocmBackend().probe()
    if probe.available:
        pytest.skip("an AMD GPU is present")
    assert "no AMD GPU" in probe.reason
    info = yr.get_backend_info("rocm")
    assert info.installed and not info.available and info.codegen_implemented
    assert info.verification_level is VerificationLevel.EMULATED
    assert main(["doctor", "--json"]) == 0
    doctor = json.loads(capsys.readouterr().out)
    row = next(b for b in doctor["backends"] if b["name"] == "rocm")
    assert row["available"] is False and row["verification_level"] == "ran emulated"
    if _probe.triton_has_amd_backend():
        assert row["toolchain"]["ahead-of-time targets"] == "gfx942, gfx90a, gfx1100"


# -- the search reads the spec -----------------------------------------------------------------
def test_search_for_mi300x_chooses_differently_from_h100() -> None:
    """RMSNorm + Linear at the bench's GPU size: the H100's best plan holds 76 KiB of tiles
    per block (it has 227 KiB of shared memory), more than an MI300X workgroup's 64 KiB of
    LDS; the MI300X's best plan is another one that fits. Both specs pinned."""
    from yirage._workloads import get_workload

    wl = get_workload("rmsnorm_linear")
    graph = wl.graph("gpu")
    best = {}
    for vendor, spec in (("cuda", _search_graphs.H100), ("rocm", _device_spec.MI300X)):
        result = yr.search(
            graph,
            backend=vendor,
            device_spec=spec,
            config=wl.search_config,
            top_k=2,
            deterministic=True,
            cache=False,
        )
        best[vendor] = result.candidates[0]
    smem = {v: max(k.smem_bytes for k in yirage_triton_plan(c).generated) for v, c in best.items()}
    assert smem["cuda"] > 64 * 1024 >= smem["rocm"], smem
    assert best["cuda"].label != best["rocm"].label


def yirage_triton_plan(cand: Any) -> Any:
    from yirage.plan import parse_plan

    return parse_plan(cand.kernel_plan())


# -- LDS overflow --------------------------------------------------------------------------------
BIG = plans.rmsnorm_linear(b=8, h=1024, n=1024, tn=256, tk=128, dtype="float16")


def test_plan_beyond_lds_is_refused_by_codegen() -> None:
    with pytest.raises(
        CodegenError, match=r"kernel 'rms_mm' .* 67584 bytes .* 65536 bytes of LDS per workgroup"
    ):
        RocmBackend(interpret=True).codegen(BIG.plan)


@needs_triton
def test_plan_beyond_lds_is_refused_for_gfx942() -> None:
    """Printed without the LDS check (as for a 227 KiB H100), the kernel compiles, and the
    compiled kernel's LDS is refused with the candidate and the limit named."""
    src = yirage_triton.generate_triton(BIG.plan, yirage_triton.TritonOptions(num_stages=2))
    module = yirage_triton.load_triton_module(
        yirage_triton.write_triton_module(src.text, src.codegen_version)
    )
    dtypes = {b.id: b.dtype for b in src.plan.buffers}
    with pytest.raises(ResourceError) as err:
        yirage_triton.compile_for(module, dtypes, "gfx942", candidate="big-tile candidate")
    msg = str(err.value)
    assert (
        msg.startswith("big-tile candidate: kernel rms_mm needs ") and "allows 65536 bytes" in msg
    )
    assert "gfx942" in msg


# -- bad input ---------------------------------------------------------------------------------
def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        yirage_triton.aot_target("gfx940")
    for name in ("gfx942", "gfx90a", "gfx1100", "sm_90", "sm_80"):
        assert name in str(err.value)


@pytest.mark.parametrize("installed", ["3.1.0", None])
def test_triton_too_old_names_the_version(monkeypatch: Any, installed: str | None) -> None:
    from yirage_triton import _aot

    monkeypatch.setattr(_aot, "dist_version", lambda name: installed)
    with pytest.raises(ToolchainError, match=r"triton>=3\.9") as err:
        _aot.require_triton(_aot.aot_target("gfx942"))
    if installed:
        assert "triton 3.1.0 is too old to compile for gfx942" in str(err.value)
    monkeypatch.setattr(_aot, "dist_version", lambda name: "3.9.0+git1234")
    _aot.require_triton(_aot.aot_target("gfx1100"))


# -- runtime without a GPU ---------------------------------------------------------------------
@needs_triton
def test_compiled_launcher_asks_for_rocm_tensors() -> None:
    """The printed module's launcher runs on torch's "cuda" device type (HIP on ROCm torch):
    CPU tensors are refused with the device to move them to."""
    import torch

    from yirage_triton import InputError, TritonLauncher

    be = RocmBackend()
    assert be.torch_device == "cuda" and be._device_api() is torch.cuda
    case = plans.rmsnorm_linear(dtype="float16")
    src = yirage_triton.generate_triton(case.plan, be.export_options(_device_spec.MI300X))
    module = yirage_triton.load_triton_module(
        yirage_triton.write_triton_module(src.text, src.codegen_version)
    )
    launcher = TritonLauncher(src.plan, src.text, module, device=TARGET.torch_device)
    xs = [torch.zeros(d, dtype=torch.float16) for d, _ in launcher.input_specs]
    with pytest.raises(InputError, match=r"cuda"):
        launcher(*xs)


def yirage_triton_plan_of(case: Any) -> Any:
    from yirage.plan import parse_plan

    return parse_plan(case.plan)
