"""``CPUOptimizer``: parallel blocks, tiles and vector width for CPUs from the search."""

from __future__ import annotations

from dataclasses import dataclass

from yirage._graph import KernelGraph
from yirage.kernel._optimizer import HardwareOptimizer

__all__ = ["CPUOptimizer", "CpuSchedule"]


@dataclass(frozen=True)
class CpuSchedule:
    """One generated kernel on the CPU: its grid's blocks are the iterations of one
    OpenMP ``parallel for`` over the cores, each block walking its tiles."""

    kernel: str
    grid: tuple[int, int, int]
    parallel_blocks: int
    #: cores of the spec; at most ``min(cores, parallel_blocks)`` blocks run at once
    cores: int
    #: float32 lanes of one SIMD register (the printer computes in float32); None when the
    #: spec does not know the SIMD width
    vector_width: int | None
    #: bytes of the tiles one block keeps (the search's per-block cache budget bounds it)
    block_bytes: int
    forloop_range: int
    input_tiles: tuple[tuple[int, ...], ...]
    output_tiles: tuple[tuple[int, ...], ...]


class CPUOptimizer(HardwareOptimizer):
    """The cpu backend's schedule for a graph on a CPU, read from the KernelPlan the search
    ranks first for the DeviceSpec (default: this machine's CPU)."""

    backend = "cpu"

    def optimize_for_cpu(self, graph: KernelGraph) -> list[CpuSchedule]:
        """Parallel blocks, tiles, loop length and vector width of every generated kernel
        of the search's best candidate (empty when the best is the library baseline)."""
        cores = int(self.core_spec(graph)["compute_units"])
        bits = self.device_spec.get("simd_width_bits")
        width = None if bits is None else max(1, int(bits) // 32)
        return [
            CpuSchedule(
                kernel=k.name,
                grid=k.grid,
                parallel_blocks=k.blocks,
                cores=cores,
                vector_width=width,
                block_bytes=k.smem_bytes,
                forloop_range=k.forloop_range,
                input_tiles=k.input_tiles,
                output_tiles=k.output_tiles,
            )
            for k in self.optimize(graph).kernels
        ]
