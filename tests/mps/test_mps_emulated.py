"""Every fixture plan printed as Metal Shading Language and executed by the emulator (the
source compiled as C++ against the shim, each threadgroup's threads as real threads meeting
at the barriers, threadgroup memory NaN before every threadgroup) against float64 references;
a printing with a barrier removed or an index wrong fails."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import plans
import pytest
from _mps_support import needs_emulator, rel_err, to_torch

from yirage.plan import CodegenError
from yirage_mps._emulate import EmulatedMsl
from yirage_mps._msl_codegen import MslOptions, MslSource, generate_msl

pytestmark = needs_emulator

# relative Frobenius error allowed per input dtype (kernels compute in fp32)
TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}
CASES = [(dt, c) for dt in ("float32", "float16", "bfloat16") for c in plans.small_cases(dt)]
#: fixture plans (tiled for an H100) whose fp32 tiles exceed the 32 KiB of threadgroup memory
#: of an Apple GPU (searches for an Apple DeviceSpec tile within it: test_mps_search_plans)
TOO_BIG = {("float32", "gqa_decode"), ("float32", "qknorm_gqa")}


def run(src: MslSource, case: plans.Case, seed: int = 4) -> tuple[list[float], list[np.ndarray]]:
    """Relative errors of the emulated outputs against the case's float64 reference."""
    tensors = to_torch(case.random_inputs(seed), [d for _, d in case.inputs])
    outs = EmulatedMsl(src).run(tensors)
    ref = case.reference(*[t.double().numpy() for t in tensors])
    return [rel_err(o.double().numpy(), r) for o, r in zip(outs, ref, strict=True)], ref


# every plan with SIMD-group matrices; the FMA loop for every float32 plan (the plans with
# matmuls whose shapes are not multiples of 8 run it in every dtype)
RUNS = [(dt, c, True) for dt, c in CASES] + [(dt, c, False) for dt, c in CASES if dt == "float32"]


@pytest.mark.parametrize(
    "dtype,case,simdgroup",
    RUNS,
    ids=[f"{dt}-{c.name}-{'simdgroup-matrix' if sg else 'fma'}" for dt, c, sg in RUNS],
)
def test_emulated_msl_matches_float64(dtype: str, case: plans.Case, simdgroup: bool) -> None:
    opts = MslOptions(use_simdgroup_matrix=simdgroup)
    if (dtype, case.name) in TOO_BIG:
        with pytest.raises(CodegenError, match="32768, the Apple GPU limit"):
            generate_msl(case.plan, opts)
        return
    errs, _ = run(generate_msl(case.plan, opts), case)
    assert max(errs) <= TOL[dtype], errs


def test_safe_softmax_survives_scores_that_overflow_exp() -> None:
    """Scores of several hundred: exp without the running max overflows fp32."""
    case = plans.attention_fused(scale=60.0, dtype="float16")
    errs, _ = run(generate_msl(case.plan), case, seed=3)
    assert max(errs) <= TOL["float16"]


def _without_barrier_before(src: MslSource, marker: str) -> MslSource:
    """``src`` without the last barrier before the first line containing ``marker`` (at most
    two lines above it: the barrier that ends the step before)."""
    lines = src.text.split("\n")
    at = next(i for i, line in enumerate(lines) if marker in line)
    bar = next(i for i in (at - 1, at - 2) if "threadgroup_barrier(" in lines[i])
    return replace(src, text="\n".join(lines[:bar] + lines[bar + 1 :]))


@pytest.mark.parametrize(
    "marker",
    [
        "// one SIMD-group per 8x8 output tile",  # the matmul reads both loaded tiles
        "s5[i] = s3[i] / s4[(i / 16)];",  # the epilogue reads the row norms
    ],
    ids=["before-matmul", "before-epilogue"],
)
def test_a_missing_barrier_fails_the_emulator(marker: str) -> None:
    """Between barriers the emulator runs one half of the SIMD-groups before the other (a
    legal Metal schedule), so a read of another SIMD-group's value without a barrier meets the
    NaN the threadgroup memory starts with."""
    case = plans.rmsnorm_linear()
    src = generate_msl(case.plan)
    errs, _ = run(src, case)
    assert max(errs) <= TOL["float32"]
    broken = _without_barrier_before(src, marker)
    errs, _ = run(broken, case)
    assert not max(errs) <= TOL["float32"], errs


def test_a_wrong_index_fails_the_emulator() -> None:
    case = plans.rmsnorm_linear()
    src = generate_msl(case.plan)
    good = "s0[e] = g0[base + (e / 32) * 512 + (e % 32)];"
    assert good in src.text
    broken = replace(src, text=src.text.replace(good, good.replace("* 512", "* 511")))
    errs, _ = run(broken, case)
    assert not max(errs) <= TOL["float32"], errs


def _fused_products(plan: dict) -> list[tuple[str, int, int]]:
    """(kernel, matmul id, accumulator id) of every matmul the plan fuses into its
    accumulator."""
    return [
        (k["name"], o["id"], o["accumulate_into"])
        for k in plan["kernels"]
        if k["kind"] == "generated"
        for o in k["ops"]
        if o.get("accumulate_into") is not None
    ]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_fused_product_adds_into_its_accumulator_and_takes_no_slot(dtype: str) -> None:
    fused = 0
    for case in plans.small_cases(dtype):
        if (dtype, case.name) in TOO_BIG:
            continue
        src = generate_msl(case.plan)
        for name, mm, acc in _fused_products(case.plan):
            fused += 1
            text = src.text.split(f"kernel void {name}(")[1].split("kernel void ")[0]
            assert f"* s{mm} =" not in text and f"* s{acc} =" in text, case.name
        if _fused_products(case.plan):
            errs, _ = run(src, case)
            assert max(errs) <= TOL[dtype], (case.name, errs)
    assert fused, "no fixture plan fuses a matmul into its accumulator"


def test_16_bit_operands_are_widened_block_by_block_when_whole_tiles_do_not_fit() -> None:
    """Each 16-bit plan printed under a threadgroup budget one byte below what its widened
    whole tiles need: where the per-SIMD-group blocks fit, they are printed and checked."""
    printed = []
    for dtype in ("float16", "bfloat16"):
        for case in plans.small_cases(dtype):
            whole = generate_msl(case.plan)
            assert "simdgroup_barrier" not in whole.text
            need = max(v["smem"] for v in whole.kernels.values())
            try:
                src = generate_msl(case.plan, MslOptions(threadgroup_memory=need - 1))
            except CodegenError as exc:
                assert "Apple GPU limit" in str(exc)
                continue
            assert "simdgroup_barrier(mem_flags::mem_threadgroup);" in src.text
            assert max(v["smem"] for v in src.kernels.values()) < need
            errs, _ = run(src, case)
            assert max(errs) <= TOL[dtype], (dtype, case.name, errs)
            printed.append(f"{dtype}-{case.name}")
    assert printed, "no 16-bit fixture plan fits with block-widened operands"
    print("block-widened:", printed)
