"""The hardware optimizers (``yirage.kernel``) answer from the real search: every answer
equals the KernelPlan of the candidate ``yirage.search`` ranks first for the same graph and
DeviceSpec, and moves when the search's pick moves. Specs are pinned (vendor tables and
tests/_pinned_spec.py), never the host's."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr
from yirage import kernel
from yirage.plan import GeneratedKernel, parse_plan


def _table(vendor: str, name: str) -> yr.DeviceSpec:
    mod = pytest.importorskip(f"yirage_{vendor}._device_spec")
    spec: yr.DeviceSpec = mod.KNOWN_DEVICES[name]
    return spec


def _graph() -> yr.KernelGraph:
    """RMSNorm + Linear, the op every backend fuses into one kernel."""
    g = yr.new_kernel_graph()
    x = g.new_input((8, 1024), yr.float16)
    w = g.new_input((1024, 1536), yr.float16)
    g.mark_output(g.rms_norm_linear(x, w))
    return g


def _best(graph: yr.KernelGraph, backend: str, spec: Any) -> Any:
    """What yirage.search itself ranks first: searched again here (no cache), with the
    deterministic search the optimizers below are given too."""
    return yr.search(graph, backend=backend, device_spec=spec, cache=False, **SEARCH).best


def _searched(graph: yr.KernelGraph, backend: str, spec: Any) -> list[GeneratedKernel]:
    """The generated kernels of the search's best candidate."""
    return parse_plan(_best(graph, backend, spec).kernel_plan()).generated


#: the same search options for the optimizers and the searches they are checked against
SEARCH: dict[str, Any] = {"deterministic": True}

CASES = [
    (kernel.CUDAOptimizer, "cuda", ("cuda", "H100 SXM")),
    (kernel.ROCmOptimizer, "rocm", ("rocm", "MI300X")),
    (kernel.MPSOptimizer, "mps", ("mps", "M2 Max")),
    (kernel.AscendOptimizer, "ascend", ("ascend", "Ascend 910B2")),
    (kernel.TPUOptimizer, "tpu", ("tpu", "TPU v5e")),
    (kernel.CPUOptimizer, "cpu", None),
]


def _spec(table: tuple[str, str] | None) -> yr.DeviceSpec:
    return REFERENCE_CPU if table is None else _table(*table)


def _answer(opt: Any, graph: yr.KernelGraph) -> list[Any]:
    """The optimizer's own question of its backend."""
    question = {
        "cuda": "optimize_grid_block_dims",
        "rocm": "optimize_grid_block_dims",
        "mps": "optimize_for_apple_silicon",
        "ascend": "optimize_for_ascend",
        "tpu": "optimize_for_tpu",
        "cpu": "optimize_for_cpu",
    }[opt.backend]
    answer: list[Any] = getattr(opt, question)(graph)
    return answer


def _expected(backend: str, k: GeneratedKernel, spec: yr.DeviceSpec) -> dict[str, Any]:
    """What each backend's answer must say about a searched kernel, field by field."""
    tiles_in = tuple(a.tile for a in k.inputs)
    tiles_out = tuple(a.tile for a in k.outputs)
    if backend in ("cuda", "rocm"):
        return {
            "grid": k.grid,
            "block": (k.block_threads, 1, 1),
            "warps": k.warps,
            "warp_size": spec.warp_size,
            "shared_mem_bytes": k.smem_bytes,
            "input_tiles": tiles_in,
            "output_tiles": tiles_out,
            "loop_split": k.loop_split,
        }
    if backend == "mps":
        return {
            "threadgroups": k.grid,
            "threads_per_threadgroup": k.block_threads,
            "simdgroups": k.warps,
            "simd_width": spec.warp_size,
            "threadgroup_memory_bytes": k.smem_bytes,
            "input_tiles": tiles_in,
        }
    if backend == "ascend":
        return {
            "grid": k.grid,
            "block_dim": k.grid[0] * k.grid[1] * k.grid[2],
            "ai_cores": spec.compute_units,
            "ub_bytes": k.smem_bytes,
            "forloop_range": k.forloop_range,
            "input_tiles": tiles_in,
        }
    if backend == "tpu":
        return {
            "grid": k.grid,
            "in_block_shapes": tiles_in,
            "out_block_shapes": tiles_out,
            "forloop_range": k.forloop_range,
            "vmem_bytes": k.smem_bytes,
        }
    assert spec.simd_width_bits is not None
    return {
        "grid": k.grid,
        "parallel_blocks": k.grid[0] * k.grid[1] * k.grid[2],
        "cores": spec.compute_units,
        "vector_width": spec.simd_width_bits // 32,
        "block_bytes": k.smem_bytes,
        "forloop_range": k.forloop_range,
        "input_tiles": tiles_in,
        "output_tiles": tiles_out,
    }


