"""The Google TPU Backend: KernelPlans printed as JAX Pallas, run through jax (on a TPU, or in
Pallas interpret mode on jax's CPU backend)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yirage import plugin
from yirage.plan import parse_plan
from yirage.plugin import (
    Backend,
    BackendError,
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
)
from yirage_tpu import _device_spec, _probe
from yirage_tpu._pallas import CODEGEN_VERSION, PallasSource, generate_pallas
from yirage_tpu._probe import JAX_HINT
from yirage_tpu._runtime import (
    PallasLauncher,
    ProfileResult,
    load_module,
    profile,
    require_jax,
    to_jax,
)

__all__ = ["MODULE_CACHE", "PallasArtifact", "TpuBackend"]

#: Cache kind of printed Pallas modules.
MODULE_CACHE = "tpu-pallas"
#: The chip the interpret-mode backend searches and prints for by default.
DEFAULT_INTERPRET_CHIP = "TPU v5e"


@dataclass(frozen=True)
class PallasArtifact:
    """A printed module written into the cache."""

    source: PallasSource
    path: Path
    interpret: bool


class TpuBackend(Backend):
    """Google TPU: Pallas printing of KernelPlans, jit-compiled through jax.

    ``TpuBackend()`` (the registered backend) runs on the TPU jax sees; ``TpuBackend(
    interpret=True)`` runs the same printed kernels in Pallas interpret mode on jax's CPU
    backend and searches with the DeviceSpec of ``chip`` (a key of the datasheet table)."""

    name = "tpu"
    #: The plugin API this package was written against, declared here rather than inherited
    #: (inherited, it would always equal the installed yirage's and the registry's version
    #: check could never fire).
    plugin_api = (1, 2)
    distribution = "yirage-tpu"
    #: Every candidate's kernels ran in Pallas interpret mode against the float64 reference
    #: and compiled with libtpu for v5e and v6e (tests/tpu); none has run on a TPU yet.
    verification_level = VerificationLevel.EMULATED
    source_suffix = ".py"

    def __init__(self, interpret: bool = False, *, chip: str = DEFAULT_INTERPRET_CHIP) -> None:
        if chip not in _device_spec.KNOWN_DEVICES:
            known = ", ".join(sorted(_device_spec.KNOWN_DEVICES))
            raise BackendError(f"unknown TPU chip {chip!r}; use one of {known}")
        self.interpret = bool(interpret)
        self.chip = chip

    @property
    def codegen_versions(self) -> dict[str, str]:
        return {"pallas": CODEGEN_VERSION}

    # -- probe / device ------------------------------------------------------------------
    def probe(self) -> ProbeResult:
        if not self.interpret:
            return _probe.probe()
        tools = _probe.toolchain()
        if importlib.util.find_spec("jax") is None:
            return ProbeResult(False, f"jax not installed: {JAX_HINT}", None, tools)
        return ProbeResult(
            True,
            "Pallas interpret mode on jax's CPU backend (emulated; no TPU used)",
            f"Pallas interpreter ({self.chip} spec)",
            tools,
        )

    def device_spec(self) -> DeviceSpec:
        if self.interpret:
            return _device_spec.KNOWN_DEVICES[self.chip]
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)

    def toolchain(self) -> dict[str, str]:
        tools = _probe.toolchain()
        if self.interpret:
            tools["mode"] = "Pallas interpret mode (CPU)"
        return tools

    # -- tensors -------------------------------------------------------------------------
    def from_numpy(self, arrays: Sequence[Any], dtypes: Sequence[str]) -> list[Any]:
        """float32 numpy arrays as jax arrays in ``dtypes`` on jax's default device."""
        require_jax()
        import jax.numpy as jnp

        return [jnp.asarray(a, dtype=d) for a, d in zip(arrays, dtypes, strict=True)]

    def random_inputs(self, specs: Sequence[tuple[Sequence[int], str]], seed: int = 0) -> list[Any]:
        import numpy as np

        rng = np.random.default_rng(seed)
        arrays = [rng.standard_normal(tuple(d)).astype(np.float32) for d, _ in specs]
        return self.from_numpy(arrays, [dt for _, dt in specs])

    # -- codegen / compile / load ------------------------------------------------------------
    def codegen(self, plan: Any) -> PallasSource:
        """Print a KernelPlan as a Pallas module; a block that breaks the TPU tiling rule is
        refused (CodegenError naming the rule) before any compiler sees it."""
        return generate_pallas(parse_plan(plan), self.device_spec())

    def compile(self, source: Any) -> PallasArtifact:
        """Write the module into the cache; jax compiles it at the first call (per shape)."""
        if not isinstance(source, PallasSource):
            raise BackendError(
                f"the tpu backend compiles what its codegen() returns, got {type(source).__name__}"
            )
        path = plugin.entry_path(MODULE_CACHE, {"key": source.key}, ".py")
        data = source.text.encode()
        with plugin.locked(path):
            if plugin.load_verified_artifact(path) != data:
                plugin.store_artifact(path, data)
        return PallasArtifact(source, path, self.interpret)

    def load(self, artifact: Any) -> PallasLauncher:
        if not isinstance(artifact, PallasArtifact):
            raise BackendError(
                f"the tpu backend loads what its compile() returns, got {type(artifact).__name__}"
            )
        if plugin.verified_path(artifact.path) is None:
            raise BackendError(
                f"the cached Pallas module {artifact.path} is missing or damaged; compile again"
            )
        module = load_module(artifact.path, f"yirage_tpu_pallas_{artifact.source.key}")
        return PallasLauncher(
            artifact.source.plan, artifact.source.text, module, interpret=artifact.interpret
        )

    def profile(
        self, launcher: Any, inputs: Sequence[Any] | None = None, **options: Any
    ) -> ProfileResult:
        """Median of calls each waited for with ``block_until_ready`` (interpret mode times
        the CPU emulation, which says nothing about a TPU)."""
        if inputs is None:
            inputs = self.random_inputs(launcher.input_specs)
        return profile(launcher, [to_jax(x) for x in inputs], **options)
