"""float16 / bfloat16 in the CPU backend: storage types widened to float in registers.

Numbers: every float16 and bfloat16 bit pattern widened exactly; float32 values (ties,
subnormals, overflow, infinities, NaN) narrowed with round-to-nearest-even exactly as numpy
(float16) and torch (bfloat16) do; odd lengths that leave a tail after the vector loop; the
ISA conversion path and the portable one (``-DYR_SOFT_HALF``) alike. Paths: the printed
source compiled to assembly for pinned x86-64 levels (not the host's) takes the conversion
instructions of that level.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err
from cpu_plan_tools import PlanBuilder, x86_assembly, x86_compiler

from yirage_cpu import _codegen, _toolchain

#: The conversion path the host compile takes, and the portable one.
PATHS = [pytest.param((), id="isa"), pytest.param(("-DYR_SOFT_HALF",), id="portable")]
#: Longer than two float16 chunks of an elementwise kernel, not a multiple of any vector.
N = 2 * _codegen._HALF_CHUNK + 37


def _unary_plan(n: int, src: str, dst: str, op: str = "neg") -> dict[str, Any]:
    p = PlanBuilder()
    x = p.input([n], src)
    p.library("unary", [x], [p.output([n], dst)], {"op": op, "params": []})
    return p.build()


def _specials(n: int, seed: int) -> np.ndarray:
    """float32 values that exercise every rounding case of both 16-bit formats."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-140, 20, n))).astype(np.float32)
    halves = np.arange(1024, 1024 + 64, dtype=np.float32)
    x[:64] = halves + 0.5  # float16 ties between neighbours: to even
    bf16_ties = np.arange(64, dtype=np.uint32) * 0x10000 + 0x3F808000
    x[64:128] = bf16_ties.view(np.float32)  # bfloat16 ties: to even
    x[128:136] = [np.inf, -np.inf, np.nan, -0.0, 65519.0, 65520.0, 70000.0, -1e6]
    x[136:144] = [6e-8, 2.9e-8, 3.0e-8, -5.96e-8, 6.1e-5, 1e-39, -3e-40, 1.17e-38]
    return x


@pytest.mark.parametrize("flags", PATHS)
def test_every_float16_widens_exactly(build: Any, flags: tuple[str, ...]) -> None:
    bits = np.concatenate([np.arange(65536), np.arange(7)]).astype(np.uint16)  # odd length
    launcher = build(_unary_plan(bits.size, "float16", "float32"), extra_flags=flags)
    (out,) = launcher(bits.view(np.float16))
    want = -bits.view(np.float16).astype(np.float64)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan], want[~nan])


@pytest.mark.parametrize("flags", PATHS)
def test_float32_narrows_to_float16_as_numpy(build: Any, flags: tuple[str, ...]) -> None:
    x = _specials(N, 1)
    launcher = build(_unary_plan(N, "float32", "float16"), extra_flags=flags)
    (out,) = launcher(x)
    with np.errstate(over="ignore"):
        want = (-x).astype(np.float16)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def test_every_bfloat16_widens_and_float32_narrows_as_torch(build: Any) -> None:
    torch = pytest.importorskip("torch")
    bits = np.concatenate([np.arange(65536), np.arange(5)]).astype(np.uint16)
    widen = build(_unary_plan(bits.size, "bfloat16", "float32"))
    (out,) = widen(torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16))
    with np.errstate(invalid="ignore"):  # signalling NaNs
        want = -(bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out.numpy()), nan)
    np.testing.assert_array_equal(out.numpy()[~nan], want[~nan])

    x = _specials(N, 2)
    narrow = build(_unary_plan(N, "float32", "bfloat16"))
    (got,) = narrow(torch.from_numpy(x))
    ref = torch.from_numpy(-x).to(torch.bfloat16)
    nan16 = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan16)
    assert torch.equal(got.view(torch.int16)[~nan16], ref.view(torch.int16)[~nan16])
    assert (got.view(torch.int16)[torch.from_numpy(np.abs(x) < 1.1754944e-38)] != 0).any()


