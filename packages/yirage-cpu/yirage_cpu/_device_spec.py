"""CPU DeviceSpec: queried live (cores, caches, SIMD width); there is no datasheet table.

The cache hierarchy shapes the search: a block's tile budget (``shared_mem_per_block``) is
half of a core's L2 (:func:`block_bytes`), ``l1d_bytes`` / ``l2_bytes`` / ``l3_bytes`` are the
per-core L1d and L2 and the shared L3, which the core's CPU cost terms read.

Linux: sysfs caches and /proc/cpuinfo flags. macOS: ``sysctl`` (``hw.*cachesize``, and on
Intel Macs ``machdep.cpu.*features``). Bandwidth and peak FLOPS are not measured here and stay
None. A CPU block is one single-threaded task on a core (``execution_model="cpu"``, no
warps); launch_overhead_us stays None (the core's CPU default, about 1 µs for a parallel
region)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path

from yirage import Backend, DeviceSpec
from yirage_cpu._probe import cpu_model

#: No table: CPUs are described by a live query.
KNOWN_DEVICES: dict[str, DeviceSpec] = {}

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon"}


def parse_size(text: str) -> int | None:
    """'48K' -> 49152; '2048K'; '32M'; a plain number is bytes."""
    t = text.strip().upper()
    scale = 1
    if t.endswith("K"):
        scale, t = 1024, t[:-1]
    elif t.endswith("M"):
        scale, t = 1024 * 1024, t[:-1]
    elif t.endswith("G"):
        scale, t = 1024**3, t[:-1]
    return int(t) * scale if t.isdigit() else None


def cache_sizes(cache_dir: Path = _CACHE_DIR) -> dict[str, int]:
    """{"L1d": bytes, "L2": bytes, "L3": bytes} from sysfs (whatever is present)."""
    sizes: dict[str, int] = {}
    try:
        entries = sorted(cache_dir.glob("index*"))
    except OSError:
        return sizes
    for entry in entries:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = parse_size((entry / "size").read_text())
        except OSError:
            continue
        if size is None or kind == "Instruction":
            continue
        key = f"L{level}d" if level == "1" else f"L{level}"
        sizes.setdefault(key, size)
    return sizes


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str | None, set[str]]:
    """(vendor_id, feature flags) from /proc/cpuinfo (x86 'flags', ARM 'Features')."""
    vendor: str | None = None
    flags: set[str] = set()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return vendor, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return vendor, flags


def simd_width_bits(flags: set[str], machine: str) -> int | None:
    """Widest float SIMD the flags advertise."""
    if "avx512f" in flags:
        return 512
    if "avx2" in flags or "avx" in flags:
        return 256
    if "sse2" in flags or "asimd" in flags or "neon" in flags:
        return 128
    if machine.lower() in ("arm64", "aarch64"):
        return 128  # NEON is mandatory on AArch64
    return None


def sysctl(name: str) -> str | None:
    """``sysctl -n name`` (macOS/BSD), or None when it is missing or fails (the error text
    has a colon and quotes, which no value of the names read here has)."""
    return Backend._command_version("sysctl", "-n", name, match=r"^[A-Za-z0-9_. ]+$", timeout=5)


#: sysctl names of the caches, P-cores first (Apple silicon reports per performance level).
_SYSCTL_CACHES = {
    "L1d": ("hw.perflevel0.l1dcachesize", "hw.l1dcachesize"),
    "L2": ("hw.perflevel0.l2cachesize", "hw.l2cachesize"),
    "L3": ("hw.l3cachesize",),
}


def sysctl_cache_sizes(query: Callable[[str], str | None] | None = None) -> dict[str, int]:
    """Cache sizes from sysctl (``query``, default :func:`sysctl`; whatever is present, a
    size of 0 means none)."""
    query = query or sysctl
    sizes: dict[str, int] = {}
    for key, names in _SYSCTL_CACHES.items():
        for name in names:
            value = query(name)
            if value is not None and value.isdigit() and int(value) > 0:
                sizes[key] = int(value)
                break
    return sizes


def sysctl_cpu_flags(query: Callable[[str], str | None] | None = None) -> set[str]:
    """x86 feature flags of an Intel Mac in /proc/cpuinfo's spelling ("AVX1.0" is "avx")."""
    query = query or sysctl
    words: set[str] = set()
    for name in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
        words |= {w.lower() for w in (query(name) or "").split()}
    return {"avx" if w == "avx1.0" else w for w in words}


def usable_cores() -> int:
    """CPUs this process may run on (affinity/cgroup-aware where the OS says so)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: Share of a core's L2 one block's tiles may take: the other half holds the panels the
#: block streams (weight rows read in place, prefetched lines) and the stack.
_L2_SHARE = 2


def block_bytes(caches: dict[str, int]) -> int | None:
    """Tile bytes one CPU "block" (a task on one core) may keep resident: half of the
    core's L2, at least L1d. A block's tiles (accumulators, converted or computed tiles)
    are reused every for-loop iteration, so they must stay in L2; the tiles it streams are
    read in place once. A fixed fraction like L2 / 16 left model sizes without fused
    programs: RMSNorm + Linear at 8x4096x6144 needs ~300 KiB per block on 2 cores (an
    8x3072 accumulator and a 16x3072 weight panel), attention at kv 4096 with 1024 query
    rows ~400 KiB. Tiles above 256 KiB live in a per-thread heap scratch area, not on the
    stack (yirage_cpu._codegen)."""
    l1, l2 = caches.get("L1d"), caches.get("L2")
    if l2 is None:
        return l1
    return max(l2 // _L2_SHARE, l1 or 0)


def device_spec() -> DeviceSpec:
    machine = platform.machine() or "unknown"
    vendor_id, flags = cpu_flags()
    if vendor_id:
        vendor = _VENDORS.get(vendor_id, vendor_id)
    elif platform.system() == "Darwin" and machine == "arm64":
        vendor = "Apple"
    elif machine.lower() in ("arm64", "aarch64"):
        vendor = "ARM"
    else:
        vendor = "unknown"
    caches = cache_sizes()
    if platform.system() == "Darwin":
        caches = caches or sysctl_cache_sizes()
        flags = flags or sysctl_cpu_flags()
    return DeviceSpec(
        name=cpu_model(),
        vendor=vendor,
        arch=machine,
        compute_units=usable_cores(),
        warp_size=None,
        max_threads_per_block=None,
        shared_mem_per_block=block_bytes(caches),
        l2_bytes=caches.get("L2"),
        l1d_bytes=caches.get("L1d"),
        l3_bytes=caches.get("L3"),
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=None,
        simd_width_bits=simd_width_bits(flags, machine),
        execution_model="cpu",
        source="live",
    )
