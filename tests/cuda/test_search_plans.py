"""Plans from the real search: every candidate ``yr.search`` emits for the bench
workloads (at small shapes, float32 and float16) is printed as Triton and run in the Triton
interpreter against the core's float64 reference evaluator, its Triton kernels compile for
sm_90, and its CUDA C++ runs in the host emulation; ``yr.superoptimize`` works end to end
with the interpreter backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import needs_triton

import yirage_triton
from yirage import _core

pytestmark = [
    needs_triton,
    pytest.mark.skipif(
        not hasattr(_core, "search") or not hasattr(_core, "kernel_plan"),
        reason="the installed yirage._core has no search/kernel_plan yet",
    ),
]

# small shapes of each workload family (yirage._workloads builders)
SMALL: dict[str, dict[str, Any]] = {
    "rmsnorm_linear": {"b": 4, "h": 256, "n": 384},
    "gated_mlp": {"b": 4, "h": 256, "n": 256},
    "lora": {"b": 4, "h": 256, "n": 256, "r": 16},
    "gqa_decode": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
    "qknorm_gqa": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
}
TOL = {"float32": 1e-4, "float16": 1e-2}


def small_graph(name: str, dtype: str) -> Any:
    import yirage as yr
    from yirage._workloads import get_workload

    wl = get_workload(name)
    return wl._build(SMALL[name], getattr(yr, dtype))


def search(*args: Any, **kwargs: Any) -> Any:
    import yirage as yr

    return yr.search(*args, **kwargs)


def candidates(interp: Any, name: str, dtype: str) -> list[Any]:
    graph = small_graph(name, dtype)
    result = search(graph, backend=interp, time_limit=60, top_k=6, deterministic=True)
    return [graph, *result.candidates]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(SMALL))
def test_every_search_candidate_runs_in_the_interpreter(interp: Any, name: str, dtype: str) -> None:
    from yirage._kernel import check_inputs, to_numpy64

    graph, *cands = candidates(interp, name, dtype)
    assert cands, "the search returned no candidate"
    arrays = check_inputs(graph, seed=11)
    tensors = interp.from_numpy(arrays, [t.dtype.name for t in graph.inputs])
    reference = graph.evaluate([to_numpy64(t) for t in tensors])
    generated = 0
    for cand in cands:
        plan = cand.kernel_plan()
        kernel = interp.load(interp.compile(interp.codegen(plan)))
        generated += len(kernel.plan.generated)
        outs = kernel(*tensors)
        for o, r in zip(outs, reference, strict=True):
            assert rel(to_numpy64(o), np.asarray(r)) <= TOL[dtype], (
                cand.label,
                plan.to_json()[:2000],
            )
    print(f"{name}/{dtype}: {len(cands)} candidates, {generated} generated kernels ran")


@pytest.mark.parametrize("name", list(SMALL))
def test_every_search_candidate_compiles_for_sm90_and_emulates(interp: Any, name: str) -> None:
    from yirage._kernel import check_inputs, to_numpy64
    from yirage_cuda import _toolchain
    from yirage_cuda._emulate import EmulatedCudaCpp, host_compiler

    graph, *cands = candidates(interp, name, "float16")
    arrays = check_inputs(graph, seed=12)
    tensors = interp.from_numpy(arrays, [t.dtype.name for t in graph.inputs])
    reference = graph.evaluate([to_numpy64(t) for t in tensors])
    for cand in cands:
        src = interp.codegen(cand.kernel_plan())
        path = yirage_triton.write_triton_module(src.triton.text, src.triton.codegen_version)
        module = yirage_triton.load_triton_module(path, interpret=False)
        yirage_triton.aot_compile_triton(module, {b.id: b.dtype for b in src.plan.buffers}, arch=90)
        if src.cuda is None:
            continue  # the C++ printer refused (shared memory); recorded in src.cuda_error
        if _toolchain.nvrtc_available():
            _toolchain.compile_cuda(src.cuda.text, "sm_90")
        if host_compiler() is not None:
            outs = EmulatedCudaCpp(src.cuda).launcher()(*tensors)
            for o, r in zip(outs, reference, strict=True):
                assert rel(to_numpy64(o), np.asarray(r)) <= TOL["float16"], cand.label


def test_superoptimize_with_the_interpreter_backend(interp: Any) -> None:
    from yirage._superoptimize import superoptimize

    graph = small_graph("rmsnorm_linear", "float32")
    kernel = superoptimize(graph, backend=interp, top_k=3, cache=False, time_limit=60)
    assert kernel.backend == "cuda"
    assert "@triton.jit" in kernel.source or "torch.matmul" in kernel.source
    assert kernel.report.verification_level == str(interp.verification_level)
    tensors = interp.random_inputs([(t.dims, t.dtype.name) for t in graph.inputs])
    ref = graph.evaluate([t.double().numpy() for t in tensors])
    assert rel(kernel(*tensors)[0].double().numpy(), np.asarray(ref[0])) <= 1e-4
