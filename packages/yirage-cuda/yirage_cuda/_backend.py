"""The NVIDIA CUDA Backend object.

``codegen`` prints a KernelPlan as Triton (primary), as Triton with the for-loops of
kernels that leave SMs idle split across extra blocks, the last part of each block combining
the parts (split-K / flash-decoding, when some kernel qualifies:
:func:`~yirage_cuda._triton_codegen.loop_split`), both also with 5-stage pipelines
("triton_deep", "triton_split_deep"), with finer loop chunks under 4- and 5-stage pipelines
("triton_fine", "triton_fine_deep"), the split one also split half and a quarter as many
ways ("triton_split_half", "triton_split_quarter") and with a normalised dot operand
multiplied raw and the product scaled ("triton_split_scaled" / "triton_scaled"), and as
CUDA C++ (when the printer can lay the kernel out in shared memory). ``compile`` writes the
Triton modules into the cache and, on a GPU machine, compiles the C++ with NVRTC/nvcc for
the live architecture. ``load`` returns a :class:`CudaKernel` running the Triton variant;
``precompile`` compiles the Triton kernels of many kernels at once in a thread pool;
``profile`` screens every variant that loaded, cross-checks the others' outputs against the
(already reference-checked) Triton outputs, keeps the fastest and remembers the choice in
the cache, so a later ``load`` of the same plan on the same device picks it again.

``CudaBackend(interpret=True)`` runs the Triton kernels in the Triton interpreter on CPU
tensors (no GPU needed): that is how CI runs the generated code ("ran emulated").
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yirage import plugin
from yirage.plugin import (
    PRUNE_AFTER_ROUNDS,
    PRUNE_RATIO,
    Backend,
    BackendError,
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
    get_logger,
    pick_cold_tie,
)
from yirage_cuda import _device_spec, _env, _probe, _toolchain, _verification
from yirage_cuda._cuda_codegen import CudaCppOptions, CudaCppSource, generate_cuda
from yirage_cuda._plan import Plan, parse_plan
from yirage_cuda._runtime import (
    CudaCppLauncher,
    CudaLauncher,
    ProfileResult,
    TimingSession,
    TritonLauncher,
    profile,
    time_callable,
    warm_median_us,
)
from yirage_cuda._subtile import loop_subtile
from yirage_cuda._triton_codegen import (
    CODEGEN_VERSION,
    DEEP_STAGES,
    DEFAULT_STAGES,
    TritonOptions,
    TritonSource,
    generate_triton,
    loop_split,
)

__all__ = ["CudaArtifact", "CudaBackend", "CudaKernel", "CudaSource"]

_log = get_logger(__name__)

#: Variants slower than this factor times the fastest in a short screen are not profiled.
SCREEN_FACTOR = 1.5


@dataclass
class CudaSource:
    """What :meth:`CudaBackend.codegen` returns: the Triton module (``code``) and, when the
    C++ printer could lay the plan out, the CUDA C++ translation unit (``cuda_code``)."""

    plan: Plan
    triton: TritonSource
    cuda: CudaCppSource | None
    cuda_error: str | None = None
    #: further printings of the plan by variant name: "triton_split" (the under-filled
    #: kernels' loops split), "triton_split_half" / "triton_split_quarter" (split half / a
    #: quarter as many ways), "triton_deep" / "triton_split_deep" (deeper pipelines),
    #: "triton_fine" / "triton_fine_deep" (loop chunks cut to 128 rows, 4 / 5 stages),
    #: "triton_split_scaled" / "triton_scaled" (a normalised dot operand multiplied raw, the
    #: product scaled)
    triton_variants: dict[str, TritonSource] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return self.triton.text

    @property
    def cuda_code(self) -> str | None:
        return self.cuda.text if self.cuda is not None else None

    def __str__(self) -> str:
        return self.code


@dataclass
class CudaArtifact:
    source: CudaSource
    triton_path: Path
    interpret: bool
    #: module path of each of ``source.triton_variants``
    triton_variant_paths: dict[str, Path] = field(default_factory=dict)
    cuda_compiled: _toolchain.CompiledCuda | None = None
    cuda_error: str | None = None
    cache_hit: bool = False
    compile_seconds: float = 0.0
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
        except Exception as exc:  # a toolchain crash: the variant is unavailable, not hidden
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


@dataclass
class CudaKernel:
    """Launcher of a plan with its variants ("triton", and "cuda" for the C++ path)."""

    _variants: dict[str, CudaLauncher]
    variant: str = "triton"
    notes: list[str] = field(default_factory=list)
    #: best median (µs) of each profiled variant over all ``profile`` calls
    timings: dict[str, float] = field(default_factory=dict)
    #: replay median (µs) with the inputs in L2 of the variants that tied on ``timings``
    warm_timings: dict[str, float] = field(default_factory=dict)
    #: variants that passed the screen and the cross-check (decided at the first profile)
    contenders: list[str] | None = None
    #: ``profile`` calls so far: after superoptimize's ``PRUNE_AFTER_ROUNDS`` rounds, variants
    #: over ``PRUNE_RATIO`` times the best are no longer timed (as candidates are not)
    profile_calls: int = 0
    #: adds the CUDA C++ variant once its background compile is done (see ``variants``)
    pending: Callable[[CudaKernel], None] | None = field(default=None, repr=False)

    @property
    def variants(self) -> dict[str, CudaLauncher]:
        """Every variant; waits for a CUDA C++ compile still running in the background."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending(self)
        return self._variants

    @property
    def built_variants(self) -> dict[str, CudaLauncher]:
        """The variants ready now, without waiting for the CUDA C++ compile."""
        return self._variants

    @property
    def active(self) -> CudaLauncher:
        ready = self._variants.get(self.variant)
        return ready if ready is not None else self.variants[self.variant]

    @property
    def plan(self) -> Plan:
        return self.active.plan

    @property
    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return self.active.input_specs

    @property
    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return self.active.output_specs

    @property
    def interpret(self) -> bool:
        return self.active.interpret

    @property
    def source(self) -> str:
        return self.active.source

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        return self.active(*tensors, inputs=inputs)

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        return self.active.run_unchecked(inputs)

    def __repr__(self) -> str:
        return f"<CudaKernel {self.variant} of {sorted(self.variants)}>"


