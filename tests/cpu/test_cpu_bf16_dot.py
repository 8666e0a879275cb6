"""The bfloat16 dot path of the CPU matmul (AVX512-BF16 ``vdpbf16ps``).

A matmul whose B is a bfloat16 tile read in place (a weight) and whose A is bfloat16 in the
graph multiplies pairs along K with ``vdpbf16ps``: A's pairs packed once where A is computed
(rounded to bfloat16 there unless exact already), B's rows k and k+1 interleaved per column.
The tests run the compiled path on this host at odd sizes (odd K and K tiles, N tiles with a
masked tail of fewer than 32 columns, 1 to 17 rows, batched library matmuls) against float64
numpy; check where the path is and is not printed (an A the graph keeps in float32, a pinned
target without ``avx512_bf16``, a float32 view others read); the assembly; that the
prefetches of the interleaved rows stay inside B; and the subnormal semantics the path has:
bfloat16 subnormal inputs count as zero (the reference flushes them), and nothing is NaN or
infinite where the float64 graph is finite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err, run_plan
from cpu_plan_tools import (
    PlanBuilder,
    count_prefetches_in,
    off,
    prefetch_counts,
    recording_launcher,
    x86_assembly,
)

from yirage._check import TOLERANCES
from yirage_cpu import _codegen, _runtime, _toolchain
from yirage_cpu._backend import CpuBackend

torch = pytest.importorskip("torch")

#: The tolerance of the numeric check for bfloat16 graphs.
BF16_TOL = TOLERANCES["bfloat16"]
#: bfloat16 products are exact in float32: only the float32 sums round (float32 outputs).
EXACT_TOL = 1e-5
#: K 217 in tiles of 31: odd K, odd K tiles (a last row paired with zero).
K, KT = 217, 31
#: The instruction of the path, as printed (C) and compiled (assembly).
DOT_C, DOT_ASM = "_mm512_dpbf16_ps", "vdpbf16ps"
#: The features of a pinned AVX-512 target without AVX512-BF16 (x86-64-v4 and F16C).
NO_BF16 = ("f16c", "fma", "avx2", "avx512f")


@pytest.fixture(scope="module")
def host_bf16() -> None:
    """Skip where this host's compile target lacks AVX512-BF16 (the path cannot run)."""
    feats = CpuBackend().isa_features()
    if "avx512_bf16" not in feats:
        pytest.skip(f"the host's compile target has no avx512_bf16 (features: {feats})")


def _bf16(rng: np.random.Generator, dims: tuple[int, ...], std: float = 1.0) -> Any:
    x = (rng.standard_normal(dims) * std).astype(np.float32)
    return torch.from_numpy(x).to(torch.bfloat16)


def _f64(t: Any) -> np.ndarray:
    return np.asarray(t.double().numpy())


