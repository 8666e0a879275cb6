"""Runtime input checks (no GPU needed: they fire before any launch) and the backend API:
probe, DeviceSpec, codegen/compile/load/profile in interpreter mode, the verification level
as a function of records, and the cache."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import plans
import pytest
from conftest import needs_triton

import yirage as yr
import yirage_triton
from yirage_cuda import _verification
from yirage_triton import InputError, check_inputs

pytestmark = needs_triton

SPECS = [((8, 512), "float16"), ((512, 768), "float16")]


def torch() -> Any:
    import torch as t

    return t


def test_cpu_tensors_are_refused_with_the_fix() -> None:
    t = torch()
    xs = [t.zeros(8, 512, dtype=t.float16), t.zeros(512, 768, dtype=t.float16)]
    with pytest.raises(InputError, match=r"input 0 is on cpu.*tensor\.to\('cuda'\).*backend='cpu'"):
        check_inputs(xs, SPECS)


def test_numpy_arrays_are_refused() -> None:
    with pytest.raises(InputError, match=r"numpy\.ndarray.*torch tensors.*backend='cpu'"):
        check_inputs([np.zeros((8, 512)), np.zeros((512, 768))], SPECS)


def test_wrong_dtype_shape_count_layout() -> None:
    t = torch()
    good = [t.zeros(8, 512, dtype=t.float16), t.zeros(512, 768, dtype=t.float16)]
    check_inputs(good, SPECS, interpret=True)
    with pytest.raises(
        yr.DTypeError, match=r"input 1 has dtype torch.float32.*\.to\(torch.float16\)"
    ):
        check_inputs([good[0], good[1].float()], SPECS, interpret=True)
    with pytest.raises(yr.ShapeError, match=r"input 0 has shape \(8, 256\).*\(8, 512\)"):
        check_inputs([t.zeros(8, 256, dtype=t.float16), good[1]], SPECS, interpret=True)
    with pytest.raises(InputError, match="takes 2 input tensors, got 1"):
        check_inputs(good[:1], SPECS, interpret=True)
    with pytest.raises(InputError, match=r"not contiguous.*\.contiguous\(\)"):
        check_inputs([good[0], t.zeros(768, 512, dtype=t.float16).T], SPECS, interpret=True)


def test_gpu_launcher_refuses_cpu_tensors_before_launching() -> None:
    from yirage_cuda import CudaBackend

    be = CudaBackend()  # GPU mode: loads the module (no GPU needed until a launch)
    case = plans.rmsnorm_linear(dtype="float16")
    kernel = be.load(be.compile(be.codegen(case.plan)))
    t = torch()
    xs = [t.zeros(d, dtype=t.float16) for d, _ in case.inputs]
    with pytest.raises(InputError, match=r"\.to\('cuda'\)"):
        kernel(*xs)
    with pytest.raises(InputError, match="either positionally or as inputs"):
        kernel(xs[0], inputs=xs)


def test_interpreter_mode_backend_api(interp: Any) -> None:
    probe = interp.probe()
    assert probe.available and "interpreter" in probe.reason
    spec = interp.device_spec()
    assert spec.arch == "sm_90"
    assert interp.codegen_implemented
    case = plans.gated_mlp()
    src = interp.codegen(case.plan)
    assert src.cuda is not None and 'extern "C" YR_GLOBAL' in (src.cuda_code or "")
    art = interp.compile(src)
    again = interp.compile(interp.codegen(case.plan))
    assert again.cache_hit and again.triton_path == art.triton_path
    kernel = interp.load(art)
    # the C++ variant needs a GPU; the small grid leaves SMs idle, so its loop is also split
    assert set(kernel.variants) == {"triton", "triton_split"}
    assert "tl.atomic_add(cnt + blk" in kernel.variants["triton_split"].source
    tensors = interp.random_inputs(kernel.input_specs)
    outs = kernel(inputs=tensors)
    assert [tuple(o.shape) for o in outs] == [(8, 512)]
    prof = interp.profile(kernel, tensors, repeats=2)
    assert prof.median_us > 0 and "interpreter" in prof.method


def test_verification_level_follows_records(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from yirage_cuda import CudaBackend

    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_verification, "shipped_records", lambda: [])
    be = CudaBackend(interpret=True)
    assert be.verification_level is yr.VerificationLevel.GENERATED
    _verification.record("HARDWARE", "test", arch="sm_90", device="H100")
    # a hardware record does not count without the hardware
    assert be.verification_level is yr.VerificationLevel.GENERATED
    _verification.record("EMULATED", "test")
    assert be.verification_level is yr.VerificationLevel.EMULATED
    monkeypatch.setattr(CudaBackend, "_gpu_arch", lambda self: "sm_90")
    assert CudaBackend().verification_level is yr.VerificationLevel.HARDWARE
    monkeypatch.setattr(CudaBackend, "_gpu_arch", lambda self: "sm_80")
    assert CudaBackend().verification_level is yr.VerificationLevel.EMULATED


def test_shipped_record_states_the_release_level() -> None:
    recs = _verification.shipped_records()
    assert recs, "yirage_cuda/_verification.json must ship with the package"
    assert {r["level"] for r in recs} <= {"HARDWARE", "EMULATED", "COMPILED"}
    assert all(r.get("summary") for r in recs)


def test_self_check_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import yirage_cuda

    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    result = yirage_cuda.self_check(interpret=True)
    assert result["passed"], result
    assert result["record"]["level"] == "EMULATED"
    assert any(r["level"] == "EMULATED" for r in _verification.local_records())


def test_registered_backend(fresh_registry: None) -> None:
    info = yr.get_backend_info("cuda")
    assert info.installed and info.codegen_implemented
    assert info.verification_level is not yr.VerificationLevel.NONE


def test_interpreted_and_compiled_kernels_mix_in_one_process(interp: Any) -> None:
    """Interpreter runs leave Triton usable for GPU compilation and vice versa."""

    case = plans.zoo_odd()
    kernel = interp.load(interp.compile(interp.codegen(case.plan)))
    src = interp.codegen(plans.rmsnorm_linear().plan)
    path = yirage_triton.write_triton_module(src.triton.text, src.triton.codegen_version)
    module = yirage_triton.load_triton_module(path, interpret=False)
    dtypes = {b.id: b.dtype for b in src.plan.buffers}
    for _ in range(2):
        kernel(*interp.random_inputs(kernel.input_specs))
        assert yirage_triton.aot_compile_triton(module, dtypes)["rms_mm"]["binary_bytes"] > 0


def test_matmul_fp32_off_cuda_computes_in_16_bit_then_converts() -> None:
    """Library matmuls of 16-bit operands into float32 intermediates: off CUDA (CPU tensors,
    as in the interpreter) the product is computed in the operands' dtype and converted."""
    from yirage_triton import matmul_fp32

    t = torch()
    gen = t.Generator().manual_seed(0)
    a = t.randn(8, 64, generator=gen).to(t.float16)
    b = t.randn(64, 32, generator=gen).to(t.float16)
    out = matmul_fp32(a, b)
    assert out.dtype == t.float32 and tuple(out.shape) == (8, 32)
    assert t.equal(out, t.matmul(a, b).float())
    batched = matmul_fp32(a.reshape(2, 4, 64), b.expand(2, 64, 32))
    assert batched.dtype == t.float32 and t.equal(batched.reshape(8, 32), out)


