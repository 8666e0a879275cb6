"""What the CUDA backend's generated code has actually been run on — records, not claims.

A *record* says that a verification run passed: the level (``HARDWARE``: generated kernels
ran on a GPU and matched the reference; ``EMULATED``: they ran in the Triton interpreter;
``COMPILED``: they compiled for an ``sm_XY`` target), the package version, the GPU
architecture and name for hardware runs, the toolchain, the date and a summary.

Records come from two places: ``_verification.json`` shipped in this package (what the
release was verified with: CI's interpreter run, the maintainers' GPU runs) and local
records in the yirage cache (``cuda-verification`` entries), written by
``benchmarks/gpu_check.py`` and :func:`yirage_cuda.self_check` when they pass.

The backend's level is a function of those records and the probe: HARDWARE only when this
machine has a GPU whose architecture a hardware record covers, else the best emulated or
compiled record for this package version, else GENERATED.
"""

from __future__ import annotations

import datetime
import json
import platform
from importlib import resources
from typing import Any

from yirage import plugin
from yirage.plugin import VerificationLevel

__all__ = ["current_level", "local_records", "record", "shipped_records"]

_ORDER = ("HARDWARE", "EMULATED", "COMPILED")


def _version() -> str:
    try:
        import importlib.metadata

        return importlib.metadata.version("yirage-cuda")
    except Exception:
        return "0+unknown"


def shipped_records() -> list[dict[str, Any]]:
    try:
        text = (
            resources.files("yirage_cuda")
            .joinpath("_verification.json")
            .read_text(encoding="utf-8")
        )
        data = json.loads(text)
    except Exception:
        return []
    recs = data.get("records", []) if isinstance(data, dict) else []
    return [dict(r, origin="shipped") for r in recs if isinstance(r, dict)]


def local_records() -> list[dict[str, Any]]:
    root = plugin.cache_root() / plugin.LAYOUT_VERSION / "cuda-verification"
    out = []
    if root.is_dir():
        for p in sorted(root.glob("*.json")):
            data = plugin.read_json(p)
            if data is not None:
                out.append(dict(data, origin=str(p)))
    return out


def record(level: str, summary: str, **details: Any) -> dict[str, Any]:
    """Write a local record that a verification run at ``level`` passed."""
    if level not in _ORDER:
        raise ValueError(f"level must be one of {_ORDER}, got {level!r}")
    rec = {
        "level": level,
        "package_version": _version(),
        "summary": summary,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        **details,
    }
    key = {"level": level, "version": rec["package_version"], "arch": str(details.get("arch", ""))}
    path = plugin.entry_path("cuda-verification", key, ".json")
    with plugin.locked(path):
        plugin.write_json(path, rec)
    return rec


def current_level(gpu_arch: str | None) -> tuple[VerificationLevel, dict[str, Any] | None]:
    """(level, the record that justifies it) for this machine (``gpu_arch``: e.g. "sm_90",
    None without a GPU)."""
    version = _version()
    recs = [
        r for r in (*local_records(), *shipped_records()) if r.get("package_version") == version
    ]
    for level in _ORDER:
        for r in recs:
            if r.get("level") != level:
                continue
            if level == "HARDWARE" and (gpu_arch is None or r.get("arch") != gpu_arch):
                continue
            return VerificationLevel[level], r
    return VerificationLevel.GENERATED, None
