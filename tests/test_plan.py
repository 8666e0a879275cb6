"""KernelPlans produced by the core (format ``yirage.kernel_plan`` v2, docs/kernel-plan.md)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
from _graphs import rmsnorm_linear_ugraph
from _plan_ref import rel_err, run_plan
from _search_graphs import (
    CPU2,
    H100,
    attention,
    generated,
    ops_of,
    plan_of,
    rmsnorm_linear,
    search,
)

import yirage as yr
from yirage import _core
from yirage._search import KernelPlan


def _plan(g: yr.KernelGraph, spec: str = H100) -> dict[str, Any]:
    return json.loads(_core.kernel_plan(g._g, spec))  # type: ignore[no-any-return]


def _starts(offsets: list[list[dict[str, Any]]], env: dict[str, int]) -> list[int]:
    return [sum(env[o["var"]] * o["stride"] for o in dim) for dim in offsets]


def _check_tiles_in_bounds(k: dict[str, Any]) -> None:
    """Every tile of every block and iteration lies inside its buffer, and the output
    tiles of all blocks cover each output exactly once."""
    gx, gy, gz = k["grid"]
    for bx, by, bz in itertools.product(range(gx), range(gy), range(gz)):
        for it in range(k["forloop_range"]):
            env = {"bx": bx, "by": by, "bz": bz, "iter": it}
            for inp in k["inputs"]:
                for s, t, d in zip(
                    _starts(inp["offsets"], env), inp["tile"], inp["dims"], strict=True
                ):
                    assert 0 <= s and s + t <= d
    for out in k["outputs"]:
        starts = {
            tuple(_starts(out["offsets"], {"bx": bx, "by": by, "bz": bz, "iter": 0}))
            for bx, by, bz in itertools.product(range(gx), range(gy), range(gz))
        }
        assert len(starts) == gx * gy * gz  # disjoint tiles


def test_baseline_plan_is_library_kernels() -> None:
    g = rmsnorm_linear(8, 512, 768)
    plan = _plan(g)
    assert plan["format"] == "yirage.kernel_plan" and plan["version"] == 2
    assert plan["graph_hash"] == g.hash()
    assert [k["kind"] for k in plan["kernels"]] == ["library", "library"]
    assert [k["op"] for k in plan["kernels"]] == ["rms_norm", "matmul"]
    assert plan["kernels"][0]["params"] == {
        "num_normalized_dims": 1,
        "eps": 1e-6,
        "has_weight": False,
    }
    roles = [(b["role"], b.get("index")) for b in plan["buffers"]]
    assert roles == [("input", 0), ("input", 1), ("output", 0), ("intermediate", None)]
    assert plan["buffers"][3]["dtype"] == "float32"


def test_hand_written_ugraph_plan() -> None:
    g = rmsnorm_linear_ugraph(8, 512, 768, grid=8, forloop=4)
    plan = _plan(g)
    (k,) = plan["kernels"]
    assert k["kind"] == "generated"
    assert k["grid"] == [8, 1, 1] and k["forloop_range"] == 4
    assert k["block_threads"] == 128 and k["warps"] == 4
    phases = {o["op"]: o["phase"] for o in k["ops"] if o["op"] != "binary"}
    assert phases["input"] == "loop" and phases["accum"] == "accum"
    assert k["ops"][-1]["phase"] == "epilogue"
    rms = [o for o in ops_of(k, "accum") if o["acc"] == "rms"]
    assert rms and rms[0]["extent"] == 512
    assert k["smem_bytes"] > 0
    assert k["safe_softmax"] == []
    _check_tiles_in_bounds(k)


def test_plan_validated_against_the_device() -> None:
    g = rmsnorm_linear_ugraph(8, 512, 768, grid=8, forloop=4)
    tiny = json.loads(H100)
    tiny["shared_mem_per_block"] = 1024
    with pytest.raises(yr.MappingError, match="shared memory"):
        _core.kernel_plan(g._g, json.dumps(tiny))
    few = json.loads(H100)
    few["max_threads_per_block"] = 64
    with pytest.raises(yr.MappingError, match="threads"):
        _core.kernel_plan(g._g, json.dumps(few))


def test_searched_plans_are_in_bounds_and_round_trip() -> None:
    res = search(rmsnorm_linear(8, 512, 768), device_spec=CPU2, cache=False)
    for c in res.candidates:
        plan = c.kernel_plan()
        assert isinstance(plan, KernelPlan)
        assert json.loads(plan.to_json()) == plan.to_dict()
        assert plan.graph_hash == c.hash
        assert {pk.kind for pk in plan.kernels} <= {"generated", "library"}
        for k in generated(plan.to_dict()):
            assert k["block_threads"] == 1  # CPU blocks are single-threaded
            assert k["smem_bytes"] <= json.loads(CPU2)["shared_mem_per_block"]
            _check_tiles_in_bounds(k)


def test_safe_softmax_group_of_fused_attention() -> None:
    """The single-kernel form: exp feeds both accumulators, the output is their ratio, so
    the running-max shift cancels (no scaled outputs)."""
    g = attention(1, 64, 32, 512)
    res = search(g, device_spec=CPU2, cache=False)
    fused = [
        c for c in res.candidates if [k["kind"] for k in plan_of(c)["kernels"]] == ["generated"]
    ]
    assert fused
    (k,) = generated(plan_of(fused[0]))
    (group,) = k["safe_softmax"]
    exp_ops = [o["id"] for o in ops_of(k, "unary") if o["unop"] == "exp"]
    assert group["exp"] in exp_ops
    assert len(group["accums"]) == 2
    assert group["scale_outputs"] == []


def _attention64(xs: list[np.ndarray]) -> np.ndarray:
    s = xs[0] @ xs[1]
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ xs[2]


def test_split_kv_partials_are_stored_shifted_with_their_maxima() -> None:
    # top_k 64: one-kernel forms, charged with the cuda backend's loop split, rank first
    res = search(attention(), device_spec=H100, cache=False, time_limit=300, top_k=64)
    split = [
        c
        for c in res.candidates
        if len(gen := generated(plan_of(c))) == 2
        and len(gen[0]["outputs"]) == 2
        and len(gen[0]["safe_softmax"]) == 1
    ]
    assert split, "no split-KV candidate whose first kernel shifts its exp by a running max"
    plan = plan_of(split[0])
    k0, k1 = generated(plan)
    (group,) = k0["safe_softmax"]
    assert sorted(group["scale_outputs"]) == [0, 1]
    assert k1["safe_softmax"] == []
    # the maxima go to an fp32 intermediate of one column per KV split, like the sums
    store = group["shift_store"]
    m_buf = plan["buffers"][store["buffer"]]
    sums = next(plan["buffers"][o["buffer"]] for o in k0["outputs"] if o["tile"][-1] == 1)
    assert m_buf["role"] == "intermediate" and m_buf["dtype"] == "float32"
    assert m_buf["dims"] == sums["dims"]
    exp = k0["ops"][group["exp"]]
    assert store["tile"] == [*exp["dims"][:-1], 1]
    # the combine loads each split's maxima beside its partials and rescales both sums
    carry = k1["shift_carry"]
    assert sorted(carry["inputs"]) == [0, 1]
    assert sorted(carry["accums"]) == sorted(o["id"] for o in ops_of(k1, "accum"))
    for i in carry["inputs"]:
        load = k1["inputs"][i]["shift_load"]
        assert load["buffer"] == store["buffer"]
        assert load["tile"][-1] * load["width"] == k1["inputs"][i]["tile"][-1]
    for k in (k0, k1):
        assert k["warps"] in (4, 8) and k["block_threads"] == 32 * k["warps"]
        _check_tiles_in_bounds(k)
    # std-3 inputs: logits of several hundred, where exp(m) overflows float32; the plan
    # (float64 interpreter) still computes attention
    rng = np.random.default_rng(4)
    xs = [3 * rng.standard_normal(t.dims) for t in attention().inputs]
    xs[2] /= 3
    assert (xs[0] @ xs[1]).max() > 200
    assert rel_err(run_plan(plan, xs)[0], _attention64(xs)) < 1e-12


def _split_kv_ugraph(reader: str) -> yr.KernelGraph:
    """A split-KV attention µGraph written by hand: kernel 1 (grid 2x1x4) writes partial
    numerators [2,16,4·32] and sums [2,16,4] shifted by its running max; ``reader`` says who
    reads them: ``combine`` (a kernel walking the splits, then their ratio), ``sums`` (the
    same kernel storing the numerator sum alone), ``library`` (library reductions and a
    division) or ``output`` (they are the graph's outputs)."""
    b, m, d, n, s = 2, 16, 32, 1024, 4
    g = yr.new_kernel_graph()
    q = g.new_input((b, m, d), yr.float32)
    k = g.new_input((b, d, n), yr.float32)
    v = g.new_input((b, n, d), yr.float32)
    tb = yr.new_threadblock_graph(
        grid_dim=(b, 1, s), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=d
    )
    tq = tb.new_input(q, input_map=(0, -1, -1), forloop_dim=-1)
    tk = tb.new_input(k, input_map=(0, -1, 2), forloop_dim=2)
    tv = tb.new_input(v, input_map=(0, -1, 1), forloop_dim=1)
    e = tb.exp(tb.matmul(tq, tk))
    tb.new_output(tb.forloop_accum(tb.matmul(e, tv)), output_map=(0, -1, 2))
    tb.new_output(tb.forloop_accum(e, "sum"), output_map=(0, -1, 2))
    num, den = g.customized([q, k, v], tb)
    if reader == "output":
        g.mark_output(num)
        g.mark_output(den)
        return g
    if reader == "library":
        g.mark_output(g.div(g.reduction(num, -1), g.reduction(den, -1)))
        return g
    tc = yr.new_threadblock_graph(
        grid_dim=(b, 1, 1), block_dim=(128, 1, 1), forloop_range=s, reduction_dimx=d
    )
    an = tc.forloop_accum(tc.new_input(num, input_map=(0, -1, -1), forloop_dim=2))
    ad = tc.forloop_accum(tc.new_input(den, input_map=(0, -1, -1), forloop_dim=2))
    tc.new_output(an if reader == "sums" else tc.div(an, ad), output_map=(0, -1, -1))
    (o,) = g.customized([num, den], tc)
    g.mark_output(o)
    return g


def test_hand_written_split_kv_ugraph_carries_the_shift() -> None:
    plan = _plan(_split_kv_ugraph("combine"))
    k0, k1 = generated(plan)
    assert k0["safe_softmax"][0]["shift_store"]["tile"] == [1, 16, 1]
    assert [k1["inputs"][i]["shift_load"]["width"] for i in (0, 1)] == [32, 1]
    rng = np.random.default_rng(6)
    xs = [3 * rng.standard_normal(dims) for dims in ((2, 16, 32), (2, 32, 1024), (2, 1024, 32))]
    assert rel_err(run_plan(plan, xs)[0], _attention64(xs)) < 1e-12


@pytest.mark.parametrize(
    "reader,message",
    [
        ("sums", "keeps the shift"),
        ("library", "library kernel"),
        ("output", "graph output"),
    ],
)
def test_readers_that_cannot_undo_the_shift_are_mapping_errors(reader: str, message: str) -> None:
    with pytest.raises(yr.MappingError, match=message):
        _plan(_split_kv_ugraph(reader))
