"""Programmatic dependent launch (PDL) in the Triton printing, without a GPU: every kernel of
a PDL printing waits on the grids before it as its first statement (before any global memory
access, so it may read what they wrote) and every launch asks for PDL; the PTX for sm_90
carries the wait; the backend turns PDL on only on sm_90+ with a Triton that prints it and
for plans other than attention, and ``YIRAGE_CUDA_PDL=0`` turns it off. That chained PDL
launches stay correct on the device is tested in ``test_gpu.py``."""

from __future__ import annotations

import ast
from typing import Any

import plans
import pytest
from conftest import needs_triton

import yirage_triton
from yirage.plan import parse_plan
from yirage_cuda import CudaBackend, _backend, _toolchain
from yirage_triton import TritonOptions, generate_triton

TARGETS = plans.target_cases("float16")
WAIT = "tl.extra.cuda.gdc_wait()"
RELEASE = "tl.extra.cuda.gdc_launch_dependents()"


def _printings(case: plans.Case, pdl: bool) -> list[TritonOptions]:
    """The plain printing and, where the backend splits a loop, both split printings."""
    plan = parse_plan(case.plan)
    splits = tuple((k.name, k.loop_split) for k in plan.generated if k.loop_split > 1)
    out = [TritonOptions(pdl=pdl)]
    if splits:
        out.append(TritonOptions(pdl=pdl, split_loop=splits))
        out.append(TritonOptions(pdl=pdl, split_loop=splits, last_block_combine=False))
    return out


def _kernels(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module's ``@triton.jit`` kernels (launched ones take NUM_STAGES; helpers do not)."""
    return [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and any(ast.unparse(d) == "triton.jit" for d in f.decorator_list)
        and any(a.arg == "NUM_STAGES" for a in f.args.args)
    ]


def _launches(tree: ast.Module, names: set[str]) -> list[ast.Call]:
    """Every ``kernel[grid](...)`` call and ``kernel.warmup(...)`` of one of ``names``."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Subscript) and ast.unparse(f.value) in names:
            out.append(node)
        elif isinstance(f, ast.Attribute) and f.attr == "warmup" and ast.unparse(f.value) in names:
            out.append(node)
    return out


@pytest.mark.parametrize("case", TARGETS, ids=[c.name for c in TARGETS])
def test_pdl_printing_waits_first_and_every_launch_asks_for_it(case: plans.Case) -> None:
    for opts in _printings(case, pdl=True):
        tree = ast.parse(generate_triton(case.plan, opts).text)
        kernels = _kernels(tree)
        assert kernels
        for f in kernels:
            first = [ast.unparse(s) for s in f.body[:2]]
            assert first == [WAIT, RELEASE], f"{f.name}: {first}"
            waits = [s for s in ast.walk(f) if isinstance(s, ast.Expr) and ast.unparse(s) == WAIT]
            assert len(waits) == 1
        launches = _launches(tree, {f.name for f in kernels})
        # each kernel is launched once and warmed once
        assert len(launches) == 2 * len(kernels)
        for call in launches:
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
            assert kw.get("launch_pdl") == "True", ast.unparse(call)


@pytest.mark.parametrize("case", TARGETS, ids=[c.name for c in TARGETS])
def test_printing_without_pdl_has_no_trace_of_it(case: plans.Case) -> None:
    for with_pdl, without in zip(
        _printings(case, pdl=True), _printings(case, pdl=False), strict=True
    ):
        text = generate_triton(case.plan, without).text
        assert "gdc_" not in text and "launch_pdl" not in text
        assert without.key() != with_pdl.key()
        assert generate_triton(case.plan, with_pdl).text != text


@needs_triton
def test_pdl_kernels_compile_with_the_wait_in_their_ptx() -> None:
    case = plans.rmsnorm_linear(b=16, h=4096, n=6144, tn=48, tk=128, dtype="float16")
    dtypes = {b.id: b.dtype for b in parse_plan(case.plan).buffers}
    for pdl in (True, False):
        src = generate_triton(case.plan, TritonOptions(smem_limit=227 * 1024, pdl=pdl))
        path = yirage_triton.write_triton_module(src.text, src.codegen_version)
        module = yirage_triton.load_triton_module(path, interpret=False)
        info = yirage_triton.aot_compile_triton(module, dtypes, arch=90)
        assert [k["pdl"] for k in info.values()] == [pdl] * len(info)


def _device(cc: tuple[int, int]) -> _toolchain.DeviceInfo:
    return _toolchain.DeviceInfo(
        index=0,
        name="fake",
        cc=cc,
        sm_count=132,
        smem_per_block_optin=227 * 1024,
        smem_per_sm=228 * 1024,
        l2_bytes=50 * 2**20,
        warp_size=32,
        total_memory=80 * 2**30,
    )


def test_backend_turns_pdl_on_only_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("YIRAGE_CUDA_PDL", raising=False)
    triton_pdl = [True]
    monkeypatch.setattr(_backend, "triton_has_pdl", lambda: triton_pdl[0])
    device: list[Any] = [_device((9, 0))]
    monkeypatch.setattr(_toolchain, "device_info", lambda index=None: device[0])
    be = CudaBackend(cuda_cpp=False)
    assert be.use_pdl()
    text = be.codegen(plans.rmsnorm_linear(dtype="float16").plan).triton.text
    assert WAIT in text and "launch_pdl=True" in text

    # not for attention plans (measured slower or level on the H100)
    assert "gdc_" not in be.codegen(plans.gqa_decode(dtype="float16").plan).triton.text

    monkeypatch.setenv("YIRAGE_CUDA_PDL", "0")
    assert not be.use_pdl()
    assert "gdc_" not in be.codegen(plans.rmsnorm_linear(dtype="float16").plan).triton.text
    monkeypatch.delenv("YIRAGE_CUDA_PDL")

    device[0] = _device((8, 0))  # Ampere has no griddepcontrol
    assert not be.use_pdl()
    device[0] = None  # no GPU
    assert not be.use_pdl()
    device[0] = _device((9, 0))
    triton_pdl[0] = False  # a Triton without gdc_wait
    assert not be.use_pdl()
    triton_pdl[0] = True
    assert not CudaBackend(interpret=True).use_pdl()
