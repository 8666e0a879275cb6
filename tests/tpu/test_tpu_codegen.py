"""The Pallas printer, the TPU tiling rule (DeviceSpec, search and checker), the launcher, the
DeviceSpec table and what a user without jax or without a TPU is told."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from _tpu_cases import (
    TOL,
    candidates,
    inputs_and_reference,
    interpret_backend,
    needs_jax,
    rel,
    small_graph,
)

import yirage as yr
from yirage.plan import CodegenError
from yirage.plugin import DeviceSpec

#: A small CPU spec whose search proposes tiles the TPU rule forbids (e.g. 32 columns).
CPU_SPEC = json.dumps(
    {
        "compute_units": 2,
        "warp_size": 1,
        "max_threads_per_block": 1,
        "shared_mem_per_block": 1048576,
        "l2_bytes": 33554432,
        "mem_bandwidth_gbps": 20.0,
        "peak_tflops_fp16": 0.1,
        "peak_tflops_fp32": 0.1,
        "matrix_tile": None,
        "vendor": "cpu",
        "execution_model": "cpu",
    }
)


def tpu_spec() -> DeviceSpec:
    from yirage_tpu import KNOWN_DEVICES

    return KNOWN_DEVICES["TPU v5e"]


def blocks(plan: Any) -> list[tuple[list[int], list[int], str]]:
    """(tile, buffer dims, dtype) of every input and output block of a plan's kernels."""
    d = plan.to_dict()
    bufs = {b["id"]: b for b in d["buffers"]}
    return [
        (a["tile"], bufs[a["buffer"]]["dims"], bufs[a["buffer"]]["dtype"])
        for k in d["kernels"]
        if k["kind"] == "generated"
        for a in [*k["inputs"], *k["outputs"]]
    ]


# -- the tiling rule --------------------------------------------------------------------------


def test_block_error_names_the_rule_scaled_by_element_width() -> None:
    spec = tpu_spec()
    assert spec.block_error((8, 128), (64, 1024), "float32") is None
    assert spec.block_error((4, 96), (4, 96), "float32") is None  # whole dims
    assert spec.block_error((2, 3, 16, 256), (4, 6, 64, 1024), "bfloat16") is None
    err = spec.block_error((8, 128), (64, 1024), "bfloat16")
    assert err is not None and "multiple of 16" in err and "(16, 128) for 16-bit" in err
    err = spec.block_error((8, 64), (8, 1024), "float32")
    assert err is not None and "last dim" in err and "multiple of 128" in err
    assert "tiling rule" in err
    no_rule = DeviceSpec(**{**spec.to_dict(), "tiling": None, "matrix_tile": (128, 128, 128)})
    assert no_rule.block_error((8, 64), (8, 1024), "float32") is None


def test_the_core_reads_the_tiling_rule_from_the_spec() -> None:
    from yirage._search import device_spec_json

    core, _ = device_spec_json(tpu_spec(), "tpu")
    assert json.loads(core)["tiling"] == [8, 128]
    assert "tiling" not in json.loads(device_spec_json(json.loads(CPU_SPEC), "cpu")[0])
    bad = {**json.loads(CPU_SPEC), "tiling": [0, 128]}
    with pytest.raises(yr.ConfigError, match="tiling"):
        device_spec_json(bad, "cpu")


def test_search_proposes_only_legal_tiles_with_the_rule_and_illegal_ones_without() -> None:
    graph = small_graph("rmsnorm_linear", "float32")
    spec = tpu_spec()
    with_rule = yr.search(graph, device_spec=spec, time_limit=60, top_k=6, deterministic=True)
    legal = [b for c in with_rule.candidates for b in blocks(c.kernel_plan())]
    assert legal and all(spec.block_error(t, d, dt) is None for t, d, dt in legal)
    cpu = json.loads(CPU_SPEC) | {"tiling": None}
    without = yr.search(graph, device_spec=cpu, time_limit=60, top_k=6, deterministic=True)
    found = [b for c in without.candidates for b in blocks(c.kernel_plan())]
    assert any(spec.block_error(t, d, dt) is not None for t, d, dt in found)
    # the same CPU machine with the TPU rule set: legal tiles only
    ruled = yr.search(
        graph, device_spec=cpu | {"tiling": [8, 128]}, time_limit=60, deterministic=True
    )
    ruled_blocks = [b for c in ruled.candidates for b in blocks(c.kernel_plan())]
    assert ruled_blocks and all(spec.block_error(t, d, dt) is None for t, d, dt in ruled_blocks)


