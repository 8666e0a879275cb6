"""Masked edge tiles: dims no power-of-two matrix tile divides (5000 = 625·8, primes) get
fused candidates whose last block owns a partial tile. The search offers them on the pinned
H100 spec, fingerprints verify them, the plan names the masked dims, and the Triton printer
(run by the interpreter) masks their loads and stores: numbers against float64 numpy."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from _interp_backend import interp_backend, needs_triton, private_cache
from _search_graphs import H100, scaled_attention

import yirage as yr
from yirage.plan import GeneratedKernel, parse_plan

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

pytestmark = needs_triton

EPS = 1e-6


_private_cache = private_cache("yirage-masked-cache")


def _backend() -> Any:
    return interp_backend("maskedtest")


def gated_mlp(b: int, h: int, n: int, dt: Any = yr.float32) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input((b, h), dt)
    w1, w2 = g.new_input((h, n), dt), g.new_input((h, n), dt)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def rmsnorm_linear(b: int, h: int, n: int, dt: Any = yr.float32) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x, w = g.new_input((b, h), dt), g.new_input((h, n), dt)
    g.mark_output(g.matmul(g.rms_norm(x, (h,), eps=EPS), w))
    return g


def _gated_ref(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    s = x @ w1
    return s / (1.0 + np.exp(-s)) * (x @ w2)


def _rms_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)) @ w


GRAPHS = {"gated_mlp": (gated_mlp, _gated_ref), "rmsnorm_linear": (rmsnorm_linear, _rms_ref)}


def _search(workload: str, dims: tuple[int, int, int], dt: Any = yr.float32, top_k: int = 4) -> Any:
    graph = GRAPHS[workload][0](*dims, dt)
    config = "mlp" if workload == "gated_mlp" else None
    return yr.search(graph, device_spec=H100, config=config, top_k=top_k, cache=False)


def _interpreted_error(
    workload: str, dims: tuple[int, int, int], candidate: Any, seed: int
) -> float:
    """Relative error of ``candidate`` run by the Triton interpreter against float64 numpy,
    on inputs of ``seed`` (the source must mask: it compares with one of the dims)."""
    be = _backend()
    rng = np.random.default_rng(seed)
    b, h, n = dims
    shapes = [(b, h), (h, n)] if workload == "rmsnorm_linear" else [(b, h), (h, n), (h, n)]
    arrays = [rng.standard_normal(s) / (np.sqrt(s[0]) if i else 1.0) for i, s in enumerate(shapes)]
    want = GRAPHS[workload][1](*arrays)
    src = be.codegen(candidate.kernel_plan())
    assert any(f"< {d}" in src.code for d in dims if d > 16 and d % 16), src.code
    kernel = be.load(be.compile(src))
    tensors = be.from_numpy([a.astype(np.float32) for a in arrays], ["float32"] * len(arrays))
    (out,) = kernel(*tensors)
    got = out.double().numpy()
    assert got.shape == want.shape
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _masked(candidate: Any) -> list[tuple[GeneratedKernel, str, Any]]:
    if candidate.baseline:
        return []
    return [
        (k, name, acc)
        for k in parse_plan(candidate.kernel_plan()).generated
        for name, acc in k.masked_accesses
    ]


@pytest.mark.parametrize("workload", ["gated_mlp", "rmsnorm_linear"])
def test_a_ragged_workload_gets_a_fused_candidate_like_its_divisible_neighbour(
    workload: str,
) -> None:
    """The bench's ragged preset (8 x 4000 x 5000, fp16): 5000 columns have no matrix-sized
    power-of-two divisor, so the fused kernel tiles them by 16/32/64 with a masked last
    block, and its loop walks K = 4000 in power-of-two tiles (the last one masked, where
    4000 / f would start each tile off alignment); 8 x 4096 x 4096 is fused with dividing
    tiles, as before."""
    divisible = _search(workload, (8, 4096, 4096), yr.float16).candidates[0]
    assert not divisible.baseline and not _masked(divisible), divisible.label
    ragged = _search(workload, (8, 4000, 5000), yr.float16)
    best = ragged.candidates[0]
    assert not best.baseline, [c.label for c in ragged.candidates]
    masked = _masked(best)
    assert masked, best.label
    for k, _, acc in masked:
        for m in acc.masked:
            t = acc.tile[m.dim]
            assert t >= 16 and t & (t - 1) == 0, (t, best.label)
            if any(o.var == "iter" for o in acc.offsets[m.dim]):  # K, walked by the loop
                assert m.extent == 4000 and (k.forloop_range - 1) * t < 4000 < k.forloop_range * t
            else:
                assert m.extent == 5000 and -(-5000 // t) in k.grid, (t, k.grid)
    baseline = next(c for c in ragged.candidates if c.baseline)
    assert best.predicted_us < baseline.predicted_us


@pytest.mark.parametrize(
    ("workload", "dims"),
    [
        ("gated_mlp", (8, 200, 300)),  # N = 300 over 19 blocks of 16 (the last owns 12)
        ("gated_mlp", (8, 96, 257)),  # a prime N: 17 blocks of 16, the last owns 1
        ("rmsnorm_linear", (8, 200, 300)),
        ("rmsnorm_linear", (47, 64, 96)),  # a prime M = 47: 3 row blocks of 16
    ],
    ids=["gated_8x200x300", "gated_8x96x257", "rms_linear_8x200x300", "rms_linear_47x64x96"],
)
def test_masked_candidates_match_float64_in_the_interpreter(
    workload: str, dims: tuple[int, int, int]
) -> None:
    r = _search(workload, dims)
    chosen = [c for c in r.candidates if _masked(c)]
    assert chosen, [c.label for c in r.candidates]
    for cand in chosen[:2]:
        err = _interpreted_error(workload, dims, cand, seed=7)
        assert err <= 1e-5, (cand.label, err)


def test_a_plan_with_a_masked_tile_the_loop_walks_is_refused() -> None:
    """The plan reader checks the masked fields: grid blocks and the loop do not both walk
    a masked dim, and the extent is the buffer's."""
    from yirage.plan import PlanError

    plan = _search("gated_mlp", (8, 200, 300)).candidates[0].kernel_plan().to_dict()
    k = next(k for k in plan["kernels"] if k["kind"] == "generated")
    io = next(i for i in k["inputs"] if i.get("masked"))
    io["masked"][0]["extent"] = 299
    with pytest.raises(PlanError, match="extent 299 is not the buffer's dim 300"):
        parse_plan(plan)
    io["masked"][0]["extent"] = 300
    io["offsets"][io["masked"][0]["dim"]].append({"var": "iter", "stride": 1})
    with pytest.raises(PlanError, match="walked by grid blocks or by the loop, not both"):
        parse_plan(plan)


