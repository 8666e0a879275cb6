"""``CUDAOptimizer``: grid/block dims, warps and tiles for NVIDIA GPUs from the search."""

from __future__ import annotations

from yirage.kernel._simt import GridBlockDims, SimtOptimizer

__all__ = ["CUDAOptimizer", "GridBlockDims"]


class CUDAOptimizer(SimtOptimizer):
    """The cuda backend's launch geometry for a graph on an NVIDIA GPU
    (:meth:`optimize_grid_block_dims`, :meth:`optimize`), read from the KernelPlan the search
    ranks first for the DeviceSpec (default: the GPU found here)."""

    backend = "cuda"
