"""What ``superoptimize`` reports: one :class:`CandidateReport` per candidate (with its
variants' times and why any variant left the race) inside a :class:`SuperoptimizeReport`
(saved with the kernel and in the decision cache, so it round-trips through JSON)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from yirage._backend import DEFAULT_VARIANT

__all__ = ["CandidateReport", "SuperoptimizeReport"]


@dataclass
class CandidateReport:
    """What happened to one search candidate in ``superoptimize``.

    A backend may print several code paths (variants) for one candidate's plan; each is a
    contender of its own. ``variant`` is the candidate's fastest variant that passed the
    checks, and ``measured_us`` / ``max_rel_err`` are that variant's; ``variant_us`` holds
    the best time of every variant that was timed, ``dropped_variants`` why the others left
    the race (failed check, failed run, screened out). ``status`` "slower": profiled in a
    worker process, too slow to be a finalist, so neither checked nor raced here."""

    index: int
    hash: str | None
    description: str
    predicted_us: float | None = None
    status: str = "pending"
    max_rel_err: float | None = None
    measured_us: float | None = None
    codegen_compile_s: float | None = None
    cache_hit: bool | None = None
    error: str | None = None
    variant: str | None = None
    variant_us: dict[str, float] = field(default_factory=dict)
    dropped_variants: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    def variants_summary(self) -> str:
        """The variants part of the report's row: "(variant b: a 2.0 µs, b 1.5 µs; c
        dropped: why)", empty for a candidate with one variant that raced."""
        if len(self.variant_us) < 2 and not self.dropped_variants:
            return ""
        parts = []
        if self.variant_us:
            times = ", ".join(f"{n} {t:.1f} µs" for n, t in sorted(self.variant_us.items()))
            parts.append(f"variant {self.variant or '-'}: {times}")
        parts += [f"{n} dropped: {why[:60]}" for n, why in sorted(self.dropped_variants.items())]
        return f" ({'; '.join(parts)})"


@dataclass
class SuperoptimizeReport:
    """The end report of ``superoptimize`` (also saved with the kernel)."""

    backend: str
    backend_version: str
    verification_level: str
    device: str
    toolchain: dict[str, str] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    candidates: list[CandidateReport] = field(default_factory=list)
    chosen_index: int | None = None
    chosen_hash: str | None = None
    chosen_variant: str | None = None
    chosen_description: str = ""
    chosen_is_library_baseline: bool = False
    max_rel_err: float | None = None
    tolerance: float | None = None
    measured_us: float | None = None
    predicted_us: float | None = None
    search_s: float = 0.0
    codegen_compile_s: float = 0.0
    check_s: float = 0.0
    profile_s: float = 0.0
    total_s: float = 0.0
    from_cache: bool = False
    check_seed: int | None = None
    #: the devices of the worker processes that compiled and profiled the candidates first
    #: (empty: everything ran in this process; see docs/api.md "Several GPUs")
    profiled_on: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidates"] = [asdict(c) for c in self.candidates]
        out: dict[str, Any] = _jsonable(d)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SuperoptimizeReport:
        data = dict(d)
        cand_fields = set(CandidateReport.__dataclass_fields__)
        cands = [
            CandidateReport(**{k: v for k, v in c.items() if k in cand_fields})
            for c in data.pop("candidates", [])
        ]
        known = set(cls.__dataclass_fields__)
        rep = cls(**{k: v for k, v in data.items() if k in known})
        rep.candidates = cands
        return rep

    def __str__(self) -> str:
        lines = [
            f"yirage superoptimize on {self.backend} ({self.device}; {self.verification_level})",
            f"  toolchain: {', '.join(f'{k}: {v}' for k, v in self.toolchain.items()) or '-'}",
            f"  search {self.search_s:.2f} s, codegen+compile {self.codegen_compile_s:.2f} s, "
            f"check {self.check_s:.2f} s, profile {self.profile_s:.2f} s, "
            f"total {self.total_s:.2f} s"
            + (" (decision from the disk cache)" if self.from_cache else ""),
            "  #  status              predicted µs  measured µs  max rel err  candidate",
        ]
        if self.profiled_on:
            lines.insert(
                3, f"  profiled first on: {', '.join(self.profiled_on)} (worker processes)"
            )
        for c in self.candidates:
            mark = "*" if c.index == self.chosen_index else " "
            lines.append(
                f" {mark}{c.index:<2} {c.status[:19]:<19} {_fmt(c.predicted_us):>12} "
                f"{_fmt(c.measured_us):>12} "
                f"{_fmt(c.max_rel_err, '.1e'):>12}  {c.description}{c.variants_summary()}"
                + (f"  [{c.error[:80]}]" if c.error else "")
            )
        if self.chosen_index is not None:
            variant = (
                f", variant {self.chosen_variant}"
                if self.chosen_variant not in (None, DEFAULT_VARIANT)
                else ""
            )
            lines.append(
                f"  chosen: #{self.chosen_index} {self.chosen_description} "
                f"({self.chosen_hash or '?'}{variant}), "
                f"max rel err {_fmt(self.max_rel_err, '.1e')} (tolerance {self.tolerance:g})"
            )
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.check_seed is not None and any(c.status == "rejected" for c in self.candidates):
            lines.append(
                f"  check seed: {self.check_seed} (superoptimize(..., check_seed="
                f"{self.check_seed}, cache=False) draws the same check inputs again)"
            )
        return "\n".join(lines)


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)
