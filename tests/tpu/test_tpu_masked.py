"""Masked edge tiles (docs/kernel-plan.md, ``masked``) printed as Pallas: a grid that does not
divide a dim gives a partial last block, whose loads the printer masks to zero past the
extent (a TPU reads undefined values there, interpret mode NaN) and whose stores Pallas clips.

The search offers masked tiles on GPU specs only (the TPU v5e search proposes none for these
graphs), so the search plans come from the H100 spec: their 16-column tiles break the TPU
tiling rule, so they print without the rule's check and run in both interpreters (the
HLO one of ``interpret=True`` and the TPU one of ``pltpu.InterpretParams``, which simulates
the DMAs of partial blocks). Plans whose masked blocks obey the rule (masked rows of
RMSNorm + Linear from the IR, a split-K matmul over a masked contraction by hand) also go
through the backend's check and compile with libtpu for v5e and v6e. The split-K plan is the
one where the zeros matter: dropping the read mask breaks it."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _search_graphs import H100
from _tpu_cases import DTYPES, TOL, inputs_and_reference, interpret_backend, needs_jax, rel

import yirage as yr
from yirage.plan import CodegenError, parse_plan

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import plans

pytestmark = needs_jax

#: A masked load as printed; the mutation below replaces it with the bare load.
MASKED_LOAD = re.compile(r"jnp\.where\(mk\d+, (x\d+\[\.\.\.\]), 0\)")


def _gated_mlp(dt: Any) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((8, 200), dt)
    w1, w2 = g.new_input((200, 300), dt), g.new_input((200, 300), dt)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _rmsnorm_linear(dt: Any) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x, w = g.new_input((8, 96), dt), g.new_input((96, 257), dt)
    g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(96,)), w))
    return g


def _matmul(dt: Any) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    a, b = g.new_input((47, 64), dt), g.new_input((64, 96), dt)
    g.mark_output(g.matmul(a, b))
    return g


#: name: (builder, search config); no power-of-two tile divides 300, 257 or 47
GRAPHS: dict[str, tuple[Callable[[Any], yr.KernelGraph], str | None]] = {
    "gated_mlp_8x200x300": (_gated_mlp, "mlp"),
    "rmsnorm_linear_8x96x257": (_rmsnorm_linear, None),
    "matmul_47x64x96": (_matmul, None),
}


def _masked_inputs(plan: Any) -> int:
    return sum(1 for k in parse_plan(plan).generated for a in k.inputs if a.masked)


@cache
def masked_search_plans(name: str, dtype: str) -> tuple[yr.KernelGraph, list[dict[str, Any]]]:
    """The graph and the plans of every candidate with masked tiles the H100 search returns."""
    build, config = GRAPHS[name]
    graph = build(getattr(yr, dtype))
    kw = {"config": config} if config else {}
    r = yr.search(graph, device_spec=H100, top_k=4, cache=False, deterministic=True, **kw)
    out = [c.kernel_plan().to_dict() for c in r.candidates]
    return graph, [p for p in out if any(k.masked_accesses for k in parse_plan(p).generated)]


def _load(source: Any) -> Any:
    be = interpret_backend()
    return be.load(be.compile(source))


# -- search plans (GPU tiles) ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(GRAPHS))
def test_masked_search_plans_match_float64_in_both_interpreters(name: str, dtype: str) -> None:
    from jax.experimental.pallas import tpu as pltpu

    from yirage_tpu import generate_pallas

    graph, found = masked_search_plans(name, dtype)
    assert found, f"the H100 search returned no candidate with masked tiles for {name}"
    xs, ref = inputs_and_reference(graph)
    for plan in found:
        src = generate_pallas(plan)  # no tiling check: GPU tiles (see the refusal test)
        assert src.text.count("jnp.where(mk") >= _masked_inputs(plan) > 0
        kernel = _load(src)
        runs = {
            "interpret=True": kernel(*xs),
            "InterpretParams": kernel.module.forward(*xs, interpret=pltpu.InterpretParams()),
        }
        for how, outs in runs.items():
            for o, r in zip(outs, ref, strict=True):
                assert o.shape == r.shape, (how, o.shape, r.shape)  # nothing past the extent
                assert rel(o, r) <= TOL[dtype], (name, how, rel(o, r))


def test_the_tiling_rule_refuses_masked_gpu_tiles() -> None:
    """W1's masked blocks of 16 columns: only a whole dim may be narrower than 128."""
    _, found = masked_search_plans("gated_mlp_8x200x300", "float32")
    plan = next(p for p in found if parse_plan(p).generated[0].forloop_range == 1)
    with pytest.raises(CodegenError, match=r"input 1 .* tiling rule") as e:
        interpret_backend().codegen(plan)
    assert "a masked edge tile" in str(e.value) and "search with this DeviceSpec" in str(e.value)


