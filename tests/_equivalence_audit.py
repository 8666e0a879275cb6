"""Random audit of ``yr.equivalent``: random small kernel graphs and random mutations of them,
each pair judged by the fingerprints and by an independent numpy evaluation.

The numpy judge evaluates both graphs on random inputs in float64 and in extended precision
(``np.longdouble``). An output element is *well-conditioned* in a graph when its two
evaluations agree (to 1e-9 of the output's scale, or as the same NaN/infinity); the pair is

* ``different`` when some element is well-conditioned in both graphs and the two values are
  far apart (more than 1e-6 of the scale, or a NaN/infinity against a finite value);
* ``equal`` when every element of every draw is well-conditioned in both and the values agree
  within the rounding noise the graphs show between the two precisions (plus 1e-13 of the
  scale; NaN with NaN, an infinity with the same infinity);
* ``equal_nan`` when they are equal but some element is NaN in both (a square root of a
  negative value, pow of a negative base): the fingerprints model NaN-producing ops as
  functions of their field values and do not see that NaN absorbs, so such pairs may be
  rejected; they do not count as false rejects;
* ``unclear`` otherwise (overflow, cancellation, values that only nearly agree): such pairs
  count as neither a false accept nor a false reject.

Run large:  python tests/_equivalence_audit.py --pairs 100000 [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

import yirage as yr
from yirage import _core

Arr = npt.NDArray[np.floating]

M, N = 4, 8
#: Input shapes: three [M, N] activations and one [N, N] weight.
INPUT_DIMS: tuple[tuple[int, int], ...] = ((M, N), (M, N), (M, N), (N, N))

P, Q = _core.field_info()["p"], _core.field_info()["q"]
#: Ordinary scalars, and scalars congruent to small ones modulo the field's primes.
#: (No value and its rounded reciprocal: 3 · fl(1/3) is not 1 exactly, and the fingerprints,
#: which compute exactly, tell them apart.)
SCALARS = (0.5, 2.0, -1.0, 3.0, 0.125, 0.1, 1e-3, -0.75, 1.5, 5.0)
CONGRUENT = (float(P * Q + 1), float(Q + 1), float(P + 1), float(P * Q + 2), float(Q))
EPS = (0.0, 1e-6, 1e-3)

UNARY = ("exp", "square", "sqrt", "rsqrt", "silu", "gelu", "relu", "sigmoid", "tanh", "neg")
BINARY = ("add", "sub", "mul", "div", "pow")


@dataclass(frozen=True)
class Node:
    """One op of a random program: ``op`` on earlier nodes ``args`` (inputs are nodes 0..3)."""

    op: str
    args: tuple[int, ...] = ()
    param: float = 0.0
    dims: tuple[int, ...] = (M, N)


@dataclass
class Program:
    nodes: list[Node] = field(default_factory=list)

    def copy(self) -> Program:
        return Program(list(self.nodes))

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1


def _bcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


def inputs_program() -> Program:
    return Program([Node("input", dims=d) for d in INPUT_DIMS])


def _pick(rng: np.random.Generator, p: Program, ok: Callable[[Node], bool]) -> int | None:
    ids = [i for i, n in enumerate(p.nodes) if ok(n)]
    if not ids:
        return None
    # favour recent nodes, so programs are deep rather than wide
    w = np.arange(1, len(ids) + 1, dtype=float) ** 2
    return int(ids[rng.choice(len(ids), p=w / w.sum())])


def random_op(rng: np.random.Generator, p: Program) -> Node | None:
    """A random op on existing nodes, or None when the drawn kind has no valid operands."""
    kind = rng.choice(["unary", "unary", "binary", "binary", "scalar", "matmul", "reduce", "norm"])
    act = _pick(rng, p, lambda n: n.dims[0] in (1, M))
    if act is None:
        return None
    x = p.nodes[act]
    if kind == "unary":
        return Node(str(rng.choice(UNARY)), (act,), dims=x.dims)
    if kind == "scalar":
        pool = CONGRUENT if rng.random() < 0.05 else SCALARS
        return Node("mul_scalar", (act,), float(rng.choice(pool)), x.dims)
    if kind == "binary":
        other = _pick(rng, p, lambda n: _bcast(x.dims, n.dims) is not None)
        if other is None:
            return None
        a, b = (act, other) if rng.random() < 0.5 else (other, act)
        dims = _bcast(p.nodes[a].dims, p.nodes[b].dims)
        assert dims is not None
        return Node(str(rng.choice(BINARY)), (a, b), dims=dims)
    if kind == "matmul":
        if x.dims[1] != N:
            return None
        return Node("matmul", (act, 3), dims=(x.dims[0], N))
    if kind == "reduce":
        dim = int(rng.integers(0, 2))
        dims = (1, x.dims[1]) if dim == 0 else (x.dims[0], 1)
        return Node("reduction", (act,), float(dim), dims)
    if x.dims[1] != N:
        return None
    op = "rms_norm" if rng.random() < 0.7 else "softmax"
    return Node(op, (act,), float(rng.choice(EPS)) if op == "rms_norm" else 0.0, x.dims)


def random_program(rng: np.random.Generator, n_ops: int) -> Program:
    p = inputs_program()
    while len(p.nodes) < len(INPUT_DIMS) + n_ops:
        node = random_op(rng, p)
        if node is not None:
            p.add(node)
    return p


# --- mutations -------------------------------------------------------------------------------


def _mutable(p: Program) -> list[int]:
    return [i for i, n in enumerate(p.nodes) if n.op != "input"]


def _splice(p: Program, i: int, extra: Sequence[Node], out: int) -> Program:
    """Insert ``extra`` after node ``i`` (their args: old ids <= i, or ``i + 1 + k`` for extra
    node k) and make the later users of ``i`` read extra node ``out`` instead."""
    shift = len(extra)
    q = Program(p.nodes[: i + 1] + list(extra))
    new = i + 1 + out
    for n in p.nodes[i + 1 :]:
        q.add(
            replace(n, args=tuple(new if a == i else (a + shift if a > i else a) for a in n.args))
        )
    return q


def _rewire(p: Program, i: int, replacement: Node) -> Program:
    """Make the later users of node ``i`` read ``replacement`` (which may use ``i``)."""
    return _splice(p, i, [replacement], 0)


def mutate(rng: np.random.Generator, p: Program) -> Program:
    """A random mutation: swap operands, change an op or a scalar, negate, insert an
    identity or a degenerate value, redirect an operand."""
    ids = _mutable(p)
    i = int(rng.choice(ids))
    n = p.nodes[i]
    kind = rng.choice(
        ["swap", "op", "scalar", "neg", "identity", "zero_div", "sqrt_sign", "redirect"]
    )
    q = p.copy()
    if kind == "swap" and len(n.args) == 2 and n.op != "matmul":
        q.nodes[i] = replace(n, args=(n.args[1], n.args[0]))
    elif kind == "op" and n.op in UNARY:
        q.nodes[i] = replace(n, op=str(rng.choice(UNARY)))
    elif kind == "op" and n.op in BINARY:
        q.nodes[i] = replace(n, op=str(rng.choice(BINARY)))
    elif kind == "scalar" and n.op == "mul_scalar":
        congruent = n.param + float(rng.choice([P * Q, Q, P])) * float(rng.choice([1, -1]))
        new = congruent if rng.random() < 0.5 else float(rng.choice(SCALARS))
        q.nodes[i] = replace(n, param=new)
    elif kind == "scalar" and n.op == "rms_norm":
        q.nodes[i] = replace(n, param=float(rng.choice(EPS)))
    elif kind == "neg":
        q = _rewire(p, i, Node("neg", (i,), dims=n.dims))
    elif kind == "identity":
        q = _insert_identity(rng, p, i)
    elif kind == "zero_div" and n.dims == (M, N):
        # x / (y - y) or rsqrt(y - y): divisions by a value that is 0 for every input
        y = int(rng.choice([0, 1, 2]))
        last = Node("div", (i, i + 1)) if rng.random() < 0.5 else Node("rsqrt", (i + 1,))
        q = _splice(p, i, [Node("sub", (y, y)), last], 1)
    elif kind == "sqrt_sign":
        q = _rewire(p, i, Node(str(rng.choice(["sqrt", "rsqrt"])), (i,), dims=n.dims))
        if rng.random() < 0.5:
            q = _rewire(q, i, Node("neg", (i,), dims=n.dims))
    elif kind == "redirect" and n.args:
        k = int(rng.integers(0, len(n.args)))
        same = [j for j in range(i) if p.nodes[j].dims == p.nodes[n.args[k]].dims]
        args = list(n.args)
        args[k] = int(rng.choice(same))
        q.nodes[i] = replace(n, args=tuple(args))
    else:
        q = _rewire(p, i, Node("mul_scalar", (i,), float(rng.choice(SCALARS)), n.dims))
    return q


def _insert_identity(rng: np.random.Generator, p: Program, i: int) -> Program:
    """Rewrite node ``i``'s value into a form that is equal for every input (where defined)."""
    n = p.nodes[i]
    k = i + 1  # id of the first inserted node
    choice = rng.choice(["scale", "add_zero", "exp_split", "mul_div", "distribute", "comm"])
    full = n.dims == (M, N)
    if choice == "scale":
        extra = [Node("mul_scalar", (i,), 4.0, n.dims), Node("mul_scalar", (k,), 0.25, n.dims)]
    elif choice == "add_zero" and full:
        extra = [Node("sub", (0, 0)), Node("add", (i, k))]
    elif choice == "exp_split" and n.op == "exp" and p.nodes[n.args[0]].op in ("add", "sub"):
        inner = p.nodes[n.args[0]]
        x, y = inner.args
        extra = [
            Node("exp", (x,), dims=p.nodes[x].dims),
            Node("exp", (y,), dims=p.nodes[y].dims),
            Node("mul" if inner.op == "add" else "div", (k, k + 1), dims=n.dims),
        ]
    elif choice == "mul_div" and full:
        y = int(rng.choice([0, 1, 2]))
        # a divisor that is never 0: rms_norm of an input (|inputs| >= 0.25)
        extra = [Node("rms_norm", (y,), 1e-6), Node("mul", (i, k)), Node("div", (k + 1, k))]
    elif choice == "distribute" and n.op == "mul" and p.nodes[n.args[1]].op in ("add", "sub"):
        inner = p.nodes[n.args[1]]
        a = n.args[0]
        d1 = _bcast(p.nodes[a].dims, p.nodes[inner.args[0]].dims)
        d2 = _bcast(p.nodes[a].dims, p.nodes[inner.args[1]].dims)
        if d1 is None or d2 is None or _bcast(d1, d2) != n.dims:
            return p.copy()
        extra = [
            Node("mul", (a, inner.args[0]), dims=d1),
            Node("mul", (a, inner.args[1]), dims=d2),
            Node(inner.op, (k, k + 1), dims=n.dims),
        ]
    elif choice == "comm" and n.op in ("add", "mul"):
        extra = [replace(n, args=(n.args[1], n.args[0]))]
    else:
        extra = [Node("neg", (i,), dims=n.dims), Node("neg", (k,), dims=n.dims)]
    return _splice(p, i, extra, len(extra) - 1)


