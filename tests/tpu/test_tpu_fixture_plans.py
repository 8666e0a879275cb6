"""The hand-written fixture plans of the cuda tests (tests/cuda/plans.py: split-KV attention
with ``shift_store`` and the combine's ``shift_carry``, LoRA's split-K reduced to dimx, a
mixed library+generated plan, odd tiles and every tile op) printed as Pallas without the
tiling check (they are tiled for GPUs) and run in Pallas interpret mode against their
float64 references: the printer's rules beyond what the TPU search proposes at CI size."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tpu_cases import needs_jax, rel

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import plans

pytestmark = needs_jax

#: relative Frobenius error per input dtype (bf16 inputs are rounded first, the reference
#: sees the rounded values; kernels compute in fp32)
TOL = {"float32": 2e-5, "bfloat16": 2e-2}
CASES = [(dt, c) for dt in TOL for c in plans.small_cases(dt)]


def run(case: plans.Case, seed: int = 0) -> tuple[list[Any], list[np.ndarray]]:
    import jax.numpy as jnp

    from yirage_tpu import generate_pallas
    from yirage_tpu._runtime import load_module

    src = generate_pallas(case.plan)
    path = Path(__import__("tempfile").mkdtemp()) / "fixture.py"
    path.write_text(src.text)
    module = load_module(path, f"yirage_tpu_fixture_{src.key}")
    xs = [
        jnp.asarray(x.astype(np.float32), dtype=d)
        for x, (_, d) in zip(case.random_inputs(seed), case.inputs, strict=True)
    ]
    outs = module.forward(*xs, interpret=True)
    return outs, [np.asarray(x, dtype=np.float64) for x in xs]


@pytest.mark.parametrize("dtype,case", CASES, ids=[f"{dt}-{c.name}" for dt, c in CASES])
def test_fixture_plan_matches_float64_in_interpret_mode(dtype: str, case: plans.Case) -> None:
    outs, xs = run(case)
    for o, r in zip(outs, case.reference(*xs), strict=True):
        assert rel(o, r) <= TOL[dtype], case.name


def test_split_kv_with_scores_that_overflow_exp_stays_finite() -> None:
    """Logits of several hundred: the partials leave kernel 0 shifted with their maxima and
    the combine rescales them to its running max (no exp(m) anywhere)."""
    case = plans.gqa_decode(qk_norm=False)
    k0 = case.plan["kernels"][0]
    assert k0["safe_softmax"][0]["scale_outputs"] and "shift_carry" in case.plan["kernels"][-1]
    case.scale = {0: 40.0}
    outs, xs = run(case, seed=3)
    assert rel(outs[0], case.reference(*xs)[0]) <= 1e-4
