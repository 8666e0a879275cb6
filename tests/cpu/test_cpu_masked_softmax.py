"""Masked loops over a softmax on the CPU printer: attention over a kv length no tile divides
(a prime one) is fused into one kernel whose loop walks kv in tiles with a zero-padded last
one, and whose exp carries the padding (``TileOp.masked``). The printer maps the padding's
exp to zero and leaves it out of the safe-softmax row max in the loop's last iteration, so
the kernel matches float64 numpy, also where every real score lies far below the padding's
zeros (a max over them would underflow every exp: 0 / 0). A plain masked exp is zero there
too."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU
from cpu_plan_tools import PlanBuilder, off

import yirage as yr
from yirage.plan import parse_plan

B, S, D, KV = 2, 16, 64, 1031  # a prime kv: no tile divides it
SCALE = 1.0 / 8


def _attention(kv: int = KV, scale: float = SCALE) -> yr.KernelGraph:
    """softmax(Q·Kt·scale)·V, built as yirage._workloads builds attention."""
    g = yr.new_kernel_graph()
    q = g.new_input((B, S, D), yr.float32)
    kt = g.new_input((B, D, kv), yr.float32)
    v = g.new_input((B, kv, D), yr.float32)
    scores = g.mul_scalar(g.matmul(q, kt), scale)
    g.mark_output(g.matmul(g.softmax(scores, -1), v))
    return g


def _ref(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float = SCALE) -> np.ndarray:
    s = q.astype(np.float64) @ kt.astype(np.float64) * scale
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def _rel(out: Any, want: np.ndarray) -> float:
    out = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out - want) / np.linalg.norm(want))


def _masked_safe_exps(plan: dict[str, Any]) -> list[Any]:
    """The exps of safe-softmax groups that carry a masked loop's padding."""
    return [
        o
        for k in parse_plan(plan).generated
        for o in k.ops
        if o.masked and o.id in {g.exp for g in k.safe_softmax}
    ]


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(B, S, D), (B, D, KV), (B, KV, D)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.fixture(scope="module")
def masked_plan() -> dict[str, Any]:
    """The fused single-kernel candidate of attention over kv = 1031 on the pinned CPU spec,
    whose safe-softmax exp is masked along kv."""
    r = yr.search(_attention(), device_spec=REFERENCE_CPU, top_k=8, cache=False)
    plans = [c.kernel_plan().to_dict() for c in r.candidates if not c.baseline]
    fused = [p for p in plans if len(parse_plan(p).kernels) == 1 and _masked_safe_exps(p)]
    assert fused, "the search offers no fused attention with a masked exp"
    return fused[0]


@pytest.fixture(scope="module")
def masked_kernel(masked_plan: dict[str, Any], build: Callable[..., Any]) -> Any:
    return build(masked_plan)


def test_prime_kv_attention_is_fused_with_a_masked_exp_and_matches_float64(
    masked_plan: dict[str, Any], masked_kernel: Any
) -> None:
    """The search offers the fused kernel; its loop prints the last iteration apart, and only
    there does the exp skip the padding (earlier iterations are whole tiles)."""
    from yirage_cpu import _codegen

    arrays = _inputs(3)
    (out,) = masked_kernel(*arrays)
    assert np.all(np.isfinite(out))
    assert _rel(out, _ref(*arrays)) < 1e-5
    (kernel,) = parse_plan(masked_plan).generated
    (exp,) = _masked_safe_exps(masked_plan)
    assert exp.masked[0].dim == len(exp.dims) - 1 and exp.masked[0].extent == KV
    f = kernel.forloop_range
    assert f > 1 and KV % f != 0
    code = _codegen.generate(masked_plan, simd_width_bits=512).code
    before, last = code.split(f"for (int iter = {f - 1}; iter < {f}; ++iter)")
    assert f"iter < {f - 1}; ++iter)" in before and "yr_nv" not in before
    assert last.count("j < yr_nv ? yr_exp(") == 1 and "j < yr_nv; ++j)" in last


