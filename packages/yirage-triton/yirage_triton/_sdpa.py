"""Attention written as library kernels, run as one call of PyTorch's fused attention.

A plan whose library kernels compute ``matmul(softmax(c · matmul(Q, Kᵀ)), V)`` (the search's
baseline of an attention graph, or the tail of a plan whose generated kernels prepare Q, K or
V) materialises the score matrix: at 4096 query rows, 32 heads and 4096 keys that is 2 GiB
written and read three times. ``torch.nn.functional.scaled_dot_product_attention`` computes
the same value in one pass (flash or memory-efficient attention where the device has them),
with the scores in float32 and the weights rounded to the 16-bit dtype before their product
with V, as the library printing rounds them before its second matmul.

Where the graph holds Kᵀ (``[.., d, kv]``) as a buffer, SDPA's fused kernels need K's rows
contiguous, so the printing copies K into that layout first
(:func:`~yirage_triton.transposed_copy`). That copy streams K once more, which doubles a
decode step's traffic: such chains are printed only where every head has at least
:data:`MIN_QUERY_ROWS` query rows, whose products reread K from cache many times over.
Where a library transpose in the chain writes Kᵀ from K, SDPA reads K as it is, at any row
count. The race decides whether the printing pays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from yirage.plan import LibraryKernel, Plan

from ._host import TORCH_DTYPE, buffer_readers, fmt_float, library_writers

__all__ = ["MIN_QUERY_ROWS", "AttentionChain", "attention_chains", "sdpa_lines"]

#: Query rows per head below which the fused-attention printing is not offered (see the
#: module doc): a query tile of the fused kernels.
MIN_QUERY_ROWS = 64


@dataclass(frozen=True)
class AttentionChain:
    """Library kernels ``kernels`` (plan indices, in order) computing buffer ``out`` =
    softmax(``scale`` · q @ kt, last dim) @ v; their other outputs are read by the chain
    alone. Where ``k`` is set, the chain starts with the transpose writing ``kt`` from it."""

    kernels: tuple[int, ...]
    q: int
    kt: int
    v: int
    out: int
    scale: float
    #: K itself where a library transpose in the chain wrote ``kt`` from it (read as it is)
    k: int | None = None


def attention_chains(plan: Plan, min_query_rows: int = MIN_QUERY_ROWS) -> list[AttentionChain]:
    """Every attention chain of ``plan``: the second matmul's output back to the first (and
    to a transpose writing Kᵀ), all four tensors of one rank with equal leading (head) dims,
    each link an intermediate that only the next link reads. Chains that copy K (no
    transpose in them) only where the heads have at least ``min_query_rows`` query rows."""
    readers, writer = buffer_readers(plan), library_writers(plan)

    def lib(i: int | None) -> LibraryKernel | None:
        k = plan.kernels[i] if i is not None else None
        return k if isinstance(k, LibraryKernel) and len(k.outputs) == 1 else None

    def private(buf: int, reader: int) -> bool:
        b = plan.buffer(buf)
        return b.role == "intermediate" and readers.get(buf) == [reader]

    chains = []
    for i, pv in enumerate(plan.kernels):
        if not (isinstance(pv, LibraryKernel) and pv.op == "matmul" and len(pv.outputs) == 1):
            continue
        p_buf, v = pv.inputs
        j = writer.get(p_buf)
        sm = lib(j)
        if sm is None or sm.op != "softmax" or j is None or not private(p_buf, i):
            continue
        rank = len(plan.buffer(p_buf).dims)
        if int(sm.params.get("dim", -1)) % rank != rank - 1:
            continue
        links, scale, s_buf = [j, i], 1.0, sm.inputs[0]
        h = writer.get(s_buf)
        k_scale = lib(h)
        if k_scale is not None and h is not None and k_scale.op == "unary":
            if k_scale.params.get("op") != "mul_scalar" or "shift_dims" in k_scale.params:
                continue
            if not private(s_buf, j):
                continue
            scale = float(k_scale.params["params"][0])
            links.insert(0, h)
            j, s_buf = h, k_scale.inputs[0]
            h = writer.get(s_buf)
        qk = lib(h)
        if qk is None or h is None or qk.op != "matmul" or not private(s_buf, j):
            continue
        q, kt = qk.inputs
        links.insert(0, h)
        dims = [plan.buffer(b).dims for b in (q, kt, v, pv.outputs[0])]
        if len({len(d) for d in dims}) != 1 or len({d[:-2] for d in dims}) != 1:
            continue
        (*_, m, d), (*_, d2, n), (*_, n2, _dv) = dims[:3]
        if d != d2 or n != n2 or not math.isfinite(scale):
            continue
        # Kᵀ written by a library transpose of K: SDPA reads K itself, with no copy
        t = writer.get(kt)
        tr = lib(t)
        rank = len(dims[1])
        swap = [*range(rank - 2), rank - 1, rank - 2]
        if tr is not None and t is not None and tr.op == "permute" and private(kt, h):
            if [int(x) for x in tr.params.get("perm", ())] == swap:
                links.insert(0, t)
                chains.append(
                    AttentionChain(tuple(links), q, kt, v, pv.outputs[0], scale, k=tr.inputs[0])
                )
                continue
        if m >= min_query_rows:  # K is copied (see the module doc)
            chains.append(AttentionChain(tuple(links), q, kt, v, pv.outputs[0], scale))
    return chains


def sdpa_lines(plan: Plan, chain: AttentionChain, names: dict[int, str]) -> list[str]:
    """Python lines computing ``chain``'s output buffer with one SDPA call: the heads as one
    batch of a 4-D call (SDPA runs 3-D inputs through its unfused fallback), in the 16-bit
    dtype of the operands where one is 16-bit (as the library matmuls multiply), K copied
    into rows of d."""
    k_buf = chain.kt if chain.k is None else chain.k
    bufs = [plan.buffer(b) for b in (chain.q, k_buf, chain.v)]
    # the matmul multiplied in the 16-bit dtype of its graph operands (not of Kᵀ's
    # float32 copy where a transpose wrote it)
    operands = bufs if chain.k is None else [*bufs, plan.buffer(chain.kt)]
    low = [d for d in ("float16", "bfloat16") if d in {b.dtype for b in operands}]
    cd = TORCH_DTYPE[low[0]] if low else "torch.float32"
    q, _, v = bufs
    heads = math.prod(q.dims[:-2])
    (m, d), (n, dv) = q.dims[-2:], v.dims[-2:]
    out = plan.buffer(chain.out)
    qn, kn, vn = (names[b.id] for b in bufs)
    if chain.k is None:
        k_lines = [
            "from yirage_triton import transposed_copy as _yr_transposed_copy",
            f"_yr_k = _yr_transposed_copy({kn}.to({cd}).reshape(1, {heads}, {d}, {n}))",
        ]
    else:
        k_lines = [f"_yr_k = {kn}.to({cd}).reshape(1, {heads}, {n}, {d})"]
    return [
        f"# library attention {list(chain.kernels)} -> [{chain.out}] as one fused call",
        f"_yr_q = {qn}.to({cd}).reshape(1, {heads}, {m}, {d})",
        *k_lines,
        f"_yr_v = {vn}.to({cd}).reshape(1, {heads}, {n}, {dv})",
        f"{names[out.id]} = torch.nn.functional.scaled_dot_product_attention("
        f"_yr_q, _yr_k, _yr_v, scale={fmt_float(chain.scale)})"
        f".to({TORCH_DTYPE[out.dtype]}).reshape({tuple(out.dims)}).contiguous()",
    ]
