"""``yirage.estimate``: the search's cost model, term by term, for one candidate on one device.

Every number here is a model prediction, the same one the search ranks candidates by
(``Candidate.predicted_us``), never a measurement: ``superoptimize`` times candidates on the
device. The terms come from the core (``_core.cost_terms``): per kernel, memory traffic and
compute overlap, so only the larger counts in full; the remainder of the smaller one
(``exposed``: pipeline fill and drain), a generated GPU loop's per-iteration overhead
(``loop``), a split loop's combine step (``combine``) and the launch gap (``launch``) add up
to the kernel's time. There is no energy estimate: no DeviceSpec carries a power figure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from yirage import _core
from yirage._device_spec import DeviceSpec
from yirage._errors import ConfigError
from yirage._graph import KernelGraph
from yirage._search import Candidate, SearchResult, device_spec_json, search

__all__ = ["TERMS", "Estimate", "KernelEstimate", "estimate"]

#: The additive terms, in the order the core reports them.
TERMS = ("memory", "compute", "exposed", "loop", "combine", "launch")


@dataclass(frozen=True)
class KernelEstimate:
    """One kernel's predicted time (µs): ``op`` is the library op it runs (``"matmul"`` …)
    or ``"customized"`` for a generated kernel. ``memory_us`` and ``compute_us`` overlap;
    ``terms`` are the parts that add up to ``total_us`` (the larger of memory and compute
    under its own name, the other 0)."""

    op: str
    total_us: float
    memory_us: float
    compute_us: float
    launch_us: float
    exposed_us: float
    loop_us: float
    combine_us: float
    utilization: float
    loop_split: int
    terms: dict[str, float]

    @property
    def bound(self) -> str:
        """``"memory"`` or ``"compute"``: which of the two the kernel's time follows."""
        return "memory" if self.memory_us >= self.compute_us else "compute"


