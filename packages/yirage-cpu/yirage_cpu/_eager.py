"""The library baseline as PyTorch eager runs it (variant ``torch_eager``).

The cpu backend runs a plan's library kernels with numpy and its own C matmul: a plan of
library kernels alone (the search's baseline, the graph as written) then costs what numpy
costs, which for compute-bound graphs is well behind PyTorch eager (attention over 459 keys
and 260 query rows: 461 µs against eager's 167 on a 2-core EPYC). Where torch is installed,
the backend offers the same plan run op by op through torch, in the graph's dtype, with the
calls PyTorch eager makes (oneDNN/MKL matmuls, torch's threads): the race then never keeps a
kernel slower than eager for want of an eager contender. Like eager, a 16-bit intermediate
can overflow where the graph has a finite value; the numeric checks drop the variant then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from yirage.plugin import BackendError, ShapeError
from yirage_cpu._runtime import CallsRun, CpuLauncher, TensorArgumentError

__all__ = ["EAGER_VARIANT", "EagerLauncher", "eager_applies"]

#: Variant name of the eager printing of a library-only plan.
EAGER_VARIANT = "torch_eager"


def eager_applies(plan: Mapping[str, Any]) -> bool:
    """Whether ``plan`` is library kernels alone (no collective) on inputs of one dtype."""
    kernels = plan.get("kernels", [])
    inputs = [b for b in plan.get("buffers", []) if b.get("role") == "input"]
    return (
        bool(kernels)
        and all(k.get("kind") == "library" and k.get("op") != "all_reduce" for k in kernels)
        and len({b["dtype"] for b in inputs}) == 1
    )


class EagerLauncher(CallsRun):
    """Runs a library-only plan with torch on CPU tensors (numpy arrays are wrapped without a
    copy); returns numpy arrays where the base launcher would (float32 and float16 inputs
    given as numpy), torch tensors otherwise."""

    def __init__(self, base: CpuLauncher) -> None:
        import torch

        plan = base.program.plan
        if not eager_applies(plan):
            raise BackendError("the torch_eager variant runs plans of library kernels only")
        self._torch = torch
        self._buffers = {int(b["id"]): b for b in plan["buffers"]}
        self._inputs = sorted(
            (b for b in plan["buffers"] if b["role"] == "input"), key=lambda b: b["index"]
        )
        self._outputs = sorted(
            (b for b in plan["buffers"] if b["role"] == "output"), key=lambda b: b["index"]
        )
        self.input_specs = base.input_specs
        self.output_specs = base.output_specs
        # resolved once: a call runs these steps and nothing else (eager's own overhead)
        self._in = [
            (int(b["id"]), torch.Size(b["dims"]), getattr(torch, b["dtype"])) for b in self._inputs
        ]
        self._steps = [
            (
                self._op_fn(k, self._buffers[int(k["outputs"][0])]),
                [int(i) for i in k["inputs"]],
                int(k["outputs"][0]),
            )
            for k in plan["kernels"]
        ]
        self._out = [
            (
                int(b["id"]),
                getattr(torch, b["dtype"]),
                torch.Size(b["dims"]),
                b["dtype"] != "bfloat16",
            )
            for b in self._outputs
        ]

    def run(self, tensors: Sequence[Any], outputs: Sequence[Any] | None = None) -> list[Any]:
        torch = self._torch
        if len(tensors) != len(self._inputs):
            raise ShapeError(
                f"this kernel takes {len(self._inputs)} inputs with dims "
                f"{[tuple(b['dims']) for b in self._inputs]}, got {len(tensors)}"
            )
        vals: dict[int, Any] = {}
        numpy_in = True
        for (bid, dims, want), x in zip(self._in, tensors, strict=True):
            is_np = isinstance(x, np.ndarray)
            t = torch.from_numpy(x) if is_np else x
            numpy_in &= is_np
            if t.shape != dims or t.dtype != want or not t.is_cpu:
                raise TensorArgumentError(
                    f"input {len(vals)}: expected a CPU tensor of dims {tuple(dims)} and dtype "
                    f"{want}, got {tuple(t.shape)} {t.dtype} on {t.device}"
                )
            vals[bid] = t
        with torch.no_grad():  # as the C launcher: tensors that require grad are read only
            for fn, args, out in self._steps:
                vals[out] = fn(*[vals[i] for i in args])
        results = []
        for i, (bid, dtype, dims, np_ok) in enumerate(self._out):
            r = vals[bid]
            if r.dtype != dtype or r.shape != dims or not r.is_contiguous():
                r = r.to(dtype).reshape(dims).contiguous()
            if outputs is not None:
                dst = outputs[i]
                (torch.from_numpy(dst) if isinstance(dst, np.ndarray) else dst).copy_(r)
                results.append(dst)
            elif numpy_in and np_ok:
                results.append(r.numpy())
            else:
                results.append(r)
        return results

    def _op_fn(self, k: Mapping[str, Any], out: Mapping[str, Any]) -> Any:
        """One library kernel as PyTorch eager runs it, in its operands' dtype: a function
        of its operands."""
        torch, F = self._torch, self._torch.nn.functional
        p = k.get("params", {}) or {}
        op = k["op"]
        if op == "matmul":
            return torch.matmul
        if op == "unary":
            fn = _unary(torch, str(p["op"]), [float(v) for v in p.get("params", [])])
            if "shift_dims" not in p:
                return fn
            dims = tuple(int(d) for d in p["shift_dims"])

            def shifted(a: Any) -> Any:  # exp(x - m), m the max over dims (0 if not finite)
                m = torch.amax(a, dim=dims, keepdim=True)
                return fn(a - torch.nan_to_num(m, nan=0.0, posinf=0.0, neginf=0.0))

            return shifted
        if op == "binary":
            return {
                "add": torch.add,
                "sub": torch.sub,
                "mul": torch.mul,
                "div": torch.div,
                "pow": torch.pow,
            }[str(p["op"])]
        dim = int(p.get("dim", 0))
        if op == "reduction":
            return lambda a: torch.sum(a, dim=dim, keepdim=True)
        if op == "rms_norm":
            n, eps = int(p.get("num_normalized_dims", 1)), float(p.get("eps", 1e-6))

            def rms_norm(a: Any, w: Any = None) -> Any:
                if w is not None and w.dim() > n:
                    w = w.reshape(a.shape[-n:])  # torch wants exactly normalized_shape
                return F.rms_norm(a, a.shape[-n:], w, eps)

            return rms_norm
        if op == "softmax":
            return lambda a: torch.softmax(a, dim=dim)
        if op == "concat":
            return lambda *xs: torch.cat(xs, dim=dim)
        if op == "chunk":
            chunks, index = int(p["chunks"]), int(p["index"])
            return lambda a: torch.chunk(a, chunks, dim=dim)[index]
        if op == "reduce_max":
            return lambda a: torch.amax(a, dim=dim, keepdim=True)
        if op == "permute":
            perm = tuple(int(d) for d in p["perm"])
            return lambda a: a.permute(perm)
        if op == "reshape":
            shape = tuple(int(d) for d in p["dims"])
            return lambda a: a.reshape(shape)
        raise BackendError(f"library op {op!r} has no torch lowering (buffer {out['id']})")


def _unary(torch: Any, name: str, prm: list[float]) -> Any:
    F = torch.nn.functional
    if name == "mul_scalar":
        return lambda x: x * prm[0]
    if name == "add_scalar":
        return lambda x: x + prm[0]
    if name == "clamp":
        return lambda x: torch.clamp(x, prm[0], prm[1])
    table = {
        "exp": torch.exp,
        "square": torch.square,
        "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt,
        "silu": F.silu,
        "gelu": F.gelu,
        "relu": torch.relu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "neg": torch.neg,
    }
    fn = table.get(name)
    if fn is None:
        raise BackendError(f"unary op {name!r} has no torch lowering")
    return fn
