"""Masked edge tiles on the CPU printer: plans whose last block owns a partial tile (from the
search on the pinned H100 spec, which offers them for dims no power-of-two matrix tile
divides) print with guarded loads (zero past the extent) and stores (nothing past it),
compile for real and match float64 numpy; a malformed masked field is refused. A masked loop
(a contraction no loop range divides) is offered on the pinned CPU spec too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _search_graphs import H100

import yirage as yr
from yirage.plan import PlanError, parse_plan

EPS = 1e-6


def _gated(b: int, h: int, n: int) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((b, h), yr.float32)
    w1, w2 = g.new_input((h, n), yr.float32), g.new_input((h, n), yr.float32)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _rms_linear(b: int, h: int, n: int) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x, w = g.new_input((b, h), yr.float32), g.new_input((h, n), yr.float32)
    g.mark_output(g.matmul(g.rms_norm(x, (h,), eps=EPS), w))
    return g


def _gated_ref(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    s = x @ w1
    return s / (1.0 + np.exp(-s)) * (x @ w2)


def _rms_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)) @ w


def _walked(acc: Any, dim: int) -> bool:
    return any(t.var == "iter" for t in acc.offsets[dim])


def _masked_plans(
    graph: yr.KernelGraph, config: str | None, spec: Any = H100, loop: bool = False
) -> list[dict[str, Any]]:
    """The plans of the search's candidates with masked tiles (``loop``: masked by the loop)."""
    r = yr.search(graph, device_spec=spec, config=config, top_k=4, cache=False)
    plans = []
    for c in r.candidates:
        if c.baseline:
            continue
        plan: dict[str, Any] = c.kernel_plan().to_dict()
        accesses = [acc for k in parse_plan(plan).generated for _, acc in k.masked_accesses]
        if any(not loop or any(_walked(a, m.dim) for m in a.masked) for a in accesses):
            plans.append(plan)
    return plans


def _case(workload: str, dims: tuple[int, int, int]) -> tuple[Any, Any, Any, str | None]:
    """(graph, float64 reference, input shapes, search config) of ``workload`` at ``dims``."""
    b, h, n = dims
    if workload == "gated_mlp":
        return _gated(b, h, n), _gated_ref, [(b, h), (h, n), (h, n)], "mlp"
    return _rms_linear(b, h, n), _rms_ref, [(b, h), (h, n)], None


def _arrays(shapes: list[tuple[int, int]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(s) / (np.sqrt(s[0]) if i else 1.0)).astype(np.float32)
        for i, s in enumerate(shapes)
    ]


def _rel(out: Any, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(out) - want) / np.linalg.norm(want))


@pytest.mark.parametrize(
    ("workload", "dims"),
    [
        ("gated_mlp", (8, 200, 300)),  # N = 300: 19 column blocks of 16, the last owns 12
        ("rmsnorm_linear", (47, 64, 96)),  # a prime M = 47: 3 row blocks of 16
    ],
)
def test_masked_plans_compile_and_match_float64(
    build: Any, workload: str, dims: tuple[int, int, int]
) -> None:
    graph, ref, shapes, config = _case(workload, dims)
    plans = _masked_plans(graph, config)
    assert plans, "the search offers no masked candidate"
    arrays = _arrays(shapes, 5)
    want = ref(*[a.astype(np.float64) for a in arrays])
    for plan in plans[:2]:
        (out,) = build(plan)(*arrays)
        assert out.shape == want.shape
        assert _rel(out, want) < 1e-5


def test_a_masked_field_beyond_the_tile_rank_is_refused() -> None:
    (plan, *_) = _masked_plans(_gated(8, 200, 300), "mlp")
    k = next(k for k in plan["kernels"] if k["kind"] == "generated")
    out = k["outputs"][0]
    out["masked"] = [{"dim": 5, "extent": 300}]
    with pytest.raises(PlanError, match="dim 5: expected distinct dims of the tile"):
        parse_plan(plan)
    out["masked"] = []
    with pytest.raises(PlanError, match="reaches 304 > buffer"):
        parse_plan(plan)  # an unmasked store past the extent stays an error