@pytest.mark.parametrize(("cls", "backend", "table"), CASES, ids=[c[1] for c in CASES])
def test_each_answer_is_what_the_search_picks(cls: Any, backend: str, table: Any) -> None:
    spec = _spec(table)
    graph = _graph()
    opt = cls(spec, **SEARCH)
    answer = _answer(opt, graph)
    searched = _searched(graph, backend, spec)
    assert searched, "the search fuses RMSNorm + Linear on every backend"
    assert len(answer) == len(searched)
    for got, k in zip(answer, searched, strict=True):
        assert got.kernel == k.name
        for key, value in _expected(backend, k, spec).items():
            assert getattr(got, key) == value, (key, got)
    plan = opt.optimize(graph)
    best = _best(graph, backend, spec)
    assert plan.candidate == best.label and plan.predicted_us == best.predicted_us
    assert plan.backend == backend and plan.device == spec.name and not plan.baseline


def test_answers_move_with_the_search_pick() -> None:
    """Another device, another pick: a CPU with a quarter of the per-block budget gets more,
    smaller blocks, and an AMD GPU other dims than an NVIDIA one; each still the search's."""
    graph = _graph()
    small = dataclasses.replace(REFERENCE_CPU, name="small", shared_mem_per_block=32 * 1024)
    (big_cpu,) = kernel.CPUOptimizer(REFERENCE_CPU, **SEARCH).optimize_for_cpu(graph)
    (small_cpu,) = kernel.CPUOptimizer(small, **SEARCH).optimize_for_cpu(graph)
    assert small_cpu.parallel_blocks > big_cpu.parallel_blocks
    assert small_cpu.block_bytes <= 32 * 1024 < big_cpu.block_bytes
    (k,) = _searched(graph, "cpu", small)
    assert (small_cpu.grid, small_cpu.input_tiles) == (k.grid, tuple(a.tile for a in k.inputs))

    nvidia = kernel.CUDAOptimizer(_table("cuda", "H100 SXM"), **SEARCH).optimize_grid_block_dims(
        graph
    )
    amd = kernel.ROCmOptimizer(_table("rocm", "MI300X"), **SEARCH).optimize_grid_block_dims(graph)
    assert (nvidia[0].grid, nvidia[0].block, nvidia[0].warp_size) != (
        amd[0].grid,
        amd[0].block,
        amd[0].warp_size,
    )
    assert amd[0].warp_size == 64 and nvidia[0].warp_size == 32


