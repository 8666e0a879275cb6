"""On a TPU (``nox -s tests-tpu``): superoptimize on the device, kernels against the float64
reference, launcher with torch tensors, timing. Skipped without a TPU unless
YIRAGE_REQUIRE_DEVICE=1."""

from __future__ import annotations

from typing import Any

import pytest
from _tpu_cases import SMALL, TOL, inputs_and_reference, rel, small_graph

import yirage as yr

pytestmark = pytest.mark.tpu


@pytest.fixture(scope="module")
def tpu() -> Any:
    """The TPU backend on the device jax sees."""
    from yirage import _env
    from yirage_tpu import TpuBackend

    be = TpuBackend()
    probe = be.probe()
    if not probe.available:
        if _env.require_device():
            pytest.fail(f"YIRAGE_REQUIRE_DEVICE=1 but no TPU: {probe.reason}")
        pytest.skip(probe.reason)
    return be


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(SMALL))
def test_every_candidate_matches_the_reference_on_the_tpu(tpu: Any, name: str, dtype: str) -> None:
    graph = small_graph(name, dtype)
    result = yr.search(graph, backend=tpu, time_limit=60, top_k=6, deterministic=True)
    xs, ref = inputs_and_reference(graph)
    for cand in result.candidates:
        kernel = tpu.load(tpu.compile(tpu.codegen(cand.kernel_plan())))
        for o, r in zip(kernel(*xs), ref, strict=True):
            assert rel(o, r) <= TOL[dtype], cand.label
        timing = tpu.profile(kernel, xs)
        print(f"{name}/{dtype} {cand.label}: {timing.median_us:.1f} us on {timing.device}")


def test_superoptimize_on_the_tpu_with_torch_tensors(tpu: Any) -> None:
    torch = pytest.importorskip("torch")
    graph = small_graph("rmsnorm_linear", "bfloat16")
    kernel = yr.superoptimize(graph, backend=tpu, top_k=3, cache=False)
    xs, ref = inputs_and_reference(graph)
    tensors = [torch.from_dlpack(x) for x in xs]
    out = kernel(*tensors)[0]
    assert rel(out.float().cpu().numpy(), ref[0]) <= TOL["bfloat16"]
