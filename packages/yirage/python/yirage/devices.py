"""``yirage.devices``: the chips yirage can search for, present here or not.

The registry gathers every installed backend's datasheet table (``Backend.known_devices()``:
yirage-cuda, -rocm, -mps, -ascend, -tpu and any third-party backend) plus a few common
server and desktop CPUs of its own (the CPU backend describes its host live and has no
table). Each entry keeps where its figures come from (:attr:`DeviceEntry.sources`). Users
add chips with :func:`register_custom_device`.

``yirage.search(graph, device="MI300X")`` searches for any entry; it needs no such chip here,
since the search ranks candidates by the cost model alone (the result's notes say so), and
``yirage.estimate`` reports that model's terms. Figures a table leaves out (None) are
estimated by the search with a note naming each one.

Lookup is case-insensitive and ignores spaces, dashes and underscores; an entry answers to
its table name (``"MI300X"``), its full chip name (``"AMD Instinct MI300X"``), the vendor plus
table name (``"AMD MI300X"``), a few short aliases (``"H100"``, ``"v5e"``, ``"910B2"``) and
``"<backend>:<name>"`` (``"rocm:MI300X"``).
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yirage import _core, _interconnect
from yirage._device_spec import EXECUTION_MODELS, DeviceSpec
from yirage._errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:
    from yirage._search import SearchResult

__all__ = [
    "CPU_DEVICES",
    "DeviceEntry",
    "UnknownDeviceError",
    "get_device",
    "get_device_spec",
    "list_devices",
    "register_custom_device",
    "unregister_custom_device",
]

_log = logging.getLogger("yirage.devices")


@dataclass(frozen=True)
class DeviceEntry:
    """One chip of the registry.

    ``name`` is its registry name (a vendor table's key, or the custom spec's name),
    ``backend`` the backend whose code generator and cost terms it follows (``"rocm"``),
    ``origin`` where the entry comes from (``"yirage-rocm table"``, ``"yirage CPU table"``,
    ``"custom"``), ``sources`` the documents its figures come from and ``aliases`` the
    further names it answers to."""

    name: str
    spec: DeviceSpec
    backend: str
    origin: str
    sources: tuple[str, ...]
    aliases: tuple[str, ...] = ()

    @property
    def vendor(self) -> str:
        return self.spec.vendor

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the entry answers to (``backend:name`` aside)."""
        vendor_name = f"{self.spec.vendor} {self.name}"
        return tuple(dict.fromkeys((self.name, self.spec.name, vendor_name, *self.aliases)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "origin": self.origin,
            "sources": list(self.sources),
            "aliases": list(self.aliases),
            "spec": self.spec.to_dict(),
        }

    def __str__(self) -> str:
        return f"{self.name} [{self.backend}, {self.origin}]: {self.spec.summary()}"


class UnknownDeviceError(ConfigError):
    """No registry entry answers to ``name``; ``close_matches`` lists the nearest names."""

    def __init__(self, name: str, close_matches: Sequence[str], detail: str) -> None:
        super().__init__(detail)
        self.name = name
        self.close_matches = tuple(close_matches)


# -- citations of the vendor tables ---------------------------------------------------------------
# The vendor packages give their sources in their module docs; the registry keeps them per
# entry. An entry a vendor adds without one here cites its package's table (tests insist
# that every table entry of yirage's own packages has one).

_CUDA_GUIDE = (
    "CUDA C Programming Guide, Features and Technical Specifications (shared memory per "
    "block, warp size, threads per block)"
)
_AMD_ISA = "AMD CDNA2/CDNA3/RDNA3 ISA guides (64 KiB LDS per workgroup, wavefront size)"
_METAL = "developer.apple.com/metal/Metal-Feature-Set-Tables.pdf (threadgroup limits)"
_CATLASS = "CANN CATLASS include/*/arch/arch.hpp, AtlasA2 (AI Core buffers, cube unit)"
_HAMI = "HAMi scheduler Ascend device configs (aiCore)"


def _tpu(gen: str) -> tuple[str, ...]:
    return (
        f"cloud.google.com/tpu/docs/{gen} (TensorCores, MXUs, HBM bandwidth, bf16 peak)",
        f"jax/_src/pallas/mosaic/tpu_info.py TPU_{gen.upper()} (VMEM, MXU width, tiling)",
    )


_APPLE_NEWS = "apple.com/newsroom/"
_M1_PRO_MAX = (
    _APPLE_NEWS + "2021/10/introducing-m1-pro-and-m1-max-the-most-powerful-chips-apple-has-ever-"
    "built/"
)
_M2_PRO_MAX = (
    _APPLE_NEWS + "2023/01/apple-unveils-m2-pro-and-m2-max-next-generation-chips-for-next-level-"
    "workflows/"
)
_M2 = _APPLE_NEWS + "2022/06/apple-unveils-m2-with-breakthrough-performance-and-capabilities/"
_M3 = (
    _APPLE_NEWS + "2023/10/apple-unveils-m3-m3-pro-and-m3-max-the-most-advanced-chips-for-a-"
    "personal-computer/"
)
_M4_PRO_MAX = _APPLE_NEWS + "2024/10/apple-introduces-m4-pro-and-m4-max/"

#: (backend, table key) -> the documents the entry's figures come from.
_VENDOR_SOURCES: dict[tuple[str, str], tuple[str, ...]] = {
    ("cuda", "H100 SXM"): ("NVIDIA H100 Tensor Core GPU datasheet (dense figures)", _CUDA_GUIDE),
    ("cuda", "H200"): ("NVIDIA H200 Tensor Core GPU datasheet (dense figures)", _CUDA_GUIDE),
    ("cuda", "A100 80GB"): ("NVIDIA A100 Tensor Core GPU datasheet (dense figures)", _CUDA_GUIDE),
    ("cuda", "L4"): (
        "NVIDIA L4 datasheet (dense FP16 Tensor Core, FP32, GDDR6 bandwidth)",
        "NVIDIA Ada GPU architecture whitepaper (SMs, L2)",
        _CUDA_GUIDE,
    ),
    ("rocm", "MI300X"): ("AMD Instinct MI300X data sheet", "AMD CDNA3 white paper", _AMD_ISA),
    ("rocm", "MI325X"): ("AMD Instinct MI325X data sheet", _AMD_ISA),
    ("rocm", "MI250X"): ("AMD Instinct MI250X data sheet (one GCD: half the package)", _AMD_ISA),
    ("rocm", "MI210"): ("AMD Instinct MI210 data sheet", _AMD_ISA),
    ("rocm", "RX7900XTX"): ("AMD Radeon RX 7900 XTX product page", "AMD RDNA3 ISA guide"),
    ("mps", "M1"): (_APPLE_NEWS + "2020/11/apple-unleashes-m1/", _M2, _METAL),
    ("mps", "M1 Pro"): (_M1_PRO_MAX, _METAL),
    ("mps", "M1 Max"): (_M1_PRO_MAX, _METAL),
    ("mps", "M1 Ultra"): (
        _APPLE_NEWS + "2022/03/apple-unveils-m1-ultra-the-worlds-most-powerful-chip-for-a-"
        "personal-computer/",
        _METAL,
    ),
    ("mps", "M2"): (_M2, _METAL),
    ("mps", "M2 Pro"): (_M2_PRO_MAX, _METAL),
    ("mps", "M2 Max"): (_M2_PRO_MAX, _METAL),
    ("mps", "M2 Ultra"): (_APPLE_NEWS + "2023/06/apple-introduces-m2-ultra/", _METAL),
    ("mps", "M3"): (_M3, _METAL),
    ("mps", "M3 Pro"): (_M3, _METAL),
    ("mps", "M3 Max"): (_M3, _METAL),
    ("mps", "M3 Ultra"): (
        _APPLE_NEWS + "2025/03/apple-reveals-m3-ultra-taking-apple-silicon-to-a-new-extreme/",
        _METAL,
    ),
    ("mps", "M4"): (_APPLE_NEWS + "2024/05/apple-introduces-m4-chip/", _METAL),
    ("mps", "M4 Pro"): (_M4_PRO_MAX, _METAL),
    ("mps", "M4 Max"): (_M4_PRO_MAX, _METAL),
    ("ascend", "Ascend 910B2"): (_CATLASS, _HAMI),
    ("ascend", "Ascend 910B3"): (_CATLASS, _HAMI, "CANN CATLASS AscendC910B3 (L2)"),
    ("ascend", "Ascend 910B4"): (_CATLASS, _HAMI),
    ("ascend", "Ascend 910C"): (_CATLASS, "one die of two, as torch_npu shows it"),
    ("tpu", "TPU v4"): _tpu("v4"),
    ("tpu", "TPU v5e"): _tpu("v5e"),
    ("tpu", "TPU v5p"): _tpu("v5p"),
    ("tpu", "TPU v6e"): _tpu("v6e"),
}

#: (backend, table key) -> short names the entry also answers to.
_VENDOR_ALIASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("cuda", "H100 SXM"): ("H100", "H100 SXM5"),
    ("cuda", "H200"): ("H200 SXM",),
    ("cuda", "A100 80GB"): ("A100", "A100 SXM"),
    ("rocm", "MI250X"): ("MI250X GCD",),
    ("rocm", "RX7900XTX"): ("7900 XTX", "Radeon RX 7900 XTX"),
    ("ascend", "Ascend 910B2"): ("910B2",),
    ("ascend", "Ascend 910B3"): ("910B3",),
    ("ascend", "Ascend 910B4"): ("910B4",),
    ("ascend", "Ascend 910C"): ("910C",),
    ("tpu", "TPU v4"): ("v4",),
    ("tpu", "TPU v5e"): ("v5e", "TPU v5 lite"),
    ("tpu", "TPU v5p"): ("v5p",),
    ("tpu", "TPU v6e"): ("v6e", "TPU v6 lite", "Trillium"),
}


