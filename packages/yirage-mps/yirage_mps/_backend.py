"""The Apple Metal (MPS) Backend object.

``codegen`` prints a plan's generated kernels as Metal Shading Language
(:func:`yirage_mps.generate_msl`), ``compile`` builds them with ``torch.mps.compile_shader``
on a Mac, ``load`` returns a launcher on ``mps`` tensors and ``profile`` times it with MPS
events. ``MpsBackend(emulate=True)`` compiles the printed MSL as C++ for the emulator and runs
it on CPU tensors instead (how CI runs the printed code without a Mac: "ran emulated").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from yirage.plan import parse_plan
from yirage.plugin import (
    Backend,
    BackendError,
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
)
from yirage_mps import _device_spec, _probe
from yirage_mps._msl_codegen import CODEGEN_VERSION, MslOptions, MslSource, generate_msl
from yirage_mps._runtime import (
    EmulatedLauncher,
    MpsLauncher,
    MslLauncher,
    ProfileResult,
    compile_on_mps,
    profile,
)

__all__ = ["MpsArtifact", "MpsBackend"]


@dataclass(frozen=True)
class MpsArtifact:
    """A compiled plan: the Metal library on a Mac (``library``), or None under the emulator
    (whose build is the launcher's)."""

    source: MslSource
    library: Any = None
    emulated: bool = False


class MpsBackend(Backend):
    """Apple Metal: MSL code generation from KernelPlans, run on torch.mps (or emulated)."""

    name = "mps"
    #: The plugin API this package was written against, declared here rather than inherited
    #: (inherited, it would always equal the installed yirage's and the registry's version
    #: check could never fire).
    plugin_api = (1, 2)
    distribution = "yirage-mps"
    #: No printed kernel has been compiled by Metal or run on an Apple GPU yet: CI runs them
    #: in the C++ emulator (docs/backends.md).
    verification_level = VerificationLevel.EMULATED

    def __init__(self, emulate: bool = False, options: MslOptions | None = None) -> None:
        self.emulate = emulate
        self.options = options or MslOptions()

    # -- hardware -----------------------------------------------------------------------------
    def probe(self) -> ProbeResult:
        return _probe.probe()

    def device_spec(self) -> DeviceSpec:
        """The live spec of this Mac's GPU; under the emulator the M2 Ultra table entry (the
        Metal limits the printer keeps to are those of every Apple GPU)."""
        if self.emulate:
            return _device_spec.M2_ULTRA
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)

    @property
    def codegen_versions(self) -> dict[str, str]:
        return {"msl": CODEGEN_VERSION}

    @property
    def torch_device(self) -> str | None:
        return "cpu" if self.emulate else "mps"

    def toolchain(self) -> dict[str, str]:
        tools = _probe.toolchain()
        if self.emulate:
            from yirage_mps._emulate import host_compiler

            tools["mode"] = f"MSL emulator (C++20, {host_compiler() or 'no host compiler'})"
        return tools

    # -- code generation ------------------------------------------------------------------------
    def codegen(self, plan: Any) -> MslSource:
        """Print a KernelPlan (object with ``kernel_plan()``/``to_json()``, JSON text or dict)
        as MSL; CodegenError when a kernel needs more than the 32 KiB of threadgroup memory."""
        return generate_msl(parse_plan(plan), self.options)

    def compile(self, source: Any) -> MpsArtifact:
        if not isinstance(source, MslSource):
            raise BackendError(
                "the mps backend compiles what its codegen() returns (an MslSource), "
                f"got {type(source).__name__}"
            )
        if self.emulate:
            return MpsArtifact(source, emulated=True)
        return MpsArtifact(source, compile_on_mps(source))

    def load(self, artifact: Any) -> MslLauncher:
        if not isinstance(artifact, MpsArtifact):
            raise BackendError(
                "the mps backend loads what its compile() returns (an MpsArtifact), "
                f"got {type(artifact).__name__}"
            )
        if artifact.emulated:
            return EmulatedLauncher(artifact.source)
        return MpsLauncher(artifact.source, artifact.library)

    def profile(self, launcher: Any, inputs: Any = None, **options: Any) -> ProfileResult:
        """Time ``launcher`` on ``inputs`` (random ones when None): MPS events on the GPU,
        wall clock under the emulator."""
        if inputs is None:
            specs = launcher.input_specs
            import numpy as np

            rng = np.random.default_rng(0)
            arrays = [rng.standard_normal(dims).astype(np.float32) for dims, _ in specs]
            inputs = self.from_numpy(arrays, [d for _, d in specs])
        return profile(launcher, inputs, **options)
