"""KernelPlans produced by the core (format ``yirage.kernel_plan`` v3, docs/kernel-plan.md) and
their typed reader, ``yirage.plan``."""

from __future__ import annotations

import functools
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
    gated_mlp,
    generated,
    ops_of,
    plan_of,
    rmsnorm_linear,
    search,
)
from cpu.cpu_plan_tools import PlanBuilder, off

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
    assert plan["format"] == "yirage.kernel_plan" and plan["version"] == 3
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


# -- yirage.plan: the typed reader -----------------------------------------------------------


def _fused_rms(grid: int = 8, forloop: int = 4) -> dict[str, Any]:
    """rms_norm(X) @ W as one kernel (X and W walk the loop), lowered for the H100."""
    return _plan(rmsnorm_linear_ugraph(8, 512, 768, grid=grid, forloop=forloop))


def _hoisting_plan() -> dict[str, Any]:
    """silu(sum_to_64(X)) @ W with X loaded once: the sum and the silu are loop-invariant."""
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(8, 512), dtype=yr.float32)
    w = g.new_input(dims=(256, 256), dtype=yr.float32)
    tb = yr.new_threadblock_graph(
        grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=-1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    a = tb.silu(tb.reduction_to_dimx(bx, 1))
    tb.new_output(tb.forloop_accum(tb.matmul(a, bw)), output_map=(1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return _plan(g)


@functools.cache
def _attention_text() -> str:
    res = search(attention(1, 64, 32, 512), device_spec=CPU2, cache=False)
    fused = [
        c for c in res.candidates if [k["kind"] for k in plan_of(c)["kernels"]] == ["generated"]
    ]
    assert fused
    return json.dumps(plan_of(fused[0]))


def _attention_plan() -> dict[str, Any]:
    """The single-kernel attention candidate's plan (a fresh copy)."""
    return json.loads(_attention_text())  # type: ignore[no-any-return]


def test_the_reader_accepts_every_form_of_a_plan() -> None:
    from yirage.plan import Plan, PlanError, parse_plan

    d = _fused_rms()
    text = json.dumps(d)

    class WithJson:
        def to_json(self) -> str:
            return text

    class Candidate:
        def kernel_plan(self) -> WithJson:
            return WithJson()

    parsed = parse_plan(d)
    assert isinstance(parsed, Plan)
    for form in (text, text.encode(), WithJson(), Candidate(), parsed):
        assert parse_plan(form).text == parsed.text
    with pytest.raises(PlanError, match="not JSON"):
        parse_plan("{nope")
    with pytest.raises(PlanError, match="expected a JSON object, got list"):
        parse_plan("[]")
    with pytest.raises(PlanError, match="format 'other'"):
        parse_plan({**d, "format": "other"})


@pytest.mark.parametrize("version", [1, 2])
def test_plans_before_version_3_are_refused_naming_the_fix(version: int) -> None:
    from yirage.plan import PlanError, parse_plan

    with pytest.raises(PlanError, match=rf"version {version} lacks the analyses.*lower the graph"):
        parse_plan({**_fused_rms(), "version": version})


def test_an_unknown_version_names_the_upgrade() -> None:
    from yirage.plan import PlanError, parse_plan

    with pytest.raises(PlanError, match=r"version 99 is not supported.*install matching"):
        parse_plan({**_fused_rms(), "version": 99})


def test_typed_reading_of_the_analysed_fields() -> None:
    from yirage.plan import parse_plan

    (k,) = parse_plan(_fused_rms(grid=8, forloop=4)).generated
    mm = next(o for o in k.ops if o.op == "matmul")
    assert mm.accumulate_into is not None
    assert k.op(mm.accumulate_into).attr("acc") == "iter"
    assert k.fused_accums() == {mm.accumulate_into: mm.id}
    assert not any(o.hoisted for o in k.ops) and k.invariant_ops() == set()
    assert k.loop_split == 4  # 8 blocks on 132 SMs, the loop has 4 iterations
    (k,) = parse_plan(_hoisting_plan()).generated
    assert [o.phase for o in k.ops] == ["pre", "loop", "pre", "pre", "loop", "accum"]
    assert k.invariant_ops() == {0, 2, 3} == {o.id for o in k.ops if o.hoisted}
    (k,) = parse_plan(_attention_plan()).generated
    (group,) = k.safe_softmax
    assert [(r.accum, r.degree) for r in group.rescale] == [(a, 1) for a in group.accums]


def _reject(plan: dict[str, Any], match: str) -> None:
    from yirage.plan import PlanError, parse_plan

    with pytest.raises(PlanError, match=match):
        parse_plan(plan)


def _k(plan: dict[str, Any]) -> dict[str, Any]:
    (k,) = generated(plan)
    return k


def test_loop_invariant_ops_must_be_hoisted() -> None:
    plan = _hoisting_plan()
    _k(plan)["ops"][0]["phase"] = "loop"
    _reject(plan, "does not walk the loop, so it is loaded once and must be 'pre'")
    plan = _hoisting_plan()
    _k(plan)["ops"][3]["phase"] = "loop"
    _reject(plan, "operands are all 'pre', so it is loop-invariant and must be 'pre'")


def test_accumulate_into_is_checked() -> None:
    plan = _fused_rms()
    ops = _k(plan)["ops"]
    mm = next(o for o in ops if o["op"] == "matmul")
    acc = mm["accumulate_into"]
    rms = next(o for o in ops if o.get("acc") == "rms")
    cases = [
        (lambda: ops[0].update(accumulate_into=acc), "only matmuls accumulate"),
        (lambda: mm.update(accumulate_into=rms["id"]), "is not an 'iter' accumulator"),
        (lambda: mm.update(accumulate_into=99), "accumulate_into 99 is not"),
        (lambda: mm.update(accumulate_into=-1), "accumulate_into must be"),
    ]
    for edit, match in cases:
        plan = _fused_rms()
        ops = _k(plan)["ops"]
        mm = next(o for o in ops if o["op"] == "matmul")
        edit()
        _reject(plan, match)
    # a second reader of the product: the epilogue divides it too
    plan = _fused_rms()
    ops = _k(plan)["ops"]
    mm = next(o for o in ops if o["op"] == "matmul")
    extra = {"id": len(ops), "op": "accum", "acc": "iter", "args": [mm["id"]]}
    ops.append({**extra, "dims": mm["dims"], "phase": "accum"})
    _reject(plan, "read besides accumulator")
    # a matmul of tiles loaded once is hoisted: it cannot add into the accumulator each step
    p = PlanBuilder()
    x, w = p.input([8, 64]), p.input([64, 32])
    k = p.kernel("pre_mm", forloop_range=2)
    mm = k.matmul(k.input(x, [8, 64], [[], []]), k.input(w, [64, 32], [[], []]))
    k.output(p.output([8, 32]), k.accum(mm), [[], []])
    plan = p.build()
    assert "accumulate_into" not in _k(plan)["ops"][mm]
    _k(plan)["ops"][mm]["accumulate_into"] = mm + 1
    _reject(plan, "only 'loop' matmuls accumulate into an accumulator: 'pre'")


def test_rescale_entries_are_checked() -> None:
    base = _attention_plan()
    g0 = _k(base)["safe_softmax"][0]
    a0 = g0["accums"][0]
    cases: list[tuple[Any, str]] = [
        ("x", "rescale must be a list"),
        ([{"accum": 999, "degree": 1}], "rescale names op 999, which is not one of the group"),
        ([{"accum": a0, "degree": 0}], "degree 0, which needs no rescale"),
        ([{"accum": a0, "degree": 1}, {"accum": a0, "degree": 1}], "rescaled twice"),
        ([{"accum": a0, "degree": "1"}], "rescale degree must be an int"),
        ([{"accum": a0}], "missing field 'degree'"),
    ]
    for rescale, match in cases:
        plan = json.loads(json.dumps(base))
        _k(plan)["safe_softmax"][0]["rescale"] = rescale
        _reject(plan, match)
    plan = json.loads(json.dumps(base))
    del _k(plan)["safe_softmax"][0]["rescale"]
    _reject(plan, "missing field 'rescale'")


def _group_plan(rows_of_acc: int, x_walks: bool = True) -> dict[str, Any]:
    """exp(X[2, 256]) with its row sums accumulated, or (``rows_of_acc`` 1) the sum over its
    rows too; with ``x_walks`` off, X is loaded once and the exp is hoisted."""
    p = PlanBuilder()
    x = p.input([2, 256])
    k = p.kernel("k", forloop_range=4)
    if x_walks:
        e = k.unary("exp", k.input(x, [2, 64], [[], off(("iter", 64))]))
    else:
        e = k.unary("exp", k.input(x, [2, 256], [[], []]))
    acc = k.accum(e if rows_of_acc == 2 else k.reduction(e, 0), "sum")
    k.output(p.output([rows_of_acc, 1]), acc, [[], []])
    k.safe_softmax(e, [acc])
    return p.build()


def test_rescale_rows_must_broadcast_and_a_hoisted_exp_rescales_nothing() -> None:
    from yirage.plan import parse_plan

    parse_plan(_group_plan(2))
    _reject(_group_plan(1), r"running max has rows \[2\], which do not broadcast")
    hoisted = _group_plan(2, x_walks=False)
    g = _k(hoisted)["safe_softmax"][0]
    assert g["rescale"] == []  # the builder, as the lowering, leaves it empty
    parse_plan(hoisted)
    g["rescale"] = [{"accum": g["accums"][0], "degree": 1}]
    _reject(hoisted, "is hoisted, so its max is fixed and rescales nothing")


def test_loop_split_is_checked() -> None:
    for split, match in (
        (3, "loop_split 3 is not a power of two"),
        (8, "no larger than forloop_range 4"),
        (0, "loop_split must be ≥ 1"),
    ):
        plan = _fused_rms(grid=8, forloop=4)
        _k(plan)["loop_split"] = split
        _reject(plan, match)
    plan = _fused_rms()
    del _k(plan)["loop_split"]
    _reject(plan, "missing field 'loop_split'")


def _documented_split(k: Any, sm_count: int) -> int:
    """The loop split docs/kernel-plan.md states (cap 16): a kernel whose loop streams tiles
    into accumulators and whose grid leaves SMs idle is split into the smallest power of two,
    at most its iterations, that gives every SM two blocks."""
    if not any(o.op == "accum" for o in k.ops) or not any(a.uses_iter() for a in k.inputs):
        return 1
    split = 1
    while k.blocks * split < 2 * sm_count and split * 2 <= min(16, k.forloop_range):
        split *= 2
    return int(split)


#: The H100 bench workloads (yirage bench --backend cuda) and the split of the first
#: candidate's kernels: 16-block attention kernels split 16 ways (the cap), the 64- to
#: 128-block matmul kernels 4 or 8 ways.
H100_BENCH = [
    ("rmsnorm_linear", "gpu", [4]),
    ("gated_mlp", "gpu", [4]),
    ("lora", "gpu", [8]),
    ("gqa_decode", "gpu", [16]),
    ("gqa_decode", "gpu_kv16384", [16]),
    ("qknorm_gqa", "gpu", [16]),
]


@pytest.mark.parametrize("name,preset,first", H100_BENCH)
def test_the_core_emits_the_split_the_triton_printer_uses(
    name: str, preset: str, first: list[int]
) -> None:
    """On the H100 spec (132 SMs) every generated kernel of every candidate the search offers
    for the bench workloads gets the documented loop split (one rule, one cap)."""
    from yirage._workloads import get_workload
    from yirage.plan import parse_plan

    wl = get_workload(name)
    res = search(
        wl.graph(preset),
        device_spec=H100,
        deterministic=True,
        top_k=4,
        time_limit=60,
        config=wl.search_config,
    )
    plans = [parse_plan(c.kernel_plan()) for c in res.candidates]
    assert [k.loop_split for k in plans[0].generated] == first
    for p in plans:
        for k in p.generated:
            assert k.loop_split == _documented_split(k, 132), k.name


@pytest.mark.parametrize(
    "graph",
    [
        functools.partial(rmsnorm_linear, 8, 1031, 700),
        functools.partial(gated_mlp, 12, 999, 500),
        functools.partial(attention, 2, 24, 64, 301),
    ],
    ids=["rmsnorm_linear_1031x700", "gated_mlp_999x500", "attention_kv301"],
)
def test_searched_masked_plans_compute_their_graph(graph: Any) -> None:
    """Plans the H100-spec search emits for dims no tile divides (masked edge tiles, masked
    loops, masked exps), run by the numpy plan executor written from docs/kernel-plan.md,
    match the graph's float64 evaluation: the lowering's masks, extents and loop tiles say
    what the graph computes, independently of every printer."""
    g = graph()
    res = search(g, device_spec=H100, cache=False, top_k=6)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(t.dims) / np.sqrt(t.dims[-1]) for t in g.inputs]
    (want,) = g.evaluate(xs)
    masked = 0
    for c in res.candidates:
        plan = plan_of(c)
        kernels = generated(plan)
        masked += any(a.get("masked") for k in kernels for a in k["inputs"] + k["outputs"])
        (got,) = run_plan(plan, xs)
        assert np.isfinite(got).all(), c.label
        assert rel_err(got, want) < 1e-9, c.label
    assert masked, [c.label for c in res.candidates]
