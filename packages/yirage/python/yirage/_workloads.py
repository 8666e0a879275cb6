"""The bench workloads (benchmarks/README.md), each defined once: graph builder, torch
reference, optional expert kernel, and shape presets.

Presets: ``"gpu"`` is the full size in float16, ``"cpu"`` the reduced CPU size in
float32, ``"model"`` / ``"model_bf16"`` model sizes (hidden 4096, GQA decode at kv 8192) in
float32 / bfloat16 for CPUs, ``"model_ragged"`` (CPU) and ``"ragged_prime"`` (GPU) a prime
hidden size (4099) no loop tile divides (attention prefill: a prime prompt length),
``"model_ragged_n"`` (CPU) an odd output size no block count divides; some workloads have
further named presets (e.g. ``"gpu_b1"``, ``"paper"``). The graph builder and the reference
function take the same tensors in the same layout, so a benchmark can feed one set of inputs
to yirage, to the reference (PyTorch eager or ``torch.compile``) and to the expert kernel.

Attention layout: the µGraph IR has no transpose, so GQA decode is expressed per KV head with
the query heads that share it as rows: ``Q[b·kvh, g, d]`` (g = query heads per KV head),
``Kt[b·kvh, d, kv]`` (K transposed) and ``V[b·kvh, kv, d]``; query head ``h·g + r`` of batch
``i`` is row ``r`` of ``Q[i·kvh + h]`` (PyTorch's ``enable_gqa`` convention). The output is
``softmax(Q·Kt/√d)·V`` of shape ``[b·kvh, g, d]``. Attention prefill is the same graph with
``q_len`` query rows per head and one query head per KV head: ``Q[b·h, q_len, d]``,
``Kt[b·h, d, kv]``, ``V[b·h, kv, d]`` (no causal mask: the IR has no masking op).

QK-norm: Q is normalised with ``rms_norm`` over d; K (stored transposed, so d is dim -2) with
the same formula written out, ``Kt / sqrt(mean(Kt², dim=-2))`` — the IR has no scalar add,
so K's normalisation has eps = 0 (for keys of unit scale the difference to eps = 1e-6 is
≈ 5·10⁻⁷ relative); the reference function computes exactly this.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from yirage._dtypes import DType, bfloat16, float16, float32
from yirage._errors import ShapeError, YirageError
from yirage._graph import KernelGraph, new_kernel_graph

__all__ = ["WORKLOADS", "Workload", "get_workload", "workload_names"]

EPS = 1e-6


@dataclass(frozen=True)
class Workload:
    """One benchmark workload. ``shapes[preset]`` holds the named sizes and ``dtype``."""

    name: str
    description: str
    shapes: Mapping[str, Mapping[str, Any]]
    _build: Callable[[Mapping[str, Any], DType], KernelGraph] = field(repr=False)
    _reference: Callable[..., list[Any]] = field(repr=False)
    _expert: Callable[..., list[Any]] | None = field(default=None, repr=False)
    expert_name: str | None = None
    #: The ``yirage.search`` preset for this workload family (narrows the search; the
    #: unrestricted search finds the same best candidates, more slowly).
    search_config: str | None = None

    @property
    def presets(self) -> tuple[str, ...]:
        return tuple(self.shapes)

    def _shape(self, preset: str) -> Mapping[str, Any]:
        try:
            return self.shapes[preset]
        except KeyError:
            raise KeyError(
                f"workload {self.name!r} has no preset {preset!r}; "
                f"presets: {', '.join(self.shapes)}"
            ) from None

    def dtype(self, preset: str = "cpu") -> DType:
        dt: DType = self._shape(preset)["dtype"]
        return dt

    def graph(self, preset: str = "cpu") -> KernelGraph:
        """The kernel graph at ``preset``'s sizes and dtype."""
        s = self._shape(preset)
        return self._build(s, s["dtype"])

    def input_dims(self, preset: str = "cpu") -> list[tuple[int, ...]]:
        return [t.dims for t in self.graph(preset).inputs]

    def inputs(
        self, preset: str = "cpu", *, seed: int = 0, device: str = "cpu", numpy: bool = False
    ) -> list[Any]:
        """Random inputs (torch tensors on ``device``, or numpy arrays when ``numpy``), scaled
        so every matmul output stays O(1) (weights ~ N(0, 1/fan_in))."""
        s = self._shape(preset)
        dt = s["dtype"]
        rng = np.random.default_rng(seed)
        arrays = []
        for dims in self.input_dims(preset):
            std = 1.0 / math.sqrt(dims[-2]) if len(dims) >= 2 and dims[-2] >= 64 else 1.0
            arrays.append((rng.standard_normal(dims) * std).astype(np.float32))
        if numpy:
            if dt.numpy_dtype is None:
                raise TypeError(f"{dt} inputs need torch tensors (numpy has no {dt.name})")
            return [a.astype(dt.numpy_dtype) for a in arrays]
        import torch

        tdt = getattr(torch, dt.name)
        # copy=True: tensors in torch's own (64-byte aligned) CPU memory, as a model's tensors
        # are, not views of numpy's 16-byte aligned buffers (a CPU kernel streaming a
        # misaligned weight splits every 64-byte vector load across two cache lines).
        return [torch.from_numpy(a).to(device=device, dtype=tdt, copy=True) for a in arrays]

    def reference(self, *tensors: Any) -> list[Any]:
        """The workload in PyTorch eager (same inputs and outputs as the graph)."""
        return self._reference(*tensors)

    @property
    def has_expert(self) -> bool:
        return self._expert is not None

    def expert(self, *tensors: Any) -> list[Any]:
        """A hand-written expert kernel (e.g. SDPA for attention)."""
        if self._expert is None:
            raise YirageError(
                f"workload {self.name!r} has no expert kernel (check Workload.has_expert first)"
            )
        return self._expert(*tensors)