def _loop_masked(candidate: Any) -> list[tuple[GeneratedKernel, Any]]:
    """The masked accesses of ``candidate`` along a dim its for-loop walks."""
    return [
        (k, m)
        for k, _, acc in _masked(candidate)
        for m in acc.masked
        if any(t.var == "iter" and t.stride for t in acc.offsets[m.dim])
    ]


@pytest.mark.parametrize(
    ("workload", "dims"),
    [("rmsnorm_linear", (8, 1031, 64)), ("gated_mlp", (8, 1031, 64))],
    ids=["rms_linear_8x1031x64", "gated_8x1031x64"],
)
def test_a_prime_contraction_is_walked_by_a_masked_loop_in_the_interpreter(
    workload: str, dims: tuple[int, int, int]
) -> None:
    """K = 1031 (prime): no loop range divides it, so the fused candidates walk it in
    matrix-sized tiles whose last one is masked; the Triton printer masks those loads (zeros
    past K), the RMSNorm divides by 1031, and the numbers match float64 numpy."""
    r = _search(workload, dims, top_k=6)
    chosen = [c for c in r.candidates if _loop_masked(c)]
    assert chosen, [c.label for c in r.candidates]
    h = dims[1]
    for cand in chosen[:2]:
        for k, m in _loop_masked(cand):
            assert m.extent == h and h % k.forloop_range != 0
            # GPU tiles are powers of two (1031 in 17 tiles of 64, not 61): aligned starts
            tile = _walk_tile(cand, m)
            assert tile & (tile - 1) == 0 and (k.forloop_range - 1) * tile < h, cand.label
        err = _interpreted_error(workload, dims, cand, seed=11)
        assert err <= 1e-5, (cand.label, err)