def illegal_plan() -> Any:
    """A plan searched for a CPU whose blocks break the TPU rule."""
    graph = small_graph("rmsnorm_linear", "float32")
    res = yr.search(graph, device_spec=CPU_SPEC, time_limit=60, top_k=6, deterministic=True)
    spec = tpu_spec()
    for cand in res.candidates:
        plan = cand.kernel_plan()
        if any(spec.block_error(t, d, dt) for t, d, dt in blocks(plan)):
            return plan
    raise AssertionError("the CPU search proposed no TPU-illegal tile")


def test_a_block_breaking_the_rule_is_refused_before_the_compiler() -> None:
    plan = illegal_plan()
    with pytest.raises(CodegenError, match=r"tiling rule: the (last|second-to-last) dim"):
        interpret_backend().codegen(plan)


@needs_jax
def test_mosaic_refuses_the_same_block_so_the_checker_is_not_stricter_than_needed() -> None:
    """Printed without the check, the illegal plan's pallas_call fails Mosaic's lowering."""
    from yirage_tpu import generate_pallas, lower_for_tpu
    from yirage_tpu._runtime import load_module

    src = generate_pallas(illegal_plan())  # no spec: no check
    path = __import__("pathlib").Path(__import__("tempfile").mkdtemp()) / "illegal.py"
    path.write_text(src.text)
    with pytest.raises(
        yr.BackendError, match=r"does not lower for the TPU.*divisible by 8 and 128"
    ):
        lower_for_tpu(load_module(path, "yirage_tpu_illegal_test"))


# -- the printed text ------------------------------------------------------------------------


def fused(name: str, dtype: str = "float32", loop: bool = True) -> Any:
    """The first fused candidate (with a for-loop of more than one step if ``loop``)."""
    _, cands = candidates(name, dtype)
    for c in cands:
        if c.baseline:
            continue
        ks = [k for k in c.kernel_plan().to_dict()["kernels"] if k["kind"] == "generated"]
        if ks and (not loop or any(k["forloop_range"] > 1 for k in ks)):
            return c
    raise AssertionError(f"no fused {name} candidate with a loop")


def test_printed_kernel_grid_blockspecs_scratch_and_dot() -> None:
    cand = fused("gated_mlp")
    plan = cand.kernel_plan().to_dict()
    (k,) = [k for k in plan["kernels"] if k["kind"] == "generated"]
    text = interpret_backend().codegen(cand.kernel_plan()).text
    grid = (*k["grid"], k["forloop_range"])
    assert f"grid={grid!r}," in text
    assert 'dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")' in text
    # the loop walks the contracted dim: every streamed block's index map uses `it`
    maps = re.findall(r"pl\.BlockSpec\(\(([^)]*)\), lambda bx, by, bz, it: \(([^)]*)\)\)", text)
    assert len(maps) == len(k["inputs"]) + len(k["outputs"])
    assert sum("it" in m for _, m in maps) == sum(
        any(t["var"] == "iter" for d in a["offsets"] for t in d) for a in k["inputs"]
    )
    assert "pltpu.VMEM(" in text and "@pl.when(it == 0)" in text
    assert f"@pl.when(it == {k['forloop_range'] - 1})" in text
    assert "jnp.dot(" in text and "preferred_element_type=jnp.float32" in text
    assert "vmem_limit_bytes=16777216" in text


def test_bf16_tiles_go_to_the_dot_as_they_are() -> None:
    text = interpret_backend().codegen(fused("gated_mlp", "bfloat16").kernel_plan()).text
    dots = [ln for ln in text.splitlines() if "jnp.dot(" in ln]
    assert dots and all("astype" not in ln for ln in dots), dots


