"""GPU tests (``pytest -m cuda tests/cuda``; skipped without a GPU unless
YIRAGE_REQUIRE_DEVICE=1): every variant (Triton, CUDA C++ with tensor-core MMA, CUDA C++
with FMA) of every fixture plan on the device against float64 references; the bench
workloads at full size in fp16 against an fp32 reference; profiling with CUDA events and
CUDA-graph replay; and, once the search is available, every candidate it emits."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import plans
import pytest

pytestmark = pytest.mark.cuda

TOL = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 2e-2}
DTYPES = ("float32", "float16", "bfloat16")
SMALL = [(dt, c) for dt in DTYPES for c in plans.small_cases(dt)]
VARIANTS = ("triton", "cuda-mma", "cuda-fma")


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    if not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def build(variant: str, plan: dict[str, Any]) -> Any:
    """(backend, kernel) with ``variant`` active: "triton", "cuda-mma" or "cuda-fma"."""
    from yirage_cuda import CudaBackend, _toolchain
    from yirage_cuda._cuda_codegen import CudaCppOptions

    copts = None
    if variant != "triton":
        info = _toolchain.device_info()
        assert info is not None
        copts = CudaCppOptions(
            arch=info.arch, smem_limit=info.smem_per_block_optin, use_mma=variant == "cuda-mma"
        )
    be = CudaBackend(cuda_cpp=variant != "triton", cuda_options=copts)
    art = be.compile(be.codegen(plan))
    kernel = be.load(art)
    if variant != "triton":
        if "cuda" not in kernel.variants:
            pytest.fail(f"CUDA C++ variant did not build: {art.cuda_error or kernel.notes}")
        kernel.variant = "cuda"
    return be, kernel


def run(
    be: Any, kernel: Any, case: plans.Case, seed: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    xs = case.random_inputs(seed)
    tensors = be.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    outs = kernel(*tensors)
    import torch

    torch.cuda.synchronize()
    for o in outs:
        assert o.device == tensors[0].device
    return [o.double().cpu().numpy() for o in outs], [t.double().cpu().numpy() for t in tensors]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype,case", SMALL, ids=[f"{dt}-{c.name}" for dt, c in SMALL])
def test_fixtures_on_the_gpu(gpu: Any, variant: str, dtype: str, case: plans.Case) -> None:
    be, kernel = build(variant, case.plan)
    outs, xs = run(be, kernel, case)
    for o, r in zip(outs, case.reference(*xs), strict=True):
        assert rel_err(o, r) <= TOL[dtype]


def test_cuda_cpp_kernels_launch_from_a_thread_without_a_context(gpu: Any) -> None:
    """The driver launches into the calling thread's current context. A thread that made no
    CUDA runtime call of its own (a rank thread of a multi-device check) has none: the
    launcher makes the device's primary context current there (it failed with
    CUDA_ERROR_INVALID_CONTEXT, and every CUDA C++ variant of a multi-device graph was lost)."""
    import threading

    case = SMALL[0][1]
    be, kernel = build("cuda-fma", case.plan)
    xs = case.random_inputs(0)
    tensors = be.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    want = [o.double().cpu().numpy() for o in kernel(*tensors)]  # loads the function here
    got: list[Any] = []

    def other_thread() -> None:
        try:
            got.append(kernel(*tensors))
        except Exception as exc:
            got.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert not isinstance(got[0], Exception), got[0]
    for o, w in zip(got[0], want, strict=True):
        np.testing.assert_array_equal(o.double().cpu().numpy(), w)


TARGETS = plans.target_cases("float16")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", TARGETS, ids=[c.name for c in TARGETS])
def test_targets_full_size_fp16(gpu: Any, variant: str, case: plans.Case) -> None:
    """fp16 kernels against an fp32 reference on the same (fp16-rounded) inputs."""
    import torch

    from yirage._workloads import get_workload

    _, kernel = build(variant, case.plan)
    wl = get_workload(case.workload or "")
    tensors = wl.inputs(case.preset or "gpu", device="cuda", seed=1)
    outs = kernel(*tensors)
    ref = wl.reference(*[t.float() for t in tensors])
    torch.cuda.synchronize()
    for o, r in zip(outs, ref, strict=True):
        assert o.dtype == torch.float16 and tuple(o.shape) == tuple(r.shape)
        err = float((o.float() - r).norm() / r.norm())
        assert err <= 1e-2, err


def test_profile_graph_replay_of_every_variant(gpu: Any) -> None:
    """profile times the launcher it is given with graph replay; every variant's launcher
    (the C++ one included, once compiled) profiles, and profile chooses nothing."""
    case = TARGETS[1]  # rmsnorm_linear_b8
    from yirage._workloads import get_workload

    src = gpu.codegen(case.plan)
    kernel = gpu.load(gpu.compile(src))
    tensors = get_workload("rmsnorm_linear").inputs("gpu", device="cuda")
    variants = gpu.variants(kernel)
    assert "triton" in variants and ("cuda" in variants) == (src.cuda is not None), kernel.notes
    for name, launcher in variants.items():
        prof = gpu.profile(launcher, tensors, repeats=20, warmup=5)
        assert prof.graph_median_us is not None and 0 < prof.graph_median_us < 1e5, (name, prof)
        assert prof.graph_error is None and prof.method == "cuda events + cuda graph replay"
    assert kernel.variant == "triton"


def test_profiling_session_captures_once_and_replays(gpu: Any) -> None:
    """Inside a profiling session the first round runs the launcher eagerly (probe, timed
    launches, capture); later rounds only replay its graphs. The session is dropped on exit."""
    from yirage._workloads import get_workload

    kernel = gpu.load(gpu.compile(gpu.codegen(TARGETS[1].plan)))
    launcher = kernel.variants["triton"]
    calls = []
    original = launcher.run_unchecked

    def counted(inputs: Any) -> Any:
        calls.append(1)
        return original(inputs)

    launcher.run_unchecked = counted
    tensors = get_workload("rmsnorm_linear").inputs("gpu", device="cuda")
    opts = {"min_time_s": 0.01, "min_repeats": 3}
    with gpu.profiling_session():
        first = gpu.profile(kernel, tensors, **opts)
        eager = len(calls)
        second = gpu.profile(kernel, tensors, **opts)
        assert gpu._timing is not None
    assert eager > 0 and len(calls) == eager  # the second round did not call the launcher
    assert second.repeats == first.repeats and second.graph_median_us is not None
    assert gpu._timing is None
    gpu.profile(kernel, tensors, **opts)  # outside a session: captured afresh
    assert len(calls) > eager


def test_cuda_graph_capture_and_streams(gpu: Any) -> None:
    import torch

    case = plans.gqa_decode(dtype="float16")
    kernel = gpu.load(gpu.compile(gpu.codegen(case.plan)))
    static = gpu.random_inputs(kernel.input_specs, seed=1)
    expect = [o.clone() for o in kernel(*static)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel.run_unchecked(static)  # warm-up off the default stream, as capture requires
        on_side = kernel(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel.run_unchecked(static)
    fresh = gpu.random_inputs(kernel.input_specs, seed=2)
    for s, f in zip(static, fresh, strict=True):
        s.copy_(f)
    graph.replay()
    direct = kernel(*fresh)
    torch.cuda.synchronize()
    for a, b in zip(on_side, expect, strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3)
    for a, b in zip(captured, direct, strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-3)


def test_chained_pdl_launches_read_what_the_launch_before_wrote(gpu: Any) -> None:
    """Under programmatic dependent launch each kernel lets the next launch early; the next
    one's wait must hold it until the output it reads is written. Eight chained calls (each
    reads the output of the one before), eagerly and replayed from a CUDA graph, against the
    float64 chain."""
    import torch

    if not gpu.use_pdl():
        pytest.skip("this device or Triton has no programmatic dependent launch (sm_90+)")
    case = plans.rmsnorm_linear(b=8, h=512, n=512, dtype="float16")
    src = gpu.codegen(case.plan)
    assert "gdc_wait" in src.triton.text
    kernel = gpu.load(gpu.compile(src))
    x, w = gpu.random_inputs(kernel.input_specs, seed=3)
    w.mul_(512**-0.5)

    def chain(y: Any) -> Any:
        for _ in range(8):
            y = kernel.run_unchecked([y, w])[0]
        return y

    def reference(xv: np.ndarray) -> np.ndarray:
        wv = w.double().cpu().numpy()
        for _ in range(8):
            xv = case.reference(xv, wv)[0]
        return xv

    eager = chain(x)
    torch.cuda.synchronize()
    assert rel_err(eager.double().cpu().numpy(), reference(x.double().cpu().numpy())) < 1e-2
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(static)  # warm-up off the default stream, as capture requires
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(static)
    static.copy_(gpu.random_inputs(kernel.input_specs, seed=4)[0])
    graph.replay()
    torch.cuda.synchronize()
    expect = reference(static.double().cpu().numpy())
    assert rel_err(captured.double().cpu().numpy(), expect) < 1e-2


def test_inputs_on_another_device_or_cpu_are_refused(gpu: Any) -> None:
    import torch

    from yirage_triton import InputError

    case = plans.rmsnorm_linear(dtype="float16")
    kernel = gpu.load(gpu.compile(gpu.codegen(case.plan)))
    xs = gpu.random_inputs(kernel.input_specs)
    with pytest.raises(InputError, match=r"to\('cuda'\)"):
        kernel(xs[0].cpu(), xs[1])
    if torch.cuda.device_count() > 1:
        with pytest.raises(InputError, match="one device"):
            kernel(xs[0], xs[1].to("cuda:1"))


def test_self_check_on_hardware(gpu: Any) -> None:
    import yirage_cuda

    result = yirage_cuda.self_check(interpret=False, record=False)
    assert result["passed"], result
    assert {k.split("/")[1] for k in result["checks"]} >= {"triton"}


@pytest.mark.skipif(
    importlib.util.find_spec("yirage._search") is None, reason="yr.search not available yet"
)
@pytest.mark.parametrize(
    "name", ["rmsnorm_linear", "gated_mlp", "lora", "gqa_decode", "qknorm_gqa"]
)
def test_superoptimize_full_size_every_candidate_runs(gpu: Any, name: str) -> None:
    import yirage as yr
    from yirage._workloads import get_workload

    wl = get_workload(name)
    kernel = yr.superoptimize(wl.graph("gpu"), backend=gpu, top_k=8, cache=False, time_limit=15)
    bad = [c for c in kernel.report.candidates if c.status == "error"]
    assert not bad, "\n".join(f"#{c.index}: {c.error}" for c in bad)
    tensors = wl.inputs("gpu", device="cuda", seed=3)
    ref = wl.reference(*[t.float() for t in tensors])
    for o, r in zip(kernel(*tensors), ref, strict=True):
        assert float((o.float() - r).norm() / r.norm()) <= 1e-2


@pytest.mark.parametrize("variant", VARIANTS)
def test_misaligned_contiguous_views(gpu: Any, variant: str) -> None:
    """A contiguous view at an odd offset is not 16-byte aligned: results must not change."""
    import torch

    case = plans.gated_mlp(dtype="float16")
    _, kernel = build(variant, case.plan)
    xs = gpu.random_inputs(kernel.input_specs, seed=4)
    shifted = []
    for x in xs:
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        view = flat[1:].view(x.shape)
        view.copy_(x)
        assert view.is_contiguous() and view.data_ptr() % 16 != 0
        shifted.append(view)
    a, b = kernel(*xs)[0], kernel(*shifted)[0]
    torch.cuda.synchronize()
    assert torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3)


def test_matmul_fp32_straight_from_cublas(gpu: Any) -> None:
    """On CUDA the float32 result of a 16-bit library matmul comes from cuBLAS directly
    (``out_dtype``): closer to the float64 product than rounding to 16 bits and converting."""
    import torch

    from yirage_triton import matmul_fp32

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 4096, generator=gen).half()
    b = (torch.randn(4096, 512, generator=gen) / 64).half()
    ref = (a.double() @ b.double()).numpy()
    out = matmul_fp32(a.cuda(), b.cuda())
    assert out.dtype == torch.float32
    rounded = torch.matmul(a.cuda(), b.cuda()).float()
    assert rel_err(out.cpu().numpy(), ref) < rel_err(rounded.cpu().numpy(), ref)
    assert rel_err(out.cpu().numpy(), ref) < 1e-4
    batched = matmul_fp32(a.cuda().reshape(2, 4, 4096), b.cuda().expand(2, 4096, 512))
    assert batched.dtype == torch.float32
    assert rel_err(batched.reshape(8, 512).cpu().numpy(), ref) < 1e-4


def test_check_inputs_drawn_on_the_gpu(gpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The numeric check's inputs are drawn on the GPU, the same values for a seed; a warm
    superoptimize re-checks the cached kernel on them against the stored reference."""
    import torch
    from test_runtime import _draw_checks

    import yirage as yr
    from yirage import _superoptimize

    monkeypatch.setattr(_superoptimize, "_noisy", lambda spread: False)  # always cached

    _draw_checks(gpu, "cuda")
    assert torch.cuda.get_device_name() in gpu.check_input_generator()
    g = yr.new_kernel_graph()
    x = g.new_input((8, 1024), yr.float16)
    w = g.new_input((1024, 512), yr.float16)
    g.mark_output(g.matmul(g.rms_norm(x, (1024,)), w))
    cold = yr.superoptimize(g, backend=gpu, top_k=2, time_limit=15)
    warm = yr.superoptimize(g, backend=gpu, top_k=2, time_limit=15)
    assert warm.report.from_cache and warm.report.check_seed == cold.report.check_seed
    assert warm.report.max_rel_err is not None and warm.report.max_rel_err <= 1e-2