# -- rmsnorm_linear ----------------------------------------------------------------------------


def _rmsnorm_linear_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["b"], s["h"]), dt)
    w = g.new_input((s["h"], s["n"]), dt)
    g.mark_output(g.matmul(g.rms_norm(x, (s["h"],), eps=EPS), w))
    return g


def _rmsnorm_linear_ref(x: Any, w: Any) -> list[Any]:
    import torch

    return [torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=EPS) @ w]


# -- rms_norm ----------------------------------------------------------------------------------


def _rms_norm_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["b"], s["h"]), dt)
    w = g.new_input((s["h"],), dt)
    g.mark_output(g.rms_norm(x, (s["h"],), weight=w, eps=EPS))
    return g


def _rms_norm_ref(x: Any, w: Any) -> list[Any]:
    import torch

    return [torch.nn.functional.rms_norm(x, (x.shape[-1],), weight=w, eps=EPS)]


# -- norm_transformer --------------------------------------------------------------------------
#
# The elementwise chain a norm-transformer block ends with: the block's output A is
# normalised, scaled by a learned per-channel step alpha and added to the residual stream H:
#     H' = H + rms_norm(A) * alpha   (normalise, scale, residual add; rms_norm without weight).


def _norm_transformer_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    g = new_kernel_graph()
    h = g.new_input((s["b"], s["h"]), dt)
    a = g.new_input((s["b"], s["h"]), dt)
    alpha = g.new_input((s["h"],), dt)
    g.mark_output(g.add(h, g.mul(g.rms_norm(a, (s["h"],), eps=EPS), alpha)))
    return g


def _norm_transformer_ref(h: Any, a: Any, alpha: Any) -> list[Any]:
    import torch

    return [h + torch.nn.functional.rms_norm(a, (a.shape[-1],), eps=EPS) * alpha]


# -- gated_mlp ---------------------------------------------------------------------------------


def _gated_mlp_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["b"], s["h"]), dt)
    w1 = g.new_input((s["h"], s["n"]), dt)
    w2 = g.new_input((s["h"], s["n"]), dt)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _gated_mlp_ref(x: Any, w1: Any, w2: Any) -> list[Any]:
    import torch

    return [torch.nn.functional.silu(x @ w1) * (x @ w2)]


# -- lora --------------------------------------------------------------------------------------


def _lora_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["b"], s["h"]), dt)
    w = g.new_input((s["h"], s["n"]), dt)
    a = g.new_input((s["h"], s["r"]), dt)
    b = g.new_input((s["r"], s["n"]), dt)
    g.mark_output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b)))
    return g


