"""The race: ``superoptimize`` times every contender (one variant of one candidate, already
checked against the float64 reference) once, on the same inputs, and ranks them.

- **Interleaved rounds.** Every contender gets ``rounds`` short turns (``PROFILE_ROUNDS``),
  one after the other, and keeps its best turn's median, so bursts of load from other
  processes hit every contender alike.
- **Screen.** When a backend offers several variants per plan (tens of contenders), a first
  cheap turn (``SCREEN_OPTIONS``: a few repeats) drops the contenders over ``SCREEN_FACTOR``
  times the fastest before the rounds, and all but each candidate's ``SCREEN_VARIANTS``
  fastest variants: a slow code path costs milliseconds, not a full profile.
- **Pruning.** After ``PRUNE_AFTER_ROUNDS`` turns, contenders over ``PRUNE_RATIO`` times the
  best so far are no longer timed: they cannot win.
- **Cold ties.** Contenders within ``COLD_TIE_RATIO`` of the fastest (cold-cache) time are not
  told apart by it; the backend's :meth:`~yirage.Backend.warm_time_us` decides among them
  where it has one (:func:`pick_cold_tie`).
- **Noise.** A contender whose best turn is not reproduced by another (within
  ``NOISE_TOLERANCE``) makes the race noisy: ``superoptimize`` then does not cache the
  decision unless asked to.

:meth:`~yirage.Backend.profile` is only ever given one launcher: the backend times, the race
compares.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from yirage._backend import DEFAULT_VARIANT, Backend

__all__ = [
    "BASELINE_MARGIN",
    "BASELINE_WARM_WINDOW",
    "COLD_TIE_RATIO",
    "NOISE_TOLERANCE",
    "PROFILE_ROUNDS",
    "PRUNE_AFTER_ROUNDS",
    "PRUNE_RATIO",
    "SCREEN_FACTOR",
    "SCREEN_OPTIONS",
    "SCREEN_VARIANTS",
    "Contender",
    "RaceResult",
    "break_cold_ties",
    "build_contenders",
    "contender_key",
    "pick_cold_tie",
    "prefer_baseline",
    "race",
    "variants_of",
]

#: Interleaved profiling rounds per contender (``profile_options={"rounds": n}``).
PROFILE_ROUNDS = 8
#: A contender's best round counts as reproduced when another round is within this factor.
NOISE_TOLERANCE = 1.25
#: Contenders whose (cold-cache) times are within this factor of the best one are not told
#: apart by them (on the H100 one fused LoRA kernel's cold time ranged 16.5-17.7 µs over
#: runs); among those the backend's :meth:`~yirage.Backend.warm_time_us` decides, where it
#: has one: fused LoRA at b16 ran 19.3 and 19.5 µs cold in two forms, 14.5 and 9.9 µs with
#: its 32 MB weight in L2.
COLD_TIE_RATIO = 1.05
#: A generated contender must beat the library baseline's cold-cache time by more than this
#: factor to be chosen: within it the race does not tell them apart, and the baseline runs the
#: library calls PyTorch eager runs. (On an H200 the race timed fused gated MLP at 1024 rows
#: 111.1 µs against the baseline's 112.1; the benchmark then measured 119.8 against 112.5.)
BASELINE_MARGIN = 1.03
#: A generated contender that beats the library baseline's cold-cache time by less than this
#: factor must also be faster with its inputs in cache (:meth:`~yirage.Backend.warm_time_us`,
#: where the backend has one) to be chosen: the benchmark and a model's steady state replay
#: warm. (On an H100 the race timed a matmul plus a norm kernel at 256 rows 4% ahead of the
#: baseline cold; with its weight in L2 it ran 23.7 µs against eager's 21.7.)
#: Past this window a cold win stands unless the warm loss outweighs it: the product of the
#: cold and the warm ratio (winner over library baseline) must stay below 1. (On an H200,
#: fused RMSNorm + Linear at 64x2048x3000 won the cold race by more than the window, and
#: ran 12.5 µs in the benchmark's warm replay against eager's 9.1.)
BASELINE_WARM_WINDOW = 1.10
#: After this many profiling rounds, contenders slower than ``PRUNE_RATIO`` times the best so
#: far are not profiled further (they cannot win; cold superoptimize spent 4-5 s profiling).
PRUNE_AFTER_ROUNDS = 2
PRUNE_RATIO = 1.25
#: Contenders slower than this factor times the fastest in the screening turn are not raced.
SCREEN_FACTOR = 1.5
#: Profile options of the screening turn (a few repeats; they override the race's own).
SCREEN_OPTIONS: Mapping[str, float | int] = {"min_time_s": 0.002, "min_repeats": 3}
#: In the screen, a backend may stop timing a contender whose first launches each take over
#: this many times the fastest screened time so far (profile option ``give_up_us``; backends
#: without it ignore it). Eager launches carry launch overhead the graph-replay times of the
#: others do not, so the factor is far past ``SCREEN_FACTOR``: only contenders the screen
#: drops anyway stop early (on the H200 four 10-21 ms variants beside 0.4 ms kernels took
#: 1.5 s each to screen).
SCREEN_GIVE_UP = 5.0
#: Variants of one candidate the screen lets into the rounds: its fastest ones. Variants of
#: one plan differ by printing options and often by a few percent only; racing them all costs
#: rounds, not better picks (on an H100, RMSNorm + Linear at 4096 rows raced 21 contenders
#: within 1.2x of each other, five seconds of its cold time).
SCREEN_VARIANTS = 2

_K = TypeVar("_K")
#: A contender's identity: (candidate index, variant name).
Key = tuple[int, str]


class Contender(NamedTuple):
    """One variant of one built candidate (``candidate``: its index in the report). Its first
    five fields are the (time, candidate index, plan, source, launcher) tuples the pipeline
    used before variants existed."""

    us: float
    candidate: int
    plan: dict[str, Any]
    source: Any
    launcher: Any
    variant: str = DEFAULT_VARIANT

    @property
    def key(self) -> Key:
        return (self.candidate, self.variant)


def contender_key(entry: Sequence[Any]) -> Key:
    """(candidate index, variant) of a contender; a bare 5-tuple is the default variant."""
    return (int(entry[1]), str(entry[5]) if len(entry) > 5 else DEFAULT_VARIANT)


def label(key: Key) -> str:
    """How the report names a contender: "candidate 2", "candidate 2 (variant cuda)"."""
    index, variant = key
    return f"candidate {index}" if variant == DEFAULT_VARIANT else f"candidate {index} ({variant})"


@dataclass
class RaceResult:
    """What the race measured: every contender's best time (the screen's for those it
    dropped), why contenders left (``screened``, ``failed``), and whether it was noisy."""

    best_us: dict[Key, float] = field(default_factory=dict)
    screened: dict[Key, str] = field(default_factory=dict)
    failed: dict[Key, str] = field(default_factory=dict)
    pruned: set[Key] = field(default_factory=set)
    spread: dict[Key, list[float]] = field(default_factory=dict)

    def spread_in_race(self) -> dict[Key, list[float]]:
        """Every round time of the contenders that ran every round (for :func:`_noisy`)."""
        return {k: ts for k, ts in self.spread.items() if k not in self.pruned}

    def ranked(self, contenders: Sequence[Contender]) -> list[Contender]:
        """The contenders still in the race with their best times, fastest first (ties in
        the given order)."""
        alive = [
            c._replace(us=self.best_us[c.key])
            for c in contenders
            if c.key in self.best_us and c.key not in self.failed and c.key not in self.screened
        ]
        order = {c.key: i for i, c in enumerate(contenders)}
        return sorted(alive, key=lambda c: (c.us, order[c.key]))


def _median_us(result: Any) -> float:
    v = getattr(result, "median_us", None)
    if v is not None:
        return float(v)
    if isinstance(result, Mapping) and "median_us" in result:
        return float(result["median_us"])
    return float(result)


def race_options(profile_options: Mapping[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """(rounds, options for each ``profile`` call): a turn's budget is 1/rounds of a full
    profile, so the race costs about one profile per contender."""
    opts = dict(profile_options or {})
    rounds = max(1, int(opts.pop("rounds", PROFILE_ROUNDS)))
    opts.setdefault("min_time_s", 0.2 / rounds)
    opts.setdefault("min_repeats", max(1, 30 // rounds))
    return rounds, opts


def _time(
    be: Backend,
    c: Contender,
    inputs: Any,
    options: Mapping[str, Any],
    result: RaceResult,
    stand_in: Callable[[], contextlib.AbstractContextManager[Any]],
) -> float | None:
    """One ``profile`` call of one contender; a failure takes it out of the race."""
    try:
        with stand_in():
            return _median_us(be.profile(c.launcher, inputs, **options))
    except Exception as exc:
        result.failed[c.key] = f"profiling failed: {type(exc).__name__}: {exc}"
        return None


def takes_option(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _screen(
    be: Backend,
    contenders: Sequence[Contender],
    inputs: Any,
    options: Mapping[str, Any],
    result: RaceResult,
    stand_in: Callable[[], contextlib.AbstractContextManager[Any]],
) -> None:
    """The screening turn: a few repeats each; contenders over ``SCREEN_FACTOR`` times the
    fastest leave the race with their screen time."""
    opts = dict(options)
    opts["min_repeats"] = SCREEN_OPTIONS["min_repeats"]
    opts["min_time_s"] = min(float(opts["min_time_s"]), float(SCREEN_OPTIONS["min_time_s"]))
    quick: dict[Key, float] = {}
    gives_up = takes_option(be.profile, "give_up_us")
    for c in contenders:
        if quick and gives_up:
            opts["give_up_us"] = SCREEN_GIVE_UP * min(quick.values())
        us = _time(be, c, inputs, opts, result, stand_in)
        if us is not None:
            quick[c.key] = us
    if not quick:
        return
    fastest = min(quick.values())
    for key, us in quick.items():
        if us > SCREEN_FACTOR * fastest:
            result.best_us[key] = us
            result.screened[key] = (
                f"screened out ({us:.1f} µs, over {SCREEN_FACTOR:g}x the fastest {fastest:.1f} µs)"
            )
    by_candidate: dict[int, list[Key]] = {}
    for key in sorted(quick, key=quick.__getitem__):
        if key not in result.screened:
            by_candidate.setdefault(key[0], []).append(key)
    for keys in by_candidate.values():
        for key in keys[SCREEN_VARIANTS:]:
            result.best_us[key] = quick[key]
            result.screened[key] = (
                f"screened out ({quick[key]:.1f} µs; its candidate's {SCREEN_VARIANTS} faster "
                "variants race)"
            )


def race(
    be: Backend,
    contenders: Sequence[Contender],
    inputs: Any,
    profile_options: Mapping[str, Any] | None = None,
    *,
    stand_in: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> RaceResult:
    """Time ``contenders`` on ``inputs`` (the screen when some candidate has several
    variants, then interleaved rounds with pruning) inside the backend's profiling session.
    ``stand_in`` wraps every ``profile`` call (a multi-device kernel's local collective)."""
    rounds, opts = race_options(profile_options)
    result = RaceResult()
    with be.profiling_session():
        if len(contenders) > len({c.candidate for c in contenders}):
            _screen(be, contenders, inputs, opts, result, stand_in)
        live = [c for c in contenders if c.key not in result.screened | result.failed]
        for turn in range(rounds):
            if turn >= PRUNE_AFTER_ROUNDS:
                result.pruned |= out_of_the_race(
                    {c.key: result.best_us[c.key] for c in live if c.key in result.best_us}
                )
            for c in live:
                if c.key in result.pruned or c.key in result.failed:
                    continue
                us = _time(be, c, inputs, opts, result, stand_in)
                if us is None:
                    continue
                result.best_us[c.key] = min(result.best_us.get(c.key, math.inf), us)
                result.spread.setdefault(c.key, []).append(us)
    return result


def out_of_the_race(best_us: Mapping[_K, float]) -> set[_K]:
    """The keys whose best time is over ``PRUNE_RATIO`` times the best one."""
    if not best_us:
        return set()
    best = min(best_us.values())
    return {k for k, t in best_us.items() if t > best * PRUNE_RATIO}


def _noisy(spread: Mapping[Any, list[float]]) -> bool:
    """True when some contender's best round was not reproduced by another round: its
    time (the best round's median) may then be inflated by load from other processes."""
    for rounds in spread.values():
        if len(rounds) < 2:
            continue
        best = min(rounds)
        if sum(1 for r in rounds if r <= best * NOISE_TOLERANCE) < 2:
            return True
    return False


def pick_cold_tie(
    cold_us: Mapping[_K, float], warm_us: Callable[[_K], float | None]
) -> tuple[_K, dict[_K, float]]:
    """The key with the lowest cold-cache time, or, among the keys within ``COLD_TIE_RATIO``
    of it, the one ``warm_us`` (time with the inputs left in cache) finds fastest; with the
    warm times used (empty when nothing tied or ``warm_us`` gave None)."""
    best = min(cold_us, key=lambda k: cold_us[k])
    tied = [k for k in cold_us if cold_us[k] <= COLD_TIE_RATIO * cold_us[best]]
    if len(tied) < 2:
        return best, {}
    warm: dict[_K, float] = {}
    for k in tied:
        us = warm_us(k)
        if us is None:
            return best, {}
        warm[k] = us
    return min(tied, key=lambda k: warm[k]), warm


def break_cold_ties(
    be: Backend, ranked: list[Contender], inputs: Any, notes: list[str]
) -> list[Contender]:
    """``ranked`` (fastest cold time first) with :func:`pick_cold_tie`'s contender first; a
    note when the warm times changed the pick."""
    launchers = {c.key: c.launcher for c in ranked}
    try:
        pick, warm = pick_cold_tie(
            {c.key: c.us for c in ranked}, lambda k: be.warm_time_us(launchers[k], inputs)
        )
    except Exception as exc:  # a timing failure only forgoes the tie-break
        notes.append(f"warm timing failed, contenders ordered by cold time: {exc}")
        return ranked
    first = ranked[0].key
    if pick != first:
        notes.append(
            f"{', '.join(label(k) for k in warm)} were within {COLD_TIE_RATIO:g}x of each "
            f"other with a cold cache; {label(pick)} was chosen as the fastest with its inputs "
            f"in cache ({warm[pick]:.1f} µs against {warm[first]:.1f} µs)"
        )
    return sorted(ranked, key=lambda c: c.key != pick)


def prefer_baseline(
    ranked: list[Contender],
    is_library: Callable[[Contender], bool],
    notes: list[str],
    warm_us: Callable[[Contender], float | None] | None = None,
) -> list[Contender]:
    """``ranked`` (the winner first) with its fastest library-only contender first instead
    when the winner generates kernels and either beats it by less than ``BASELINE_MARGIN``,
    or by less than ``BASELINE_WARM_WINDOW`` while ``warm_us`` (time with the inputs in
    cache, None where unknown) finds it no faster, or by more while the warm ratio undoes
    the cold one (their product is not below 1); a note says so."""
    if not ranked or is_library(ranked[0]):
        return ranked
    winner = ranked[0]
    base = next((c for c in ranked if is_library(c)), None)
    if base is None:
        return ranked
    if base.us <= BASELINE_MARGIN * winner.us:
        notes.append(
            f"{label(winner.key)} ran {winner.us:.1f} µs against {base.us:.1f} µs for "
            f"{label(base.key)}, which runs library kernels only: within {BASELINE_MARGIN:g}x "
            "the race does not tell them apart, so the library kernels were kept"
        )
        return [base, *(c for c in ranked if c is not base)]
    if warm_us is None:
        return ranked
    try:
        warm_winner, warm_base = warm_us(winner), warm_us(base)
    except Exception as exc:  # a timing failure only forgoes the warm comparison
        notes.append(f"warm timing failed, the library baseline compared cold only: {exc}")
        return ranked
    if warm_winner is None or warm_base is None:
        return ranked
    close = base.us <= BASELINE_WARM_WINDOW * winner.us
    if warm_winner < warm_base if close else winner.us * warm_winner < base.us * warm_base:
        return ranked
    notes.append(
        f"{label(winner.key)} ran {winner.us:.1f} µs against {base.us:.1f} µs for "
        f"{label(base.key)} (library kernels only) with a cold cache, but "
        f"{warm_winner:.1f} µs against {warm_base:.1f} µs with its inputs in cache: "
        + (
            "not faster in both"
            if close
            else "the warm loss outweighs the cold win (product of the ratios ≥ 1)"
        )
        + ", so the library kernels were kept"
    )
    return [base, *(c for c in ranked if c is not base)]


def variants_of(be: Backend, launcher: Any) -> Mapping[str, Any]:
    """``be.variants(launcher)``, checked: a non-empty mapping of names to launchers (kept
    as given where its names are strings: a backend may build a launcher when it is first
    looked up)."""
    variants = be.variants(launcher)
    if not isinstance(variants, Mapping) or not variants:
        raise TypeError(
            f"{type(be).__name__}.variants() returned {variants!r}: it must return a non-empty "
            "mapping of variant name to launcher (the default is {'default': launcher})"
        )
    if all(isinstance(k, str) for k in variants):
        return variants
    return {str(k): v for k, v in variants.items()}


def build_contenders(be: Backend, index: int, plan: dict[str, Any]) -> tuple[list[Contender], Any]:
    """Print, compile and load candidate ``index``'s ``plan``: its contenders, one per
    variant, and the compiled artifact."""
    source = be.codegen(plan)
    artifact = be.compile(source)
    variants = variants_of(be, be.load(artifact))
    contenders = [Contender(math.inf, index, plan, source, v, n) for n, v in variants.items()]
    return contenders, artifact
