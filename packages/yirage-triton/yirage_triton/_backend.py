"""The reusable Triton Backend: codegen, compile, load, variants, profile and precompile for
any :class:`~yirage_triton.TritonTarget`.

``codegen`` prints a KernelPlan as Triton ("triton") and, per the target's variant families,
as further printings of the same plan (:meth:`TritonBackend.printings`): the for-loops of
kernels that leave compute units idle split across extra blocks, the last part of each block
combining the parts ("triton_split", split-K / flash-decoding, as many ways as the plan's
``loop_split`` of each kernel says), split half and a quarter as many ways, with deeper
pipelines, with finer loop chunks, and with a normalised dot operand multiplied raw and the
product scaled. ``compile`` writes every module into the cache; ``load`` returns a
:class:`TritonKernel` holding a launcher per printing; :meth:`TritonBackend.variants` hands
them to ``superoptimize``, which checks and times each (``profile`` only times the launcher
it is given).

A vendor backend subclasses TritonBackend, sets ``target`` and implements the hardware hooks
(:meth:`~TritonBackend.probe_device`, :meth:`~TritonBackend.live_device_spec`,
:meth:`~TritonBackend.interpreter_spec`). With ``interpret=True`` the kernels run in the
Triton interpreter on CPU tensors (no device): that is how CI runs the generated code.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib.util
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from yirage import plugin
from yirage.plan import CodegenError, Plan, parse_plan
from yirage.plugin import (
    Backend,
    BackendError,
    DeviceSpec,
    ProbeResult,
    get_logger,
)
from yirage_triton import _toolchain
from yirage_triton._align import misaligned_inputs
from yirage_triton._codegen import CODEGEN_VERSION, TritonOptions, TritonSource, generate_triton
from yirage_triton._host import is_library_plan
from yirage_triton._runtime import (
    Launcher,
    ProfileResult,
    TimingSession,
    TritonLauncher,
    profile,
    warm_median_us,
)
from yirage_triton._sdpa import attention_chains
from yirage_triton._subtile import loop_subtile
from yirage_triton._target import TritonTarget

__all__ = ["TritonArtifact", "TritonBackend", "TritonKernel", "TritonPrinted"]

_log = get_logger(__name__)

#: Triton backends whose compile options have ``enable_fp_fusion`` (see
#: ``TritonOptions.exact_softmax_shift``).
_FP_FUSION_BACKENDS = ("cuda", "hip")


@dataclass
class TritonPrinted:
    """What :meth:`TritonBackend.codegen` returns: the plain Triton module (``code``) and the
    further printings of the plan by variant name."""

    plan: Plan
    triton: TritonSource
    #: "triton_split" (the under-filled kernels' loops split), "triton_split_half" /
    #: "triton_split_quarter" (split half / a quarter as many ways), "triton_deep" /
    #: "triton_split_deep" (deeper pipelines), "triton_fine" / "triton_fine_deep" (loop
    #: chunks cut finer, deeper pipelines), "triton_split_scaled" / "triton_scaled" (a
    #: normalised dot operand multiplied raw, the product scaled)
    triton_variants: dict[str, TritonSource] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return self.triton.text

    def __str__(self) -> str:
        return self.code


@dataclass
class TritonArtifact:
    """The cached module of every printing of :attr:`source`."""

    source: TritonPrinted
    triton_path: Path
    interpret: bool
    #: module path of each of ``source.triton_variants``
    triton_variant_paths: dict[str, Path] = field(default_factory=dict)
    cache_hit: bool = False
    compile_seconds: float = 0.0


@dataclass
class TritonKernel:
    """Launchers of one plan by variant name; calls run :attr:`variant` ("triton" unless
    set). ``superoptimize`` races the launchers of :attr:`variants` one by one."""

    variants: dict[str, Any]
    variant: str = "triton"
    notes: list[str] = field(default_factory=list)

    @property
    def active(self) -> Any:
        return self.variants[self.variant]

    @property
    def plan(self) -> Plan:
        return self.variants["triton"].plan  # type: ignore[no-any-return]

    @property
    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return self.active.input_specs  # type: ignore[no-any-return]

    @property
    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return self.active.output_specs  # type: ignore[no-any-return]

    @property
    def interpret(self) -> bool:
        return bool(self.active.interpret)

    @property
    def source(self) -> str:
        return str(self.active.source)

    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        return self.active(*tensors, inputs=inputs)  # type: ignore[no-any-return]

    def run_unchecked(self, inputs: Sequence[Any]) -> list[Any]:
        return self.active.run_unchecked(inputs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<TritonKernel {self.variant} of {sorted(self.variants)}>"


class TritonBackend(Backend):
    """A Backend printing KernelPlans as Triton for :attr:`target`, run through torch."""

    #: What differs per vendor (device namespace, warp width, stages, variant families …).
    target: ClassVar[TritonTarget]
    source_suffix = ".py"

    def __init__(self, interpret: bool = False, *, triton_options: TritonOptions | None = None):
        self.interpret = bool(interpret)
        self.triton_options = triton_options
        self._timing: TimingSession | None = None

    @property
    def codegen_versions(self) -> dict[str, str]:
        return {"triton": CODEGEN_VERSION}

    # -- hooks of the vendor -------------------------------------------------------------------
    def probe_device(self) -> ProbeResult:
        """The hardware probe (the interpreter's is :meth:`probe`'s own). Must never raise."""
        raise NotImplementedError

    def live_device_spec(self) -> DeviceSpec:
        """The spec of the device found here; BackendUnavailableError without one."""
        raise NotImplementedError

    def interpreter_spec(self) -> DeviceSpec:
        """The spec the interpreter prints for (a reference chip of the vendor)."""
        raise NotImplementedError

    def compute_units(self) -> int:
        """Compute units (SMs, CUs) that under-filled kernels' loop splits aim to fill."""
        return int(self.device_spec().compute_units or 1)

    def smem_limit(self) -> int | None:
        """Shared memory per block (bytes) the pipeline stages must fit, None: unchecked."""
        value = getattr(self.device_spec(), "shared_mem_per_block", None)
        return int(value) if value else None

    def use_pdl(self) -> bool:
        """Whether to print programmatic dependent launch (only where the target has it)."""
        return False

    # -- probe / device ------------------------------------------------------------------------
    def probe(self) -> ProbeResult:
        if not self.interpret:
            return self.probe_device()
        try:
            ok = all(importlib.util.find_spec(m) is not None for m in ("triton", "torch"))
            tools = _toolchain.triton_versions()
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

    def device_spec(self) -> DeviceSpec:
        return self.interpreter_spec() if self.interpret else self.live_device_spec()

    def device_count(self) -> int:
        """The device count when every visible device is one model (else 1: timings taken
        on different models would not rank candidates for one of them)."""
        if self.interpret:
            return 1
        api = self._device_api()
        n = int(api.device_count())
        if n <= 1 or len({api.get_device_name(i) for i in range(n)}) != 1:
            return 1
        return n

    def use_device(self, index: int) -> None:
        if self.interpret:
            super().use_device(index)
            return
        self._device_api().set_device(index)

    def toolchain(self) -> dict[str, str]:
        tools = _toolchain.triton_versions()
        if self.interpret:
            tools["mode"] = "Triton interpreter (CPU)"
        return tools

    # -- tensors -------------------------------------------------------------------------------
    @property
    def torch_device(self) -> str:
        return "cpu" if self.interpret else self.target.torch_device

    def from_numpy(self, arrays: Sequence[Any], dtypes: Sequence[str]) -> list[Any]:
        import torch

        return [
            torch.from_numpy(a).to(device=self.torch_device, dtype=getattr(torch, d)).contiguous()
            for a, d in zip(arrays, dtypes, strict=True)
        ]

    def _device_api(self) -> Any:
        import torch

        return getattr(torch, self.target.torch_device)

    def check_input_generator(self) -> str | None:
        """torch's generator of the device (on a GPU its values for a seed depend on the torch
        version and on the launch grid torch picks from the compute-unit count)."""
        import torch

        if self.interpret:
            return f"torch {torch.__version__} randn on cpu"
        api = self._device_api()
        props = api.get_device_properties(api.current_device())
        units = getattr(props, "multi_processor_count", None)
        return f"torch {torch.__version__} randn on {props.name} ({units} SMs)"

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
            self._device_api().current_stream().synchronize()
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

    # -- codegen ---------------------------------------------------------------------------------
    def default_options(self, plan: Plan) -> TritonOptions:
        """The printer's options for ``plan``: the user's, else the target's defaults (and
        programmatic dependent launch, except for safe-softmax (attention) plans, where it
        measured slower or level: benchmarks/README.md, "Why the cuda backend prints these
        variants")."""
        if self.triton_options is not None:
            opts = self.triton_options
        else:
            attention = any(k.safe_softmax for k in plan.generated)
            opts = TritonOptions(
                smem_limit=self.smem_limit(),
                bf16_dot_as_fp32=self.interpret,
                pdl=self.target.pdl and self.use_pdl() and not attention,
                max_stages=self.target.default_stages,
                fp32_dot_precision=self.target.fp32_dot_precisions[0],
                dot_sum_precision=self.target.dot_sum_precision,
                launch_options=self.target.compile_options,
                exact_softmax_shift=self.target.aot_backend in _FP_FUSION_BACKENDS,
            )
        if opts.fp32_dot_precision not in self.target.fp32_dot_precisions:
            raise CodegenError(
                f"fp32_dot_precision {opts.fp32_dot_precision!r} is not offered by the "
                f"{self.target.name} target; use one of {list(self.target.fp32_dot_precisions)}"
            )
        return opts

    def export_options(self, spec: DeviceSpec) -> TritonOptions:
        """The printer's options for a device that is not here (ahead-of-time export): the
        target's defaults and ``spec``'s shared memory per block; no programmatic dependent
        launch (the export's launch glue is the caller's)."""
        return TritonOptions(
            smem_limit=int(spec.shared_mem_per_block) if spec.shared_mem_per_block else None,
            max_stages=self.target.default_stages,
            fp32_dot_precision=self.target.fp32_dot_precisions[0],
            dot_sum_precision=self.target.dot_sum_precision,
            launch_options=self.target.compile_options,
            exact_softmax_shift=self.target.aot_backend in _FP_FUSION_BACKENDS,
        )

    def printings(self, plan: Plan, topts: TritonOptions) -> dict[str, TritonOptions]:
        """The further printings to try beside ``topts``, by variant name. The rules and the
        measurements behind them: benchmarks/README.md, "Why the cuda backend prints these
        variants". None in the interpreter except the split (whose wall-clock times cannot
        choose between the others)."""
        t, live = self.target, not self.interpret
        attention = any(k.safe_softmax for k in plan.generated)
        units = self.compute_units()
        # the core decides each kernel's split (KernelPlan ``loop_split``, one rule and cap)
        splits = tuple(
            (k.name, k.loop_split)
            for k in plan.generated
            if k.loop_split > 1 and not topts.split_loop
        )
        out: dict[str, TritonOptions] = {}
        if splits and t.tries("split"):
            out["triton_split"] = dataclasses.replace(topts, split_loop=splits)
            # half the split: bigger kernels fill the compute units with fewer parts; not for
            # safe-softmax plans, whose split is capped and whose half split never won
            half = tuple((name, n // 2) for name, n in splits if n >= 4)
            if half and live and not attention and t.tries("split_half"):
                out["triton_split_half"] = dataclasses.replace(topts, split_loop=half)
            # a quarter, where that still leaves at most an eighth of the units idle, with
            # the full default pipeline (one block per unit runs the bigger grids in waves)
            grids = {k.name: k.blocks for k in plan.generated}
            quarter = tuple(
                (name, n // 4)
                for name, n in splits
                if n >= 8 and 8 * grids[name] * (n // 4) >= 7 * units
            )
            if quarter and live and t.tries("split_quarter"):
                out["triton_split_quarter"] = dataclasses.replace(
                    topts, split_loop=quarter, num_stages=topts.num_stages or t.default_stages
                )
        free_stages = topts.num_stages is None
        if live and not attention and free_stages and t.tries("deep"):
            if topts.max_stages < t.deep_stages:
                deep = dataclasses.replace(topts, max_stages=t.deep_stages)
                out["triton_deep"] = deep
                if splits and "triton_split" in out:
                    out["triton_split_deep"] = dataclasses.replace(deep, split_loop=splits)
        # finer loop chunks under deeper pipelines (weight-streaming kernels; see _subtile)
        fine = tuple((k.name, f) for k in plan.generated if (f := loop_subtile(k)) > 1)
        if fine and live and not attention and free_stages and not topts.subtile:
            if t.tries("fine"):
                for name, depth in (
                    ("triton_fine", t.deep_stages - 1),
                    ("triton_fine_deep", t.deep_stages),
                ):
                    out[name] = dataclasses.replace(topts, subtile=fine, max_stages=depth)
        # a normalised dot operand multiplied raw and the product scaled: fewer elementwise
        # ops but more registers; a plan without such an operand prints the same text
        if live and not topts.scale_after_dot and t.tries("scaled"):
            base = out.get("triton_split", topts)
            scaled = "triton_split_scaled" if "triton_split" in out else "triton_scaled"
            out[scaled] = dataclasses.replace(base, scale_after_dot=True)
        # misaligned input rows staged into padded copies (see _align): only where kernels
        # reread such an input does the copy pay, which the race measures
        if live and misaligned_inputs(plan) and t.tries("aligned"):
            out["triton_aligned"] = dataclasses.replace(topts, align_rows=True)
        # attention chains of library kernels as one fused call (see _sdpa); no Triton
        # kernel of its own, so the interpreter runs it too
        if t.tries("sdpa") and attention_chains(plan):
            out["torch_sdpa"] = dataclasses.replace(topts, fused_attention=True)
        # the baseline as PyTorch eager runs it (16-bit intermediates; see _host)
        if is_library_plan(plan):
            out["triton_eager"] = dataclasses.replace(topts, eager_library=True)
        return out

    def print_triton(self, plan: Plan) -> tuple[TritonSource, dict[str, TritonSource]]:
        """The plain printing and every further one that prints a different text."""
        topts = self.default_options(plan)
        base = generate_triton(plan, topts)
        texts = {base.text}
        variants: dict[str, TritonSource] = {}
        for name, opts in self.printings(plan, topts).items():
            src = generate_triton(plan, opts)
            if src.text not in texts:  # e.g. no loop deep enough to take more stages
                texts.add(src.text)
                variants[name] = src
        return base, variants

    def codegen(self, plan: Any) -> TritonPrinted:
        """Print a KernelPlan (object with ``kernel_plan()``/``to_json()``, JSON text or dict)."""
        p = parse_plan(plan)
        base, variants = self.print_triton(p)
        return TritonPrinted(p, base, variants)

    # -- compile / load ----------------------------------------------------------------------------
    def write_modules(self, source: TritonPrinted) -> TritonArtifact:
        """Every printing of ``source`` written into the cache."""
        if not isinstance(source, TritonPrinted):
            raise BackendError(
                f"the {self.name} backend compiles what its codegen() returns, "
                f"got {type(source).__name__}"
            )
        t0 = time.perf_counter()
        key = _toolchain.triton_key(source.triton.text, source.triton.codegen_version)
        hit = plugin.entry_path(_toolchain.MODULE_CACHE, key, ".py").is_file()
        path = _toolchain.write_triton_module(source.triton.text, source.triton.codegen_version)
        art = TritonArtifact(source, path, self.interpret, cache_hit=hit)
        for name, src in source.triton_variants.items():
            art.triton_variant_paths[name] = _toolchain.write_triton_module(
                src.text, src.codegen_version
            )
        art.compile_seconds = time.perf_counter() - t0
        return art

    def compile(self, source: Any) -> TritonArtifact:
        return self.write_modules(source)

    def triton_launchers(self, artifact: TritonArtifact) -> dict[str, Launcher]:
        """A launcher per printing of the artifact, "triton" first."""
        if not isinstance(artifact, TritonArtifact):
            raise BackendError(
                f"the {self.name} backend loads what its compile() returns, "
                f"got {type(artifact).__name__}"
            )
        src = artifact.source
        paths = {"triton": artifact.triton_path, **artifact.triton_variant_paths}
        texts = {"triton": src.triton.text, **{n: s.text for n, s in src.triton_variants.items()}}
        return {
            name: TritonLauncher(
                src.plan,
                texts[name],
                _toolchain.load_triton_module(path, interpret=artifact.interpret),
                interpret=artifact.interpret,
                device=self.target.torch_device,
            )
            for name, path in paths.items()
        }

    def load(self, artifact: Any) -> TritonKernel:
        return TritonKernel(self.triton_launchers(artifact))

    def variants(self, launcher: Any) -> Mapping[str, Any]:
        """The launcher of every printed variant of ``launcher``'s plan, by name."""
        if isinstance(launcher, TritonKernel):
            return dict(launcher.variants)
        return {"triton": launcher}

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
            for v in (k.variants.values() if isinstance(k, TritonKernel) else [k])
            if isinstance(v, TritonLauncher) and hasattr(v.module, "warmup")
        }
        if async_mode is None or not modules:
            return
        workers = max(1, min(len(modules) * 2, os.cpu_count() or 1, 32))
        with ThreadPoolExecutor(workers, thread_name_prefix="yirage-triton") as pool:
            compile_all(async_mode, pool, list(modules.values()), list(inputs))

    # -- timing ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def profiling_session(self) -> Iterator[None]:
        """Profiling rounds inside share one :class:`~yirage_triton.TimingSession`: each
        launcher's graphs are captured and its repeat count fitted once, then only replayed
        (on the H100 host profiling went from 2.0-3.9 s to 1.3-2.4 s per workload; the rest
        is the replays themselves)."""
        outer, self._timing = self._timing, TimingSession()
        try:
            yield
        finally:
            self._timing = outer

    def profile(
        self, launcher: Any, inputs: Sequence[Any] | None = None, **options: Any
    ) -> ProfileResult:
        """Time ``launcher`` alone (a kernel: the variant it runs): the median graph replay
        time, see :func:`~yirage_triton.profile`. No variant is chosen here: superoptimize
        races the launchers of :meth:`variants`."""
        one = launcher.active if isinstance(launcher, TritonKernel) else launcher
        if inputs is None:
            inputs = self.random_inputs(one.input_specs)
        return profile(one, inputs, session=self._timing, **options)

    def warm_time_us(self, launcher: Any, inputs: Any) -> float | None:
        """Graph replay time of ``launcher`` on ``inputs`` alone with nothing flushed (its
        inputs in L2); None in the interpreter, whose wall-clock times break no ties."""
        one = launcher.active if isinstance(launcher, TritonKernel) else launcher
        if getattr(one, "interpret", False):
            return None
        return warm_median_us(one, inputs)


def compile_all(
    async_mode: Any, pool: ThreadPoolExecutor, modules: list[Any], inputs: list[Any]
) -> None:
    """Warm up (compile) every module's kernels for ``inputs`` under Triton's asynchronous
    compile mode on ``pool``; failures are left to each kernel's first run to report.

    It runs in a copy of the caller's context: Triton 3.6's mode stays active when a kernel
    fails to compile (its exit raises before it resets itself), and every later compile on
    the thread then went to ``pool`` after its shutdown ("cannot schedule new futures after
    shutdown"), so the next ``superoptimize`` lost all its Triton variants."""
    contextvars.copy_context().run(_compile_in_mode, async_mode, pool, modules, inputs)


def _compile_in_mode(
    async_mode: Any, pool: ThreadPoolExecutor, modules: list[Any], inputs: list[Any]
) -> None:
    try:
        mode = async_mode(pool, ignore_errors=True)
    except TypeError:  # a Triton without the option
        mode = async_mode(pool)
    try:
        with mode:
            for module in modules:
                try:
                    module.warmup(inputs)
                except Exception as exc:
                    _log.debug("precompile of %s failed: %s", module.__name__, exc)
    except Exception as exc:
        _log.debug("precompile failed: %s", exc)
