"""The shared machinery of the hardware optimizers: search, take the best candidate's
KernelPlan, read its launch geometry.

An optimizer holds no table of its own: every answer is a field of the KernelPlan that the
search's cost model ranks first for the given DeviceSpec (the plan a backend's printer
would print), or a figure of that DeviceSpec. Asking for another device means passing its
spec; the answer then changes exactly as the search's pick does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from yirage._errors import ConfigError
from yirage._graph import KernelGraph
from yirage.plan import GeneratedKernel, LibraryKernel, Plan, parse_plan

if TYPE_CHECKING:
    from yirage._search import Candidate, SearchResult

__all__ = ["HardwareOptimizer", "KernelLaunch", "LaunchPlan"]

#: backend -> the optimizer answering for it (named in errors)
OPTIMIZERS = {
    "cuda": "CUDAOptimizer",
    "rocm": "ROCmOptimizer",
    "mps": "MPSOptimizer",
    "cpu": "CPUOptimizer",
    "ascend": "AscendOptimizer",
    "tpu": "TPUOptimizer",
}


@dataclass(frozen=True)
class KernelLaunch:
    """The launch geometry of one generated kernel of the plan."""

    name: str
    #: blocks of the grid, (x, y, z)
    grid: tuple[int, int, int]
    #: threads of one block (1 on the CPU, whose blocks are loop iterations)
    block_threads: int
    #: warps (NVIDIA) / wavefronts (AMD) / simdgroups (Apple) of one block
    warps: int
    #: iterations of the block's for-loop (the reduction dimension walked in tiles)
    forloop_range: int
    #: ways a GPU printer may split that loop across extra blocks (1: not split)
    loop_split: int
    #: the tile one block loads of each kernel input, in input order
    input_tiles: tuple[tuple[int, ...], ...]
    #: the tile one block stores of each kernel output
    output_tiles: tuple[tuple[int, ...], ...]
    #: bytes of on-chip memory one block uses (shared memory, LDS, UB, VMEM, cache budget)
    smem_bytes: int

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclass(frozen=True)
class LaunchPlan:
    """The search's best candidate for one graph on one device, as launch geometry."""

    backend: str
    device: str
    #: the candidate's structure (``custom[grid=… loop=…: …]``; the baseline says so)
    candidate: str
    #: the cost model's prediction for it, µs
    predicted_us: float
    #: True when no fused form beat the original graph as library kernels
    baseline: bool
    #: the generated kernels, in launch order
    kernels: tuple[KernelLaunch, ...]
    #: the ops left to library kernels (matmul, reduction, …), in launch order
    library_ops: tuple[str, ...]
    plan: Plan = field(repr=False, compare=False)


def _launch(k: GeneratedKernel) -> KernelLaunch:
    return KernelLaunch(
        name=k.name,
        grid=k.grid,
        block_threads=k.block_threads,
        warps=k.warps,
        forloop_range=k.forloop_range,
        loop_split=k.loop_split,
        input_tiles=tuple(a.tile for a in k.inputs),
        output_tiles=tuple(a.tile for a in k.outputs),
        smem_bytes=k.smem_bytes,
    )


def launch_plan(plan: Plan, backend: str, device: str, best: Candidate) -> LaunchPlan:
    """The :class:`LaunchPlan` of a parsed plan and the search candidate it came from."""
    return LaunchPlan(
        backend=backend,
        device=device,
        candidate=str(best.label),
        predicted_us=float(best.predicted_us),
        baseline=bool(best.baseline),
        kernels=tuple(_launch(k) for k in plan.kernels if isinstance(k, GeneratedKernel)),
        library_ops=tuple(k.op for k in plan.kernels if isinstance(k, LibraryKernel)),
        plan=plan,
    )


class HardwareOptimizer:
    """Answers a backend's launch questions for a graph on a device from the real search.

    ``device_spec``: a :class:`yirage.DeviceSpec`, mapping or JSON of the device to answer
    for, or ``device=`` the name of a chip of :mod:`yirage.devices` (``"H100"``,
    ``"MI300X"``) of this optimizer's backend; neither: the device this backend finds on
    this machine (BackendUnavailableError with the probe's reason when there is none).
    ``config``, ``time_limit`` and further keywords go to :func:`yirage.search` unchanged,
    so an answer equals what that search picks."""

    #: the backend whose printer the answers are for
    backend: ClassVar[str] = ""

    def __init__(
        self,
        device_spec: Any = None,
        *,
        device: str | None = None,
        config: str | Mapping[str, Any] | None = None,
        time_limit: float | None = 60,
        **search_options: Any,
    ) -> None:
        if device is not None and device_spec is not None:
            raise ConfigError("pass device= (a registry name) or device_spec=, not both")
        self._spec_arg = device_spec
        self._device_name = device
        self._config = config
        self._time_limit = time_limit
        self._options = dict(search_options)
        self._results: dict[str, SearchResult] = {}
        self._spec: dict[str, Any] | None = None

    @property
    def device_spec(self) -> dict[str, Any]:
        """The DeviceSpec answered for, as a mapping (resolved on first use)."""
        if self._spec is None:
            from yirage._search import _as_dict, _backend_spec

            spec = self._spec_arg
            if self._device_name is not None:
                spec = self._registry_spec(self._device_name)
            elif spec is None:
                _, spec = _backend_spec(self.backend)
            self._spec = _as_dict(spec)
        return self._spec

    def _registry_spec(self, name: str) -> Any:
        """The spec of a registry chip, refused when another backend's printer runs it."""
        from yirage.devices import get_device

        entry = get_device(name)
        if entry.backend != self.backend:
            other = OPTIMIZERS.get(entry.backend, f"the {entry.backend} backend")
            raise ConfigError(
                f"{entry.name!r} is a {entry.backend} device, not {self.backend}: "
                f"ask {other} about it"
            )
        return entry.spec

    @property
    def device(self) -> str:
        return str(self.device_spec.get("name") or "unnamed device")

    def search(self, graph: KernelGraph) -> SearchResult:
        """:func:`yirage.search` of ``graph`` for this backend and device (memoised per
        graph; the search's own disk cache applies too)."""
        if not isinstance(graph, KernelGraph):
            raise TypeError(
                f"{type(self).__name__} answers for a yirage.KernelGraph, got "
                f"{type(graph).__name__}"
            )
        key = graph.hash()
        if key not in self._results:
            from yirage._search import search

            self._results[key] = search(
                graph,
                backend=self.backend,
                config=self._config,
                time_limit=self._time_limit,
                device_spec=self.device_spec,
                **self._options,
            )
        return self._results[key]

    def optimize(self, graph: KernelGraph) -> LaunchPlan:
        """The best candidate's launch geometry (the cost model's pick; ``superoptimize``
        may still pick another candidate after profiling on the device)."""
        result = self.search(graph)
        best = result.best
        plan = parse_plan(best.kernel_plan())
        return launch_plan(plan, self.backend, self.device, best)

    def core_spec(self, graph: KernelGraph) -> dict[str, Any]:
        """The DeviceSpec as the search's cost model read it for ``graph`` (figures the
        spec lacked are filled with the estimates the search's notes name)."""
        spec_json = self.search(graph).report.device_spec
        if not spec_json:
            raise ConfigError("the search result carries no DeviceSpec; search again")
        doc: dict[str, Any] = json.loads(spec_json)
        return doc