@dataclass(frozen=True)
class Estimate:
    """A cost-model prediction of one candidate on one device (not a measurement).

    ``total_us`` is the sum of the kernels' times and equals the search's
    ``predicted_us`` for the same graph and device; ``terms`` sums each additive term over
    the kernels (they add up to ``total_us``). ``device`` names the device, ``label`` the
    candidate, ``notes`` the figures the model had to estimate. ``kind`` is always
    ``"model prediction"``."""

    total_us: float
    terms: dict[str, float]
    kernels: tuple[KernelEstimate, ...]
    device: str
    backend: str
    label: str
    graph: KernelGraph
    notes: tuple[str, ...] = ()
    kind: str = "model prediction"
    device_spec: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "device": self.device,
            "backend": self.backend,
            "label": self.label,
            "total_us": self.total_us,
            "terms": dict(self.terms),
            "kernels": [dict(vars(k)) for k in self.kernels],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        parts = ", ".join(f"{t} {self.terms[t]:.2f}" for t in TERMS if self.terms[t])
        lines = [
            f"{self.total_us:.2f} us on {self.device} ({self.kind}, cost model; {parts})",
            f"  candidate: {self.label}",
        ]
        for k in self.kernels:
            lines.append(
                f"  {k.op}: {k.total_us:.2f} us, {k.bound}-bound (memory {k.memory_us:.2f}, "
                f"compute {k.compute_us:.2f}, launch {k.launch_us:.2f})"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _device(device: str | DeviceSpec, backend: str | None) -> tuple[str, str, str, list[str]]:
    """(device name, backend, core spec JSON, notes) of a registry name or a DeviceSpec."""
    if isinstance(device, str):
        from yirage.devices import get_device

        entry = get_device(device)
        spec_json, notes = device_spec_json(entry.spec, backend or entry.backend)
        return entry.spec.name, backend or entry.backend, spec_json, notes
    spec_json, notes = device_spec_json(device, backend)
    return device.name, str(json.loads(spec_json)["vendor"]), spec_json, notes


def _kernels(graph: KernelGraph, spec_json: str) -> tuple[KernelEstimate, ...]:
    return tuple(
        KernelEstimate(
            op=str(k["op"]),
            total_us=float(k["total_us"]),
            memory_us=float(k["memory_us"]),
            compute_us=float(k["compute_us"]),
            launch_us=float(k["launch_us"]),
            exposed_us=float(k["exposed_us"]),
            loop_us=float(k["loop_us"]),
            combine_us=float(k["combine_us"]),
            utilization=float(k["utilization"]),
            loop_split=int(k["loop_split"]),
            terms={t: float(v) for t, v in k["terms"].items()},
        )
        for k in _core.cost_terms(graph._g, spec_json)
    )


def _fits(graph: KernelGraph, spec_json: str, device: str, label: str) -> None:
    """Refuse a candidate found for another device whose blocks this one cannot hold."""
    try:
        _core.kernel_plan(graph._g, spec_json)
    except _core.YirageError as exc:
        raise ConfigError(
            f"candidate {label} does not fit {device}: {exc}; search for it "
            "(yirage.estimate(graph, device=...)) instead"
        ) from exc


def estimate(
    graph_or_candidate: KernelGraph | Candidate | SearchResult,
    device: str | DeviceSpec | None = None,
    *,
    backend: str | None = None,
    best: bool = True,
    **search_options: Any,
) -> Estimate:
    """Predicted time of a candidate on a device, with the cost model's terms.

    ``graph_or_candidate``: a :class:`yirage.KernelGraph` (searched for ``device`` with
    ``search_options``, e.g. ``time_limit``, and its best candidate estimated; with
    ``best=False`` the graph as written, its ops as library kernels), a
    :class:`yirage.Candidate` or a :class:`yirage.SearchResult` (its best candidate).
    ``device``: a registry name (``"MI300X"``, see :mod:`yirage.devices`) or a
    :class:`yirage.DeviceSpec`; None: a candidate's own search device, else the search's
    default (this machine's CPU). ``backend`` overrides the backend name of the spec."""
    given: object = device  # checked here, before a search would ignore a wrong type
    if given is not None and not isinstance(given, (str, DeviceSpec)):
        raise ConfigError(
            "device must be a registry name (see yirage.devices.list_devices()) or a "
            f"yirage.DeviceSpec, got {type(given).__name__}"
        )
    if isinstance(graph_or_candidate, SearchResult):
        found = graph_or_candidate
        if device is None and "device" in found.extra:  # searched with device=
            device = str(found.extra["device"])
        return _estimate_candidate(found.best, device, backend, found.report.notes)
    if isinstance(graph_or_candidate, Candidate):
        return _estimate_candidate(graph_or_candidate, device, backend)
    if not isinstance(graph_or_candidate, KernelGraph):
        raise TypeError(
            "estimate() takes a yirage.KernelGraph, Candidate or SearchResult, got "
            f"{type(graph_or_candidate).__name__}"
        )
    if best:
        kw: dict[str, Any] = dict(search_options)
        if isinstance(device, str):
            kw["device"] = device
        elif isinstance(device, DeviceSpec):
            kw["device_spec"] = device
        return estimate(search(graph_or_candidate, backend, **kw), device, backend=backend)
    if search_options:
        raise ConfigError(
            f"best=False estimates the graph as written: search options "
            f"({', '.join(sorted(search_options))}) do not apply"
        )
    if device is None:
        device = _host_spec(backend)
    name, be, spec_json, notes = _device(device, backend)
    return _build(
        graph_or_candidate, "the graph as written (library kernels)", name, be, spec_json, notes
    )


def _host_spec(backend: str | None) -> DeviceSpec:
    from yirage._search import _backend_spec

    return _backend_spec(backend or "cpu")[1]  # type: ignore[no-any-return]


def _estimate_candidate(
    cand: Candidate,
    device: str | DeviceSpec | None,
    backend: str | None,
    search_notes: tuple[str, ...] = (),
) -> Estimate:
    if device is None:
        spec_json = cand._spec_json
        doc: Mapping[str, Any] = json.loads(spec_json)
        name, be, notes = str(doc["vendor"]), backend or str(doc["vendor"]), list(search_notes)
    else:
        name, be, spec_json, notes = _device(device, backend)
        if spec_json != cand._spec_json:
            _fits(cand.graph, spec_json, name, cand.label)
            notes.append(f"the candidate was found for another device spec, estimated on {name}")
        notes = list(dict.fromkeys([*search_notes, *notes]))
    return _build(cand.graph, cand.label, name, be, spec_json, notes)


def _build(
    graph: KernelGraph, label: str, device: str, backend: str, spec_json: str, notes: list[str]
) -> Estimate:
    kernels = _kernels(graph, spec_json)
    terms = {t: sum(k.terms.get(t, 0.0) for k in kernels) for t in TERMS}
    return Estimate(
        total_us=sum(k.total_us for k in kernels),
        terms=terms,
        kernels=kernels,
        device=device,
        backend=backend,
        label=label,
        graph=graph,
        notes=tuple(notes),
        device_spec=spec_json,
    )
