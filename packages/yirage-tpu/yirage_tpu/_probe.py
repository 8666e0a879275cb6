"""Google TPU probe: /dev/accel*, /dev/vfio/<n> with a Google TPU on the PCI bus, libtpu, and
jax (imported lazily, and only where a TPU runtime is installed).

Newer TPU generations (v5e, v5p, v6e …) are handed to user space through VFIO, so their device
nodes are /dev/vfio/<n>. VFIO is generic, though: any server passing a device through to a VM
or to DPDK/SPDK has /dev/vfio/<n>. Those nodes count only when the PCI bus holds a Google TPU.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from yirage import Backend, ProbeResult

_PCI_DEVICES = Path("/sys/bus/pci/devices")
#: Google's PCI vendor id (as sysfs writes it).
GOOGLE_PCI_VENDOR = "0x1ae0"
#: PCI device ids of Google TPU chips, for the hardware name (v2 and v3 share one id).
TPU_PCI_DEVICE_IDS: dict[str, str] = {
    "0x0027": "TPU v2/v3",
    "0x005e": "TPU v4",
    "0x0062": "TPU v5p",
    "0x0063": "TPU v5e",
    "0x006f": "TPU v6e",
    "0x0076": "TPU7x",
}
#: PCI class prefixes of Google devices that are not TPUs: mass storage (the NVMe local SSD)
#: and network (gVNIC) controllers, present on every Compute Engine VM. A Google device of
#: another class counts as a TPU of a generation newer than the table above.
_NOT_TPU_CLASSES = ("0x01", "0x02")
#: What a user without jax is told.
JAX_HINT = "pip install yirage[tpu]"
#: The levels the printed kernels reach without a TPU (docs/backends.md).
LEVELS = (
    "here the printed Pallas kernels run emulated (interpret mode, TpuBackend(interpret=True)) "
    "and compile for the target without a device (libtpu, v5e/v6e: yirage_tpu.compile_for_topology)"
)
#: Distributions of the TPU runtime, and the variable that points jax at a libtpu.so.
_LIBTPU_DISTS = ("libtpu", "libtpu-nightly")
_LIBTPU_PATH_VAR = "TPU_LIBRARY_PATH"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return None


def tpu_pci_devices(root: Path | None = None) -> list[str]:
    """One name per Google TPU function on the PCI bus ("TPU v5e" …); empty when there is
    none or sysfs is unreadable. ``root`` defaults to /sys/bus/pci/devices."""
    found: list[str] = []
    try:
        devices = sorted((_PCI_DEVICES if root is None else root).iterdir())
    except OSError:
        return found
    for dev in devices:
        if _read(dev / "vendor") != GOOGLE_PCI_VENDOR:
            continue
        device_id = _read(dev / "device") or ""
        if device_id in TPU_PCI_DEVICE_IDS:
            found.append(TPU_PCI_DEVICE_IDS[device_id])
            continue
        pci_class = _read(dev / "class") or ""
        if pci_class and not pci_class.startswith(_NOT_TPU_CLASSES):
            found.append(f"Google TPU (PCI device {device_id or '?'})")
    return found


def accel_nodes() -> list[str]:
    """/dev/accel<n>: the TPU driver's nodes (v2 to v4)."""
    return sorted(glob.glob("/dev/accel[0-9]*"))


def vfio_nodes() -> list[str]:
    """/dev/vfio/<n>: VFIO groups, of any passed-through device."""
    return sorted(glob.glob("/dev/vfio/[0-9]*"))


def device_nodes() -> list[str]:
    """TPU device nodes: /dev/accel*, plus /dev/vfio/<n> when a Google TPU is on the PCI bus."""
    nodes = accel_nodes()
    vfio = vfio_nodes()
    if vfio and tpu_pci_devices():
        nodes += vfio
    return nodes


