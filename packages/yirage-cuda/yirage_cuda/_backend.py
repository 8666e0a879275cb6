"""The NVIDIA CUDA Backend: the shared Triton layer (:class:`yirage_triton.TritonBackend`)
for the NVIDIA :data:`TARGET`, plus a CUDA C++ variant of each plan.

``codegen`` prints the Triton variants (see yirage_triton) and, when the C++ printer can lay
the plan out in shared memory, CUDA C++. ``compile`` writes the Triton modules into the cache
and, on a GPU machine, starts compiling the C++ with NVRTC/nvcc for the live architecture in
the background, so a cold ``superoptimize`` overlaps it with the Triton compiles of
``precompile``. ``load`` returns a kernel whose ``variants`` include "cuda": that launcher
waits for the compile at its first use, and a failed compile is that variant's error (the
race drops it), never hidden.

``CudaBackend(interpret=True)`` runs the Triton kernels in the Triton interpreter on CPU
tensors (no GPU needed): that is how CI runs the generated code ("ran emulated").
"""

from __future__ import annotations

import os
import threading
import types
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from yirage.plan import Plan, parse_plan
from yirage.plugin import (
    BackendError,
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
)
from yirage_cuda import _device_spec, _env, _probe, _toolchain, _verification
from yirage_cuda._cpp_runtime import CudaCppLauncher
from yirage_cuda._cuda_codegen import CODEGEN_VERSION as CUDACPP_VERSION
from yirage_cuda._cuda_codegen import CudaCppOptions, CudaCppSource, generate_cuda
from yirage_triton import (
    TritonArtifact,
    TritonBackend,
    TritonKernel,
    TritonOptions,
    TritonPrinted,
    TritonTarget,
    triton_has_pdl,
)

__all__ = ["TARGET", "CudaArtifact", "CudaBackend", "CudaKernel", "CudaSource", "PendingCudaCpp"]

#: NVIDIA's Triton target: torch.cuda, 32-thread warps, TF32 dots, programmatic dependent
#: launch (sm_90+), 3 and 5 pipeline stages, every variant family, ahead-of-time "cuda".
TARGET = TritonTarget(name="cuda", torch_device="cuda", warp_size=32, pdl=True, aot_backend="cuda")

#: The kernel type of this backend (the shared Triton layer's).
CudaKernel = TritonKernel


@dataclass
class CudaSource(TritonPrinted):
    """The Triton printings and, when the C++ printer could lay the plan out, the CUDA C++
    translation unit (``cuda``; else ``cuda_error`` says why not)."""

    cuda: CudaCppSource | None = None
    cuda_error: str | None = None

    @property
    def cuda_code(self) -> str | None:
        return self.cuda.text if self.cuda is not None else None


@dataclass
class CudaArtifact(TritonArtifact):
    cuda_compiled: _toolchain.CompiledCuda | None = None
    cuda_error: str | None = None
    #: the CUDA C++ compile while it runs in the background (see :meth:`wait_cuda`)
    cuda_future: Future[_toolchain.CompiledCuda] | None = None

    def wait_cuda(self) -> None:
        """Wait for the background CUDA C++ compile; its result or error lands in
        ``cuda_compiled`` / ``cuda_error``."""
        future, self.cuda_future = self.cuda_future, None
        if future is None:
            return
        try:
            self.cuda_compiled = future.result()
        except BackendError as exc:
            self.cuda_error = str(exc)
        except Exception as exc:  # a toolchain crash: the variant fails, it is not hidden
            self.cuda_error = f"{type(exc).__name__}: {exc}"


#: CUDA C++ compiles run on these threads, so that a cold ``superoptimize`` overlaps them
#: with the Triton compiles of ``precompile`` instead of waiting for them first.
_CPP_POOL: list[ThreadPoolExecutor] = []
_CPP_POOL_LOCK = threading.Lock()


