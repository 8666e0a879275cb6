"""Compound-op builders: common model blocks written as the primitive ops the search fuses.

Each builder only chains :class:`~yirage.KernelGraph` primitives, so the reference evaluator,
the fingerprints and every backend see nothing new; what the builder adds is the checked
shapes and the op order the search's presets expect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from yirage._checks import check_float, check_ints
from yirage._errors import GraphError, ShapeError

if TYPE_CHECKING:
    from yirage._graph import DTensor, KernelGraph

__all__ = [
    "ACTIVATIONS",
    "gated_mlp",
    "gemm_layernorm",
    "gemm_softmax",
    "layer_norm",
    "lora_linear",
    "rms_norm_linear",
    "self_attention",
]

#: Gate activations :func:`gated_mlp` accepts.
ACTIVATIONS = ("silu", "gelu", "relu")


def _contract(a: DTensor, b: DTensor, what: str) -> None:
    """``a @ b`` must contract ``a``'s last dim with ``b``'s second to last."""
    if a.num_dims < 2 or b.num_dims < 2 or a.dims[-1] != b.dims[-2]:
        raise ShapeError(
            f"{what}: expected [..., m, k] @ [..., k, n], got {list(a.dims)} @ {list(b.dims)}"
        )


def rms_norm_linear(
    g: KernelGraph, x: DTensor, w: DTensor, weight: DTensor | None = None, eps: float = 1e-6
) -> DTensor:
    """``rms_norm(x) @ w``: ``x`` [..., h] normalised over h (times ``weight`` [h] if given),
    ``w`` [h, n]."""
    _contract(x, w, "rms_norm_linear")
    return g.matmul(g.rms_norm(x, (x.dims[-1],), weight, eps), w)


def gated_mlp(
    g: KernelGraph, x: DTensor, w_gate: DTensor, w_up: DTensor, activation: str = "silu"
) -> DTensor:
    """``act(x @ w_gate) * (x @ w_up)`` (SwiGLU with ``"silu"``, GeGLU with ``"gelu"``)."""
    if activation not in ACTIVATIONS:
        raise GraphError(
            f"gated_mlp: unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}"
        )
    _contract(x, w_gate, "gated_mlp (x @ w_gate)")
    _contract(x, w_up, "gated_mlp (x @ w_up)")
    if w_gate.dims != w_up.dims:
        raise ShapeError(
            f"gated_mlp: w_gate and w_up must have one shape, got {list(w_gate.dims)} and "
            f"{list(w_up.dims)}"
        )
    act = {"silu": g.silu, "gelu": g.gelu, "relu": g.relu}[activation]
    return g.mul(act(g.matmul(x, w_gate)), g.matmul(x, w_up))


def lora_linear(
    g: KernelGraph, x: DTensor, w: DTensor, a: DTensor, b: DTensor, scale: float = 1.0
) -> DTensor:
    """``x @ w + scale * (x @ a) @ b``: a frozen weight ``w`` [h, n] with a rank-r adapter
    ``a`` [h, r], ``b`` [r, n]."""
    _contract(x, w, "lora_linear (x @ w)")
    _contract(x, a, "lora_linear (x @ a)")
    _contract(a, b, "lora_linear (a @ b)")
    if b.dims[-1] != w.dims[-1]:
        raise ShapeError(
            f"lora_linear: b must end in w's output dim {w.dims[-1]}, got {list(b.dims)}"
        )
    delta = g.matmul(g.matmul(x, a), b)
    s = check_float(scale, "scale", GraphError)
    if s != 1.0:
        delta = g.mul_scalar(delta, s)
    return g.add(g.matmul(x, w), delta)


def gemm_softmax(g: KernelGraph, a: DTensor, b: DTensor, scale: float | None = None) -> DTensor:
    """``softmax(scale * (a @ b))`` over the last dim (``scale`` None: no scaling)."""
    _contract(a, b, "gemm_softmax")
    s = g.matmul(a, b)
    if scale is not None:
        s = g.mul_scalar(s, check_float(scale, "scale", GraphError))
    return g.softmax(s, -1)


def _check_layer_norm(
    x: DTensor,
    shape: tuple[int, ...],
    params: dict[str, DTensor | None],
    eps: float,
) -> float:
    """Validate layer_norm's arguments; returns eps."""
    n = len(shape)
    if n == 0 or n > x.num_dims or tuple(x.dims[-n:]) != shape:
        raise ShapeError(
            f"layer_norm: normalized_shape {list(shape)} must be a suffix of the input's dims "
            f"{list(x.dims)}, e.g. normalized_shape={list(x.dims[-1:])}"
        )
    e = check_float(eps, "eps", GraphError)
    if e < 0.0:
        raise GraphError(f"layer_norm: eps ({e}) must be ≥ 0, e.g. eps=1e-5")
    for name, t in params.items():
        if t is None:
            continue
        lead, tail = t.dims[: t.num_dims - n], t.dims[t.num_dims - n :]
        if t.num_dims < n or tuple(tail) != shape or any(d != 1 for d in lead):
            raise ShapeError(
                f"layer_norm: {name} must have dims normalized_shape {list(shape)} (optionally "
                f"with leading size-1 dims), got {list(t.dims)}"
            )
    return e


