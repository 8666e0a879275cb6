"""A contiguous copy of a tensor with its last two dims swapped, for host code of printed
plans: the fused-attention printing turns the graph's Kᵀ into K's rows with it.

torch's own copy of a transposed view (``x.transpose(-1, -2).contiguous()``) moved a
``[32, 128, 4096]`` float16 Kᵀ in 96.9 µs on an H200; a tiled Triton kernel (each program
loads a 64 x 64 tile and stores it transposed) took 19.5 µs
(``benchmarks/probes/sdpa_layout_probe.py``). On devices other than torch's "cuda" (NVIDIA
and AMD GPUs) torch copies.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["transposed_copy"]

#: Rows and columns of one program's tile.
TILE = 64


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def yr_transpose(src, dst, rows, cols, TR: tl.constexpr, TC: tl.constexpr):  # type: ignore[no-untyped-def]
        # src [B, rows, cols] -> dst [B, cols, rows]; 64-bit offsets past 2**31 elements
        base = tl.program_id(2).to(tl.int64) * rows * cols
        r = tl.program_id(0) * TR + tl.arange(0, TR)
        c = tl.program_id(1) * TC + tl.arange(0, TC)
        inside = (r[:, None] < rows) & (c[None, :] < cols)
        tile = tl.load(src + base + r[:, None] * cols + c[None, :], mask=inside)
        tl.store(dst + base + c[None, :] * rows + r[:, None], tile, mask=inside)

    return yr_transpose


def transposed_copy(x: Any) -> Any:
    """``x.transpose(-1, -2).contiguous()`` of a contiguous torch tensor of rank ≥ 2."""
    *lead, rows, cols = x.shape if x.dim() >= 2 else (0, 0)
    batch = x.numel() // max(1, rows * cols)
    # grid dims 1 and 2 stop at 65535 programs
    fits = batch <= 65535 and -(-cols // TILE) <= 65535
    if x.device.type != "cuda" or not x.is_contiguous() or x.dim() < 2 or not fits:
        return x.transpose(-1, -2).contiguous()
    import torch
    import triton

    out = torch.empty((*lead, cols, rows), dtype=x.dtype, device=x.device)
    if out.numel():
        grid = (triton.cdiv(rows, TILE), triton.cdiv(cols, TILE), batch)
        _kernel()[grid](x, out, rows, cols, TR=TILE, TC=TILE)
    return out
