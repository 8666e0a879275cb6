"""The CPU printer: every tile op, accumulator, phase and dtype against float64 numpy.

Plans are hand-written (docs/kernel-plan.md); ``_plan_ref.run_plan`` interprets them in
float64 with exact math, so the running-max rewrite of safe-softmax groups is checked too.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err, run_plan
from cpu_plan_tools import PLANS, PlanBuilder, off

from yirage.plan import LibraryKernel, PlanError, parse_plan
from yirage_cpu import _codegen, _toolchain

F32_TOL = 1e-5


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _check(
    launcher: Any, plan: dict[str, Any], inputs: list[np.ndarray], tol: float = F32_TOL
) -> list[Any]:
    outs = launcher(*inputs)
    refs = run_plan(plan, [np.asarray(x, dtype=np.float64) for x in inputs])
    assert len(outs) == len(refs)
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        o64 = np.asarray(o, dtype=np.float64)
        assert o64.shape == r.shape, (i, o64.shape, r.shape)
        assert np.isfinite(o64).all(), f"output {i} has non-finite values"
        err = rel_err(o64, r)
        assert err < tol, f"output {i}: relative error {err:.3g} >= {tol}"
    return outs


def test_docs_example_compiles_with_werror_and_matches_numpy(build: Any) -> None:
    plan = json.loads((PLANS / "rmsnorm_matmul.json").read_text())
    launcher = build(plan)
    assert {"-Wall", "-Wextra", "-Werror"} <= set(launcher.library.flags)
    rng = _rng(1)
    x = rng.standard_normal((8, 512), dtype=np.float32)
    w = rng.standard_normal((512, 768), dtype=np.float32)
    (y,) = launcher(x, w)
    assert y.dtype == np.float32 and y.shape == (8, 768)
    x64 = x.astype(np.float64)
    expected = (x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)) @ w.astype(np.float64)
    assert rel_err(y, expected) < 1e-5
    assert "#pragma omp parallel" in launcher.program.code
    assert "#pragma omp simd" in launcher.program.code


UNARY = [
    ("exp", []),
    ("square", []),
    ("sqrt", []),
    ("rsqrt", []),
    ("silu", []),
    ("gelu", []),
    ("relu", []),
    ("sigmoid", []),
    ("tanh", []),
    ("neg", []),
    ("mul_scalar", [0.37]),
    ("add_scalar", [-0.625]),
    ("clamp", [-0.5, 0.75]),
]


def test_every_unary_op_in_loop_and_epilogue(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([16, 64])
    k = p.kernel("unary", grid=(2, 1, 1), forloop_range=4)
    t = k.input(x, [8, 16], [off(("bx", 8)), off(("iter", 16))])
    for name, params in UNARY:
        u = k.unary(name, t, params)
        a = k.accum(u)
        e = k.epi_unary(name, a, params)
        for src in (a, e):
            ob = p.output([16, 16])
            k.output(ob, src, [off(("bx", 8)), []])
    plan = p.build()
    launcher = build(plan)
    xin = (np.abs(_rng(2).standard_normal((16, 64))) + 0.25).astype(np.float32)
    xin[:, ::3] *= -1.0  # negative values for everything but the sqrt family
    outs = launcher(xin)
    refs = run_plan(plan, [xin.astype(np.float64)])
    for i, (name, _) in enumerate(UNARY):
        for j in range(2):
            o, r = np.asarray(outs[2 * i + j], dtype=np.float64), refs[2 * i + j]
            finite = np.isfinite(r)
            if name in ("sqrt", "rsqrt"):
                assert np.array_equal(np.isnan(o), np.isnan(r)), name
            assert rel_err(o[finite], r[finite]) < 1e-5, (name, j)


def test_binary_ops_with_broadcasting(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([16, 64])
    col = p.input([16, 4])
    row = p.input([1, 64])
    k = p.kernel("binary", grid=(2, 1, 1), forloop_range=4)
    tx = k.input(x, [8, 16], [off(("bx", 8)), off(("iter", 16))])
    tc = k.input(col, [8, 1], [off(("bx", 8)), off(("iter", 1))])
    tr = k.input(row, [1, 16], [[], off(("iter", 16))])
    for name in ("add", "sub", "mul", "div", "pow"):
        for a, b in ((tx, tc), (tc, tx), (tx, tr), (tr, tx), (tx, tx), (tc, tr)):
            y = k.binary(name, a, b)
            acc = k.accum(y)
            k.output(p.output([16, 16]), acc, [off(("bx", 8)), []])
    plan = p.build()
    launcher = build(plan)
    rng = _rng(3)
    ins = [
        (np.abs(rng.standard_normal(s)) + 0.5).astype(np.float32)
        for s in ((16, 64), (16, 4), (1, 64))
    ]
    _check(launcher, plan, ins)


def test_reductions_rms_norm_concat_and_batched_matmul(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([16, 64])
    a3 = p.input([4, 8, 32])
    b3 = p.input([4, 32, 16])
    k = p.kernel("shapes", grid=(2, 1, 1), forloop_range=2)
    t = k.input(x, [8, 32], [off(("bx", 8)), off(("iter", 32))])
    ta = k.input(a3, [2, 8, 16], [off(("bx", 2)), [], off(("iter", 16))])
    tb = k.input(b3, [2, 16, 16], [off(("bx", 2)), off(("iter", 16)), []])
    srcs = [
        k.reduction(t, 1),
        k.reduction(t, 0),
        k.reduction_to_dimx(t, 1, 4),
        k.reduction_to_dimx(t, 0, 2),
        k.rms_norm(t, 1e-5),
        k.concat([t, t], 0),
        k.concat([t, k.unary("neg", t)], 1),
        k.unary("relu", k.matmul(ta, tb)),  # not fused: the matmul feeds a unary
        fused := k.matmul(ta, tb),  # fused into its accumulator
        k.reduction(ta, 1),
    ]
    for s in srcs:
        acc = k.accum(s)
        dims = list(k.dims[acc])
        full = [dims[0] * 2, *dims[1:]]
        k.output(p.output(full), acc, [off(("bx", dims[0])), *([[]] * (len(dims) - 1))])
    plan = p.build()
    launcher = build(plan)
    assert f"op {fused}: matmul" in launcher.program.code
    assert f"op {fused + 1}: accum" not in launcher.program.code  # added by the matmul
    rng = _rng(4)
    ins = [rng.standard_normal(s, dtype=np.float32) for s in ((16, 64), (4, 8, 32), (4, 32, 16))]
    _check(launcher, plan, ins)


MATMUL_SHAPES = [
    (1, 16, 8),
    (3, 17, 5),
    (8, 48, 32),
    (13, 64, 3),
    (5, 7, 9),
    (9, 128, 4),
    (6, 200, 2),
]


@pytest.mark.parametrize("simd", [128, 256, 512])
def test_matmul_micro_kernel_paths(simd: int) -> None:
    """Row-block remainders, column tails, batched tiles, fused and unfused, at each SIMD
    width (narrower code runs on wider hardware)."""
    p = PlanBuilder()
    ins = []
    for m, n, kk in MATMUL_SHAPES:
        a = p.input([2, m, 2 * kk])
        b = p.input([2, 2 * kk, n])
        ins += [(2, m, 2 * kk), (2, 2 * kk, n)]
        k = p.kernel(f"mm_{m}_{n}_{kk}", grid=(2, 1, 1), forloop_range=2)
        ta = k.input(a, [1, m, kk], [off(("bx", 1)), [], off(("iter", kk))])
        tb = k.input(b, [1, kk, n], [off(("bx", 1)), off(("iter", kk)), []])
        fused = k.accum(k.matmul(ta, tb))
        plain = k.accum(k.unary("neg", k.matmul(ta, tb)))
        for src in (fused, plain):
            k.output(p.output([2, m, n]), src, [off(("bx", 1)), [], []])
    plan = p.build()
    src = _codegen.generate(plan, simd_width_bits=simd)
    lib = _toolchain.compile_shared(src.code, simd_width_bits=simd)
    from yirage_cpu._runtime import CpuLauncher

    rng = _rng(20)
    _check(CpuLauncher(src, lib), plan, [rng.standard_normal(s, dtype=np.float32) for s in ins])


def test_every_accumulator_kind(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([8, 256])
    k = p.kernel("accums", grid=(1, 1, 1), forloop_range=8)
    t = k.input(x, [8, 32], [[], off(("iter", 32))])
    for acc, kw in (
        ("iter", {}),
        ("sum", {}),
        ("rms", {"eps": 1e-6, "extent": 256}),
        ("sum_todimx", {"dimx": 8}),
    ):
        a = k.accum(t, acc, **kw)
        k.output(p.output(k.dims[a]), a, [[], []])
    # accumulators of a 3-d tile: rows are all dims but the last
    plan = p.build()
    launcher = build(plan)
    xin = _rng(5).standard_normal((8, 256), dtype=np.float32)
    outs = _check(launcher, plan, [xin])
    x64 = xin.astype(np.float64)
    np.testing.assert_allclose(outs[1][:, 0], x64.sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(outs[2][:, 0], np.sqrt((x64**2).mean(1) + 1e-6), rtol=1e-5)
    # contiguous groups (the core's semantics): out[r, j] = sum of x[r, iter*32 + j*4 : +4]
    np.testing.assert_allclose(outs[3], x64.reshape(8, 8, 4, 8).sum((1, 2)), rtol=1e-4, atol=1e-4)


def test_accumulators_of_3d_tiles(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([2, 4, 64])
    k = p.kernel("acc3d", grid=(2, 1, 1), forloop_range=4)
    t = k.input(x, [1, 4, 16], [off(("bx", 1)), [], off(("iter", 16))])
    for acc, kw in (("sum", {}), ("rms", {"eps": 1e-6}), ("sum_todimx", {"dimx": 4})):
        a = k.accum(t, acc, **kw)
        d = k.dims[a]
        k.output(p.output([2, *d[1:]]), a, [off(("bx", 1)), [], []])
    plan = p.build()
    _check(build(plan), plan, [_rng(6).standard_normal((2, 4, 64), dtype=np.float32)])


def test_pre_phase_is_hoisted(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([8, 128])
    w = p.input([16, 24])
    bias = p.input([1, 24])
    k = p.kernel("pre", grid=(1, 1, 1), forloop_range=8)
    tw = k.input(w, [16, 24], [[], []], phase="pre")
    tws = k.unary("mul_scalar", tw, [0.5], phase="pre")
    tb = k.input(bias, [1, 24], [[], []])  # "loop" in the plan, but loop-invariant: hoisted
    tx = k.input(x, [8, 16], [[], off(("iter", 16))])
    mm = k.matmul(tx, tws)
    y = k.binary("add", mm, tb)
    acc = k.accum(y)
    k.output(p.output([8, 24]), acc, [[], []])
    plan = p.build()
    launcher = build(plan)
    code = launcher.program.code
    loop_start = code.index("for (int iter = 0;")
    assert code.index("op 1: unary") < loop_start  # the pre op runs before the loop
    assert code.index("const float *restrict v2") < loop_start  # loop-invariant load hoisted
    rng = _rng(7)
    _check(
        launcher,
        plan,
        [rng.standard_normal(s, dtype=np.float32) for s in ((8, 128), (16, 24), (1, 24))],
    )


def _attention_plan(scale: float) -> dict[str, Any]:
    heads, rows, d, kv, chunk = 4, 4, 32, 256, 64
    p = PlanBuilder()
    q = p.input([heads, rows, d])
    kt = p.input([heads, d, kv])
    v = p.input([heads, kv, d])
    k = p.kernel("attn", grid=(heads, 1, 1), forloop_range=kv // chunk)
    tq = k.input(q, [1, rows, d], [off(("bx", 1)), [], []])
    tk = k.input(kt, [1, d, chunk], [off(("bx", 1)), [], off(("iter", chunk))])
    tv = k.input(v, [1, chunk, d], [off(("bx", 1)), off(("iter", chunk)), []])
    s = k.unary("mul_scalar", k.matmul(tq, tk), [scale])
    e = k.unary("exp", s)
    den = k.accum(e, "sum")
    num = k.accum(k.matmul(e, tv))
    k.output(p.output([heads, rows, d]), k.epi_binary("div", num, den), [off(("bx", 1)), [], []])
    k.safe_softmax(e, [den, num])
    return p.build()


@pytest.mark.parametrize("scale", [0.18, 6.0])
def test_safe_softmax_group_is_exact_and_does_not_overflow(build: Any, scale: float) -> None:
    plan = _attention_plan(scale)
    launcher = build(plan)
    rng = _rng(8)
    ins = [
        rng.standard_normal(s, dtype=np.float32) for s in ((4, 4, 32), (4, 32, 256), (4, 256, 32))
    ]
    logits = np.einsum("hrd,hdk->hrk", ins[0].astype(np.float64), ins[1].astype(np.float64)) * scale
    if scale > 1:
        assert logits.max() > 100  # exp would overflow float32 without the running max
    (out,) = launcher(*ins)
    assert np.isfinite(out).all()
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = np.einsum("hrk,hkd->hrd", p, ins[2].astype(np.float64))
    assert rel_err(out, expected) < 1e-5


def test_safe_softmax_rescales_by_the_shift_degree(build: Any) -> None:
    """acc(E·E) carries exp(-m)² and is rescaled by the square of the running factor."""
    p = PlanBuilder()
    x = p.input([4, 512])
    k = p.kernel("deg2", grid=(2, 1, 1), forloop_range=8)
    t = k.input(x, [2, 64], [off(("bx", 2)), off(("iter", 64))])
    e = k.unary("exp", k.unary("mul_scalar", t, [20.0]))
    sq = k.accum(k.binary("mul", e, e), "sum")
    s = k.accum(e, "sum")
    k.output(
        p.output([4, 1]), k.epi_binary("div", sq, k.epi_binary("mul", s, s)), [off(("bx", 2)), []]
    )
    k.safe_softmax(e, [sq, s], degrees={sq: 2, s: 1})
    plan = p.build()
    launcher = build(plan)
    xin = _rng(14).standard_normal((4, 512), dtype=np.float32)
    (out,) = launcher(xin)
    z = 20.0 * xin.astype(np.float64)
    z -= z.max(1, keepdims=True)
    expected = (np.exp(2 * z).sum(1) / np.exp(z).sum(1) ** 2)[:, None]
    assert np.isfinite(out).all()
    assert rel_err(out, expected) < 1e-5


def test_float16_and_bfloat16_buffers(build: Any) -> None:
    torch = pytest.importorskip("torch")
    for dtype, tol in (("float16", 2e-3), ("bfloat16", 1e-2)):
        p = PlanBuilder()
        x = p.input([8, 256], dtype)
        w = p.input([256, 64], dtype)
        k = p.kernel("lowp", grid=(4, 1, 1), forloop_range=4)
        tx = k.input(x, [8, 64], [[], off(("iter", 64))])
        tw = k.input(w, [64, 16], [off(("iter", 64)), off(("bx", 16))])
        acc = k.accum(k.matmul(tx, tw))
        k.output(p.output([8, 64], dtype), acc, [[], off(("bx", 16))])
        k.output(p.output([8, 64], "float32"), acc, [[], off(("bx", 16))])
        plan = p.build()
        launcher = build(plan)
        rng = _rng(10)
        tdt = getattr(torch, dtype)
        ins_t = [
            torch.from_numpy(rng.standard_normal(s, dtype=np.float32)).to(tdt)
            for s in ((8, 256), (256, 64))
        ]
        outs = launcher(*ins_t)
        assert outs[0].dtype == tdt and outs[1].dtype == torch.float32
        refs = run_plan(plan, [t.to(torch.float64).numpy() for t in ins_t])
        assert rel_err(outs[1].numpy(), refs[1]) < 1e-5  # fp32 accumulation of exact inputs
        assert rel_err(outs[0].to(torch.float64).numpy(), refs[0]) < tol
        if dtype == "float16":  # numpy holds float16 too
            ins_n = [t.numpy() for t in ins_t]
            outs_n = launcher(*ins_n)
            assert outs_n[0].dtype == np.float16
            np.testing.assert_array_equal(outs_n[0], outs[0].numpy())


def test_software_half_conversion_matches_numpy(build: Any) -> None:
    """The fallback for compilers without _Float16 (forced with -DYR_SOFT_HALF)."""
    p = PlanBuilder()
    h = p.input([256, 256], "float16")
    f = p.input([256, 256], "float32")
    k = p.kernel("conv", grid=(1, 1, 1), forloop_range=1)
    th = k.input(h, [256, 256], [[], []])
    tf = k.input(f, [256, 256], [[], []])
    k.output(p.output([256, 256], "float32"), k.accum(th), [[], []])
    k.output(p.output([256, 256], "float16"), k.accum(tf), [[], []])
    plan = p.build()
    launcher = build(plan, extra_flags=("-DYR_SOFT_HALF",))
    assert "aligned_alloc" in launcher.program.code  # 512 KiB of tiles: heap scratch path
    all_halves = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)
    rng = _rng(11)
    f32 = (rng.standard_normal((256, 256)) * np.exp2(rng.integers(-30, 20, (256, 256)))).astype(
        np.float32
    )
    # exact ties between two halves, which must round to even
    f32[0, :64] = (np.arange(64, dtype=np.float32) + 1024.5).astype(np.float32)
    f32[1, :4] = [np.inf, -np.inf, 70000.0, 1e-9]
    as_f32, as_f16 = launcher(all_halves, f32)
    expected32 = all_halves.astype(np.float32)
    nan = np.isnan(expected32)
    np.testing.assert_array_equal(np.isnan(as_f32), nan)
    np.testing.assert_array_equal(as_f32[~nan], expected32[~nan])
    with np.errstate(over="ignore"):
        expected16 = f32.astype(np.float16)
    np.testing.assert_array_equal(as_f16.view(np.uint16), expected16.view(np.uint16))


def test_multi_kernel_plan_with_library_kernels(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([8, 64])
    w = p.input([64, 32])
    g = p.input([32])
    t0 = p.intermediate([8, 32])
    k0 = p.kernel("first", grid=(2, 1, 1), forloop_range=2)
    tx = k0.input(x, [8, 32], [[], off(("iter", 32))])
    tw = k0.input(w, [32, 16], [off(("iter", 32)), off(("bx", 16))])
    k0.output(t0, k0.accum(k0.matmul(tx, tw)), [[], off(("bx", 16))])
    for op, ins, params, shape in (
        ("unary", [t0], {"op": "silu", "params": []}, [8, 32]),
        ("binary", [t0, t0], {"op": "mul"}, [8, 32]),
        ("reduction", [t0], {"dim": 1}, [8, 1]),
        ("rms_norm", [t0, g], {"num_normalized_dims": 1, "eps": 1e-6, "has_weight": True}, [8, 32]),
        ("softmax", [t0], {"dim": 1}, [8, 32]),
        ("concat", [t0, t0], {"dim": 0}, [16, 32]),
        ("chunk", [t0], {"chunks": 2, "dim": 1, "index": 1}, [8, 16]),
    ):
        p.library(op, ins, [p.output(shape)], params)
    # a second generated kernel reads the intermediate after the library kernels
    t1 = p.intermediate([8, 32])
    p.library("matmul", [x, w], [t1])
    k1 = p.kernel("second", grid=(1, 1, 1), forloop_range=1)
    a = k1.input(t0, [8, 32], [[], []])
    b = k1.input(t1, [8, 32], [[], []])
    k1.output(p.output([8, 32]), k1.accum(k1.binary("add", a, b)), [[], []])
    plan = p.build()
    launcher = build(plan)
    rng = _rng(12)
    ins = [rng.standard_normal(s, dtype=np.float32) for s in ((8, 64), (64, 32), (32,))]
    outs = _check(launcher, plan, ins, tol=1e-5)
    expected = 2.0 * ins[0].astype(np.float64) @ ins[1].astype(np.float64)
    assert rel_err(outs[-1], expected) < 1e-5  # both routes compute X·W


def test_printed_library_kernels(build: Any) -> None:
    """Elementwise, reduction, rms_norm and softmax library kernels are printed as C (one
    parallel pass, numpy broadcasting, any reduced dim, 16-bit outputs); matmul stays BLAS."""
    p = PlanBuilder()
    x = p.input([4, 128, 1024])
    v = p.input([1024])
    g = p.input([1, 128, 1024])
    sq = p.intermediate([4, 128, 1024])
    ss = p.intermediate([4, 1, 1024])
    p.library("unary", [x], [sq], {"op": "square", "params": []})
    p.library("reduction", [sq], [ss], {"dim": 1})
    for op, ins, params, shape, dtype in (
        ("binary", [x, ss], {"op": "div"}, [4, 128, 1024], "float32"),
        ("binary", [v, x], {"op": "sub"}, [4, 128, 1024], "float32"),
        ("binary", [ss, v], {"op": "mul"}, [4, 1, 1024], "float16"),
        ("reduction", [x], {"dim": 2}, [4, 128, 1], "float32"),
        ("reduction", [x], {"dim": 0}, [1, 128, 1024], "float32"),
        ("softmax", [x], {"dim": 1}, [4, 128, 1024], "float32"),
        ("softmax", [x], {"dim": 2}, [4, 128, 1024], "bfloat16"),
        ("rms_norm", [x], {"num_normalized_dims": 1, "eps": 1e-6}, [4, 128, 1024], "float32"),
        (
            "rms_norm",
            [x, g],
            {"num_normalized_dims": 2, "eps": 0.0, "has_weight": True},
            [4, 128, 1024],
            "float16",
        ),
        ("unary", [ss], {"op": "mul_scalar", "params": [0.5]}, [4, 1, 1024], "float32"),
    ):
        p.library(op, ins, [p.output(shape, dtype)], params)
    plan = p.build()
    launcher = build(plan)
    code = launcher.program.code
    assert "yr_lib" in code and "#pragma omp parallel for" in code
    assert all(s.kind == "generated" for s in launcher.program.steps)
    rng = _rng(21)
    ins = [
        rng.standard_normal(s, dtype=np.float32) for s in ((4, 128, 1024), (1024,), (1, 128, 1024))
    ]
    refs = run_plan(plan, [np.asarray(a, dtype=np.float64) for a in ins])
    torch = pytest.importorskip("torch")  # bfloat16 outputs need torch tensors
    outs = launcher(*[torch.from_numpy(a) for a in ins])
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        tol = 1e-5 if o.dtype == torch.float32 else 1e-2
        assert rel_err(o.double().numpy(), r) < tol, (i, o.dtype)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((8, 1024), (1024, 1536)),  # decode-style skinny matmul: N tiles over the cores
        ((4, 4, 128), (4, 128, 1024)),  # batched (GQA scores)
        ((2, 3, 5, 12), (2, 3, 12, 24)),  # rank 4, odd sizes (no power-of-two tiles)
        ((256, 64), (64, 48)),  # M tiled too
        ((1, 7), (7, 1)),
    ],
)
def test_printed_library_matmuls(build: Any, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """Library matmuls run as generated kernels (one OpenMP pool with the rest of the plan,
    no BLAS thread pool competing for the cores)."""
    p = PlanBuilder()
    xa, xb = p.input(list(a)), p.input(list(b))
    p.library("matmul", [xa, xb], [p.output([*a[:-1], b[-1]])])
    plan = p.build()
    typed = parse_plan(plan)
    lib = typed.kernels[0]
    assert isinstance(lib, LibraryKernel)
    gk = _codegen.library_matmul_kernel(lib, {x.id: x for x in typed.buffers})
    assert gk is not None
    # as the lowering would mark it: a looping product adds into its accumulator
    assert gk.ops[2].accumulate_into == (3 if gk.forloop_range > 1 else None)
    launcher = build(plan)
    assert [s.kind for s in launcher.program.steps] == ["generated"]
    rng = _rng(sum(a) + sum(b))
    _check(launcher, plan, [rng.standard_normal(s, dtype=np.float32) for s in (a, b)])


def test_three_dimensional_grid(build: Any) -> None:
    p = PlanBuilder()
    x = p.input([4, 6, 32])
    k = p.kernel("grid3", grid=(2, 3, 2), forloop_range=2)
    t = k.input(x, [2, 2, 8], [off(("bx", 2)), off(("by", 2)), off(("bz", 16), ("iter", 8))])
    acc = k.accum(k.unary("square", t))
    k.output(p.output([4, 6, 16]), acc, [off(("bx", 2)), off(("by", 2)), off(("bz", 8))])
    plan = p.build()
    launcher = build(plan)
    assert "collapse(3)" in launcher.program.code
    _check(launcher, plan, [_rng(13).standard_normal((4, 6, 32), dtype=np.float32)])


def test_malformed_plans_raise_plan_errors() -> None:
    """The printer reads plans through yirage.plan, whose errors name the problem."""
    good = json.loads((PLANS / "rmsnorm_matmul.json").read_text())
    with pytest.raises(PlanError, match="format"):
        _codegen.generate({**good, "format": "something"})
    with pytest.raises(PlanError, match="version 99"):
        _codegen.generate({**good, "version": 99})
    with pytest.raises(PlanError, match="lower the graph again"):
        _codegen.generate({**good, "version": 2})
    with pytest.raises(PlanError, match="not JSON"):
        _codegen.generate("{nope")
    bad = json.loads(json.dumps(good))
    bad["kernels"][0]["ops"][2]["op"] = "fft"
    with pytest.raises(PlanError, match="unknown tile op 'fft'"):
        _codegen.generate(bad)
    bad = json.loads(json.dumps(good))
    bad["buffers"][0]["dtype"] = "int8"
    with pytest.raises(PlanError, match="int8"):
        _codegen.generate(bad)


def test_a_running_max_broadcast_over_rows_is_refused() -> None:
    """A valid plan whose group max (one row) broadcasts over an accumulator's 2 rows: the CPU
    printer indexes the max by row, so it refuses the plan with a CodegenError."""
    p = PlanBuilder()
    x = p.input([1, 256])
    v = p.input([2, 256])
    k = p.kernel("bcast", forloop_range=4)
    e = k.unary("exp", k.input(x, [1, 64], [[], off(("iter", 64))]))
    acc = k.accum(k.binary("mul", e, k.input(v, [2, 64], [[], off(("iter", 64))])), "sum")
    den = k.accum(e, "sum")
    k.output(p.output([2, 1]), k.epi_binary("div", acc, den), [[], []])
    k.safe_softmax(e, [acc, den])
    plan = p.build()
    parse_plan(plan)  # valid
    with pytest.raises(_codegen.CodegenError, match="broadcast"):
        _codegen.generate(plan)


def test_plan_objects_with_to_json_are_accepted() -> None:
    text = (PLANS / "rmsnorm_matmul.json").read_text()

    class Plan:
        def to_json(self) -> str:
            return text

    a = _codegen.generate(Plan())
    b = _codegen.generate(text)
    assert a.code == b.code and a.source_hash == b.source_hash
    assert [s.kind for s in a.steps] == ["generated"] and a.symbols == ("yr_k0",)


def test_toolchain_reports_compiler_and_flags() -> None:
    cc = _toolchain.find_compiler()
    assert cc.kind in ("gcc", "clang", "cc") and cc.version
    flags, _ = _toolchain.select_flags(cc)
    assert "-fopenmp" in flags and "-O3" in flags
