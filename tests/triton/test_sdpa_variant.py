"""Attention written as library kernels (matmul, scale, softmax, matmul: the search's
baseline of an attention graph) is also printed as one call of PyTorch's fused attention
(``torch_sdpa``), which the backend races beside the library printing. Run here with torch
on the CPU (SDPA's CPU kernels); on a GPU the same text calls flash attention."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _interp_backend import host_launch, needs_triton
from _search_graphs import scaled_attention

from yirage.plan import parse_plan

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import plans

pytestmark = needs_triton


def _attention_plan(
    heads: int,
    rows: int,
    d: int,
    kv: int,
    dtype: str,
    *,
    scale: float | None = 0.125,
    softmax_dim: int = 2,
    scores_also_output: bool = False,
) -> dict[str, Any]:
    """matmul(softmax(scale · Q @ Kᵀ), V) as library kernels with float32 intermediates, as
    the core lowers the search's baseline."""
    pb = plans.PlanBuilder(f"fixture-sdpa-{heads}x{rows}x{d}x{kv}-{dtype}-{scale}")
    q = pb.buf([heads, rows, d], dtype, "input")
    kt = pb.buf([heads, d, kv], dtype, "input")
    v = pb.buf([heads, kv, d], dtype, "input")
    o = pb.buf([heads, rows, d], dtype, "output")
    if scores_also_output:
        s = pb.buf([heads, rows, kv], dtype, "output")
    else:
        s = pb.buf([heads, rows, kv], "float32", "intermediate")
    pb.library("matmul", [q, kt], s)
    p = pb.buf([heads, rows, kv], "float32", "intermediate")
    if scale is None:
        pb.library("softmax", [s], p, dim=softmax_dim)
    else:
        s2 = pb.buf([heads, rows, kv], "float32", "intermediate")
        pb.raw["kernels"].append(
            {
                "kind": "library",
                "op": "unary",
                "inputs": [s],
                "outputs": [s2],
                "params": {"op": "mul_scalar", "params": [scale]},
            }
        )
        pb.library("softmax", [s2], p, dim=softmax_dim)
    pb.library("matmul", [p, v], o)
    return pb.plan


def _baseline_plan(g: Any) -> Any:
    """The kernel plan of the search's library baseline of ``g``."""
    import yirage as yr

    res = yr.search(g, top_k=1, cache=False, max_kernel_ops=1)
    return next(c for c in res.candidates if c.baseline).kernel_plan()