def test_safe_softmax_keeps_a_running_max_and_rescales_as_the_plan_says() -> None:
    cand = fused("gqa_decode")
    k = next(k for k in cand.kernel_plan().to_dict()["kernels"] if k["kind"] == "generated")
    (group,) = k["safe_softmax"]
    text = interpret_backend().codegen(cand.kernel_plan()).text
    assert "jnp.full(s_m0.shape, float('-inf'), jnp.float32)" in text
    assert "mn0 = jnp.maximum(s_m0[...], jnp.max(" in text
    assert "jnp.exp(jnp.minimum(" in text and "alpha0 = jnp.exp(s_m0[...] - mn0)" in text
    for r in group["rescale"]:
        assert f"s_acc{r['accum']}[...] = s_acc{r['accum']}[...] * alpha0" in text


def test_library_kernels_print_as_plain_jax_numpy() -> None:
    _, cands = candidates("rmsnorm_linear", "float32")
    (base,) = [c for c in cands if c.baseline]
    text = interpret_backend().codegen(base.kernel_plan()).text
    assert "pl.pallas_call(" not in text
    assert "jnp.matmul(" in text and "_rms_norm(" in text


# -- numerics beyond the candidates ----------------------------------------------------------


@needs_jax
def test_scores_that_overflow_a_plain_exp_stay_finite() -> None:
    """gqa_decode with queries scaled so scores reach hundreds: exp alone overflows fp32; a
    late block with the largest scores makes the running max rescale earlier sums."""
    cand = fused("gqa_decode")
    graph, _ = candidates("gqa_decode", "float32")
    be = interpret_backend()
    kernel = be.load(be.compile(be.codegen(cand.kernel_plan())))
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(t.dims) for t in graph.inputs]
    xs[0] *= 30.0
    xs[1][..., -64:, :] *= 4.0  # keys of the last loop steps
    jx = be.from_numpy([x.astype(np.float32) for x in xs], ["float32"] * len(xs))
    ref = graph.evaluate([np.asarray(x, dtype=np.float64) for x in jx])
    out = kernel(*jx)[0]
    assert rel(out, np.asarray(ref[0])) <= 1e-4


# -- the launcher ----------------------------------------------------------------------------


@needs_jax
def test_launcher_takes_jax_arrays_and_torch_tensors_and_jits_once_per_shape() -> None:
    torch = pytest.importorskip("torch")
    import jax

    cand = fused("lora")
    graph, _ = candidates("lora", "float32")
    be = interpret_backend()
    kernel = be.load(be.compile(be.codegen(cand.kernel_plan())))
    xs, ref = inputs_and_reference(graph)
    out = kernel(*xs)
    assert isinstance(out[0], jax.Array) and rel(out[0], ref[0]) <= TOL["float32"]
    traced = kernel._fn._cache_size()
    kernel(inputs=[x + 1.0 for x in xs])  # new values, same shapes: no new trace
    assert kernel._fn._cache_size() == traced == 1
    tensors = [torch.from_dlpack(x) for x in xs]
    tout = kernel(*tensors)
    assert isinstance(tout[0], torch.Tensor) and rel(tout[0].numpy(), ref[0]) <= TOL["float32"]
    with pytest.raises(yr.ShapeError, match="superoptimize the graph for this shape"):
        kernel(*[x[:2] for x in xs])
    with pytest.raises(yr.DTypeError, match="cast it first"):
        kernel(*[x.astype("bfloat16") for x in xs])


@needs_jax
def test_profile_times_calls_with_block_until_ready() -> None:
    cand = fused("rmsnorm_linear")
    be = interpret_backend()
    kernel = be.load(be.compile(be.codegen(cand.kernel_plan())))
    result = be.profile(kernel, min_repeats=3, min_time_s=0.0, warmup=1)
    assert result.repeats >= 3 and 0 < result.min_us <= result.median_us
    assert result.device.startswith("TFRT_CPU") or "cpu" in result.device.lower()


