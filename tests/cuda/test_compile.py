"""Every printed kernel compiles for the H100 (sm_90) without a GPU: Triton kernels through
``triton.compile`` with a CUDA target (Triton ships ptxas), CUDA C++ kernels to a cubin with
NVRTC (cuda-python's ``cuda.bindings.nvrtc``; skipped with the reason when not importable).
Covers the CI-size fixtures in fp32/fp16/bf16 and the bench workloads at full size."""

from __future__ import annotations

import plans
import pytest
from conftest import needs_triton

import yirage_triton
from yirage.plan import CodegenError, parse_plan
from yirage_cuda import _toolchain
from yirage_cuda._cuda_codegen import CudaCppOptions, generate_cuda
from yirage_triton import TritonOptions, generate_triton

SMALL = [c for dt in ("float32", "float16", "bfloat16") for c in plans.small_cases(dt)]
TARGETS = plans.target_cases("float16") + plans.target_cases("bfloat16")[:1]
ALL = SMALL + TARGETS


def _id(c: plans.Case) -> str:
    return f"{c.plan['buffers'][0]['dtype']}-{c.name}"


needs_nvrtc = pytest.mark.skipif(
    not _toolchain.nvrtc_available(),
    reason="NVRTC not importable (pip install cuda-python provides cuda.bindings.nvrtc)",
)


@needs_triton
@pytest.mark.parametrize("case", ALL, ids=[_id(c) for c in ALL])
def test_triton_kernels_compile_for_sm90(case: plans.Case) -> None:
    src = generate_triton(case.plan, TritonOptions(smem_limit=227 * 1024))
    path = yirage_triton.write_triton_module(src.text, src.codegen_version)
    module = yirage_triton.load_triton_module(path, interpret=False)
    info = yirage_triton.aot_compile_triton(
        module, {b.id: b.dtype for b in src.plan.buffers}, arch=90
    )
    assert set(info) == {k.name for k in src.plan.generated}
    for k in info.values():
        assert k["binary_bytes"] > 0
        assert k["shared"] <= 227 * 1024


SPLIT_TARGETS = [
    c
    for c in plans.target_cases("float16")
    if any(k.loop_split > 1 for k in parse_plan(c.plan).generated)
]


@needs_triton
@pytest.mark.parametrize("case", SPLIT_TARGETS, ids=[_id(c) for c in SPLIT_TARGETS])
def test_split_kernels_compile_for_sm90(case: plans.Case) -> None:
    """The split printings of the full-size workloads (as the backend prints them for an
    H100's 132 SMs: parts, arrival counter and the in-kernel combine) compile too, and so
    does the scaled-dot printing where it differs (qknorm_gqa)."""
    plan = parse_plan(case.plan)
    splits = tuple((k.name, k.loop_split) for k in plan.generated if k.loop_split > 1)
    texts: set[str] = set()
    for scaled in (False, True):
        opts = TritonOptions(smem_limit=227 * 1024, split_loop=splits, scale_after_dot=scaled)
        src = generate_triton(plan, opts)
        if src.text in texts:
            continue
        texts.add(src.text)
        path = yirage_triton.write_triton_module(src.text, src.codegen_version)
        module = yirage_triton.load_triton_module(path, interpret=False)
        dtypes = {b.id: b.dtype for b in plan.buffers}
        info = yirage_triton.aot_compile_triton(module, dtypes, arch=90)
        assert set(info) == {k.name for k in plan.generated}
        assert all(k["binary_bytes"] > 0 for k in info.values())
    assert len(texts) == (2 if case.workload == "qknorm_gqa" else 1)


@needs_nvrtc
@pytest.mark.parametrize("mma", [True, False], ids=["mma", "fma"])
@pytest.mark.parametrize("case", ALL, ids=[_id(c) for c in ALL])
def test_cuda_cpp_kernels_compile_with_nvrtc(case: plans.Case, mma: bool) -> None:
    src = generate_cuda(case.plan, CudaCppOptions(arch="sm_90", use_mma=mma))
    compiled = _toolchain.compile_cuda(src.text, "sm_90", case.name)
    assert compiled.cubin[:4] == b"\x7fELF"
    assert ".target sm_90" in compiled.ptx
    for k in src.plan.generated:
        assert f".entry {k.name}(" in compiled.ptx
        assert src.kernels[k.name]["smem"] <= 227 * 1024
    has_matmul = any(o.op == "matmul" for k in src.plan.generated for o in k.ops)
    if mma and has_matmul and src.plan.compute_dtype != "float32":
        assert "mma.sync.aligned.m16n8k16" in compiled.ptx
    # cached: a second compile is a hit with identical bytes
    again = _toolchain.compile_cuda(src.text, "sm_90", case.name)
    assert again.cubin == compiled.cubin and again.path == compiled.path


@needs_nvrtc
def test_nvrtc_errors_carry_the_log() -> None:
    with pytest.raises(_toolchain.ToolchainError, match="NVRTC rejected") as err:
        _toolchain.compile_cuda('extern "C" __global__ void f() { undefined_thing(); }', "sm_90")
    assert "undefined_thing" in str(err.value)


@needs_nvrtc
def test_nvrtc_output_buffers_are_not_shared_objects() -> None:
    """A kernel that compiles without warnings has a 1-byte log; NVRTC writes its NUL into
    the buffer we pass, which must not be CPython's shared ``b" "`` (that corrupted every
    later one-byte space in the process, e.g. print's separator)."""
    for _ in range(2):
        _toolchain._nvrtc_compile(
            'extern "C" __global__ void k(float* x) { x[0] = 1.f; }', "sm_90", "k"
        )
    # compare code points: a corrupted singleton would compare equal to itself
    assert "a b".encode("ascii")[1] == 32 and bytes([32])[0] == 32


def test_cuda_printer_refuses_tiles_beyond_shared_memory() -> None:
    case = plans.rmsnorm_linear(b=8, h=4096, n=6144, tn=1024, tk=512, dtype="float16")
    with pytest.raises(CodegenError, match="shared memory"):
        generate_cuda(case.plan, CudaCppOptions(smem_limit=64 * 1024))


def test_sources_are_deterministic() -> None:
    for case in plans.small_cases("float16"):
        p = parse_plan(case.plan)
        assert generate_triton(p).text == generate_triton(case.plan).text
        assert generate_cuda(p).text == generate_cuda(case.plan).text


def test_toolchain_versions_never_raise() -> None:
    versions = _toolchain.toolchain_versions()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items())
