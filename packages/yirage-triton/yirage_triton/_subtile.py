"""Finer for-loops: a generated kernel whose loop streams chunks of its inputs, printed with
each chunk cut into ``f`` consecutive smaller chunks and ``f`` times the iterations.

A weight-streaming kernel (RMSNorm + Linear, gated MLP at decode sizes) keeps more loads in
flight with small chunks and a deep pipeline than with the plan's big chunks, whose stage
buffers leave room for two or three stages: on the H100 a hand-written RMSNorm + Linear b16
ran 20.0 µs with 128-row chunks and 5 stages against 24.1 with 512-row chunks and 3, gated
MLP 24.6 against 26.4 (benchmarks/probes/gemv_probe.py). The search's cost model does not see
pipelines, so the backend offers the finer printing as a variant and profiling decides.

Where the walked dim ends in a masked last chunk (the loop does not divide it), the finer
loop stops at the first small chunk that reaches the extent, since the printer masks only the
last iteration (cutting the iterations alone let the chunks before it read past the extent).

The rewrite changes nothing the plan computes as long as everything that walks the loop is
summed over it: chunks feed elementwise ops, the contracted dim of a matmul, or a reduction
over the walked dim, and a per-chunk sum only reaches an ``iter``/``sum`` accumulator.
:func:`subtile_kernel` checks exactly that and refuses everything else.
"""

from __future__ import annotations

from dataclasses import replace

from yirage.plan import GeneratedKernel, OffsetTerm, TileAccess, TileOp

__all__ = ["FINE_CHUNK", "loop_subtile", "subtile_kernel"]

#: rows per chunk of the finer printing (the best chunk for both probes above)
FINE_CHUNK = 128


def _walk_dim(acc: TileAccess) -> int | bool | None:
    """The one dim along which ``acc`` walks the loop (None: it does not walk; False: it walks
    in a way the rewrite does not handle)."""
    dims = [d for d, terms in enumerate(acc.offsets) if any(t.var == "iter" for t in terms)]
    if not dims:
        return None
    if len(dims) != 1:
        return False
    d = dims[0]
    steps = [t.stride for t in acc.offsets[d] if t.var == "iter"]
    if len(steps) != 1 or steps[0] != acc.tile[d]:
        return False  # not consecutive chunks
    return d


def _chunk(k: GeneratedKernel) -> int | None:
    """The extent of every walking input's chunk, if they agree."""
    sizes = set()
    for acc in k.inputs:
        d = _walk_dim(acc)
        if d is False:
            return None
        if d is not None:
            sizes.add(acc.tile[d])
    return sizes.pop() if len(sizes) == 1 else None


def _fine_range(k: GeneratedKernel, sub: int) -> int | None:
    """The iterations of the finer loop where the walked dim ends in a masked last chunk
    (the chunks of ``sub`` up to the extent: the printer masks the last iteration only, so
    the overrun must stay within it), 0 where no walking input is masked along its walk,
    None where the walking inputs disagree on the extent."""
    ends: set[int | None] = set()  # each walking input's masked extent (None: unmasked)
    for acc in k.inputs:
        d = _walk_dim(acc)
        if d is not None and d is not False:
            ends.add(next((m.extent for m in acc.masked if m.dim == d), None))
    if len(ends) > 1:
        return None  # masked and unmasked walkers, or different extents
    end = ends.pop() if ends else None
    return 0 if end is None else -(-end // sub)


def subtile_kernel(k: GeneratedKernel, f: int) -> GeneratedKernel | None:
    """``k`` with every loop chunk cut into ``f`` (``f`` times the iterations), or None where
    that could change the result (see the module docstring)."""
    chunk = _chunk(k)
    if f < 2 or chunk is None or chunk % f or k.safe_softmax or k.shift_carry is not None:
        return None  # (a running max's tiles are not cut: their maxima span whole chunks)
    if any(acc.uses_iter() for acc in k.outputs):
        return None
    loops = _fine_range(k, chunk // f)
    if loops is None:
        return None
    walk: dict[int, int | None] = {}  # op id -> the dim walking the loop
    partial: set[int] = set()  # ops holding a sum over one chunk
    for o in k.ops:
        ins = [walk[a] for a in o.args]
        if any(a in partial for a in o.args) and not (
            o.op == "accum" and o.attr("acc") in ("iter", "sum")
        ):
            return None
        w: int | None = None
        if o.op == "input":
            d = _walk_dim(k.inputs[o.attr("input")])
            w = None if d is False else d  # (_chunk refused inputs that walk otherwise)
        elif o.op == "unary":
            w = ins[0]
        elif o.op == "binary":
            ds = {d for d in ins if d is not None}
            if len(ds) > 1:
                return None
            if ds:
                w = ds.pop()
                if any(
                    d is None and k.op(a).dims[w] != 1 for a, d in zip(o.args, ins, strict=True)
                ):
                    return None  # a fixed operand spans the walked dim
        elif o.op == "matmul":
            r = len(o.dims)
            if ins == [r - 1, r - 2]:
                partial.add(o.id)
            elif ins != [None, None]:
                return None
        elif o.op == "reduction":
            if ins[0] is not None and ins[0] == o.attr("dim"):
                partial.add(o.id)
            else:
                w = ins[0]
        elif o.op == "accum":
            kind, x = o.attr("acc"), ins[0]
            if kind == "iter" and x is not None:
                return None
            if kind in ("sum", "rms") and x not in (None, len(o.dims) - 1):
                return None
            if kind == "rms" and o.args[0] in partial:
                return None
            if kind == "sum_todimx" and x is not None:
                return None
        elif any(d is not None for d in ins):
            return None  # rms_norm, concat, reduction to dimx over a walking tile
        walk[o.id] = w
    inputs = []
    for acc in k.inputs:
        d = _walk_dim(acc)
        if d is None or d is False:
            inputs.append(acc)
            continue
        tile = list(acc.tile)
        tile[d] //= f
        offsets = list(acc.offsets)
        offsets[d] = tuple(
            OffsetTerm("iter", t.stride // f) if t.var == "iter" else t for t in acc.offsets[d]
        )
        inputs.append(replace(acc, tile=tuple(tile), offsets=tuple(offsets)))
    ops: list[TileOp] = []
    for o in k.ops:
        w = walk[o.id]
        if w is None:
            ops.append(o)
            continue
        dims = list(o.dims)
        dims[w] //= f
        ops.append(replace(o, dims=tuple(dims)))
    return replace(
        k,
        forloop_range=loops if loops else k.forloop_range * f,
        inputs=tuple(inputs),
        ops=tuple(ops),
        # the estimate is mostly stage buffers, which shrink with the chunks; the printer
        # only uses it to choose a pipeline depth, and the runtime lowers one that does not fit
        smem_bytes=max(1, k.smem_bytes // f),
    )


def loop_subtile(k: GeneratedKernel) -> int:
    """How many ways the finer printing cuts ``k``'s chunks (1: it is not printed): down to
    :data:`FINE_CHUNK` rows where the rewrite applies."""
    chunk = _chunk(k)
    if chunk is None or chunk <= FINE_CHUNK or chunk % FINE_CHUNK:
        return 1
    f = chunk // FINE_CHUNK
    return f if subtile_kernel(k, f) is not None else 1
