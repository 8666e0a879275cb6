"""RMSNorm of a plan's library kernel as one Triton kernel, for host code of printed plans.

The float32 printing of a library ``rms_norm`` of 16-bit X ran ``rms_norm(x.float(), ..)``:
a conversion kernel and torch's norm kernels, then, where a 16-bit matmul read the result,
another conversion. This kernel reads X in its own dtype, sums the squares in float32 and
writes the normalised row once, in the dtype its reader wants (see
:func:`yirage_triton._host.narrowed_intermediates`). One program per row; rows of up to
:data:`MAX_ONE_PASS` elements stay in registers, longer ones are read twice (the second time
from cache). Tensors on other devices than torch's "cuda" (NVIDIA and AMD GPUs) take torch's
``rms_norm`` in float32: the interpreter's CPU tensors, and Ascend's, where this kernel has
not been run.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["rms_norm_rows"]

#: Longest row normalised from registers in one pass (elements).
MAX_ONE_PASS = 8192


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def yr_rms_norm(  # type: ignore[no-untyped-def]
        x, w, out, cols, eps, HAS_W: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64) * cols
        offs = tl.arange(0, BLOCK)
        if ONE_PASS:
            m = offs < cols
            v = tl.load(x + row + offs, mask=m, other=0.0).to(tl.float32)
            r = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / cols + eps)
            y = v * r
            if HAS_W:
                y = y * tl.load(w + offs, mask=m, other=0.0).to(tl.float32)
            tl.store(out + row + offs, y.to(out.dtype.element_ty), mask=m)
        else:
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, cols, BLOCK):
                m = start + offs < cols
                v = tl.load(x + row + start + offs, mask=m, other=0.0).to(tl.float32)
                acc += v * v
            r = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + eps)
            for start in range(0, cols, BLOCK):
                m = start + offs < cols
                y = tl.load(x + row + start + offs, mask=m, other=0.0).to(tl.float32) * r
                if HAS_W:
                    y = y * tl.load(w + start + offs, mask=m, other=0.0).to(tl.float32)
                tl.store(out + row + start + offs, y.to(out.dtype.element_ty), mask=m)

    return yr_rms_norm


def rms_norm_rows(x: Any, normalized_dims: int, weight: Any, eps: float, dtype: Any) -> Any:
    """``rms_norm`` of torch tensor ``x`` over its last ``normalized_dims`` dims (``weight``:
    their shape's elements, or None), computed in float32 and returned in ``dtype``."""
    import torch

    shape = tuple(x.shape[-normalized_dims:])
    if x.device.type != "cuda" or not x.is_contiguous() or x.numel() == 0:
        w = None if weight is None else weight.float().reshape(shape)
        return torch.nn.functional.rms_norm(x.float(), shape, w, eps).to(dtype)
    import triton

    cols = 1
    for d in shape:
        cols *= int(d)
    rows = x.numel() // cols
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    w = x if weight is None else weight.reshape(-1).contiguous()
    one_pass = cols <= MAX_ONE_PASS
    block = triton.next_power_of_2(cols) if one_pass else 2048
    _kernel()[(rows,)](
        x,
        w,
        out,
        cols,
        float(eps),
        HAS_W=weight is not None,
        BLOCK=block,
        ONE_PASS=one_pass,
        num_warps=8 if block >= 2048 else 4,
    )
    return out
