"""KernelPlans produced by the core (format ``yirage.kernel_plan`` v1, docs/kernel-plan.md)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from _graphs import rmsnorm_linear_ugraph
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
    assert plan["format"] == "yirage.kernel_plan" and plan["version"] == 1
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


def test_split_kv_partials_are_scaled() -> None:
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
    k0, k1 = generated(plan_of(split[0]))
    assert sorted(k0["safe_softmax"][0]["scale_outputs"]) == [0, 1]
    assert k1["safe_softmax"] == []
    for k in (k0, k1):
        assert k["warps"] in (4, 8) and k["block_threads"] == 32 * k["warps"]
        _check_tiles_in_bounds(k)
