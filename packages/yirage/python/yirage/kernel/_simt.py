"""Grid and block dimensions of the SIMT GPU backends (CUDA, ROCm)."""

from __future__ import annotations

from dataclasses import dataclass

from yirage._graph import KernelGraph
from yirage.kernel._optimizer import HardwareOptimizer

__all__ = ["GridBlockDims", "SimtOptimizer"]


@dataclass(frozen=True)
class GridBlockDims:
    """One generated kernel's launch: ``grid`` blocks of ``block`` threads."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    #: warps (CUDA) or wavefronts (ROCm) of one block
    warps: int
    #: threads of a warp / wavefront on this device (the spec's warp_size)
    warp_size: int
    shared_mem_bytes: int
    #: tiles one block loads (inputs) and stores (outputs)
    input_tiles: tuple[tuple[int, ...], ...]
    output_tiles: tuple[tuple[int, ...], ...]
    #: ways the printer may split the block's for-loop across extra blocks (1: not split)
    loop_split: int


class SimtOptimizer(HardwareOptimizer):
    """Grid/block answers of a SIMT backend (blocks of threads in warps)."""

    def optimize_grid_block_dims(self, graph: KernelGraph) -> list[GridBlockDims]:
        """Grid and block dims of every generated kernel of the search's best candidate
        (empty when the best is the original graph as library kernels)."""
        warp_size = int(self.core_spec(graph)["warp_size"])
        return [
            GridBlockDims(
                kernel=k.name,
                grid=k.grid,
                block=(k.block_threads, 1, 1),
                warps=k.warps,
                warp_size=warp_size,
                shared_mem_bytes=k.smem_bytes,
                input_tiles=k.input_tiles,
                output_tiles=k.output_tiles,
                loop_split=k.loop_split,
            )
            for k in self.optimize(graph).kernels
        ]
