"""Graph builders shared by the tests: the RMSNorm + Linear reference and its µGraph."""

from __future__ import annotations

import yirage as yr


def rmsnorm_linear(b: int, k: int, n: int, eps: float = 1e-6) -> yr.KernelGraph:
    """O = rms_norm(X[b,k]) @ W[k,n] as two kernel operators."""
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(b, k), dtype=yr.float16)
    w = g.new_input(dims=(k, n), dtype=yr.float16)
    g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(k,), eps=eps), w))
    return g


def rmsnorm_linear_ugraph(
    b: int,
    k: int,
    n: int,
    *,
    grid: int = 8,
    forloop: int = 4,
    eps: float | None = None,
    x_fmap: int = 1,
    w_imap: tuple[int, int, int] = (1, -1, -1),
    w_fmap: int = 0,
    with_rms: bool = True,
) -> yr.KernelGraph:
    """The same computation as one customized operator: each of ``grid`` blocks computes
    ``n / grid`` output columns, looping ``forloop`` times over k; the RMS of X is
    accumulated alongside and divides the accumulated product after the loop."""
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(b, k), dtype=yr.float16)
    w = g.new_input(dims=(k, n), dtype=yr.float16)
    tb = yr.new_threadblock_graph(
        grid_dim=(grid, 1, 1), block_dim=(128, 1, 1), forloop_range=forloop, reduction_dimx=64
    )
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=x_fmap)
    bw = tb.new_input(w, input_map=w_imap, forloop_dim=w_fmap)
    out = tb.forloop_accum(tb.matmul(bx, bw))
    if with_rms:
        out = tb.div(out, tb.forloop_accum(bx, "rms", eps=eps))
    tb.new_output(out, output_map=(1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g
