"""Split-KV partials carried shifted across kernels (docs/kernel-plan.md, ``shift_store`` /
``shift_load`` / ``shift_carry``) in the Triton printer, run in the Triton interpreter (no
GPU) against float64: whole and split printings stay finite and exact where logits are far
beyond fp32's exp range (un-shifting the partials by exp(m) overflowed to inf and the
combine's inf/inf gave NaN); the CUDA C++ printing too, built for the host. The GPU-marked
test superoptimizes attention with std-3 inputs on the device."""

from __future__ import annotations

from typing import Any

import numpy as np
import plans
import pytest
from _plan_ref import run_plan
from _search_graphs import H100, attention, generated, plan_of, search
from conftest import needs_triton

from yirage_cuda._cuda_codegen import generate_cuda
from yirage_cuda._emulate import EmulatedCudaCpp, host_compiler

# scores of several hundred carry fp32 rounding of ~1e-5 into the softmax weights
TOL = 1e-4


def _attention64(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s = (q @ kt) * scale
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def _err(a: np.ndarray, b: np.ndarray) -> float:
    assert np.isfinite(a).all(), "non-finite output"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _run(backend: Any, plan: Any, xs: list[np.ndarray], dtypes: list[str]) -> dict[str, Any]:
    """Outputs of every variant the backend prints for ``plan`` (float64 numpy), and the
    inputs as the kernels saw them."""
    kernel = backend.load(backend.compile(backend.codegen(plan)))
    tensors = backend.from_numpy([x.astype(np.float32) for x in xs], dtypes)
    outs = {
        name: [o.double().cpu().numpy() for o in var(*tensors)]
        for name, var in kernel.variants.items()
    }
    return {"outs": outs, "xs": [t.double().cpu().numpy() for t in tensors]}


def _split_backend(combine: str, last_block: bool) -> Any:
    """The interpreter backend printing the producer's loop split 2 ways, and the combine's
    too where it has a loop."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    splits = (("attn_split", 2), ("attn_combine", 2)) if combine == "loop" else (("attn_split", 2),)
    opts = TritonOptions(split_loop=splits, last_block_combine=last_block)
    return CudaBackend(interpret=True, cuda_cpp=False, triton_options=opts)


@needs_triton
@pytest.mark.parametrize("combine", ["loop", "dimx"])
@pytest.mark.parametrize("printing", ["whole", "last_block", "combine_kernel"])
def test_gqa_partials_stay_finite_beyond_the_exp_range(
    interp: Any, combine: str, printing: str
) -> None:
    """The hand-written split-KV plan with scores up to several hundred, the last KV split's
    far above the others (every part rescales to it); printed whole, and with the kernels'
    loops split again by the printer (the producer's part maxima and the combine's running
    max are combined like any safe-softmax group's)."""
    case = plans.gqa_decode(splits=4, kv_len=512, tl=64, combine=combine)
    xs = case.random_inputs(2)
    xs[0] *= 200.0
    xs[1][:, :, -128:] *= 3.0
    dtypes = [d for _, d in case.inputs]
    be = interp if printing == "whole" else _split_backend(combine, printing == "last_block")
    got = _run(be, case.plan, xs, dtypes)
    q, kt, v = got["xs"]
    scores = q @ kt / np.sqrt(q.shape[-1])
    assert scores.max() > 200  # exp(m) of a partial overflows float32 past ~88
    want = _attention64(q, kt, v, 1.0 / np.sqrt(q.shape[-1]))
    assert got["outs"], "no variant was printed"
    for name, (out,) in got["outs"].items():
        assert _err(out, want) <= TOL, name
    (ref,) = run_plan(case.plan, got["xs"])
    assert _err(ref, want) <= 1e-12


@needs_triton
def test_searched_split_kv_candidates_with_std3_inputs(interp: Any) -> None:
    """Every split-KV candidate the search offers for attention, with inputs of std 3
    (logits beyond 150), printed for the interpreter (whole and split) and run."""
    b, m, d, n = 2, 16, 32, 1024
    res = search(attention(b, m, d, n), device_spec=H100, cache=False, top_k=64)
    carried = [c for c in res.candidates if any("shift_carry" in k for k in generated(plan_of(c)))]
    assert carried, "the search offers no split-KV candidate"
    rng = np.random.default_rng(5)
    xs = [
        3 * rng.standard_normal((b, m, d)),
        3 * rng.standard_normal((b, d, n)),
        rng.standard_normal((b, n, d)),
    ]
    for c in carried[:4]:  # the interpreter is slow; the CPU tests run them all
        got = _run(interp, c.kernel_plan(), xs, ["float32"] * 3)
        q, kt, v = got["xs"]
        assert (q @ kt).max() > 150
        want = _attention64(q, kt, v, 1.0)
        for name, (out,) in got["outs"].items():
            assert _err(out, want) <= TOL, (c.label, name)


@needs_triton
@pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler (g++/c++/clang++)")
@pytest.mark.parametrize("combine", ["loop", "dimx"])
def test_cuda_cpp_emulation_of_shifted_partials(interp: Any, combine: str) -> None:
    """The CUDA C++ printing of the same plan, built for the host (its emulation branch),
    stays finite and exact with scores of several hundred."""
    case = plans.gqa_decode(splits=4, kv_len=512, tl=64, combine=combine)
    src = generate_cuda(case.plan)
    assert "carrymax" in src.text and "store the row max" in src.text
    xs = case.random_inputs(2)
    xs[0] *= 200.0
    xs[1][:, :, -128:] *= 3.0
    tensors = interp.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    (out,) = EmulatedCudaCpp(src).launcher()(*tensors)
    q, kt, v = (t.double().numpy() for t in tensors)
    assert (q @ kt).max() / np.sqrt(q.shape[-1]) > 200
    assert _err(out.double().numpy(), _attention64(q, kt, v, 1.0 / np.sqrt(q.shape[-1]))) <= TOL


@needs_triton
def test_plan_checks_of_the_shift_fields() -> None:
    """The plan reader refuses a version-1 plan (it lacks the analyses of version 3), a
    shifted input without its shift_carry, and maxima that do not cover the input tile."""
    import copy

    from yirage.plan import PlanError, parse_plan

    case = plans.gqa_decode(combine="loop")
    parse_plan(case.plan)
    old = copy.deepcopy(case.plan)
    old["version"] = 1
    with pytest.raises(PlanError, match="lower the graph again"):
        parse_plan(old)
    bad = copy.deepcopy(case.plan)
    del bad["kernels"][1]["shift_carry"]
    with pytest.raises(PlanError, match="no shift_carry"):
        parse_plan(bad)
    bad = copy.deepcopy(case.plan)
    bad["kernels"][1]["inputs"][0]["shift_load"]["width"] = 32
    with pytest.raises(PlanError, match="does not cover"):
        parse_plan(bad)
    bad = copy.deepcopy(case.plan)
    del bad["kernels"][0]["safe_softmax"][0]["shift_store"]
    with pytest.raises(PlanError, match="needs a shift_store"):
        parse_plan(bad)


@pytest.mark.cuda
def test_superoptimized_attention_with_std3_inputs_on_the_gpu(gpu: Any) -> None:
    """Attention Q[32,16,64]·K[32,64,4096]·V with inputs of std 3 (logits up to ~300):
    the superoptimized kernel and every split-KV candidate of the search, in every printing
    the backend builds, are finite and match float64."""
    import torch

    import yirage as yr

    b, m, d, n = 32, 16, 64, 4096
    g = attention(b, m, d, n)
    rng = np.random.default_rng(7)
    xs = [
        3 * rng.standard_normal((b, m, d)),
        3 * rng.standard_normal((b, d, n)),
        rng.standard_normal((b, n, d)),
    ]
    tensors = [torch.tensor(x, dtype=torch.float32, device="cuda") for x in xs]
    q, kt, v = (t.double().cpu().numpy() for t in tensors)
    assert (q @ kt).max() > 200
    want = _attention64(q, kt, v, 1.0)
    kernel = yr.superoptimize(g, backend=gpu, top_k=8, cache=False, time_limit=60)
    (out,) = kernel(*tensors)
    assert _err(out.double().cpu().numpy(), want) <= 1e-4, kernel.report
    res = search(g, device_spec=H100, cache=False, top_k=64)
    carried = [c for c in res.candidates if any("shift_carry" in k for k in generated(plan_of(c)))]
    assert carried, "the search offers no split-KV candidate"
    for c in carried[:4]:
        got = _run(gpu, c.kernel_plan(), xs, ["float32"] * 3)
        for name, (o,) in got["outs"].items():
            assert _err(o, want) <= 1e-4, (c.label, name)