def _walk_tile(candidate: Any, m: Any) -> int:
    """The loop tile (iter stride) of ``candidate``'s access masked by ``m``."""
    return next(
        t.stride
        for _, _, acc in _masked(candidate)
        if m in acc.masked
        for t in acc.offsets[m.dim]
        if t.var == "iter"
    )


def _softmax_ref(q: np.ndarray, kt: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ kt / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize(
    ("dims", "offset"),
    [((2, 16, 64, 1031), 0.0), ((2, 16, 64, 1031), 80.0), ((2, 47, 64, 1031), 0.0)],
    ids=["scores", "scores_far_below_zero", "prime_query_rows"],
)
def test_attention_over_a_prime_kv_masks_the_exp_in_the_interpreter(
    dims: tuple[int, int, int, int], offset: float
) -> None:
    """kv = 1031 (prime): the fused attention walks kv with a masked loop, and its exp maps
    the padded scores past 1031 to zero (-inf in the softmax's max). With positive Q and K
    shifted so that every score lies far below 0, a max over the padding's zeros would
    underflow every exp (0 / 0); the printed kernel matches float64 numpy instead. With 47
    query rows the rows are masked edge tiles too: the printer folds the heads into the rows
    and compares each row with its own head's end."""
    r = yr.search(scaled_attention(*dims), device_spec=H100, top_k=12, cache=False)
    chosen = [c for c in r.candidates if _loop_masked(c)]
    assert chosen, [c.label for c in r.candidates]
    rng = np.random.default_rng(5)
    h, m, d, kv = dims
    q = rng.standard_normal((h, m, d))
    kt = rng.standard_normal((h, d, kv))
    if offset:  # every product of a negative Q row and a positive K column is ≪ 0
        q, kt = -(np.abs(q) + offset / 8), np.abs(kt) + 1.0
    v = rng.standard_normal((h, kv, d))
    want = _softmax_ref(q, kt, v)
    if offset:
        s = q @ kt / np.sqrt(d)
        assert np.all(np.exp(s.astype(np.float32)) == 0.0)  # every exp underflows unshifted
    be = _backend()
    for cand in chosen[:2]:
        plan = parse_plan(cand.kernel_plan())
        exps = [o for k in plan.generated for o in k.ops if o.attrs.get("unop") == "exp"]
        assert any(o.masked and o.masked[0].extent == kv for o in exps), cand.label
        tiles = [_walk_tile(cand, m) for _, m in _loop_masked(cand)]
        assert tiles and all(t >= 16 and t & (t - 1) == 0 for t in tiles), (cand.label, tiles)
        src = be.codegen(cand.kernel_plan())
        kernel = be.load(be.compile(src))
        tensors = be.from_numpy([a.astype(np.float32) for a in (q, kt, v)], ["float32"] * 3)
        (out,) = kernel(*tensors)
        got = out.double().numpy()
        assert np.isfinite(got).all(), cand.label
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        # fp32 scores near -150 are rounded by ~1e-5 before their exp
        assert err <= (1e-4 if offset else 1e-5), (cand.label, err)


def test_misaligned_input_rows_are_staged_into_padded_copies() -> None:
    """``align_rows``: Kᵀ [4, 32, 1031] float32 has rows of 4124 bytes, no multiple of 16, and
    the fused attention's query blocks each reread it, so the launcher copies it into rows of
    1032 elements and the kernel addresses those; Q and V (rows of 32) stay as they are. The
    output still matches float64 numpy. A library matmul reads Kᵀ in another candidate: not
    staged there."""
    from yirage_triton._align import misaligned_inputs

    dims = (4, 64, 32, 1031)
    r = yr.search(scaled_attention(*dims), device_spec=H100, top_k=12, cache=False)
    staged = {c.label: misaligned_inputs(parse_plan(c.kernel_plan())) for c in r.candidates}
    assert any(not v for k, v in staged.items() if k.startswith("matmul ;")), staged
    cand = next(c for c in r.candidates if staged[c.label] and _loop_masked(c))
    plan = parse_plan(cand.kernel_plan())
    kt = plan.inputs[1]
    assert staged[cand.label] == {kt.id: 1032}
    be = interp_backend("alignedtest", align_rows=True)
    src = be.codegen(cand.kernel_plan())
    assert f"buf{kt.id}_al.copy_(buf{kt.id})" in src.code
    assert "* 1032" in src.code, src.code
    rng = np.random.default_rng(3)
    h, m, d, kv = dims
    q, k, v = (rng.standard_normal(s) for s in ((h, m, d), (h, d, kv), (h, kv, d)))
    kernel = be.load(be.compile(src))
    (out,) = kernel(*be.from_numpy([a.astype(np.float32) for a in (q, k, v)], ["float32"] * 3))
    want = _softmax_ref(q, k, v)
    got = out.double().numpy()
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) <= 1e-5