def runtime_installed(tools: dict[str, str]) -> bool:
    """Is a TPU runtime (libtpu) there for jax to load? Checked without importing anything."""
    if any(dist in tools for dist in _LIBTPU_DISTS):
        return True
    if os.environ.get(_LIBTPU_PATH_VAR):
        return True
    try:
        return importlib.util.find_spec("libtpu") is not None
    except Exception:
        return False


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null inside: libtpu logs several lines there (missing
    TPU host variables, no device) when it starts on a machine without a TPU, and a probe
    says what it found in its result instead."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def jax_tpu_device() -> tuple[Any, str]:
    """(the first TPU device jax sees or None, note), importing jax only if installed."""
    if importlib.util.find_spec("jax") is None:
        return None, "jax not installed"
    try:
        with _quiet_stderr():
            import jax

            devices = jax.devices("tpu")
    except Exception as exc:
        return None, f"jax.devices('tpu') failed: {type(exc).__name__}"
    if not devices:
        return None, "jax sees no TPU"
    return devices[0], f"jax sees {len(devices)} TPU device(s)"


#: Asks jax for the TPUs in a child process (see :func:`jax_tpu_kind`).
_KIND_SCRIPT = """
import json, os, sys
os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
try:
    import jax
    devices = jax.devices("tpu")
    print(json.dumps([str(devices[0].device_kind) if devices else None, len(devices)]))
except Exception as exc:
    print(json.dumps([None, type(exc).__name__]))
"""


def jax_tpu_kind() -> tuple[str | None, str]:
    """(device_kind of the first TPU or None, note). jax is asked in a child process:
    starting libtpu in this one leaves its threads and signal handlers behind (Ctrl-C then
    no longer interrupts, and a later fork warns), even on a machine without a TPU."""
    if importlib.util.find_spec("jax") is None:
        return None, "jax not installed"
    try:
        run = subprocess.run(
            [sys.executable, "-c", _KIND_SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        kind, info = json.loads(run.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return None, f"jax could not be asked for TPUs: {type(exc).__name__}"
    if kind is None:
        why = "jax sees no TPU" if info == 0 else f"jax.devices('tpu') failed: {info}"
        return None, why
    return str(kind), f"jax sees {info} TPU device(s)"


def toolchain() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in ("jax", "jaxlib", *_LIBTPU_DISTS):
        version = Backend._distribution_version(dist)
        if version:
            found[dist] = version
    return found


def _hardware(nodes: list[str]) -> str:
    chips = tpu_pci_devices()
    if chips:
        return f"{chips[0]} ({len(chips)} chip(s))"
    return f"TPU ({len(nodes)} device node(s))"


def probe() -> ProbeResult:
    """Never raises. Available when TPU device nodes exist, or when jax, given an installed
    libtpu, sees a TPU. jax is imported only where libtpu is installed: without it jax cannot
    see a TPU, and ``jax.devices`` initialises every jax backend installed (a CUDA jaxlib
    would take GPU memory) just to say so."""
    try:
        tools = toolchain()
        nodes = device_nodes()
        runtime = runtime_installed(tools)
        if nodes:
            if not runtime:
                return ProbeResult(
                    True,
                    "TPU device nodes found; libtpu not installed (pip install jax[tpu])",
                    _hardware(nodes),
                    tools,
                )
            kind, note = jax_tpu_kind()
            return ProbeResult(True, note, kind or _hardware(nodes), tools)
        where = "no TPU: /dev/accel* absent and no Google TPU on the PCI bus"
        if not runtime:
            if importlib.util.find_spec("jax") is None:
                why = f"{where}, and libtpu not installed; jax not installed: {JAX_HINT}"
                return ProbeResult(False, why, None, tools)
            return ProbeResult(False, f"{where}, and libtpu not installed; {LEVELS}", None, tools)
        kind, note = jax_tpu_kind()
        if kind is not None:
            return ProbeResult(True, f"no TPU device nodes, but {note}", kind, tools)
        return ProbeResult(
            False, f"{where}, and {note} (libtpu is installed); {LEVELS}", None, tools
        )
    except Exception as exc:  # never raise from a probe
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