#: Loops their split does not divide (part p of S walks ⌊p·F/S⌋ .. ⌊(p+1)·F/S⌋): attention
#: over 6000 keys in 94 masked tiles of 64 (the form GQA decode at kv 6000 runs), and
#: RMSNorm + Linear over a hidden size of 4000 in 63 masked tiles of 64.
UNEVEN_GPU = [
    (plans.attention_fused(batch=32, rows=4, d=128, kv_len=6000, tl=64, dtype="float16"), 16),
    (plans.attention_fused(batch=32, rows=4, d=128, kv_len=6000, tl=64, dtype="float16"), 4),
    (plans.rmsnorm_linear(b=8, h=4000, n=1024, tn=64, tk=64, dtype="float16"), 8),
]


@pytest.mark.parametrize("case,split", UNEVEN_GPU, ids=["attn-94-s16", "attn-94-s4", "rms-63-s8"])
def test_uneven_splits_on_the_gpu(gpu: Any, case: plans.Case, split: int) -> None:
    """Split printings whose parts walk shares one iteration apart, compiled by Triton for
    the device, against float64 (a part kernel walking one iteration too many or too few is
    off by a whole tile of keys or of the hidden size)."""
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    (k,) = [k for k in case.plan["kernels"] if k["kind"] == "generated"]
    assert k["forloop_range"] % split, "fixture must not divide"
    be = CudaBackend(cuda_cpp=False, triton_options=TritonOptions(split_loop=((k["name"], split),)))
    kernel = be.load(be.compile(be.codegen(case.plan)))
    outs, xs = run(be, kernel, case)
    for o, r in zip(outs, case.reference(*xs), strict=True):
        assert rel_err(o, r) <= TOL["float16"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_baseline_as_fused_attention_on_the_gpu(gpu: Any, dtype: str) -> None:
    """The ``torch_sdpa`` printing of the search's attention baseline (a kv no tile divides)
    matches the float64 reference and profiles with graph replay."""
    import torch
    from _search_graphs import scaled_attention

    import yirage as yr

    heads, rows, d, kv = 4, 192, 128, 1031
    g = scaled_attention(heads, rows, d, kv, getattr(yr, dtype))
    res = yr.search(g, top_k=1, cache=False, max_kernel_ops=1)
    base = next(c for c in res.candidates if c.baseline)
    variants = gpu.variants(gpu.load(gpu.compile(gpu.codegen(base.kernel_plan()))))
    assert "torch_sdpa" in variants
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s in ((heads, rows, d), (heads, d, kv), (heads, kv, d))]
    tensors = [torch.from_numpy(x).to(getattr(torch, dtype)).cuda() for x in xs]
    (out,) = variants["torch_sdpa"](*tensors)
    (want,) = g.evaluate([t.double().cpu().numpy() for t in tensors])
    assert rel_err(out.double().cpu().numpy(), want) <= TOL[dtype]
    prof = gpu.profile(variants["torch_sdpa"], tensors, repeats=20, warmup=5)
    assert prof.graph_error is None and prof.graph_median_us is not None


