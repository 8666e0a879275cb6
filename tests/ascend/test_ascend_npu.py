"""On an Ascend NPU (``nox -s tests-ascend``; skipped without one unless
YIRAGE_REQUIRE_DEVICE=1): the printed kernels compiled by Triton-Ascend (BiSheng) and run on
``torch.npu`` tensors through the shared launcher match the float64 reference, and
``superoptimize`` returns a kernel that runs on the NPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _ascend_cases as cases

pytestmark = pytest.mark.ascend


@pytest.fixture(scope="module")
def npu() -> Any:
    from yirage_ascend import AscendBackend

    backend = AscendBackend()
    probe = backend.probe()
    if not probe.available:
        if os.environ.get("YIRAGE_REQUIRE_DEVICE") == "1":
            pytest.fail(f"YIRAGE_REQUIRE_DEVICE=1 but no Ascend NPU: {probe.reason}")
        pytest.skip(f"no Ascend NPU: {probe.reason}")
    return backend


@pytest.mark.parametrize("name", list(cases.SMALL))
def test_every_candidate_runs_on_the_npu(npu: Any, name: str) -> None:
    ran = cases.run_candidates(npu, name, "float16")
    assert ran.kernels > 0
    print(f"{name}/float16 on {npu.device_spec().name}: {ran}")


def test_superoptimize_returns_a_kernel_on_torch_npu(npu: Any) -> None:
    import yirage as yr
    from yirage._workloads import get_workload

    graph = get_workload("rmsnorm_linear")._build(cases.SMALL["rmsnorm_linear"], yr.float16)
    kernel = yr.superoptimize(graph, backend=npu, top_k=3, cache=False, time_limit=60)
    tensors = npu.random_inputs([(t.dims, t.dtype.name) for t in graph.inputs])
    assert all(t.device.type == "npu" for t in tensors)
    ref = graph.evaluate([t.double().cpu().numpy() for t in tensors])
    out = kernel(*tensors)[0]
    assert out.device.type == "npu"
    assert cases.rel(out.double().cpu().numpy(), np.asarray(ref[0])) <= cases.TOL["float16"]
