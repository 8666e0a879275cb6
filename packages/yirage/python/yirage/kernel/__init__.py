"""Hardware optimizers: each backend's launch questions (grid and block dims, threadgroup
size, tiles, vector width, block shapes …) answered for a graph on a device by the real
search and cost model.

Every answer is read from the KernelPlan of the candidate the search ranks first for the
given DeviceSpec (``yirage.search(graph, backend=…, device_spec=…).best``), the plan that
backend's printer prints, or is a figure of that spec; none comes from a table of its own.
The cost model's pick, not a measurement: ``superoptimize`` profiles the candidates on the
device and may choose another.
"""

from __future__ import annotations

from yirage.kernel._optimizer import HardwareOptimizer, KernelLaunch, LaunchPlan
from yirage.kernel._simt import GridBlockDims
from yirage.kernel.ascend import AscendLaunch, AscendOptimizer
from yirage.kernel.cpu import CPUOptimizer, CpuSchedule
from yirage.kernel.cuda import CUDAOptimizer
from yirage.kernel.mps import MetalDispatch, MPSOptimizer
from yirage.kernel.rocm import ROCmOptimizer
from yirage.kernel.tpu import PallasLaunch, TPUOptimizer

__all__ = [
    "AscendLaunch",
    "AscendOptimizer",
    "CPUOptimizer",
    "CUDAOptimizer",
    "CpuSchedule",
    "GridBlockDims",
    "HardwareOptimizer",
    "KernelLaunch",
    "LaunchPlan",
    "MPSOptimizer",
    "MetalDispatch",
    "PallasLaunch",
    "ROCmOptimizer",
    "TPUOptimizer",
]
