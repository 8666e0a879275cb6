"""``MPSOptimizer``: threadgroups and threadgroup sizes for Apple GPUs from the search."""

from __future__ import annotations

from dataclasses import dataclass

from yirage._graph import KernelGraph
from yirage.kernel._optimizer import HardwareOptimizer

__all__ = ["MPSOptimizer", "MetalDispatch"]


@dataclass(frozen=True)
class MetalDispatch:
    """One generated kernel's Metal dispatch."""

    kernel: str
    #: threadgroups of the dispatch, (x, y, z)
    threadgroups: tuple[int, int, int]
    threads_per_threadgroup: int
    #: simdgroups of one threadgroup, of ``simd_width`` threads each
    simdgroups: int
    simd_width: int
    threadgroup_memory_bytes: int
    input_tiles: tuple[tuple[int, ...], ...]
    output_tiles: tuple[tuple[int, ...], ...]


class MPSOptimizer(HardwareOptimizer):
    """The mps backend's dispatch geometry for a graph on an Apple GPU, read from the
    KernelPlan the search ranks first for the DeviceSpec (default: the GPU found here)."""

    backend = "mps"

    def optimize_for_apple_silicon(self, graph: KernelGraph) -> list[MetalDispatch]:
        """Threadgroups, threadgroup size and threadgroup memory of every generated kernel
        of the search's best candidate (empty when the best is the library baseline)."""
        simd_width = int(self.core_spec(graph)["warp_size"])
        return [
            MetalDispatch(
                kernel=k.name,
                threadgroups=k.grid,
                threads_per_threadgroup=k.block_threads,
                simdgroups=k.warps,
                simd_width=simd_width,
                threadgroup_memory_bytes=k.smem_bytes,
                input_tiles=k.input_tiles,
                output_tiles=k.output_tiles,
            )
            for k in self.optimize(graph).kernels
        ]
