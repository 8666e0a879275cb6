"""Every candidate the search returns for the five bench workloads at CI size (float32 and
bfloat16, TPU v5e DeviceSpec) is printed as Pallas, runs in Pallas interpret mode on jax's CPU
backend and matches the float64 reference; each is lowered for the TPU platform
(``jax.export``, Mosaic) and compiled by libtpu for a v5e and a v6e chip without a TPU. The
test output records every lowering and compile (``pytest -s`` or ``-rP`` shows it)."""

from __future__ import annotations

import pytest
from _tpu_cases import (
    DTYPES,
    SMALL,
    TOL,
    candidates,
    inputs_and_reference,
    interpret_backend,
    needs_jax,
    rel,
)

pytestmark = needs_jax


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SMALL))
def test_every_candidate_runs_in_interpret_mode(name: str, dtype: str) -> None:
    graph, cands = candidates(name, dtype)
    assert len(cands) >= 2, "the search returned no fused candidate"
    be = interpret_backend()
    xs, ref = inputs_and_reference(graph)
    pallas_calls = 0
    for cand in cands:
        kernel = be.load(be.compile(be.codegen(cand.kernel_plan())))
        pallas_calls += kernel.source.count("pl.pallas_call(")
        outs = kernel(*xs)
        for o, r in zip(outs, ref, strict=True):
            assert rel(o, r) <= TOL[dtype], (cand.label, rel(o, r))
    assert pallas_calls >= len(cands) - 1  # every fused candidate has a generated kernel
    print(f"{name}/{dtype}: {len(cands)} candidates, {pallas_calls} pallas_calls ran (interpret)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SMALL))
def test_every_candidate_lowers_and_compiles_for_v5e_and_v6e(name: str, dtype: str) -> None:
    from yirage_tpu import CI_TOPOLOGIES, compile_for_topology, lower_for_tpu

    _, cands = candidates(name, dtype)
    be = interpret_backend()
    kinds = set()
    for cand in cands:
        module = be.load(be.compile(be.codegen(cand.kernel_plan()))).module
        done = [lower_for_tpu(module)] + [compile_for_topology(module, t) for t in CI_TOPOLOGIES]
        generated = module.KERNELS
        for r in done:
            assert r.mosaic_kernels == len(generated), (cand.label, str(r))
            kinds.add(r.device_kind)
        print(f"{name}/{dtype} {cand.label}: " + "; ".join(str(r) for r in done))
    assert {"TPU v5 lite", "TPU v6 lite"} <= kinds
