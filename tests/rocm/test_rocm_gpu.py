"""AMD GPU tests (``pytest -m rocm tests/rocm``, run by ``nox -s tests-rocm``; skipped without
an AMD GPU and torch for ROCm unless YIRAGE_REQUIRE_DEVICE=1): the live DeviceSpec, every
candidate of the bench workloads at CI size on the device against the float64 reference,
``superoptimize(backend="rocm")`` end to end, and profiling with HIP events and graph
replay (torch.cuda.CUDAGraph is a HIP graph on ROCm torch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import rocm_cases

pytestmark = pytest.mark.rocm


def test_live_spec_matches_torch(gpu: Any) -> None:
    import torch

    spec = gpu.device_spec()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert spec.arch == str(props.gcnArchName).split(":")[0]
    assert spec.compute_units == props.multi_processor_count
    assert spec.shared_mem_per_block and spec.shared_mem_per_block >= 64 * 1024


@pytest.mark.parametrize("name", list(rocm_cases.SMALL))
def test_every_candidate_on_the_device(gpu: Any, name: str) -> None:
    from yirage._kernel import check_inputs, to_numpy64

    graph, cands = rocm_cases.candidates(name, "float16")
    tensors = gpu.from_numpy(check_inputs(graph, seed=5), [t.dtype.name for t in graph.inputs])
    reference = graph.evaluate([to_numpy64(t) for t in tensors])
    for cand in cands:
        kernel = gpu.load(gpu.compile(gpu.codegen(cand.kernel_plan())))
        for variant, launcher in gpu.variants(kernel).items():
            for o, r in zip(launcher(*tensors), reference, strict=True):
                err = rocm_cases.rel(to_numpy64(o), np.asarray(r))
                assert err <= 1e-2, (cand.label, variant, err)


def test_superoptimize_and_graph_replay(gpu: Any) -> None:
    import yirage as yr

    graph = rocm_cases.small_graph("rmsnorm_linear", "float16")
    kernel = yr.superoptimize(graph, backend="rocm", top_k=3, cache=False, time_limit=60)
    assert kernel.backend == "rocm" and kernel.report.verification_level == "ran emulated"
    tensors = gpu.random_inputs([(t.dims, t.dtype.name) for t in graph.inputs])
    ref = graph.evaluate([t.double().cpu().numpy() for t in tensors])
    out = kernel(*tensors)[0].double().cpu().numpy()
    assert rocm_cases.rel(out, np.asarray(ref[0])) <= 1e-2
    launcher = gpu.load(gpu.compile(gpu.codegen(graph)))  # the graph as library kernels
    result = gpu.profile(launcher, tensors)
    assert result.median_us > 0 and result.graph_error is None, result.graph_error
