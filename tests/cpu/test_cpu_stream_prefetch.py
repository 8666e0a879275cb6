"""The matmul's software prefetch of the B rows it streams from memory in place (a weight).

A block's B tile is ``kt`` rows read side by side; the micro-kernel prefetches each row
``_STREAM_PREFETCH_BYTES`` ahead of its loads into L2 and, near a row's end, the same row of
the next iteration's tile, where the block's stream continues. A prefetch changes no number,
so the tests check what it could break or miss: the kernels still match float64 numpy at odd
sizes that take every branch of the distance (rows longer than it, with the wrap into the next
tile; rows shorter; a B loaded once; a masked edge tile, staged and not prefetched) in
float32, float16 and bfloat16 on every ISA path; every address a kernel prefetches lies inside
the B buffer (the printed C with the builtin replaced by a recorder); the prefetch is printed
where B is streamed and nowhere else; x86-64-v4 assembly carries ``prefetcht1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err
from cpu_plan_tools import (
    PlanBuilder,
    count_prefetches_in,
    off,
    prefetch_counts,
    recording_launcher,
    x86_assembly,
)

from yirage_cpu import _codegen

torch = pytest.importorskip("torch")

M, K, KT = 5, 210, 30
#: N tiles: longer than the prefetch distance of every dtype (the row's end wraps into the
#: next tile; 333 is no multiple of a vector: a column tail too) and shorter than it.
LONG, SHORT = 333, 37
DTYPES = ["float32", "float16", "bfloat16"]
PATHS = [
    pytest.param((), id="host"),
    pytest.param(("-march=x86-64-v3",), id="x86-64-v3"),
    pytest.param(("-march=x86-64",), id="x86-64"),
    pytest.param(("-DYR_SOFT_HALF",), id="portable"),
]
#: A prefetch the micro-kernel prints (the prelude defines the macro in every program).
_PREFETCH = "YR_PREFETCH((const char *)"
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _flags_run_here(flags: tuple[str, ...]) -> None:
    import platform

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if any(f.startswith("-march=") for f in flags) and not x86:
        pytest.skip("pinned x86-64 levels run on an x86-64 host only")


def _linear(dtype: str, nt: int, blocks: int = 2, masked: int = 0) -> dict[str, Any]:
    """x [M, K] (float32) @ W [K, N] (``dtype``, read in place): ``blocks`` N tiles of
    ``nt``, the for-loop over K tiles of KT; ``masked`` columns short of the last tile (its
    W and output accesses masked)."""
    n = blocks * nt - masked
    p = PlanBuilder()
    x, w = p.input([M, K]), p.input([K, n], dtype)
    k = p.kernel("linear", grid=(blocks, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [M, KT], [[], off(("iter", KT))])
    tw = k.input(w, [KT, nt], [off(("iter", KT)), off(("bx", nt))])
    acc = k.accum(k.matmul(tx, tw))
    k.output(p.output([M, n]), acc, [[], off(("bx", nt))])
    plan = p.build()
    if masked:
        kernel = plan["kernels"][0]
        for access in (kernel["inputs"][1], kernel["outputs"][0]):
            access["masked"] = [{"dim": 1, "extent": n}]
    return plan


def _loaded_once(dtype: str) -> dict[str, Any]:
    """x @ W with W [K, LONG] loaded once before a for-loop that does not walk it (the
    matmul in the epilogue): its rows are streamed without a next tile."""
    p = PlanBuilder()
    x, w = p.input([M, K]), p.input([K, LONG], dtype)
    k = p.kernel("once", grid=(1, 1, 1), forloop_range=K // KT)
    tx = k.input(x, [M, KT], [[], off(("iter", KT))])
    rms = k.accum(tx, "rms", eps=1e-6, extent=K)
    tall = k.input(x, [M, K], [[], []])
    tw = k.input(w, [K, LONG], [[], []])
    y = k.epi_binary("div", k.matmul(tall, tw, phase="epilogue"), rms)
    k.output(p.output([M, LONG]), y, [[], []])
    return p.build()


def _inputs(dtype: str, n: int, seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32))
    w = torch.from_numpy((rng.standard_normal((K, n)) / np.sqrt(K)).astype(np.float32))
    return x, w.to(_TORCH[dtype])


def _f64(t: Any) -> np.ndarray:
    return np.asarray(t.double().numpy())


CASES = [
    pytest.param(LONG, 0, id="long-rows"),
    pytest.param(SHORT, 0, id="short-rows"),
    pytest.param(LONG, 7, id="masked"),
]


@pytest.mark.parametrize("flags", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("nt", "masked"), CASES)
def test_streamed_matmuls_match_float64(
    build: Any, flags: tuple[str, ...], dtype: str, nt: int, masked: int
) -> None:
    _flags_run_here(flags)
    plan = _linear(dtype, nt, masked=masked)
    n = 2 * nt - masked
    x, w = _inputs(dtype, n, seed=nt + masked)
    (y,) = build(plan, extra_flags=flags)(x, w)
    assert rel_err(_f64(y), _f64(x) @ _f64(w)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_b_loaded_once_streams_and_matches_float64(build: Any, dtype: str) -> None:
    launcher = build(_loaded_once(dtype))
    assert _PREFETCH in launcher.program.code
    x, w = _inputs(dtype, LONG, seed=9)
    (y,) = launcher(x, w)
    x64 = _f64(x)
    want = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-6) @ _f64(w)
    assert rel_err(_f64(y), want) < 1e-5


# -- where the prefetches go -------------------------------------------------------------------


def _recording(plan: dict[str, Any], simd_bits: int) -> Any:
    """A launcher of ``plan`` whose prefetches are counted instead of issued."""
    src = _codegen.generate(plan, simd_width_bits=simd_bits)
    return recording_launcher(src, simd_bits, "pf-recorder")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nt", [LONG, SHORT])
def test_every_prefetch_lies_inside_the_streamed_buffer(
    simd_bits: int, dtype: str, nt: int
) -> None:
    """Each block's last tile prefetches no further than its own rows, and the rows' ends
    wrap into the next tile only while there is one: not one address leaves W, and W's
    rows are prefetched (all blocks, both threads)."""
    launcher = _recording(_linear(dtype, nt, blocks=3), simd_bits)
    x, w = _inputs(dtype, 3 * nt, seed=4)
    count_prefetches_in(launcher, w)
    (y,) = launcher(x, w)
    inside, outside = prefetch_counts(launcher)
    assert outside == 0
    assert inside >= K * 3  # at least one line of every row of every block
    assert rel_err(_f64(y), _f64(x) @ _f64(w)) < 1e-5


def test_only_b_operands_in_memory_are_prefetched(simd_bits: int) -> None:
    """A streamed B prints the distance and its wrap (the next tile's row, one loop step
    later), a masked edge included (the last tile is shifted back, so B is streamed in place
    by every block)."""
    code = _codegen.generate(_linear("float32", LONG), simd_width_bits=simd_bits).code
    assert _PREFETCH in code
    assert f"(iter + 1 < {K // KT} ?" in code
    masked = _codegen.generate(_linear("float32", LONG, masked=7), simd_width_bits=simd_bits)
    assert _PREFETCH in masked.code and "yr_skip" in masked.code


def test_the_switch_turns_the_prefetch_off(simd_bits: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(_codegen, "STREAM_PREFETCH", False)
    code = _codegen.generate(_linear("bfloat16", LONG), simd_width_bits=simd_bits).code
    assert _PREFETCH not in code


@pytest.mark.parametrize("dtype", DTYPES)
def test_x86_64_v4_assembly_prefetches_into_l2(tmp_path: Path, dtype: str) -> None:
    code = _codegen.generate(_linear(dtype, LONG), simd_width_bits=512).code
    asm = x86_assembly(tmp_path, code, ("-march=x86-64-v4", "-mprefer-vector-width=512"))
    assert "prefetcht1" in asm
