"""Finer for-loops (yirage_triton._subtile): a kernel whose loop chunks are only summed over
is printed with each chunk cut f ways, matches the float64 reference in the Triton
interpreter, and anything else is refused."""

from __future__ import annotations

from typing import Any

import plans
import pytest
from conftest import needs_triton
from test_triton_interpreter import TOL, rel_err, run_case

from yirage.plan import CodegenError, parse_plan
from yirage_triton import loop_subtile, subtile_kernel

pytestmark = needs_triton

LEGAL = {
    "rmsnorm_linear": plans.rmsnorm_linear,  # rms accumulator beside X @ W
    "gated_mlp": plans.gated_mlp,  # two dots
    "lora": plans.lora,  # a split-K kernel and one with a pre phase
    "zoo_reduce_matmul": plans.zoo_reduce_matmul,  # a column sum feeding the dot
}


def _kernel(case: plans.Case, name: str | None = None) -> Any:
    p = parse_plan(case.plan)
    return next(k for k in p.generated if name is None or k.name == name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(LEGAL))
def test_cut_chunks_match_the_reference(name: str, dtype: str) -> None:
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    case = LEGAL[name](dtype=dtype)
    p = parse_plan(case.plan)
    cuts = tuple((k.name, 2) for k in p.generated if subtile_kernel(k, 2) is not None)
    assert cuts, "every kernel of this plan that walks a loop can be cut"
    opts = TritonOptions(subtile=cuts, bf16_dot_as_fp32=True)
    be = CudaBackend(interpret=True, triton_options=opts)
    code = be.codegen(case.plan).code
    for kname, _ in cuts:
        k = _kernel(case, kname)
        assert f"tl.range(0, 0 + {2 * k.forloop_range}," in code, code
    outs, xs = run_case(be, case, seed=4)
    for o, r in zip(outs, case.reference(*xs), strict=True):
        assert rel_err(o, r) <= TOL[dtype]


def test_cut_kernel_shrinks_the_walking_tiles_only() -> None:
    k = _kernel(plans.rmsnorm_linear(h=512, tk=64))
    cut = subtile_kernel(k, 4)
    assert cut is not None and cut.forloop_range == 4 * k.forloop_range
    assert [a.tile for a in cut.inputs] == [(8, 16), (16, 16)]
    steps = [t.stride for a in cut.inputs for d in a.offsets for t in d if t.var == "iter"]
    assert steps == [16, 16]
    assert [o.dims for o in cut.ops if o.op == "accum"] == [
        o.dims for o in k.ops if o.op == "accum"
    ]


def test_refused_where_a_chunk_is_not_only_summed() -> None:
    # safe softmax (exp of a running max) and a 48-row chunk that 5 does not divide
    assert subtile_kernel(_kernel(plans.zoo_odd()), 2) is None
    assert subtile_kernel(_kernel(plans.rmsnorm_linear(tk=32)), 5) is None
    assert subtile_kernel(_kernel(plans.attention_fused()), 2) is None
    # a per-chunk dot that goes through exp before it is accumulated
    pb = plans.PlanBuilder("fixture-exp-of-partial")
    x, w = pb.buf([8, 64], "float32", "input"), pb.buf([64, 16], "float32", "input")
    o = pb.buf([8, 16], "float32", "output")
    kb = pb.kernel("expdot", [1], 2)
    part = kb.matmul(
        kb.load(x, [8, 32], d1=[("iter", 32)]), kb.load(w, [32, 16], d0=[("iter", 32)])
    )
    kb.store(o, kb.accum(kb.unary("exp", part)))
    assert subtile_kernel(_kernel(plans.Case("x", pb.plan, [], lambda: [])), 2) is None
    # a walking tile accumulated element by element (its shape is the chunk's)
    pb = plans.PlanBuilder("fixture-iter-of-chunk")
    x = pb.buf([8, 64], "float32", "input")
    o = pb.buf([8, 32], "float32", "output")
    kb = pb.kernel("chunksum", [1], 2)
    kb.store(o, kb.accum(kb.load(x, [8, 32], d1=[("iter", 32)])))
    assert subtile_kernel(_kernel(plans.Case("y", pb.plan, [], lambda: [])), 2) is None
    # the printer refuses a cut that does not apply, naming the kernel
    from yirage_triton import TritonOptions, generate_triton

    with pytest.raises(CodegenError, match=r"'odd'.*cannot be cut 2 ways"):
        generate_triton(plans.zoo_odd().plan, TritonOptions(subtile=(("odd", 2),)))


def test_backend_offers_the_finer_printing_for_big_chunks() -> None:
    """512-row chunks are cut to 128 rows, printed with 4 and 5 stages; 128-row chunks and
    the interpreter (which ignores stages) get no such variant."""
    from yirage_cuda import CudaBackend

    big = plans.rmsnorm_linear(b=16, h=4096, n=6144, tn=48, tk=512, dtype="float16")
    assert loop_subtile(_kernel(big)) == 4
    src = CudaBackend(cuda_cpp=False).codegen(big.plan)
    fine = {n: v for n, v in src.triton_variants.items() if n.startswith("triton_fine")}
    assert set(fine) == {"triton_fine", "triton_fine_deep"}
    assert {v.options.subtile for v in fine.values()} == {(("rms_mm", 4),)}
    assert fine["triton_fine"].options.max_stages == 4
    assert "tl.range(0, 0 + 32," in fine["triton_fine_deep"].text
    small = plans.rmsnorm_linear(b=16, h=4096, n=6144, tn=48, tk=128, dtype="float16")
    assert loop_subtile(_kernel(small)) == 1
    assert not any(
        n.startswith("triton_fine")
        for n in CudaBackend(cuda_cpp=False).codegen(small.plan).triton_variants
    )
    interp = CudaBackend(interpret=True, cuda_cpp=False).codegen(big.plan)
    assert not any(n.startswith("triton_fine") for n in interp.triton_variants)