def _reference(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s = (q @ kt) * scale
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("scale", [0.125, None])
def test_the_chain_runs_as_one_call_and_matches_float64(
    dtype: str, tol: float, scale: float | None
) -> None:
    import torch

    heads, rows, d, kv = 3, 70, 32, 83  # kv no tile divides
    launch, src = host_launch(
        _attention_plan(heads, rows, d, kv, dtype, scale=scale), fused_attention=True
    )
    assert src.count("scaled_dot_product_attention") == 1
    assert "torch.softmax" not in src and "torch.matmul" not in src
    rng = np.random.default_rng(0)
    td = getattr(torch, dtype)
    xs = [
        torch.from_numpy(rng.standard_normal(shape)).to(td)
        for shape in ((heads, rows, d), (heads, d, kv), (heads, kv, d))
    ]
    (out,) = launch(xs)
    assert out.dtype == td and tuple(out.shape) == (heads, rows, d)
    want = _reference(*(x.double().numpy() for x in xs), 1.0 if scale is None else scale)
    err = np.linalg.norm(out.double().numpy() - want) / np.linalg.norm(want)
    assert err <= tol


def test_without_the_option_the_library_kernels_run() -> None:
    _, src = host_launch(_attention_plan(2, 64, 16, 64, "float16"), fused_attention=False)
    assert "scaled_dot_product_attention" not in src and "torch.softmax" in src


def test_only_whole_chains_are_fused() -> None:
    from yirage_triton._sdpa import attention_chains

    def chains(raw: dict[str, Any], rows: int = 1) -> int:
        return len(attention_chains(parse_plan(raw), rows))

    assert chains(_attention_plan(2, 64, 16, 64, "float16")) == 1
    assert chains(_attention_plan(2, 64, 16, 64, "float16", scale=None)) == 1
    # a softmax over the query rows is no attention
    assert chains(_attention_plan(2, 64, 16, 64, "float16", softmax_dim=1)) == 0
    # the scores are an output too: the fused call would not write them
    assert chains(_attention_plan(2, 64, 16, 64, "float16", scores_also_output=True)) == 0
    # a head with fewer query rows than asked for
    assert chains(_attention_plan(2, 8, 16, 64, "float16"), rows=64) == 0


def test_a_generated_kernel_before_the_chain_still_runs() -> None:
    """Q computed by a generated kernel (an elementwise scale into a float32 intermediate):
    the kernel is launched, then the chain runs as one call on its output."""
    pb = plans.PlanBuilder("fixture-sdpa-mixed")
    x = pb.buf([2, 64, 16], "float16", "input")
    kt = pb.buf([2, 16, 64], "float16", "input")
    v = pb.buf([2, 64, 16], "float16", "input")
    o = pb.buf([2, 64, 16], "float16", "output")
    q = pb.buf([2, 64, 16], "float32", "intermediate")
    k = pb.kernel("prep", [2, 1], 1)
    t = k.load(x, [1, 64, 16], d0=[("bx", 1)])
    k.store(q, k.accum(k.unary("mul_scalar", t, params=[2.0])), d0=[("bx", 1)])
    s, s2, p = (pb.buf([2, 64, 64], "float32", "intermediate") for _ in range(3))
    pb.library("matmul", [q, kt], s)
    pb.raw["kernels"].append(
        {
            "kind": "library",
            "op": "unary",
            "inputs": [s],
            "outputs": [s2],
            "params": {"op": "mul_scalar", "params": [0.25]},
        }
    )
    pb.library("softmax", [s2], p, dim=2)
    pb.library("matmul", [p, v], o)
    _, src = host_launch(pb.plan, fused_attention=True)
    assert src.index("# kernel prep") < src.index("scaled_dot_product_attention")
    assert f"buf{q}.to(torch.float16)" in src  # the float32 Q multiplied in float16


def test_the_backend_offers_the_printing_where_heads_have_query_tiles() -> None:
    from yirage_triton import TritonOptions, TritonTarget
    from yirage_triton._backend import TritonBackend
    from yirage_triton._sdpa import MIN_QUERY_ROWS

    def backend(families: frozenset[str]) -> Any:
        class Thin(TritonBackend):
            name = "thin"
            target = TritonTarget("thin", "cuda", variant_families=families)

            def compute_units(self) -> int:
                return 100

        return Thin(interpret=True)

    prefill = parse_plan(_attention_plan(2, MIN_QUERY_ROWS, 16, 64, "float16"))
    decode = parse_plan(_attention_plan(2, 4, 16, 64, "float16"))
    assert "torch_sdpa" in backend(frozenset({"sdpa"})).printings(prefill, TritonOptions())
    assert "torch_sdpa" not in backend(frozenset({"sdpa"})).printings(decode, TritonOptions())
    assert "torch_sdpa" not in backend(frozenset()).printings(prefill, TritonOptions())


def test_the_core_baseline_of_an_attention_graph_gets_the_variant() -> None:
    """End to end on the CUDA backend in the interpreter: the search's own baseline plan of
    an attention graph is printed, compiled and loaded with a ``torch_sdpa`` variant that
    gives the float64 reference's values."""
    import torch

    from yirage_cuda import CudaBackend

    heads, rows, d, kv = 2, 64, 32, 96
    g = scaled_attention(heads, rows, d, kv)
    be = CudaBackend(interpret=True)
    variants = be.variants(be.load(be.compile(be.codegen(_baseline_plan(g)))))
    assert "torch_sdpa" in variants
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s) for s in ((heads, rows, d), (heads, d, kv), (heads, kv, d))]
    (out,) = variants["torch_sdpa"](*[torch.from_numpy(x).float() for x in xs])
    (want,) = g.evaluate(xs)
    assert np.abs(out.double().numpy() - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("rows", [4, 64])
def test_a_transpose_of_k_in_the_graph_is_read_as_k(rows: int) -> None:
    """Attention written with K in its own layout and ``transpose`` in the graph: the chain
    takes in the transpose and SDPA reads K with no copy, at any row count."""
    import torch

    import yirage as yr
    from yirage_triton._sdpa import attention_chains

    heads, d, kv = 2, 32, 80
    g = scaled_attention(heads, rows, d, kv, yr.float16, transpose_k=True)
    plan = parse_plan(_baseline_plan(g))
    (chain,) = attention_chains(plan)
    assert chain.k == plan.inputs[1].id and len(chain.kernels) == 5
    launch, src = host_launch(plan, fused_attention=True)
    assert "transposed_copy" not in src and ".permute(" not in src
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(s) for s in ((heads, rows, d), (heads, kv, d), (heads, kv, d))]
    tensors = [torch.from_numpy(x).half() for x in xs]
    (out,) = launch(tensors)
    (want,) = g.evaluate([t.double().numpy() for t in tensors])
    assert np.linalg.norm(out.double().numpy() - want) / np.linalg.norm(want) <= 3e-3