def layer_norm(
    g: KernelGraph,
    x: DTensor,
    normalized_shape: int | Sequence[int],
    weight: DTensor | None = None,
    bias: DTensor | None = None,
    eps: float = 1e-5,
) -> DTensor:
    """``(x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` over the trailing
    ``normalized_shape`` dims (the biased variance, as torch.nn.functional.layer_norm).

    Built as ``rms_norm(x - mean(x), eps, weight) + bias``: the rms of the centred value is
    the standard deviation, and every piece is a primitive that the fingerprints model
    exactly and the search already fuses."""
    shape = tuple(check_ints(normalized_shape, "normalized_shape", ShapeError))
    e = _check_layer_norm(x, shape, {"weight": weight, "bias": bias}, eps)
    total = x
    for d in range(1, len(shape) + 1):
        total = g.reduction(total, -d)
    mean = g.mul_scalar(total, 1.0 / math.prod(shape))
    y = g.rms_norm(g.sub(x, mean), shape, weight, e)
    return y if bias is None else g.add(y, bias)


def gemm_layernorm(
    g: KernelGraph,
    x: DTensor,
    w: DTensor,
    weight: DTensor | None = None,
    bias: DTensor | None = None,
    eps: float = 1e-5,
) -> DTensor:
    """``layer_norm(x @ w)`` over the output's last dim n (``w`` [h, n]; ``weight`` and
    ``bias`` [n] if given): a linear layer followed by a LayerNorm, as in post-LN blocks."""
    _contract(x, w, "gemm_layernorm")
    return layer_norm(g, g.matmul(x, w), (w.dims[-1],), weight, bias, eps)


def self_attention(
    g: KernelGraph,
    q: DTensor,
    kt: DTensor,
    v: DTensor,
    scale: float | None = None,
    qk_norm: bool = False,
    eps: float = 1e-6,
) -> DTensor:
    """``softmax(scale * q @ kt) @ v`` with ``q`` [..., m, d], keys transposed ``kt``
    [..., d, kv] and ``v`` [..., kv, dv]; ``scale`` defaults to 1/√d.

    Grouped-query attention: put the query heads that share a key/value head along m (``q``
    [batch·kv_heads, q_heads/kv_heads, d]), so each key tile is read once for the group.
    ``qk_norm``: RMS-normalise each query and each key (over d, with ``eps``; the keys are
    transposed, so their norm is ``k / sqrt(mean(k²) + eps)`` written out over dim -2)."""
    _contract(q, kt, "self_attention (q @ kt)")
    _contract(kt, v, "self_attention (scores @ v)")
    d = q.dims[-1]
    if qk_norm:
        q = g.rms_norm(q, (d,), eps=eps)
        mean_sq = g.mul_scalar(g.reduction(g.square(kt), -2), 1.0 / d)
        kt = g.div(kt, g.sqrt(g.add_scalar(mean_sq, eps) if eps else mean_sq))
    factor = 1.0 / math.sqrt(d) if scale is None else check_float(scale, "scale", GraphError)
    scores = g.mul_scalar(g.matmul(q, kt), factor)
    return g.matmul(g.softmax(scores, -1), v)
