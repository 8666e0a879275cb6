"""The Google TPU backend of yirage: KernelPlans printed as JAX Pallas (Mosaic) kernels, run
on a TPU through jax or in Pallas interpret mode on the CPU, lowered and compiled for TPU
topologies without a device.

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
Nothing here imports jax until a kernel is loaded, lowered or compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from yirage_tpu._aot import CI_TOPOLOGIES, AotResult, compile_for_topology, lower_for_tpu
from yirage_tpu._backend import PallasArtifact, TpuBackend
from yirage_tpu._device_spec import KNOWN_CHIPS, KNOWN_DEVICES, TPU_TILING, TpuChip
from yirage_tpu._pallas import CODEGEN_VERSION, PallasSource, check_blocks, generate_pallas
from yirage_tpu._runtime import PallasLauncher, ProfileResult

if TYPE_CHECKING:
    from yirage import Backend

__all__ = [
    "CI_TOPOLOGIES",
    "CODEGEN_VERSION",
    "KNOWN_CHIPS",
    "KNOWN_DEVICES",
    "TPU_TILING",
    "AotResult",
    "PallasArtifact",
    "PallasLauncher",
    "PallasSource",
    "ProfileResult",
    "TpuBackend",
    "TpuChip",
    "check_blocks",
    "compile_for_topology",
    "generate_pallas",
    "lower_for_tpu",
    "register",
]


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    return TpuBackend()
