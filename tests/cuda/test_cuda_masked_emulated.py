"""Masked edge tiles in the CUDA C++ printer: plans whose last block owns a partial tile (from
``yr.search`` on the pinned H100 spec) print guarded loads (zero past the extent; a 16-byte
load lies wholly inside or past it and is guarded as one) and guarded stores (nothing past
it). Their host emulation (one thread per block, shared memory NaN before every block)
matches float64 numpy with and without ``mma.sync`` operand staging, and a run on buffers
that end right before an inaccessible page (in a child process: a read or write past a
buffer is a SIGSEGV) leaves every output element written and nothing touched past them; the
same run of a printing with one guard removed dies. The ``cuda``-marked test compiles and
runs the same plans on the GPU through the CUDA backend's CUDA C++ variant."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_triton
from masked_cases import (
    BY_NAME,
    CASES,
    DTYPES,
    TOL,
    fenced_run,
    masked_plans,
    rel_err,
    single_kernel_plans,
    torch_inputs,
)

from yirage.plan import CodegenError, ShiftCarry, parse_plan
from yirage_cuda import _toolchain
from yirage_cuda._cuda_codegen import CudaCppOptions, generate_cuda
from yirage_cuda._emulate import EmulatedCudaCpp, host_compiler

pytestmark = [
    needs_triton,
    pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler (g++/c++/clang++)"),
]

# float32 graphs never stage operands for mma.sync: one run each
RUNS = [
    (c.name, dt, mma)
    for c in CASES
    for dt in DTYPES
    for mma in ((False,) if dt == "float32" else (True, False))
]
PAIRS = [(c.name, dt) for c in CASES for dt in DTYPES]


@pytest.mark.parametrize(
    ("case", "dtype", "mma"),
    RUNS,
    ids=[f"{c}-{dt}-{'mma-staging' if m else 'fma'}" for c, dt, m in RUNS],
)
def test_masked_plans_match_float64_in_the_host_emulation(case: str, dtype: str, mma: bool) -> None:
    for text in masked_plans(case, dtype):
        src = generate_cuda(json.loads(text), CudaCppOptions(use_mma=mma))
        ts, xs = torch_inputs(case, dtype)
        (out,) = EmulatedCudaCpp(src).launcher()(*ts)
        err = rel_err(out.double().numpy(), BY_NAME[case].reference(*xs))
        assert err <= TOL[dtype], (parse_plan(json.loads(text)).generated[0].grid, err)


@pytest.mark.parametrize(("case", "dtype"), PAIRS, ids=[f"{c}-{dt}" for c, dt in PAIRS])
def test_nothing_is_read_or_written_past_the_extents(tmp_path: Path, case: str, dtype: str) -> None:
    """Every buffer ends right before an inaccessible page and outputs start as NaN: a
    missing guard kills the child, a too strict one leaves NaN in the output."""
    text = single_kernel_plans(case, dtype)[0]
    run = fenced_run(tmp_path, "cuda", text, case, dtype, "off" if dtype == "float32" else "on")
    assert run.code == 0, run.stderr
    assert run.err <= TOL[dtype]


#: one guard of each kind removed from a printing: (case, dtype, the guarded text, unguarded)
MUTATIONS = [
    (  # the store of the 16 rows of the last block (4 of them past row 300)
        "rms_norm_300x64",
        "float32",
        "if (bx * 16 + (e / 64) < 300) g1[",
        "g1[",
    ),
    (  # a 16-byte load of those rows
        "rms_norm_300x64",
        "float32",
        "if (bx * 16 + (e / 64) < 300) *reinterpret_cast",
        "if (1) *reinterpret_cast",
    ),
    (  # an element load of the last block's 16 columns (one of them inside 257)
        "gated_mlp_8x96x257",
        "float16",
        "(bx * 16 + (e % 16) < 257) ? g1[",
        "(1) ? g1[",
    ),
]


@pytest.mark.parametrize(
    ("case", "dtype", "guarded", "unguarded"),
    MUTATIONS,
    ids=["store", "vector-load", "element-load"],
)
def test_a_printing_without_a_guard_dies(
    tmp_path: Path, case: str, dtype: str, guarded: str, unguarded: str
) -> None:
    """The check above can fail: without one guard the fenced run reaches past a buffer."""
    text = single_kernel_plans(case, dtype)[0]
    assert guarded in generate_cuda(json.loads(text)).text
    run = fenced_run(tmp_path, "cuda", text, case, dtype, "on", [(guarded, unguarded)])
    assert run.code == -11, (run.code, run.stderr)


def test_masked_tiles_with_shifted_partials_are_refused() -> None:
    """The lowering never combines them; a plan that does gets a CodegenError naming it."""
    p = parse_plan(masked_plans("gated_mlp_8x200x300", "float32")[0])
    k = replace(p.generated[0], shift_carry=ShiftCarry((), ()))
    with pytest.raises(CodegenError, match=r"masked edge tiles .* with shifted partials"):
        generate_cuda(replace(p, kernels=(k,)))


@pytest.mark.skipif(
    not _toolchain.nvrtc_available(),
    reason="NVRTC not importable (pip install cuda-python provides cuda.bindings.nvrtc)",
)
@pytest.mark.parametrize(("case", "dtype"), PAIRS, ids=[f"{c}-{dt}" for c, dt in PAIRS])
def test_masked_printings_compile_with_nvrtc(case: str, dtype: str) -> None:
    """The guarded loads and stores (the zero ``uint4`` included) compile for sm_90."""
    for text in masked_plans(case, dtype):
        for mma in (True, False):
            src = generate_cuda(json.loads(text), CudaCppOptions(arch="sm_90", use_mma=mma))
            compiled = _toolchain.compile_cuda(src.text, "sm_90", case)
            assert compiled.cubin[:4] == b"\x7fELF"
            assert all(f".entry {k.name}(" in compiled.ptx for k in src.plan.generated)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["cuda-mma", "cuda-fma"])
@pytest.mark.parametrize(("case", "dtype"), PAIRS, ids=[f"{c}-{dt}" for c, dt in PAIRS])
def test_masked_plans_on_the_gpu(gpu: Any, case: str, dtype: str, variant: str) -> None:
    """The CUDA C++ variant of the CUDA backend (NVRTC/nvcc, driver-API launch) on the GPU
    against float64."""
    import torch
    from test_gpu import build

    for text in masked_plans(case, dtype):
        _, kernel = build(variant, json.loads(text))
        assert kernel.variant == "cuda"
        ts, xs = torch_inputs(case, dtype)
        (out,) = kernel(*[t.to("cuda") for t in ts])
        torch.cuda.synchronize()
        assert rel_err(out.double().cpu().numpy(), BY_NAME[case].reference(*xs)) <= TOL[dtype]
