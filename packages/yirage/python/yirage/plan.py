"""KernelPlan (``yirage.kernel_plan``, docs/kernel-plan.md) parsed into typed records.

Backends' printers read plans only through these records, so every check a printer relies on
(references resolve, tiles divide and stay inside their tensor, ops are ordered, phases are
legal) is made once, here, with messages that name the kernel and the op.

Version 3 plans also carry the analyses printers used to repeat, decided once by the core's
lowering: loop-invariant ops have phase ``pre`` (:attr:`TileOp.hoisted`), a matmul that adds
straight into its accumulator names it (:attr:`TileOp.accumulate_into`), every safe-softmax
group lists the accumulators to rescale with their degree (:attr:`SafeSoftmax.rescale`), and
every generated kernel its loop split (:attr:`GeneratedKernel.loop_split`). This reader checks
that they are consistent; it derives none of them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from yirage._errors import BackendError, SerializationError

__all__ = [
    "ACCUMS",
    "BINARY_OPS",
    "DTYPES",
    "UNARY_OPS",
    "Buffer",
    "CodegenError",
    "GeneratedKernel",
    "LibraryKernel",
    "MaskedDim",
    "OffsetTerm",
    "Plan",
    "PlanError",
    "Rescale",
    "SafeSoftmax",
    "ShiftCarry",
    "ShiftLoad",
    "TileAccess",
    "TileOp",
    "parse_plan",
    "refuse_masked",
]

FORMAT = "yirage.kernel_plan"
VERSION = 3
DTYPES = ("float16", "bfloat16", "float32")
UNARY_OPS = (
    "exp",
    "square",
    "sqrt",
    "rsqrt",
    "silu",
    "gelu",
    "relu",
    "sigmoid",
    "tanh",
    "neg",
    "mul_scalar",
    "add_scalar",
    "clamp",
)
UNARY_NPARAMS = {"mul_scalar": 1, "add_scalar": 1, "clamp": 2}
BINARY_OPS = ("add", "sub", "mul", "div", "pow")
ACCUMS = ("iter", "sum", "rms", "sum_todimx")
TILE_OPS = (
    "input",
    "matmul",
    "unary",
    "binary",
    "reduction",
    "reduction_to_dimx",
    "rms_norm",
    "concat",
    "accum",
)
LIBRARY_OPS = (
    "matmul",
    "unary",
    "binary",
    "reduction",
    "rms_norm",
    "softmax",
    "concat",
    "chunk",
    "reduce_max",
    "permute",
    "reshape",
    "all_reduce",
)
PHASES = ("pre", "loop", "accum", "epilogue")
GRID_VARS = ("bx", "by", "bz")
OFFSET_VARS = (*GRID_VARS, "iter")


class PlanError(SerializationError):
    """A KernelPlan that is malformed or inconsistent (the message names kernel and op)."""


class CodegenError(BackendError):
    """A valid plan that this printer cannot implement (e.g. tiles beyond the device limits)."""


@dataclass(frozen=True)
class Buffer:
    id: int
    dims: tuple[int, ...]
    dtype: str
    role: str
    index: int | None

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def elem_bytes(self) -> int:
        """Bytes of one element (a plan's dtypes: float32, or a 16-bit one)."""
        return 4 if self.dtype == "float32" else 2

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides."""
        out = []
        acc = 1
        for d in reversed(self.dims):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))


@dataclass(frozen=True)
class OffsetTerm:
    var: str
    stride: int


@dataclass(frozen=True)
class ShiftLoad:
    """Where the running maxima of a shifted input tile are: ``access`` is a tile of the max
    buffer whose column ``c`` holds the max of the input tile's columns
    ``c·width .. (c+1)·width - 1``."""

    access: TileAccess
    width: int


@dataclass(frozen=True)
class MaskedDim:
    """A tile dim of a masked edge tile: the grid (or, for an input, the loop) does not
    divide the buffer's ``extent`` along it, so the last block's (iteration's) tile runs past
    it; loads read zeros there and stores skip it."""

    dim: int
    extent: int


@dataclass(frozen=True)
class TileAccess:
    """A tile load (kernel input) or store (kernel output)."""

    buffer: int
    tile: tuple[int, ...]
    offsets: tuple[tuple[OffsetTerm, ...], ...]
    src: int | None = None  # outputs: the op whose value is stored
    shift_load: ShiftLoad | None = None  # inputs: a partial stored shifted by exp(-m)
    #: dims whose last block's tile runs past the buffer (masked edge tiles)
    masked: tuple[MaskedDim, ...] = ()

    def uses_iter(self) -> bool:
        return any(t.var == "iter" for dim in self.offsets for t in dim)


@dataclass(frozen=True)
class TileOp:
    id: int
    op: str
    args: tuple[int, ...]
    dims: tuple[int, ...]
    phase: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    #: matmuls: the ``iter`` accumulator (its only reader, same dims) that the product is
    #: added into directly; None: the product is a tile of its own
    accumulate_into: int | None = None
    #: a loop exp whose input carries a masked loop's padding along ``masked[0].dim``: in
    #: iteration ``it`` the elements ``it * dims[dim] + j >= extent`` are padding, which the
    #: exp maps to zero (fill -inf before the exp and its safe-softmax max)
    masked: tuple[MaskedDim, ...] = ()

    def attr(self, name: str) -> Any:
        return self.attrs[name]

    @property
    def hoisted(self) -> bool:
        """Computed once before the loop (phase ``pre``: its value is the same in every
        iteration, a load that does not walk the loop or an op of such values)."""
        return self.phase == "pre"


@dataclass(frozen=True)
class Rescale:
    """An accumulator of a safe-softmax group: multiplied by ``exp(m_old - m_new)**degree``
    before each update (it holds ``exp(-m)**degree`` times its exact value)."""

    accum: int
    degree: int


@dataclass(frozen=True)
class SafeSoftmax:
    exp: int
    accums: tuple[int, ...]
    #: outputs stored shifted by exp(-m) (m stored at ``shift_store``)
    scale_outputs: tuple[int, ...]
    shift_store: TileAccess | None = None
    #: the accumulators to rescale and their degree (empty when the exp is hoisted)
    rescale: tuple[Rescale, ...] = ()


@dataclass(frozen=True)
class ShiftCarry:
    """A kernel reading shifted partials: its shifted inputs (indices into ``inputs``) and
    the accumulators rescaled to its running max of their maxima."""

    inputs: tuple[int, ...]
    accums: tuple[int, ...]


@dataclass(frozen=True)
class LibraryKernel:
    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    params: Mapping[str, Any]
    kind: str = "library"


@dataclass(frozen=True)
class GeneratedKernel:
    name: str
    grid: tuple[int, int, int]
    block_threads: int
    warps: int
    forloop_range: int
    inputs: tuple[TileAccess, ...]
    ops: tuple[TileOp, ...]
    outputs: tuple[TileAccess, ...]
    safe_softmax: tuple[SafeSoftmax, ...]
    smem_bytes: int
    shift_carry: ShiftCarry | None = None
    #: ways a GPU printer splits the for-loop across extra blocks (1: not split)
    loop_split: int = 1
    kind: str = "generated"

    @property
    def blocks(self) -> int:
        """Thread blocks of the grid."""
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def masked_accesses(self) -> tuple[tuple[str, TileAccess], ...]:
        """(``"input i"``/``"output i"``, access) of every load/store with masked edge tiles."""
        named = [(f"input {i}", a) for i, a in enumerate(self.inputs)]
        named += [(f"output {i}", a) for i, a in enumerate(self.outputs)]
        return tuple((n, a) for n, a in named if a.masked)

    def op(self, op_id: int) -> TileOp:
        for op in self.ops:
            if op.id == op_id:
                return op
        raise KeyError(op_id)

    def consumers(self, op_id: int) -> list[TileOp]:
        return [o for o in self.ops if op_id in o.args]

    def invariant_ops(self) -> set[int]:
        """Ops whose value is the same in every iteration (printers hoist them before the
        loop): the core marks them ``pre``."""
        return {o.id for o in self.ops if o.hoisted}

    def fused_accums(self) -> dict[int, int]:
        """Accumulator id -> the matmul that adds into it directly (``accumulate_into``)."""
        return {o.accumulate_into: o.id for o in self.ops if o.accumulate_into is not None}


@dataclass(frozen=True)
class Plan:
    graph_hash: str
    buffers: tuple[Buffer, ...]
    kernels: tuple[LibraryKernel | GeneratedKernel, ...]
    text: str  # canonical JSON of the plan (sorted keys), the basis of cache keys

    def buffer(self, buffer_id: int) -> Buffer:
        for b in self.buffers:
            if b.id == buffer_id:
                return b
        raise KeyError(buffer_id)

    @property
    def inputs(self) -> list[Buffer]:
        """Input buffers in graph-input order."""
        return sorted((b for b in self.buffers if b.role == "input"), key=lambda b: b.index or 0)

    @property
    def outputs(self) -> list[Buffer]:
        """Output buffers in graph-output order."""
        return sorted((b for b in self.buffers if b.role == "output"), key=lambda b: b.index or 0)

    @property
    def intermediates(self) -> list[Buffer]:
        return [b for b in self.buffers if b.role == "intermediate"]

    @property
    def generated(self) -> list[GeneratedKernel]:
        return [k for k in self.kernels if isinstance(k, GeneratedKernel)]

    @property
    def compute_dtype(self) -> str:
        """The 16-bit dtype of the graph's inputs if any (tensor-core operand type), else fp32."""
        for b in self.inputs:
            if b.dtype in ("float16", "bfloat16"):
                return b.dtype
        return "float32"


# ---------------------------------------------------------------------------------------------
# parsing


def _err(where: str, msg: str) -> PlanError:
    return PlanError(f"kernel plan: {where}: {msg}")


def _int(v: Any, where: str, what: str, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _err(where, f"{what} must be an int, got {v!r}")
    if minimum is not None and v < minimum:
        raise _err(where, f"{what} must be ≥ {minimum}, got {v}")
    return v


def _dims(v: Any, where: str, what: str) -> tuple[int, ...]:
    if not isinstance(v, Sequence) or isinstance(v, str) or not 1 <= len(v) <= 4:
        raise _err(where, f"{what} must be a list of 1 to 4 ints, got {v!r}")
    return tuple(_int(x, where, what, 1) for x in v)


def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(obj, Mapping):
        raise _err(where, f"expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise _err(where, f"missing field {key!r}")
    return obj[key]


def _offsets(v: Any, rank: int, where: str) -> tuple[tuple[OffsetTerm, ...], ...]:
    if not isinstance(v, Sequence) or len(v) != rank:
        raise _err(where, f"offsets must have one list per dim ({rank}), got {v!r}")
    out = []
    for d, terms in enumerate(v):
        if not isinstance(terms, Sequence):
            raise _err(where, f"offsets[{d}] must be a list")
        row = []
        for t in terms:
            var = _get(t, "var", where)
            if var not in OFFSET_VARS:
                raise _err(where, f"offset var {var!r} is not one of {OFFSET_VARS}")
            row.append(OffsetTerm(var, _int(_get(t, "stride", where), where, "stride", 0)))
        out.append(tuple(row))
    return tuple(out)


def _check_access(
    acc: TileAccess, buf: Buffer, grid: tuple[int, int, int], forloop: int, where: str
) -> None:
    if len(acc.tile) != len(buf.dims):
        raise _err(
            where, f"tile {list(acc.tile)} has another rank than buffer {buf.id} {list(buf.dims)}"
        )
    extent = {"bx": grid[0], "by": grid[1], "bz": grid[2], "iter": forloop}
    masked = {m.dim: m for m in acc.masked}
    for d, (t, n) in enumerate(zip(acc.tile, buf.dims, strict=True)):
        if t > n:
            raise _err(where, f"tile dim {d} ({t}) exceeds buffer dim {n}")
        hi = sum((extent[term.var] - 1) * term.stride for term in acc.offsets[d])
        if d in masked:
            _check_masked(masked[d], acc.offsets[d], hi, n, where)
        elif hi + t > n:
            raise _err(
                where,
                f"tile dim {d} reaches {hi + t} > buffer {buf.id} dim {n} "
                f"(offset {' + '.join(f'{x.var}*{x.stride}' for x in acc.offsets[d]) or '0'})",
            )


def _check_masked(m: MaskedDim, terms: Sequence[OffsetTerm], last: int, n: int, where: str) -> None:
    """A masked dim: the buffer's extent, walked by grid blocks or by the loop (not both),
    the last tile starting inside it."""
    w = f"{where} masked dim {m.dim}"
    if m.extent != n:
        raise _err(w, f"extent {m.extent} is not the buffer's dim {n}")
    if len({term.var == "iter" for term in terms if term.stride}) > 1:
        raise _err(w, "a masked dim is walked by grid blocks or by the loop, not both")
    if last >= n:
        raise _err(w, f"the last tile starts at {last}, past the extent {n}")


def _masked(raw: Any, rank: int, where: str) -> tuple[MaskedDim, ...]:
    """An access's ``masked`` list: distinct dims in increasing order."""
    out: list[MaskedDim] = []
    for i, r in enumerate(raw or []):
        w = f"{where} masked {i}"
        dim = _int(_get(r, "dim", w), w, "dim", 0)
        if dim >= rank or (out and dim <= out[-1].dim):
            raise _err(w, f"dim {dim}: expected distinct dims of the tile in increasing order")
        out.append(MaskedDim(dim, _int(_get(r, "extent", w), w, "extent", 1)))
    return tuple(out)


def refuse_masked(plan: Plan, printer: str) -> None:
    """CodegenError for a plan with masked edge tiles, for printers that do not mask."""
    for k in plan.generated:
        for name, acc in k.masked_accesses:
            m = acc.masked[0]
            raise CodegenError(
                f"kernel {k.name!r} {name}: {printer} does not print masked edge tiles (dim "
                f"{m.dim}: tiles of {acc.tile[m.dim]} over an extent of {m.extent}); search "
                "for this backend's device spec, whose grids divide every split dim"
            )


def _broadcast(a: Sequence[int], b: Sequence[int], where: str) -> tuple[int, ...]:
    if len(a) != len(b):
        raise _err(where, f"binary operands of rank {len(a)} and {len(b)}")
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            raise _err(where, f"dims {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _expected_dims(op: TileOp, by_id: Mapping[int, TileOp], where: str) -> tuple[int, ...] | None:
    """Result dims implied by the operands (None: not derivable, e.g. inputs)."""
    a = [by_id[x].dims for x in op.args]
    kind = op.op
    if kind == "matmul":
        x, y = a
        if len(x) != len(y) or len(x) < 2 or x[:-2] != y[:-2] or x[-1] != y[-2]:
            raise _err(where, f"matmul of {list(x)} and {list(y)}")
        return (*x[:-1], y[-1])
    if kind == "unary" or kind == "rms_norm":
        return a[0]
    if kind == "binary":
        return _broadcast(a[0], a[1], where)
    if kind == "reduction":
        d = op.attr("dim")
        return tuple(1 if i == d else n for i, n in enumerate(a[0]))
    if kind == "reduction_to_dimx":
        d, dimx = op.attr("dim"), op.attr("dimx")
        if a[0][d] % dimx:
            raise _err(where, f"dim {d} ({a[0][d]}) is not a multiple of dimx {dimx}")
        return tuple(dimx if i == d else n for i, n in enumerate(a[0]))
    if kind == "concat":
        d = op.attr("dim")
        base = list(a[0])
        for other in a[1:]:
            if len(other) != len(base) or any(
                i != d and p != q for i, (p, q) in enumerate(zip(base, other, strict=True))
            ):
                raise _err(where, f"concat along {d} of {[list(x) for x in a]}")
        base[d] = sum(x[d] for x in a)
        return tuple(base)
    if kind == "accum":
        acc = op.attr("acc")
        x = a[0]
        if acc == "iter":
            return x
        if acc in ("sum", "rms"):
            return (*x[:-1], 1)
        dimx = op.attr("dimx")
        if x[-1] % dimx:
            raise _err(where, f"sum_todimx: last dim {x[-1]} is not a multiple of dimx {dimx}")
        return (*x[:-1], dimx)
    return None


_ARITY = {
    "matmul": 2,
    "unary": 1,
    "binary": 2,
    "reduction": 1,
    "reduction_to_dimx": 1,
    "rms_norm": 1,
    "accum": 1,
}


def _parse_op(raw: Any, kname: str, n_inputs: int) -> TileOp:
    where = f"kernel {kname!r} op {raw.get('id') if isinstance(raw, Mapping) else raw!r}"
    op_id = _int(_get(raw, "id", where), where, "id", 0)
    kind = _get(raw, "op", where)
    if kind not in TILE_OPS:
        raise _err(where, f"unknown tile op {kind!r}; expected one of {TILE_OPS}")
    phase = _get(raw, "phase", where)
    if phase not in PHASES:
        raise _err(where, f"phase {phase!r} is not one of {PHASES}")
    dims = _dims(_get(raw, "dims", where), where, "dims")
    args = tuple(_int(x, where, "arg", 0) for x in raw.get("args", []))
    attrs: dict[str, Any] = {}
    if kind == "input":
        attrs["input"] = _int(_get(raw, "input", where), where, "input", 0)
        if attrs["input"] >= n_inputs:
            raise _err(where, f"input {attrs['input']} but the kernel has {n_inputs} inputs")
        if args:
            raise _err(where, "input ops take no args")
    elif kind == "concat":
        if len(args) < 2:
            raise _err(where, "concat needs at least two args")
    elif len(args) != _ARITY[kind]:
        raise _err(where, f"{kind} takes {_ARITY[kind]} args, got {len(args)}")
    if kind == "unary":
        name = _get(raw, "unop", where)
        if name not in UNARY_OPS:
            raise _err(where, f"unknown unary op {name!r}")
        params = [float(p) for p in raw.get("params", [])]
        if len(params) != UNARY_NPARAMS.get(name, 0):
            raise _err(where, f"{name} takes {UNARY_NPARAMS.get(name, 0)} params, got {params}")
        attrs["unop"] = name
        attrs["params"] = tuple(params)
    elif kind == "binary":
        name = _get(raw, "binop", where)
        if name not in BINARY_OPS:
            raise _err(where, f"unknown binary op {name!r}")
        attrs["binop"] = name
    elif kind in ("reduction", "concat"):
        attrs["dim"] = _int(_get(raw, "dim", where), where, "dim", 0)
    elif kind == "reduction_to_dimx":
        attrs["dim"] = _int(_get(raw, "dim", where), where, "dim", 0)
        attrs["dimx"] = _int(_get(raw, "dimx", where), where, "dimx", 1)
    elif kind == "rms_norm":
        attrs["eps"] = float(_get(raw, "eps", where))
    elif kind == "accum":
        acc = _get(raw, "acc", where)
        if acc not in ACCUMS:
            raise _err(where, f"unknown accumulator {acc!r}; expected one of {ACCUMS}")
        attrs["acc"] = acc
        if acc == "rms":
            attrs["eps"] = float(raw.get("eps", 0.0))
            attrs["extent"] = _int(_get(raw, "extent", where), where, "extent", 1)
        if acc == "sum_todimx":
            attrs["dimx"] = _int(_get(raw, "dimx", where), where, "dimx", 1)
        if phase != "accum":
            raise _err(where, f"accumulators have phase 'accum', got {phase!r}")
    if kind != "accum" and phase == "accum":
        raise _err(where, f"only accumulators have phase 'accum' (op is {kind!r})")
    into = raw.get("accumulate_into")
    if into is not None:
        into = _int(into, where, "accumulate_into", 0)
        if kind != "matmul":
            raise _err(where, f"only matmuls accumulate into an accumulator (op is {kind!r})")
    masked = _masked(raw.get("masked"), len(dims), where)
    if masked and (attrs.get("unop") != "exp" or phase != "loop" or len(masked) != 1):
        raise _err(where, "only a loop exp masks its padding, along one dim")
    return TileOp(op_id, kind, args, dims, phase, attrs, into, masked)


_PHASE_RANK = {"pre": 0, "loop": 1, "accum": 2, "epilogue": 3}


def _check_phases(k: GeneratedKernel) -> None:
    by_id = {o.id: o for o in k.ops}
    for o in k.ops:
        where = f"kernel {k.name!r} op {o.id}"
        srcs = [by_id[a].phase for a in o.args]
        if o.op == "input":
            if o.phase not in ("pre", "loop"):
                raise _err(where, f"input ops are 'pre' or 'loop', got {o.phase!r}")
            walks = k.inputs[o.attr("input")].uses_iter()
            if o.phase == "pre" and walks:
                raise _err(where, "a 'pre' input cannot depend on the loop index")
            if o.phase == "loop" and not walks:
                raise _err(
                    where,
                    "the input does not walk the loop, so it is loaded once and must be 'pre' "
                    "(version 3 hoists it)",
                )
        elif o.phase == "pre":
            if any(p != "pre" for p in srcs):
                raise _err(where, "'pre' ops may only use 'pre' values")
        elif o.phase == "loop":
            if any(p not in ("pre", "loop") for p in srcs):
                raise _err(where, "'loop' ops may only use 'pre' and 'loop' values")
            if all(p == "pre" for p in srcs):
                raise _err(
                    where,
                    "its operands are all 'pre', so it is loop-invariant and must be 'pre' "
                    "(version 3 hoists it)",
                )
        elif o.phase == "accum":
            if any(p not in ("pre", "loop") for p in srcs):
                raise _err(where, "accumulators take 'pre' or 'loop' values")
        elif o.phase == "epilogue" and any(p == "loop" for p in srcs):
            raise _err(where, "epilogue ops cannot use loop values (accumulate them first)")


def _parse_generated(
    raw: Mapping[str, Any], idx: int, bufs: Mapping[int, Buffer]
) -> GeneratedKernel:
    name = str(raw.get("name", f"k{idx}"))
    where = f"kernel {name!r}"
    if not name.isidentifier():
        raise _err(where, "kernel names must be identifiers")
    grid_raw = _get(raw, "grid", where)
    if not isinstance(grid_raw, Sequence) or not 1 <= len(grid_raw) <= 3:
        raise _err(where, f"grid must be a list of up to 3 ints, got {grid_raw!r}")
    grid_l = [_int(g, where, "grid", 1) for g in grid_raw] + [1] * (3 - len(grid_raw))
    grid = (grid_l[0], grid_l[1], grid_l[2])
    block_threads = _int(raw.get("block_threads", 128), where, "block_threads", 1)
    warps = _int(raw.get("warps", max(1, block_threads // 32)), where, "warps", 1)
    forloop = _int(raw.get("forloop_range", 1), where, "forloop_range", 1)
    inputs = []
    for i, r in enumerate(_get(raw, "inputs", where)):
        w = f"{where} input {i}"
        buf_id = _int(_get(r, "buffer", w), w, "buffer", 0)
        if buf_id not in bufs:
            raise _err(w, f"unknown buffer {buf_id}")
        buf = bufs[buf_id]
        if "dims" in r and tuple(r["dims"]) != buf.dims:
            raise _err(w, f"dims {r['dims']} differ from buffer {buf_id} {list(buf.dims)}")
        tile = _dims(_get(r, "tile", w), w, "tile")
        acc = TileAccess(buf_id, tile, _offsets(_get(r, "offsets", w), len(tile), w))
        acc = replace(acc, masked=_masked(r.get("masked"), len(tile), w))
        _check_access(acc, buf, grid, forloop, w)
        if r.get("shift_load") is not None:
            acc = replace(acc, shift_load=_shift_load(r["shift_load"], acc, bufs, grid, forloop, w))
        inputs.append(acc)
    ops = [_parse_op(o, name, len(inputs)) for o in _get(raw, "ops", where)]
    seen: dict[int, TileOp] = {}
    for o in ops:
        w = f"{where} op {o.id}"
        if o.id in seen:
            raise _err(w, "duplicate op id")
        for a in o.args:
            if a not in seen:
                raise _err(w, f"arg {a} is not an earlier op")
        if o.op == "input":
            tile = inputs[o.attr("input")].tile
            if o.dims != tile:
                raise _err(w, f"dims {list(o.dims)} differ from the input tile {list(tile)}")
        else:
            expect = _expected_dims(o, seen, w)
            if expect is not None and expect != o.dims:
                raise _err(w, f"dims {list(o.dims)} but the operands give {list(expect)}")
            if o.op in ("reduction", "reduction_to_dimx", "concat") and o.attr("dim") >= len(
                o.dims
            ):
                raise _err(w, f"dim {o.attr('dim')} out of range for rank {len(o.dims)}")
        seen[o.id] = o
    outputs = []
    for i, r in enumerate(_get(raw, "outputs", where)):
        w = f"{where} output {i}"
        buf_id = _int(_get(r, "buffer", w), w, "buffer", 0)
        if buf_id not in bufs:
            raise _err(w, f"unknown buffer {buf_id}")
        if bufs[buf_id].role == "input":
            raise _err(w, f"buffer {buf_id} is a graph input; kernels never write inputs")
        src = _int(_get(r, "src", w), w, "src", 0)
        if src not in seen:
            raise _err(w, f"src {src} is not an op of the kernel")
        tile = _dims(_get(r, "tile", w), w, "tile")
        if tile != seen[src].dims:
            raise _err(w, f"tile {list(tile)} differs from op {src} dims {list(seen[src].dims)}")
        if seen[src].phase not in ("accum", "epilogue"):
            raise _err(w, f"outputs store values after the loop; op {src} is {seen[src].phase!r}")
        acc = TileAccess(buf_id, tile, _offsets(_get(r, "offsets", w), len(tile), w), src)
        acc = replace(acc, masked=_masked(r.get("masked"), len(tile), w))
        if acc.uses_iter():
            raise _err(w, "output offsets cannot depend on the loop index")
        _check_access(acc, bufs[buf_id], grid, 1, w)
        outputs.append(acc)
    groups = []
    for i, g in enumerate(raw.get("safe_softmax", []) or []):
        w = f"{where} safe_softmax group {i}"
        exp_id = _int(_get(g, "exp", w), w, "exp", 0)
        if exp_id not in seen or seen[exp_id].op != "unary" or seen[exp_id].attr("unop") != "exp":
            raise _err(w, f"op {exp_id} is not an exp")
        accs = tuple(_int(a, w, "accum", 0) for a in g.get("accums", []))
        for a in accs:
            if (
                a not in seen
                or seen[a].op != "accum"
                or seen[a].attr("acc") not in ("iter", "sum", "sum_todimx")
            ):
                raise _err(w, f"op {a} is not a sum accumulator")
        rows = seen[seen[exp_id].args[0]].dims[:-1]
        outs = tuple(_int(x, w, "scale_output", 0) for x in g.get("scale_outputs", []))
        for x in outs:
            if x >= len(outputs):
                raise _err(w, f"scale_outputs names output {x} of {len(outputs)}")
            src_dims = outputs[x].tile  # the stored op's dims
            if src_dims[:-1] != rows:
                raise _err(
                    w, f"output {x} {list(src_dims)} does not have the exp's rows {list(rows)}"
                )
        store = None
        if g.get("shift_store") is not None:
            store = _shift_store(g["shift_store"], (*rows, 1), bufs, grid, w)
        if outs and store is None:
            raise _err(w, "scale_outputs are stored shifted, so the group needs a shift_store")
        if store is not None and not outs:
            raise _err(w, "a shift_store without scale_outputs")
        rescale = _rescale(_get(g, "rescale", w), accs, seen, seen[exp_id], rows, w)
        groups.append(SafeSoftmax(exp_id, accs, outs, store, rescale))
    k = GeneratedKernel(
        name=name,
        grid=grid,
        block_threads=block_threads,
        warps=warps,
        forloop_range=forloop,
        inputs=tuple(inputs),
        ops=tuple(ops),
        outputs=tuple(outputs),
        safe_softmax=tuple(groups),
        smem_bytes=_int(raw.get("smem_bytes", 0), where, "smem_bytes", 0),
        shift_carry=_shift_carry(raw.get("shift_carry"), inputs, seen, where),
        loop_split=_loop_split(_get(raw, "loop_split", where), forloop, where),
    )
    _check_phases(k)
    _check_fusion(k)
    return k


def _broadcasts(rows: Sequence[int], to: Sequence[int]) -> bool:
    """Whether per-row values of ``rows`` broadcast to the rows ``to`` (equal rank, each dim
    1 or equal)."""
    return len(rows) == len(to) and all(r in (1, t) for r, t in zip(rows, to, strict=True))


def _rescale(
    raw: Any,
    accs: Sequence[int],
    ops: Mapping[int, TileOp],
    exp: TileOp,
    rows: tuple[int, ...],
    w: str,
) -> tuple[Rescale, ...]:
    """A group's ``rescale``: distinct accumulators of the group, non-zero integer degrees,
    rows the running max broadcasts to; empty when the exp is hoisted (its max is fixed)."""
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise _err(w, f"rescale must be a list of {{accum, degree}} objects, got {raw!r}")
    out: list[Rescale] = []
    for r in raw:
        a = _int(_get(r, "accum", w), w, "rescale accum", 0)
        d = _int(_get(r, "degree", w), w, "rescale degree")
        if a not in accs:
            raise _err(w, f"rescale names op {a}, which is not one of the group's accums")
        if d == 0:
            raise _err(w, f"accumulator {a} has degree 0, which needs no rescale; leave it out")
        if a in (x.accum for x in out):
            raise _err(w, f"accumulator {a} is rescaled twice")
        if not _broadcasts(rows, ops[a].dims[:-1]):
            raise _err(
                w,
                f"the exp's running max has rows {list(rows)}, which do not broadcast to "
                f"accumulator {a} {list(ops[a].dims)}",
            )
        out.append(Rescale(a, d))
    if out and exp.hoisted:
        raise _err(w, f"exp {exp.id} is hoisted, so its max is fixed and rescales nothing")
    return tuple(out)


def _loop_split(raw: Any, forloop: int, where: str) -> int:
    """``loop_split``: a power of two no larger than the for-loop (its parts' shares differ
    by at most one iteration)."""
    split = _int(raw, where, "loop_split", 1)
    if split < 1 or split & (split - 1) or split > max(forloop, 1):
        raise _err(
            where,
            f"loop_split {split} is not a power of two no larger than forloop_range {forloop}",
        )
    return split


def _check_fusion(k: GeneratedKernel) -> None:
    """``accumulate_into``: a loop matmul whose only reader is that ``iter`` accumulator of
    the same dims, and which is not stored."""
    stored = {a.src for a in k.outputs}
    for o in k.ops:
        if o.accumulate_into is None:
            continue
        where = f"kernel {k.name!r} op {o.id}"
        acc = next((x for x in k.ops if x.id == o.accumulate_into), None)
        if acc is None or acc.op != "accum" or acc.attr("acc") != "iter":
            raise _err(where, f"accumulate_into {o.accumulate_into} is not an 'iter' accumulator")
        if acc.args != (o.id,) or acc.dims != o.dims:
            raise _err(where, f"accumulator {acc.id} does not sum this matmul's tile")
        if o.phase != "loop":
            raise _err(where, f"only 'loop' matmuls accumulate into an accumulator: {o.phase!r}")
        if [c.id for c in k.consumers(o.id)] != [acc.id] or o.id in stored:
            raise _err(where, f"the product is read besides accumulator {acc.id}: not fusable")


def _shift_buffer(raw: Any, bufs: Mapping[int, Buffer], where: str) -> tuple[Buffer, int]:
    bid = _int(_get(raw, "buffer", where), where, "buffer", 0)
    if bid not in bufs:
        raise _err(where, f"unknown buffer {bid}")
    buf = bufs[bid]
    if buf.role != "intermediate" or buf.dtype != "float32":
        raise _err(where, f"buffer {bid} of running maxima must be a float32 intermediate")
    return buf, bid


def _shift_store(
    raw: Any, rows: tuple[int, ...], bufs: Mapping[int, Buffer], grid: tuple[int, int, int], w: str
) -> TileAccess:
    """A group's ``shift_store``: one max per row of the exp's argument (tile ``rows``)."""
    where = f"{w} shift_store"
    buf, bid = _shift_buffer(raw, bufs, where)
    tile = _dims(_get(raw, "tile", where), where, "tile")
    if tile != rows:
        raise _err(where, f"tile {list(tile)} is not the exp's rows {list(rows)}")
    acc = TileAccess(bid, tile, _offsets(_get(raw, "offsets", where), len(tile), where))
    if acc.uses_iter():
        raise _err(where, "offsets cannot depend on the loop index")
    _check_access(acc, buf, grid, 1, where)
    return acc


def _shift_load(
    raw: Any,
    inp: TileAccess,
    bufs: Mapping[int, Buffer],
    grid: tuple[int, int, int],
    forloop: int,
    w: str,
) -> ShiftLoad:
    """An input's ``shift_load``: the input tile's rows, one column per ``width`` columns."""
    where = f"{w} shift_load"
    buf, bid = _shift_buffer(raw, bufs, where)
    width = _int(_get(raw, "width", where), where, "width", 1)
    tile = _dims(_get(raw, "tile", where), where, "tile")
    if len(tile) != len(inp.tile) or tile[:-1] != inp.tile[:-1] or tile[-1] * width != inp.tile[-1]:
        raise _err(
            where,
            f"tile {list(tile)} with width {width} does not cover the input tile {list(inp.tile)}",
        )
    acc = TileAccess(bid, tile, _offsets(_get(raw, "offsets", where), len(tile), where))
    _check_access(acc, buf, grid, forloop, where)
    if acc.uses_iter() != inp.uses_iter():
        raise _err(where, "the maxima must walk the loop exactly when the input does")
    return ShiftLoad(acc, width)


def _shift_carry(
    raw: Any, inputs: Sequence[TileAccess], ops: Mapping[int, TileOp], where: str
) -> ShiftCarry | None:
    """A kernel's ``shift_carry``: exactly its inputs with a ``shift_load``, all walking the
    loop or none, and sum accumulators to rescale."""
    shifted = tuple(i for i, a in enumerate(inputs) if a.shift_load is not None)
    if raw is None:
        if shifted:
            raise _err(where, f"inputs {list(shifted)} have a shift_load but no shift_carry")
        return None
    w = f"{where} shift_carry"
    ins = tuple(_int(i, w, "input", 0) for i in _get(raw, "inputs", w))
    if tuple(sorted(ins)) != shifted or not shifted:
        raise _err(w, f"inputs {list(ins)} are not the inputs with a shift_load {list(shifted)}")
    if len({inputs[i].uses_iter() for i in ins}) != 1:
        raise _err(w, "shifted inputs must all walk the loop or all be loaded once")
    rows = {inputs[i].tile[:-1] for i in ins}
    if len(rows) != 1:
        raise _err(w, f"shifted inputs have different rows {sorted(list(r) for r in rows)}")
    (row,) = rows
    accs = tuple(_int(a, w, "accum", 0) for a in _get(raw, "accums", w))
    for a in accs:
        if a not in ops or ops[a].op != "accum" or ops[a].attr("acc") == "rms":
            raise _err(w, f"op {a} is not a sum accumulator")
        if not _broadcasts(row, ops[a].dims[:-1]):
            raise _err(
                w,
                f"the running max has the shifted inputs' rows {list(row)}, which do not "
                f"broadcast to accumulator {a} {list(ops[a].dims)}",
            )
    if accs and not inputs[ins[0]].uses_iter():
        raise _err(w, "shifted inputs loaded once leave the running max final: no accums")
    return ShiftCarry(ins, accs)


def _parse_library(raw: Mapping[str, Any], idx: int, bufs: Mapping[int, Buffer]) -> LibraryKernel:
    where = f"library kernel {idx}"
    op = _get(raw, "op", where)
    if op not in LIBRARY_OPS:
        raise _err(where, f"unknown library op {op!r}; expected one of {LIBRARY_OPS}")
    ins = tuple(_int(x, where, "input", 0) for x in _get(raw, "inputs", where))
    outs = tuple(_int(x, where, "output", 0) for x in _get(raw, "outputs", where))
    for b in (*ins, *outs):
        if b not in bufs:
            raise _err(where, f"unknown buffer {b}")
    for b in outs:
        if bufs[b].role == "input":
            raise _err(where, f"buffer {b} is a graph input; kernels never write inputs")
    if len(outs) != 1:
        raise _err(where, f"library kernels write exactly one buffer, got {len(outs)}")
    params = raw.get("params", {}) or {}
    if not isinstance(params, Mapping):
        raise _err(where, "params must be an object")
    if op == "unary":
        name = _get(params, "op", where)
        if name not in UNARY_OPS:
            raise _err(where, f"unknown unary op {name!r}")
    if op == "binary" and _get(params, "op", where) not in BINARY_OPS:
        raise _err(where, f"unknown binary op {params['op']!r}")
    return LibraryKernel(op, ins, outs, dict(params))


def parse_plan(plan: Any) -> Plan:
    """Parse a KernelPlan given as JSON text, a dict, a :class:`Plan`, or an object with
    ``to_json()``/``kernel_plan()`` (the core's plan / a search candidate)."""
    if isinstance(plan, Plan):
        return plan
    if hasattr(plan, "kernel_plan") and callable(plan.kernel_plan):
        plan = plan.kernel_plan()
    if hasattr(plan, "to_json") and callable(plan.to_json):
        plan = plan.to_json()
    if isinstance(plan, (bytes, bytearray)):
        plan = plan.decode("utf-8")
    if isinstance(plan, str):
        try:
            plan = json.loads(plan)
        except json.JSONDecodeError as exc:
            raise PlanError(f"kernel plan: not JSON ({exc})") from None
    if not isinstance(plan, Mapping):
        raise PlanError(f"kernel plan: expected a JSON object, got {type(plan).__name__}")
    if plan.get("format") != FORMAT:
        raise PlanError(f"kernel plan: format {plan.get('format')!r}, expected {FORMAT!r}")
    version = plan.get("version")
    if version in (1, 2):
        raise PlanError(
            f"kernel plan: version {version} lacks the analyses version {VERSION} carries "
            "(hoisted phases, accumulate_into, rescale, loop_split); lower the graph again "
            "with this yirage"
        )
    if version != VERSION:
        raise PlanError(
            f"kernel plan: version {version!r} is not supported by this yirage "
            f"(supports {VERSION}); install matching versions of yirage and its backends"
        )
    bufs: dict[int, Buffer] = {}
    for r in _get(plan, "buffers", "plan"):
        where = f"buffer {r.get('id') if isinstance(r, Mapping) else r!r}"
        bid = _int(_get(r, "id", where), where, "id", 0)
        if bid in bufs:
            raise _err(where, "duplicate buffer id")
        dtype = _get(r, "dtype", where)
        if dtype not in DTYPES:
            raise _err(where, f"dtype {dtype!r} is not one of {DTYPES}")
        role = _get(r, "role", where)
        if role not in ("input", "output", "intermediate"):
            raise _err(where, f"role {role!r} is not input, output or intermediate")
        index = None
        if role != "intermediate":
            index = _int(_get(r, "index", where), where, "index", 0)
        bufs[bid] = Buffer(bid, _dims(_get(r, "dims", where), where, "dims"), dtype, role, index)
    for role in ("input", "output"):
        idx = sorted(b.index for b in bufs.values() if b.role == role and b.index is not None)
        if idx != list(range(len(idx))):
            raise PlanError(f"kernel plan: {role} indices {idx} are not 0..{len(idx) - 1}")
    if not any(b.role == "output" for b in bufs.values()):
        raise PlanError("kernel plan: no output buffer")
    kernels: list[LibraryKernel | GeneratedKernel] = []
    written: set[int] = set()
    names: set[str] = set()
    for i, k in enumerate(_get(plan, "kernels", "plan")):
        kind = _get(k, "kind", f"kernel {i}")
        if kind == "library":
            lk = _parse_library(k, i, bufs)
            reads = lk.inputs
            kernels.append(lk)
            writes = lk.outputs
        elif kind == "generated":
            gk = _parse_generated(k, i, bufs)
            if gk.name in names:
                raise _err(f"kernel {gk.name!r}", "duplicate kernel name")
            names.add(gk.name)
            reads = tuple(a.buffer for a in gk.inputs) + tuple(
                a.shift_load.access.buffer for a in gk.inputs if a.shift_load is not None
            )
            writes = tuple(a.buffer for a in gk.outputs) + tuple(
                g.shift_store.buffer for g in gk.safe_softmax if g.shift_store is not None
            )
            kernels.append(gk)
        else:
            raise _err(f"kernel {i}", f"kind {kind!r} is not 'library' or 'generated'")
        for b in reads:
            if bufs[b].role != "input" and b not in written:
                raise _err(f"kernel {i}", f"reads buffer {b} before any kernel wrote it")
        written.update(writes)
    for buf in bufs.values():
        if buf.role == "output" and buf.id not in written:
            raise PlanError(f"kernel plan: output buffer {buf.id} is never written")
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    return Plan(str(plan.get("graph_hash", "")), tuple(bufs.values()), tuple(kernels), text)
