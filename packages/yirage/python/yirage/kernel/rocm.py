"""``ROCmOptimizer``: grid/block dims, wavefronts and tiles for AMD GPUs from the search."""

from __future__ import annotations

from yirage.kernel._simt import GridBlockDims, SimtOptimizer

__all__ = ["GridBlockDims", "ROCmOptimizer"]


class ROCmOptimizer(SimtOptimizer):
    """The rocm backend's launch geometry for a graph on an AMD GPU
    (:meth:`optimize_grid_block_dims`: ``warps`` are wavefronts of the spec's
    ``warp_size``, 64 on CDNA), read from the KernelPlan the search ranks first for the
    DeviceSpec (default: the GPU found here)."""

    backend = "rocm"
