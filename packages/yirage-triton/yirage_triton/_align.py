"""Graph inputs whose rows are not 16-byte aligned, staged into row-padded copies.

A row-major buffer whose last dim holds a byte count no multiple of 16 (Kᵀ ``[h, d, kv]`` of
float16 with an odd kv) starts each row off alignment: Triton then loads it element by element,
without vector or asynchronous copies, and a kernel that reads it many times over (attention's
K, read by every query tile) slows down by half (kv 4099 against 4104 on an H200: 1022
against 661 µs). Where :attr:`~yirage_triton.TritonOptions.align_rows` is set, the launcher
copies such an input once into a buffer whose rows are padded to 16 bytes (the padding is never
read: the plan masks every dim at its extent) and the kernels address it with the padded row
stride. The copy reads and writes the input once, so it only pays where kernels reread it:
only inputs that some kernel's blocks read several times over (grid axes the access does not
move along) and of at least ``MIN_BYTES`` are staged, and the backend offers it as a variant of
its own, which the race decides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from yirage.plan import Buffer, Plan

__all__ = ["PaddedRows", "misaligned_inputs", "padded_view"]

#: Row alignment (bytes) of vector and asynchronous copies.
ALIGN_BYTES = 16
#: Smaller inputs are not staged: a copy's launch costs more than their loads.
MIN_BYTES = 256 * 1024
_AXES = ("bx", "by", "bz")


@dataclass(frozen=True)
class PaddedRows(Buffer):
    """A buffer addressed with its last dim padded to ``row`` elements."""

    row: int = 0

    @property
    def numel(self) -> int:
        return super().numel // self.dims[-1] * self.row

    @property
    def strides(self) -> tuple[int, ...]:
        out = [1]
        acc = self.row
        for d in reversed(self.dims[:-1]):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))


def misaligned_inputs(plan: Plan) -> dict[int, int]:
    """Graph input buffer id → padded row length, for the inputs whose rows are no multiple
    of 16 bytes, of at least ``MIN_BYTES``, that a generated kernel's blocks reread."""
    reread = set()
    for k in plan.generated:
        for a in k.inputs:
            moves = {t.var for dim in a.offsets for t in dim}
            if any(n > 1 and _AXES[i] not in moves for i, n in enumerate(k.grid)):
                reread.add(a.buffer)
    out = {}
    for b in plan.inputs:
        size = b.elem_bytes
        if (
            b.id in reread
            and len(b.dims) >= 2
            and b.numel * size >= MIN_BYTES
            and b.dims[-1] * size % ALIGN_BYTES
        ):
            per = ALIGN_BYTES // size
            out[b.id] = -(-b.dims[-1] // per) * per
    return out


def padded_view(plan: Plan, rows: dict[int, int]) -> Plan:
    """``plan`` with the buffers of ``rows`` addressed as :class:`PaddedRows`."""
    bufs = tuple(
        PaddedRows(b.id, b.dims, b.dtype, b.role, b.index, rows[b.id]) if b.id in rows else b
        for b in plan.buffers
    )
    return replace(plan, buffers=bufs)
