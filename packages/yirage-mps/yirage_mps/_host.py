"""The host side of a printed plan: runs its kernels in plan order on one torch device.

Library kernels run through torch on the inputs' device (``mps`` on a Mac, CPU tensors under
the emulator) in fp32, cast to the destination buffer's dtype, as the shared Triton layer's
host module does; outputs, intermediates and the running-max buffers of ``shift_store`` are
allocated with ``torch.empty``; generated kernels go to ``launch(name, grid, tensors)`` with
their buffers in the printer's parameter order. yirage-mps does not import the Triton layer
(Triton has no macOS build), hence this small runner of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from yirage.plan import CodegenError, GeneratedKernel, LibraryKernel, Plan

__all__ = ["Launch", "run_plan", "torch_dtype"]

#: ``launch(kernel name, grid, tensors)`` runs one generated kernel.
Launch = Callable[[str, Sequence[int], Sequence[Any]], None]


def _torch() -> Any:
    import torch

    return torch


def torch_dtype(name: str) -> Any:
    """The torch dtype of a plan dtype name."""
    return getattr(_torch(), name)


def _unary(torch: Any, name: str, x: Any, prm: Sequence[float]) -> Any:
    fns: dict[str, Callable[[Any], Any]] = {
        "exp": torch.exp,
        "square": torch.square,
        "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt,
        "silu": torch.nn.functional.silu,
        "gelu": torch.nn.functional.gelu,
        "relu": torch.relu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "neg": torch.neg,
    }
    if name == "mul_scalar":
        return x * float(prm[0])
    if name == "add_scalar":
        return x + float(prm[0])
    if name == "clamp":
        return torch.clamp(x, float(prm[0]), float(prm[1]))
    return fns[name](x)


def _library(plan: Plan, k: LibraryKernel, bufs: dict[int, Any]) -> Any:
    """The output of library kernel ``k`` (in its buffer's dtype and shape)."""
    torch = _torch()
    out = plan.buffer(k.outputs[0])
    xs = [bufs[b].float() for b in k.inputs]
    p = k.params
    if k.op == "matmul":
        y = torch.matmul(xs[0], xs[1])
    elif k.op == "unary":
        x = xs[0]
        if "shift_dims" in p:  # exp(x - m), m the max over the dims, 0 where not finite
            m = torch.amax(x, dim=tuple(int(d) for d in p["shift_dims"]), keepdim=True)
            x = x - torch.nan_to_num(m, nan=0.0, posinf=0.0, neginf=0.0)
        y = _unary(torch, str(p["op"]), x, [float(v) for v in p.get("params", [])])
    elif k.op == "binary":
        ops = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
        y = torch.pow(xs[0], xs[1]) if p["op"] == "pow" else ops[p["op"]](xs[0], xs[1])
    elif k.op == "reduction":
        y = torch.sum(xs[0], dim=int(p["dim"]), keepdim=True)
    elif k.op == "rms_norm":
        n = int(p.get("num_normalized_dims", 1))
        shape = xs[0].shape[-n:]
        w = xs[1].reshape(shape) if p.get("has_weight") else None
        y = torch.nn.functional.rms_norm(xs[0], shape, w, float(p.get("eps", 1e-6)))
    elif k.op == "softmax":
        y = torch.softmax(xs[0], dim=int(p["dim"]))
    elif k.op == "concat":
        y = torch.cat(xs, dim=int(p["dim"]))
    elif k.op == "chunk":
        y = torch.chunk(xs[0], int(p["chunks"]), dim=int(p["dim"]))[int(p["index"])]
    elif k.op == "reduce_max":
        y = torch.amax(xs[0], dim=int(p["dim"]), keepdim=True)
    elif k.op == "permute":
        y = xs[0].permute(tuple(int(d) for d in p["perm"]))
    elif k.op == "reshape":
        y = xs[0].reshape(tuple(int(d) for d in p["dims"]))
    elif k.op == "all_reduce":
        from yirage.plugin import all_reduce

        y = all_reduce(xs[0].clone(), int(p.get("world_size", 1)))
    else:  # pragma: no cover - validated by the parser
        raise CodegenError(f"library op {k.op!r} has no torch lowering in yirage-mps")
    return y.to(torch_dtype(out.dtype)).reshape(tuple(out.dims)).contiguous()


def _allocate(plan: Plan, k: GeneratedKernel, bufs: dict[int, Any], device: Any) -> None:
    torch = _torch()
    stores = [g.shift_store for g in k.safe_softmax if g.shift_store is not None]
    for acc in (*k.outputs, *stores):
        if acc.buffer not in bufs:
            b = plan.buffer(acc.buffer)
            bufs[b.id] = torch.empty(tuple(b.dims), dtype=torch_dtype(b.dtype), device=device)


def run_plan(
    plan: Plan, inputs: Sequence[Any], params: Mapping[str, Sequence[int]], launch: Launch
) -> list[Any]:
    """Run ``plan`` on ``inputs`` (contiguous tensors of one device, in the plan's dtypes);
    returns its outputs."""
    bufs: dict[int, Any] = {b.id: t.contiguous() for b, t in zip(plan.inputs, inputs, strict=True)}
    device = inputs[0].device if inputs else None
    for k in plan.kernels:
        if isinstance(k, LibraryKernel):
            bufs[k.outputs[0]] = _library(plan, k, bufs)
            continue
        _allocate(plan, k, bufs, device)
        launch(k.name, tuple(k.grid), [bufs[b] for b in params[k.name]])
    return [bufs[b.id] for b in plan.outputs]
