"""Compound-op builders: common model blocks written as the primitive ops the search fuses.

Each builder only chains :class:`~yirage.KernelGraph` primitives, so the reference evaluator,
the fingerprints and every backend see nothing new; what the builder adds is the checked
shapes and the op order the search's presets expect.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from yirage._checks import check_float
from yirage._errors import GraphError, ShapeError

if TYPE_CHECKING:
    from yirage._graph import DTensor, KernelGraph

__all__ = [
    "ACTIVATIONS",
    "gated_mlp",
    "gemm_softmax",
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
    ``qk_norm``: RMS-normalise each query (over d, with ``eps``) and each key (over d, as
    ``k / sqrt(mean(k²))``: the IR has no scalar add, so the key norm takes no epsilon)."""
    _contract(q, kt, "self_attention (q @ kt)")
    _contract(kt, v, "self_attention (scores @ v)")
    d = q.dims[-1]
    if qk_norm:
        q = g.rms_norm(q, (d,), eps=eps)
        mean_sq = g.mul_scalar(g.reduction(g.square(kt), -2), 1.0 / d)
        kt = g.div(kt, g.sqrt(mean_sq))
    factor = 1.0 / math.sqrt(d) if scale is None else check_float(scale, "scale", GraphError)
    scores = g.mul_scalar(g.matmul(q, kt), factor)
    return g.matmul(g.softmax(scores, -1), v)
