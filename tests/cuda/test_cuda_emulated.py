"""The printed CUDA C++ of every fixture plan, built for the host (its emulation branch: one
thread runs each block's steps, shared memory poisoned with NaN before every block) and run
on CPU tensors against float64 references. This checks the C++ printer's indexing, vector
loads, shared-memory allocation, phases, accumulators and safe softmax without a GPU; the
``mma.sync`` fragment code itself only runs on the GPU (tests marked ``cuda``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plans
import pytest
from conftest import needs_triton

from yirage_cuda._cuda_codegen import CudaCppOptions, generate_cuda
from yirage_cuda._emulate import EmulatedCudaCpp, host_compiler

pytestmark = [
    needs_triton,
    pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler (g++/c++/clang++)"),
]

TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}
CASES = [(dt, c) for dt in ("float32", "float16", "bfloat16") for c in plans.small_cases(dt)]


@pytest.mark.parametrize("mma", [True, False], ids=["mma-staging", "fma"])
@pytest.mark.parametrize("dtype,case", CASES, ids=[f"{dt}-{c.name}" for dt, c in CASES])
def test_cuda_cpp_host_emulation_matches_float64(
    interp: Any, dtype: str, case: plans.Case, mma: bool
) -> None:
    src = generate_cuda(case.plan, CudaCppOptions(use_mma=mma))
    launcher = EmulatedCudaCpp(src).launcher()
    xs = case.random_inputs(4)
    tensors = interp.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    outs = launcher(*tensors)
    ref = case.reference(*[t.double().numpy() for t in tensors])
    for o, r in zip(outs, ref, strict=True):
        a = o.double().numpy()
        assert np.isfinite(a).all(), "NaN: a value was read before it was written"
        assert np.linalg.norm(a - r) <= TOL[dtype] * np.linalg.norm(r)


def test_emulation_catches_uninitialised_shared_memory(interp: Any) -> None:
    """Sanity check of the harness: a kernel that reads a slot it never wrote yields NaN."""
    case = plans.gated_mlp()
    src = generate_cuda(case.plan)
    broken = src.text.replace("s4[i] = 0.0f;", "s4[i] = s4[i];")  # accumulator left unset
    assert broken != src.text
    from dataclasses import replace

    launcher = EmulatedCudaCpp(replace(src, text=broken)).launcher()
    tensors = interp.random_inputs(launcher.input_specs)
    assert not bool(launcher(*tensors)[0].isfinite().all())


@pytest.mark.parametrize("mma", [True, False], ids=["mma-staging", "fma"])
def test_a_fused_product_takes_no_shared_memory_slot(mma: bool) -> None:
    """A matmul the plan fuses into its accumulator (``accumulate_into``) adds into the
    accumulator's slot (checked numerically above): no slot of its own is declared, and the
    kernel needs less shared memory than the product plus the accumulator."""
    fused = 0
    for dtype in ("float32", "float16"):
        for case in plans.small_cases(dtype):
            src = generate_cuda(case.plan, CudaCppOptions(use_mma=mma))
            for k in case.plan["kernels"]:
                for o in k["ops"] if k["kind"] == "generated" else ():
                    if o.get("accumulate_into") is None:
                        continue
                    fused += 1
                    text = src.text.split(f" {k['name']}(")[1].split('extern "C"')[0]
                    assert f"* s{o['id']} = " not in text, (dtype, case.name)
                    assert f"* s{o['accumulate_into']} = " in text, (dtype, case.name)
    assert fused
