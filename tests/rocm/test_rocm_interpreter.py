"""Every candidate the search emits for the five bench workloads at CI size (float32 and
float16, searched for an MI300X), printed as the ROCm backend prints it (its compile options
in every launch, IEEE fp32 dots, stages that fit 64 KiB of LDS, and every further printing it
would race), runs in the Triton interpreter through the backend's codegen → compile → load
and matches the core's float64 reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import rocm_cases

TOL = {"float32": 1e-4, "float16": 1e-2}
CASES = [(w, dt) for dt in ("float32", "float16") for w in rocm_cases.SMALL]


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{w}-{dt}" for w, dt in CASES])
def test_every_candidate_matches_float64_in_the_interpreter(
    interp: Any, name: str, dtype: str
) -> None:
    from yirage._kernel import check_inputs, to_numpy64

    graph, cands = rocm_cases.candidates(name, dtype)
    assert cands, "the search returned no candidate"
    arrays = check_inputs(graph, seed=11)
    tensors = interp.from_numpy(arrays, [t.dtype.name for t in graph.inputs])
    reference = graph.evaluate([to_numpy64(t) for t in tensors])
    ran = 0
    for cand in cands:
        source = interp.codegen(cand.kernel_plan())
        for text in (source.code, *(s.text for s in source.triton_variants.values())):
            assert "launch_pdl" not in text
            if source.plan.generated:
                assert "waves_per_eu=0, matrix_instr_nonkdim=16, kpack=1" in text
            assert "input_precision='tf32'" not in text
        kernel = interp.load(interp.compile(source))
        for variant, launcher in interp.variants(kernel).items():
            outs = launcher(*tensors)
            for o, r in zip(outs, reference, strict=True):
                err = rocm_cases.rel(to_numpy64(o), np.asarray(r))
                assert err <= TOL[dtype], (cand.label, variant, err)
            ran += 1
    print(f"{name}/{dtype}: {len(cands)} candidates, {ran} printings ran")


def test_superoptimize_with_the_interpreter_backend(interp: Any) -> None:
    from yirage._superoptimize import superoptimize

    graph = rocm_cases.small_graph("rmsnorm_linear", "float32")
    kernel = superoptimize(graph, backend=interp, top_k=2, cache=False, time_limit=60)
    assert kernel.backend == "rocm" and kernel.report.verification_level == "ran emulated"
    assert "waves_per_eu=0" in kernel.source or "torch.matmul" in kernel.source
    tensors = interp.random_inputs([(t.dims, t.dtype.name) for t in graph.inputs])
    ref = graph.evaluate([t.double().numpy() for t in tensors])
    assert rocm_cases.rel(kernel(*tensors)[0].double().numpy(), np.asarray(ref[0])) <= 1e-4