def test_finer_chunks_of_a_masked_loop_stop_at_the_extent() -> None:
    """The finer printing (yirage_triton._subtile) of a loop whose last chunk is masked: the
    printer masks the last iteration only, so the cut loop must end at the first small chunk
    that reaches the extent (cutting the iterations alone let the chunks before the last one
    read past it, into the next row: NaN on an H200 at 93 x 7801)."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions, loop_subtile, subtile_kernel

    b, h = 5, 7801
    g = yr.new_kernel_graph()
    res, a = g.new_input((b, h), yr.float32), g.new_input((b, h), yr.float32)
    alpha = g.new_input((h,), yr.float32)
    g.mark_output(g.add(res, g.mul(g.rms_norm(a, (h,), eps=EPS), alpha)))
    result = yr.search(g, device_spec=H100, top_k=5, cache=False)
    cuts = []
    for cand in result.candidates:
        for k, _, acc in _masked(cand):
            f = loop_subtile(k)
            walked = [m for m in acc.masked if m.extent == h]
            if f > 1 and walked and acc.uses_iter():
                cuts.append((cand, k, f))
    assert cuts, [c.label for c in result.candidates]
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((b, h)), rng.standard_normal((b, h)), rng.standard_normal(h)]
    x = arrays[1]
    want = arrays[0] + x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS) * arrays[2]
    for cand, k, f in cuts[:2]:
        cut = subtile_kernel(k, f)
        assert cut is not None
        small = _walk_tile(cand, next(m for _, _, acc in _masked(cand) for m in acc.masked)) // f
        assert cut.forloop_range == -(-h // small) < k.forloop_range * f, cand.label
        opts = TritonOptions(subtile=((k.name, f),))
        be = CudaBackend(interpret=True, triton_options=opts)
        kernel = be.load(be.compile(be.codegen(cand.kernel_plan())))
        ins = [a.astype(np.float32).reshape(-1, h) for a in arrays]  # alpha as the plan's row
        (out,) = kernel(*be.from_numpy(ins, ["float32"] * 3))
        err = float(np.linalg.norm(out.double().numpy() - want) / np.linalg.norm(want))
        assert err <= 1e-5, (cand.label, err)
