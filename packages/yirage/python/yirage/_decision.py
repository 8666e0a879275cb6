"""The decision cache of ``superoptimize``: the chosen plan, its variant and the report,
keyed by everything that decides them, plus the cold run's check reference next to it.

Key: the graph hash, the backend, its version and its printers' versions, the DeviceSpec
(and the one the search was pinned to, if any), the core and yirage versions, the search
options and ``DECISION_VERSION``.
The reference file holds the float64 reference outputs of the cold run's check inputs, so a
warm call re-checks the kernel on the same (regenerated) inputs without re-evaluating.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from yirage import _cache, _core
from yirage._backend import Backend
from yirage._graph import KernelGraph
from yirage._logging import get_logger
from yirage._version import __version__

__all__ = ["DECISION_VERSION", "decision_path", "load_reference", "read", "save_reference", "write"]

#: Bumped when what a decision holds changes (9: the chosen variant's name).
DECISION_VERSION = "9"

_log = get_logger("yirage.superoptimize")


def decision_path(
    graph: KernelGraph,
    be: Backend,
    spec_json: str,
    pinned_json: str,
    top_k: int,
    config: Any,
    options: dict[str, Any],
) -> Path:
    """Where the decision for these inputs lives in the cache."""
    parts = {
        "graph": graph.hash(),
        "backend": be.name,
        "backend_version": be.package_version,
        "codegen": json.dumps(be.codegen_versions, sort_keys=True),
        "device": spec_json,
        "searched_for": pinned_json,
        "core": _core.__version__,
        "yirage": __version__,
        "top_k": str(top_k),
        "config": repr(config),
        "options": json.dumps(options, sort_keys=True, default=repr),
        "decision": DECISION_VERSION,
    }
    return _cache.entry_path("superoptimize", parts, ".json")


def _reference_path(decision: Path) -> Path:
    return decision.with_name(decision.stem + ".ref.bin")


_REF_MAGIC = b"YRREF1\n"


def save_reference(decision: Path, seed: int, generator: str, reference: list[np.ndarray]) -> None:
    """Keep the reference outputs of the cold run's check next to the decision, so a warm
    call re-checks the kernel on the same (regenerated) inputs without re-evaluating.

    Format: magic, one JSON header line (seed, input generator, output shapes), then the
    outputs as little-endian float64 — no dependence on numpy's file formats."""
    arrays = [np.ascontiguousarray(r, dtype="<f8") for r in reference]
    header = {
        "seed": int(seed),
        "generator": generator,
        "shapes": [list(a.shape) for a in arrays],
    }
    blob = _REF_MAGIC + json.dumps(header).encode() + b"\n" + b"".join(a.tobytes() for a in arrays)
    try:
        _cache.store_artifact(_reference_path(decision), blob)
    except OSError as exc:
        _log.warning("yirage cache: could not store the check reference (%s)", exc)


def load_reference(
    decision: Path, generator: str, n_outputs: int
) -> tuple[int, list[np.ndarray]] | None:
    blob = _cache.load_verified_artifact(_reference_path(decision))
    if blob is None:  # missing, or damaged (reported and removed): evaluate afresh
        return None
    try:
        if not blob.startswith(_REF_MAGIC):
            raise ValueError("bad magic")
        line_end = blob.index(b"\n", len(_REF_MAGIC))
        header = json.loads(blob[len(_REF_MAGIC) : line_end])
        if header["generator"] != generator:
            return None  # made with another input generator: re-evaluate
        shapes = [tuple(int(d) for d in sh) for sh in header["shapes"]]
        if len(shapes) != n_outputs:
            raise ValueError(f"{len(shapes)} outputs stored, {n_outputs} expected")
        outs, pos = [], line_end + 1
        for shape in shapes:
            n = int(np.prod(shape, dtype=np.int64)) * 8
            if pos + n > len(blob):
                raise ValueError("truncated")
            outs.append(np.frombuffer(blob, dtype="<f8", count=n // 8, offset=pos).reshape(shape))
            pos += n
        if pos != len(blob):
            raise ValueError("trailing bytes")
        return int(header["seed"]), [o.astype(np.float64) for o in outs]
    except (ValueError, KeyError, TypeError) as exc:  # corrupt entry: evaluate afresh
        _log.warning("yirage cache: unreadable check reference (%s); re-evaluating", exc)
        return None


def read(path: Path) -> dict[str, Any] | None:
    """The cached decision ({"plan", "variant", "report"}), or None."""
    data = _cache.read_json(path)
    return dict(data) if isinstance(data, Mapping) else None


def write(
    path: Path,
    plan: Mapping[str, Any],
    variant: str,
    report: dict[str, Any],
    reference: tuple[int, str, list[np.ndarray]] | None,
) -> None:
    """Store a decision: the chosen candidate's plan, the name of its winning variant and the
    report; with ``reference`` (seed, input generator, float64 outputs) the check reference
    next to it."""
    with _cache.locked(path):
        _cache.write_json(path, {"plan": dict(plan), "variant": variant, "report": report})
        if reference is not None:
            save_reference(path, *reference)
