"""Google TPU probe: /dev/accel* or /dev/vfio, libtpu, and jax (imported lazily)."""

from __future__ import annotations

import glob
import importlib.util

from yirage import Backend, ProbeResult


def device_nodes() -> list[str]:
    """TPU device nodes: /dev/accel* (v2-v5e) or /dev/vfio/<n> (newer generations)."""
    return sorted(glob.glob("/dev/accel[0-9]*")) + sorted(glob.glob("/dev/vfio/[0-9]*"))


def jax_tpu_kind() -> tuple[str | None, str]:
    """(device_kind of the first TPU or None, note), importing jax only if installed."""
    if importlib.util.find_spec("jax") is None:
        return None, "jax not installed"
    try:
        import jax

        devices = jax.devices("tpu")
    except Exception as exc:
        return None, f"jax.devices('tpu') failed: {type(exc).__name__}"
    if not devices:
        return None, "jax sees no TPU"
    return str(devices[0].device_kind), f"jax sees {len(devices)} TPU core(s)"


def toolchain() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in ("jax", "jaxlib", "libtpu", "libtpu-nightly"):
        version = Backend._distribution_version(dist)
        if version:
            found[dist] = version
    return found


def probe() -> ProbeResult:
    """Never raises. Available when TPU device nodes exist (jax asked only then, for the
    chip kind, since initialising a TPU runtime is slow)."""
    try:
        tools = toolchain()
        nodes = device_nodes()
        if not nodes:
            return ProbeResult(False, "no TPU: /dev/accel* and /dev/vfio/* absent", None, tools)
        if "libtpu" not in tools and "libtpu-nightly" not in tools:
            hardware = f"TPU ({len(nodes)} device node(s))"
            return ProbeResult(
                True,
                "TPU device nodes found; libtpu not installed (pip install jax[tpu])",
                hardware,
                tools,
            )
        kind, note = jax_tpu_kind()
        return ProbeResult(True, note, kind or f"TPU ({len(nodes)} device node(s))", tools)
    except Exception as exc:  # never raise from a probe
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
