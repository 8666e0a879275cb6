"""Masked edge tiles in the Metal printer: the plans of the CUDA C++ masked tests (from
``yr.search`` on the pinned H100 spec, printed with the H100's shared-memory budget: the
emulator has no 32 KiB limit) and masked plans searched for the M2 Ultra (default options)
print guarded loads (zero past the extent) and guarded stores (nothing past it). The
emulator (real threads per threadgroup, threadgroup memory NaN first) matches float64 numpy
with SIMD-group matrices and with the FMA loop; a run on buffers that end right before an
inaccessible page (in a child process) reaches nothing past them and writes every output
element, and the same run of a printing with one guard removed dies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _mps_support import needs_emulator
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

from yirage.plan import CodegenError
from yirage_mps._emulate import EmulatedMsl
from yirage_mps._msl_codegen import MslOptions, generate_msl

pytestmark = needs_emulator

#: the H100's opt-in shared memory per block (the plans were tiled for it)
H100_SMEM = 227 * 1024
RUNS = [
    (c.name, dt, sg)
    for c in CASES
    for dt in DTYPES
    for sg in ((True, False) if dt == "float32" else (True,))
]
PAIRS = [(c.name, dt) for c in CASES for dt in DTYPES]


def _err(text: str, case: str, dtype: str, opts: MslOptions) -> float:
    src = generate_msl(json.loads(text), opts)
    ts, xs = torch_inputs(case, dtype)
    (out,) = EmulatedMsl(src).run(ts)
    return rel_err(out.double().numpy(), BY_NAME[case].reference(*xs))


@pytest.mark.parametrize(
    ("case", "dtype", "simdgroup"),
    RUNS,
    ids=[f"{c}-{dt}-{'simdgroup-matrix' if sg else 'fma'}" for c, dt, sg in RUNS],
)
def test_masked_plans_match_float64_in_the_emulator(case: str, dtype: str, simdgroup: bool) -> None:
    opts = MslOptions(threadgroup_memory=H100_SMEM, use_simdgroup_matrix=simdgroup)
    for text in masked_plans(case, dtype):
        assert _err(text, case, dtype, opts) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", ["gated_mlp_8x200x300", "gated_mlp_47x64x96"])
def test_masked_plans_for_an_apple_gpu(case: str, dtype: str) -> None:
    """Masked candidates of the M2 Ultra's own search that fit its 32 KiB (the search's
    per-block budget counts 16-bit tiles that the printer widens to fp32)."""
    from yirage_mps._device_spec import M2_ULTRA

    ran = 0
    for text in masked_plans(case, dtype, M2_ULTRA.to_json(), limit=4):
        try:
            generate_msl(json.loads(text))
        except CodegenError as e:
            assert "the Apple GPU limit" in str(e)
            continue
        assert _err(text, case, dtype, MslOptions()) <= TOL[dtype]
        ran += 1
    assert ran, "no masked candidate fits the Apple GPU's threadgroup memory"


@pytest.mark.parametrize(("case", "dtype"), PAIRS, ids=[f"{c}-{dt}" for c, dt in PAIRS])
def test_nothing_is_read_or_written_past_the_extents(tmp_path: Path, case: str, dtype: str) -> None:
    text = single_kernel_plans(case, dtype)[0]
    run = fenced_run(tmp_path, "msl", text, case, dtype, "on")
    assert run.code == 0, run.stderr
    assert run.err <= TOL[dtype]


#: one guard of each kind removed from a printing: (case, dtype, the guarded text, unguarded)
MUTATIONS = [
    ("rms_norm_300x64", "float32", "if (bx * 16 + (e / 64) < 300) g1[", "g1["),
    ("rms_norm_300x64", "float32", "(bx * 16 + (e / 64) < 300) ? g0[", "(1) ? g0["),
    ("gated_mlp_8x96x257", "float16", "(bx * 16 + (e % 16) < 257) ? g1[", "(1) ? g1["),
]


@pytest.mark.parametrize(
    ("case", "dtype", "guarded", "unguarded"), MUTATIONS, ids=["store", "row-load", "column-load"]
)
def test_a_printing_without_a_guard_dies(
    tmp_path: Path, case: str, dtype: str, guarded: str, unguarded: str
) -> None:
    text = single_kernel_plans(case, dtype)[0]
    assert guarded in generate_msl(json.loads(text), MslOptions(threadgroup_memory=H100_SMEM)).text
    run = fenced_run(tmp_path, "msl", text, case, dtype, "on", [(guarded, unguarded)])
    assert run.code == -11, (run.code, run.stderr)
