"""Ahead-of-time checks of a printed Pallas module without a TPU: lowering for the TPU
platform (``jax.export``, which runs Pallas' Mosaic lowering) and a deviceless compile for a
TPU topology (libtpu's real compiler, through ``jax.experimental.topologies``).

Both need only jax; the compile also needs libtpu (``pip install "jax[tpu]"``), which on a
machine without a TPU prints warnings about missing TPU host variables and compiles anyway.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from yirage.plugin import BackendError

__all__ = ["AotResult", "compile_for_topology", "lower_for_tpu"]

#: Topologies the CI compiles every chosen candidate for (a v5e and a v6e slice).
CI_TOPOLOGIES = ("v5e:2x2", "v6e:2x2")


@dataclass(frozen=True)
class AotResult:
    """What one lowering or compile did: the target, the seconds it took and how many
    Mosaic kernels (``tpu_custom_call``) the TPU program holds."""

    target: str
    seconds: float
    mosaic_kernels: int
    device_kind: str = ""

    def __str__(self) -> str:
        kind = f" ({self.device_kind})" if self.device_kind else ""
        return (
            f"{self.target}{kind}: {self.mosaic_kernels} Mosaic kernel(s) in {self.seconds:.2f} s"
        )


def _structs(specs: Sequence[tuple[Sequence[int], str]], sharding: Any = None) -> list[Any]:
    import jax
    import jax.numpy as jnp

    struct: Any = jax.ShapeDtypeStruct
    return [struct(tuple(d), getattr(jnp, dt), sharding=sharding) for d, dt in specs]


def lower_for_tpu(module: ModuleType) -> AotResult:
    """Export ``module.forward`` for the TPU platform from any host (Mosaic lowering of
    every pallas_call); BackendError with jax's message when a kernel does not lower."""
    import jax
    from jax import export

    t0 = time.perf_counter()
    try:
        exp = export.export(jax.jit(module.forward), platforms=["tpu"])(*_structs(module.INPUTS))
        text = exp.mlir_module()
    except Exception as exc:
        raise BackendError(
            f"the printed Pallas module (plan {module.PLAN_HASH[:12]}) does not lower for "
            f"the TPU: {type(exc).__name__}: {exc}"
        ) from exc
    return AotResult("tpu lowering", time.perf_counter() - t0, text.count("tpu_custom_call"))


def compile_for_topology(module: ModuleType, topology: str) -> AotResult:
    """Compile ``module.forward`` with libtpu for one chip of ``topology`` (e.g.
    ``"v5e:2x2"``) without a TPU; BackendError naming the fix when libtpu is missing or the
    compiler refuses a kernel."""
    import jax
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    t0 = time.perf_counter()
    try:
        desc = topologies.get_topology_desc(topology, platform="tpu")
    except Exception as exc:
        raise BackendError(
            f"no TPU compiler for topology {topology!r} ({type(exc).__name__}: {exc}); "
            f'libtpu comes with pip install "jax[tpu]", and one process at a time may use it'
        ) from exc
    device = desc.devices[0]
    structs = _structs(module.INPUTS, SingleDeviceSharding(device))
    try:
        lowered = jax.jit(module.forward).lower(*structs)
        text = lowered.as_text()
        lowered.compile()
    except Exception as exc:
        raise BackendError(
            f"libtpu did not compile the printed Pallas module (plan {module.PLAN_HASH[:12]}) "
            f"for {topology}: {type(exc).__name__}: {exc}"
        ) from exc
    return AotResult(
        f"compile {topology}",
        time.perf_counter() - t0,
        text.count("tpu_custom_call"),
        str(getattr(device, "device_kind", "?")),
    )