def _lora_ref(x: Any, w: Any, a: Any, b: Any) -> list[Any]:
    return [x @ w + (x @ a) @ b]


# -- GQA decode --------------------------------------------------------------------------------


def _gqa_dims(s: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(groups, query rows per group, d, kv): a group is one KV head of one batch; its rows
    are the query heads sharing it, each ``q_len`` rows long (1 for decode)."""
    if s["q_heads"] % s["kv_heads"]:
        raise ShapeError(
            f"q_heads ({s['q_heads']}) must be a multiple of kv_heads ({s['kv_heads']}): "
            "each KV head serves the same number of query heads"
        )
    groups = s["b"] * s["kv_heads"]
    per = s["q_heads"] // s["kv_heads"] * s.get("q_len", 1)
    return groups, per, s["d"], s["kv"]


def _gqa_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    bb, g_, d, kv = _gqa_dims(s)
    g = new_kernel_graph()
    q = g.new_input((bb, g_, d), dt)
    kt = g.new_input((bb, d, kv), dt)
    v = g.new_input((bb, kv, d), dt)
    scores = g.mul_scalar(g.matmul(q, kt), 1.0 / math.sqrt(d))
    g.mark_output(g.matmul(g.softmax(scores, -1), v))
    return g


def _gqa_ref(q: Any, kt: Any, v: Any) -> list[Any]:
    import torch

    d = q.shape[-1]
    return [torch.softmax((q @ kt) * (1.0 / math.sqrt(d)), dim=-1) @ v]


_NATURAL_K: dict[tuple[int, int, tuple[int, ...]], Any] = {}


def _natural_k(kt: Any) -> Any:
    """K in SDPA's own contiguous ``[.., kv, d]`` layout, made once per input tensor (keyed by
    storage, version and shape) so the expert is timed on its natural layout, as a serving
    stack stores it, rather than on our graph's transposed Kᵀ view."""
    key = (int(kt.data_ptr()), int(kt._version), tuple(kt.shape))
    if key not in _NATURAL_K:
        if len(_NATURAL_K) > 16:
            _NATURAL_K.clear()
        _NATURAL_K[key] = kt.transpose(-1, -2).contiguous()
    return _NATURAL_K[key]


def _sdpa(q: Any, kt: Any, v: Any, kv_heads: int = 2) -> list[Any]:
    """Expert for GQA decode: PyTorch SDPA in the decode layout (``[b, hq, 1, d]`` queries,
    ``[b, kvh, kv, d]`` contiguous keys/values, ``enable_gqa``)."""
    import torch

    bb, g_, d = (int(x) for x in q.shape)
    kv = int(kt.shape[-1])
    b = bb // kv_heads
    qq = q.reshape(b, kv_heads * g_, 1, d)
    kk = _natural_k(kt).reshape(b, kv_heads, kv, d)
    vv = v.reshape(b, kv_heads, kv, d)
    out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)
    return [out.reshape(bb, g_, d)]


def _sdpa_prefill(q: Any, kt: Any, v: Any) -> list[Any]:
    """Expert for attention prefill: PyTorch SDPA (flash attention on GPUs) over the
    ``[b·heads, q_len, d]`` queries with K in its natural contiguous ``[.., kv, d]`` layout,
    passed as one batch of ``b·heads`` heads: SDPA's fused kernels take 4-D inputs only and
    run 3-D ones through its unfused math fallback."""
    import torch

    q4, k4, v4 = (t.unsqueeze(0) for t in (q, _natural_k(kt), v))
    return [torch.nn.functional.scaled_dot_product_attention(q4, k4, v4).squeeze(0)]


def _qknorm_graph(s: Mapping[str, Any], dt: DType) -> KernelGraph:
    bb, g_, d, kv = _gqa_dims(s)
    g = new_kernel_graph()
    q = g.new_input((bb, g_, d), dt)
    kt = g.new_input((bb, d, kv), dt)
    v = g.new_input((bb, kv, d), dt)
    qn = g.rms_norm(q, (d,), eps=EPS)
    k_rms = g.sqrt(g.mul_scalar(g.reduction(g.square(kt), 1), 1.0 / d))
    kn = g.div(kt, k_rms)
    scores = g.mul_scalar(g.matmul(qn, kn), 1.0 / math.sqrt(d))
    g.mark_output(g.matmul(g.softmax(scores, -1), v))
    return g


