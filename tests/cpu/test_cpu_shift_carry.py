"""Split-KV partials carried shifted across kernels (docs/kernel-plan.md, ``shift_store`` /
``shift_load`` / ``shift_carry``): the CPU printing stays finite and exact where logits are
far beyond fp32's exp range (un-shifting the partials by exp(m) overflowed to inf and the
combine's inf/inf gave NaN), against float64 numpy and the float64 plan interpreter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err, run_plan
from _search_graphs import H100, attention, generated, plan_of, search
from cpu_plan_tools import PlanBuilder, off

from yirage.plan import PlanError
from yirage_cpu import _codegen

TOL = 1e-5


def _attention64(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s = (q.astype(np.float64) @ kt.astype(np.float64)) * scale
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def _split_attention_plan(scale: float, combine: str) -> dict[str, Any]:
    """softmax(Q Kᵀ·scale) V over 4 KV splits: ``part`` stores the partial numerators and
    sums shifted by its row max and the maxima; ``combine`` walks the splits with its loop
    (``loop``) or loads all of them once and sums them to dimx (``dimx``)."""
    heads, rows, d, kv, splits, chunk = 4, 4, 32, 512, 4, 64
    span = kv // splits
    p = PlanBuilder()
    q, kt, v = p.input([heads, rows, d]), p.input([heads, d, kv]), p.input([heads, kv, d])
    out = p.output([heads, rows, d])
    num = p.intermediate([heads, rows, splits * d])
    den = p.intermediate([heads, rows, splits])
    mx = p.intermediate([heads, rows, splits])
    head = off(("bx", 1))
    k = p.kernel("part", grid=(heads, splits, 1), forloop_range=span // chunk)
    tq = k.input(q, [1, rows, d], [head, [], []])
    tk = k.input(kt, [1, d, chunk], [head, [], off(("by", span), ("iter", chunk))])
    tv = k.input(v, [1, chunk, d], [head, off(("by", span), ("iter", chunk)), []])
    e = k.unary("exp", k.unary("mul_scalar", k.matmul(tq, tk), [scale]))
    a_num, a_den = k.accum(k.matmul(e, tv)), k.accum(e, "sum")
    o_num = k.output(num, a_num, [head, [], off(("by", d))])
    o_den = k.output(den, a_den, [head, [], off(("by", 1))])
    k.safe_softmax(e, [a_num, a_den], [o_num, o_den], (mx, [head, [], off(("by", 1))]))
    if combine == "loop":
        c = p.kernel("combine", grid=(heads, 1, 1), forloop_range=splits)
        tn = c.input(num, [1, rows, d], [head, [], off(("iter", d))], shift=(mx, d))
        td = c.input(den, [1, rows, 1], [head, [], off(("iter", 1))], shift=(mx, 1))
        an, ad = c.accum(tn), c.accum(td)
        c.shift_carry([0, 1], [an, ad])
    else:
        c = p.kernel("combine", grid=(heads, 1, 1), forloop_range=1)
        tn = c.input(num, [1, rows, splits * d], [head, [], []], shift=(mx, d))
        td = c.input(den, [1, rows, splits], [head, [], []], shift=(mx, 1))
        an, ad = c.accum(tn, "sum_todimx", dimx=d), c.accum(td, "sum")
        c.shift_carry([0, 1], [])  # loaded once: the running max is final before the loop
    c.output(out, c.epi_binary("div", an, ad), [head, [], []])
    return p.build()


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((4, 4, 32), dtype=np.float32)
    kt = rng.standard_normal((4, 32, 512), dtype=np.float32)
    kt[:, :, -128:] *= 4.0  # the last split's scores dominate: every part rescales to it
    v = rng.standard_normal((4, 512, 32), dtype=np.float32)
    return [q, kt, v]


@pytest.mark.parametrize("combine", ["loop", "dimx"])
@pytest.mark.parametrize("scale", [0.1, 3.0])
def test_split_kv_partials_stay_finite_beyond_the_exp_range(
    build: Any, combine: str, scale: float
) -> None:
    plan = _split_attention_plan(scale, combine)
    launcher = build(plan)
    xs = _inputs(3)
    logits = (xs[0].astype(np.float64) @ xs[1].astype(np.float64)) * scale
    if scale > 1:
        assert logits.max() > 200  # exp(m) of a partial overflows float32 past ~88
    (out,) = launcher(*xs)
    assert np.isfinite(out).all()
    want = _attention64(*xs, scale)
    assert rel_err(out, want) < TOL
    # the plan interpreter stores the same shifted partials and maxima
    assert rel_err(run_plan(plan, [x.astype(np.float64) for x in xs])[0], want) < 1e-12


def test_older_plan_versions_are_refused_with_the_fix() -> None:
    """Version 1 un-shifted scale_outputs before the store and neither it nor version 2
    carries the analysed fields; such plans are not printed."""
    plan = _split_attention_plan(0.1, "loop")
    for version in (1, 2):
        plan["version"] = version
        with pytest.raises(PlanError, match="lower the graph again with this yirage"):
            _codegen.generate(plan)


def test_a_shifted_input_needs_the_shift_carry() -> None:
    plan = _split_attention_plan(0.1, "loop")
    del plan["kernels"][1]["shift_carry"]
    with pytest.raises(PlanError, match="shift_load"):
        _codegen.generate(plan)


def test_searched_split_kv_candidates_with_std3_inputs(build: Any) -> None:
    """Every split-KV candidate the search offers for attention (inputs of std 3: logits up
    beyond 150, where exp(m) of a partial overflows float32) prints, compiles and matches
    float64."""
    b, m, d, n = 2, 16, 32, 1024
    res = search(attention(b, m, d, n), device_spec=H100, cache=False, top_k=64)
    carried = [c for c in res.candidates if any("shift_carry" in k for k in generated(plan_of(c)))]
    assert carried, "the search offers no split-KV candidate"
    rng = np.random.default_rng(11)
    q = (3 * rng.standard_normal((b, m, d))).astype(np.float32)
    kt = (3 * rng.standard_normal((b, d, n))).astype(np.float32)
    v = rng.standard_normal((b, n, d)).astype(np.float32)
    assert (q.astype(np.float64) @ kt.astype(np.float64)).max() > 150
    want = _attention64(q, kt, v, 1.0)
    for c in carried:
        plan = plan_of(c)
        k0, k1 = generated(plan)
        assert (
            k0["safe_softmax"][0]["shift_store"]["buffer"]
            == (k1["inputs"][k1["shift_carry"]["inputs"][0]]["shift_load"]["buffer"])
        )
        (out,) = build(plan)(q, kt, v)
        assert np.isfinite(out).all(), c.label
        assert rel_err(out, want) < TOL, c.label
