"""Kernels tiled over rows and columns: the grouped tile order in the Triton interpreter
against float64 numpy, the pipeline depth from the stage buffers' bytes, and the search
ranking a fused RMSNorm + Linear at prefill rows on a pinned H100 spec."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _search_graphs import H100

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import plans
from _interp_backend import interp_backend, needs_triton, private_cache

pytestmark = needs_triton


_private_cache = private_cache("yirage-grouped-cache")


def _backend() -> Any:
    return interp_backend("groupedtest")


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def rmsnorm_linear_rows(b: int, h: int, n: int, tm: int, tn: int, tk: int) -> plans.Case:
    """rms_norm(X) @ W with blocks over row tiles (grid y) and column tiles (grid x)."""
    eps = 1e-6
    pb = plans.PlanBuilder(f"grouped-rmsnorm-linear-{b}x{h}x{n}-{tm}-{tn}-{tk}")
    x, w = pb.buf([b, h], "float32", "input"), pb.buf([h, n], "float32", "input")
    o = pb.buf([b, n], "float32", "output")
    k = pb.kernel("rms_mm_rows", [n // tn, b // tm], h // tk)
    tx = k.load(x, [tm, tk], d0=[("by", tm)], d1=[("iter", tk)])
    tw = k.load(w, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    acc = k.accum(k.matmul(tx, tw))
    rms = k.accum(tx, "rms", eps=eps, extent=h)
    k.store(o, k.binary("div", acc, rms, "epilogue"), d0=[("by", tm)], d1=[("bx", tn)])

    def ref(xv: np.ndarray, wv: np.ndarray) -> list[np.ndarray]:
        return [(xv / _rms(xv, eps)) @ wv]

    return plans.Case("rmsnorm_linear", pb.plan, [((b, h), "float32"), ((h, n), "float32")], ref)


def gated_mlp_rows(b: int, h: int, n: int, tm: int, tn: int, tk: int) -> plans.Case:
    """silu(X @ W1) * (X @ W2) with blocks over column tiles (grid x) and row tiles (z)."""
    pb = plans.PlanBuilder(f"grouped-gated-mlp-{b}x{h}x{n}-{tm}-{tn}-{tk}")
    x = pb.buf([b, h], "float32", "input")
    w1, w2 = pb.buf([h, n], "float32", "input"), pb.buf([h, n], "float32", "input")
    o = pb.buf([b, n], "float32", "output")
    k = pb.kernel("gated_rows", [n // tn, 1, b // tm], h // tk)
    tx = k.load(x, [tm, tk], d0=[("bz", tm)], d1=[("iter", tk)])
    t1 = k.load(w1, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    t2 = k.load(w2, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    a1 = k.accum(k.matmul(tx, t1))
    a2 = k.accum(k.matmul(tx, t2))
    out = k.binary("mul", k.unary("silu", a1, "epilogue"), a2, "epilogue")
    k.store(o, out, d0=[("bz", tm)], d1=[("bx", tn)])

    def ref(xv: np.ndarray, w1v: np.ndarray, w2v: np.ndarray) -> list[np.ndarray]:
        s = xv @ w1v
        return [s / (1.0 + np.exp(-s)) * (xv @ w2v)]

    dims = [((b, h), "float32"), ((h, n), "float32"), ((h, n), "float32")]
    return plans.Case("gated_mlp", pb.plan, dims, ref)


def _run(case: plans.Case) -> tuple[float, str]:
    be = _backend()
    src = be.codegen(case.plan)
    kernel = be.load(be.compile(src))
    tensors = be.from_numpy(case.random_inputs(3), [d for _, d in case.inputs])
    (want,) = case.reference(*[t.double().numpy() for t in tensors])
    (out,) = kernel(*tensors)
    got = out.double().numpy()
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    return err, src.code


@pytest.mark.parametrize(
    ("case", "axes"),
    [
        # 19 row tiles (grid y, the longer axis): two groups of 8 and a last group of 3
        (rmsnorm_linear_rows(b=19 * 16, h=64, n=4 * 16, tm=16, tn=16, tk=32), "axis 1 (19)"),
        # 10 column tiles (grid x) over 3 row tiles (grid z): a group of 8, then one of 2
        (gated_mlp_rows(b=3 * 16, h=64, n=10 * 16, tm=16, tn=16, tk=32), "axis 0 (10)"),
    ],
    ids=["rmsnorm_linear_19x4", "gated_mlp_10x3"],
)
def test_the_grouped_tile_order_matches_float64(case: plans.Case, axes: str) -> None:
    err, text = _run(case)
    assert f"grouped tile order: 8 tiles of {axes}" in text
    assert err <= 1e-5, err


def test_a_grid_over_one_axis_keeps_the_launch_order() -> None:
    from yirage_triton._codegen import grouped_axes, grouped_order_lines

    assert grouped_axes((32, 1, 1)) is None and grouped_order_lines((1, 7, 1)) is None
    assert grouped_axes((8, 32, 1)) == (1, 0)
    assert grouped_axes((32, 1, 8)) == (0, 2)
    assert grouped_axes((16, 16, 1)) == (0, 1)  # a tie groups the lower axis
    assert grouped_axes((4, 5, 6)) is None


def _stages(case: plans.Case, smem_limit: int, max_stages: int = 5) -> int:
    from yirage.plan import parse_plan
    from yirage_triton._codegen import TritonOptions, _KernelPrinter

    p = parse_plan(case.plan)
    k = next(k for k in p.kernels if hasattr(k, "forloop_range"))
    opts = TritonOptions(smem_limit=smem_limit, max_stages=max_stages)
    return _KernelPrinter(p, k, opts).stages()


def test_pipeline_depth_follows_the_padded_stage_buffers() -> None:
    """Stages are sized from the streamed tiles at their padded block shapes (K tiles of 125
    are 128-wide buffers) and element size, whatever the plan's own count says."""
    # fp32 tiles: X [16, 125] and two W [125, 64] per stage, padded to 128 wide/high:
    # 8 KB + 2 x 32 KB = 72 KB a stage, a 4 KB output tile beside them
    case = gated_mlp_rows(b=16, h=1000, n=64, tm=16, tn=64, tk=125)
    per_stage = (16 * 128 + 2 * 128 * 64) * 4
    reserve = 16 * 64 * 4
    for limit in (227 * 1024, 160 * 1024, 100 * 1024, 40 * 1024):
        want = max(1, min(5, (limit - reserve) // per_stage))
        assert _stages(case, limit) == want, limit
    assert _stages(case, 227 * 1024) == 3 and _stages(case, 100 * 1024) == 1
    # the plan's count does not enter: the same kernel claiming no shared memory at all
    case.plan["kernels"][0]["smem_bytes"] = 1
    assert _stages(case, 100 * 1024) == 1


@pytest.mark.parametrize("workload", ["rmsnorm_linear", "gated_mlp"])
def test_the_search_ranks_a_fused_row_tiled_kernel_first_at_prefill_rows(workload: str) -> None:
    """At 256 rows x 4096 x 4096 (fp16) the re-reads of the weights by the row tiles of one
    wave come from L2, so one kernel tiled over rows and columns with tensor-core-sized tiles
    (≥ 64 rows) ranks above the library kernels; its printing uses the grouped tile
    order."""
    import yirage as yr
    from yirage._workloads import WORKLOADS
    from yirage.plan import parse_plan
    from yirage_triton import generate_triton

    graph = WORKLOADS[workload].graph("prefill_256")
    config = "mlp" if workload == "gated_mlp" else None
    r = yr.search(graph, device_spec=H100, config=config, time_limit=120, top_k=4, cache=False)
    best = r.candidates[0]
    assert not best.baseline, [c.label for c in r.candidates]
    (kernel,) = parse_plan(best.kernel_plan()).kernels
    grid = getattr(kernel, "grid", (1, 1, 1))
    assert sorted(grid, reverse=True)[1] > 1, grid  # tiled over rows and columns
    rows = {
        a.tile[0]
        for a in kernel.inputs  # type: ignore[union-attr]
        if a.tile[-1] != 1 and any(t.var in ("bx", "by", "bz") for t in a.offsets[0])
    }
    assert rows and min(rows) >= 64, rows
    baseline = next(c for c in r.candidates if c.baseline)
    assert best.predicted_us < baseline.predicted_us
    assert "grouped tile order" in generate_triton(best.kernel_plan()).text
