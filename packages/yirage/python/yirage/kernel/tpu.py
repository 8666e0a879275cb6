"""``TPUOptimizer``: grid and block shapes for TPUs from the search."""

from __future__ import annotations

from dataclasses import dataclass

from yirage._graph import KernelGraph
from yirage.kernel._optimizer import HardwareOptimizer

__all__ = ["PallasLaunch", "TPUOptimizer"]


@dataclass(frozen=True)
class PallasLaunch:
    """One generated kernel as a Pallas call: its grid and the block shape of every input
    and output (each legal under the spec's tiling rule: the search proposes no other)."""

    kernel: str
    grid: tuple[int, int, int]
    in_block_shapes: tuple[tuple[int, ...], ...]
    out_block_shapes: tuple[tuple[int, ...], ...]
    #: iterations of the block's reduction loop (a grid axis the printer walks in order)
    forloop_range: int
    vmem_bytes: int


class TPUOptimizer(HardwareOptimizer):
    """The tpu backend's grid and block shapes for a graph on a TPU, read from the
    KernelPlan the search ranks first for the DeviceSpec (default: the TPU found here)."""

    backend = "tpu"

    def optimize_for_tpu(self, graph: KernelGraph) -> list[PallasLaunch]:
        """Grid, block shapes and VMEM bytes of every generated kernel of the search's best
        candidate (empty when the best is the library baseline)."""
        return [
            PallasLaunch(
                kernel=k.name,
                grid=k.grid,
                in_block_shapes=k.input_tiles,
                out_block_shapes=k.output_tiles,
                forloop_range=k.forloop_range,
                vmem_bytes=k.smem_bytes,
            )
            for k in self.optimize(graph).kernels
        ]
