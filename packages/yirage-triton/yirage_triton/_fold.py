"""Fold a kernel's leading unit batch dim into its rows before printing.

A kernel over batched tensors (attention's ``[b·h, s, d]``) tiles the batch dim by one: every
tile is ``[1, rows, cols]``. Printed as it is, each ``tl.dot`` is wrapped in reshapes to 2-D
and back, which costs Triton's Hopper pipeline its direct shared-memory operands (fused
attention prefill ran 6% slower on an H100) and makes Triton 3.6 assert on some tilings
(a LinearLayout ``reshapeOuts`` check, "PassManager::run failed"). Row-major buffers
``[B, A, …]`` are the same memory as ``[B·A, …]``, so such a kernel is printed as a rank-2
kernel over merged views of its buffers: a tile's batch offset becomes a row offset of
``A`` rows per batch (a masked row dim compares with the batch's own end, :class:`FoldedMask`).
The printer sees a plain 2-D kernel; nothing else changes (the host
code allocates and passes the plan's own buffers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from yirage.plan import Buffer, GeneratedKernel, MaskedDim, OffsetTerm, Plan, TileAccess, TileOp

__all__ = ["FoldedMask", "fold_unit_batch"]


@dataclass(frozen=True)
class FoldedMask(MaskedDim):
    """A masked row dim of a folded access: the merged row index ``batch·rows + row`` is
    compared with ``extent + batch·rows`` (``base``: the batch's offset terms, in rows)."""

    base: tuple[OffsetTerm, ...] = ()


def _accesses(k: GeneratedKernel) -> list[TileAccess]:
    out = [*k.inputs, *k.outputs]
    out += [a.shift_load.access for a in k.inputs if a.shift_load is not None]
    out += [g.shift_store for g in k.safe_softmax if g.shift_store is not None]
    return out


def _foldable(plan: Plan, k: GeneratedKernel) -> bool:
    ranks = {len(o.dims) for o in k.ops}
    if len(ranks) != 1:
        return False
    (rank,) = ranks
    if rank < 3 or any(o.dims[0] != 1 for o in k.ops):
        return False
    if any("dim" in o.attrs and o.attrs["dim"] == 0 for o in k.ops):
        return False
    for a in _accesses(k):
        buf = plan.buffer(a.buffer)
        if len(a.tile) != rank or len(buf.dims) != rank or a.tile[0] != 1:
            return False
        # an edge mask on the batch dim compares an index the fold merges away
        if any(m.dim == 0 for m in a.masked):
            return False
    return True


def _fold_access(a: TileAccess, rows_of: dict[int, int]) -> TileAccess:
    rows = rows_of[a.buffer]
    batch = tuple(replace(t, stride=t.stride * rows) for t in a.offsets[0])
    offsets = (batch + a.offsets[1], *a.offsets[2:])
    masked = tuple(
        FoldedMask(0, m.extent, batch) if m.dim == 1 else replace(m, dim=m.dim - 1)
        for m in a.masked
    )
    shift = a.shift_load
    if shift is not None:
        shift = replace(shift, access=_fold_access(shift.access, rows_of))
    return replace(a, tile=a.tile[1:], offsets=offsets, masked=masked, shift_load=shift)


def _fold_op(o: TileOp) -> TileOp:
    attrs = dict(o.attrs)
    if "dim" in attrs:
        attrs["dim"] = attrs["dim"] - 1
    masked = tuple(replace(m, dim=m.dim - 1) for m in o.masked)
    return replace(o, dims=o.dims[1:], attrs=attrs, masked=masked)


def fold_unit_batch(plan: Plan, k: GeneratedKernel) -> tuple[Plan, GeneratedKernel]:
    """``(plan, k)`` as the printer should see them: with the batch dim folded into the rows
    where every op and access of ``k`` has a leading unit dim (see the module doc), else
    unchanged."""
    if not _foldable(plan, k):
        return plan, k
    rows_of = {a.buffer: plan.buffer(a.buffer).dims[1] for a in _accesses(k)}

    def fold(a: TileAccess) -> TileAccess:
        return _fold_access(a, rows_of)

    merged: dict[int, Buffer] = {}
    for b in plan.buffers:
        if b.id in rows_of:
            merged[b.id] = replace(b, dims=(b.dims[0] * b.dims[1], *b.dims[2:]))
    view = replace(plan, buffers=tuple(merged.get(b.id, b) for b in plan.buffers))
    folded = replace(
        k,
        inputs=tuple(fold(a) for a in k.inputs),
        outputs=tuple(fold(a) for a in k.outputs),
        ops=tuple(_fold_op(o) for o in k.ops),
        safe_softmax=tuple(
            replace(g, shift_store=fold(g.shift_store)) if g.shift_store is not None else g
            for g in k.safe_softmax
        ),
    )
    return view, folded
