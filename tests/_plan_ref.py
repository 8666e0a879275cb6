"""A float64 numpy executor of KernelPlans, written from docs/kernel-plan.md alone.

It runs every generated kernel block by block and iteration by iteration with exact math
(no safe-softmax shift inside a kernel: it cancels mathematically), and library kernels with
numpy. Where the plan carries a shift across kernels, it follows the plan: ``scale_outputs``
are stored times exp(-m), m the row max of the group's exp argument over the block's loop
(the max the printers keep), m is stored at ``shift_store``, and an input with a
``shift_load`` is multiplied back by exp(m) when loaded (float64 holds that up to m ≈ 709).
Masked accesses read zeros past the buffer's extent and store nothing there; a masked exp
is zero where its loop index runs past the extent. The CPU and CUDA tests share it to check
that plans (hand-built or searched) compute their workload, independently of any printer.
``rel_err`` is the relative Frobenius error they report.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[float])(x)


def unary(name: str, x: np.ndarray, params: list[float]) -> np.ndarray:
    with np.errstate(all="ignore"):
        if name == "exp":
            return np.exp(x)
        if name == "square":
            return x * x
        if name == "sqrt":
            return np.sqrt(x)
        if name == "rsqrt":
            return 1.0 / np.sqrt(x)
        if name == "silu":
            return x / (1.0 + np.exp(-x))
        if name == "gelu":
            return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
        if name == "relu":
            return np.maximum(x, 0.0)
        if name == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if name == "tanh":
            return np.tanh(x)
        if name == "neg":
            return -x
        if name == "mul_scalar":
            return x * params[0]
        if name == "add_scalar":
            return x + params[0]
        if name == "clamp":
            return np.clip(x, params[0], params[1])
    raise ValueError(name)


def binary(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return {
            "add": np.add,
            "sub": np.subtract,
            "mul": np.multiply,
            "div": np.divide,
            "pow": np.power,
        }[name](a, b)


def to_dimx(x: np.ndarray, dim: int, dimx: int) -> np.ndarray:
    shape = list(x.shape)
    groups = shape[dim] // dimx
    new = [*shape[:dim], groups, dimx, *shape[dim + 1 :]]
    return x.reshape(new).sum(axis=dim)


def _start(offsets: list[list[dict[str, Any]]], env: dict[str, int]) -> list[int]:
    return [sum(env[t["var"]] * t["stride"] for t in dim) for dim in offsets]


def _slices(start: list[int], tile: list[int]) -> tuple[slice, ...]:
    return tuple(slice(s, s + t) for s, t in zip(start, tile, strict=True))


def _load(inp: dict[str, Any], bufs: dict[int, np.ndarray], env: dict[str, int]) -> np.ndarray:
    """An input tile (zeros past the buffer's extent in its masked dims), multiplied back by
    exp(m) where it was stored shifted."""
    start, tile = _start(inp["offsets"], env), inp["tile"]
    x = bufs[inp["buffer"]][_slices(start, tile)].copy()
    if x.shape != tuple(tile):
        masked = {m["dim"] for m in inp.get("masked", [])}
        short = {d for d, (a, b) in enumerate(zip(x.shape, tile, strict=True)) if a != b}
        if not short <= masked:
            raise ValueError(f"unmasked access past the buffer in dims {sorted(short - masked)}")
        x = np.pad(x, [(0, b - a) for a, b in zip(x.shape, tile, strict=True)])
    load = inp.get("shift_load")
    if load is not None:
        m = bufs[load["buffer"]][_slices(_start(load["offsets"], env), load["tile"])]
        with np.errstate(all="ignore"):
            x = x * np.exp(np.repeat(m, load["width"], axis=-1))
    return x


def run_generated(k: dict[str, Any], bufs: dict[int, np.ndarray]) -> None:
    gx, gy, gz = [*list(k["grid"]), 1, 1, 1][:3]
    ops = k["ops"]
    groups = {g["exp"]: g for g in k.get("safe_softmax", []) if g.get("scale_outputs")}
    for g in groups.values():
        if g.get("shift_store") is None:
            raise ValueError(f"kernel {k['name']}: scale_outputs without a shift_store")
    for bx, by, bz in itertools.product(range(gx), range(gy), range(gz)):
        vals: dict[int, np.ndarray] = {}
        acc: dict[int, np.ndarray] = {}
        env = {"bx": bx, "by": by, "bz": bz, "iter": 0}
        maxima: dict[int, np.ndarray] = {}  # exp op -> row max of its argument so far

        def compute(
            o: dict[str, Any],
            vals: dict[int, np.ndarray] = vals,
            env: dict[str, int] = env,
            maxima: dict[int, np.ndarray] = maxima,
        ) -> np.ndarray:
            a = [vals[x] for x in o.get("args", [])]
            kind = o["op"]
            if kind == "input":
                return _load(k["inputs"][o["input"]], bufs, env)
            if o["id"] in groups:
                rowmax = a[0].max(axis=-1, keepdims=True)
                maxima[o["id"]] = np.maximum(maxima.get(o["id"], -np.inf), rowmax)
            if kind == "matmul":
                return a[0] @ a[1]
            if kind == "unary":
                y = unary(o["unop"], a[0], o.get("params", []))
                for m in o.get("masked", []):  # a masked loop's padding: exp is zero there
                    d, n = m["dim"], y.shape[m["dim"]]
                    past = env["iter"] * n + np.arange(n) >= m["extent"]
                    y[(slice(None),) * d + (past,)] = 0.0
                return y
            if kind == "binary":
                return binary(o["binop"], a[0], a[1])
            if kind == "reduction":
                return a[0].sum(axis=o["dim"], keepdims=True)
            if kind == "reduction_to_dimx":
                return to_dimx(a[0], o["dim"], o["dimx"])
            if kind == "rms_norm":
                return a[0] / np.sqrt(np.mean(a[0] ** 2, axis=-1, keepdims=True) + o["eps"])
            if kind == "concat":
                return np.concatenate(a, axis=o["dim"])
            raise ValueError(kind)

        for o in ops:
            if o["phase"] == "pre":
                vals[o["id"]] = compute(o)
        for it in range(k["forloop_range"]):
            env["iter"] = it
            for o in ops:
                if o["phase"] == "loop":
                    vals[o["id"]] = compute(o)
                elif o["phase"] == "accum":
                    x = vals[o["args"][0]]
                    kind = o["acc"]
                    if kind == "iter":
                        upd = x
                    elif kind == "sum":
                        upd = x.sum(axis=-1, keepdims=True)
                    elif kind == "rms":
                        upd = (x * x).sum(axis=-1, keepdims=True)
                    else:
                        upd = to_dimx(x, x.ndim - 1, o["dimx"])
                    acc[o["id"]] = acc.get(o["id"], 0.0) + upd
        for o in ops:
            if o["phase"] == "accum":
                v = acc[o["id"]]
                if o["acc"] == "rms":
                    v = np.sqrt(v / o["extent"] + o.get("eps", 0.0))
                vals[o["id"]] = v
            elif o["phase"] == "epilogue":
                vals[o["id"]] = compute(o)
        shifts = {i: maxima[e] for e, g in groups.items() for i in g["scale_outputs"]}
        for i, out in enumerate(k["outputs"]):
            v = vals[out["src"]]
            if i in shifts:
                v = v * np.exp(-shifts[i])
            dst = bufs[out["buffer"]][_slices(_start(out["offsets"], env), out["tile"])]
            dst[...] = v[tuple(slice(0, n) for n in dst.shape)]  # nothing past the extent
        for e, g in groups.items():
            st = g["shift_store"]
            bufs[st["buffer"]][_slices(_start(st["offsets"], env), st["tile"])] = maxima[e]


def run_library(k: dict[str, Any], bufs: dict[int, np.ndarray]) -> None:
    x = [bufs[b] for b in k["inputs"]]
    p = k.get("params", {})
    op = k["op"]
    if op == "matmul":
        r = x[0] @ x[1]
    elif op == "unary":
        r = unary(p["op"], x[0], list(p.get("params", [])))
    elif op == "binary":
        r = binary(p["op"], x[0], x[1])
    elif op == "reduction":
        r = x[0].sum(axis=p["dim"], keepdims=True)
    elif op == "rms_norm":
        n = p.get("num_normalized_dims", 1)
        axes = tuple(range(x[0].ndim - n, x[0].ndim))
        r = x[0] / np.sqrt(np.mean(x[0] ** 2, axis=axes, keepdims=True) + p.get("eps", 1e-6))
        if p.get("has_weight"):
            r = r * x[1]
    elif op == "softmax":
        e = np.exp(x[0] - x[0].max(axis=p["dim"], keepdims=True))
        r = e / e.sum(axis=p["dim"], keepdims=True)
    elif op == "concat":
        r = np.concatenate(x, axis=p["dim"])
    elif op == "chunk":
        r = np.array_split(x[0], p["chunks"], axis=p["dim"])[p["index"]]
    elif op == "reduce_max":
        r = x[0].max(axis=p["dim"], keepdims=True)
    elif op == "permute":
        r = np.transpose(x[0], p["perm"])
    elif op == "reshape":
        r = np.reshape(x[0], p["dims"])
    else:
        raise ValueError(op)
    bufs[k["outputs"][0]][...] = r


def run_plan(plan: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``plan`` on ``inputs`` computed in float64."""
    bufs: dict[int, np.ndarray] = {}
    for b in plan["buffers"]:
        if b["role"] == "input":
            bufs[b["id"]] = np.asarray(inputs[b["index"]], dtype=np.float64)
        else:
            bufs[b["id"]] = np.full(b["dims"], np.nan)
    for k in plan["kernels"]:
        if k["kind"] == "library":
            run_library(k, bufs)
        else:
            run_generated(k, bufs)
    outs = sorted((b for b in plan["buffers"] if b["role"] == "output"), key=lambda b: b["index"])
    return [bufs[b["id"]] for b in outs]


def rel_err(actual: Any, expected: np.ndarray) -> float:
    a = np.asarray(actual, dtype=np.float64)
    denom = np.linalg.norm(expected)
    return float(np.linalg.norm(a - expected) / (denom if denom > 0 else 1.0))
