"""The CPU Backend object: probe, DeviceSpec, and the codegen → compile → load → profile steps.

Verification level: ran on hardware (the generated C runs on the host CPU in CI).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from yirage.plugin import (
    DEFAULT_VARIANT,
    Backend,
    BackendError,
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
)
from yirage_cpu import _codegen, _device_spec, _eager, _probe, _runtime, _toolchain

#: The variant of a plan whose bfloat16 matmuls widen B to float32 and use FMAs, raced
#: beside the AVX512-BF16 dot path: which one is faster depends on the core (the dot
#: path ran bfloat16 at 8 rows in 0.37-0.65x the float32 time on an AMD EPYC, and 1.3-1.5x
#: slower than widening on an Intel Xeon).
WIDEN_VARIANT = "bf16_widen"


class _Variants(Mapping[str, Any]):
    """Variant launchers built on first use: a warm call takes one variant by name, and
    printing and loading the others would be wasted."""

    def __init__(self, build: Mapping[str, Callable[[], Any]]) -> None:
        self._build = build
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = self._build[name]()
        return self._built[name]

    def __contains__(self, name: object) -> bool:  # Mapping's would build the launcher
        return name in self._build

    def __iter__(self) -> Iterator[str]:
        return iter(self._build)

    def __len__(self) -> int:
        return len(self._build)


@dataclass(frozen=True)
class CpuArtifact:
    """A compiled program: the printed source and the shared object in the cache."""

    source: _codegen.CpuSource
    library: _toolchain.CompiledLibrary

    @property
    def cache_hit(self) -> bool:
        return self.library.cache_hit

    @property
    def compile_seconds(self) -> float:
        return self.library.compile_seconds


class CpuBackend(Backend):
    """The host CPU: C11 + OpenMP + SIMD code from KernelPlans, built by the system C
    compiler, run through ctypes on numpy arrays and torch CPU tensors."""

    name = "cpu"
    #: The plugin API this package was written against (yirage.PLUGIN_API when it was
    #: built). Declared, not inherited from yirage.Backend: inherited, it would always equal
    #: the installed meta package's PLUGIN_API and the registry's check could never catch a
    #: mismatch; declared, a yirage of another major API version refuses this backend with an
    #: error that names the versions to install.
    plugin_api = (1, 1)
    distribution = "yirage-cpu"
    verification_level = VerificationLevel.HARDWARE
    #: File suffix of the generated source (used when a kernel is saved).
    source_suffix = ".c"

    _version: str | None = None

    @property
    def package_version(self) -> str:
        """The yirage-cpu version (looked up once: it keys every warm-path cache lookup)."""
        if self._version is None:
            self._version = Backend.package_version.fget(self)  # type: ignore[attr-defined]
        return self._version

    @property
    def codegen_versions(self) -> dict[str, str]:
        return {"cpu": _codegen.CODEGEN_VERSION}

    def probe(self) -> ProbeResult:
        return _probe.probe()

    def device_spec(self) -> DeviceSpec:
        """The live spec; ``simd_width_bits`` is the width generated code is compiled for
        (:func:`yirage_cpu._toolchain.host_simd_width_bits`: the detected ISA's with
        ``-march=native``, 128 bits with the portable flags), so the search's cost model, the
        cache keys built from the spec and the printer agree with the compile; ``isa_features``
        are the features that compile enables (:meth:`isa_features`)."""
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        bits = _toolchain.host_simd_width_bits(spec.simd_width_bits)
        if bits != spec.simd_width_bits:
            spec = dataclasses.replace(spec, simd_width_bits=bits)
        if hasattr(spec, "isa_features"):  # a yirage whose DeviceSpec records them
            spec = dataclasses.replace(spec, isa_features=_features_for(bits))
        return spec

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)

    def _simd_bits(self) -> int:
        """The vector width to print for: the DeviceSpec's (which follows the flags)."""
        try:
            return int(self.device_spec().simd_width_bits or _toolchain.PORTABLE_SIMD_BITS)
        except Exception:
            return _toolchain.PORTABLE_SIMD_BITS

    def isa_features(self) -> tuple[str, ...]:
        """The vector ISA features generated code is compiled for (/proc/cpuinfo's spelling:
        ``avx512f``, ``avx512_bf16``, ...): those the compile flags enable, with
        ``-march=native`` the host's (:func:`yirage_cpu._toolchain.isa_features`). The
        printer prints the paths of these features only (the bfloat16 dot path needs
        ``avx512_bf16``). Empty without a usable compiler (nothing is built then)."""
        return _features_for(self._simd_bits())

    # -- the pipeline ------------------------------------------------------------------------
    def codegen(self, plan: Any, *, bf16_dot: bool = True) -> _codegen.CpuSource:
        """Print a KernelPlan (object with ``to_json()``, JSON text or dict) as C source for
        the vector width and ISA features the code is compiled for; ``bf16_dot=False``
        leaves out the bfloat16 dot path (the ``bf16_widen`` variant)."""
        return _codegen.generate(
            plan,
            simd_width_bits=self._simd_bits(),
            isa_features=self.isa_features(),
            bf16_dot=bf16_dot,
        )

    def compile(self, source: Any) -> CpuArtifact:
        """Compile printed source (from :meth:`codegen`) into the disk cache."""
        if not isinstance(source, _codegen.CpuSource):
            raise BackendError(
                f"the cpu backend compiles what its codegen() returns (a CpuSource), got "
                f"{type(source).__name__}"
            )
        lib = _toolchain.compile_shared(
            source.code,
            simd_width_bits=source.simd_width_bits,
            name=str(source.plan.get("graph_hash", "kernel"))[:16],
        )
        return CpuArtifact(source, lib)

    def load(self, artifact: Any) -> _runtime.CpuLauncher:
        """Load a compiled artifact; a corrupt cache entry is rebuilt once."""
        if not isinstance(artifact, CpuArtifact):
            raise BackendError(
                f"the cpu backend loads what its compile() returns, got {type(artifact).__name__}"
            )
        try:
            return _runtime.CpuLauncher(artifact.source, artifact.library)
        except OSError:
            _toolchain.forget(artifact.library)
            rebuilt = self.compile(artifact.source)
            return _runtime.CpuLauncher(rebuilt.source, rebuilt.library)

    def variants(self, launcher: Any) -> Mapping[str, Any]:
        """The generated C (``DEFAULT_VARIANT``); where it multiplies bfloat16 with the
        AVX512-BF16 dot path, the same plan printed without it (``bf16_widen``); and, for a
        plan of library kernels alone where torch is installed, the same plan as PyTorch
        eager runs it (:mod:`yirage_cpu._eager`, ``torch_eager``): numpy's library calls are
        well behind eager on compute-bound graphs, and the race must have eager among its
        contenders. The others are built when first looked up."""
        out: dict[str, Callable[[], Any]] = {DEFAULT_VARIANT: lambda: launcher}
        if isinstance(launcher, _runtime.CpuLauncher) and launcher.program.bf16_dot:
            plan = launcher.program.plan
            out[WIDEN_VARIANT] = lambda: self.load(self.compile(self.codegen(plan, bf16_dot=False)))
        if (
            isinstance(launcher, _runtime.CpuLauncher)
            and _eager.eager_applies(launcher.program.plan)
            and importlib.util.find_spec("torch") is not None
        ):
            out[_eager.EAGER_VARIANT] = lambda: _eager.EagerLauncher(launcher)
        return _Variants(out)

    def profile(
        self, launcher: Any, inputs: Sequence[Any] | None = None, **options: Any
    ) -> _runtime.ProfileResult:
        """Median time of ``launcher`` on ``inputs`` (fresh random inputs when None)."""
        if inputs is None:
            inputs = self.random_inputs(launcher.input_specs)
        return _runtime.profile(launcher, inputs, **options)

    # -- tensors -----------------------------------------------------------------------------
    def random_inputs(
        self, specs: Sequence[tuple[Sequence[int], str]], *, seed: int = 0
    ) -> list[Any]:
        """Standard-normal inputs of the given (dims, dtype name) on this device (numpy
        arrays; torch CPU tensors for bfloat16, which numpy cannot hold)."""
        return _runtime.random_inputs(specs, seed=seed)

    def from_numpy(self, arrays: Sequence[Any], dtypes: Sequence[str]) -> list[Any]:
        """float32 numpy arrays → this backend's tensors in ``dtypes`` (numpy arrays, 64-byte
        aligned like torch's CPU tensors; torch CPU tensors for bfloat16)."""
        import numpy as np

        out: list[Any] = []
        for a, d in zip(arrays, dtypes, strict=True):
            if d == "bfloat16":
                import torch

                out.append(
                    torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
                )
            else:
                src = np.asarray(a)
                dst = _runtime._aligned_empty(
                    src.shape, np.dtype(np.float16 if d == "float16" else np.float32)
                )
                dst[...] = src
                out.append(dst)
        return out

    def to_numpy(self, tensor: Any) -> Any:
        """A float64 numpy copy of a tensor this backend produced or accepts."""
        import numpy as np

        if type(tensor).__module__.startswith("torch"):
            return tensor.detach().to("cpu").double().numpy()
        return np.asarray(tensor, dtype=np.float64)

    def toolchain(self) -> dict[str, str]:
        """The compiler and flags generated code is built with (raises when there is none)."""
        cc = _toolchain.find_compiler()
        bits = self._simd_bits()
        flags, notes = _toolchain.select_flags(cc, bits)
        info = {"compiler": cc.describe(), "flags": " ".join(flags), "simd_width_bits": str(bits)}
        info.update(_toolchain.isa_report(cc, flags, bits))
        if notes:
            info["notes"] = "; ".join(notes)
        return info


def _features_for(simd_width_bits: int) -> tuple[str, ...]:
    """The vector ISA features the compile for ``simd_width_bits`` enables (empty without a
    usable compiler: nothing is built then)."""
    try:
        cc = _toolchain.find_compiler()
        flags, _ = _toolchain.select_flags(cc, simd_width_bits)
    except BackendError:
        return ()
    return _toolchain.isa_features(set(_toolchain.predefined_macros(cc, flags)))