def _qknorm_ref(q: Any, kt: Any, v: Any) -> list[Any]:
    import torch

    d = q.shape[-1]
    qn = torch.nn.functional.rms_norm(q, (d,), eps=EPS)
    kn = kt / torch.sqrt((kt * kt).sum(dim=1, keepdim=True) * (1.0 / d))
    return [torch.softmax((qn @ kn) * (1.0 / math.sqrt(d)), dim=-1) @ v]


def _gqa_shapes(b: int, kv: int, dtype: DType) -> dict[str, Any]:
    return {"b": b, "q_heads": 8, "kv_heads": 2, "d": 128, "kv": kv, "dtype": dtype}


def _prefill_shapes(
    q_len: int, dtype: DType, heads: int = 32, d: int = 128, kv: int | None = None
) -> dict[str, Any]:
    """Attention prefill: ``q_len`` query rows against ``kv`` keys (default as many: self-
    attention over the prompt), ``heads`` heads (one query head per KV head)."""
    return {
        "b": 1,
        "q_heads": heads,
        "kv_heads": heads,
        "d": d,
        "kv": q_len if kv is None else kv,
        "q_len": q_len,
        "dtype": dtype,
    }


_GQA_SHAPES: dict[str, dict[str, Any]] = {
    "cpu": _gqa_shapes(2, 1024, float32),
    "gpu": _gqa_shapes(8, 4096, float16),
    "gpu_kv16384": _gqa_shapes(8, 16384, float16),
    "model": _gqa_shapes(1, 8192, float32),
    "model_bf16": _gqa_shapes(1, 8192, bfloat16),
}


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "rmsnorm_linear",
            "rms_norm(X[b,h]) @ W[h,n]",
            {
                "cpu": {"b": 8, "h": 1024, "n": 1536, "dtype": float32},
                "gpu": {"b": 8, "h": 4096, "n": 6144, "dtype": float16},
                "gpu_b1": {"b": 1, "h": 4096, "n": 6144, "dtype": float16},
                "gpu_b16": {"b": 16, "h": 4096, "n": 6144, "dtype": float16},
                "prefill_256": {"b": 256, "h": 4096, "n": 4096, "dtype": float16},
                "prefill_1024": {"b": 1024, "h": 4096, "n": 4096, "dtype": float16},
                "prefill_4096": {"b": 4096, "h": 4096, "n": 4096, "dtype": float16},
                "ragged": {"b": 8, "h": 4000, "n": 5000, "dtype": float16},
                "ragged_prime": {"b": 8, "h": 4099, "n": 4096, "dtype": float16},
                "model": {"b": 8, "h": 4096, "n": 6144, "dtype": float32},
                "model_bf16": {"b": 8, "h": 4096, "n": 6144, "dtype": bfloat16},
                "model_ragged": {"b": 8, "h": 4099, "n": 6144, "dtype": float32},
                "model_ragged_n": {"b": 8, "h": 4096, "n": 6151, "dtype": float32},
            },
            _rmsnorm_linear_graph,
            _rmsnorm_linear_ref,
        ),
        Workload(
            "rms_norm",
            "rms_norm(X[b,h]) · w[h]",
            {
                "cpu": {"b": 8, "h": 1024, "dtype": float32},
                "gpu": {"b": 8, "h": 4096, "dtype": float16},
                "gpu_b1": {"b": 1, "h": 4096, "dtype": float16},
                "gpu_b16": {"b": 16, "h": 4096, "dtype": float16},
            },
            _rms_norm_graph,
            _rms_norm_ref,
        ),
        Workload(
            "norm_transformer",
            "H[b,h] + rms_norm(A[b,h]) * alpha[h] (norm-transformer residual update: normalise, "
            "scale, residual add)",
            {
                "cpu": {"b": 8, "h": 1024, "dtype": float32},
                "gpu": {"b": 8, "h": 4096, "dtype": float16},
                "gpu_b1": {"b": 1, "h": 4096, "dtype": float16},
                "gpu_b16": {"b": 16, "h": 4096, "dtype": float16},
            },
            _norm_transformer_graph,
            _norm_transformer_ref,
        ),
        Workload(
            "gated_mlp",
            "silu(X[b,h] @ W1[h,n]) * (X @ W2[h,n])",
            {
                "cpu": {"b": 8, "h": 1024, "n": 1024, "dtype": float32},
                "gpu": {"b": 8, "h": 4096, "n": 4096, "dtype": float16},
                "gpu_b1": {"b": 1, "h": 4096, "n": 4096, "dtype": float16},
                "gpu_b16": {"b": 16, "h": 4096, "n": 4096, "dtype": float16},
                "prefill_256": {"b": 256, "h": 4096, "n": 4096, "dtype": float16},
                "prefill_1024": {"b": 1024, "h": 4096, "n": 4096, "dtype": float16},
                "prefill_4096": {"b": 4096, "h": 4096, "n": 4096, "dtype": float16},
                "ragged": {"b": 8, "h": 4000, "n": 5000, "dtype": float16},
                "ragged_prime": {"b": 8, "h": 4099, "n": 4096, "dtype": float16},
                "model": {"b": 8, "h": 4096, "n": 11008, "dtype": float32},
                "model_bf16": {"b": 8, "h": 4096, "n": 11008, "dtype": bfloat16},
                "model_ragged": {"b": 8, "h": 4099, "n": 11008, "dtype": float32},
                "model_ragged_n": {"b": 8, "h": 4096, "n": 11003, "dtype": float32},
            },
            _gated_mlp_graph,
            _gated_mlp_ref,
            search_config="mlp",
        ),
        Workload(
            "lora",
            "X[b,h] @ W[h,n] + (X @ A[h,r]) @ B[r,n]",
            {
                "cpu": {"b": 8, "h": 1024, "n": 1024, "r": 16, "dtype": float32},
                "gpu": {"b": 16, "h": 4096, "n": 4096, "r": 16, "dtype": float16},
                "gpu_b1": {"b": 1, "h": 4096, "n": 4096, "r": 16, "dtype": float16},
                "paper": {"b": 16, "h": 256, "n": 4096, "r": 16, "dtype": float16},
                "model": {"b": 8, "h": 4096, "n": 4096, "r": 16, "dtype": float32},
                "model_bf16": {"b": 8, "h": 4096, "n": 4096, "r": 16, "dtype": bfloat16},
            },
            _lora_graph,
            _lora_ref,
            search_config="lora",
        ),
        Workload(
            "gqa_decode",
            "softmax(Q[b·kvh,g,d] · Kt[b·kvh,d,kv] / √d) · V[b·kvh,kv,d] "
            "(GQA decode, 8 q heads, 2 kv heads)",
            _GQA_SHAPES,
            _gqa_graph,
            _gqa_ref,
            _sdpa,
            "torch SDPA (enable_gqa, K in its natural contiguous layout)",
            "attention",
        ),
        Workload(
            "attention_prefill",
            "softmax(Q[b·h,s,d] · Kt[b·h,d,s] / √d) · V[b·h,s,d] (self-attention prefill, "
            "s query rows, 32 heads, d 128, no mask)",
            {
                # a 64-row prompt chunk against 256 keys (CI size)
                "cpu": _prefill_shapes(64, float32, heads=2, d=64, kv=256),
                "prefill_1024": _prefill_shapes(1024, float16),
                "prefill_4096": _prefill_shapes(4096, float16),
                # a prime prompt length: kv walked by a masked loop, the query rows masked
                "ragged_prime": _prefill_shapes(4099, float16),
            },
            _gqa_graph,
            _gqa_ref,
            _sdpa_prefill,
            "torch SDPA (flash attention, K in its natural contiguous layout)",
            "attention",
        ),
        Workload(
            "qknorm_gqa",
            "rms_norm over d of Q and K per head, then GQA decode",
            {k: v for k, v in _GQA_SHAPES.items() if k in ("cpu", "gpu")},
            _qknorm_graph,
            _qknorm_ref,
            search_config="attention",
        ),
    )
}


def workload_names() -> list[str]:
    return list(WORKLOADS)


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"no workload {name!r}; known: {', '.join(WORKLOADS)}") from None