@pytest.mark.parametrize(
    ("workload", "dims"),
    [("rmsnorm_linear", (8, 1031, 256)), ("gated_mlp", (8, 1031, 128))],
    ids=["rms_linear_8x1031x256", "gated_8x1031x128"],
)
def test_a_prime_contraction_gets_a_fused_masked_loop_on_the_cpu(
    build: Any, workload: str, dims: tuple[int, int, int]
) -> None:
    """K = 1031 (prime) on the pinned CPU spec: like its divisible neighbour 1024, the graph
    gets fused candidates, whose loop walks K in tiles of 16, 32 … with a masked last one.
    The printer runs the iterations before the last on whole tiles in place and the last on
    a zero-padded copy; every candidate passes the numeric and stress checks, and the fused
    kernel matches float64 numpy."""
    from _pinned_spec import REFERENCE_CPU

    from yirage_cpu import _codegen

    graph, ref, shapes, config = _case(workload, dims)
    k = graph.superoptimize(
        backend="cpu",
        config=config,
        cache=False,
        device_spec=REFERENCE_CPU,
        profile_options={"min_time_s": 0.01, "min_repeats": 3},
    )
    rep = k.report
    assert all(c.status == "ok" for c in rep.candidates), str(rep)
    fused = [c for c in rep.candidates if c.description.endswith("[1 generated kernel]")]
    assert fused, str(rep)
    h = dims[1]
    for c in fused:
        loop = int(c.description.split("loop=")[1].split(":")[0])
        assert loop > 1 and h % loop != 0, c.description
    arrays = _arrays(shapes, 9)
    want = ref(*[a.astype(np.float64) for a in arrays])
    plans = _masked_plans(graph, config, REFERENCE_CPU, loop=True)
    plan = next(p for p in plans if len(parse_plan(p).generated) == 1)
    src = _codegen.generate(plan, simd_width_bits=512)
    f = parse_plan(plan).generated[0].forloop_range
    assert f"iter < {f - 1}; ++iter)" in src.code and f"iter = {f - 1}; iter < {f};" in src.code
    for out in (k(*arrays)[0], build(plan)(*arrays)[0]):
        assert _rel(out, want) < 1e-5


def test_a_ragged_free_dim_gets_masked_block_counts_on_the_cpu(build: Any) -> None:
    """N = 1543 (prime) on the pinned CPU spec: no power-of-two block count divides it, so
    the search offers counts whose last block owns a partial, masked tile. The printer
    shifts that tile back to end at the extent (it overlaps the block before, recomputes
    the overlap and stores only its own columns), so every block reads whole tiles in place
    and nothing is staged; every candidate passes the numeric and stress checks, and each
    masked plan matches float64 numpy."""
    from _pinned_spec import REFERENCE_CPU

    from yirage_cpu import _codegen

    graph, ref, shapes, config = _case("rmsnorm_linear", (8, 256, 1543))
    k = graph.superoptimize(
        backend="cpu",
        cache=False,
        device_spec=REFERENCE_CPU,
        profile_options={"min_time_s": 0.01, "min_repeats": 3},
    )
    assert all(c.status == "ok" for c in k.report.candidates), str(k.report)
    plans = _masked_plans(graph, config, REFERENCE_CPU)
    assert plans, "the search offers no masked block count"
    arrays = _arrays(shapes, 11)
    want = ref(*[a.astype(np.float64) for a in arrays])
    assert _rel(k(*arrays)[0], want) < 1e-5
    for plan in plans:
        kernel = next(kp for kp in parse_plan(plan).generated if kp.masked_accesses)
        grid = kernel.grid[0]
        assert grid > 1 and 1543 % grid != 0, kernel.grid
        tile = -(-1543 // grid)
        code = _codegen.generate(plan, simd_width_bits=512).code
        assert f"< {1543 - tile} ? " in code and ">= yr_skip" in code  # shifted, stored after
        assert "memset" not in code and " : 0.0f" not in code  # nothing staged or guarded
        (out,) = build(plan)(*arrays)
        assert _rel(out, want) < 1e-5


def test_a_masked_axis_the_blocks_reduce_over_keeps_zero_padding(build: Any) -> None:
    """K = 13 split over 2 blocks in tiles of 8, each block storing its partial product in
    its own half of the output: no output carries the masked axis, so the last tile is not
    shifted back (its overlap would be summed twice); it reads zeros past K instead, and the
    two halves add up to x @ w."""
    from cpu_plan_tools import PlanBuilder, off

    from yirage_cpu import _codegen

    m, k, n = 4, 13, 16
    p = PlanBuilder()
    x, w = p.input([m, k]), p.input([k, n])
    kb = p.kernel("split_k", grid=(2, 1, 1), forloop_range=1)
    tx = kb.input(x, [m, 8], [[], off(("bx", 8))])
    tw = kb.input(w, [8, n], [off(("bx", 8)), []])
    kb.output(p.output([m, 2 * n]), kb.matmul(tx, tw, phase="epilogue"), [[], off(("bx", n))])
    plan = p.build()
    kernel = plan["kernels"][0]
    kernel["inputs"][0]["masked"] = [{"dim": 1, "extent": k}]
    kernel["inputs"][1]["masked"] = [{"dim": 0, "extent": k}]
    assert f"< {k - 8} ? " not in _codegen.generate(plan, simd_width_bits=512).code
    xs, ws = _arrays([(m, k), (k, n)], 13)
    (out,) = build(plan)(xs, ws)
    want = xs.astype(np.float64) @ ws.astype(np.float64)
    assert _rel(out[:, :n] + out[:, n:], want) < 1e-6