def test_cpu_vector_width_is_the_printers() -> None:
    """The CPU answer's vector width is the float32 lanes the CPU printer vectorises with
    for the same spec and kernel."""
    codegen = pytest.importorskip("yirage_cpu._codegen")
    graph = _graph()
    (answer,) = kernel.CPUOptimizer(REFERENCE_CPU, **SEARCH).optimize_for_cpu(graph)
    plan = parse_plan(_best(graph, "cpu", REFERENCE_CPU).kernel_plan())
    (k,) = plan.generated
    bits = REFERENCE_CPU.simd_width_bits
    printer = codegen._KernelPrinter(k, {b.id: b for b in plan.buffers}, "k", bits)
    assert answer.vector_width == printer.vl == 16
    narrow = dataclasses.replace(REFERENCE_CPU, name="avx2", simd_width_bits=256)
    (avx2,) = kernel.CPUOptimizer(narrow, **SEARCH).optimize_for_cpu(graph)
    assert avx2.vector_width == 8


def test_tpu_block_shapes_obey_the_tiling_rule() -> None:
    spec = _table("tpu", "TPU v5e")
    graph = _graph()
    (launch,) = kernel.TPUOptimizer(spec, **SEARCH).optimize_for_tpu(graph)
    full = [t.dims for t in graph.inputs]
    for tile, dims in zip(launch.in_block_shapes, full, strict=True):
        assert spec.block_error(tile, dims, "float16") is None


def test_the_baseline_answers_no_launch() -> None:
    """With 8 KiB per block no fused RMSNorm + Linear beats the library kernels for the
    cost model: no generated kernel, so no launch to answer; the library ops are named."""
    tiny = dataclasses.replace(REFERENCE_CPU, name="tiny", shared_mem_per_block=8 * 1024)
    graph = _graph()
    best = _best(graph, "cpu", tiny)
    assert best.baseline
    opt = kernel.CPUOptimizer(tiny, **SEARCH)
    plan = opt.optimize(graph)
    assert plan.baseline and plan.kernels == () and opt.optimize_for_cpu(graph) == []
    assert plan.library_ops == tuple(k.op for k in parse_plan(best.kernel_plan()).kernels)
    assert "matmul" in plan.library_ops


def test_a_registry_name_answers_as_the_search_for_that_chip() -> None:
    graph = _graph()
    by_name = kernel.CUDAOptimizer(device="H100 SXM", **SEARCH).optimize_grid_block_dims(graph)
    best = yr.search(graph, device="H100 SXM", cache=False, **SEARCH).best
    searched = parse_plan(best.kernel_plan()).generated
    assert [(d.grid, d.block, d.input_tiles) for d in by_name] == [
        (k.grid, (k.block_threads, 1, 1), tuple(a.tile for a in k.inputs)) for k in searched
    ]
    with pytest.raises(yr.ConfigError, match="ask ROCmOptimizer"):
        kernel.CUDAOptimizer(device="MI300X").optimize(graph)
    with pytest.raises(yr.ConfigError, match="not both"):
        kernel.CUDAOptimizer(_table("cuda", "H100 SXM"), device="H100 SXM")


def test_no_device_here_names_the_fix() -> None:
    if yr.is_backend_available("rocm"):
        pytest.skip("an AMD GPU is here")
    with pytest.raises(yr.BackendUnavailableError, match="device_spec="):
        kernel.ROCmOptimizer().optimize_grid_block_dims(_graph())


def test_a_graph_is_required() -> None:
    with pytest.raises(TypeError, match="KernelGraph"):
        kernel.CPUOptimizer(REFERENCE_CPU, **SEARCH).optimize("not a graph")  # type: ignore[arg-type]


def test_public_surface() -> None:
    for name in ("CUDAOptimizer", "CPUOptimizer", "MPSOptimizer", "ROCmOptimizer"):
        assert getattr(yr.kernel, name) is getattr(kernel, name)
    for vendor, cls in (
        ("cuda", "CUDAOptimizer"),
        ("cpu", "CPUOptimizer"),
        ("mps", "MPSOptimizer"),
        ("rocm", "ROCmOptimizer"),
        ("ascend", "AscendOptimizer"),
        ("tpu", "TPUOptimizer"),
    ):
        mod = importlib.import_module(f"yirage.kernel.{vendor}")
        assert getattr(mod, cls).backend == vendor