# --- building and evaluating -----------------------------------------------------------------


def build(p: Program) -> yr.KernelGraph:
    """The program as a kernel graph whose output is the last node."""
    g = yr.new_kernel_graph()
    t: list[yr.DTensor] = []
    for n in p.nodes:
        a = [t[k] for k in n.args]
        if n.op == "input":
            t.append(g.new_input(n.dims, dtype=yr.float32))
        elif n.op in UNARY:
            t.append(getattr(g, n.op)(a[0]))
        elif n.op == "mul_scalar":
            t.append(g.mul_scalar(a[0], n.param))
        elif n.op in BINARY:
            t.append(getattr(g, n.op)(a[0], a[1]))
        elif n.op == "matmul":
            t.append(g.matmul(a[0], a[1]))
        elif n.op == "reduction":
            t.append(g.reduction(a[0], int(n.param)))
        elif n.op == "rms_norm":
            t.append(g.rms_norm(a[0], (N,), eps=n.param))
        elif n.op == "softmax":
            t.append(g.softmax(a[0], dim=1))
        else:
            raise ValueError(n.op)
    g.mark_output(t[-1])
    return g


_ERF = np.vectorize(math.erf, otypes=[float])


def _unary(op: str, x: Arr) -> Arr:
    one = x.dtype.type(1)
    table: dict[str, Callable[[Arr], Arr]] = {
        "exp": np.exp,
        "square": lambda v: v * v,
        "sqrt": np.sqrt,
        "rsqrt": lambda v: one / np.sqrt(v),
        "silu": lambda v: v / (one + np.exp(-v)),
        "gelu": lambda v: v / 2 * (one + _ERF(v.astype(float) / math.sqrt(2)).astype(v.dtype)),
        # the reference's relu: x if x > 0 else 0, so relu(NaN) = 0
        "relu": lambda v: np.where(v > 0, v, v.dtype.type(0)),
        "sigmoid": lambda v: one / (one + np.exp(-v)),
        "tanh": np.tanh,
        "neg": lambda v: -v,
    }
    return table[op](x)


