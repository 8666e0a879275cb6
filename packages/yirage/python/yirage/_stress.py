"""Stress inputs for the numeric check: values at which a naive ``exp`` overflows, and the
dtype's extremes.

The ordinary check inputs (N(0, 1), scaled per matrix) keep every exp argument small, so a
candidate that computes ``exp`` without subtracting the maximum passes them and then returns
NaN on real logits. When the graph has kernel-level ``exp`` or ``softmax`` ops, the check also
scales its inputs until the largest exp argument of the float64 reference reaches
:data:`EXP_TARGET` (past float32's exp overflow at 88.7 and float16's at 11.1, far below
float64's at 709.8). On those inputs a candidate must be finite wherever the reference rounded
to the output dtype is finite (and non-finite wherever it is not) and agree in value within
:func:`stress_tolerance`.

The extremes set (:func:`extremes_stress`) sprinkles each input dtype's extreme finite values
(±largest up to :data:`LARGEST_CAP`, ±smallest normal, ±smallest subnormal, ±0) over the check
inputs, so a candidate
that squares or sums in the storage dtype, flushes subnormals into a division or divides a zero
by a zero where the graph does not, shows it. Infinities and NaN are not among its inputs: how
they propagate through a sum depends on its order, which candidates are free to choose.

A reference element that is NaN (undefined in float64 too, e.g. a softmax whose float64 exp
overflowed, ``inf / inf``) is not compared: a kernel that shifts its exps may give the
mathematically defined number there.

An element whose float64 reference is the small difference of large terms (two extremes of
opposite sign in one dot product) is not computable in float32: no summation order gets it
right, the library's included, and a check that compared it would pick kernels by luck.
:func:`ill_conditioned` finds such elements from the graph evaluated on inputs moved by
float32's rounding bound; they are compared for finiteness only (finite where the
reference is; where the reference overflows, a kernel whose cancelling sum came out smaller
may stay finite, as the library may), and the report says how many there were.

A stress set that the library baseline (the graph run op by op, as PyTorch eager would) fails
too shows an overflow of the graph itself in its dtype, not of a candidate: it is then not
enforced, and the report says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yirage import _compare_torch, _reference_torch
from yirage._dtypes import bfloat16_bits
from yirage._graph import KernelGraph
from yirage._kernel import TOLERANCES, Shapes, to_numpy64

__all__ = [
    "EXP_TARGET",
    "EXTREMES_DENSITY",
    "LARGEST_CAP",
    "Exemptions",
    "StressSet",
    "dtype_extremes",
    "exp_stress",
    "extremes_stress",
    "ill_conditioned",
    "overflow_prone",
    "reference_rounding_bound",
    "rounded_reference",
    "rounding_bound",
    "stress_error",
    "stress_tolerance",
]

#: Largest exp argument the stress inputs aim at.
EXP_TARGET = 120.0
#: Unit roundoff of each dtype (relative spacing / 2).
_UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
#: Fraction of each input's elements the extremes set replaces: sparse enough that most rows
#: keep ordinary values next to the extreme ones (a dense sprinkle only overflows everything).
EXTREMES_DENSITY = 1 / 64
#: Cap on the largest value: kernels compute in float32, whose range a square of a float32 or
#: bfloat16 maximum leaves (RMSNorm's sum of squares then overflows in every kernel, the
#: library's included, and the set would test nothing); 2^56 squared, summed 2^15 times, stays
#: inside it. float16's largest value (65504) is below the cap and used as it is.
LARGEST_CAP = 2.0**56
#: (largest finite, smallest normal, smallest subnormal) of each dtype.
_LIMITS = {
    "float32": (float(np.finfo(np.float32).max), 2.0**-126, 2.0**-149),
    "float16": (65504.0, 2.0**-14, 2.0**-24),
    "bfloat16": (float(np.float32(3.3895313892515355e38)), 2.0**-126, 2.0**-133),
}


@dataclass
class StressSet:
    """Inputs (float32 arrays holding values exact in the graph's dtypes, kernel shapes) and
    the float64 reference outputs (kernel shapes) of one stress set. ``perturbed(eta, seed)``
    evaluates the reference on the inputs each moved by a random relative ``eta`` (see
    :func:`ill_conditioned`); it is called only when some contender misses the tolerance."""

    name: str
    arrays: list[np.ndarray]
    reference: list[np.ndarray]
    perturbed: Callable[[float, int], list[np.ndarray]] | None = None
    #: :func:`rounded_reference` of ``reference`` where it was computed with the set.
    rounded: list[np.ndarray] | None = None


def stress_tolerance(dtype: str) -> float:
    """Relative error allowed on stress inputs: the ordinary tolerance, widened by what an
    argument of size :data:`EXP_TARGET` rounded once to ``dtype`` does to an exp (a library
    kernel may round logits to the graph dtype)."""
    return max(TOLERANCES[dtype], min(0.25, 4 * EXP_TARGET * _UNIT_ROUNDOFF[dtype]))


def _exp_argument_graph(graph: KernelGraph) -> KernelGraph | None:
    """The graph cut after the last tensor that feeds a kernel-level exp or softmax, with
    those tensors as its outputs; None when the graph has none (or holds fused operators,
    whose tensor numbering this cut does not follow)."""
    doc = json.loads(graph.to_json())
    ops = doc["ops"]
    if any(op["op"] == "customized" for op in ops):
        return None
    args = sorted(
        {
            int(op["x"])
            for op in ops
            if op["op"] == "softmax" or (op["op"] == "unary" and op.get("kind") == "exp")
        }
    )
    if not args:
        return None
    last_input = max(i for i, op in enumerate(ops) if op["op"] == "input")
    doc["ops"] = ops[: max(args[-1], last_input) + 1]  # the inputs stay the graph's
    doc["outputs"] = args
    return KernelGraph.from_json(json.dumps(doc))


def _peak(probe: KernelGraph, arrays: Sequence[np.ndarray], device: Any = None) -> float:
    """The largest absolute output of ``probe`` (NaN skipped): evaluated with torch on
    ``device`` (a GPU) where given and mirrored there, else by the core evaluator."""
    if device is not None:
        value = _reference_torch.peak(probe, arrays, device)
        if value is not None:
            return value
    with np.errstate(all="ignore"):
        outs = probe.evaluate(list(arrays))
    return max(float(np.nanmax(np.abs(o), initial=0.0)) for o in outs)


def _homogeneous_degree(probe: KernelGraph) -> float | None:
    """The degree p with arg(c·inputs) = c^p · arg(inputs) shared by every output of
    ``probe`` (None when some output is not homogeneous, or they differ): 1 for an input, the
    sum over a product or matmul, half for a square root, 0 for a normalised value."""
    doc = json.loads(probe.to_json())
    deg: list[float | None] = []
    for op in doc["ops"]:
        kind = op["op"]

        def d(key: str, op: dict[str, Any] = op) -> float | None:
            return deg[int(op[key])]

        out: float | None = None
        if kind == "input":
            out = 1.0
        elif kind in ("reduction", "chunk", "all_reduce"):
            out = d("x")
        elif kind == "matmul":
            a, b = d("a"), d("b")
            out = None if a is None or b is None else a + b
        elif kind == "binary":
            a, b = d("a"), d("b")
            if a is not None and b is not None:
                name = op["kind"]
                out = a + b if name == "mul" else a - b if name == "div" else a if a == b else None
        elif kind == "unary":
            x = d("x")
            factor = {"mul_scalar": 1.0, "neg": 1.0, "square": 2.0, "sqrt": 0.5, "rsqrt": -0.5}
            if x is not None:
                out = x * factor[op["kind"]] if op["kind"] in factor else (0.0 if x == 0 else None)
        elif kind == "rms_norm":
            w = op.get("weight")
            out = 0.0 if w is None else deg[int(w)]
        elif kind == "softmax":
            out = 0.0 if d("x") == 0 else None
        elif kind == "concat":
            parts = {deg[int(x)] for x in op["xs"]}
            out = parts.pop() if len(parts) == 1 else None
        deg.append(out)
    degrees = {deg[int(t)] for t in doc["outputs"]}
    return degrees.pop() if len(degrees) == 1 else None


def _round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values exactly representable in ``dtype`` (round to nearest even)."""
    x = np.asarray(a, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (bfloat16_bits(x).astype(np.uint32) << 16).view(np.float32)
    return x


def exp_stress(
    graph: KernelGraph,
    shapes: Shapes,
    check_arrays: Sequence[np.ndarray],
    reference: Callable[[list[np.ndarray]], list[np.ndarray]],
    device: Any = None,
) -> StressSet | None:
    """The exp-overflow stress set for ``graph`` built from its check inputs (float64 or
    float32 arrays in the graph's shapes), or None when scaling the inputs cannot push an
    exp argument to :data:`EXP_TARGET` (no exp, a scale-invariant argument such as a
    normalised one, or no finite scale). ``reference`` evaluates the graph in float64 on
    kernel-shaped arrays; the cut graph is evaluated on ``device`` (a GPU) where given. The
    scale comes from one evaluation of the cut graph when the exp argument is homogeneous of
    a degree p the graph shows (p = 1 for a softmax of an input, 2 for attention scores, 0 for
    a normalised argument, which no scale pushes), else from up to three (p estimated from
    the first two)."""
    probe = _exp_argument_graph(graph)
    if probe is None:
        return None
    base = [np.asarray(a, dtype=np.float32) for a in check_arrays]
    a1 = _peak(probe, base, device)
    if not (math.isfinite(a1) and a1 > 0):
        return None
    degree = _homogeneous_degree(probe)
    if degree is not None:  # one evaluation: the argument scales as c^degree
        if degree <= 0:
            return None  # a normalised argument: no scale reaches an overflow
        scale = (EXP_TARGET / a1) ** (1.0 / degree)
        peak = a1 * scale**degree
    else:  # estimate the degree from a second evaluation, check with a third
        scale = EXP_TARGET / a1
        peak = _peak(probe, [a * np.float32(scale) for a in base], device)
        if not 0.75 * EXP_TARGET <= peak <= 4 * EXP_TARGET:
            if not (math.isfinite(peak) and peak > 0) or abs(math.log(scale)) < 1e-6:
                return None
            estimate = math.log(peak / a1) / math.log(scale)
            if estimate < 0.1:
                return None  # the argument hardly moves with the inputs' scale
            scale = (EXP_TARGET / a1) ** (1.0 / estimate)
            peak = _peak(probe, [a * np.float32(scale) for a in base], device)
            if not 0.5 * EXP_TARGET <= peak <= 5 * EXP_TARGET:
                return None
    dtypes = [t.dtype.name for t in graph.inputs]
    arrays = [_round_to(a * np.float32(scale), d) for a, d in zip(base, dtypes, strict=True)]
    kernel_arrays = shapes.to_kernel(arrays)
    return StressSet(
        name=f"exp stress: inputs x{scale:.3g}, largest exp argument {peak:.0f}",
        arrays=kernel_arrays,
        reference=reference(kernel_arrays),
        perturbed=_perturbed(reference, kernel_arrays, device),
    )


def dtype_extremes(dtype: str) -> np.ndarray:
    """The extreme finite values of ``dtype`` as float32 (each exact in ``dtype``): ±largest
    (at most :data:`LARGEST_CAP`), ±smallest normal, ±smallest subnormal, ±0."""
    big, normal, sub = _LIMITS[dtype]
    big = min(big, LARGEST_CAP)
    vals = [big, -big, normal, -normal, sub, -sub, 0.0, -0.0]
    return np.array(vals, dtype=np.float32)


def extremes_stress(
    graph: KernelGraph,
    shapes: Shapes,
    check_arrays: Sequence[np.ndarray],
    reference: Callable[[list[np.ndarray]], list[np.ndarray]],
    seed: int,
    device: Any = None,
) -> StressSet:
    """The check inputs with :data:`EXTREMES_DENSITY` of each input's elements (positions and
    values drawn from ``seed``) replaced by its dtype's extremes (:func:`dtype_extremes`), and
    their float64 reference. ``reference`` evaluates the graph in float64 on kernel-shaped
    arrays (on ``device``, a torch device, where given)."""
    rng = np.random.default_rng([seed % 2**63, 0x657874])
    arrays = []
    for a, t in zip(check_arrays, graph.inputs, strict=True):
        x = np.array(a, dtype=np.float32, copy=True)
        values = dtype_extremes(t.dtype.name)
        where = rng.random(x.shape) < EXTREMES_DENSITY
        x[where] = values[rng.integers(0, len(values), size=int(np.count_nonzero(where)))]
        arrays.append(_round_to(x, t.dtype.name))
    kernel_arrays = shapes.to_kernel(arrays)
    return StressSet(
        name=(
            "dtype extremes: ±largest (≤ 2^56), ±smallest normal, ±smallest subnormal and ±0 at "
            f"1 in {round(1 / EXTREMES_DENSITY)} input elements"
        ),
        arrays=kernel_arrays,
        reference=reference(kernel_arrays),
        perturbed=_perturbed(reference, kernel_arrays, device),
    )


def _perturbed(
    reference: Callable[[list[Any]], list[np.ndarray]],
    arrays: list[np.ndarray],
    device: Any = None,
) -> Callable[[float, int], list[np.ndarray]]:
    """``run(eta, seed)``: ``reference`` of ``arrays``, each element times ``1 + eta·v``,
    ``v`` uniform in [-1, 1) drawn from ``seed`` (the same ``v`` for ``eta`` and ``-eta``:
    a draw and its mirror). With a torch ``device`` (where the references run) the inputs
    are moved there rather than on the host, where moving GQA decode kv16384's 67M input
    elements in float64 takes about half a second (``benchmarks/probes/perturb_cost.py``)."""

    def run(eta: float, seed: int) -> list[np.ndarray]:
        if device is not None:
            return reference(_moved_on(arrays, eta, seed, device))
        rng = np.random.default_rng([seed, 0x7065727475])
        moved = []
        for a in arrays:  # a · (1 + eta·v), in place: no temporaries of the inputs' size
            m = rng.uniform(-1, 1, a.shape)
            m *= eta
            m += 1
            m *= a
            moved.append(m)
        return reference(moved)

    return run


def rounding_bound(graph: KernelGraph, dtype: str) -> float:
    """A coarse relative bound on what float32 accumulation and a few roundings to ``dtype``
    do, as a relative change of the inputs (backward error): a float32 sum of n products
    equals the exact sum of products each off by at most n·2^-24, n being at most the
    graph's longest input dim."""
    n = max((d for t in graph.inputs for d in t.dims), default=1)
    return n * 2.0**-24 + 4 * _UNIT_ROUNDOFF[dtype]


def reference_rounding_bound(graph: KernelGraph) -> float:
    """:func:`rounding_bound` of the float64 reference itself: n·2^-53."""
    n = max((d for t in graph.inputs for d in t.dims), default=1)
    return n * 2.0**-53


def ill_conditioned(
    reference: np.ndarray, perturbed: Sequence[np.ndarray], tol: float
) -> np.ndarray:
    """The elements that move by more than a quarter of ``tol`` (relative) when the inputs
    move by the rounding bound (``perturbed``: float64 references of randomly perturbed
    inputs, see :func:`rounding_bound`): a kernel computing in float32 may miss them by
    that much in any summation order."""
    with np.errstate(over="ignore", invalid="ignore"):
        moved = np.zeros(reference.shape)
        for p in perturbed:
            moved = np.maximum(moved, np.abs(p.reshape(reference.shape) - reference))
        resolved: np.ndarray = 4 * moved <= tol * np.abs(reference)
    return ~resolved


def overflow_prone(
    reference: np.ndarray, perturbed: Sequence[np.ndarray], exempt: np.ndarray, dtype: str
) -> np.ndarray:
    """The elements of ``exempt`` (:func:`ill_conditioned`) where the float64 reference
    itself cannot tell whether the value fits ``dtype``: the reference plus four times what
    float64's own rounding moves it by (``perturbed``: references of inputs moved by
    :func:`reference_rounding_bound`, best a draw and its mirror, since a one-sided
    function such as silu keeps only one sign of the move; four, the margin
    :func:`ill_conditioned` uses) passes the dtype's largest value.

    A gated MLP's ``silu(x·W1)·(x·W3)`` on the extremes set has such elements: ``x·W1``
    holds ±2^112 products that cancel, what float64 keeps of the terms beside them decides
    its value, and a large ``x·W3`` turns that into a number or an overflow (the float64
    reference said 0 where the exact value overflows; PyTorch eager returned infinity there
    on 4 of 8 seeds). Such elements are not required to be finite."""
    largest = _LIMITS[dtype][0]
    with np.errstate(over="ignore", invalid="ignore"):
        moved = np.zeros(reference.shape)
        for p in perturbed:
            moved = np.maximum(moved, np.abs(p.reshape(reference.shape) - reference))
        reach = np.abs(reference) + 4 * moved
        out: np.ndarray = exempt.reshape(reference.shape) & ~(reach <= largest)
    return out


class Exemptions:
    """What the comparison of a stress set (outputs on ``tensors``' device) may leave out,
    loosened step by step, each step computed once per set when a contender first needs it
    (each costs one or two float64 evaluations of the graph):

    0. the elements float32 cannot compute to ``tol`` (:func:`ill_conditioned`)
       when the inputs move by the rounding bound;
    1. the same with the mirrored move added (a one-sided function such as silu keeps only
       one sign of it);
    2. among those, the elements whose finiteness the float64 reference cannot decide
       (:func:`overflow_prone`), which need not be finite.

    Each step only widens the last, so a contender judged at the first that passes would
    pass at every later one."""

    STEPS = 3

    def __init__(
        self, graph: KernelGraph, stress: StressSet, tol: float, tensors: list[Any]
    ) -> None:
        self._graph, self._stress, self._tol, self._tensors = graph, stress, tol, tensors
        self.exempt_host: list[np.ndarray] = []
        self.unbounded_host: list[np.ndarray] = []
        self._moved: list[list[np.ndarray]] = []  # per output, the moved references so far
        self._steps: list[tuple[list[Any], list[Any] | None]] = []

    def step(self, i: int) -> tuple[list[Any], list[Any] | None]:
        """(exempt, unbounded) of step ``i``, on the tensors' device."""
        while len(self._steps) <= i:
            self._steps.append(self._next(len(self._steps)))
        return self._steps[i]

    def _next(self, i: int) -> tuple[list[Any], list[Any] | None]:
        run, g = self._stress.perturbed, self._graph
        assert run is not None
        if i < 2:
            eta = max(rounding_bound(g, t.dtype.name) for t in g.outputs)
            moved = run(eta if i == 0 else -eta, 1)
            before = self._moved or [[] for _ in moved]
            self._moved = [[*old, m] for old, m in zip(before, moved, strict=True)]
            self.exempt_host = [
                ill_conditioned(r, m, self._tol)
                for r, m in zip(self._stress.reference, self._moved, strict=True)
            ]
            return _compare_torch.to_device(self.exempt_host, self._tensors), None
        exempt = self._steps[-1][0]
        if any(e.any() for e in self.exempt_host):
            eta64 = reference_rounding_bound(g)
            pairs = zip(run(eta64, 2), run(-eta64, 2), strict=True)
            self.unbounded_host = [
                overflow_prone(r, list(m), e, t.dtype.name)
                for r, m, e, t in zip(
                    self._stress.reference, pairs, self.exempt_host, g.outputs, strict=True
                )
            ]
        else:
            self.unbounded_host = [np.zeros_like(e) for e in self.exempt_host]
        return exempt, _compare_torch.to_device(self.unbounded_host, self._tensors)


def _moved_on(arrays: list[np.ndarray], eta: float, seed: int, device: Any) -> list[Any]:
    """:func:`_perturbed`'s moved inputs as float64 tensors on ``device``."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 0x10001 + 0x7065727475) % 2**63)
    out = []
    for a in arrays:
        base = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        u = torch.rand(base.shape, generator=gen, device=device, dtype=torch.float32)
        out.append(u.double().mul_(2 * eta).add_(1 - eta).mul_(base))
    return out


def rounded_reference(reference: Sequence[np.ndarray], dtypes: Sequence[str]) -> list[np.ndarray]:
    """The float64 reference rounded to the output dtypes (as float64 arrays): what
    :func:`stress_error` compares with. Computed once per stress set (rounding 16M float64
    values to float16 takes numpy about a second)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return [
            r.astype(np.float16 if d == "float16" else np.float32).astype(np.float64)
            for r, d in zip(reference, dtypes, strict=True)
        ]


def stress_error(
    outputs: Sequence[Any],
    reference: Sequence[Any],
    dtypes: Sequence[str],
    edge: float = 0.0,
    exempt: Sequence[Any] | None = None,
    rounded: Sequence[Any] | None = None,
    unbounded: Sequence[Any] | None = None,
) -> tuple[float, str | None]:
    """(worst relative error over the elements the reference keeps finite in the output
    dtype, a reason when the finite/non-finite pattern differs). A NaN of the reference is
    not compared (see the module doc); an infinite one must be non-finite in the output
    unless it is exempt. A finite reference within relative ``edge`` (the tolerance) of the
    dtype's largest value may come out as the infinity of its sign: an error the tolerance
    allows can round it past; likewise a reference just past the largest value may come out
    finite within ``edge`` of it (rounding an intermediate to the dtype can bring it back).
    Elements of ``exempt`` (per output, see :func:`ill_conditioned`) must be finite where
    the reference is, and are not compared otherwise, except those of ``unbounded``
    (:func:`overflow_prone`), which need not be finite either. ``rounded``:
    :func:`rounded_reference` of ``reference`` where the caller keeps it (computed here
    otherwise). Where ``reference`` holds torch tensors (``rounded`` and ``exempt`` then
    too: :func:`yirage._compare_torch.to_device`) it is compared on their device."""
    if reference and _compare_torch.is_torch_tensor(reference[0]):
        if rounded is None:
            raise ValueError("a reference on a device needs its rounded reference there too")
        largest = [_LIMITS[d][0] for d in dtypes]
        return _compare_torch.stress_error(
            outputs, reference, rounded, dtypes, largest, edge, exempt, unbounded
        )
    worst = 0.0
    if rounded is None:
        rounded = rounded_reference(reference, dtypes)
    for i, (o, r, want, d) in enumerate(zip(outputs, reference, rounded, dtypes, strict=True)):
        got = to_numpy64(o)
        if got.shape != want.shape:
            return math.inf, f"output {i} has shape {got.shape}, expected {want.shape}"
        finite = np.isfinite(want)
        with np.errstate(invalid="ignore"):
            past = finite & np.isinf(got) & (np.sign(got) == np.sign(r))
            past &= np.abs(r) * (1 + edge) > _LIMITS[d][0]
        finite &= ~past
        if unbounded is not None:
            finite &= ~unbounded[i].reshape(finite.shape)
        lost = int(np.count_nonzero(finite & ~np.isfinite(got)))
        if lost:
            return math.inf, (
                f"output {i}: {lost} of {finite.size} elements are NaN/Inf where the float64 "
                "reference is finite"
            )
        overflows = np.isinf(want)
        if exempt is not None:
            overflows &= ~exempt[i].reshape(overflows.shape)
        with np.errstate(invalid="ignore"):  # an overflow within the tolerance may stay finite
            overflows &= ~(np.isfinite(r) & (np.abs(got - r) <= edge * np.abs(r)))
        extra = int(np.count_nonzero(overflows & np.isfinite(got)))
        if extra:
            return math.inf, (
                f"output {i}: {extra} elements are finite where the float64 reference overflows {d}"
            )
        if exempt is not None:
            finite &= ~exempt[i].reshape(finite.shape)
        denom = float(np.linalg.norm(want[finite]))
        err = float(np.linalg.norm(got[finite] - want[finite]))
        worst = max(worst, err / denom if denom > 0 else err)
    return worst, None
