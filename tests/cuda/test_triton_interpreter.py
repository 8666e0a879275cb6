"""Every generated Triton kernel of the fixture plans runs in the Triton interpreter (CPU
tensors, no GPU) through the backend's codegen → compile → load, and matches float64
references: the workload's own formula and the plan executed by _plan_ref."""

from __future__ import annotations

from typing import Any

import numpy as np
import plans
import pytest
from _plan_ref import run_plan
from conftest import needs_triton

pytestmark = needs_triton

# relative Frobenius error allowed per input dtype (fp16/bf16 inputs are rounded first, the
# reference sees the rounded values; kernels accumulate in fp32)
TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}
DTYPES = ("float32", "float16", "bfloat16")
CASES = [(dt, c) for dt in DTYPES for c in plans.small_cases(dt)]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "non-finite output"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_case(
    backend: Any, case: plans.Case, seed: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    kernel = backend.load(backend.compile(backend.codegen(case.plan)))
    xs = case.random_inputs(seed)
    tensors = backend.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    outs = kernel(*tensors)
    rounded = [t.double().numpy() for t in tensors]
    return [o.double().numpy() for o in outs], rounded


@pytest.mark.parametrize("dtype,case", CASES, ids=[f"{dt}-{c.name}" for dt, c in CASES])
def test_interpreter_matches_float64(interp: Any, dtype: str, case: plans.Case) -> None:
    outs, xs = run_case(interp, case)
    for o, r, b in zip(
        outs,
        case.reference(*xs),
        [b for b in case.plan["buffers"] if b["role"] == "output"],
        strict=True,
    ):
        assert rel_err(o, r) <= TOL[dtype], (case.name, b["id"])
    if dtype == "float32":
        for o, r in zip(outs, run_plan(case.plan, xs), strict=True):
            assert rel_err(o, r) <= TOL[dtype]


def test_safe_softmax_survives_scores_that_overflow_exp(interp: Any) -> None:
    """Scores of several hundred: exp without the running max overflows fp32."""
    case = plans.attention_fused(scale=60.0)
    outs, xs = run_case(interp, case, seed=3)
    s = xs[0] @ xs[1] * 60.0
    assert s.max() > 100.0  # exp(s) alone would be inf in fp32
    assert rel_err(outs[0], case.reference(*xs)[0]) <= 1e-4


def test_running_max_rescales_across_iterations(interp: Any) -> None:
    """A late block with much larger scores must rescale what earlier iterations summed."""
    case = plans.attention_fused(scale=4.0)
    kernel = interp.load(interp.compile(interp.codegen(case.plan)))
    xs = case.random_inputs(5)
    xs[1][:, :, -32:] *= 8.0  # the last loop iteration sees the largest scores
    tensors = interp.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    out = kernel(*tensors)[0].double().numpy()
    assert rel_err(out, case.reference(*[t.double().numpy() for t in tensors])[0]) <= 1e-4


@pytest.mark.parametrize("tile_n,tile_k", [(20, 24), (12, 48), (40, 8)])
def test_non_power_of_two_tiles(interp: Any, tile_n: int, tile_k: int) -> None:
    """Padded blocks: loads/stores masked, K padding masked out of tl.dot, rms over the
    logical extent only."""
    case = plans.rmsnorm_linear(
        b=6, h=96 if 96 % tile_k == 0 else tile_k * 4, n=tile_n * 3, tn=tile_n, tk=tile_k
    )
    outs, xs = run_case(interp, case)
    assert rel_err(outs[0], case.reference(*xs)[0]) <= TOL["float32"]


def test_interpreted_source_is_the_printed_module(interp: Any) -> None:
    case = plans.gated_mlp()
    src = interp.codegen(case.plan)
    kernel = interp.load(interp.compile(src))
    assert kernel.source == src.code
    assert "@triton.jit" in src.code and "tl.dot(" in src.code and "def launch(inputs):" in src.code
    assert kernel.variant == "triton" and kernel.interpret


def test_dot_operand_with_an_elementwise_user_is_loaded_twice(interp: Any) -> None:
    """RMSNorm's X tile feeds tl.dot and the sum of squares: the squares read their own copy
    (one shared load left the H100 loop unpipelined); gated MLP's X feeds dots only."""
    loop_loads = {}
    for case in (plans.rmsnorm_linear(), plans.gated_mlp()):
        code = interp.codegen(case.plan).code
        body = code.split("for it in tl.range(", 1)[1].split("\n    t", 1)[0]
        loop_loads[case.name] = [
            ln.split("=")[0].strip() for ln in body.splitlines() if "tl.load(" in ln
        ]
    assert loop_loads["rmsnorm_linear"] == ["t0", "t0e", "t1"]
    assert loop_loads["gated_mlp"] == ["t0", "t1", "t2"]
    outs, xs = run_case(interp, plans.rmsnorm_linear())
    assert rel_err(outs[0], plans.rmsnorm_linear().reference(*xs)[0]) <= TOL["float32"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("h,split", [(512, 1), (500, 1), (512, 4), (500, 3)])
def test_rms_of_a_dot_operand_is_a_gram_diagonal(dtype: str, h: int, split: int) -> None:
    """RMSNorm's 16-bit X tile feeds tl.dot twice, X @ W and X @ Xᵀ, whose diagonal is the
    rows' sum of squares: one load per tile, none in registers; masked (h 500 in tiles of
    32) and split loops included. A float32 graph keeps the elementwise sum (a dot would
    round X to tf32). Every printing matches the float64 reference."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    case = plans.rmsnorm_linear(h=h, dtype=dtype)
    splits = (("rms_mm", split),) if split > 1 else ()
    opts = TritonOptions(bf16_dot_as_fp32=True, split_loop=splits)
    be = CudaBackend(interpret=True, cuda_cpp=False, triton_options=opts)
    code = be.codegen(case.plan).code
    body = code.split("for it in tl.range(", 1)[1].split("\n    t", 1)[0]
    loads = [ln.split("=")[0].strip() for ln in body.splitlines() if "tl.load(" in ln]
    if dtype == "float32":
        assert "tl.trans(" not in code and loads == ["t0", "t0e", "t1"], code
    else:
        x = "t0.to(tl.float32)" if dtype == "bfloat16" else "t0"
        assert f"tl.dot({x}, tl.trans({x}), acc" in code, code
        assert loads == ["t0", "t1"] and "t0e" not in code, code
        assert code.count("tl.sum(tl.where(tl.arange(0, 16)[:, None] == ") == 1, code
    outs, xs = run_case(be, case, seed=4)
    assert rel_err(outs[0], case.reference(*xs)[0]) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_normalised_dot_operand_is_scaled_after_the_dot(dtype: str) -> None:
    """qknorm's K tile divided by its row norms feeds tl.dot raw and the scores are divided
    instead (the tile streams into the dot; its sum of squares reads a second copy); with
    ``scale_after_dot`` off the quotient is printed as before. Both match the reference."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    case = plans.gqa_decode(qk_norm=True, dtype=dtype)
    backends = {
        on: CudaBackend(
            interpret=True,
            triton_options=TritonOptions(scale_after_dot=on, bf16_dot_as_fp32=True),
        )
        for on in (True, False)
    }
    code = {
        on: be.codegen(case.plan).code.split("def attn_combine")[0] for on, be in backends.items()
    }
    scores = {
        on: next(ln for ln in c.splitlines() if "tl.dot(" in ln and "tl.full(" not in ln)
        for on, c in code.items()
    }
    # t2: the K tile's load; t6: its row norms; t7: the quotient, printed only when off
    assert ", t2)" in scores[True] or ", t2," in scores[True]  # the K tile as loaded
    assert "* (1.0 / (t6))" in scores[True]
    assert "t7 =" not in code[True] and "t2e = tl.load(" in code[True]
    # t4: the sum of squares over d; in a 16-bit graph a tl.dot with ones whose 16 rows all
    # hold the sums, in an fp32 graph a tl.sum
    sums = next(ln.strip() for ln in code[True].splitlines() if ln.strip().startswith("t4 ="))
    if dtype == "float16":
        assert "tl.dot(tl.full([16, 64], 1.0, tl.float32), s" in sums, sums
    else:
        assert sums.startswith("t4 = tl.sum("), sums
    assert "(t7)" in scores[False] or "t7," in scores[False]
    assert "t2e = " not in code[False]
    for be in backends.values():
        outs, xs = run_case(be, case, seed=2)
        assert rel_err(outs[0], case.reference(*xs)[0]) <= TOL[dtype]


def test_norm_sums_on_tensor_cores_and_one_load_without_pipeline() -> None:
    """The fp16 sum of squares goes to tl.dot with tf32 operands (the interpreter multiplies
    in fp32; tf32's rounding happens on a GPU only, where the cuda tests check it); printed
    with one pipeline stage the K tile is loaded once, its squares read the dot operand's
    copy, and the result matches the reference."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    case = plans.gqa_decode(qk_norm=True, dtype="float16")
    one_stage = TritonOptions(scale_after_dot=True, bf16_dot_as_fp32=True, num_stages=1)
    be = CudaBackend(interpret=True, triton_options=one_stage)
    code = be.codegen(case.plan).code
    sums = "tl.dot(tl.full([16, 64], 1.0, tl.float32), s2, input_precision='tf32')"
    assert sums in code, code
    assert "t2e" not in code and "t3 = t2.to(tl.float32) * t2.to(tl.float32)" in code, code
    outs, xs = run_case(be, case, seed=3)
    assert rel_err(outs[0], case.reference(*xs)[0]) <= TOL["float16"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scaled_dot_with_padded_tiles(dtype: str) -> None:
    """d = 48 and kv tiles of 40 are padded to 64: the divisor's padded lanes read 1, so the
    scaled scores stay finite and the result matches the reference."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    case = plans.gqa_decode(qk_norm=True, dtype=dtype, d=48, kv_len=480, splits=4, tl=40, group=3)
    opts = TritonOptions(bf16_dot_as_fp32=True, scale_after_dot=True)
    be = CudaBackend(interpret=True, triton_options=opts)
    code = be.codegen(case.plan).code
    scores = next(ln for ln in code.splitlines() if "tl.dot(" in ln and "tl.full(" not in ln)
    assert "* (1.0 / ((tl.where((tl.arange(0, 64) < 40)" in scores, scores
    outs, xs = run_case(be, case, seed=1)
    assert rel_err(outs[0], case.reference(*xs)[0]) <= TOL[dtype]