def evaluate(p: Program, xs: Sequence[Arr]) -> Arr:
    """numpy evaluation of the program's output in the inputs' dtype (an independent
    implementation of the reference semantics)."""
    return evaluate_flagged(p, xs)[0]


def evaluate_flagged(p: Program, xs: Sequence[Arr]) -> tuple[Arr, bool]:
    """``evaluate`` and whether an op overflowed on the way."""
    overflowed: list[object] = []
    vals: list[Arr] = []
    old = np.seterrcall(lambda err, flag: overflowed.append(err))
    try:
        with np.errstate(all="ignore", over="call"):
            _run(p, xs, vals)
    finally:
        np.seterrcall(old)
    return vals[-1], bool(overflowed)


def _run(p: Program, xs: Sequence[Arr], vals: list[Arr]) -> None:
    for n in p.nodes:
        a = [vals[k] for k in n.args]
        if n.op == "input":
            vals.append(xs[len(vals)])
        elif n.op in UNARY:
            vals.append(_unary(n.op, a[0]))
        elif n.op == "mul_scalar":
            vals.append(a[0] * a[0].dtype.type(n.param))
        elif n.op == "add":
            vals.append(a[0] + a[1])
        elif n.op == "sub":
            vals.append(a[0] - a[1])
        elif n.op == "mul":
            vals.append(a[0] * a[1])
        elif n.op == "div":
            vals.append(a[0] / a[1])
        elif n.op == "pow":
            vals.append(np.power(a[0], a[1]))
        elif n.op == "matmul":
            vals.append(a[0] @ a[1])
        elif n.op == "reduction":
            vals.append(a[0].sum(axis=int(n.param), keepdims=True))
        elif n.op == "rms_norm":
            ms = (a[0] * a[0]).mean(axis=1, keepdims=True)
            vals.append(a[0] / np.sqrt(ms + a[0].dtype.type(n.param)))
        elif n.op == "softmax":
            e = np.exp(a[0])
            vals.append(e / e.sum(axis=1, keepdims=True))