@needs_jax
def test_superoptimize_with_the_interpret_backend() -> None:
    graph = small_graph("rmsnorm_linear", "float32")
    kernel = yr.superoptimize(graph, backend=interpret_backend(), top_k=2, cache=False)
    assert kernel.backend == "tpu"
    assert kernel.report.verification_level == "ran emulated"
    xs, ref = inputs_and_reference(graph)
    assert rel(kernel(*xs)[0], ref[0]) <= TOL["float32"]


# -- DeviceSpec table, doctor, missing jax ---------------------------------------------------


def test_device_table_holds_v4_v5e_v5p_v6e_with_sources() -> None:
    from yirage_tpu import KNOWN_CHIPS, KNOWN_DEVICES
    from yirage_tpu._device_spec import spec_for_kind

    assert set(KNOWN_CHIPS) == {"TPU v4", "TPU v5e", "TPU v5p", "TPU v6e"}
    for key, chip in KNOWN_CHIPS.items():
        spec = KNOWN_DEVICES[key]
        assert "cloud.google.com/tpu/docs/" in chip.source
        assert spec.execution_model == "tile" and spec.tiling == (8, 128)
        assert spec.matrix_tile == (chip.mxu,) * 3 and spec.compute_units == chip.tensor_cores
        assert spec.peak_tflops_fp16 == chip.bf16_tflops and chip.hbm_bytes > 0
        assert chip.vmem_bytes_per_core >= 16 * 2**20 and chip.mxus_per_core >= 1
    assert KNOWN_CHIPS["TPU v6e"].mxu == 256
    for kind, key in [
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
    ]:
        assert spec_for_kind(kind) == KNOWN_DEVICES[key], kind


def test_live_spec_is_the_table_entry_of_the_chip_jax_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from yirage_tpu import KNOWN_DEVICES, _device_spec

    class Chip:
        device_kind = "TPU v5 lite"
        num_cores = 1

    monkeypatch.setattr(_device_spec, "jax_tpu_device", lambda: (Chip(), "jax sees 4"))
    spec = _device_spec.device_spec()
    assert spec is not None and spec.source == "table+live" and spec.name == "Google TPU v5 lite"
    assert spec.tiling == (8, 128) and spec.matrix_tile == KNOWN_DEVICES["TPU v5e"].matrix_tile
    Chip.device_kind = "TPU v9 ultra"  # unknown: a live spec with the rule and what jax says
    spec = _device_spec.device_spec()
    assert spec is not None and spec.source == "live" and spec.compute_units == 1
    assert spec.tiling == (8, 128) and spec.execution_model == "tile"
    monkeypatch.setattr(_device_spec, "jax_tpu_device", lambda: (None, "jax sees no TPU"))
    assert _device_spec.device_spec() is None


def test_doctor_shows_tpu_installed_unavailable_with_reason_and_level() -> None:
    info = yr.get_backend_info("tpu")
    if info.available:
        pytest.skip("this machine has a TPU")
    assert info.installed and info.codegen_implemented
    assert info.verification_level is not None
    assert info.verification_level.value == "ran emulated"
    assert "no TPU" in info.reason
    if "jax not installed" in info.reason:
        assert "pip install yirage[tpu]" in info.reason
    else:
        assert "emulated" in info.reason and "v5e/v6e" in info.reason


def test_without_jax_the_message_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from yirage_tpu import _probe, _runtime

    real = importlib.util.find_spec

    def no_jax(name: str, *args: Any) -> Any:
        return None if name == "jax" or name.startswith("jax.") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_jax)
    monkeypatch.setattr(_probe, "toolchain", lambda: {})
    monkeypatch.setattr(_probe, "runtime_installed", lambda tools: False)
    monkeypatch.setattr(_probe, "device_nodes", lambda: [])
    with pytest.raises(yr.BackendError, match=r"pip install yirage\[tpu\]"):
        _runtime.require_jax()
    probe = interpret_backend().probe()
    assert not probe.available and "pip install yirage[tpu]" in probe.reason
    assert "pip install yirage[tpu]" in _probe.probe().reason