def _linear(m: int, nt: int, a_dtype: str = "bfloat16", out: str = "bfloat16") -> dict[str, Any]:
    """x [m, K] @ W [K, 2·nt] (bfloat16, read in place): two N tiles, the for-loop over K
    tiles of KT, the product added into its accumulator."""
    n = 2 * nt
    p = PlanBuilder()
    x, w = p.input([m, K], a_dtype), p.input([K, n], "bfloat16")
    k = p.kernel("linear", grid=(2, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [m, KT], [[], off(("iter", KT))])
    tw = k.input(w, [KT, nt], [off(("iter", KT)), off(("bx", nt))])
    k.output(p.output([m, n], out), k.accum(k.matmul(tx, tw)), [[], off(("bx", nt))])
    return p.build()


def _dot_kernels(code: str) -> int:
    """How many matmuls of the printed program take the dot path."""
    return code.count("const uint32_t *restrict yr_pa =")


# -- numbers on this host ----------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3, 8, 17])
@pytest.mark.parametrize("nt", [13, 45, 77], ids=["tail-only", "unit+tail", "2-units+tail"])
def test_dot_path_matches_float64_at_odd_sizes(
    build: Any, host_bf16: None, m: int, nt: int
) -> None:
    """bfloat16 A and B: exact products, float32 sums; a float32 output shows the sums
    alone (no pair dropped or misplaced), a bfloat16 output passes the check's tolerance."""
    rng = np.random.default_rng(m * 100 + nt)
    x, w = _bf16(rng, (m, K)), _bf16(rng, (K, 2 * nt), K**-0.5)
    want = _f64(x) @ _f64(w)
    for out, tol in (("float32", EXACT_TOL), ("bfloat16", BF16_TOL)):
        launcher = build(_linear(m, nt, out=out))
        assert _dot_kernels(launcher.program.code) == 1
        assert launcher.matmul_half_path.startswith("bfloat16 avx512_bf16")
        (y,) = launcher(x, w)
        assert rel_err(_f64(y), want) < tol, out


def test_a_masked_edge_tile_of_a(build: Any, host_bf16: None) -> None:
    """Rows split over the grid with a masked edge (13 rows in tiles of 8): the last block's
    tile is shifted back to rows 5-12 and packed like any other (one dot path); its first
    three rows belong to the first block and are not stored again."""
    m, mt, n = 13, 8, 50
    p = PlanBuilder()
    x, w = p.input([m, K], "bfloat16"), p.input([K, n], "bfloat16")
    k = p.kernel("rows", grid=(2, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [mt, KT], [off(("bx", mt)), off(("iter", KT))])
    tw = k.input(w, [KT, n], [off(("iter", KT)), []])
    k.output(p.output([m, n], "float32"), k.accum(k.matmul(tx, tw)), [off(("bx", mt)), []])
    plan = p.build()
    kernel = plan["kernels"][0]
    for access in (kernel["inputs"][0], kernel["outputs"][0]):
        access["masked"] = [{"dim": 0, "extent": m}]
    launcher = build(plan)
    assert _dot_kernels(launcher.program.code) == 1
    rng = np.random.default_rng(19)
    xs, ws = _bf16(rng, (m, K)), _bf16(rng, (K, n), K**-0.5)
    (y,) = launcher(xs, ws)
    assert rel_err(_f64(y), _f64(xs) @ _f64(ws)) < EXACT_TOL


def test_a_whole_odd_k_tile_and_its_remainder_pairs(build: Any, host_bf16: None) -> None:
    """One row (the pairs split over 4 accumulator sets), K 217 in one tile loaded once:
    54 pairs in sets of 4 (two left over), then the last row paired with zero."""
    p = PlanBuilder()
    x, w = p.input([1, K], "bfloat16"), p.input([K, 70], "bfloat16")
    k = p.kernel("gemv", grid=(1, 1, 1), forloop_range=1)
    y = k.matmul(k.input(x, [1, K], [[], []]), k.input(w, [K, 70], [[], []]), phase="epilogue")
    k.output(p.output([1, 70]), y, [[], []])
    launcher = build(p.build())
    code = launcher.program.code
    assert _dot_kernels(code) == 1 and "p += 4" in code
    rng = np.random.default_rng(7)
    xs, ws = _bf16(rng, (1, K)), _bf16(rng, (K, 70), K**-0.5)
    (out,) = launcher(xs, ws)
    assert rel_err(_f64(out), _f64(xs) @ _f64(ws)) < EXACT_TOL


def test_batched_library_matmul_takes_the_dot_path(build: Any, host_bf16: None) -> None:
    """A printed library matmul (GQA's P·V shape): odd K 97 and N 50 (one unit and a
    masked tail), one block per batch entry."""
    p = PlanBuilder()
    a, b = p.input([3, 5, 97], "bfloat16"), p.input([3, 97, 50], "bfloat16")
    p.library("matmul", [a, b], [p.output([3, 5, 50], "bfloat16")])
    launcher = build(p.build())
    assert _dot_kernels(launcher.program.code) == 1
    rng = np.random.default_rng(5)
    xa, xb = _bf16(rng, (3, 5, 97)), _bf16(rng, (3, 97, 50), 0.1)
    (y,) = launcher(xa, xb)
    assert rel_err(_f64(y), _f64(xa) @ _f64(xb)) < 2.0**-8


def _lora(r: int = 6) -> dict[str, Any]:
    """x @ W + (x @ A) @ B in bfloat16: the rank-r product accumulated in the loop (its A a
    bfloat16 input), its product with B in the epilogue (A the accumulator: computed,
    rounded to bfloat16 once the loop is done)."""
    m, nt = 5, 37
    p = PlanBuilder()
    x, w = p.input([m, K], "bfloat16"), p.input([K, 2 * nt], "bfloat16")
    a, b = p.input([K, r], "bfloat16"), p.input([r, 2 * nt], "bfloat16")
    k = p.kernel("lora", grid=(2, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [m, KT], [[], off(("iter", KT))])
    aw = k.accum(k.matmul(tx, k.input(w, [KT, nt], [off(("iter", KT)), off(("bx", nt))])))
    aa = k.accum(k.matmul(tx, k.input(a, [KT, r], [off(("iter", KT)), []])))
    low = k.matmul(aa, k.input(b, [r, nt], [[], off(("bx", nt))]), phase="epilogue")
    k.output(p.output([m, 2 * nt], "bfloat16"), k.epi_binary("add", aw, low), [[], off(("bx", nt))])
    return p.build()


def test_lora_rounds_its_computed_a_once(build: Any, host_bf16: None) -> None:
    """All three matmuls take the path; the accumulator the epilogue matmul reads only
    there is packed (rounded) without being rounded in place."""
    launcher = build(_lora())
    code = launcher.program.code
    assert _dot_kernels(code) == 3
    assert "yr_bf2f(yr_f2bf(" not in code
    rng = np.random.default_rng(3)
    x, w = _bf16(rng, (5, K)), _bf16(rng, (K, 74), K**-0.5)
    a, b = _bf16(rng, (K, 6), K**-0.5), _bf16(rng, (6, 74), 6**-0.5)
    (y,) = launcher(x, w, a, b)
    x64 = _f64(x)
    want = x64 @ _f64(w) + (x64 @ _f64(a)) @ _f64(b)
    assert rel_err(_f64(y), want) < BF16_TOL


def _attention(d: int = 24, kv: int = 45) -> dict[str, Any]:
    """softmax(q @ kT) @ v for 3 groups of 4 query rows, all bfloat16, in one step: the
    exp is read by its row sum and by the P·V dot, so it is rounded in place."""
    p = PlanBuilder()
    q = p.input([3, 4, d], "bfloat16")
    kt, v = p.input([3, d, kv], "bfloat16"), p.input([3, kv, d], "bfloat16")
    k = p.kernel("attn", grid=(3, 1, 1), forloop_range=1)
    batch = [off(("bx", 1)), [], []]
    tq = k.input(q, [1, 4, d], batch)
    s = k.matmul(tq, k.input(kt, [1, d, kv], batch))
    e = k.unary("exp", s)
    o = k.matmul(e, k.input(v, [1, kv, d], batch))
    y = k.epi_binary("div", o, k.reduction(e, 2))
    k.output(p.output([3, 4, d], "bfloat16"), y, batch)
    return p.build()


def test_an_a_with_other_readers_is_rounded_in_place(build: Any, host_bf16: None) -> None:
    plan = _attention()
    launcher = build(plan)
    code = launcher.program.code
    assert _dot_kernels(code) == 2
    assert code.count("yr_bf2f(yr_f2bf(") == 1  # the exp; q is bfloat16 already
    rng = np.random.default_rng(11)
    q, kt, v = _bf16(rng, (3, 4, 24)), _bf16(rng, (3, 24, 45), 0.2), _bf16(rng, (3, 45, 24))
    (y,) = launcher(q, kt, v)
    (want,) = run_plan(plan, [_f64(t) for t in (q, kt, v)])
    assert rel_err(_f64(y), want) < BF16_TOL


# -- where the path is printed -----------------------------------------------------------------


def test_a_float32_a_keeps_the_float_path() -> None:
    """A float32 activation times a bfloat16 weight (a hand-written plan: the IR rejects
    mixed dtypes, so only plans can mix them): A is float32 in the graph and is not rounded;
    the weight is still widened in place."""
    code = _codegen.generate(_linear(8, 45, a_dtype="float32", out="float32"), simd_width_bits=512)
    assert DOT_C not in code.code and "yr_bf2f_vec(yr_bk" in code.code


def _via_intermediate(other_reader: bool) -> dict[str, Any]:
    """An all-bfloat16 graph whose second kernel multiplies a float32 intermediate (a graph
    tensor the runtime keeps in float32) by a bfloat16 weight; ``other_reader``: the
    intermediate is also added to the product (a view others read: it cannot be rounded in
    place for them, so the matmul keeps the float path)."""
    m, n = 4, 40
    p = PlanBuilder()
    x, w = p.input([m, 64], "bfloat16"), p.input([64, n], "bfloat16")
    mid = p.intermediate([m, 64])
    k1 = p.kernel("square", grid=(1, 1, 1), forloop_range=1)
    k1.output(mid, k1.epi_unary("square", k1.input(x, [m, 64], [[], []])), [[], []])
    k2 = p.kernel("proj", grid=(1, 1, 1), forloop_range=1)
    th = k2.input(mid, [m, 64], [[], []])
    y = k2.matmul(th, k2.input(w, [64, n], [[], []]), phase="epilogue")
    if other_reader:
        y = k2.epi_binary("add", y, k2.reduction(th, 1))
    k2.output(p.output([m, n], "bfloat16"), y, [[], []])
    return p.build()


def test_a_float32_intermediate_is_rounded_only_where_no_one_else_reads_it() -> None:
    alone = _codegen.generate(_via_intermediate(False), simd_width_bits=512).code
    shared = _codegen.generate(_via_intermediate(True), simd_width_bits=512).code
    assert _dot_kernels(alone) == 1
    assert _dot_kernels(shared) == 0


def test_a_pinned_target_without_avx512_bf16_gets_the_widening_path(
    build: Any, host_bf16: None
) -> None:
    """Pinned features without ``avx512_bf16`` (or vectors narrower than 512 bits) print no
    dot path: the compiled program widens B and runs float FMAs, and says so."""
    plan = _linear(8, 45)
    for bits, feats in ((512, NO_BF16), (256, (*NO_BF16, "avx512_bf16"))):
        assert DOT_C not in _codegen.generate(plan, simd_width_bits=bits, isa_features=feats).code
    src = _codegen.generate(plan, simd_width_bits=512, isa_features=NO_BF16)
    lib = _toolchain.compile_shared(src.code, simd_width_bits=512, name="no-bf16")
    launcher = _runtime.CpuLauncher(src, lib)
    assert launcher.matmul_half_path.startswith("bfloat16 avx2")
    rng = np.random.default_rng(2)
    x, w = _bf16(rng, (8, K)), _bf16(rng, (K, 90), K**-0.5)
    (y,) = launcher(x, w)
    assert rel_err(_f64(y), _f64(x) @ _f64(w)) < BF16_TOL


def test_the_source_records_whether_a_matmul_took_the_dot_path() -> None:
    """``CpuSource.bf16_dot`` is what the backend's ``bf16_widen`` variant keys on: set where
    a matmul prints the path, clear where ``bf16_dot=False`` leaves it out, where A is
    float32 in the graph and where the pinned target lacks the feature."""
    feats = (*NO_BF16, "avx512_bf16")
    dot = _codegen.generate(_linear(8, 45), simd_width_bits=512, isa_features=feats)
    assert dot.bf16_dot and DOT_C in dot.code
    widened = _codegen.generate(
        _linear(8, 45), simd_width_bits=512, isa_features=feats, bf16_dot=False
    )
    assert not widened.bf16_dot and DOT_C not in widened.code
    f32_a = _linear(8, 45, a_dtype="float32", out="float32")
    assert not _codegen.generate(f32_a, simd_width_bits=512, isa_features=feats).bf16_dot
    assert not _codegen.generate(_linear(8, 45), simd_width_bits=512, isa_features=NO_BF16).bf16_dot


def test_the_backend_races_the_widening_path_beside_the_dot_path(host_bf16: None) -> None:
    """Which path is faster depends on the core, so a plan that takes the dot path is
    offered printed without it too (``bf16_widen``); both match float64."""
    backend = CpuBackend()
    variants = backend.variants(backend.load(backend.compile(backend.codegen(_lora()))))
    assert set(variants) == {"default", "bf16_widen"}
    assert variants["default"].matmul_half_path.startswith("bfloat16 avx512_bf16")
    assert _dot_kernels(variants["default"].program.code) == 3
    assert _dot_kernels(variants["bf16_widen"].program.code) == 0
    rng = np.random.default_rng(11)
    x, w = _bf16(rng, (5, K)), _bf16(rng, (K, 74), K**-0.5)
    a, b = _bf16(rng, (K, 6), K**-0.5), _bf16(rng, (6, 74))
    want = _f64(x) @ _f64(w) + (_f64(x) @ _f64(a)) @ _f64(b)
    for launcher in variants.values():
        (y,) = launcher(x, w, a, b)
        assert rel_err(_f64(y), want) < BF16_TOL


def test_the_widening_variant_is_printed_only_when_looked_up(
    host_bf16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm call takes one variant by name: listing the variants and taking the default
    prints nothing more; looking up ``bf16_widen`` prints it once."""
    backend = CpuBackend()
    launcher = backend.load(backend.compile(backend.codegen(_lora())))
    printed: list[bool] = []
    codegen = CpuBackend.codegen

    def counting(self: CpuBackend, plan: Any, **kw: Any) -> Any:
        printed.append(kw.get("bf16_dot", True))
        return codegen(self, plan, **kw)

    monkeypatch.setattr(CpuBackend, "codegen", counting)
    variants = backend.variants(launcher)
    assert "bf16_widen" in variants and variants["default"] is launcher and printed == []
    assert variants["bf16_widen"] is variants["bf16_widen"] and printed == [False]


def test_a_plan_without_the_dot_path_has_no_widening_variant() -> None:
    """A float32 A keeps the float path on every host: nothing to race it against."""
    backend = CpuBackend()
    plan = _linear(4, 13, a_dtype="float32", out="float32")
    launcher = backend.load(backend.compile(backend.codegen(plan)))
    assert not launcher.program.bf16_dot
    assert set(backend.variants(launcher)) == {"default"}


def test_superoptimize_checks_and_times_both_bfloat16_paths(host_bf16: None) -> None:
    """The fused candidate's row lists the widening variant beside the dot path's."""
    import yirage as yr
    from yirage import _workloads

    g = _workloads.get_workload("rmsnorm_linear")._build(
        {"b": 4, "h": 128, "n": 96, "dtype": yr.bfloat16}, yr.bfloat16
    )
    k = yr.superoptimize(g, backend="cpu", cache=False)
    rows = [c for c in k.report.candidates if "bf16_widen" in (*c.variant_us, *c.dropped_variants)]
    assert rows, [(c.description, c.variant_us) for c in k.report.candidates]
    assert all("default" in c.variant_us for c in rows)


def test_the_backend_prints_the_path_for_its_compile_target(host_bf16: None) -> None:
    backend = CpuBackend()
    assert "avx512_bf16" in backend.isa_features()
    assert DOT_C in backend.codegen(_linear(8, 45)).code
    assert backend.toolchain()["matmul_half_path"].startswith("bfloat16 avx512_bf16")


@pytest.mark.parametrize(
    ("feats", "flags", "dot"),
    [
        (None, ("-march=x86-64-v4", "-mavx512bf16"), True),
        (None, ("-march=x86-64-v4",), False),  # the preprocessor: no __AVX512BF16__
        (NO_BF16, ("-march=x86-64-v4", "-mavx512bf16"), False),  # the pinned features
        (None, ("-march=x86-64-v4", "-mavx512bf16", "-DYR_SOFT_HALF"), False),
    ],
)
def test_assembly_has_vdpbf16ps_exactly_where_the_target_has_it(
    tmp_path: Path, feats: tuple[str, ...] | None, flags: tuple[str, ...], dot: bool
) -> None:
    """Compiled, not run: any x86-64 compiler that targets these levels shows it."""
    code = _codegen.generate(_linear(8, 45), simd_width_bits=512, isa_features=feats).code
    asm = x86_assembly(tmp_path, code, (*flags, "-mprefer-vector-width=512"))
    assert (DOT_ASM in asm) is dot
    if dot:
        assert "vpunpcklwd" in asm and ("vpermt2ps" in asm or "vpermi2ps" in asm)


# -- the prefetches of the interleaved rows ----------------------------------------------------


@pytest.mark.parametrize("nt", [45, 333])
def test_every_prefetch_of_the_dot_path_lies_inside_b(host_bf16: None, nt: int) -> None:
    """Rows k and k+1 are prefetched side by side, wrapping into the next K tile near a
    row's end (nt 333: longer than the distance) and none past the last one."""
    src = _codegen.generate(_linear(8, nt), simd_width_bits=512)
    assert _dot_kernels(src.code) == 1
    launcher = recording_launcher(src, 512, "pf-dot")
    rng = np.random.default_rng(nt)
    x, w = _bf16(rng, (8, K)), _bf16(rng, (K, 2 * nt), K**-0.5)
    count_prefetches_in(launcher, w)
    (y,) = launcher(x, w)
    inside, outside = prefetch_counts(launcher)
    assert outside == 0
    assert inside >= 2 * K  # every row, both blocks
    assert rel_err(_f64(y), _f64(x) @ _f64(w)) < BF16_TOL


# -- subnormals and extremes -------------------------------------------------------------------

#: bfloat16 subnormals: 2^-133 (the smallest) to 2^-127.
_SUBNORMALS = np.array([2.0**-133, 2.0**-130, 2.0**-127], dtype=np.float32)


def _flushed(t: Any) -> np.ndarray:
    """float64 values of a bfloat16 tensor with its subnormals read as zero."""
    x = _f64(t)
    return np.where(np.abs(x) < 2.0**-126, 0.0, x)


def test_subnormal_inputs_count_as_zero(build: Any, host_bf16: None) -> None:
    """Row 0 of A is all subnormal, the weights 2^100 times larger: the float64 product is
    about 2^-30 there, the dot path gives exactly zero (subnormal inputs read as zero);
    elsewhere subnormals sit among ordinary values. Every row agrees with the reference
    that flushes bfloat16 subnormals, and nothing is NaN or infinite."""
    m, nt = 8, 45
    rng = np.random.default_rng(13)
    x = rng.standard_normal((m, K)).astype(np.float32)
    sign = np.where(rng.random((m, K)) < 0.5, -1.0, 1.0).astype(np.float32)
    sub = rng.choice(_SUBNORMALS, size=(m, K)) * sign
    x = np.where(rng.random((m, K)) < 0.25, sub, x)
    x[0] = sub[0]
    w = (rng.standard_normal((K, 2 * nt)) * 2.0**100).astype(np.float32)
    xt, wt = torch.from_numpy(x).to(torch.bfloat16), torch.from_numpy(w).to(torch.bfloat16)
    assert (np.abs(_f64(xt[0])) < 2.0**-126).all() and (_f64(xt[0]) != 0).all()
    (y,) = build(_linear(m, nt, out="float32"))(xt, wt)
    y64 = _f64(y)
    assert np.isfinite(y64).all()
    assert (y64[0] == 0.0).all() and (np.abs(_f64(xt[0]) @ _f64(wt)) > 0).all()
    want = _flushed(xt) @ _flushed(wt)
    assert rel_err(y64[1:], want[1:]) < EXACT_TOL


def test_dtype_extremes_stay_finite_where_float64_is(build: Any, host_bf16: None) -> None:
    """The stress check's dtype extremes (±2^56, ±smallest normal, ±subnormals, ±0) at 1 in
    64 elements of both operands: every output finite where the float64 product is, and
    within the check's tolerance of the reference that flushes subnormals."""
    from yirage._stress import dtype_extremes

    m, nt = 17, 77
    rng = np.random.default_rng(17)
    ext = dtype_extremes("bfloat16")

    def sprinkled(dims: tuple[int, ...], std: float) -> Any:
        a = (rng.standard_normal(dims) * std).astype(np.float32)
        a = np.where(rng.random(dims) < 1 / 64, rng.choice(ext, size=dims), a)
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)

    x, w = sprinkled((m, K), 1.0), sprinkled((K, 2 * nt), K**-0.5)
    (y,) = build(_linear(m, nt, out="float32"))(x, w)
    want = _f64(x) @ _f64(w)
    y64 = _f64(y)
    assert np.isfinite(want).all() and np.isfinite(y64).all()
    assert rel_err(y64, _flushed(x) @ _flushed(w)) < BF16_TOL