def _cpp_pool() -> ThreadPoolExecutor:
    with _CPP_POOL_LOCK:
        if not _CPP_POOL:
            workers = max(1, min(8, os.cpu_count() or 1))
            _CPP_POOL.append(ThreadPoolExecutor(workers, thread_name_prefix="yirage-cuda-cpp"))
        return _CPP_POOL[0]


class PendingCudaCpp:
    """The "cuda" variant's launcher while its compile may still run: the plan's specs at
    once; the first run waits for the compile and raises its error if it failed."""

    language = "cuda"
    interpret = False
    device = "cuda"

    def __init__(self, source: CudaCppSource, artifact: CudaArtifact) -> None:
        self.plan: Plan = source.plan
        self.source = source.text
        self.input_specs = [(tuple(b.dims), b.dtype) for b in self.plan.inputs]
        self.output_specs = [(tuple(b.dims), b.dtype) for b in self.plan.outputs]
        self._src = source
        self._artifact = artifact
        self._ready: CudaCppLauncher | None = None

    def resolve(self) -> CudaCppLauncher:
        """The compiled launcher (waits for the compile); BackendError when it failed."""
        if self._ready is None:
            self._artifact.wait_cuda()
            compiled = self._artifact.cuda_compiled
            if compiled is None:
                raise BackendError(
                    "the CUDA C++ variant did not compile: "
                    f"{self._artifact.cuda_error or 'no compile was started'}"
                )
            self._ready = CudaCppLauncher(
                self.plan, self.source, _host_module(self._src), compiled.cubin, self._src.kernels
            )
        return self._ready

    def check(self, tensors: Sequence[Any]) -> list[Any]:
        return self.resolve().check(tensors)

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        return self.resolve()(*tensors, inputs=inputs)

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        return self.resolve().run_unchecked(inputs)

    def __repr__(self) -> str:
        state = "compiled" if self._ready is not None else "compiling or not yet used"
        return f"<PendingCudaCpp plan {self.plan.graph_hash or '?'} ({state})>"