class CudaBackend(Backend):
    """NVIDIA CUDA: Triton and CUDA C++ code from KernelPlans, run through torch.cuda."""

    name = "cuda"
    #: The plugin API this package was written against (yirage.PLUGIN_API of its release),
    #: declared here rather than inherited from yirage.Backend: inherited, it would always
    #: equal the installed yirage's PLUGIN_API and the registry's mismatch check could never
    #: fire; declared, a yirage of another major API version refuses this package with an
    #: error naming the versions to install.
    plugin_api = (1, 1)
    distribution = "yirage-cuda"
    source_suffix = ".py"

    def __init__(
        self,
        interpret: bool = False,
        *,
        cuda_cpp: bool = True,
        triton_options: TritonOptions | None = None,
        cuda_options: CudaCppOptions | None = None,
    ) -> None:
        self.interpret = bool(interpret)
        self.cuda_cpp = cuda_cpp
        self.triton_options = triton_options
        self.cuda_options = cuda_options
        self._timing: TimingSession | None = None

    # -- probe / device ------------------------------------------------------------------------
    def probe(self) -> ProbeResult:
        if self.interpret:
            try:
                ok = (
                    importlib.util.find_spec("triton") is not None
                    and importlib.util.find_spec("torch") is not None
                )
                tools = _toolchain.toolchain_versions()
            except Exception as exc:
                return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
            if not ok:
                return ProbeResult(
                    False, "the Triton interpreter needs triton and torch installed", None, tools
                )
            return ProbeResult(
                True,
                "Triton interpreter on the CPU (emulated; no GPU used)",
                "Triton interpreter",
                tools,
            )
        result = _probe.probe()
        try:
            tools = {**result.toolchain, **_toolchain.toolchain_versions()}
        except Exception:
            tools = dict(result.toolchain)
        return ProbeResult(result.available, result.reason, result.hardware, tools)

    def device_spec(self) -> DeviceSpec:
        if self.interpret:
            return _device_spec.H100_SXM
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

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

    def _gpu_arch(self) -> str | None:
        if self.interpret:
            return None
        info = _toolchain.device_info()
        return info.arch if info is not None else None

    @property
    def verification_level(self) -> VerificationLevel:  # type: ignore[override]
        """From the records of passed runs and this machine (see ``_verification``)."""
        try:
            return _verification.current_level(self._gpu_arch())[0]
        except Exception:
            return VerificationLevel.GENERATED

    def verification_record(self) -> dict[str, Any] | None:
        return _verification.current_level(self._gpu_arch())[1]

    # -- tensors -------------------------------------------------------------------------------
    @property
    def torch_device(self) -> str:
        return "cpu" if self.interpret else "cuda"

    def from_numpy(self, arrays: Sequence[Any], dtypes: Sequence[str]) -> list[Any]:
        import torch

        return [
            torch.from_numpy(a).to(device=self.torch_device, dtype=getattr(torch, d)).contiguous()
            for a, d in zip(arrays, dtypes, strict=True)
        ]

    def check_input_generator(self) -> str | None:
        """torch's generator of the device: Philox on a GPU, whose values for a seed depend on
        the torch version and on the launch grid torch picks from the SM count."""
        import torch

        if self.interpret:
            return f"torch {torch.__version__} randn on cpu"
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return (
            f"torch {torch.__version__} randn on {props.name} ({props.multi_processor_count} SMs)"
        )

    def draw_check_inputs(self, specs: Sequence[tuple[tuple[int, ...], str, float, int]]) -> Any:
        import torch

        out = []
        for dims, dtype, scale, seed in specs:
            gen = torch.Generator(device=self.torch_device).manual_seed(seed)
            x = torch.randn(dims, generator=gen, device=self.torch_device, dtype=torch.float32)
            if scale != 1.0:
                x.mul_(scale)
            out.append(x.to(getattr(torch, dtype)))
        if not self.interpret:
            # drawn on the caller's stream; the reference reads them from another thread
            torch.cuda.current_stream().synchronize()
        return out

    def random_inputs(self, specs: Sequence[tuple[Sequence[int], str]], seed: int = 0) -> list[Any]:
        import torch

        gen = torch.Generator().manual_seed(seed)
        return [
            torch.randn(tuple(dims), generator=gen).to(
                device=self.torch_device, dtype=getattr(torch, dt)
            )
            for dims, dt in specs
        ]

    # -- codegen / compile / load / profile ------------------------------------------------------
    def _smem_limit(self) -> int | None:
        if self.interpret:
            return _device_spec.H100_SXM.shared_mem_per_block
        info = _toolchain.device_info()
        return info.smem_per_block_optin if info is not None else None

    def codegen(self, plan: Any) -> CudaSource:
        """Print a KernelPlan (object with ``kernel_plan()``/``to_json()``, JSON text or dict)."""
        p = parse_plan(plan)
        attention = any(k.safe_softmax for k in p.generated)
        # programmatic dependent launch, except for safe-softmax (attention) plans, where it
        # measured slower or level (benchmarks/README.md, "Why these variants")
        topts = self.triton_options or TritonOptions(
            smem_limit=self._smem_limit(),
            bf16_dot_as_fp32=self.interpret,
            pdl=self._pdl() and not attention,
        )
        triton_src = generate_triton(p, topts)
        variants: dict[str, TritonSource] = {}
        splits = tuple(
            (k.name, s)
            for k in p.generated
            if (s := loop_split(k, self._sm_count())) > 1 and not topts.split_loop
        )
        printings: dict[str, TritonOptions] = {}
        if splits:
            printings["triton_split"] = dataclasses.replace(topts, split_loop=splits)
            # half the split too: bigger kernels fill the SMs with fewer parts (the fused
            # gated MLP, RMSNorm + Linear); not in the interpreter, whose wall-clock times
            # cannot choose a split, nor for safe-softmax (attention) plans, whose split is
            # capped at MAX_SPLIT and whose half split lost every measured run
            half = tuple((name, n // 2) for name, n in splits if n >= 4)
            if half and not self.interpret and not attention:
                printings["triton_split_half"] = dataclasses.replace(topts, split_loop=half)
            # and a quarter, where that still leaves at most an eighth of the SMs idle: a
            # kernel whose stage buffers fit one block per SM runs the bigger grids in waves.
            # One block per SM, it gets the full default pipeline, not the plan's shared-memory
            # estimate (which overstates Triton's buffers; the runtime lowers the depth if they
            # do not fit)
            grids = {k.name: k.blocks for k in p.generated}
            sms = self._sm_count()
            quarter = tuple(
                (name, n // 4)
                for name, n in splits
                if n >= 8 and 8 * grids[name] * (n // 4) >= 7 * sms
            )
            if quarter and not self.interpret:
                printings["triton_split_quarter"] = dataclasses.replace(
                    topts, split_loop=quarter, num_stages=topts.num_stages or DEFAULT_STAGES
                )
        # deeper pipelines (not in the interpreter, which ignores the stage count), except for
        # safe-softmax (attention) plans, whose deep printings never won and cost compiles
        if (
            not self.interpret
            and not attention
            and topts.num_stages is None
            and topts.max_stages < DEEP_STAGES
        ):
            deep = dataclasses.replace(topts, max_stages=DEEP_STAGES)
            printings["triton_deep"] = deep
            if splits:
                printings["triton_split_deep"] = dataclasses.replace(deep, split_loop=splits)
        # finer loop chunks under deeper pipelines (weight-streaming kernels whose plan chunks
        # leave room for two or three stages; see _subtile), with 4 and 5 stages
        fine = tuple((k.name, f) for k in p.generated if (f := loop_subtile(k)) > 1)
        if (
            fine
            and not self.interpret
            and not attention
            and topts.num_stages is None
            and not topts.subtile
        ):
            for name, depth in (
                ("triton_fine", DEEP_STAGES - 1),
                ("triton_fine_deep", DEEP_STAGES),
            ):
                printings[name] = dataclasses.replace(topts, subtile=fine, max_stages=depth)
        # a normalised dot operand multiplied raw and the product scaled instead (qknorm's K
        # tile): fewer elementwise ops but more registers and a second read of the tile
        # (sm_90 compiles: 239 registers against 203), so profiling decides; a plan without
        # such an operand prints the same text, which is kept once
        if not self.interpret and not topts.scale_after_dot:
            base = printings.get("triton_split", topts)
            scaled = "triton_split_scaled" if "triton_split" in printings else "triton_scaled"
            printings[scaled] = dataclasses.replace(base, scale_after_dot=True)
        texts = {triton_src.text}
        for name, opts in printings.items():
            src = generate_triton(p, opts)
            if src.text not in texts:  # e.g. no loop deep enough to take more stages
                texts.add(src.text)
                variants[name] = src
        cuda_src = None
        cuda_err = None
        if self.cuda_cpp:
            copts = self.cuda_options or CudaCppOptions(
                arch=self._gpu_arch() or "sm_90", smem_limit=self._smem_limit() or 227 * 1024
            )
            try:
                cuda_src = generate_cuda(p, copts)
            except BackendError as exc:
                cuda_err = str(exc)
        return CudaSource(p, triton_src, cuda_src, cuda_err, variants)

    def _pdl(self) -> bool:
        """Programmatic dependent launch: on sm_90 and newer with a Triton that prints it,
        unless ``YIRAGE_CUDA_PDL=0`` (the interpreter has no grids to overlap)."""
        if self.interpret or not _env.pdl_enabled():
            return False
        info = _toolchain.device_info()
        return info is not None and info.cc >= (9, 0) and _toolchain.triton_has_pdl()

    def _sm_count(self) -> int:
        info = None if self.interpret else _toolchain.device_info()
        if info is not None:
            return info.sm_count
        return _device_spec.H100_SXM.compute_units or 132

    def compile(self, source: Any) -> CudaArtifact:
        if not isinstance(source, CudaSource):
            raise BackendError(
                "the cuda backend compiles what its codegen() returns (a CudaSource), "
                f"got {type(source).__name__}"
            )
        t0 = time.perf_counter()
        key = _toolchain._triton_key(source.triton.text, source.triton.codegen_version)
        hit = plugin.entry_path("cuda-triton", key, ".py").is_file()
        path = _toolchain.write_triton_module(source.triton.text, source.triton.codegen_version)
        art = CudaArtifact(source, path, self.interpret, cache_hit=hit)
        for name, src in source.triton_variants.items():
            art.triton_variant_paths[name] = _toolchain.write_triton_module(
                src.text, src.codegen_version
            )
        # The C++ variant only runs on a GPU; without one it is printed but not compiled here
        # (CI compiles every printed kernel for sm_90 in its own tests). It compiles in the
        # background: ``load`` returns at once and the kernel adds the variant when needed.
        if source.cuda is not None and not self.interpret and self._gpu_arch() is not None:
            art.cuda_future = _cpp_pool().submit(
                _toolchain.compile_cuda, source.cuda.text, source.cuda.options.arch
            )
        elif source.cuda is None:
            art.cuda_error = source.cuda_error
        art.compile_seconds = time.perf_counter() - t0
        return art

    def load(self, artifact: Any) -> CudaKernel:
        if not isinstance(artifact, CudaArtifact):
            raise BackendError(
                f"the cuda backend loads what its compile() returns, got {type(artifact).__name__}"
            )
        src = artifact.source
        module = _toolchain.load_triton_module(artifact.triton_path, interpret=artifact.interpret)
        variants: dict[str, CudaLauncher] = {
            "triton": TritonLauncher(
                src.plan, src.triton.text, module, interpret=artifact.interpret
            )
        }
        kernel = CudaKernel(variants)
        for name, path in artifact.triton_variant_paths.items():
            variants[name] = TritonLauncher(
                src.plan,
                src.triton_variants[name].text,
                _toolchain.load_triton_module(path, interpret=artifact.interpret),
                interpret=artifact.interpret,
            )

        def add_cuda_variant(k: CudaKernel) -> None:
            artifact.wait_cuda()
            if artifact.cuda_compiled is not None and src.cuda is not None:
                k.built_variants["cuda"] = CudaCppLauncher(
                    src.plan,
                    src.cuda.text,
                    _host_module(src.cuda),
                    artifact.cuda_compiled.cubin,
                    src.cuda.kernels,
                )
            elif artifact.cuda_error:
                k.notes.append(
                    f"CUDA C++ variant unavailable: {artifact.cuda_error.splitlines()[0]}"
                )

        if artifact.cuda_future is not None and not artifact.cuda_future.done():
            kernel.pending = add_cuda_variant
        else:
            add_cuda_variant(kernel)
        choice = self._remembered_variant(src.plan)
        # (waits for the C++ compile only when that is the remembered choice)
        if choice in kernel.built_variants or (choice == "cuda" and "cuda" in kernel.variants):
            kernel.variant = str(choice)
        return kernel

    def precompile(self, launchers: Sequence[Any], inputs: Sequence[Any]) -> None:
        """Compile the Triton kernels of every variant of ``launchers`` for ``inputs`` at once,
        in a thread pool (``triton.AsyncCompileMode``; on the H100 host 6 kernels took 0.4 s
        instead of 2.9 s one by one), so the first runs find them in Triton's cache. A kernel
        that fails here is compiled again by its first run, which reports the error."""
        if self.interpret:
            return
        import triton

        async_mode = getattr(triton, "AsyncCompileMode", None)
        modules = {
            id(v.module): v.module
            for k in launchers
            for v in (k.built_variants.values() if isinstance(k, CudaKernel) else [k])
            if isinstance(v, TritonLauncher) and hasattr(v.module, "warmup")
        }
        if async_mode is None or not modules:
            return
        workers = max(1, min(len(modules) * 2, os.cpu_count() or 1, 32))
        with ThreadPoolExecutor(workers, thread_name_prefix="yirage-triton") as pool:
            try:
                with async_mode(pool):
                    for module in modules.values():
                        try:
                            module.warmup(list(inputs))
                        except Exception as exc:
                            _log.debug("precompile of %s failed: %s", module.__name__, exc)
            except Exception as exc:
                _log.debug("precompile failed: %s", exc)

    @contextlib.contextmanager
    def profiling_session(self) -> Iterator[None]:
        """Profiling rounds inside share one :class:`TimingSession`: each variant's CUDA
        graphs are captured and its repeat count fitted once, then only replayed (on the
        H100 host profiling went from 2.0-3.9 s to 1.3-2.4 s per workload; the rest is the
        replays themselves)."""
        outer, self._timing = self._timing, TimingSession()
        try:
            yield
        finally:
            self._timing = outer

    def profile(
        self, launcher: Any, inputs: Sequence[Any] | None = None, **options: Any
    ) -> ProfileResult:
        """Profile the variants of ``launcher`` that pass the screen and agree with the
        Triton variant (both decided at the first call), median CUDA-graph replay time each.
        Over repeated calls (superoptimize's rounds) every variant keeps its best median and
        the kernel runs the variant with the lowest, so the variant chosen is the one whose
        time the caller records. Returns this call's timing of that variant."""
        kernel = launcher if isinstance(launcher, CudaKernel) else CudaKernel({"triton": launcher})
        if inputs is None:
            inputs = self.random_inputs(kernel.input_specs)
        if kernel.contenders is None:
            kernel.contenders = self._checked(kernel, self._contenders(kernel, inputs), inputs)
        results: dict[str, ProfileResult] = {}
        kernel.profile_calls += 1
        for name in kernel.contenders:
            if kernel.profile_calls > PRUNE_AFTER_ROUNDS and kernel.timings.get(
                name, 0.0
            ) > PRUNE_RATIO * min(kernel.timings.values(), default=math.inf):
                continue  # far behind the best variant after the first calls: cannot win
            try:
                results[name] = profile(
                    kernel.variants[name], inputs, session=self._timing, **options
                )
            except Exception as exc:
                if name == "triton":
                    raise
                kernel.notes.append(
                    f"{name} variant failed to profile: {type(exc).__name__}: {exc}"
                )
        if not results:
            raise BackendError(
                "no variant of this plan could be profiled: " + "; ".join(kernel.notes[-3:])
            )
        for name, r in results.items():
            kernel.timings[name] = min(kernel.timings.get(name, math.inf), r.median_us)
        # cold times within COLD_TIE_RATIO do not order the variants: the one faster with
        # its inputs in L2 wins (the interpreter's wall-clock times break no ties)
        best, _ = pick_cold_tie(
            {n: kernel.timings[n] for n in results},
            lambda n: None if kernel.interpret else self._warm_us(kernel, n, inputs),
        )
        kernel.variant = best
        if not kernel.interpret:
            self._remember_variant(kernel.plan, best, kernel.timings)
        return results[best]

    def _warm_us(self, kernel: CudaKernel, name: str, inputs: Sequence[Any]) -> float:
        if name not in kernel.warm_timings:
            kernel.warm_timings[name] = warm_median_us(kernel.variants[name], inputs)
        return kernel.warm_timings[name]

    def warm_time_us(self, launcher: Any, inputs: Any) -> float | None:
        """CUDA-graph replay time of the variant ``launcher`` runs, on ``inputs`` alone with
        nothing flushed (its inputs in L2)."""
        if getattr(launcher, "interpret", False):
            return None  # the interpreter's wall-clock times cannot break ties
        if not isinstance(launcher, CudaKernel):
            return warm_median_us(launcher, inputs)
        return self._warm_us(launcher, launcher.variant, inputs)

    def _checked(
        self, kernel: CudaKernel, contenders: dict[str, CudaLauncher], inputs: Sequence[Any]
    ) -> list[str]:
        """The contenders whose outputs agree with the (reference-checked) Triton variant's."""
        base = kernel.variants["triton"]
        ref_out = None
        keep = []
        for name, var in contenders.items():
            if name != "triton":
                try:
                    if ref_out is None:
                        ref_out = base(*inputs)
                    err = _max_rel_err(var(*inputs), ref_out)
                except Exception as exc:
                    kernel.notes.append(
                        f"{name} variant failed to run: {type(exc).__name__}: {exc}"
                    )
                    continue
                tol = 2e-2 if any(dt != "float32" for _, dt in var.output_specs) else 1e-4
                if not err <= tol:
                    kernel.notes.append(
                        f"{name} variant disagrees with triton (rel err {err:.3g} > {tol}); dropped"
                    )
                    continue
            keep.append(name)
        return keep

    def _contenders(self, kernel: CudaKernel, inputs: Sequence[Any]) -> dict[str, CudaLauncher]:
        """The variants worth a full profile: a short screen (a few CUDA-graph replays, so
        that host launch overhead, which differs between the Triton and driver-API paths,
        does not decide) drops those over ``SCREEN_FACTOR`` times the fastest, so a slow
        path (often the plain CUDA C++ one) costs milliseconds, not a full profile."""
        if self.interpret or len(kernel.variants) < 2:
            return dict(kernel.variants)
        quick: dict[str, float] = {}
        for name, var in kernel.variants.items():
            try:
                launch, replay, _ = time_callable(
                    var.run_unchecked, [list(inputs)], warmup=2, repeats=5, calls_per_graph=3
                )
                quick[name] = min(replay or launch)
            except Exception as exc:
                kernel.notes.append(f"{name} variant failed to run: {type(exc).__name__}: {exc}")
        fastest = min(quick.values(), default=0.0)
        keep = {
            n: v
            for n, v in kernel.variants.items()
            if (n in quick and quick[n] <= SCREEN_FACTOR * fastest) or (n == "triton" and not quick)
        }
        for n in kernel.variants:
            if n not in keep and n in quick:
                kernel.notes.append(
                    f"{n} variant screened out ({quick[n]:.1f} µs vs {fastest:.1f} µs)"
                )
        return keep

    # -- variant memory ----------------------------------------------------------------------------
    def _variant_path(self, plan: Plan) -> Path:
        info = _toolchain.device_info()
        parts = {
            "plan": hashlib.sha256(plan.text.encode()).hexdigest(),
            "device": info.name if info else "none",
            "version": self.package_version,
            "codegen": CODEGEN_VERSION,  # what each variant name prints
        }
        return plugin.entry_path("cuda-variant", parts, ".json")

    def _remembered_variant(self, plan: Plan) -> str | None:
        if self.interpret:
            return None
        try:
            data = plugin.read_json(self._variant_path(plan))
        except Exception:
            return None
        return str(data["variant"]) if data and "variant" in data else None

    def _remember_variant(self, plan: Plan, variant: str, timings: dict[str, float]) -> None:
        try:
            path = self._variant_path(plan)
            with plugin.locked(path):
                plugin.write_json(path, {"variant": variant, "timings_us": timings})
        except Exception:
            pass


def _host_module(src: CudaCppSource) -> Any:
    import types

    mod = types.ModuleType(f"yirage_cuda_host_{src.digest[:16]}")
    exec(compile(src.host, f"<yirage-cuda host {src.digest[:16]}>", "exec"), mod.__dict__)
    return mod


def _max_rel_err(actual: Sequence[Any], expected: Sequence[Any]) -> float:
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        a64, e64 = a.detach().double(), e.detach().double()
        if not bool(a64.isfinite().all()):
            return float("inf")
        denom = float(e64.norm())
        err = float((a64 - e64).norm())
        worst = max(worst, err / denom if denom > 0 else err)
    return worst