def test_the_tpu_search_offers_no_masked_tiles() -> None:
    """What the search gives the TPU spec for these dims (why the plans above are GPU plans);
    should the core start offering them, their blocks must still pass the tiling check."""
    from yirage_tpu import KNOWN_DEVICES, check_blocks

    spec = KNOWN_DEVICES["TPU v5e"]
    for build, config in GRAPHS.values():
        kw = {"config": config} if config else {}
        r = yr.search(build(yr.float32), device_spec=spec, top_k=4, cache=False, **kw)
        for c in r.candidates:
            plan = parse_plan(c.kernel_plan().to_dict())
            check_blocks(plan, spec)
            assert not any(k.masked_accesses for k in plan.generated), c.label


# -- plans whose masked blocks obey the TPU tiling rule --------------------------------------


def _masked_rows_plan(dtype: str) -> tuple[yr.KernelGraph, dict[str, Any]]:
    """RMSNorm + Linear over 200 rows in 13 blocks of 16 (the last owns 8), the loop walking
    the 256-wide reduction: lowered by the core for the v5e spec."""
    from yirage import _core
    from yirage._search import device_spec_json
    from yirage_tpu import KNOWN_DEVICES

    dt = getattr(yr, dtype)
    g = yr.new_kernel_graph()
    x, w = g.new_input((200, 256), dt), g.new_input((256, 384), dt)
    tb = yr.new_threadblock_graph(
        grid_dim=(13, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(-1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(bx, bw))
    tb.new_output(tb.div(acc, tb.forloop_accum(bx, "rms")), output_map=(0, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    spec, _ = device_spec_json(KNOWN_DEVICES["TPU v5e"], "tpu")
    return g, json.loads(_core.kernel_plan(g._g, spec))


#: the split-K plan: 8 rows, a contraction of 383 in 3 blocks of 128 (the last owns 127)
SPLIT_K = (8, 383, 128, 3)


def _split_k_plan(dtype: str) -> dict[str, Any]:
    """Each block multiplies its slice of the masked contraction and stores the partial
    product side by side: a dim the kernel reduces, where the zeros past 383 matter."""
    m, k, n, blocks = SPLIT_K
    pb = plans.PlanBuilder(f"fixture-masked-split-k-{m}x{k}x{n}-{dtype}")
    a, b = pb.buf([m, k], dtype, "input"), pb.buf([k, n], dtype, "input")
    out = pb.buf([m, blocks * n], dtype, "output")
    kb = pb.kernel("split_k", [blocks], 1)
    ta = kb.load(a, [m, 128], "pre", d1=[("bx", 128)])
    tw = kb.load(b, [128, n], "pre", d0=[("bx", 128)])
    kb.store(out, kb.accum(kb.matmul(ta, tw, "pre")), d1=[("bx", n)])
    plan = pb.plan
    ins = plan["kernels"][0]["inputs"]
    ins[0]["masked"] = [{"dim": 1, "extent": k}]
    ins[1]["masked"] = [{"dim": 0, "extent": k}]
    return plan


def _split_k_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _, k, _, blocks = SPLIT_K
    ends = [(s, min(s + 128, k)) for s in range(0, 128 * blocks, 128)]
    return np.concatenate([a[:, s:e] @ b[s:e] for s, e in ends], axis=1)


def _split_k_inputs(dtype: str) -> tuple[list[Any], np.ndarray]:
    m, k, n, _ = SPLIT_K
    be = interpret_backend()
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n))]
    xs = be.from_numpy(arrays, [dtype, dtype])
    return xs, _split_k_reference(*(np.asarray(x, dtype=np.float64) for x in xs))


def _padded_with(xs: list[Any], garbage: float) -> list[Any]:
    """The split-K inputs in whole blocks (384 along the contraction), the tail holding
    ``garbage``: what a TPU may read past the extent, fed explicitly."""
    import jax.numpy as jnp

    a, b = xs
    return [
        jnp.pad(a, ((0, 0), (0, 1)), constant_values=garbage),
        jnp.pad(b, ((0, 1), (0, 0)), constant_values=garbage),
    ]


def _compile_for_tpus(module: Any) -> None:
    from yirage_tpu import CI_TOPOLOGIES, compile_for_topology, lower_for_tpu

    done = [lower_for_tpu(module)] + [compile_for_topology(module, t) for t in CI_TOPOLOGIES]
    assert all(r.mosaic_kernels == len(module.KERNELS) for r in done), [str(r) for r in done]
    assert {"TPU v5 lite", "TPU v6 lite"} <= {r.device_kind for r in done}
    print("; ".join(str(r) for r in done))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_rows_obey_the_rule_run_and_compile_for_v5e_and_v6e(dtype: str) -> None:
    graph, plan = _masked_rows_plan(dtype)
    assert _masked_inputs(plan) == 1
    be = interpret_backend()
    kernel = be.load(be.compile(be.codegen(plan)))  # with the v5e tiling check
    xs, ref = inputs_and_reference(graph)
    (out,) = kernel(*xs)
    assert out.shape == ref[0].shape and rel(out, ref[0]) <= TOL[dtype], rel(out, ref[0])
    _compile_for_tpus(kernel.module)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_over_a_masked_contraction_reads_zero_past_it(dtype: str) -> None:
    """Right in both interpreters and with finite garbage past the extent of whole-block
    inputs (the masks compare with the plan's extent, not the array's)."""
    from jax.experimental.pallas import tpu as pltpu

    be = interpret_backend()
    kernel = be.load(be.compile(be.codegen(_split_k_plan(dtype))))
    assert kernel.source.count("jnp.where(mk") == 2
    xs, ref = _split_k_inputs(dtype)
    for how in (True, pltpu.InterpretParams()):
        (out,) = kernel.module.forward(*xs, interpret=how)
        assert out.shape == ref.shape and rel(out, ref) <= TOL[dtype], (how, rel(out, ref))
    (out,) = kernel.module.split_k(*_padded_with(xs, 7.0), interpret=True)
    assert out.shape == ref.shape and rel(out, ref) <= TOL[dtype], rel(out, ref)
    _compile_for_tpus(kernel.module)


def test_without_the_read_mask_the_tail_leaks_into_the_sums() -> None:
    """The mutation check: the same printed module with its masked loads made bare reads
    NaN past the extent in both interpreters (jax fills the tail of a partial block with NaN)
    and the garbage of padded inputs, and no longer matches."""
    from jax.experimental.pallas import tpu as pltpu

    from yirage_tpu import PallasSource

    be = interpret_backend()
    src = be.codegen(_split_k_plan("float32"))
    bare, n = MASKED_LOAD.subn(r"\1", src.text)
    assert n == 2
    kernel = _load(PallasSource(src.plan, bare))
    xs, ref = _split_k_inputs("float32")
    for how in (True, pltpu.InterpretParams()):
        (out,) = kernel.module.forward(*xs, interpret=how)
        assert not np.isfinite(np.asarray(out)[:, -128:]).any(), how  # the last block's sums
    (out,) = kernel.module.split_k(*_padded_with(xs, 7.0), interpret=True)
    assert rel(out, ref) > 1e-2


def test_masked_tiles_with_shifted_partials_are_refused() -> None:
    """The lowering never emits them; a plan that has them is refused, naming the fix."""
    from yirage_tpu import generate_pallas

    plan = plans.gqa_decode(bb=2).plan
    plan["kernels"][0]["inputs"][0]["masked"] = [{"dim": 0, "extent": 2}]
    with pytest.raises(CodegenError, match="masked edge tiles with shifted partials") as e:
        generate_pallas(plan)
    assert "a grid that divides the split dims" in str(e.value)


# -- a masked loop ---------------------------------------------------------------------------


def _masked_loop_plan(dtype: str) -> tuple[list[Any], np.ndarray, dict[str, Any]]:
    """RMSNorm + Linear over K = 1031 (prime) as one kernel whose loop walks K in 9 tiles of
    115 (the last owns 111), lowered by the core; its inputs and a float64 numpy reference."""
    from yirage import _core
    from yirage._search import device_spec_json
    from yirage_tpu import KNOWN_DEVICES

    dt = getattr(yr, dtype)
    g = yr.new_kernel_graph()
    x, w = g.new_input((8, 1031), dt), g.new_input((1031, 64), dt)
    tb = yr.new_threadblock_graph(
        grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=9, reduction_dimx=64
    )
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(-1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(bx, bw))
    tb.new_output(tb.div(acc, tb.forloop_accum(bx, "rms")), output_map=(-1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    spec, _ = device_spec_json(KNOWN_DEVICES["TPU v5e"], "tpu")
    plan = json.loads(_core.kernel_plan(g._g, spec))
    be = interpret_backend()
    rng = np.random.default_rng(3)
    xs = be.from_numpy(
        [rng.standard_normal(s).astype(np.float32) for s in ((8, 1031), (1031, 64))],
        [dtype, dtype],
    )
    a, b = (np.asarray(v, dtype=np.float64) for v in xs)
    ref = a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + 1e-6) @ b
    return xs, ref, plan


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_masked_loop_reads_zero_past_the_contraction_in_both_interpreters(dtype: str) -> None:
    """The loads the loop walks are masked by the iteration's start (the grid's last axis);
    without those masks the last tile reads NaN past K in both interpreters."""
    from jax.experimental.pallas import tpu as pltpu

    from yirage_tpu import PallasSource, generate_pallas

    xs, ref, plan = _masked_loop_plan(dtype)
    assert _masked_inputs(plan) == 2
    src = generate_pallas(plan)  # no tiling check: tiles of 115 are GPU and CPU tiles
    assert src.text.count("jnp.where(mk") == 2 and "pl.program_id(3) * 115" in src.text
    kernel = _load(src)
    for how in (True, pltpu.InterpretParams()):
        (out,) = kernel.module.forward(*xs, interpret=how)
        assert out.shape == ref.shape and rel(out, ref) <= TOL[dtype], (how, rel(out, ref))
    bare, n = MASKED_LOAD.subn(r"\1", src.text)
    assert n == 2
    (out,) = _load(PallasSource(src.plan, bare)).module.forward(*xs, interpret=True)
    assert rel(out, ref) > TOL[dtype]
