"""``AscendOptimizer``: block dim and tiles for Ascend NPUs from the search."""

from __future__ import annotations

from dataclasses import dataclass

from yirage._graph import KernelGraph
from yirage.kernel._optimizer import HardwareOptimizer

__all__ = ["AscendLaunch", "AscendOptimizer"]


@dataclass(frozen=True)
class AscendLaunch:
    """One generated kernel on an Ascend NPU: ``block_dim`` blocks over the AI cores."""

    kernel: str
    grid: tuple[int, int, int]
    block_dim: int
    #: AI cores of the spec the blocks share
    ai_cores: int
    #: on-chip bytes one block uses (its unified-buffer budget in the search)
    ub_bytes: int
    forloop_range: int
    input_tiles: tuple[tuple[int, ...], ...]
    output_tiles: tuple[tuple[int, ...], ...]


class AscendOptimizer(HardwareOptimizer):
    """The ascend backend's launch geometry for a graph on an Ascend NPU, read from the
    KernelPlan the search ranks first for the DeviceSpec (default: the NPU found here)."""

    backend = "ascend"

    def optimize_for_ascend(self, graph: KernelGraph) -> list[AscendLaunch]:
        """Block dim, tiles and on-chip bytes of every generated kernel of the search's best
        candidate (empty when the best is the library baseline)."""
        cores = int(self.core_spec(graph)["compute_units"])
        return [
            AscendLaunch(
                kernel=k.name,
                grid=k.grid,
                block_dim=k.blocks,
                ai_cores=cores,
                ub_bytes=k.smem_bytes,
                forloop_range=k.forloop_range,
                input_tiles=k.input_tiles,
                output_tiles=k.output_tiles,
            )
            for k in self.optimize(graph).kernels
        ]
