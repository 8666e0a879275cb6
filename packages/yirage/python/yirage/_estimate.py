"""``yirage.estimate``: the search's cost model, term by term, for one candidate on one device.

Every number here is a model prediction, the same one the search ranks candidates by
(``Candidate.predicted_us``), never a measurement: ``superoptimize`` times candidates on the
device. The terms come from the core (``_core.cost_terms``): per kernel, memory traffic and
compute overlap, so only the larger counts in full; the remainder of the smaller one
(``exposed``: pipeline fill and drain), a generated GPU loop's per-iteration overhead
(``loop``), a split loop's combine step (``combine``) and the launch gap (``launch``) add up
to the kernel's time. A multi-device graph's collectives add their time on the device links
(``collective``: a ring over ``world_size`` ranks at the spec's ``link_bandwidth_gbps``, PCIe
4.0 x16 figures when the spec has none). Where the spec has a ``power_watts`` figure the
estimate carries an energy figure: predicted time times that power, a model, not a measurement.

:func:`compare_variants` ranks several candidates (tensor-parallel degrees of one layer, a
list of graphs) on one device by these predictions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yirage import _core
from yirage._device_spec import DeviceSpec
from yirage._errors import ConfigError
from yirage._graph import KernelGraph
from yirage._search import Candidate, SearchResult, device_spec_json, search

__all__ = [
    "ENERGY_MODEL",
    "TERMS",
    "Estimate",
    "KernelEstimate",
    "Variant",
    "VariantComparison",
    "compare_variants",
    "estimate",
]

#: The additive terms, in the order the core reports them.
TERMS = ("memory", "compute", "exposed", "loop", "combine", "launch", "collective")
#: How :attr:`Estimate.energy_uj` is obtained (it is never measured).
ENERGY_MODEL = "model: predicted time x board power (power_watts) x ranks"
#: The core's link figures for a spec without ``link_bandwidth_gbps`` (PCIe 4.0 x16 per
#: direction, and per ring step); named in the estimate's note.
PCIE_LINK_GBPS = 32.0
PCIE_LINK_LATENCY_US = 5.0


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
    collective_us: float = 0.0

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
    ``"model prediction"``.

    ``world_size`` is the graph's rank count; ``terms["collective"]`` its collectives' time on
    the device links (0 for one rank). ``energy_uj`` is the energy of all ranks, ``total_us``
    times ``power_watts`` times ``world_size`` (µJ), where the device spec gives a power
    figure, else None; it is a model (:data:`ENERGY_MODEL`), not a measurement."""

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
    world_size: int = 1
    power_watts: float | None = None

    @property
    def collective_us(self) -> float:
        """The collectives' time on the device links (µs; 0 for a single-device graph)."""
        return self.terms["collective"]

    @property
    def energy_uj(self) -> float | None:
        """Predicted energy of all ``world_size`` ranks (µJ): ``total_us`` times
        ``power_watts`` times ``world_size``; None without a power figure. A model
        (:data:`ENERGY_MODEL`), not a measurement."""
        if self.power_watts is None:
            return None
        return self.total_us * self.power_watts * self.world_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "device": self.device,
            "backend": self.backend,
            "label": self.label,
            "total_us": self.total_us,
            "terms": dict(self.terms),
            "world_size": self.world_size,
            "energy_uj": self.energy_uj,
            "energy_model": ENERGY_MODEL if self.power_watts is not None else None,
            "power_watts": self.power_watts,
            "kernels": [dict(vars(k)) for k in self.kernels],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        parts = ", ".join(f"{t} {self.terms[t]:.2f}" for t in TERMS if self.terms[t])
        lines = [
            f"{self.total_us:.2f} us on {self.device} ({self.kind}, cost model; {parts})",
            f"  candidate: {self.label}",
        ]
        if self.energy_uj is not None:
            lines.append(
                f"  energy: {self.energy_uj:.1f} uJ over {self.world_size} rank(s) "
                f"({ENERGY_MODEL}, {self.power_watts:g} W)"
            )
        for k in self.kernels:
            lines.append(
                f"  {k.op}: {k.total_us:.2f} us, {k.bound}-bound (memory {k.memory_us:.2f}, "
                f"compute {k.compute_us:.2f}, launch {k.launch_us:.2f})"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Device:
    """A device as the estimate sees it: names, the core's spec JSON and the power."""

    name: str
    backend: str
    spec_json: str
    notes: list[str]
    power_watts: float | None = None


def _device(device: str | DeviceSpec, backend: str | None) -> _Device:
    """The :class:`_Device` of a registry name or a DeviceSpec."""
    if isinstance(device, str):
        from yirage.devices import get_device

        entry = get_device(device)
        spec_json, notes = device_spec_json(entry.spec, backend or entry.backend)
        be = backend or entry.backend
        return _Device(entry.spec.name, be, spec_json, notes, entry.spec.power_watts)
    spec_json, notes = device_spec_json(device, backend)
    be = str(json.loads(spec_json)["vendor"])
    return _Device(device.name, be, spec_json, notes, device.power_watts)


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
            collective_us=float(k["collective_us"]),
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
    return _build(
        graph_or_candidate, "the graph as written (library kernels)", _device(device, backend)
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
        name = str(doc["vendor"])
        dev = _Device(name, backend or name, spec_json, list(search_notes))
    else:
        dev = _device(device, backend)
        if dev.spec_json != cand._spec_json:
            _fits(cand.graph, dev.spec_json, dev.name, cand.label)
            dev.notes.append(
                f"the candidate was found for another device spec, estimated on {dev.name}"
            )
        dev.notes[:] = list(dict.fromkeys([*search_notes, *dev.notes]))
    return _build(cand.graph, cand.label, dev)


def _link_note(graph: KernelGraph, dev: _Device) -> list[str]:
    """A note where a multi-device graph's collectives are priced with PCIe figures."""
    if graph.world_size == 1 or "link_bandwidth_gbps" in json.loads(dev.spec_json):
        return []
    return [
        f"{dev.name} has no link_bandwidth_gbps: its collectives are priced as PCIe 4.0 x16 "
        f"({PCIE_LINK_GBPS:g} GB/s per direction, {PCIE_LINK_LATENCY_US:g} us per ring step); "
        "set DeviceSpec.link_bandwidth_gbps (and link_latency_us) for its interconnect"
    ]


def _build(graph: KernelGraph, label: str, dev: _Device) -> Estimate:
    kernels = _kernels(graph, dev.spec_json)
    terms = {t: sum(k.terms.get(t, 0.0) for k in kernels) for t in TERMS}
    return Estimate(
        total_us=sum(k.total_us for k in kernels),
        terms=terms,
        kernels=kernels,
        device=dev.name,
        backend=dev.backend,
        label=label,
        graph=graph,
        notes=tuple(dict.fromkeys([*dev.notes, *_link_note(graph, dev)])),
        device_spec=dev.spec_json,
        world_size=graph.world_size,
        power_watts=dev.power_watts,
    )


# -- comparing variants ---------------------------------------------------------------------------

#: What :func:`compare_variants` estimates: a graph, a candidate or a search's best candidate.
Subject = KernelGraph | Candidate | SearchResult


@dataclass(frozen=True)
class Variant:
    """One variant of a :class:`VariantComparison`: its ``label``, the ``value`` a builder
    was called with (None for listed variants), its :class:`Estimate` and its ``rank`` (1:
    fastest predicted). ``relative`` is its predicted time over the fastest one's."""

    label: str
    estimate: Estimate
    rank: int
    relative: float
    value: Any = None

    @property
    def total_us(self) -> float:
        return self.estimate.total_us

    @property
    def terms(self) -> dict[str, float]:
        return self.estimate.terms


@dataclass(frozen=True)
class VariantComparison:
    """Variants ranked by predicted time on one device, fastest first (ties keep the order
    they were given in). Every number is a cost-model prediction (``kind``); a multi-device
    variant's time is one rank's (the ranks run at once), its energy all ranks'."""

    variants: tuple[Variant, ...]
    device: str
    kind: str = "model prediction"

    @property
    def best(self) -> Variant:
        return self.variants[0]

    def __iter__(self) -> Any:
        return iter(self.variants)

    def __len__(self) -> int:
        return len(self.variants)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "device": self.device,
            "variants": [
                {
                    "rank": v.rank,
                    "label": v.label,
                    "value": v.value if isinstance(v.value, (int, float, str)) else None,
                    "relative": v.relative,
                    **v.estimate.to_dict(),
                }
                for v in self.variants
            ],
        }

    def __str__(self) -> str:
        lines = [f"{len(self.variants)} variants on {self.device} ({self.kind}, fastest first):"]
        for v in self.variants:
            parts = ", ".join(f"{t} {v.terms[t]:.2f}" for t in TERMS if v.terms[t])
            energy = v.estimate.energy_uj
            tail = f"; {energy:.1f} uJ in all" if energy is not None else ""
            lines.append(
                f"  {v.rank}. {v.label}: {v.total_us:.2f} us (x{v.relative:.2f}; {parts}){tail}"
            )
        return "\n".join(lines)


def _labelled(
    variants: Callable[[Any], Subject] | Mapping[str, Subject] | Iterable[Subject],
    values: Sequence[Any] | None,
) -> list[tuple[str, Any, Subject]]:
    """(label, value, subject) of every variant, in the order given."""
    if callable(variants) and not isinstance(variants, (KernelGraph, Candidate, SearchResult)):
        if values is None or len(values) == 0:
            raise ConfigError(
                "compare_variants(builder, ...) needs values=[...]: the arguments to build "
                "each variant with (e.g. values=[1, 2, 4, 8] tensor-parallel degrees)"
            )
        name = getattr(variants, "__name__", "variant")
        return [(f"{name}({v!r})", v, variants(v)) for v in values]
    if values is not None:
        raise ConfigError(
            "values= applies to a builder (a callable returning a KernelGraph); pass the "
            "graphs themselves, or a builder with values"
        )
    if isinstance(variants, Mapping):
        return [(str(k), None, g) for k, g in variants.items()]
    if isinstance(variants, (KernelGraph, Candidate, SearchResult)):
        raise ConfigError(
            "compare_variants() compares several variants: pass a list or dict of graphs, or "
            "a builder with values=[...]; for one graph use yirage.estimate()"
        )
    return [(f"variant {i}", None, g) for i, g in enumerate(variants)]


def compare_variants(
    variants: Callable[[Any], Subject] | Mapping[str, Subject] | Iterable[Subject],
    device: str | DeviceSpec | None = None,
    *,
    values: Sequence[Any] | None = None,
    backend: str | None = None,
    best: bool = True,
    **search_options: Any,
) -> VariantComparison:
    """Rank variants of a computation by the cost model's predicted time on ``device``.

    ``variants``: a builder called with each of ``values`` (e.g. a layer builder taking the
    tensor-parallel degree, ``values=[1, 2, 4, 8]``; labels ``"name(value)"``), a dict
    label -> graph, or a list of graphs (labels ``"variant i"``); each a
    :class:`yirage.KernelGraph`, :class:`yirage.Candidate` or :class:`yirage.SearchResult`.
    Each is estimated as :func:`yirage.estimate` does (``device``, ``backend``, ``best`` and
    ``search_options`` as there): a multi-device variant's time is one rank's, collectives
    on the links included, so tensor-parallel degrees compare directly."""
    labelled = _labelled(variants, values)
    if not labelled:
        raise ConfigError("compare_variants() got no variants: pass at least one graph")
    estimates = [
        (label, value, estimate(g, device, backend=backend, best=best, **search_options))
        for label, value, g in labelled
    ]
    order = sorted(range(len(estimates)), key=lambda i: estimates[i][2].total_us)
    fastest = estimates[order[0]][2].total_us
    ranked = tuple(
        Variant(
            label=estimates[i][0],
            estimate=estimates[i][2],
            rank=r + 1,
            relative=estimates[i][2].total_us / fastest if fastest > 0 else 1.0,
            value=estimates[i][1],
        )
        for r, i in enumerate(order)
    )
    return VariantComparison(variants=ranked, device=ranked[0].estimate.device)