# -- common CPUs ----------------------------------------------------------------------------------


def _cpu_block_bytes(l1d: int, l2: int) -> int:
    """The CPU backend's per-block tile budget (``yirage_cpu``: half of a core's L2, at least
    L1d), so a table CPU is searched as the CPU backend would search it live."""
    return max(l2 // 2, l1d)


def _cpu(
    name: str,
    vendor: str,
    arch: str,
    cores: int,
    l1d_kib: int,
    l2_mib: int,
    simd_bits: int,
    channels: int,
    mts: int,
) -> DeviceSpec:
    """A CPU from its datasheet: per-core L1d and L2, memory channels x MT/s (64-bit channels:
    GB/s = channels x MT/s x 8 bytes / 1000). Peak FLOPS stay None: vendors publish no
    sustained all-core clock to derive them from (the search estimates them, with a note)."""
    l1d, l2 = l1d_kib * 1024, l2_mib * 2**20
    return DeviceSpec(
        name=name,
        vendor=vendor,
        arch=arch,
        compute_units=cores,
        warp_size=None,
        max_threads_per_block=None,
        shared_mem_per_block=_cpu_block_bytes(l1d, l2),
        l2_bytes=l2,
        l1d_bytes=l1d,
        mem_bandwidth_gbps=channels * mts * 8 / 1000,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=None,
        simd_width_bits=simd_bits,
        execution_model="cpu",
    )


_AWS_GUIDE = "github.com/aws/aws-graviton-getting-started (Graviton processor table)"

#: name -> (spec, sources, aliases): one socket each; L2 is per core.
CPU_DEVICES: dict[str, tuple[DeviceSpec, tuple[str, ...], tuple[str, ...]]] = {
    "EPYC 9654": (
        _cpu("AMD EPYC 9654", "AMD", "x86_64", 96, 32, 1, 512, 12, 4800),
        (
            "amd.com product page AMD EPYC 9654 (96 cores, 12 channels DDR5-4800, "
            "460.8 GB/s per socket)",
            "AMD Zen 4 software optimization guide (32 KiB L1d, 1 MiB L2 per core, AVX-512)",
        ),
        ("Genoa",),
    ),
    "Xeon Platinum 8480+": (
        _cpu("Intel Xeon Platinum 8480+", "Intel", "x86_64", 56, 48, 2, 512, 8, 4800),
        (
            "ark.intel.com Intel Xeon Platinum 8480+ (56 cores, 8 channels DDR5-4800, "
            "AVX-512, AMX)",
            "Intel 64 and IA-32 optimization reference manual, Sapphire Rapids (48 KiB L1d, "
            "2 MiB L2 per core)",
        ),
        ("8480+", "Sapphire Rapids"),
    ),
    "Ryzen 9 7950X": (
        _cpu("AMD Ryzen 9 7950X", "AMD", "x86_64", 16, 32, 1, 512, 2, 5200),
        (
            "amd.com product page AMD Ryzen 9 7950X (16 cores, 1 MB L2 per core, 2 channels "
            "DDR5-5200, AVX-512)",
        ),
        ("7950X",),
    ),
    "Graviton3": (
        _cpu("AWS Graviton3", "Amazon", "aarch64", 64, 64, 1, 256, 8, 4800),
        (_AWS_GUIDE + ": Neoverse V1, 64 cores, 64 KiB L1d, 1 MiB L2, DDR5-4800, 2x256-bit SVE",),
        ("Graviton 3",),
    ),
    "Graviton4": (
        _cpu("AWS Graviton4", "Amazon", "aarch64", 96, 64, 2, 128, 12, 5600),
        (_AWS_GUIDE + ": Neoverse V2, 96 cores, 64 KiB L1d, 2 MiB L2, 12 channels DDR5-5600",),
        ("Graviton 4",),
    ),
}


# -- the registry ---------------------------------------------------------------------------------


def _norm(name: str) -> str:
    """Lookup key: lower case without spaces, dashes, underscores or dots."""
    return re.sub(r"[\s_\-.]+", "", str(name)).lower()


class _Registry:
    """Built-in entries (rebuilt when backend discovery is reset) and custom ones."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.builtin: list[DeviceEntry] = []
        self.missing: list[str] = []
        self.custom: dict[str, DeviceEntry] = {}
        self._built_for: object = None

    def refresh(self) -> None:
        from yirage import _registry

        discovered = _registry._discover()
        if discovered is self._built_for:
            return
        self.builtin, self.missing = _builtin_entries(_registry)
        self._built_for = discovered

    def entries(self) -> list[DeviceEntry]:
        """Custom entries first, then the built-in ones that no custom entry replaces."""
        with self.lock:
            self.refresh()
            custom = list(self.custom.values())
            taken = {_norm(n) for e in custom for n in e.names}
            rest = [e for e in self.builtin if not taken & {_norm(n) for n in e.names}]
            return custom + rest


def _builtin_entries(registry: Any) -> tuple[list[DeviceEntry], list[str]]:
    """Entries of every installed backend's table, then the CPU table; the backends of
    yirage's own packages that are not installed."""
    entries: list[DeviceEntry] = []
    missing: list[str] = []
    for backend in registry._all_names():
        try:
            be = registry._get_backend(backend)
            table = dict(be.known_devices())
        except BackendUnavailableError:
            if backend in registry.KNOWN_BACKENDS:
                missing.append(backend)
            continue
        except Exception as exc:  # a broken plugin loses its chips, not the registry
            _log.warning("backend %s: known_devices() raised %s: %s", backend, type(exc), exc)
            continue
        origin = f"{be.distribution or backend} table"
        for key, spec in table.items():
            sources = _VENDOR_SOURCES.get((backend, key), (f"{origin}, {spec.name}",))
            spec, sources = _interconnect.with_links(backend, key, spec, sources)
            aliases = _VENDOR_ALIASES.get((backend, key), ())
            entries.append(DeviceEntry(key, spec, backend, origin, sources, aliases))
    for key, (spec, sources, aliases) in CPU_DEVICES.items():
        spec, sources = _interconnect.with_links("cpu", key, spec, sources)
        entries.append(DeviceEntry(key, spec, "cpu", "yirage CPU table", sources, aliases))
    return entries, [m for m in missing if m != "cpu"]


_REGISTRY = _Registry()


def list_devices(backend: str | None = None, vendor: str | None = None) -> list[DeviceEntry]:
    """Every registry entry (custom ones first), optionally only those of one ``backend``
    (``"rocm"``) or ``vendor`` (``"AMD"``; both case-insensitive)."""
    out = _REGISTRY.entries()
    if backend is not None:
        out = [e for e in out if e.backend == backend.lower()]
    if vendor is not None:
        out = [e for e in out if e.spec.vendor.lower() == vendor.lower()]
    return out


def _matches(name: str, entries: Iterable[DeviceEntry]) -> list[DeviceEntry]:
    key = _norm(name)
    backend, sep, rest = str(name).partition(":")
    found = []
    for e in entries:
        if sep and e.backend == backend.strip().lower() and _norm(rest) in map(_norm, e.names):
            found.append(e)
        elif not sep and key in map(_norm, e.names):
            found.append(e)
    return found


def get_device(name: str) -> DeviceEntry:
    """The registry entry answering to ``name`` (see the module doc for the names each entry
    answers to). Raises :class:`UnknownDeviceError` listing close matches."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"a device name is a non-empty string, got {name!r}")
    entries = _REGISTRY.entries()
    found = _matches(name, entries)
    if len(found) == 1:
        return found[0]
    if found:
        which = ", ".join(f"{e.backend}:{e.name}" for e in found)
        raise ConfigError(f"device name {name!r} is ambiguous ({which}); pass one of those")
    raise _unknown(name, entries)


def _unknown(name: str, entries: list[DeviceEntry]) -> UnknownDeviceError:
    by_norm: dict[str, str] = {}
    for e in entries:
        for n in e.names:
            by_norm.setdefault(_norm(n), e.name)
    near = difflib.get_close_matches(_norm(name), list(by_norm), n=8, cutoff=0.6)
    # a name that contains the query or is contained in it ("MI300" -> MI300X, MI325X…)
    near += [n for n in by_norm if _norm(name) in n or (len(n) >= 3 and n in _norm(name))]
    close = list(dict.fromkeys(by_norm[n] for n in near))[:6]
    hint = f"; close matches: {', '.join(close)}" if close else ""
    missing = _REGISTRY.missing
    extra = (
        f"; not installed, so their chips are not listed: {', '.join(missing)} (pip install "
        f"'yirage[{missing[0]}]')"
        if missing
        else ""
    )
    return UnknownDeviceError(
        name,
        close,
        f"unknown device {name!r}{hint}{extra}; yirage.devices.list_devices() lists all "
        f"{len(entries)}, register_custom_device(spec) adds one",
    )


def get_device_spec(name: str) -> DeviceSpec:
    """The DeviceSpec of the registry entry answering to ``name`` (``"MI300X"``, ``"H100"``,
    ``"tpu:v5e"`` …, case-insensitive). Raises :class:`UnknownDeviceError` listing close
    matches."""
    return get_device(name).spec


def register_custom_device(
    spec: DeviceSpec,
    *,
    backend: str | None = None,
    aliases: Sequence[str] = (),
    sources: Sequence[str] = (),
    replace: bool = False,
) -> DeviceEntry:
    """Add ``spec`` to the registry under ``spec.name`` (and ``aliases``) for this process.

    The spec is checked as the search would read it: ``execution_model`` must be set and
    every figure it gives must be valid (``ConfigError`` names the field otherwise).
    ``backend`` (default: ``spec.vendor`` in lower case) names the backend in search reports
    and cache keys. A name any entry already answers to is refused unless ``replace=True``,
    which hides that entry (a built-in one comes back with :func:`unregister_custom_device`).
    ``sources``: where the figures come from (default: "registered by the user")."""
    if not isinstance(spec, DeviceSpec):
        raise ConfigError(
            f"register_custom_device takes a yirage.DeviceSpec, got {type(spec).__name__}"
        )
    if not spec.name.strip():
        raise ConfigError("register_custom_device: the spec needs a name (DeviceSpec.name)")
    if spec.execution_model is None:
        allowed = ", ".join(repr(m) for m in EXECUTION_MODELS)
        raise ConfigError(
            f"register_custom_device({spec.name!r}): set execution_model ({allowed}): it "
            "selects the cost model's terms"
        )
    backend_name = (backend or spec.vendor).strip().lower()
    if not backend_name or ":" in backend_name:
        raise ConfigError(
            f"register_custom_device({spec.name!r}): backend must be a name without ':' "
            f"(default: the spec's vendor), got {backend_name!r}"
        )
    _check_figures(spec, backend_name)
    entry = DeviceEntry(
        name=spec.name,
        spec=spec,
        backend=backend_name,
        origin="custom",
        sources=tuple(sources) or ("registered by the user",),
        aliases=tuple(str(a) for a in aliases),
    )
    with _REGISTRY.lock:
        clash = [e for e in _REGISTRY.entries() if {_norm(n) for n in e.names} & _norms(entry)]
        if clash and not replace:
            e = clash[0]
            raise ConfigError(
                f"device {spec.name!r} clashes with {e.name!r} ({e.spec.name}, {e.origin}), "
                "which answers to the same name; pass replace=True to replace it, or another "
                "name"
            )
        for e in clash:
            _REGISTRY.custom.pop(_norm(e.name), None)
        _REGISTRY.custom[_norm(entry.name)] = entry
    return entry


def _norms(entry: DeviceEntry) -> set[str]:
    return {_norm(n) for n in entry.names}


#: Fields the core takes as null.
_OPTIONAL = (
    "matrix_tile",
    "launch_overhead_us",
    "tiling",
    "link_bandwidth_gbps",
    "link_latency_us",
    "l1d_bytes",
    "l3_bytes",
)
#: DeviceSpec fields the core's spec JSON does not take.
_NOT_CORE = ("name", "arch", "simd_width_bits", "source", "power_watts", "isa_features")


def _check_figures(spec: DeviceSpec, backend: str) -> None:
    """The core's checks of the figures the spec gives (each must be positive and finite);
    a missing figure stands in as 1 here, since the search estimates it, with a note."""
    doc = {k: v for k, v in spec.to_dict().items() if k not in _NOT_CORE}
    doc = {k: (1 if v is None and k not in _OPTIONAL else v) for k, v in doc.items()}
    doc["vendor"] = backend
    try:
        _core.device_spec_json(json.dumps(doc))
    except _core.YirageError as exc:
        raise ConfigError(f"register_custom_device({spec.name!r}): {exc}") from exc


def unregister_custom_device(name: str) -> DeviceEntry:
    """Remove the custom entry answering to ``name`` (a built-in entry it replaced comes
    back); returns it. Raises ConfigError when no custom entry answers to ``name``."""
    with _REGISTRY.lock:
        found = _matches(name, _REGISTRY.custom.values())
        if not found:
            raise ConfigError(
                f"no custom device answers to {name!r} (built-in entries cannot be removed; "
                "register_custom_device(spec, replace=True) replaces one)"
            )
        return _REGISTRY.custom.pop(_norm(found[0].name))


def _search_for_device(search: Callable[..., SearchResult], args: dict[str, Any]) -> SearchResult:
    """``yirage.search(graph, device=name, ...)``: the entry's spec searched as
    ``device_spec=`` (its backend unless ``backend`` is given), every other argument
    unchanged; the report notes that the ranking is the cost model's alone."""
    import dataclasses
    import inspect

    params = inspect.signature(search).parameters
    options = dict(args.get("options") or {})
    kw = {k: v for k, v in args.items() if k in params and k not in ("device", "options")}
    if kw.get("device_spec") is not None:
        raise ConfigError("search: pass device= (a registry name) or device_spec=, not both")
    entry = get_device(str(args["device"]))
    kw["device_spec"] = entry.spec
    if kw.get("backend") is None:
        kw["backend"] = entry.backend
    result = search(**kw, **options)
    note = (
        f"device {entry.name} ({entry.spec.name}, {entry.origin}): candidates ranked by the "
        "cost model's predictions alone; nothing was compiled or run on it"
    )
    report = dataclasses.replace(result.report, notes=(*result.report.notes, note))
    extra = {**result.extra, "device": entry.name, "prediction_only": True}
    return dataclasses.replace(result, report=report, extra=extra)