@pytest.mark.parametrize("dims", [(3, 128, 1031), (2, 5, 7, 65), (64, 1)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_transposed_copy_on_the_gpu(gpu: Any, dims: tuple[int, ...], dtype: str) -> None:
    """The tiled Triton transpose equals torch's, ragged edges and leading dims included."""
    import torch

    from yirage_triton import transposed_copy

    x = torch.randn(dims, device="cuda").to(getattr(torch, dtype))
    out = transposed_copy(x)
    assert out.is_contiguous() and torch.equal(out, x.transpose(-1, -2))


@pytest.mark.parametrize(
    "dims,n,weighted",
    [
        ((24, 3000), 1, False),
        ((5, 7, 130), 1, True),
        ((3, 4, 4096), 2, True),
        ((2, 20000), 1, True),
    ],
)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_rms_norm_rows_on_the_gpu(
    gpu: Any, dims: tuple[int, ...], n: int, weighted: bool, dtype: str
) -> None:
    """The library RMSNorm's Triton kernel (one pass, two passes past 8192 columns, several
    normalised dims, a weight) against float64, rounded once to each output dtype."""
    import torch

    from yirage_triton import rms_norm_rows

    td = getattr(torch, dtype)
    x = (torch.randn(dims, device="cuda") * 50).to(td)
    w = torch.randn(dims[-n:], device="cuda").to(td) if weighted else None
    xd = x.double()
    want = xd / torch.sqrt((xd * xd).mean(dim=tuple(range(-n, 0)), keepdim=True) + 1e-6)
    if w is not None:
        want = want * w.double()
    for out_dtype in (torch.float32, td):
        out = rms_norm_rows(x, n, w, 1e-6, out_dtype)
        assert out.dtype == out_dtype and out.shape == x.shape
        err = (out.double() - want).abs().max() / want.abs().max()
        assert err <= (1e-5 if out_dtype == torch.float32 else TOL[dtype])