def test_every_candidate_of_prime_kv_attention_passes_the_checks_on_the_cpu() -> None:
    """superoptimize on the cpu backend (pinned spec): the fused masked candidates among
    them, every built candidate passes the numeric and stress checks; the chosen kernel
    matches float64 numpy."""
    k = _attention().superoptimize(
        backend="cpu",
        cache=False,
        device_spec=REFERENCE_CPU,
        profile_options={"min_time_s": 0.01, "min_repeats": 3},
    )
    rep = k.report
    assert all(c.status == "ok" for c in rep.candidates), str(rep)
    assert any(c.description.endswith("[1 generated kernel]") for c in rep.candidates), str(rep)
    arrays = _inputs(4)
    assert _rel(k(*arrays)[0], _ref(*arrays)) < 1e-5


def test_scores_far_below_the_padding_stay_finite(masked_kernel: Any) -> None:
    """Every real score far below 0 (positive Q, negative K: each about -200 or lower, where
    float32 exp underflows): the padding's zeros lie far above them, so a max taken over the
    padding would underflow every real exp and divide 0 by 0. The masked max skips it."""
    rng = np.random.default_rng(7)
    q = (np.abs(rng.standard_normal((B, S, D))) * 5 + 1).astype(np.float32)
    kt = -(np.abs(rng.standard_normal((B, D, KV))) * 5 + 1).astype(np.float32)
    v = rng.standard_normal((B, KV, D)).astype(np.float32)
    scores = q.astype(np.float64) @ kt.astype(np.float64) * SCALE
    assert scores.max() < -110  # exp(score) is 0 in float32 for every real score
    (out,) = masked_kernel(q, kt, v)
    assert np.all(np.isfinite(out))
    assert _rel(out, _ref(q, kt, v)) < 1e-4


@pytest.mark.parametrize("dim", [1, 0], ids=["kv_last", "kv_rows"])
def test_a_plain_masked_exp_is_zero_on_the_padding(build: Callable[..., Any], dim: int) -> None:
    """A plain exp (no safe-softmax group) of a masked loop over 13 in tiles of 8: the loads
    read zeros past 13, and the exp maps them to 0, not exp(0) = 1. Along the last dim a sum
    accumulator adds each row's exps; along the rows an iter accumulator adds the tiles."""
    n, m, t = 13, 4, 8
    p = PlanBuilder()
    shape = [m, n] if dim == 1 else [n, m]
    tile = [m, t] if dim == 1 else [t, m]
    offs = [[], off(("iter", t))] if dim == 1 else [off(("iter", t)), []]
    x = p.input(shape)
    kb = p.kernel("masked_exp", grid=(1, 1, 1), forloop_range=2)
    e = kb.unary("exp", kb.input(x, tile, offs))
    acc = kb.accum(e, "sum" if dim == 1 else "iter")
    out_dims = [m, 1] if dim == 1 else [t, m]
    kb.output(p.output(out_dims), acc, [[], []])
    plan = p.build()
    k = plan["kernels"][0]
    k["inputs"][0]["masked"] = [{"dim": dim, "extent": n}]
    k["ops"][e]["masked"] = [{"dim": dim, "extent": n}]
    xs = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    ex = np.exp(xs.astype(np.float64))
    if dim == 1:
        want = ex.sum(axis=1, keepdims=True)
    else:
        want = ex[:t].copy()
        want[: n - t] += ex[t:]
    (out,) = build(plan)(xs)
    assert _rel(out, want) < 1e-6


def test_the_shared_masked_attention_fixture_runs_on_the_cpu(build: Callable[..., Any]) -> None:
    """tests/cuda/plans.py's masked-loop attention (kv 203 in tiles of 32, every score far
    below 0), the fixture the GPU printers run, printed by the CPU printer."""
    path = Path(__file__).parents[1] / "cuda" / "plans.py"
    spec = importlib.util.spec_from_file_location("_cuda_fixture_plans", path)
    assert spec is not None and spec.loader is not None
    plans = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = plans  # its dataclasses look their module up
    spec.loader.exec_module(plans)

    case = plans.attention_fused(kv_len=203, scale=-10.0)
    assert any(o.get("masked") for k in case.plan["kernels"] for o in k.get("ops", []))
    arrays = [a.astype(np.float32) for a in case.random_inputs(2)]
    (want,) = case.reference(*[a.astype(np.float64) for a in arrays])
    (out,) = build(case.plan)(*arrays)
    assert np.all(np.isfinite(out))
    assert _rel(out, want) < 1e-4
