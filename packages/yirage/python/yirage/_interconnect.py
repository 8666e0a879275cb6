"""Device links and board power of the registry's chips (private; used by yirage.devices).

The vendor tables describe one chip; the collective costs of a multi-device graph also need
the links between chips, and ``yirage.estimate``'s energy figure the chip's power. This table
adds them to the registry entries, with sources:

* ``link_bandwidth_gbps``: per device and per direction, half the bidirectional aggregate
  the vendor publishes (NVLink, Infinity Fabric / xGMI, ICI), since a ring collective sends
  and receives at once; PCIe cards get PCIe's figure;
* ``link_latency_us``: the fixed cost of one ring step, an estimate of the order NCCL's own
  tuning model uses (src/graph/tuning.cc: 0.5 to 3.4 µs per NVLink ring step depending on
  the protocol, more through PCIe);
* ``power_watts``: the board power / TDP of the datasheet, the energy model's figure (a
  chip under a single kernel draws less).

Chips without a published figure keep None: the cost model then prices collectives as
PCIe 4.0 x16 (with a note in ``yirage.estimate``) and gives no energy figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from yirage._device_spec import DeviceSpec

__all__ = ["LINKS", "Links", "with_links"]

#: Per-step latency (µs) of a direct device link and of PCIe (see the module doc).
_DIRECT_US = 1.0
_PCIE_US = 5.0
#: PCIe 4.0 x16 per direction (GB/s).
_PCIE4_GBPS = 32.0


@dataclass(frozen=True)
class Links:
    """The link and power figures of one registry entry and the documents they come from."""

    link_bandwidth_gbps: float | None
    link_latency_us: float | None
    power_watts: float | None
    sources: tuple[str, ...]


_NVLINK4 = "NVIDIA NVLink and NVSwitch page (NVLink 4: 900 GB/s per GPU, 18 links)"
_NCCL = "NCCL src/graph/tuning.cc (per-step ring latencies; the order of the step latency)"
_TPU = "cloud.google.com/tpu/docs/{} (bidirectional ICI bandwidth per chip)"

#: (backend, registry key) -> links and power.
LINKS: dict[tuple[str, str], Links] = {
    ("cuda", "H100 SXM"): Links(
        450.0,
        _DIRECT_US,
        700.0,
        (_NVLINK4, "NVIDIA H100 Tensor Core GPU datasheet (SXM: up to 700 W)", _NCCL),
    ),
    ("cuda", "H200"): Links(
        450.0,
        _DIRECT_US,
        700.0,
        (_NVLINK4, "NVIDIA H200 Tensor Core GPU datasheet (SXM: up to 700 W)", _NCCL),
    ),
    ("cuda", "A100 80GB"): Links(
        300.0,
        _DIRECT_US,
        400.0,
        (
            "NVIDIA A100 Tensor Core GPU datasheet (NVLink 3: 600 GB/s; SXM: 400 W)",
            _NCCL,
        ),
    ),
    ("cuda", "L4"): Links(
        _PCIE4_GBPS,
        _PCIE_US,
        72.0,
        ("NVIDIA L4 datasheet (PCIe Gen4 x16: 64 GB/s bidirectional; 72 W)", _NCCL),
    ),
    ("rocm", "MI300X"): Links(
        448.0,
        _DIRECT_US,
        750.0,
        (
            "AMD Instinct MI300X data sheet (7 Infinity Fabric links, 896 GB/s peak "
            "aggregate; 750 W)",
            _NCCL,
        ),
    ),
    ("rocm", "MI325X"): Links(
        448.0,
        _DIRECT_US,
        1000.0,
        (
            "AMD Instinct MI325X data sheet (7 Infinity Fabric links, 896 GB/s peak "
            "aggregate; 1000 W)",
            _NCCL,
        ),
    ),
    ("tpu", "TPU v5e"): Links(200.0, _DIRECT_US, None, (_TPU.format("v5e") + ": 400 GB/s",)),
    ("tpu", "TPU v5p"): Links(600.0, _DIRECT_US, None, (_TPU.format("v5p") + ": 1200 GB/s",)),
    ("tpu", "TPU v6e"): Links(400.0, _DIRECT_US, None, (_TPU.format("v6e") + ": 800 GB/s",)),
    ("cpu", "EPYC 9654"): Links(
        None, None, 360.0, ("amd.com product page AMD EPYC 9654 (default TDP 360 W)",)
    ),
    ("cpu", "Xeon Platinum 8480+"): Links(
        None, None, 350.0, ("ark.intel.com Intel Xeon Platinum 8480+ (TDP 350 W)",)
    ),
    ("cpu", "Ryzen 9 7950X"): Links(
        None, None, 170.0, ("amd.com product page AMD Ryzen 9 7950X (default TDP 170 W)",)
    ),
}


def with_links(
    backend: str, key: str, spec: DeviceSpec, sources: Sequence[str]
) -> tuple[DeviceSpec, tuple[str, ...]]:
    """``spec`` with the table's link and power figures for ``(backend, key)`` where the
    spec has none of its own, and the sources with the table's appended."""
    links = LINKS.get((backend, key))
    if links is None:
        return spec, tuple(sources)

    def own(mine: float | None, table: float | None) -> float | None:
        return mine if mine is not None else table

    filled = replace(
        spec,
        link_bandwidth_gbps=own(spec.link_bandwidth_gbps, links.link_bandwidth_gbps),
        link_latency_us=own(spec.link_latency_us, links.link_latency_us),
        power_watts=own(spec.power_watts, links.power_watts),
    )
    return filled, tuple(dict.fromkeys((*sources, *links.sources)))
