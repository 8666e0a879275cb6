"""Hand-written KernelPlans (docs/kernel-plan.md) for the CUDA backend's tests and GPU check.

Until the core's search emits plans, these are the plans the printers are tested on; they
follow the format exactly and cover: rmsnorm+matmul, gated MLP, LoRA (split-K low-rank
projection reduced to dimx in a ``pre`` phase, epilogue add), split-KV attention (GQA decode,
safe softmax, ``scale_outputs`` stored shifted with their maxima, the combine's
``shift_carry``) with and without QK-norm, a mixed library+generated plan, and "zoo" plans
with non-power-of-two tiles and every tile op.

Each builder returns a :class:`Case`: the plan (a dict), input shapes/dtypes, and a float64
numpy reference of the *workload* (independent of the plan).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Offsets = Sequence[Sequence[tuple[str, int]]]


@dataclass
class Case:
    name: str
    plan: dict[str, Any]
    inputs: list[tuple[tuple[int, ...], str]]
    reference: Callable[..., list[np.ndarray]]
    # positive-valued inputs (e.g. for pow / sqrt) by index
    positive: tuple[int, ...] = ()
    scale: dict[int, float] = field(default_factory=dict)
    workload: str | None = None  # yirage._workloads name (target cases)
    preset: str | None = None

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for i, (dims, _) in enumerate(self.inputs):
            # like yirage._workloads: matrix-like inputs ~ N(0, 1/fan_in) keep outputs O(1)
            std = 1.0 / math.sqrt(dims[-2]) if len(dims) >= 2 and dims[-2] >= 64 else 1.0
            x = rng.standard_normal(dims) * std * self.scale.get(i, 1.0)
            if i in self.positive:
                x = np.abs(x) + 0.1
            out.append(x)
        return out


def _off(dims: int, **terms: Any) -> list[list[dict[str, Any]]]:
    """offsets for a rank-``dims`` tile: ``d1=[("iter", 32)]`` style keywords (d0..d3)."""
    out: list[list[dict[str, Any]]] = [[] for _ in range(dims)]
    for key, value in terms.items():
        d = int(key[1:])
        out[d] = [{"var": v, "stride": s} for v, s in value]
    return out


class PlanBuilder:
    """A KernelPlan written op by op; :attr:`plan` is it with the analyses of version 3 made
    (see :func:`analysed`)."""

    def __init__(self, graph_hash: str) -> None:
        self.raw: dict[str, Any] = {
            "format": "yirage.kernel_plan",
            "version": 3,
            "graph_hash": graph_hash,
            "buffers": [],
            "kernels": [],
        }
        self.counts = {"input": 0, "output": 0}

    @property
    def plan(self) -> dict[str, Any]:
        return analysed(self.raw)

    def buf(self, dims: Sequence[int], dtype: str, role: str) -> int:
        bid = len(self.raw["buffers"])
        entry: dict[str, Any] = {"id": bid, "dims": list(dims), "dtype": dtype, "role": role}
        if role in self.counts:
            entry["index"] = self.counts[role]
            self.counts[role] += 1
        self.raw["buffers"].append(entry)
        return bid

    def dims(self, bid: int) -> list[int]:
        return list(self.raw["buffers"][bid]["dims"])

    def library(self, op: str, inputs: Sequence[int], output: int, **params: Any) -> None:
        self.raw["kernels"].append(
            {
                "kind": "library",
                "op": op,
                "inputs": list(inputs),
                "outputs": [output],
                "params": params,
            }
        )

    def kernel(self, name: str, grid: Sequence[int], forloop: int, warps: int = 4) -> KernelBuilder:
        kb = KernelBuilder(self, name, grid, forloop, warps)
        self.raw["kernels"].append(kb.k)
        return kb


class KernelBuilder:
    def __init__(
        self, pb: PlanBuilder, name: str, grid: Sequence[int], forloop: int, warps: int
    ) -> None:
        self.pb = pb
        self.k: dict[str, Any] = {
            "kind": "generated",
            "name": name,
            "grid": [*grid, *([1] * (3 - len(grid)))],
            "block_threads": 32 * warps,
            "warps": warps,
            "forloop_range": forloop,
            "inputs": [],
            "ops": [],
            "outputs": [],
            "safe_softmax": [],
            "smem_bytes": 0,
        }
        self.op_dims: dict[int, list[int]] = {}

    def _add(self, op: dict[str, Any]) -> int:
        op_id = len(self.k["ops"])
        op["id"] = op_id
        self.k["ops"].append(op)
        self.op_dims[op_id] = list(op["dims"])
        return op_id

    def load(
        self,
        bid: int,
        tile: Sequence[int],
        phase: str = "loop",
        shift: tuple[int, int] | None = None,
        **offs: Any,
    ) -> int:
        """A tile load; ``shift=(max buffer, width)`` reads a partial stored shifted, whose
        maxima lie in the max buffer at the same offsets, one column per ``width``."""
        idx = len(self.k["inputs"])
        entry: dict[str, Any] = {
            "buffer": bid,
            "dims": self.pb.dims(bid),
            "tile": list(tile),
            "offsets": _off(len(tile), **offs),
        }
        if shift is not None:
            m_buf, width = shift
            terms = {
                k: [(v, st // width) if k == f"d{len(tile) - 1}" else (v, st) for v, st in t]
                for k, t in offs.items()
            }
            entry["shift_load"] = {
                "buffer": m_buf,
                "tile": [*tile[:-1], tile[-1] // width],
                "offsets": _off(len(tile), **terms),
                "width": width,
            }
        self.k["inputs"].append(entry)
        itemsize = 2 if self.pb.raw["buffers"][bid]["dtype"] != "float32" else 4
        self.k["smem_bytes"] += math.prod(tile) * itemsize
        return self._add({"op": "input", "input": idx, "dims": list(tile), "phase": phase})

    def matmul(self, a: int, b: int, phase: str = "loop") -> int:
        da, db = self.op_dims[a], self.op_dims[b]
        return self._add(
            {"op": "matmul", "args": [a, b], "dims": [*da[:-1], db[-1]], "phase": phase}
        )

    def unary(self, name: str, x: int, phase: str = "loop", params: Sequence[float] = ()) -> int:
        op = {"op": "unary", "unop": name, "args": [x], "dims": self.op_dims[x], "phase": phase}
        if params:
            op["params"] = list(params)
        return self._add(op)

    def binary(self, name: str, a: int, b: int, phase: str = "loop") -> int:
        dims = [max(p, q) for p, q in zip(self.op_dims[a], self.op_dims[b], strict=True)]
        return self._add(
            {"op": "binary", "binop": name, "args": [a, b], "dims": dims, "phase": phase}
        )

    def reduction(self, x: int, dim: int, phase: str = "loop") -> int:
        dims = list(self.op_dims[x])
        dims[dim] = 1
        return self._add({"op": "reduction", "dim": dim, "args": [x], "dims": dims, "phase": phase})

    def to_dimx(self, x: int, dim: int, dimx: int, phase: str = "loop") -> int:
        dims = list(self.op_dims[x])
        dims[dim] = dimx
        return self._add(
            {
                "op": "reduction_to_dimx",
                "dim": dim,
                "dimx": dimx,
                "args": [x],
                "dims": dims,
                "phase": phase,
            }
        )

    def rms_norm(self, x: int, eps: float, phase: str = "loop") -> int:
        return self._add(
            {"op": "rms_norm", "eps": eps, "args": [x], "dims": self.op_dims[x], "phase": phase}
        )

    def concat(self, xs: Sequence[int], dim: int, phase: str = "loop") -> int:
        dims = list(self.op_dims[xs[0]])
        dims[dim] = sum(self.op_dims[x][dim] for x in xs)
        return self._add(
            {"op": "concat", "dim": dim, "args": list(xs), "dims": dims, "phase": phase}
        )

    def accum(self, x: int, acc: str = "iter", **kw: Any) -> int:
        dims = list(self.op_dims[x])
        if acc in ("sum", "rms"):
            dims[-1] = 1
        elif acc == "sum_todimx":
            dims[-1] = kw["dimx"]
        return self._add(
            {"op": "accum", "acc": acc, "args": [x], "dims": dims, "phase": "accum", **kw}
        )

    def store(self, bid: int, src: int, **offs: Any) -> int:
        tile = self.op_dims[src]
        self.k["outputs"].append(
            {"buffer": bid, "src": src, "tile": tile, "offsets": _off(len(tile), **offs)}
        )
        return len(self.k["outputs"]) - 1

    def safe_softmax(
        self,
        exp: int,
        accums: Sequence[int],
        scale_outputs: Sequence[int] = (),
        shift_store: int | None = None,
        **offs: Any,
    ) -> None:
        """A group; with ``scale_outputs`` its running max goes to buffer ``shift_store``
        (tile: the exp's rows, offsets ``offs``)."""
        group: dict[str, Any] = {
            "exp": exp,
            "accums": list(accums),
            "scale_outputs": list(scale_outputs),
        }
        if shift_store is not None:
            rows = [*self.op_dims[self.k["ops"][exp]["args"][0]][:-1], 1]
            group["shift_store"] = {
                "buffer": shift_store,
                "tile": rows,
                "offsets": _off(len(rows), **offs),
            }
        self.k["safe_softmax"].append(group)

    def shift_carry(self, inputs: Sequence[int], accums: Sequence[int]) -> None:
        self.k["shift_carry"] = {"inputs": list(inputs), "accums": list(accums)}


# ---------------------------------------------------------------------------------------------
# the analyses of KernelPlan version 3, made as the core's lowering makes them
# (crates/yirage-core/src/plan/analysis.rs), for H100 (132 SMs)

H100_UNITS = 132
MAX_LOOP_SPLIT = 16


def analysed(raw: dict[str, Any], units: int = H100_UNITS) -> dict[str, Any]:
    """A copy of ``raw`` with loop-invariant ops hoisted to ``pre``, ``accumulate_into``,
    safe-softmax ``rescale`` degrees and each generated kernel's ``loop_split``."""
    plan = copy.deepcopy(raw)
    for k in plan["kernels"]:
        if k["kind"] == "generated":
            _hoist(k)
            _fuse(k)
            for g in k["safe_softmax"]:
                g["rescale"] = _rescale(k, g)
            k["loop_split"] = _loop_split(k, units)
    return plan


def _walks(io: dict[str, Any]) -> bool:
    return any(t["var"] == "iter" for terms in io["offsets"] for t in terms)


def _hoist(k: dict[str, Any]) -> None:
    """Loads that do not walk the loop, and loop ops of ``pre`` values only, are ``pre``."""
    phase: dict[int, str] = {}
    for o in k["ops"]:
        if o["op"] == "input":
            o["phase"] = "loop" if _walks(k["inputs"][o["input"]]) else "pre"
        elif o["phase"] == "loop" and all(phase[a] == "pre" for a in o["args"]):
            o["phase"] = "pre"
        phase[o["id"]] = o["phase"]


def _fuse(k: dict[str, Any]) -> None:
    """A loop matmul read only by an ``iter`` accumulator of its dims adds into it."""
    stored = {s["src"] for s in k["outputs"]}
    for m in k["ops"]:
        if m["op"] != "matmul" or m["phase"] != "loop" or m["id"] in stored:
            continue
        readers = [o for o in k["ops"] if m["id"] in o.get("args", [])]
        if len(readers) == 1:
            acc = readers[0]
            if acc["op"] == "accum" and acc["acc"] == "iter" and acc["dims"] == m["dims"]:
                m["accumulate_into"] = acc["id"]


def _rescale(k: dict[str, Any], group: dict[str, Any]) -> list[dict[str, int]]:
    """Each accumulator of the group with the power of exp(-m) it holds (none when the exp
    is hoisted: its max is fixed)."""
    ops = {o["id"]: o for o in k["ops"]}
    if ops[group["exp"]]["phase"] == "pre":
        return []
    degree: dict[int, int] = {}
    for o in k["ops"]:
        args = [degree[a] for a in o.get("args", [])]
        if o["id"] == group["exp"]:
            d = 1
        elif o["op"] == "matmul" or (o["op"] == "binary" and o["binop"] == "mul"):
            d = sum(args)
        elif o["op"] == "binary" and o["binop"] == "div":
            d = args[0] - args[1]
        else:
            d = max(args, default=0)
        degree[o["id"]] = d
    return [{"accum": a, "degree": degree[a]} for a in group["accums"] if degree[a]]


def _loop_split(k: dict[str, Any], units: int) -> int:
    """Ways to split a loop streaming into accumulators so every unit gets two blocks."""
    streams = any(o["op"] == "accum" for o in k["ops"]) and any(map(_walks, k["inputs"]))
    if not streams:
        return 1
    blocks = math.prod(k["grid"])
    split = 1
    while blocks * split < 2 * units and split * 2 <= min(MAX_LOOP_SPLIT, k["forloop_range"]):
        split *= 2
    return split


# ---------------------------------------------------------------------------------------------
# numpy references (float64)


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


# ---------------------------------------------------------------------------------------------
# workloads


def rmsnorm_linear(
    b: int = 8,
    h: int = 512,
    n: int = 768,
    tn: int = 16,
    tk: int = 32,
    dtype: str = "float32",
    eps: float = 1e-6,
    warps: int = 4,
) -> Case:
    """rms_norm(X[b,h]) @ W[h,n]: matmul and rms accumulated together, divided in the epilogue
    (the plan of docs/kernel-plan.md's example at its default sizes). Where ``tk`` does not
    divide ``h`` the loop is masked: its last tile reads zeros past ``h``."""
    pb = PlanBuilder(f"fixture-rmsnorm-linear-{b}x{h}x{n}-{tn}-{tk}-{dtype}")
    x, w = pb.buf([b, h], dtype, "input"), pb.buf([h, n], dtype, "input")
    o = pb.buf([b, n], dtype, "output")
    k = pb.kernel("rms_mm", [n // tn], -(-h // tk), warps)
    tx = k.load(x, [b, tk], d1=[("iter", tk)])
    tw = k.load(w, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    acc = k.accum(k.matmul(tx, tw))
    rms = k.accum(tx, "rms", eps=eps, extent=h)
    k.store(o, k.binary("div", acc, rms, "epilogue"), d1=[("bx", tn)])
    if h % tk:
        ins = pb.raw["kernels"][-1]["inputs"]
        ins[0]["masked"] = [{"dim": 1, "extent": h}]
        ins[1]["masked"] = [{"dim": 0, "extent": h}]

    def ref(xv: np.ndarray, wv: np.ndarray) -> list[np.ndarray]:
        return [(xv / _rms(xv, eps)) @ wv]

    return Case("rmsnorm_linear", pb.plan, [((b, h), dtype), ((h, n), dtype)], ref)


def gated_mlp(
    b: int = 8,
    h: int = 256,
    n: int = 512,
    tn: int = 32,
    tk: int = 64,
    dtype: str = "float32",
    warps: int = 4,
) -> Case:
    """silu(X @ W1) * (X @ W2), both matmuls accumulated in one kernel."""
    pb = PlanBuilder(f"fixture-gated-mlp-{b}x{h}x{n}-{tn}-{tk}-{dtype}")
    x = pb.buf([b, h], dtype, "input")
    w1, w2 = pb.buf([h, n], dtype, "input"), pb.buf([h, n], dtype, "input")
    o = pb.buf([b, n], dtype, "output")
    k = pb.kernel("gated_mlp", [n // tn], h // tk, warps)
    tx = k.load(x, [b, tk], d1=[("iter", tk)])
    t1 = k.load(w1, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    t2 = k.load(w2, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    a1 = k.accum(k.matmul(tx, t1))
    a2 = k.accum(k.matmul(tx, t2))
    k.store(o, k.binary("mul", k.unary("silu", a1, "epilogue"), a2, "epilogue"), d1=[("bx", tn)])

    def ref(xv: np.ndarray, w1v: np.ndarray, w2v: np.ndarray) -> list[np.ndarray]:
        return [_silu(xv @ w1v) * (xv @ w2v)]

    return Case("gated_mlp", pb.plan, [((b, h), dtype), ((h, n), dtype), ((h, n), dtype)], ref)


def lora(
    b: int = 8,
    h: int = 256,
    n: int = 512,
    r: int = 16,
    tn: int = 32,
    tk: int = 64,
    splits: int = 2,
    dtype: str = "float32",
    warps: int = 4,
) -> Case:
    """X @ W + (X @ A) @ B: kernel 0 computes split-K partials of X @ A into an fp32
    intermediate [b, r·splits]; kernel 1 reduces them to dimx r and multiplies by B in its
    ``pre`` phase, accumulates X @ W in the loop and adds the low-rank term in the epilogue."""
    pb = PlanBuilder(f"fixture-lora-{b}x{h}x{n}-r{r}-{tn}-{tk}-{splits}-{dtype}")
    x, w = pb.buf([b, h], dtype, "input"), pb.buf([h, n], dtype, "input")
    a, bb = pb.buf([h, r], dtype, "input"), pb.buf([r, n], dtype, "input")
    o = pb.buf([b, n], dtype, "output")
    part = pb.buf([b, r * splits], "float32", "intermediate")
    chunk = h // splits
    k0 = pb.kernel("lora_xa", [splits], chunk // tk, warps)
    tx = k0.load(x, [b, tk], d1=[("bx", chunk), ("iter", tk)])
    ta = k0.load(a, [tk, r], d0=[("bx", chunk), ("iter", tk)])
    k0.store(part, k0.accum(k0.matmul(tx, ta)), d1=[("bx", r)])
    k1 = pb.kernel("lora_main", [n // tn], h // tk, warps)
    tp = k1.load(part, [b, r * splits], "pre")
    xa = k1.to_dimx(tp, 1, r, "pre")
    tb = k1.load(bb, [r, tn], "pre", d1=[("bx", tn)])
    low = k1.matmul(xa, tb, "pre")
    tx1 = k1.load(x, [b, tk], d1=[("iter", tk)])
    tw = k1.load(w, [tk, tn], d0=[("iter", tk)], d1=[("bx", tn)])
    acc = k1.accum(k1.matmul(tx1, tw))
    k1.store(o, k1.binary("add", acc, low, "epilogue"), d1=[("bx", tn)])

    def ref(xv: np.ndarray, wv: np.ndarray, av: np.ndarray, bv: np.ndarray) -> list[np.ndarray]:
        return [xv @ wv + (xv @ av) @ bv]

    return Case(
        "lora", pb.plan, [((b, h), dtype), ((h, n), dtype), ((h, r), dtype), ((r, n), dtype)], ref
    )


def gqa_decode(
    bb: int = 4,
    group: int = 4,
    d: int = 64,
    kv_len: int = 512,
    splits: int = 4,
    tl: int = 64,
    dtype: str = "float32",
    qk_norm: bool = False,
    eps: float = 1e-6,
    warps: int = 4,
    combine: str = "dimx",
) -> Case:
    """softmax(Q Kᵀ/√d) V in the workloads' GQA layout (yirage._workloads): Q [bb, G, d] (the G
    query heads sharing a KV head are the rows, bb = batch·kv_heads), Kᵀ [bb, d, L],
    V [bb, L, d]. Kernel 0 (grid bbxsplits) runs the safe softmax over its KV slice and writes
    partial numerators [bb, G, splits·d] and denominators [bb, G, splits] shifted by its row
    max (``scale_outputs``) and the maxima [bb, G, splits] (``shift_store``); kernel 1
    rescales them to its running max (``shift_carry``), sums them and divides: all partials
    at once with ``sum_todimx`` / ``sum`` accumulators (``combine="dimx"``) or one split per
    loop iteration with ``iter`` accumulators (``combine="loop"``, which scales to many
    splits).
    ``qk_norm`` adds rms_norm of Q (tile op, last dim, eps) and of K over d (dim 1 of Kᵀ:
    square → reduction → scale → sqrt → div, no eps, as in the workload)."""
    tag = "qknorm-gqa" if qk_norm else "gqa"
    pb = PlanBuilder(f"fixture-{tag}-{bb}x{group}x{d}-L{kv_len}-s{splits}-{tl}-{dtype}")
    q = pb.buf([bb, group, d], dtype, "input")
    kt = pb.buf([bb, d, kv_len], dtype, "input")
    v = pb.buf([bb, kv_len, d], dtype, "input")
    o = pb.buf([bb, group, d], dtype, "output")
    num = pb.buf([bb, group, splits * d], "float32", "intermediate")
    den = pb.buf([bb, group, splits], "float32", "intermediate")
    mx = pb.buf([bb, group, splits], "float32", "intermediate")
    span = kv_len // splits
    k0 = pb.kernel("attn_split", [bb, splits], span // tl, warps)
    tq = k0.load(q, [1, group, d], "pre", d0=[("bx", 1)])
    if qk_norm:
        tq = k0.rms_norm(tq, eps, "pre")
    tk = k0.load(kt, [1, d, tl], d0=[("bx", 1)], d2=[("by", span), ("iter", tl)])
    if qk_norm:
        ms = k0.unary("mul_scalar", k0.reduction(k0.unary("square", tk), 1), params=[1.0 / d])
        tk = k0.binary("div", tk, k0.unary("sqrt", ms))
    tv = k0.load(v, [1, tl, d], d0=[("bx", 1)], d1=[("by", span), ("iter", tl)])
    s = k0.unary("mul_scalar", k0.matmul(tq, tk), params=[1.0 / math.sqrt(d)])
    e = k0.unary("exp", s)
    acc_o = k0.accum(k0.matmul(e, tv))
    acc_l = k0.accum(e, "sum")
    o0 = k0.store(num, acc_o, d0=[("bx", 1)], d2=[("by", d)])
    o1 = k0.store(den, acc_l, d0=[("bx", 1)], d2=[("by", 1)])
    k0.safe_softmax(e, [acc_o, acc_l], [o0, o1], mx, d0=[("bx", 1)], d2=[("by", 1)])
    if combine == "dimx":
        k1 = pb.kernel("attn_combine", [bb], 1, warps)
        tn = k1.load(num, [1, group, splits * d], shift=(mx, d), d0=[("bx", 1)])
        td = k1.load(den, [1, group, splits], shift=(mx, 1), d0=[("bx", 1)])
        an = k1.accum(tn, "sum_todimx", dimx=d)
        ad = k1.accum(td, "sum")
        k1.shift_carry([0, 1], [])  # loaded once: the max is final before the loop
    else:
        k1 = pb.kernel("attn_combine", [bb], splits, warps)
        tn = k1.load(num, [1, group, d], shift=(mx, d), d0=[("bx", 1)], d2=[("iter", d)])
        td = k1.load(den, [1, group, 1], shift=(mx, 1), d0=[("bx", 1)], d2=[("iter", 1)])
        an = k1.accum(tn)
        ad = k1.accum(td)
        k1.shift_carry([0, 1], [an, ad])
    k1.store(o, k1.binary("div", an, ad, "epilogue"), d0=[("bx", 1)])

    def ref(qv: np.ndarray, ktv: np.ndarray, vv: np.ndarray) -> list[np.ndarray]:
        if qk_norm:
            qv = qv / _rms(qv, eps)
            ktv = ktv / np.sqrt(np.mean(ktv * ktv, axis=1, keepdims=True))
        return [_softmax(qv @ ktv / math.sqrt(d)) @ vv]

    shapes = [((bb, group, d), dtype), ((bb, d, kv_len), dtype), ((bb, kv_len, d), dtype)]
    return Case("qknorm_gqa" if qk_norm else "gqa_decode", pb.plan, shapes, ref)


def attention_fused(
    batch: int = 2,
    rows: int = 8,
    d: int = 32,
    kv_len: int = 256,
    tl: int = 32,
    dtype: str = "float32",
    scale: float = 1.0,
) -> Case:
    """Single-kernel attention softmax(Q Kᵀ·scale) V: the loop runs the safe softmax over all
    of L and the epilogue divides, so the shift cancels inside the kernel (no
    ``scale_outputs``); with large scores an unshifted exp would overflow. Where ``tl`` does
    not divide L the loop is masked: its last tile reads zeros past L, and the exp maps those
    padded scores to zero (its ``masked`` dim)."""
    pb = PlanBuilder(f"fixture-attn-fused-{batch}x{rows}x{d}-L{kv_len}-{tl}-{dtype}-{scale}")
    q = pb.buf([batch, rows, d], dtype, "input")
    kt = pb.buf([batch, d, kv_len], dtype, "input")
    v = pb.buf([batch, kv_len, d], dtype, "input")
    o = pb.buf([batch, rows, d], dtype, "output")
    k = pb.kernel("attn", [batch], -(-kv_len // tl))
    tq = k.load(q, [1, rows, d], "pre", d0=[("bx", 1)])
    tk = k.load(kt, [1, d, tl], d0=[("bx", 1)], d2=[("iter", tl)])
    tv = k.load(v, [1, tl, d], d0=[("bx", 1)], d1=[("iter", tl)])
    e = k.unary("exp", k.unary("mul_scalar", k.matmul(tq, tk), params=[scale]))
    if kv_len % tl:
        ins = k.k["inputs"]
        ins[1]["masked"] = [{"dim": 2, "extent": kv_len}]
        ins[2]["masked"] = [{"dim": 1, "extent": kv_len}]
        k.k["ops"][e]["masked"] = [{"dim": 2, "extent": kv_len}]
    acc_o = k.accum(k.matmul(e, tv))
    acc_l = k.accum(e, "sum")
    k.store(o, k.binary("div", acc_o, acc_l, "epilogue"), d0=[("bx", 1)])
    k.safe_softmax(e, [acc_o, acc_l], [])

    def ref(qv: np.ndarray, ktv: np.ndarray, vv: np.ndarray) -> list[np.ndarray]:
        return [_softmax(qv @ ktv * scale) @ vv]

    shapes = [((batch, rows, d), dtype), ((batch, d, kv_len), dtype), ((batch, kv_len, d), dtype)]
    # with a negative scale, positive Q and K put every score far below the padding's 0
    positive = (0, 1) if scale < 0 else ()
    return Case("attention_fused", pb.plan, shapes, ref, positive=positive)


def mixed_library(
    b: int = 8, h: int = 256, n: int = 384, tn: int = 32, dtype: str = "float32"
) -> Case:
    """Library and generated kernels mixed: library matmuls X@W1, X@W2 into fp32
    intermediates, a generated elementwise kernel silu(·)·(·), then library rms_norm (with
    weight) and softmax of the result, plus library concat/chunk/binary/reduction/unary."""
    pb = PlanBuilder(f"fixture-mixed-{b}x{h}x{n}-{dtype}")
    x = pb.buf([b, h], dtype, "input")
    w1, w2 = pb.buf([h, n], dtype, "input"), pb.buf([h, n], dtype, "input")
    g = pb.buf([n], dtype, "input")
    o0 = pb.buf([b, n], dtype, "output")
    o1 = pb.buf([b, n], dtype, "output")
    o2 = pb.buf([b, 1], dtype, "output")
    i1, i2 = pb.buf([b, n], "float32", "intermediate"), pb.buf([b, n], "float32", "intermediate")
    i3 = pb.buf([b, n], "float32", "intermediate")
    i4 = pb.buf([b, 2 * n], "float32", "intermediate")
    i5 = pb.buf([b, n], "float32", "intermediate")
    pb.library("matmul", [x, w1], i1)
    pb.library("matmul", [x, w2], i2)
    k = pb.kernel("swiglu", [b // 4 if b % 4 == 0 else 1, n // tn], 1)
    rows = 4 if b % 4 == 0 else b
    t1 = k.load(i1, [rows, tn], d0=[("bx", rows)], d1=[("by", tn)])
    t2 = k.load(i2, [rows, tn], d0=[("bx", rows)], d1=[("by", tn)])
    k.store(
        i3, k.accum(k.binary("mul", k.unary("silu", t1), t2)), d0=[("bx", rows)], d1=[("by", tn)]
    )
    pb.library("rms_norm", [i3, g], o0, num_normalized_dims=1, eps=1e-6, has_weight=True)
    pb.library("concat", [i3, i1], i4, dim=1)
    pb.library("chunk", [i4], i5, chunks=2, dim=1, index=1)
    pb.library("softmax", [i5], o1, dim=1)
    pb.library("reduction", [i3], o2, dim=1)

    def ref(xv: np.ndarray, w1v: np.ndarray, w2v: np.ndarray, gv: np.ndarray) -> list[np.ndarray]:
        a = xv @ w1v
        y = _silu(a) * (xv @ w2v)
        return [y / _rms(y, 1e-6) * gv, _softmax(a, axis=1), y.sum(axis=1, keepdims=True)]

    shapes = [((b, h), dtype), ((h, n), dtype), ((h, n), dtype), ((n,), dtype)]
    return Case("mixed_library", pb.plan, shapes, ref)


def zoo_odd(dtype: str = "float32") -> Case:
    """Non-power-of-two tiles (6x48 · 48x20), rms and exp-sum accumulators (safe softmax: a
    softmax-weighted row mean, the ratio of two accumulators), a ``pre`` input used in the
    epilogue, and the unary/binary ops gelu, div, sub, clamp, mul_scalar."""
    pb = PlanBuilder(f"fixture-zoo-odd-{dtype}")
    x, w = pb.buf([6, 96], dtype, "input"), pb.buf([96, 40], dtype, "input")
    y = pb.buf([6, 40], dtype, "input")
    o1, o2 = pb.buf([6, 40], dtype, "output"), pb.buf([6, 2], "float32", "output")
    k = pb.kernel("odd", [2], 2)
    tx = k.load(x, [6, 48], d1=[("iter", 48)])
    tw = k.load(w, [48, 20], d0=[("iter", 48)], d1=[("bx", 20)])
    acc = k.accum(k.matmul(tx, tw))
    rms = k.accum(tx, "rms", eps=1e-5, extent=96)
    e = k.unary("exp", k.unary("mul_scalar", tx, params=[0.5]))
    es = k.accum(e, "sum")
    ex = k.accum(k.binary("mul", e, tx), "sum")
    ty = k.load(y, [6, 20], "pre", d1=[("bx", 20)])
    z = k.unary("gelu", k.binary("div", acc, rms, "epilogue"), "epilogue")
    z = k.unary("clamp", k.binary("sub", z, ty, "epilogue"), "epilogue", params=[-2.0, 2.0])
    k.store(o1, z, d1=[("bx", 20)])
    k.store(o2, k.binary("div", ex, es, "epilogue"), d1=[("bx", 1)])
    k.safe_softmax(e, [es, ex])

    def ref(xv: np.ndarray, wv: np.ndarray, yv: np.ndarray) -> list[np.ndarray]:
        zz = _gelu((xv @ wv) / _rms(xv, 1e-5)) - yv
        s = np.exp(0.5 * xv)
        mean = (s * xv).sum(axis=1, keepdims=True) / s.sum(axis=1, keepdims=True)
        return [np.clip(zz, -2.0, 2.0), np.concatenate([mean, mean], axis=1)]

    return Case("zoo_odd", pb.plan, [((6, 96), dtype), ((96, 40), dtype), ((6, 40), dtype)], ref)


def zoo_batched(dtype: str = "float32") -> Case:
    """4-D tiles with a batch of 2 in the tile matmul, rms_norm / relu / sqrt / sigmoid /
    concat / reduction_to_dimx (non-power-of-two dimx) / reduction / pow / square / rsqrt /
    neg / tanh, sum accumulator to a 1x1 tile."""
    pb = PlanBuilder(f"fixture-zoo-batched-{dtype}")
    a, b = pb.buf([2, 3, 12, 20], dtype, "input"), pb.buf([2, 3, 20, 10], dtype, "input")
    c1 = pb.buf([2, 3, 12, 5], dtype, "output")
    c2 = pb.buf([2, 3, 12, 10], dtype, "output")
    c3 = pb.buf([2, 3, 1, 1], dtype, "output")
    k = pb.kernel("batched", [3], 1)
    ta = k.load(a, [2, 1, 12, 20], d1=[("bx", 1)])
    tb = k.load(b, [2, 1, 20, 10], d1=[("bx", 1)])
    mm = k.matmul(ta, tb)
    sq = k.unary("sqrt", k.unary("relu", k.rms_norm(mm, 1e-6)))
    sg = k.unary("sigmoid", mm)
    cat = k.concat([sq, sg], 3)
    red = k.to_dimx(cat, 3, 5)
    col = k.reduction(mm, 2)
    pw = k.binary("pow", sg, k.unary("relu", mm))
    a1 = k.accum(red)
    a2 = k.accum(pw)
    a3 = k.accum(k.unary("square", col), "sum")
    k.store(c1, k.unary("neg", a1, "epilogue"), d1=[("bx", 1)])
    k.store(c2, k.unary("tanh", a2, "epilogue"), d1=[("bx", 1)])
    k.store(c3, k.unary("rsqrt", a3, "epilogue"), d1=[("bx", 1)])

    def ref(av: np.ndarray, bv: np.ndarray) -> list[np.ndarray]:
        m = av @ bv
        sqv = np.sqrt(np.maximum(m / _rms(m, 1e-6), 0.0))
        sgv = 1.0 / (1.0 + np.exp(-m))
        catv = np.concatenate([sqv, sgv], axis=3)
        redv = catv.reshape(2, 3, 12, 4, 5).sum(axis=3)
        pwv = sgv ** np.maximum(m, 0.0)
        colv = m.sum(axis=2, keepdims=True)
        return [-redv, np.tanh(pwv), 1.0 / np.sqrt((colv * colv).sum(axis=3, keepdims=True))]

    return Case("zoo_batched", pb.plan, [((2, 3, 12, 20), dtype), ((2, 3, 20, 10), dtype)], ref)


def zoo_reduce_matmul(dtype: str = "float32") -> Case:
    """A column sum (logical extent 1) used as the M dim of a tile matmul, so the printer
    pads a size-1 dim to the MMA shape; K tiles stream through the loop."""
    pb = PlanBuilder(f"fixture-zoo-reduce-matmul-{dtype}")
    x, w = pb.buf([32, 128], dtype, "input"), pb.buf([128, 48], dtype, "input")
    o = pb.buf([1, 48], dtype, "output")
    k = pb.kernel("colsum_mm", [1], 2)
    tx = k.load(x, [32, 64], d1=[("iter", 64)])
    tw = k.load(w, [64, 48], d0=[("iter", 64)])
    k.store(o, k.accum(k.matmul(k.reduction(tx, 0), tw)))

    def ref(xv: np.ndarray, wv: np.ndarray) -> list[np.ndarray]:
        return [xv.sum(axis=0, keepdims=True) @ wv]

    return Case("zoo_reduce_matmul", pb.plan, [((32, 128), dtype), ((128, 48), dtype)], ref)


def small_cases(dtype: str = "float32") -> list[Case]:
    """Every fixture at CI sizes."""
    return [
        rmsnorm_linear(dtype=dtype),
        rmsnorm_linear(h=203, n=64, tk=32, dtype=dtype),  # a masked loop: 7 tiles of 32 > 203
        gated_mlp(dtype=dtype),
        lora(dtype=dtype),
        gqa_decode(dtype=dtype),
        gqa_decode(dtype=dtype, qk_norm=True, combine="loop"),
        attention_fused(dtype=dtype),
        # a masked loop over kv: 7 tiles of 32 > 203; every score far below 0, so a max
        # taken over the zero padding would underflow every exp (0 / 0)
        attention_fused(kv_len=203, dtype=dtype, scale=-10.0),
        mixed_library(dtype=dtype),
        zoo_odd(dtype=dtype),
        zoo_batched(dtype=dtype),
        zoo_reduce_matmul(dtype=dtype),
    ]


def target_cases(dtype: str = "float16") -> list[Case]:
    """The bench workloads at full size (hand-tiled plans for the H100), named as the
    bench names them; ``case.workload`` / ``case.preset`` name the yirage._workloads entry."""
    cases = []
    for b, preset in ((1, "gpu_b1"), (8, "gpu"), (16, "gpu_b16")):
        c = rmsnorm_linear(b=b, h=4096, n=6144, tn=64, tk=128, dtype=dtype)
        c.name, c.workload, c.preset = f"rmsnorm_linear_b{b}", "rmsnorm_linear", preset
        cases.append(c)
    for b, preset in ((1, "gpu_b1"), (8, "gpu"), (16, "gpu_b16")):
        c = gated_mlp(b=b, h=4096, n=4096, tn=64, tk=128, dtype=dtype)
        c.name, c.workload, c.preset = f"gated_mlp_b{b}", "gated_mlp", preset
        cases.append(c)
    for b, preset in ((1, "gpu_b1"), (16, "gpu")):
        c = lora(b=b, h=4096, n=4096, r=16, tn=64, tk=128, splits=16, dtype=dtype)
        c.name, c.workload, c.preset = f"lora_b{b}", "lora", preset
        cases.append(c)
    for kv, splits, preset in ((4096, 16, "gpu"), (16384, 64, "gpu_kv16384")):
        c = gqa_decode(
            bb=16, group=4, d=128, kv_len=kv, splits=splits, tl=64, dtype=dtype, combine="loop"
        )
        c.name, c.workload, c.preset = f"gqa_decode_b8_kv{kv}", "gqa_decode", preset
        cases.append(c)
    c = gqa_decode(
        bb=16,
        group=4,
        d=128,
        kv_len=4096,
        splits=16,
        tl=64,
        dtype=dtype,
        qk_norm=True,
        combine="loop",
    )
    c.name, c.workload, c.preset = "qknorm_gqa_b8_kv4096", "qknorm_gqa", "gpu"
    cases.append(c)
    return cases