class CudaBackend(TritonBackend):
    """NVIDIA CUDA: Triton and CUDA C++ code from KernelPlans, run through torch.cuda."""

    name = "cuda"
    target = TARGET
    #: The plugin API this package was written against (yirage.PLUGIN_API of its release),
    #: declared here rather than inherited from yirage.Backend: inherited, it would always
    #: equal the installed yirage's PLUGIN_API and the registry's mismatch check could never
    #: fire; declared, a yirage of another major API version refuses this package with an
    #: error naming the versions to install.
    plugin_api = (1, 2)
    distribution = "yirage-cuda"

    def __init__(
        self,
        interpret: bool = False,
        *,
        cuda_cpp: bool = True,
        triton_options: TritonOptions | None = None,
        cuda_options: CudaCppOptions | None = None,
    ) -> None:
        super().__init__(interpret, triton_options=triton_options)
        self.cuda_cpp = cuda_cpp
        self.cuda_options = cuda_options

    # -- hardware hooks ------------------------------------------------------------------------
    def probe_device(self) -> ProbeResult:
        result = _probe.probe()
        try:
            tools = {**result.toolchain, **_toolchain.toolchain_versions()}
        except Exception:
            tools = dict(result.toolchain)
        return ProbeResult(result.available, result.reason, result.hardware, tools)

    def live_device_spec(self) -> DeviceSpec:
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

    def interpreter_spec(self) -> DeviceSpec:
        return _device_spec.H100_SXM

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)

    def toolchain(self) -> dict[str, str]:
        tools = _toolchain.toolchain_versions()
        if self.interpret:
            tools["mode"] = "Triton interpreter (CPU)"
        else:
            info = _toolchain.device_info()
            if info is not None:
                tools["device"] = f"{info.name} ({info.arch}, {info.sm_count} SMs)"
        return tools

    def compute_units(self) -> int:
        info = None if self.interpret else _toolchain.device_info()
        if info is not None:
            return info.sm_count
        return _device_spec.H100_SXM.compute_units or 132

    def smem_limit(self) -> int | None:
        if self.interpret:
            return _device_spec.H100_SXM.shared_mem_per_block
        info = _toolchain.device_info()
        return info.smem_per_block_optin if info is not None else None

    def use_pdl(self) -> bool:
        """Programmatic dependent launch: on sm_90 and newer with a Triton that prints it,
        unless ``YIRAGE_CUDA_PDL=0`` (the interpreter has no grids to overlap)."""
        if self.interpret or not _env.pdl_enabled():
            return False
        info = _toolchain.device_info()
        return info is not None and info.cc >= (9, 0) and triton_has_pdl()

    def _gpu_arch(self) -> str | None:
        if self.interpret:
            return None
        info = _toolchain.device_info()
        return info.arch if info is not None else None

    @property
    def codegen_versions(self) -> dict[str, str]:
        return {**super().codegen_versions, "cudacpp": CUDACPP_VERSION}

    @property
    def verification_level(self) -> VerificationLevel:  # type: ignore[override]
        """From the records of passed runs and this machine (see ``_verification``)."""
        try:
            return _verification.current_level(self._gpu_arch())[0]
        except Exception:
            return VerificationLevel.GENERATED

    def verification_record(self) -> dict[str, Any] | None:
        return _verification.current_level(self._gpu_arch())[1]

    # -- the CUDA C++ variant ------------------------------------------------------------------
    def codegen(self, plan: Any) -> CudaSource:
        """Print a KernelPlan (object with ``kernel_plan()``/``to_json()``, JSON text or dict)."""
        p = parse_plan(plan)
        base, variants = self.print_triton(p)
        source = CudaSource(p, base, variants)
        if self.cuda_cpp:
            copts = self.cuda_options or CudaCppOptions(
                arch=self._gpu_arch() or "sm_90", smem_limit=self.smem_limit() or 227 * 1024
            )
            try:
                source.cuda = generate_cuda(p, copts)
            except BackendError as exc:
                source.cuda_error = str(exc)
        return source

    def compile(self, source: Any) -> CudaArtifact:
        if not isinstance(source, CudaSource):
            raise BackendError(
                "the cuda backend compiles what its codegen() returns (a CudaSource), "
                f"got {type(source).__name__}"
            )
        written = self.write_modules(source)
        art = CudaArtifact(**{f: getattr(written, f) for f in TritonArtifact.__dataclass_fields__})
        # The C++ variant only runs on a GPU; without one it is printed but not compiled here
        # (CI compiles every printed kernel for sm_90 in its own tests). It compiles in the
        # background: ``load`` returns at once and the variant waits at its first use.
        if source.cuda is not None and not self.interpret and self._gpu_arch() is not None:
            art.cuda_future = _cpp_pool().submit(
                _toolchain.compile_cuda, source.cuda.text, source.cuda.options.arch
            )
        elif source.cuda is None:
            art.cuda_error = source.cuda_error
        return art

    def load(self, artifact: Any) -> TritonKernel:
        kernel = TritonKernel(self.triton_launchers(artifact))
        if not isinstance(artifact, CudaArtifact) or not isinstance(artifact.source, CudaSource):
            return kernel
        cpp = artifact.source.cuda
        started = artifact.cuda_future is not None or artifact.cuda_compiled is not None
        if cpp is not None and started:
            kernel.variants["cuda"] = PendingCudaCpp(cpp, artifact)
        elif artifact.cuda_error:
            kernel.notes.append(
                f"CUDA C++ variant unavailable: {artifact.cuda_error.splitlines()[0]}"
            )
        return kernel


def _host_module(src: CudaCppSource) -> Any:
    mod = types.ModuleType(f"yirage_cuda_host_{src.digest[:16]}")
    exec(compile(src.host, f"<yirage-cuda host {src.digest[:16]}>", "exec"), mod.__dict__)
    return mod