def random_inputs(rng: np.random.Generator) -> list[npt.NDArray[np.float64]]:
    """±[0.25, 2) with random signs."""
    out = []
    for d in INPUT_DIMS:
        mag = rng.uniform(0.25, 2.0, size=d)
        out.append(np.where(rng.random(d) < 0.5, -mag, mag))
    return out


def _same_class(a: Arr, b: Arr) -> npt.NDArray[np.bool_]:
    """Both NaN, or both the same infinity."""
    return (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))


def _scale(*xs: Arr) -> float:
    vals = [float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0)) for x in xs]
    return max(max(vals), 1e-300)


def judge(a: Program, b: Program, draws: Sequence[Sequence[npt.NDArray[np.float64]]]) -> str:
    """``equal``, ``equal_nan``, ``different`` or ``unclear`` (see the module doc)."""
    verdicts: list[str] = []
    for xs in draws:
        a64, b64 = evaluate(a, xs), evaluate(b, xs)
        ext = [x.astype(np.longdouble) for x in xs]
        (a80, over_a), (b80, over_b) = evaluate_flagged(a, ext), evaluate_flagged(b, ext)
        if a64.shape != b64.shape:
            return "different"
        s = _scale(a64, b64)
        with np.errstate(all="ignore"):
            # a graph that overflows even in extended precision is judged nowhere
            cond_a = (_same_class(a64, a80) | (np.abs(a64 - a80) <= 1e-9 * s)) & (not over_a)
            cond_b = (_same_class(b64, b80) | (np.abs(b64 - b80) <= 1e-9 * s)) & (not over_b)
            both = cond_a & cond_b
            finite = np.isfinite(a64) & np.isfinite(b64)
            gap = np.where(finite, np.abs(a64 - b64), np.inf)
            # equal within the rounding noise each graph shows between the two precisions
            noise = np.abs(a64 - a80).astype(float) + np.abs(b64 - b80).astype(float)
            same = _same_class(a64, b64) | (finite & (gap <= 4 * noise + 1e-13 * s))
            far = (~same) & (~finite | (gap > 1e-6 * s))
        if np.any(both & far):
            return "different"
        if not np.all(both & same):
            verdicts.append("unclear")
        else:
            verdicts.append("equal_nan" if np.any(np.isnan(a64)) else "equal")
    for v in ("unclear", "equal_nan"):
        if v in verdicts:
            return v
    return "equal"