@pytest.mark.parametrize("flags", PATHS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_elementwise_kernels_on_16_bit_buffers(
    build: Any, flags: tuple[str, ...], dtype: str
) -> None:
    """exp and a binary op computed in float: within half an ulp of the 16-bit format of the
    float64 result (plus float's own error)."""
    torch = pytest.importorskip("torch")
    p = PlanBuilder()
    x, y = p.input([N], dtype), p.input([N], "float32")
    p.library("unary", [x], [p.output([N], dtype)], {"op": "exp", "params": []})
    p.library("binary", [x, y], [p.output([N], dtype)], {"op": "mul"})
    launcher = build(p.build(), extra_flags=flags)
    rng = np.random.default_rng(3)
    xs = torch.from_numpy(rng.uniform(-8, 8, N).astype(np.float32)).to(getattr(torch, dtype))
    ys = torch.from_numpy(rng.standard_normal(N, dtype=np.float32))
    e, m = launcher(xs, ys)
    x64 = xs.double().numpy()
    ulp = 2.0**-11 if dtype == "float16" else 2.0**-8
    assert rel_err(e.double().numpy(), np.exp(x64)) < ulp
    assert np.max(np.abs(m.double().numpy() / (x64 * ys.double().numpy()) - 1)) <= ulp * 1.01


@pytest.mark.parametrize("flags", PATHS)
def test_generated_kernel_tiles_convert_by_rows(build: Any, flags: tuple[str, ...]) -> None:
    """Tile loads and stores of float16 rows (37 wide: full vectors and a tail) round-trip
    exactly; a float32 tile narrows as numpy; an epilogue exp is within an ulp."""
    p = PlanBuilder()
    h, f = p.input([6, 37], "float16"), p.input([6, 37], "float32")
    k = p.kernel("rows", grid=(1, 1, 1), forloop_range=1)
    th, tf = k.input(h, [6, 37], [[], []]), k.input(f, [6, 37], [[], []])
    ah = k.accum(th)
    k.output(p.output([6, 37], "float16"), ah, [[], []])
    k.output(p.output([6, 37], "float16"), k.accum(tf), [[], []])
    k.output(p.output([6, 37], "float16"), k.epi_unary("exp", ah), [[], []])
    launcher = build(p.build(), extra_flags=flags)
    assert "yr_h2f_row(" in launcher.program.code and "yr_f2h_row(" in launcher.program.code
    rng = np.random.default_rng(4)
    hs = rng.uniform(-4, 4, (6, 37)).astype(np.float16)
    fs = _specials(6 * 37, 5).reshape(6, 37)
    same, narrowed, e = launcher(hs, fs)
    np.testing.assert_array_equal(same.view(np.uint16), hs.view(np.uint16))
    with np.errstate(over="ignore"):
        want = (np.float32(0) + fs).astype(np.float16)  # the accumulator starts at +0
    nan = np.isnan(want)
    np.testing.assert_array_equal(narrowed.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(narrowed[nan]).all()
    assert rel_err(e.astype(np.float64), np.exp(hs.astype(np.float64))) < 2.0**-11


# -- the ISA path of the printed code, for pinned x86-64 levels (compiled, never run) ------


def _assembly(tmp_path: Path, simd_bits: int, flags: tuple[str, ...]) -> str:
    p = PlanBuilder()
    h, b = p.input([4096], "float16"), p.input([4096], "bfloat16")
    p.library("unary", [h], [p.output([4096], "float16")], {"op": "exp", "params": []})
    p.library("unary", [b], [p.output([4096], "bfloat16")], {"op": "exp", "params": []})
    return x86_assembly(
        tmp_path, _codegen.generate(p.build(), simd_width_bits=simd_bits).code, flags
    )


@pytest.mark.parametrize(
    ("simd_bits", "flags", "path", "reg"),
    [
        (512, ("-march=x86-64-v4", "-mavx512bf16", "-mprefer-vector-width=512"), "avx512f", "zmm"),
        (512, ("-march=x86-64-v4", "-mprefer-vector-width=512"), "avx512f", "zmm"),
        (256, ("-march=x86-64-v3",), "f16c", "ymm"),
        (128, ("-march=x86-64",), "portable", None),
        (256, ("-march=x86-64-v3", "-DYR_SOFT_HALF"), "portable", None),
    ],
)
def test_the_pinned_isa_picks_its_conversion_path(
    tmp_path: Path, simd_bits: int, flags: tuple[str, ...], path: str, reg: str | None
) -> None:
    asm = _assembly(tmp_path, simd_bits, flags)
    assert f'.string\t"{path}"' in asm or f'.ascii\t"{path}' in asm
    if reg is not None:  # the F16C / AVX-512 conversions, a vector of halves at a time
        assert re.search(rf"vcvtph2ps\s[^\n]*%{reg}", asm)
        assert re.search(rf"vcvtps2ph\s+\$\d+, %{reg}", asm)
    else:  # no conversion instruction; the integer/float code is vectorised instead
        assert "cvtph2ps" not in asm and "cvtps2ph" not in asm
        assert re.search(r"\bv?pslld\s+\$13, %[xyz]mm", asm)
    wide = reg or "xmm"
    assert re.search(rf"\bv?pslld\s+\$16, [^\n]*%{wide}", asm)  # bfloat16 widens by a shift
    # bfloat16 narrows with vcvtneps2bf16 exactly where the flags enable AVX512-BF16
    assert ("vcvtneps2bf16" in asm) == ("-mavx512bf16" in flags)


# -- the ISA features reports record ---------------------------------------------------------


def test_isa_features_and_the_float16_path_from_pinned_macros() -> None:
    macros = {"__F16C__", "__AVX2__", "__AVX512F__", "__AVX512BF16__", "__AVX512VNNI__"}
    feats = _toolchain.isa_features(macros)
    assert feats == ("f16c", "avx2", "avx512f", "avx512_bf16", "avx512_vnni")
    assert _toolchain.float16_path(feats) == "avx512f"
    assert _toolchain.float16_path(_toolchain.isa_features({"__F16C__", "__AVX__"})) == "f16c"
    assert _toolchain.float16_path(()) == "portable"
    amx = _toolchain.isa_features({"__AMX_TILE__", "__AMX_BF16__", "__AVX512FP16__"})
    assert amx == ("avx512_fp16", "amx_tile", "amx_bf16")


def test_predefined_macros_follow_pinned_flags() -> None:
    cc = x86_compiler()
    v4 = _toolchain.isa_report(cc, ("-O3", "-march=x86-64-v4"))
    assert {"f16c", "avx512f"} <= set(v4["isa"].split()) and v4["float16_path"] == "avx512f"
    base = _toolchain.isa_report(cc, ("-O3", "-march=x86-64"))
    assert base == {
        "isa": "(baseline)",
        "float16_path": "portable",
        "matmul_half_path": "bfloat16 portable, float16 portable",
    }


def test_the_launcher_reports_the_path_its_compile_took(build: Any) -> None:
    launcher = build(_unary_plan(64, "float16", "float32"))
    report = _toolchain.isa_report(launcher.library.compiler, launcher.library.flags)
    assert launcher.float16_path == report["float16_path"]
    soft = build(_unary_plan(64, "float16", "float32"), extra_flags=("-DYR_SOFT_HALF",))
    assert soft.float16_path == "portable"
