"""Test helpers: build KernelPlans (docs/kernel-plan.md) by hand and run them in float64.

``PlanBuilder`` writes plan JSON with the shape rules of the µGraph IR; ``reference`` is an
independent numpy interpreter of the plan semantics (it ignores ``safe_softmax``: exact math,
so it checks the printer's running-max rewrite too).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

#: Hand-written plan fixtures.
PLANS = Path(__file__).parent / "plans"


def off(*terms: tuple[str, int]) -> list[dict[str, Any]]:
    """Offset terms of one dim, e.g. ``off(("iter", 32), ("bx", 64))``."""
    return [{"var": v, "stride": s} for v, s in terms]


class KernelBuilder:
    def __init__(
        self, plan: PlanBuilder, name: str, grid: tuple[int, int, int], forloop_range: int
    ) -> None:
        self.plan = plan
        self.k: dict[str, Any] = {
            "kind": "generated",
            "name": name,
            "grid": list(grid),
            "block_threads": 128,
            "warps": 4,
            "forloop_range": forloop_range,
            "inputs": [],
            "ops": [],
            "outputs": [],
            "safe_softmax": [],
            "smem_bytes": 0,
        }
        self.dims: dict[int, list[int]] = {}

    def _add(self, op: dict[str, Any], dims: list[int], phase: str) -> int:
        oid = len(self.k["ops"])
        op = {"id": oid, **op, "dims": list(dims), "phase": phase}
        self.k["ops"].append(op)
        self.dims[oid] = list(dims)
        return oid

    def input(
        self, buffer: int, tile: list[int], offsets: list[list[dict[str, Any]]], phase: str = "loop"
    ) -> int:
        bdims = self.plan.buffers[buffer]["dims"]
        self.k["inputs"].append(
            {"buffer": buffer, "dims": list(bdims), "tile": list(tile), "offsets": offsets}
        )
        return self._add({"op": "input", "input": len(self.k["inputs"]) - 1}, tile, phase)

    def matmul(self, a: int, b: int, phase: str = "loop") -> int:
        da, db = self.dims[a], self.dims[b]
        return self._add({"op": "matmul", "args": [a, b]}, [*da[:-1], db[-1]], phase)

    def unary(
        self, name: str, x: int, params: list[float] | None = None, phase: str = "loop"
    ) -> int:
        return self._add(
            {"op": "unary", "unop": name, "params": list(params or []), "args": [x]},
            self.dims[x],
            phase,
        )

    def binary(self, name: str, a: int, b: int, phase: str = "loop") -> int:
        dims = [max(p, q) for p, q in zip(self.dims[a], self.dims[b], strict=True)]
        return self._add({"op": "binary", "binop": name, "args": [a, b]}, dims, phase)

    def reduction(self, x: int, dim: int, phase: str = "loop") -> int:
        dims = list(self.dims[x])
        dims[dim] = 1
        return self._add({"op": "reduction", "dim": dim, "args": [x]}, dims, phase)

    def reduction_to_dimx(self, x: int, dim: int, dimx: int, phase: str = "loop") -> int:
        dims = list(self.dims[x])
        dims[dim] = dimx
        return self._add(
            {"op": "reduction_to_dimx", "dim": dim, "dimx": dimx, "args": [x]}, dims, phase
        )

    def rms_norm(self, x: int, eps: float = 1e-6, phase: str = "loop") -> int:
        return self._add({"op": "rms_norm", "eps": eps, "args": [x]}, self.dims[x], phase)

    def concat(self, xs: list[int], dim: int, phase: str = "loop") -> int:
        dims = list(self.dims[xs[0]])
        dims[dim] = sum(self.dims[x][dim] for x in xs)
        return self._add({"op": "concat", "dim": dim, "args": list(xs)}, dims, phase)

    def accum(
        self,
        x: int,
        acc: str = "iter",
        *,
        eps: float = 0.0,
        extent: int | None = None,
        dimx: int | None = None,
    ) -> int:
        dims = list(self.dims[x])
        extra: dict[str, Any] = {}
        if acc in ("sum", "rms"):
            dims[-1] = 1
        if acc == "rms":
            extra["eps"] = eps
            extra["extent"] = (
                extent if extent is not None else self.dims[x][-1] * self.k["forloop_range"]
            )
        if acc == "sum_todimx":
            assert dimx is not None
            dims[-1] = dimx
            extra["dimx"] = dimx
        return self._add({"op": "accum", "acc": acc, "args": [x], **extra}, dims, "accum")

    def epi_unary(self, name: str, x: int, params: list[float] | None = None) -> int:
        return self.unary(name, x, params, phase="epilogue")

    def epi_binary(self, name: str, a: int, b: int) -> int:
        return self.binary(name, a, b, phase="epilogue")

    def output(self, buffer: int, src: int, offsets: list[list[dict[str, Any]]]) -> int:
        self.k["outputs"].append(
            {"buffer": buffer, "src": src, "tile": list(self.dims[src]), "offsets": offsets}
        )
        return len(self.k["outputs"]) - 1

    def safe_softmax(
        self, exp: int, accums: list[int], scale_outputs: list[int] | None = None
    ) -> None:
        self.k["safe_softmax"].append(
            {"exp": exp, "accums": accums, "scale_outputs": list(scale_outputs or [])}
        )


class PlanBuilder:
    def __init__(self) -> None:
        self.buffers: list[dict[str, Any]] = []
        self.kernels: list[Any] = []
        self._n_in = 0
        self._n_out = 0

    def input(self, dims: list[int], dtype: str = "float32") -> int:
        self.buffers.append(
            {
                "id": len(self.buffers),
                "dims": list(dims),
                "dtype": dtype,
                "role": "input",
                "index": self._n_in,
            }
        )
        self._n_in += 1
        return len(self.buffers) - 1

    def output(self, dims: list[int], dtype: str = "float32") -> int:
        self.buffers.append(
            {
                "id": len(self.buffers),
                "dims": list(dims),
                "dtype": dtype,
                "role": "output",
                "index": self._n_out,
            }
        )
        self._n_out += 1
        return len(self.buffers) - 1

    def intermediate(self, dims: list[int]) -> int:
        self.buffers.append(
            {
                "id": len(self.buffers),
                "dims": list(dims),
                "dtype": "float32",
                "role": "intermediate",
            }
        )
        return len(self.buffers) - 1

    def kernel(
        self, name: str, grid: tuple[int, int, int] = (1, 1, 1), forloop_range: int = 1
    ) -> KernelBuilder:
        kb = KernelBuilder(self, name, grid, forloop_range)
        self.kernels.append(kb)
        return kb

    def library(
        self, op: str, inputs: list[int], outputs: list[int], params: dict[str, Any] | None = None
    ) -> None:
        self.kernels.append(
            {
                "kind": "library",
                "op": op,
                "inputs": inputs,
                "outputs": outputs,
                "params": params or {},
            }
        )

    def build(self) -> dict[str, Any]:
        return {
            "format": "yirage.kernel_plan",
            "version": 1,
            "graph_hash": "test",
            "buffers": self.buffers,
            "kernels": [k.k if isinstance(k, KernelBuilder) else k for k in self.kernels],
        }


# -- float64 reference interpreter --------------------------------------------------------------

_UNARY = {
    "exp": np.exp,
    "square": np.square,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "neg": np.negative,
}


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(x)


def unary64(name: str, params: list[float], x: np.ndarray) -> np.ndarray:
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if name == "mul_scalar":
        return x * params[0]
    if name == "clamp":
        return np.clip(x, params[0], params[1])
    return _UNARY[name](x)


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power}


def _tile_slice(
    offsets: list[list[dict[str, Any]]], tile: list[int], env: dict[str, int]
) -> tuple[slice, ...]:
    out = []
    for d, terms in enumerate(offsets):
        start = sum(env[t["var"]] * t["stride"] for t in terms)
        out.append(slice(start, start + tile[d]))
    return tuple(out)


def _run_generated(k: dict[str, Any], bufs: dict[int, np.ndarray]) -> None:
    gx, gy, gz = k["grid"]
    ops = k["ops"]
    for bx, by, bz in itertools.product(range(gx), range(gy), range(gz)):
        acc: dict[int, np.ndarray] = {}
        vals: dict[int, np.ndarray] = {}
        for it in range(k["forloop_range"]):
            env = {"bx": bx, "by": by, "bz": bz, "iter": it}
            for op in ops:
                if op["phase"] == "epilogue":
                    continue
                oid, kind = op["id"], op["op"]
                args = [vals[a] for a in op.get("args", [])]
                if kind == "input":
                    kin = k["inputs"][op["input"]]
                    vals[oid] = bufs[kin["buffer"]][
                        _tile_slice(kin["offsets"], kin["tile"], env)
                    ].reshape(op["dims"])
                elif kind == "accum":
                    x = args[0]
                    a = op.get("acc", "iter")
                    if a == "iter":
                        upd = x
                    elif a == "sum":
                        upd = x.sum(-1, keepdims=True)
                    elif a == "rms":
                        upd = (x * x).sum(-1, keepdims=True)
                    else:
                        dx = op["dimx"]
                        upd = x.reshape(*x.shape[:-1], x.shape[-1] // dx, dx).sum(-2)
                    acc[oid] = acc.get(oid, 0.0) + upd
                else:
                    vals[oid] = _tile_op(op, args)
        for op in ops:
            if op["op"] == "accum":
                v = acc[op["id"]]
                if op.get("acc") == "rms":
                    v = np.sqrt(v / op["extent"] + op["eps"])
                vals[op["id"]] = v
        for op in ops:
            if op["phase"] == "epilogue":
                vals[op["id"]] = _tile_op(op, [vals[a] for a in op["args"]])
        env = {"bx": bx, "by": by, "bz": bz, "iter": 0}
        for o in k["outputs"]:
            bufs[o["buffer"]][_tile_slice(o["offsets"], o["tile"], env)] = vals[o["src"]].reshape(
                o["tile"]
            )


def _tile_op(op: dict[str, Any], args: list[np.ndarray]) -> np.ndarray:
    kind = op["op"]
    if kind == "matmul":
        return np.matmul(args[0], args[1])
    if kind == "unary":
        return unary64(op["unop"], op.get("params", []), args[0])
    if kind == "binary":
        return _BINARY[op["binop"]](args[0], args[1])
    if kind == "reduction":
        return args[0].sum(op["dim"], keepdims=True)
    if kind == "reduction_to_dimx":
        x, d, dx = args[0], op["dim"], op["dimx"]
        shape = list(x.shape)
        new = [*shape[:d], shape[d] // dx, dx, *shape[d + 1 :]]
        return x.reshape(new).sum(d)
    if kind == "rms_norm":
        x = args[0]
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + op["eps"])
    if kind == "concat":
        return np.concatenate(args, axis=op["dim"])
    raise AssertionError(kind)


def _run_library(k: dict[str, Any], bufs: dict[int, np.ndarray]) -> None:
    op, p = k["op"], k.get("params", {})
    x = [bufs[i] for i in k["inputs"]]
    if op == "matmul":
        r = np.matmul(x[0], x[1])
    elif op == "unary":
        r = unary64(p["op"], p.get("params", []), x[0])
    elif op == "binary":
        r = _BINARY[p["op"]](x[0], x[1])
    elif op == "reduction":
        r = x[0].sum(p["dim"], keepdims=True)
    elif op == "rms_norm":
        n = p["num_normalized_dims"]
        axes = tuple(range(x[0].ndim - n, x[0].ndim))
        r = x[0] / np.sqrt((x[0] ** 2).mean(axes, keepdims=True) + p["eps"])
        if p.get("has_weight"):
            r = r * x[1]
    elif op == "softmax":
        e = np.exp(x[0] - x[0].max(p["dim"], keepdims=True))
        r = e / e.sum(p["dim"], keepdims=True)
    elif op == "concat":
        r = np.concatenate(x, axis=p["dim"])
    elif op == "chunk":
        r = np.split(x[0], p["chunks"], axis=p["dim"])[p["index"]]
    else:
        raise AssertionError(op)
    for o in k["outputs"]:
        bufs[o][...] = r


def reference(plan: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``plan`` on ``inputs`` computed in float64."""
    bufs: dict[int, np.ndarray] = {}
    outs: dict[int, int] = {}
    for b in plan["buffers"]:
        if b["role"] == "input":
            bufs[b["id"]] = np.asarray(inputs[b["index"]], dtype=np.float64)
        else:
            bufs[b["id"]] = np.full(b["dims"], np.nan)
            if b["role"] == "output":
                outs[b["index"]] = b["id"]
    with np.errstate(all="ignore"):
        for k in plan["kernels"]:
            if k["kind"] == "library":
                _run_library(k, bufs)
            else:
                _run_generated(k, bufs)
    return [bufs[outs[i]] for i in range(len(outs))]


def rel_err(actual: Any, expected: np.ndarray) -> float:
    a = np.asarray(actual, dtype=np.float64)
    denom = np.linalg.norm(expected)
    return float(np.linalg.norm(a - expected) / (denom if denom > 0 else 1.0))