@dataclass
class AuditResult:
    pairs: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    false_accepts: list[tuple[Program, Program]] = field(default_factory=list)
    false_rejects: list[tuple[Program, Program]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "pairs": self.pairs,
            **{k: v for k, v in sorted(self.counts.items())},
            "false_accepts": len(self.false_accepts),
            "false_rejects": len(self.false_rejects),
        }


def audit(pairs: int, seed: int, max_ops: int = 6) -> AuditResult:
    """Judge ``pairs`` (program, mutation) pairs; a tenth are (program, unrelated program)."""
    rng = np.random.default_rng(seed)
    res = AuditResult()
    while res.pairs < pairs:
        a = random_program(rng, int(rng.integers(1, max_ops + 1)))
        b = random_program(rng, int(rng.integers(1, max_ops + 1)))
        if rng.random() >= 0.1:
            b = mutate(rng, a)
            if rng.random() < 0.3:
                b = mutate(rng, b)
        ga, gb = build(a), build(b)
        if ga.outputs[0].dims != gb.outputs[0].dims:
            continue
        res.pairs += 1
        truth = judge(a, b, [random_inputs(rng) for _ in range(3)])
        fp = yr.equivalent(ga, gb, seed=int(rng.integers(0, 1 << 30)))
        res.counts[f"{truth}/{'accepted' if fp else 'rejected'}"] += 1
        if fp and truth == "different":
            res.false_accepts.append((a, b))
        elif not fp and truth == "equal":
            res.false_rejects.append((a, b))
    return res


def describe(p: Program) -> str:
    return "; ".join(
        f"t{i}={n.op}({','.join(f't{k}' for k in n.args)}{f', {n.param!r}' if n.param else ''})"
        for i, n in enumerate(p.nodes)
        if n.op != "input"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=5, help="print this many failures of each kind")
    args = ap.parse_args()
    t = time.perf_counter()
    res = audit(args.pairs, args.seed)
    for name, found in (("false accept", res.false_accepts), ("false reject", res.false_rejects)):
        for a, b in found[: args.show]:
            print(f"{name}:\n  A: {describe(a)}\n  B: {describe(b)}")
    out = res.summary() | {"seed": args.seed, "seconds": round(time.perf_counter() - t, 1)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