def test_profile_times_only_the_launcher_it_is_given(
    interp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No race inside profile: it times the one launcher (a kernel: the variant it runs)
    with the backend's timing session, chooses nothing and remembers nothing."""
    from yirage_triton import TritonKernel, _backend

    timed: list[tuple[str, Any]] = []

    def fake_profile(launcher: Any, inputs: Any, **kw: Any) -> Any:
        timed.append((launcher.name, kw.get("session")))
        return SimpleNamespace(median_us={"triton": 10.0, "triton_split": 5.0}[launcher.name])

    monkeypatch.setattr(_backend, "profile", fake_profile)
    launchers = {n: SimpleNamespace(name=n, interpret=True) for n in ("triton", "triton_split")}
    kernel = TritonKernel(dict(launchers))
    assert interp.profile(kernel, inputs=[]).median_us == 10.0
    assert interp.profile(launchers["triton_split"], inputs=[]).median_us == 5.0
    assert kernel.variant == "triton"  # the faster variant was not chosen here
    with interp.profiling_session():
        interp.profile(kernel, inputs=[])
    assert [n for n, _ in timed] == ["triton", "triton_split", "triton"]
    assert timed[0][1] is None and timed[2][1] is not None  # the session's graphs are shared
    assert dict(interp.variants(kernel)) == launchers
    assert interp.variants(launchers["triton"]) == {"triton": launchers["triton"]}


def test_warm_time_is_the_given_launchers(interp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """warm_time_us replays the launcher given (a kernel: its variant), None in the
    interpreter, whose wall-clock times break no ties."""
    from yirage_triton import TritonKernel, _backend

    monkeypatch.setattr(_backend, "warm_median_us", lambda launcher, inputs: launcher.warm)
    gpu_like = {
        n: SimpleNamespace(interpret=False, warm=w) for n, w in (("triton", 12.0), ("x", 3.0))
    }
    kernel = TritonKernel(dict(gpu_like))
    assert interp.warm_time_us(kernel, []) == 12.0
    kernel.variant = "x"
    assert interp.warm_time_us(kernel, []) == 3.0
    assert interp.warm_time_us(SimpleNamespace(interpret=True, warm=1.0), []) is None


def _draw_checks(be: Any, device: str) -> None:
    """Shared by the interpreter and GPU tests: the backend's check-input draws."""
    specs = [((64, 96), "float16", 0.125, 11), ((3, 5), "float32", 1.0, 12)]
    a, b = be.draw_check_inputs(specs), be.draw_check_inputs(specs)
    assert [tuple(t.shape) for t in a] == [(64, 96), (3, 5)]
    assert [str(t.dtype) for t in a] == ["torch.float16", "torch.float32"]
    assert all(t.device.type == device for t in a)
    assert all(torch().equal(x, y) for x, y in zip(a, b, strict=True))  # a seed's values
    other = be.draw_check_inputs([((64, 96), "float16", 0.125, 13)])[0]
    assert not torch().equal(other, a[0])
    assert float(a[0].float().std()) == pytest.approx(0.125, rel=0.1)
    assert be.check_input_generator().startswith(f"torch {torch().__version__} randn on ")


def test_check_inputs_drawn_by_the_backend(interp: Any) -> None:
    _draw_checks(interp, "cpu")
    assert interp.check_input_generator().endswith(" on cpu")


def test_cuda_cpp_variant_waits_at_its_first_use_and_fails_alone(interp: Any) -> None:
    """The C++ compile runs in the background (CudaBackend.compile): ``load`` and
    ``variants`` do not wait for it, the Triton variant runs meanwhile, and the "cuda"
    launcher's first use waits and raises the compile's error (that variant only)."""
    from concurrent.futures import Future

    from yirage.plugin import BackendError
    from yirage_cuda._backend import PendingCudaCpp

    case = plans.gated_mlp()
    art = interp.compile(interp.codegen(case.plan))
    assert art.source.cuda is not None and art.cuda_future is None  # printed, not compiled
    failed: Future[Any] = Future()
    art.cuda_future = failed
    kernel = interp.load(art)  # returns while the compile still runs
    variants = interp.variants(kernel)
    cpp = variants["cuda"]
    assert isinstance(cpp, PendingCudaCpp) and not failed.done()
    assert cpp.input_specs == kernel.input_specs and cpp.output_specs == kernel.output_specs
    tensors = interp.random_inputs(kernel.input_specs)
    (want,) = variants["triton"](*tensors)  # the Triton variant does not wait
    failed.set_exception(BackendError("nvrtc: error: identifier 'x' is undefined"))
    for _ in range(2):  # the error is the variant's, every time it is used
        with pytest.raises(BackendError, match="did not compile: nvrtc: error: identifier"):
            cpp(*tensors)
    assert art.cuda_future is None and art.cuda_error == "nvrtc: error: identifier 'x' is undefined"
    (again,) = kernel(*tensors)
    assert torch().equal(again, want)


def test_a_cuda_cpp_refusal_is_a_note_not_a_variant(interp: Any) -> None:
    """Without a compile (the printer refused the plan) there is no "cuda" launcher, and
    the kernel's note says why."""
    art = interp.compile(interp.codegen(plans.gated_mlp().plan))
    art.cuda_error = "CodegenError: the tile does not fit in shared memory"
    kernel = interp.load(art)
    assert "cuda" not in interp.variants(kernel)
    assert kernel.notes == [
        "CUDA C++ variant unavailable: CodegenError: the tile does not fit in shared memory"
    ]


def test_only_one_kernel_launches_count_as_device_time_for_the_screen() -> None:
    """The race's screen gives up on a contender by its eager launch times only where one
    generated kernel is the whole call; several kernels or a library op leave host gaps."""
    from yirage.plan import parse_plan
    from yirage_triton._runtime import host_gaps

    one = parse_plan(plans.rmsnorm_linear().plan)
    two = parse_plan(plans.mixed_library().plan)
    assert len(one.kernels) == 1 and not host_gaps(SimpleNamespace(plan=one))
    assert host_gaps(SimpleNamespace(plan=two))
    assert not host_gaps(SimpleNamespace())  # no plan: a bare device launcher


@pytest.mark.parametrize(
    ("code", "says", "never"),
    [
        (700, "a kernel faulted earlier", "compiler newer"),  # illegal address: sticky
        (222, "compiler newer than the driver", "faulted"),  # unsupported PTX version
        (2, "CUresult 2", "compiler newer"),  # out of memory: neither hint
    ],
)
def test_driver_errors_name_the_likely_cause(code: int, says: str, never: str) -> None:
    """A module load failing because an earlier kernel faulted (the sticky CUresult 700 of
    an illegal address) must not blame the compiler's version; an image the driver cannot
    load does."""
    from yirage.plugin import BackendError
    from yirage_cuda._cpp_runtime import _Driver

    with pytest.raises(BackendError) as info:
        _Driver.check(code, "cuModuleLoadData")
    assert says in str(info.value) and never not in str(info.value)
