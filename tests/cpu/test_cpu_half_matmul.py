"""float16 / bfloat16 weights read in place by the CPU matmul (no float copy of the tile).

A matmul's B tile that nothing else reads is not staged into a private float tile: the
micro-kernel widens one register of 16-bit elements at a time as it loads it (bfloat16 by a
zero extension and a shift, float16 by the ISA's conversion instruction). Numbers: RMSNorm +
Linear, gated MLP and LoRA kernels of the form the search picks at model sizes, at odd sizes
(K, N and the LoRA rank not multiples of any vector width, N tiles with a column tail),
against float64 numpy on the same 16-bit inputs, on the host ISA, pinned lower x86-64 levels
and the portable path, which must all agree. Paths: the printed matmul compiled to assembly
for pinned x86-64 levels takes that level's widening instructions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err
from cpu_plan_tools import PlanBuilder, off, x86_assembly

from yirage_cpu import _codegen, _toolchain

torch = pytest.importorskip("torch")

M, K, KT, N, NT, R = 5, 200, 40, 74, 37, 6
#: The compile paths every kernel runs on: the host's, pinned lower x86-64 levels (an x86
#: host runs them all) and the portable conversions.
PATHS = [
    pytest.param((), id="host"),
    pytest.param(("-march=x86-64-v3",), id="x86-64-v3"),
    pytest.param(("-march=x86-64",), id="x86-64"),
    pytest.param(("-DYR_SOFT_HALF",), id="portable"),
]
HALF = ["bfloat16", "float16"]
_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _host_is_x86() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")


def _flags_run_here(flags: tuple[str, ...]) -> None:
    if any(f.startswith("-march=") for f in flags) and not _host_is_x86():
        pytest.skip("pinned x86-64 levels run on an x86-64 host only")


def _tensor(rng: np.random.Generator, dims: tuple[int, ...], dtype: str, std: float) -> Any:
    x = (rng.standard_normal(dims) * std).astype(np.float32)
    return torch.from_numpy(x).to(_TORCH.get(dtype, torch.float32))


def _f64(t: Any) -> np.ndarray:
    return np.asarray(t.double().numpy())


def _rmsnorm_linear(dtype: str, out_dtype: str) -> dict[str, Any]:
    """x [M, K] (float32), W [K, N] (16-bit): rms_norm(x) @ W as one kernel over N tiles,
    the for-loop over K tiles (accum_rms, matmul, accum_iter, div)."""
    p = PlanBuilder()
    x, w = p.input([M, K]), p.input([K, N], dtype)
    k = p.kernel("rmsnorm_linear", grid=(N // NT, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [M, KT], [[], off(("iter", KT))])
    tw = k.input(w, [KT, NT], [off(("iter", KT)), off(("bx", NT))])
    rms = k.accum(tx, "rms", eps=1e-6, extent=K)
    acc = k.accum(k.matmul(tx, tw))
    y = k.epi_binary("div", acc, rms)
    k.output(p.output([M, N], out_dtype), y, [[], off(("bx", NT))])
    return p.build()


def _gated_mlp(dtype: str) -> dict[str, Any]:
    """silu(x @ W1) * (x @ W3), x and both weights 16-bit."""
    p = PlanBuilder()
    x, w1, w3 = p.input([M, K], dtype), p.input([K, N], dtype), p.input([K, N], dtype)
    k = p.kernel("gated_mlp", grid=(N // NT, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [M, KT], [[], off(("iter", KT))])
    walk = [off(("iter", KT)), off(("bx", NT))]
    a1 = k.accum(k.matmul(tx, k.input(w1, [KT, NT], walk)))
    a3 = k.accum(k.matmul(tx, k.input(w3, [KT, NT], walk)))
    y = k.epi_binary("mul", k.epi_unary("silu", a1), a3)
    k.output(p.output([M, N], dtype), y, [[], off(("bx", NT))])
    return p.build()


def _lora(dtype: str) -> dict[str, Any]:
    """x @ W + (x @ A) @ B: the rank-R product in the loop, its B in the epilogue."""
    p = PlanBuilder()
    x, w = p.input([M, K], dtype), p.input([K, N], dtype)
    a, b = p.input([K, R], dtype), p.input([R, N], dtype)
    k = p.kernel("lora", grid=(N // NT, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [M, KT], [[], off(("iter", KT))])
    aw = k.accum(k.matmul(tx, k.input(w, [KT, NT], [off(("iter", KT)), off(("bx", NT))])))
    aa = k.accum(k.matmul(tx, k.input(a, [KT, R], [off(("iter", KT)), []])))
    tb = k.input(b, [R, NT], [[], off(("bx", NT))])
    low = k.matmul(aa, tb, phase="epilogue")
    y = k.epi_binary("add", aw, low)
    k.output(p.output([M, N], "float32"), y, [[], off(("bx", NT))])
    return p.build()


def _rms_rows(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _bound(out_dtype: str) -> float:
    """float arithmetic on exact inputs, plus one rounding of a 16-bit output."""
    return {"float32": 1e-5, "float16": 2.0**-11, "bfloat16": 2.0**-8}[out_dtype]


def _widened_in_place(code: str, dtype: str) -> bool:
    """The printed kernel widens its 16-bit B tiles in the micro-kernel, staging none."""
    vec = _codegen._VEC_LOAD[dtype]
    return f"{vec}(yr_bk" in code and f"{_codegen._ROW_LOAD[dtype]}(B1" not in code


@pytest.mark.parametrize("flags", PATHS)
@pytest.mark.parametrize("dtype", HALF)
def test_rmsnorm_linear_with_16_bit_weights(build: Any, flags: tuple[str, ...], dtype: str) -> None:
    _flags_run_here(flags)
    rng = np.random.default_rng(1)
    x, w = _tensor(rng, (M, K), "float32", 1.0), _tensor(rng, (K, N), dtype, K**-0.5)
    for out_dtype in ("float32", dtype):
        launcher = build(_rmsnorm_linear(dtype, out_dtype), extra_flags=flags)
        assert _widened_in_place(launcher.program.code, dtype)
        (y,) = launcher(x, w)
        want = _rms_rows(_f64(x)) @ _f64(w)
        assert rel_err(_f64(y), want) < _bound(out_dtype)


@pytest.mark.parametrize("flags", PATHS)
@pytest.mark.parametrize("dtype", HALF)
def test_gated_mlp_with_16_bit_operands(build: Any, flags: tuple[str, ...], dtype: str) -> None:
    _flags_run_here(flags)
    rng = np.random.default_rng(2)
    x = _tensor(rng, (M, K), dtype, 1.0)
    w1, w3 = (_tensor(rng, (K, N), dtype, K**-0.5) for _ in range(2))
    launcher = build(_gated_mlp(dtype), extra_flags=flags)
    (y,) = launcher(x, w1, w3)
    x64 = _f64(x)
    want = _silu(x64 @ _f64(w1)) * (x64 @ _f64(w3))
    assert rel_err(_f64(y), want) < 2 * _bound(dtype)


@pytest.mark.parametrize("flags", PATHS)
@pytest.mark.parametrize("dtype", HALF)
def test_lora_with_16_bit_operands(build: Any, flags: tuple[str, ...], dtype: str) -> None:
    """The rank-6 product (narrower than any vector: the column path) and the epilogue
    matmul both read their 16-bit B in place."""
    _flags_run_here(flags)
    rng = np.random.default_rng(3)
    x = _tensor(rng, (M, K), dtype, 1.0)
    w, a = _tensor(rng, (K, N), dtype, K**-0.5), _tensor(rng, (K, R), dtype, K**-0.5)
    b = _tensor(rng, (R, N), dtype, R**-0.5)
    launcher = build(_lora(dtype), extra_flags=flags)
    code = launcher.program.code
    assert not any(f"{_codegen._ROW_LOAD[dtype]}(B{w}" in code for w in (1, 2, 3))
    (y,) = launcher(x, w, a, b)
    x64 = _f64(x)
    want = x64 @ _f64(w) + (x64 @ _f64(a)) @ _f64(b)
    assert rel_err(_f64(y), want) < _bound("float32")


@pytest.mark.parametrize("dtype", HALF)
def test_every_path_gives_the_same_numbers(build: Any, dtype: str) -> None:
    """The ISA widening and the portable one compute the same float products: outputs
    agree to float32 rounding of the accumulation order (which is the same on every path)."""
    rng = np.random.default_rng(4)
    x = _tensor(rng, (M, K), dtype, 1.0)
    w1, w3 = (_tensor(rng, (K, N), dtype, K**-0.5) for _ in range(2))
    plan = _gated_mlp(dtype)
    outs = []
    for p in PATHS:
        flags = p.values[0]
        if any(f.startswith("-march=") for f in flags) and not _host_is_x86():
            continue
        (y,) = build(plan, extra_flags=flags)(x, w1, w3)
        outs.append(_f64(y))
    for y in outs[1:]:
        assert rel_err(y, outs[0]) <= _bound(dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_batched_library_matmul_with_16_bit_operands(build: Any, dtype: str) -> None:
    """A printed library matmul (GQA's P·V shape, odd sizes) reads its 16-bit B in place."""
    p = PlanBuilder()
    a, b = p.input([3, 4, 96], dtype), p.input([3, 96, 40], dtype)
    p.library("matmul", [a, b], [p.output([3, 4, 40], dtype)])
    launcher = build(p.build())
    assert [s.kind for s in launcher.program.steps] == ["generated"]
    rng = np.random.default_rng(5)
    xa, xb = _tensor(rng, (3, 4, 96), dtype, 1.0), _tensor(rng, (3, 96, 40), dtype, 0.1)
    (y,) = launcher(xa, xb)
    assert rel_err(_f64(y), _f64(xa) @ _f64(xb)) < _bound(dtype)


# -- the widening instructions of pinned x86-64 levels (compiled, never run) -----------------


def _assembly(tmp_path: Path, dtype: str, simd_bits: int, flags: tuple[str, ...]) -> str:
    code = _codegen.generate(_rmsnorm_linear(dtype, "float32"), simd_width_bits=simd_bits).code
    return x86_assembly(tmp_path, code, flags)


@pytest.mark.parametrize(
    ("simd_bits", "flags", "reg"),
    [
        (512, ("-march=x86-64-v4", "-mprefer-vector-width=512"), "zmm"),
        (256, ("-march=x86-64-v3",), "ymm"),
        (128, ("-march=x86-64",), "xmm"),
    ],
)
def test_bfloat16_b_tiles_widen_by_a_shift(
    tmp_path: Path, simd_bits: int, flags: tuple[str, ...], reg: str
) -> None:
    asm = _assembly(tmp_path, "bfloat16", simd_bits, flags)
    # a zero extension of the 16-bit lanes (punpck* on SSE2) and a shift into float position
    assert re.search(rf"\b(vpmovzxwd|punpcklwd|vpunpcklwd)\s[^\n]*%{reg}", asm)
    assert re.search(rf"\bv?pslld\s+\$16, [^\n]*%{reg}", asm)
    assert re.search(rf"\bvfmadd\w+\s[^\n]*%{reg}" if reg != "xmm" else r"\bmulps\s", asm)


@pytest.mark.parametrize(
    ("simd_bits", "flags", "reg"),
    [
        (512, ("-march=x86-64-v4", "-mprefer-vector-width=512"), "zmm"),
        (256, ("-march=x86-64-v3",), "ymm"),
        (512, ("-march=x86-64-v3",), "ymm"),  # a 512-bit print on an F16C-only target
        (256, ("-march=x86-64-v3", "-DYR_SOFT_HALF"), None),
        (128, ("-march=x86-64",), None),
    ],
)
def test_float16_b_tiles_widen_with_the_isa_instruction(
    tmp_path: Path, simd_bits: int, flags: tuple[str, ...], reg: str | None
) -> None:
    asm = _assembly(tmp_path, "float16", simd_bits, flags)
    if reg is None:  # portable: the integer/float widening, vectorised or not
        assert "cvtph2ps" not in asm
    else:
        assert re.search(rf"\bvcvtph2ps\s[^\n]*%{reg}", asm)


# -- the path a compile took, as reports record it ---------------------------------------------


def test_the_matmul_widening_path_from_pinned_features() -> None:
    bf16 = _toolchain.isa_features({"__F16C__", "__AVX2__", "__AVX512F__", "__AVX512BF16__"})
    assert _toolchain.matmul_half_path(bf16, 512) == "bfloat16 avx512_bf16, float16 avx512f"
    assert _toolchain.matmul_half_path(bf16, 256) == "bfloat16 avx2, float16 avx512f"
    v4 = _toolchain.isa_features({"__F16C__", "__AVX2__", "__AVX512F__"})
    assert _toolchain.matmul_half_path(v4, 512) == "bfloat16 avx2, float16 avx512f"
    v3 = _toolchain.isa_features({"__F16C__", "__AVX__", "__AVX2__"})
    assert _toolchain.matmul_half_path(v3, 256) == "bfloat16 avx2, float16 f16c"
    assert _toolchain.matmul_half_path(v3, 128) == "bfloat16 portable, float16 f16c"
    assert _toolchain.matmul_half_path(()) == "bfloat16 portable, float16 portable"


def test_the_launcher_reports_the_matmul_path_its_compile_took(build: Any, simd_bits: int) -> None:
    plan = _rmsnorm_linear("bfloat16", "float32")
    launcher = build(plan)
    lib = launcher.library
    report = _toolchain.isa_report(lib.compiler, lib.flags, simd_bits)
    assert launcher.matmul_half_path == report["matmul_half_path"]
    soft = build(plan, extra_flags=("-DYR_SOFT_HALF",))
    assert soft.matmul_half_path == "bfloat16 portable, float16 portable"
