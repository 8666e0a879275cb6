"""The float64 reference evaluator on a torch device (private).

``KernelGraph.evaluate`` runs the Rust core's reference evaluator on the CPU; for the numeric
check of a prefill-sized graph (a 32 x 4096 x 4096 score matrix) that is most of
``superoptimize``'s cold time. Where the check's tensors live on a GPU, :func:`evaluate` runs
the same float64 formulas there with torch, op for op as the core writes them
(``reference.rs``, ``dense.rs``, ``exec.rs``), so the stress checks, which compare NaN/inf
patterns with the reference, see the same ones:

- softmax subtracts each row's largest *finite* value (nothing in a row without one), then
  ``exp(x - m) / Σ exp(x - m)``; rms_norm is ``x / sqrt(Σx² / n + eps) · w``;
- silu ``x / (1 + e^-x)``, sigmoid ``1 / (1 + e^-x)``, rsqrt ``1 / √x``, gelu
  ``0.5·x·(1 + erf(x/√2))`` with the core's own erf (series, continued fraction), relu
  ``x > 0 ? x : 0`` and clamp ``min(max(x, lo), hi)`` (NaN gives 0 and ``lo``), reduce_max
  propagates NaN and keeps the first of equal maxima (the sign of a zero);
- sums and matmuls start from +0 (a zero result is +0, as in the core), divisions are IEEE
  divisions (never a multiplication by a reciprocal).

Sums and matmuls add in torch's order, not the core's index order: values agree to rounding
(about 1e-15 relative of the terms' size), NaN/inf patterns exactly (a float64 sum of finite
float16/float32-sized terms does not overflow in any order).

Graphs the evaluator does not mirror are refused (:func:`evaluate` returns None, logged at
debug level) and the caller runs the core evaluator: fused (``customized``) operators, whose
block graphs the core executes tile by tile, multi-device graphs (``all_reduce``), and any op
this module does not know. So is a graph whose float64 footprint passes half the device's
free memory (:data:`FOOTPRINT_COPIES`), and one that runs out of memory all the same.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from yirage._graph import KernelGraph
from yirage._logging import get_logger

__all__ = ["device_of", "evaluate", "evaluate_numpy", "peak"]

_log = get_logger("yirage.check")

#: torch device types the check evaluates its reference on: NVIDIA and AMD (ROCm) GPUs, both
#: "cuda" to torch. CPU backends keep the core evaluator itself; MPS has no float64.
DEVICE_TYPES: tuple[str, ...] = ("cuda",)

#: The float64 footprint charged to a graph, in copies of its largest tensor (a softmax holds
#: its input, the shifted values, their exps and the quotient), on top of its inputs. A graph
#: whose footprint passes half the device's free memory is refused: the kernels' checks run
#: beside the reference and must not run out of memory because of it.
FOOTPRINT_COPIES = 4

#: 2/√π and √2 rounded to float64 (Rust's ``FRAC_2_SQRT_PI`` and ``SQRT_2``).
_FRAC_2_SQRT_PI = 1.1283791670955126
_SQRT_2 = 1.4142135623730951

#: A torch tensor (torch is imported only where a caller already holds its tensors).
Tensor = Any


class _Refused(Exception):
    """The graph holds an op this module does not mirror."""


def tensor_type() -> Any:
    """``torch.Tensor`` where torch is imported, without importing it; None also while
    another thread is still importing it (no tensor exists yet then)."""
    return getattr(sys.modules.get("torch"), "Tensor", None)


def device_of(tensors: Sequence[Any]) -> Any | None:
    """The torch device of ``tensors`` when every one is a torch tensor on a device of
    :data:`DEVICE_TYPES` (one device), else None."""
    tensor = tensor_type()
    if tensor is None or not tensors:
        return None
    devices = {t.device for t in tensors if isinstance(t, tensor)}
    if len(devices) != 1 or not all(isinstance(t, tensor) for t in tensors):
        return None
    device = devices.pop()
    return device if device.type in DEVICE_TYPES else None


def evaluate(graph: KernelGraph, inputs: Sequence[Any], device: Any) -> list[Tensor] | None:
    """The float64 reference outputs of single-device ``graph`` on ``inputs`` (torch tensors
    or numpy arrays, the graph's input dims), as float64 tensors on ``device``; None when the
    graph holds an op this module does not mirror or the device runs out of memory (the
    caller then runs ``graph.evaluate``)."""
    import torch

    parsed = _parse(graph)
    if parsed is None:
        return None
    ops, outputs = parsed
    device = torch.device(device)
    if not _fits(graph, len(ops), device):
        return None
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    try:
        with torch.no_grad():
            return _run(ops, outputs, [_to_device(x, device) for x in inputs])
    except _Refused as why:
        _log.debug("torch reference on %s refused: %s; the core evaluator runs it", device, why)
        return None
    except oom:
        _log.debug("torch reference on %s ran out of memory; the core evaluator runs it", device)
        return None
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # hand the reference's buffers back to the device


def evaluate_numpy(
    graph: KernelGraph, inputs: Sequence[Any], device: Any
) -> list[np.ndarray] | None:
    """:func:`evaluate`'s outputs as float64 numpy arrays (None where it refuses)."""
    outs = evaluate(graph, inputs, device)
    if outs is None:
        return None
    return [np.ascontiguousarray(o.cpu().numpy()) for o in outs]


def peak(graph: KernelGraph, inputs: Sequence[Any], device: Any) -> float | None:
    """The largest absolute value of ``graph``'s outputs, NaN skipped (0 when there are
    none), computed on ``device``; None where :func:`evaluate` refuses."""
    import torch

    outs = evaluate(graph, inputs, device)
    if outs is None:
        return None
    best = 0.0
    for o in outs:
        if o.numel():
            a = torch.where(torch.isnan(o), 0.0, o.abs())
            best = max(best, float(a.max()))
    return best


# -- the graph's ops ----------------------------------------------------------------------------


def _parse(graph: KernelGraph) -> tuple[list[dict[str, Any]], list[int]] | None:
    """The graph's ops (op i computes tensor i) and output ids, or None (logged) when an op
    is not mirrored here."""
    doc = json.loads(graph.to_json())
    why = None
    if doc.get("world_size", 1) != 1:
        why = f"a graph of {doc['world_size']} ranks"
    else:
        for op in doc["ops"]:
            kind = op["op"]
            if kind not in _KNOWN:
                why = f"op {kind!r} is not mirrored here"
            elif kind == "unary" and op["kind"] not in _UNARY:
                why = f"unary op {op['kind']!r} is not mirrored here"
            elif kind == "binary" and op["kind"] not in _BINARY:
                why = f"binary op {op['kind']!r} is not mirrored here"
            if why is not None:
                break
    if why is not None:
        _log.debug("torch reference refuses the graph: %s; the core evaluator runs it", why)
        return None
    return list(doc["ops"]), [int(t) for t in doc["outputs"]]


def _free_bytes(device: Any) -> int | None:
    """Free memory of a GPU ``device`` (None for others: no limit)."""
    import torch

    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def _fits(graph: KernelGraph, num_tensors: int, device: Any) -> bool:
    """Whether ``graph``'s float64 footprint (:data:`FOOTPRINT_COPIES`) fits in half of the
    device's free memory; logged when it does not."""
    free = _free_bytes(device)
    if free is None:
        return True
    sizes = [math.prod(graph._g.tensor_dims(t)) for t in range(num_tensors)]
    inputs = sum(math.prod(t.dims) for t in graph.inputs)
    need = 8 * (FOOTPRINT_COPIES * max(sizes, default=0) + inputs)
    if need <= free // 2:
        return True
    _log.debug(
        "torch reference on %s refused: the graph needs about %.1f GiB of float64, over half "
        "of the %.1f GiB free; the core evaluator runs it",
        device,
        need / 2**30,
        free / 2**30,
    )
    return False


def _to_device(x: Any, device: Any) -> Tensor:
    """``x`` (torch tensor or array-like) as a float64 tensor on ``device``."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to(device=device, dtype=torch.float64)
    arr = np.ascontiguousarray(x)
    if arr.dtype not in (np.float32, np.float64) or not arr.flags.writeable:
        arr = arr.astype(np.float64)  # torch takes writable float arrays only
    return torch.from_numpy(arr).to(device=device, dtype=torch.float64)


def _run(
    ops: Sequence[dict[str, Any]], outputs: Sequence[int], inputs: list[Tensor]
) -> list[Tensor]:
    """Walk ``ops`` in order; each value is dropped after its last use (prefill scores are
    4 GiB in float64)."""
    last = {int(t): len(ops) for t in outputs}
    for i, op in enumerate(ops):
        for t in _operands(op):
            last[t] = max(last.get(t, -1), i)
    dims = [tuple(op["dims"]) for op in ops if op["op"] == "input"]
    if [tuple(x.shape) for x in inputs] != dims:
        raise _Refused(f"inputs of shapes {[tuple(x.shape) for x in inputs]}, not {dims}")
    vals: list[Tensor | None] = [None] * len(ops)
    pending = iter(inputs)
    for i, op in enumerate(ops):
        if op["op"] == "input":
            vals[i] = next(pending)
        else:
            vals[i] = _OPS[op["op"]](op, [vals[t] for t in _operands(op)])
        for t in _operands(op):
            if last[t] == i:
                vals[t] = None
        if i not in last:
            vals[i] = None  # nothing reads it
    return [vals[int(t)] for t in outputs]


def _operands(op: dict[str, Any]) -> list[int]:
    """The tensor ids ``op`` reads (in the order its function takes them)."""
    kind = op["op"]
    if kind in ("matmul", "binary"):
        return [int(op["a"]), int(op["b"])]
    if kind == "concat":
        return [int(x) for x in op["xs"]]
    if kind == "rms_norm":
        w = op.get("weight")
        return [int(op["x"])] + ([] if w is None else [int(w)])
    if kind == "input":
        return []
    return [int(op["x"])]


# -- formulas (each one the core's) -------------------------------------------------------------


def _div(a: Tensor, b: Tensor | float) -> Tensor:
    """IEEE ``a / b``: a divisor given as a number becomes a 1-element tensor (torch would
    otherwise multiply by its reciprocal on the GPU)."""
    import torch

    if not isinstance(b, torch.Tensor):
        b = torch.full((1,), float(b), dtype=torch.float64, device=a.device)
    return torch.div(a, b)


def _plus_zero(x: Tensor) -> Tensor:
    """``x`` with -0 turned into +0 (the core sums from +0, so a zero sum is +0)."""
    return x + 0.0


def _sum(x: Tensor, dims: int | tuple[int, ...]) -> Tensor:
    return _plus_zero(x.sum(dims, keepdim=True))


def _matmul(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    import torch

    return _plus_zero(torch.matmul(args[0], args[1]))


def _reduction(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    return _sum(args[0], int(op["dim"]))


def _reduce_max(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    """The row's maximum, NaN when it holds one; of equal maxima the first (f64 ``>``
    keeps it), which decides the sign of a zero maximum."""
    import torch

    x, dim = args[0], int(op["dim"])
    m = x.amax(dim, keepdim=True)
    zero = m == 0
    if bool(zero.any()):
        first = (x == m).to(torch.uint8).argmax(dim, keepdim=True)
        m = torch.where(zero, torch.gather(x, dim, first), m)
    return m


def _rms_norm(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    import torch

    x = args[0]
    n = len(op["normalized_shape"])
    inner = math.prod(x.shape[x.dim() - n :])
    ss = _sum(x * x, tuple(range(x.dim() - n, x.dim())))
    y = _div(x, torch.sqrt(_div(ss, float(inner)) + float(op["eps"])))
    return y * args[1] if len(args) > 1 else y


def _softmax(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    """``exp(x - m) / Σ exp(x - m)``, ``m`` the row's largest finite value (0 where the row
    has none: the core leaves such a row unshifted)."""
    import torch

    x, dim = args[0], int(op["dim"])
    m = torch.where(torch.isfinite(x), x, -math.inf).amax(dim, keepdim=True)
    m = torch.where(torch.isinf(m), 0.0, m)
    e = torch.exp(x - m)
    return _div(e, _sum(e, dim))


def _concat(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    import torch

    return torch.cat(args, int(op["dim"]))


def _chunk(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    x, dim = args[0], int(op["dim"])
    size = x.shape[dim] // int(op["chunks"])
    return x.narrow(dim, int(op["index"]) * size, size)


def _permute(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    return args[0].permute(*[int(p) for p in op["perm"]])


def _reshape(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    return args[0].reshape(*[int(d) for d in op["dims"]])


def _unary(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    return _UNARY[op["kind"]](args[0], [float(p) for p in op.get("params", [])])


def _binary(op: dict[str, Any], args: list[Tensor]) -> Tensor:
    return _BINARY[op["kind"]](args[0], args[1])


def _pow(a: Tensor, b: Tensor) -> Tensor:
    """C's ``pow`` (the core's ``powf``): NaN for a negative base and a fractional
    exponent, ±inf for a zero base and a negative exponent."""
    import torch

    return torch.pow(a, b)


def _exp(x: Tensor) -> Tensor:
    import torch

    return torch.exp(x)


def _silu(x: Tensor, _: list[float]) -> Tensor:
    return _div(x, 1.0 + _exp(-x))


def _sigmoid(x: Tensor, _: list[float]) -> Tensor:
    return _div(_ones(x), 1.0 + _exp(-x))


def _rsqrt(x: Tensor, _: list[float]) -> Tensor:
    import torch

    return _div(_ones(x), torch.sqrt(x))


def _relu(x: Tensor, _: list[float]) -> Tensor:
    import torch

    return torch.where(x > 0, x, 0.0)


def _clamp(x: Tensor, p: list[float]) -> Tensor:
    """``min(max(x, lo), hi)`` as f64 ``max``/``min`` compute it: NaN gives ``lo``, and of
    equal operands (±0) the first, ``x``."""
    import torch

    lo, hi = p
    y = torch.where(x >= lo, x, lo)
    return torch.where(y <= hi, y, hi)


def _ones(x: Tensor) -> Tensor:
    import torch

    return torch.ones((1,), dtype=x.dtype, device=x.device)


def _gelu(x: Tensor, _: list[float]) -> Tensor:
    return (0.5 * x) * (1.0 + _erf(_div(x, _SQRT_2)))


def _erf(x: Tensor) -> Tensor:
    """The core's ``erf`` (``reference.rs``) element for element: Maclaurin series below 3,
    1 past 27, the continued fraction of erfc between; NaN stays NaN."""
    import torch

    ax = x.abs()
    r = torch.where(ax > 27.0, 1.0, ax)  # NaN too: its sign is restored below
    small = ax < 3.0
    if bool(small.any()):
        r[small] = _erf_series(ax[small])
    mid = (ax >= 3.0) & (ax <= 27.0)
    if bool(mid.any()):
        r[mid] = _erf_fraction(ax[mid])
    return torch.where(x < 0, -r, r)


def _erf_series(ax: Tensor) -> Tensor:
    """erf(ax) = 2/√π Σ (-1)^n ax^(2n+1) / (n! (2n+1)), summed while the term is above
    1e-17 of the sum (at most 200 terms)."""
    import torch

    x2 = ax * ax
    term = ax.clone()
    total = ax.clone()
    active = torch.ones_like(ax, dtype=torch.bool)
    n = 0.0
    while True:
        active &= term.abs() > 1e-17 * total.abs()
        if not bool(active.any()):
            break
        n += 1.0
        term = torch.where(active, term * _div(-x2, n), term)
        total = torch.where(active, total + _div(term, 2.0 * n + 1.0), total)
        if n > 200.0:
            break
    return total * _FRAC_2_SQRT_PI


def _erf_fraction(ax: Tensor) -> Tensor:
    """1 - e^{-ax²}/√π · 1/(ax + ½/(ax + 1/(ax + (3/2)/(ax + …)))), by modified Lentz,
    stopped per element when a step changes the value by less than 1e-16."""
    import torch

    tiny = 1e-300
    f = ax.clone()
    c = ax.clone()
    dd = torch.zeros_like(ax)
    active = torch.ones_like(ax, dtype=torch.bool)
    for k in range(1, 300):
        a = k * 0.5
        d_new = ax + a * dd
        d_new = torch.where(d_new.abs() < tiny, tiny, d_new)
        c_new = ax + _div(torch.full((1,), a, dtype=ax.dtype, device=ax.device), c)
        c_new = torch.where(c_new.abs() < tiny, tiny, c_new)
        d_new = _div(_ones(ax), d_new)
        delta = c_new * d_new
        f = torch.where(active, f * delta, f)
        dd = torch.where(active, d_new, dd)
        c = torch.where(active, c_new, c)
        active &= ~((delta - 1.0).abs() < 1e-16)
        if not bool(active.any()):
            break
    return 1.0 - _div(_exp(-ax * ax), f * math.sqrt(math.pi))


def _scalar(fn: Callable[[Tensor, float], Tensor]) -> Callable[[Tensor, list[float]], Tensor]:
    return lambda x, p: fn(x, p[0])


def _plain(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor, list[float]], Tensor]:
    return lambda x, _: fn(x)


def _torch_fn(name: str) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        import torch

        return getattr(torch, name)(x)

    return run


_UNARY: dict[str, Callable[[Tensor, list[float]], Tensor]] = {
    "exp": _plain(_exp),
    "square": _plain(lambda x: x * x),
    "sqrt": _plain(_torch_fn("sqrt")),
    "rsqrt": _rsqrt,
    "silu": _silu,
    "gelu": _gelu,
    "relu": _relu,
    "sigmoid": _sigmoid,
    "tanh": _plain(_torch_fn("tanh")),
    "neg": _plain(lambda x: -x),
    "mul_scalar": _scalar(lambda x, s: x * s),
    "add_scalar": _scalar(lambda x, s: x + s),
    "clamp": _clamp,
}

_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": _div,
    "pow": _pow,
}


_OPS: dict[str, Callable[[dict[str, Any], list[Tensor]], Tensor]] = {
    "matmul": _matmul,
    "unary": _unary,
    "binary": _binary,
    "reduction": _reduction,
    "reduce_max": _reduce_max,
    "rms_norm": _rms_norm,
    "softmax": _softmax,
    "concat": _concat,
    "chunk": _chunk,
    "permute": _permute,
    "reshape": _reshape,
}

#: Every op kind :func:`_run` knows (inputs are taken in order, not computed).
_KNOWN = frozenset(_OPS) | {"input"}
