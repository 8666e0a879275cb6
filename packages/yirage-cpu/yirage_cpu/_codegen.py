"""KernelPlan → C11 + OpenMP source (the CPU backend's printer).

The plan format is docs/kernel-plan.md. Each generated kernel becomes one C function
``int yr_<name>(void **buffers)`` that takes every plan buffer by id. Library kernels of
the ops in :data:`PRINTED_LIBRARY_OPS` are printed too (``yr_lib<i>_<op>``): elementwise,
reduction, rms_norm and softmax as one parallel pass each, matmul as a generated kernel
(:func:`library_matmul_kernel`; a matmul of a shape that does not fit it runs through numpy).
The others (concat, chunk, collectives) are run by the runtime through numpy between the C
calls, in plan order.

How a generated kernel maps onto a CPU:

* the grid's blocks are the iterations of one ``#pragma omp parallel for collapse(...)``
  loop over (bz, by, bx);
* a block keeps its tiles in thread-private, 64-byte aligned float arrays (on the stack when
  they are small, else in one per-thread heap scratch area); float32 input tiles are not
  copied at all but read in place through a strided view;
* the for-loop runs inside the block: ``pre`` ops (and inputs loaded once) are hoisted
  before it, ``loop`` and ``accum`` ops run in it, ``epilogue`` ops and stores after it;
* inner loops are contiguous and carry ``#pragma omp simd``; matmul runs in i-k-j order
  with a row accumulator, and a matmul whose only consumer is an ``iter`` accumulator is
  fused into it (it adds straight into the accumulator);
* float16 and bfloat16 are storage types only: tile loads widen them to float, the
  arithmetic is float, stores narrow back (round to nearest even; subnormals, infinities and
  NaN exact). Contiguous rows and the chunks of elementwise library kernels convert with the
  widest instructions the compile targets (F16C / AVX-512 ``vcvtph2ps``/``vcvtps2ph``,
  AVX512-BF16 ``vcvtneps2bf16``, NEON ``fcvtl``/``fcvtn``; one path per ISA, chosen by the
  preprocessor, ``yr_half_path()`` names it); element conversions elsewhere are branch-free
  integer code the compiler vectorises on any ISA (bfloat16 widens by a shift);
* a 16-bit tile that only matmuls read as their B operand (a weight) is not copied: the
  micro-kernel reads it in place and widens one register at a time as it loads it
  (bfloat16 by ``vpmovzxwd`` + ``vpslld`` with AVX2 / AVX-512, float16 by ``vcvtph2ps``,
  portable vector code elsewhere; ``yr_matmul_half_path()`` names the path), so a weight
  stream costs its 16-bit bytes and no staging pass;
* a matmul whose B is a bfloat16 tile read in place and whose A is bfloat16 in the graph (a
  tile of a bfloat16 buffer; in a graph whose inputs and outputs are all bfloat16 also a
  computed tile or one of a float32 intermediate, rounded to bfloat16 once where it is
  computed, as the GPU printers round 16-bit dot operands) multiplies pairs along K with
  AVX512-BF16 ``vdpbf16ps`` where the compile target has it (``YR_MM_BF16_DOT``; a target
  pinned without ``avx512_bf16`` prints the widening path only): A's pairs packed once per
  tile, B's rows k and k+1 interleaved per column by unpacks, the sums put back in column
  order as they are stored; an A the graph keeps in float32 is never rounded. The
  instruction reads bfloat16 subnormal inputs as zero and flushes subnormal results (it
  ignores MXCSR), as the library GEMMs PyTorch runs on such CPUs do: a documented deviation
  of this backend for bfloat16 dot products only (docs/backends.md); every kernel still
  passes the numeric check and the dtype-extremes stress check (bfloat16 subnormals
  included) before it may win;
* a matmul whose B tile is read in place from memory (a weight: float32, or 16-bit read by
  matmuls only) prefetches each B row :data:`_STREAM_PREFETCH_BYTES` ahead of its loads into
  L2 (``YR_PREFETCH``), continuing into the same row of the next iteration's tile near the
  row's end: the ``kt`` rows a block reads side by side are more streams than the hardware
  prefetchers keep ahead of;
* every parallel region runs on ``yr_nt`` threads, which the runtime sets before each call
  (:mod:`yirage_cpu._threads`: the idle cores, or the count a variable fixes);
* ``safe_softmax`` groups keep a running row max ``m``: ``exp(x - m)`` and each listed
  accumulator is rescaled by ``exp(m_old - m_new)`` before it adds; listed outputs are
  stored shifted and ``m`` is stored at the group's ``shift_store``;
* an exp over a masked loop's padding (its ``masked`` dim) is 0 there, and a safe-softmax
  exp's row max skips the padding, in the loop's last iteration (the only one with padding);
* a ``shift_carry`` kernel (the reader of shifted partials) keeps a running row max ``M`` of
  the maxima of its shifted inputs (``shift_load``): before its first shifted tile it raises
  ``M`` to them and rescales the listed accumulators by ``exp(M_old - M_new)``; every shifted
  tile is copied multiplied by ``exp(m - M)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import platform
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yirage.plan import (
    FORMAT,
    VERSION,
    Buffer,
    CodegenError,
    GeneratedKernel,
    LibraryKernel,
    MaskedDim,
    OffsetTerm,
    SafeSoftmax,
    TileAccess,
    TileOp,
    parse_plan,
)

__all__ = [
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "CodegenError",
    "CpuSource",
    "Step",
    "generate",
]

PLAN_FORMAT = FORMAT
PLAN_VERSION = VERSION
#: Version of the printer; part of every compile-cache key.
CODEGEN_VERSION = "14"

#: Private tiles of one block above this many bytes go to a per-thread heap scratch area.
_STACK_LIMIT = 256 * 1024
#: Row accumulators of a matmul are kept in a local array up to this many columns.
_MATMUL_ROW_ACC_MAX = 512

_DTYPE_C = {"float32": "float", "float16": "yr_half", "bfloat16": "uint16_t"}
_LOAD = {"float32": "{}", "float16": "yr_h2f({})", "bfloat16": "yr_bf2f({})"}
_STORE = {"float32": "{}", "float16": "yr_f2h({})", "bfloat16": "yr_f2bf({})"}
_BLOCK_VARS = ("bx", "by", "bz")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: 16-bit rows at least this long are converted by the row functions of the prelude (the
#: ISA's conversion instructions); shorter ones element by element.
_HALF_ROW_MIN = 8
_ROW_LOAD = {"float16": "yr_h2f_row", "bfloat16": "yr_bf2f_row"}
_ROW_STORE = {"float16": "yr_f2h_row", "bfloat16": "yr_f2bf_row"}
#: One SIMD register of floats widened from 16-bit elements in place (the matmul's B loads).
_VEC_LOAD = {"float16": "yr_h2f_vec", "bfloat16": "yr_bf2f_vec"}
#: Software prefetch of the B operand a matmul streams from memory in place (a weight): each
#: row of the tile is prefetched this many bytes ahead of the micro-kernel's loads, into L2.
#: A block's B tile is ``kt`` rows read side by side, more concurrent streams than the
#: hardware prefetchers keep ahead of; without it the FMAs wait on every miss (measured on
#: a Zen 4 core: an 8-row float32 matmul over a 100 MB weight took the sum of its in-cache
#: time and its read time).
STREAM_PREFETCH = True
_STREAM_PREFETCH_BYTES = 512
#: OpenMP schedule of the grid loop.
SCHEDULE = "static"


@dataclass(frozen=True)
class Step:
    """One entry of the execution order: ``library`` (run by the runtime through numpy) or
    ``generated`` (the C function ``symbol``: a generated kernel or a printed library
    kernel)."""

    kind: str
    index: int
    symbol: str | None = None


@dataclass(frozen=True)
class CpuSource:
    """The printed program: C source plus what the runtime needs to drive it."""

    code: str
    plan: dict[str, Any] = field(repr=False)
    steps: tuple[Step, ...]
    simd_width_bits: int
    #: Whether some matmul took the bfloat16 dot path (compiled where the target has
    #: AVX512-BF16): then the backend races the same plan printed without it.
    bf16_dot: bool = False

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(s.symbol for s in self.steps if s.symbol is not None)

    def __str__(self) -> str:
        return self.code


# -- small helpers ---------------------------------------------------------------------------


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _row_major(dims: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * int(dims[i + 1])
    return tuple(strides)


def _flt(v: float) -> str:
    """A C float literal."""
    v = float(v)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(v)
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return f"{text}f" if not text.startswith("-") else f"({text}f)"


def _is_arm() -> bool:
    return platform.machine().lower() in ("arm64", "aarch64")


def _ident(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", str(name))
    return s if s and not s[0].isdigit() else f"k{s}"


def _walked(acc: TileAccess, dim: int) -> bool:
    """Whether the for-loop walks dim ``dim`` of ``acc``."""
    return any(t.var == "iter" and t.stride for t in acc.offsets[dim])


class _Writer:
    def __init__(self, indent: int = 0) -> None:
        self.lines: list[str] = []
        self.ind = indent

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.ind + line) if line else "")

    @contextlib.contextmanager
    def block(self, head: str) -> Iterator[None]:
        self(f"{head} {{" if head else "{")
        self.ind += 1
        try:
            yield
        finally:
            self.ind -= 1
            self("}")

    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class _Tile:
    """A tile as the printer sees it: a float pointer (private array or in-place view of a
    float32 buffer) with row-major-like strides (last stride 1), or an in-place view of a
    16-bit buffer (``dtype``) that only a matmul reads, widening as it loads."""

    ptr: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    private: bool
    dtype: str = "float32"
    #: elements an in-place view of a loop-phase input moves per for-loop iteration (the
    #: next iteration's tile starts there); 0 when it does not move
    iter_step: int = 0

    def off(self, idx: Sequence[str]) -> str:
        """Offset expression at loop indices ``idx``; size-1 dims broadcast (index ignored)."""
        terms = []
        for d, (i, s) in enumerate(zip(idx, self.strides, strict=True)):
            if i == "0" or self.dims[d] == 1:
                continue
            terms.append(i if s == 1 else f"{i} * {s}")
        return " + ".join(terms) if terms else "0"

    def at(self, idx: Sequence[str]) -> str:
        """Element expression at loop indices ``idx``."""
        return f"{self.ptr}[{self.off(idx)}]"


def _blocking(m: int, nv: int, vregs: int) -> tuple[int, int]:
    """(vectors per row c, rows per block mb) of the matmul micro-kernel: the fewest loads
    per k step over the whole tile (c must divide nv; mb·c accumulators + c B vectors + a
    broadcast must fit the vector registers); ties go to wider c."""
    best: tuple[float, int, int] | None = None
    for c in range(1, 5):
        if nv % c:
            continue
        for mb in range(1, m + 1):
            if mb * c + c + 2 > vregs:
                break
            blocks = [mb] * (m // mb) + ([m % mb] if m % mb else [])
            loads = (nv // c) * sum(c + rows for rows in blocks)
            key = (loads, -c, -mb)
            if best is None or key < best:
                best = (loads, -c, -mb)
    assert best is not None
    return -best[1], -best[2]


def _dot_blocking(m: int, units: int, vregs: int) -> tuple[int, int]:
    """(units of 32 columns per step c, rows per block mb) of the bfloat16 dot kernel: a
    unit costs two B loads and two unpacks per pair of k, a row one broadcast; the fewest
    of those over the tile (c divides ``units``; mb·2c accumulators, 2c B vectors and two
    temporaries fit the registers); ties go to fewer row blocks (B is read from memory by
    the first), then to wider c."""
    best: tuple[int, int, int, int] | None = None  # (cost, blocks, -c, -mb)
    for c in (1, 2):
        if units % c:
            continue
        for mb in range(1, m + 1):
            if mb * 2 * c + 2 * c + 2 > vregs:
                break
            blocks = [mb] * (m // mb) + ([m % mb] if m % mb else [])
            cost = (units // c) * sum(4 * c + rows for rows in blocks)
            key = (cost, len(blocks), -c, -mb)
            if best is None or key < best:
                best = key
    assert best is not None
    return -best[2], -best[3]


@dataclass(frozen=True)
class _Matmul:
    """C (+)= A·B on row-major operands: base expressions and row strides (last stride 1)."""

    a: str
    sa: int
    b: str
    sb: int
    c: str
    sc: int
    m: int
    k: int
    n: int
    accumulate: bool
    #: element type of B: float32, or float16/bfloat16 widened in registers as it is loaded
    bt: str = "float32"
    #: B is a view of a buffer in memory (not a private tile): its rows are prefetched
    b_stream: bool = False
    #: elements B's view moves per for-loop iteration (0: none); the prefetch of a row's end
    #: continues into the next iteration's tile
    b_step: int = 0


# -- the printer of one generated kernel -----------------------------------------------------

_UNARY = {
    "exp": "yr_exp({x})",
    "square": "({x}) * ({x})",
    "sqrt": "sqrtf({x})",
    "rsqrt": "1.0f / sqrtf({x})",
    "silu": "({x}) / (1.0f + yr_exp(-({x})))",
    "gelu": "0.5f * ({x}) * (1.0f + erff(({x}) * 0.70710678118654752f))",
    "relu": "(({x}) < 0.0f ? 0.0f : ({x}))",
    "sigmoid": "1.0f / (1.0f + yr_exp(-({x})))",
    "tanh": "tanhf({x})",
    "neg": "-({x})",
}
_BINARY = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "pow": "powf({a}, {b})",
}


def unary_expr(op: str, params: Sequence[float], x: str) -> str:
    """C expression of a unary op applied to the float expression ``x``."""
    if op == "mul_scalar":
        if len(params) != 1:
            raise CodegenError(f"mul_scalar takes one parameter, got {list(params)}")
        return f"({x}) * {_flt(params[0])}"
    if op == "add_scalar":
        if len(params) != 1:
            raise CodegenError(f"add_scalar takes one parameter, got {list(params)}")
        return f"(({x}) + {_flt(params[0])})"
    if op == "clamp":
        if len(params) != 2:
            raise CodegenError(f"clamp takes two parameters (lo, hi), got {list(params)}")
        lo, hi = _flt(params[0]), _flt(params[1])
        # Ternaries (not fminf/fmaxf) so NaN propagates as in the reference.
        return f"(({x}) < {lo} ? {lo} : (({x}) > {hi} ? {hi} : ({x})))"
    template = _UNARY.get(op)
    if template is None:
        raise CodegenError(f"unknown unary op {op!r} in the kernel plan")
    if params:
        raise CodegenError(f"unary op {op!r} takes no parameters, got {list(params)}")
    return template.format(x=x)


@dataclass(frozen=True)
class _Decl:
    """A block-private array: ``count`` elements of ``ctype`` (4 bytes each); ``dot`` arrays
    exist only where the compile takes the bfloat16 dot path (``YR_MM_BF16_DOT``)."""

    name: str
    count: int
    ctype: str = "float"
    dot: bool = False


class _KernelPrinter:
    def __init__(
        self,
        kernel: GeneratedKernel,
        buffers: Mapping[int, Buffer],
        symbol: str,
        simd_width_bits: int,
        bf16_dot: bool = False,
        graph_dtype: str | None = None,
    ) -> None:
        self.k = kernel
        self.buffers = buffers
        self.symbol = symbol
        self.align = max(16, simd_width_bits // 8)
        self.vl = max(1, simd_width_bits // 32)  # floats per SIMD register
        self.vregs = 32 if simd_width_bits >= 512 or _is_arm() else 16
        self.counter = 0
        self.ops: dict[int, TileOp] = {op.id: op for op in kernel.ops}
        self.tiles: dict[int, _Tile] = {}
        self.private_decls: list[_Decl] = []
        self.grid = kernel.grid
        self.loop_range = kernel.forloop_range
        #: printing the iterations before a masked loop's last one: the dims the loop walks
        #: are whole there (see :meth:`_masked_dims`)
        self.before_last = False
        self.shift_vars = self._shift_vars()
        self._read_analyses()
        self.dot_mm, self.dot_a = self._dot_matmuls(graph_dtype) if bf16_dot else (set(), {})

    # -- the plan's analyses ---------------------------------------------------------------
    def _name(self) -> str:
        return self.k.name

    def _err(self, msg: str) -> CodegenError:
        return CodegenError(f"kernel {self._name()!r}: {msg}")

    def _read_analyses(self) -> None:
        """Index what the plan decided (phases, fusion, rescale degrees, the shift carry) and
        refuse what this printer cannot print: a running max broadcast over rows."""
        self.phase = {op.id: op.phase for op in self.k.ops}
        self.fused_into = {op.id: op.accumulate_into for op in self.k.ops if op.accumulate_into}
        self.fused_accums = set(self.fused_into.values())
        self.softmax_of_exp: dict[int, SafeSoftmax] = {g.exp: g for g in self.k.safe_softmax}
        self.rescales: dict[int, list[tuple[int, int]]] = {}  # accum -> [(exp, degree)]
        for g in self.k.safe_softmax:
            rows = self._dims(self.ops[g.exp].args[0])[:-1]
            for r in g.rescale:
                self._same_rows(r.accum, rows, f"exp {g.exp}'s running max")
                self.rescales.setdefault(r.accum, []).append((g.exp, r.degree))
        carry = self.k.shift_carry
        self.carry_done = False  # the running max is raised before the first shifted tile
        self.carry_ops: list[int] = []
        self.carry_accums: set[int] = set()
        if carry is None:
            return
        self.carry_ops = [
            op.id for op in self.k.ops if op.op == "input" and op.attr("input") in carry.inputs
        ]
        self.carry_rows = self._dims(self.carry_ops[0])[:-1]
        for a in carry.accums:
            self._same_rows(a, self.carry_rows, "the shift carry's running max")
        self.carry_accums = set(carry.accums)

    def _same_rows(self, acc: int, rows: tuple[int, ...], what: str) -> None:
        if self._dims(acc)[:-1] != rows:
            raise self._err(
                f"{what} has rows {list(rows)}; accumulator {acc} {list(self._dims(acc))} "
                "needs it broadcast, which the CPU printer does not do"
            )

    def _dims(self, oid: int) -> tuple[int, ...]:
        return self.ops[oid].dims

    def _kinput(self, op: TileOp) -> TileAccess:
        return self.k.inputs[int(op.attr("input"))]

    def _offset_expr(
        self,
        offsets: Sequence[Sequence[OffsetTerm]],
        buf_dims: Sequence[int],
        acc: TileAccess | None = None,
    ) -> str:
        """The element offset of a tile in its buffer (``acc``: the access, whose masked
        dims the grid splits start as :meth:`_start` says)."""
        strides = _row_major(buf_dims)
        shifted = self._grid_masked(acc) if acc is not None else {}
        terms = []
        for d, parts in enumerate(offsets):
            if d in shifted:
                assert acc is not None
                terms.append(f"{self._start(acc, d)} * {strides[d]}")
                continue
            for t in parts:
                coef = t.stride * strides[d]
                if coef:
                    terms.append(f"(int64_t){t.var} * {coef}" if coef != 1 else f"(int64_t){t.var}")
        return " + ".join(terms) if terms else "0"

    def _edge_guard(self, acc: TileAccess, idx: Sequence[str]) -> str | None:
        """C condition that element ``idx`` of a masked edge tile lies inside the buffer
        (``(block offset + i) < extent`` per masked dim), or None for an unmasked tile."""
        conds = []
        for m in self._masked_dims(acc):
            start = " + ".join(f"(int64_t){t.var} * {t.stride}" for t in acc.offsets[m.dim])
            conds.append(f"({start or '0'} + {idx[m.dim]}) < {m.extent}")
        return " && ".join(conds) if conds else None

    # -- emission helpers ------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    @contextlib.contextmanager
    def _nest(self, w: _Writer, dims: Sequence[int], simd: bool = True) -> Iterator[list[str]]:
        """Loops over ``dims`` (size-1 dims get no loop); yields the index expressions."""
        tag = self._fresh("i")
        idx = ["0" if d == 1 else f"{tag}_{n}" for n, d in enumerate(dims)]
        live = [n for n, d in enumerate(dims) if d != 1]
        with contextlib.ExitStack() as stack:
            for pos, n in enumerate(live):
                if simd and pos == len(live) - 1:
                    w("#pragma omp simd")
                stack.enter_context(
                    w.block(f"for (int {idx[n]} = 0; {idx[n]} < {dims[n]}; ++{idx[n]})")
                )
            yield idx

    def _private(self, oid: int, dims: Sequence[int], prefix: str = "t") -> _Tile:
        name = f"{prefix}{oid}"
        self._add_decl(_Decl(name, _prod(dims)))
        return _Tile(name, tuple(dims), _row_major(dims), True)

    def _add_decl(self, decl: _Decl) -> None:
        """Declare a private array once (a masked loop prints its body twice)."""
        if all(d.name != decl.name for d in self.private_decls):
            self.private_decls.append(decl)

    def _masked_dims(self, acc: TileAccess) -> tuple[MaskedDim, ...]:
        """The dims of ``acc`` read with zeros past the extent (and stored only inside it)
        where the code being printed runs: a dim the loop walks in its last iteration only;
        a dim the grid splits unless its last tile is shifted back (:meth:`_start`)."""
        shifted = self._grid_masked(acc)
        return tuple(
            m
            for m in acc.masked
            if m.dim not in shifted and not (self.before_last and _walked(acc, m.dim))
        )

    def _shift_vars(self) -> set[str]:
        """Block variables whose last tile may be shifted back: each offsets a masked dim
        the loop does not walk, in every output of the kernel. An axis no output carries
        is one the kernel reduces over (its blocks add partial results), where an overlap
        would be counted twice: those keep zero-padded tiles."""

        def carried(acc: TileAccess) -> set[str]:
            return {
                t.var
                for m in acc.masked
                if not _walked(acc, m.dim)
                for t in acc.offsets[m.dim]
                if t.var in _BLOCK_VARS and t.stride
            }

        outs = [carried(o) for o in self.k.outputs]
        return set.intersection(*outs) if outs else set()

    def _grid_masked(self, acc: TileAccess) -> dict[int, int]:
        """The masked dims of ``acc`` whose last tile is shifted back, with their extents."""
        return {
            m.dim: m.extent
            for m in acc.masked
            if not _walked(acc, m.dim)
            and any(t.var in self.shift_vars and t.stride for t in acc.offsets[m.dim])
        }

    def _start(self, acc: TileAccess, d: int) -> str:
        """C expression of the first element of ``acc``'s tile along dim ``d``. Along a masked
        dim the grid splits, the last block's tile would run past the extent E: it starts at
        E - tile instead, overlapping the block before (the dims the grid may split so are
        ones no op reduces: the overlap is recomputed exactly, and only the block's own part
        is stored, see :meth:`_emit_output`). Every tile is then whole and read in place."""
        start = " + ".join(f"(int64_t){t.var} * {t.stride}" for t in acc.offsets[d]) or "0"
        extent = self._grid_masked(acc).get(d)
        if extent is None:
            return start
        last = extent - acc.tile[d]
        return f"(({start}) < {last} ? ({start}) : (int64_t){last})"

    # -- op emitters -----------------------------------------------------------------------
    def _emit_input(self, w: _Writer, oid: int, op: TileOp) -> None:
        kin = self._kinput(op)
        bid = kin.buffer
        buf = self.buffers[bid]
        bdims = buf.dims
        tile = kin.tile
        dims = self._dims(oid)
        off = self._offset_expr(kin.offsets, bdims, kin)
        bstrides = _row_major(bdims)
        if kin.shift_load is not None:
            self._emit_shifted_input(w, oid, kin, buf, off)
            return
        masked = bool(self._masked_dims(kin))  # masked edge tiles: staged, zero past the extent
        if self._input_is_view(oid):
            name = f"v{oid}"
            ctype = _DTYPE_C[buf.dtype]
            w(f"const {ctype} *restrict {name} = B{bid} + {off};")
            w(f"(void){name};")
            step = self._iter_step(kin.offsets, bdims) if self.phase[oid] == "loop" else 0
            self.tiles[oid] = _Tile(name, dims, bstrides, False, buf.dtype, step)
            return
        priv = self._private(oid, dims)
        self.tiles[oid] = priv
        src = _Tile(f"B{bid}", tile, bstrides, False)
        base = f"yr_off{oid}"
        w(f"const int64_t {base} = {off};")
        if not masked and buf.dtype in _ROW_LOAD and tile[-1] >= _HALF_ROW_MIN:
            with self._nest(w, tile[:-1], simd=False) as ridx:
                idx = [*ridx, "0"]
                row = f"B{bid} + {base} + {src.off(idx)}"
                conv = _ROW_LOAD[buf.dtype]
                w(f"{conv}({row}, {priv.ptr} + {self._lin(idx, tile)}, {tile[-1]});")
            return
        if masked and tile[-1] >= _HALF_ROW_MIN and self._masked_rows(oid, kin, w):
            return
        with self._nest(w, tile) as idx:
            el = f"B{bid}[{base} + {src.off(idx)}]"
            val = _LOAD[buf.dtype].format(el)
            guard = self._edge_guard(kin, idx)
            if guard is not None:
                val = f"({guard}) ? {val} : 0.0f"
            w(f"{priv.ptr}[{self._lin(idx, tile)}] = {val};")

    def _masked_rows(self, oid: int, kin: TileAccess, w: _Writer) -> bool:
        """Stage a tile masked along its last (contiguous) dim only row by row: the valid
        prefix of each row copied (widened for 16-bit buffers), the rest zeroed, instead of
        a guard per element. False (nothing printed) for other masks."""
        masked = self._masked_dims(kin)
        last = len(kin.tile) - 1
        if any(m.dim != last for m in masked):
            return False
        buf = self.buffers[kin.buffer]
        tile, priv = kin.tile, self.tiles[oid]
        src = _Tile(f"B{kin.buffer}", tile, _row_major(buf.dims), False)
        start = " + ".join(f"(int64_t){t.var} * {t.stride}" for t in kin.offsets[last]) or "0"
        n, v = f"yr_n{oid}", f"yr_v{oid}"
        w(f"const int64_t {n} = (int64_t){masked[0].extent} - ({start});")
        w(f"const int {v} = {n} <= 0 ? 0 : ({n} >= {tile[-1]} ? {tile[-1]} : (int){n});")
        with self._nest(w, tile[:-1], simd=False) as ridx:
            idx = [*ridx, "0"]
            row = f"B{kin.buffer} + yr_off{oid} + {src.off(idx)}"
            dst = f"{priv.ptr} + {self._lin(idx, tile)}"
            if buf.dtype in _ROW_LOAD:
                w(f"{_ROW_LOAD[buf.dtype]}({row}, {dst}, {v});")
            else:
                w(f"memcpy({dst}, {row}, (size_t){v} * sizeof(float));")
            w(f"memset({dst} + {v}, 0, (size_t)({tile[-1]} - {v}) * sizeof(float));")
        return True

    def _input_is_view(self, oid: int) -> bool:
        """Whether input op ``oid`` is read in place (a view of its buffer) rather than staged
        into a private float tile: an unmasked, unshifted whole tile of a float32 buffer, or
        of a 16-bit one that only matmuls read as B."""
        kin = self._kinput(self.ops[oid])
        buf = self.buffers[kin.buffer]
        return (
            kin.shift_load is None
            and not self._masked_dims(kin)
            and tuple(kin.tile) == self._dims(oid)
            and (buf.dtype == "float32" or self._only_matmul_b(oid))
        )

    def _only_matmul_b(self, oid: int) -> bool:
        """Whether every reader of ``oid`` is a matmul taking it as B (then a 16-bit tile is
        read in place and widened in the matmul's registers: no float copy is staged)."""
        if any(out.src == oid for out in self.k.outputs):
            return False
        readers = [op for op in self.k.ops if oid in op.args]
        return bool(readers) and all(
            op.op == "matmul" and op.args[1] == oid and op.args[0] != oid for op in readers
        )

    # -- the bfloat16 dot path (AVX512-BF16 vdpbf16ps) ----------------------------------------
    def _dot_matmuls(self, graph_dtype: str | None) -> tuple[set[int], dict[int, bool]]:
        """(matmul ids, {A op id: round A in place}) of the matmuls that take the bfloat16
        dot path: B a bfloat16 tile read in place (a weight) and A bfloat16 in the graph (a
        tile of a bfloat16 buffer, exact; or, in a graph whose inputs and outputs are all
        bfloat16, a computed tile or one of a float32 intermediate, rounded to bfloat16 once).
        An A tile read by other ops too is rounded in place where it is computed, so every
        reader sees the value the dot multiplied (as the GPU printers do); an A that cannot be
        (a view of a float32 intermediate that others read) keeps the float path."""
        rounded: dict[int, bool] = {}  # A op -> rounded (not exact in bfloat16)
        cand: dict[int, int] = {}  # matmul -> A op
        for op in self.k.ops:
            if op.op != "matmul":
                continue
            a, b = op.args
            bop = self.ops[b]
            if bop.op != "input" or not self._input_is_view(b):
                continue
            if self.buffers[self._kinput(bop).buffer].dtype != "bfloat16":
                continue
            exact = self._a_is_bf16(a, graph_dtype)
            if exact is None:
                continue
            cand[op.id] = a
            rounded[a] = not exact
        dot_a: dict[int, bool] = {}
        for a, rnd in rounded.items():
            dots = {m for m, x in cand.items() if x == a}
            others = [o for o in self.k.ops if a in o.args and o.id not in dots]
            stored = any(out.src == a for out in self.k.outputs)
            in_place = rnd and bool(others or stored)
            if in_place and self.ops[a].op == "input" and self._input_is_view(a):
                for m in dots:
                    del cand[m]  # a view cannot be rounded in place for its other readers
                continue
            dot_a[a] = in_place
        return set(cand), dot_a

    def _a_is_bf16(self, a: int, graph_dtype: str | None) -> bool | None:
        """Whether matmul operand A (op ``a``) is bfloat16 in the graph: True when its values
        are bfloat16 already (a tile of a bfloat16 buffer), False when they are rounded to it
        (computed, or of a float32 intermediate, in an all-bfloat16 graph), None when the
        graph keeps A in float32 (then the dot path is not taken)."""
        op = self.ops[a]
        if op.op == "input" and self._kinput(op).shift_load is None:
            buf = self.buffers[self._kinput(op).buffer]
            if buf.dtype == "bfloat16":
                return True
            if buf.role != "intermediate":
                return None
        return False if graph_dtype == "bfloat16" else None

    def _emit_dot_operand(self, w: _Writer, aid: int) -> None:
        """A's rows as bfloat16 pairs along K, ``(a[k], a[k+1])`` in one 32-bit word (the
        low half first, as vdpbf16ps reads them; an odd K's last pair is ``(a[k-1], 0)``),
        into the private ``yr_ap<aid>``: once where A is computed, shared by every dot that
        reads it. An A read by other ops too is first rounded to bfloat16 in place."""
        t = self.tiles[aid]
        dims = t.dims
        kk = dims[-1]
        kp = (kk + 1) // 2
        rows = dims[:-1]
        name = f"yr_ap{aid}"
        self._add_decl(_Decl(name, _prod(rows) * kp, "uint32_t", dot=True))
        w("#if defined(YR_MM_BF16_DOT)")
        with w.block(f"/* op {aid} as bfloat16 pairs along K */"):
            if self.dot_a[aid]:
                n = _prod(dims)
                w("#pragma omp simd")
                w(f"for (int j = 0; j < {n}; ++j) {t.ptr}[j] = yr_bf2f(yr_f2bf({t.ptr}[j]));")
            with self._nest(w, rows, simd=False) as ridx:
                src = t.off([*ridx, "0"])
                w(f"const float *restrict yr_r = {t.ptr} + {src};")
                w(f"uint32_t *restrict yr_q = {name} + ({self._lin(ridx, rows)}) * {kp};")
                w("#pragma omp simd")
                w(
                    f"for (int p = 0; p < {kk // 2}; ++p) yr_q[p] = (uint32_t)yr_f2bf(yr_r[2 * p])"
                    " | ((uint32_t)yr_f2bf(yr_r[2 * p + 1]) << 16);"
                )
                if kk % 2:
                    w(f"yr_q[{kp - 1}] = (uint32_t)yr_f2bf(yr_r[{kk - 1}]);")
        w("#endif")

    def _m_tile(self, load: TileAccess) -> tuple[int, str, _Tile]:
        """(buffer id, base offset expression, tile view) of a ``shift_load``'s tile."""
        mb = load.buffer
        mdims = self.buffers[mb].dims
        base = self._offset_expr(load.offsets, mdims)
        return mb, base, _Tile(f"B{mb}", load.tile, _row_major(mdims), False)

    def _emit_carry_update(self, w: _Writer) -> None:
        """Raise the running max ``yr_cM`` of every row to the maxima of all shifted tiles
        (``yr_cA``: exp(old - new), 0 while the old one is -inf)."""
        if self.carry_done:
            return
        self.carry_done = True
        rows = self.carry_rows
        with w.block(""), self._nest(w, rows, simd=False) as ridx:
            r = self._lin(ridx, rows)
            w("float yr_mx = -INFINITY;")
            for o in self.carry_ops:
                shift = self._kinput(self.ops[o]).shift_load
                assert shift is not None  # carry_ops are the shifted inputs
                mb, base, mt = self._m_tile(shift.access)
                with w.block(f"for (int c = 0; c < {mt.dims[-1]}; ++c)"):
                    w(f"const float yr_v = B{mb}[{base} + {mt.off([*ridx, 'c'])}];")
                    w("yr_mx = yr_v > yr_mx ? yr_v : yr_mx;")
            w(f"const float yr_mo = yr_cM[{r}];")
            w("const float yr_mn = yr_mx > yr_mo ? yr_mx : yr_mo;")
            w(f"yr_cA[{r}] = (yr_mo == -INFINITY) ? 0.0f : yr_exp(yr_mo - yr_mn);")
            w(f"yr_cM[{r}] = yr_mn;")

    def _emit_shifted_input(
        self, w: _Writer, oid: int, kin: TileAccess, buf: Buffer, off: str
    ) -> None:
        """A shifted tile, copied times exp(m - M) (M read as 0 where it is -inf): one exp
        per max (a row's, or a row's block of ``width`` columns), then a multiply each."""
        self._emit_carry_update(w)
        load = kin.shift_load
        assert load is not None  # only shifted inputs come here
        width = load.width
        dims = self._dims(oid)
        priv = self._private(oid, dims)
        self.tiles[oid] = priv
        bid = kin.buffer
        src = _Tile(f"B{bid}", dims, _row_major(buf.dims), False)
        mb, mbase, mt = self._m_tile(load.access)
        scale = self._private(oid, mt.dims, prefix="yr_sc")
        w(f"const int64_t yr_moff{oid} = {mbase};")
        with self._nest(w, mt.dims) as sidx:
            r = self._lin(sidx[:-1], dims[:-1])
            big_m = f"(yr_cM[{r}] == -INFINITY ? 0.0f : yr_cM[{r}])"
            m = f"B{mb}[yr_moff{oid} + {mt.off(sidx)}]"
            w(f"{scale.at(sidx)} = yr_exp({m} - {big_m});")
        base = f"yr_off{oid}"
        w(f"const int64_t {base} = {off};")
        with self._nest(w, dims) as idx:
            col = idx[-1] if width == 1 or idx[-1] == "0" else f"{idx[-1]} / {width}"
            el = _LOAD[buf.dtype].format(f"B{bid}[{base} + {src.off(idx)}]")
            w(f"{priv.ptr}[{self._lin(idx, dims)}] = {el} * {scale.at([*idx[:-1], col])};")

    @staticmethod
    def _iter_step(offsets: Sequence[Sequence[OffsetTerm]], bdims: Sequence[int]) -> int:
        """Elements a tile at ``offsets`` moves per for-loop iteration (its ``iter`` terms)."""
        strides = _row_major(bdims)
        return sum(
            t.stride * strides[d] for d, ts in enumerate(offsets) for t in ts if t.var == "iter"
        )

    @staticmethod
    def _lin(idx: Sequence[str], dims: Sequence[int]) -> str:
        strides = _row_major(dims)
        terms = [
            i if s == 1 else f"{i} * {s}" for i, s in zip(idx, strides, strict=True) if i != "0"
        ]
        return " + ".join(terms) if terms else "0"

    def _emit_unary(self, w: _Writer, oid: int, op: TileOp) -> None:
        x = self.tiles[op.args[0]]
        dims = self._dims(oid)
        name = str(op.attr("unop"))
        params = list(op.attr("params"))
        if oid in self.softmax_of_exp:
            self._emit_safe_exp(w, oid, x)
            return
        out = self._private(oid, dims)
        self.tiles[oid] = out
        with self._nest(w, dims) as idx:
            val = unary_expr(name, params, x.at(idx))
            valid = self._loop_valid(op, idx)
            if valid is not None:  # the padding's exp is 0 (its input counts as -inf)
                val = f"({valid}) ? {val} : 0.0f"
            w(f"{out.at(idx)} = {val};")

    def _loop_valid(self, op: TileOp, idx: Sequence[str]) -> str | None:
        """For an exp over a masked loop's padding (``op.masked``), printed where padding can
        be (the loop's last iteration; the ones before it read whole tiles): the condition
        that element ``idx`` lies before the extent, ``iter * tile + j < extent``. The loads
        read zeros there, and exp(0) would leak into the sums; None where nothing is padding."""
        if not op.masked or self.before_last:
            return None
        m = op.masked[0]
        return f"(int64_t)iter * {op.dims[m.dim]} + {idx[m.dim]} < {m.extent}"

    def _emit_safe_exp(self, w: _Writer, oid: int, x: _Tile) -> None:
        dims = x.dims
        rows = _prod(dims[:-1])
        cols = dims[-1]
        mx, sc = f"yr_m{oid}", f"yr_s{oid}"
        out = self._private(oid, dims)
        self.tiles[oid] = out
        # a masked loop's padding (its last iteration, :meth:`_loop_valid`): the row's max
        # and exp take its first yr_nv columns only; the padding's exp is 0 and it counts as
        # -inf in the max (a max over its zeros could lie far above every score and
        # underflow each exp to 0 / 0)
        op = self.ops[oid]
        pad = op.masked[0] if op.masked and not self.before_last else None
        ncols = str(cols) if pad is None else "yr_nv"
        if pad is not None and pad.dim == len(dims) - 1:
            w(f"const int64_t yr_n = (int64_t){pad.extent} - (int64_t)iter * {cols};")
            w(f"const int yr_nv = yr_n <= 0 ? 0 : (yr_n >= {cols} ? {cols} : (int)yr_n);")
        with self._nest(w, dims[:-1], simd=False) as ridx:
            if pad is not None and pad.dim != len(dims) - 1:  # a padded row: every column
                row_ok = self._loop_valid(op, [*ridx, "0"])
                w(f"const int yr_nv = ({row_ok}) ? {cols} : 0;")
            r = self._lin(ridx, dims[:-1]) if rows > 1 else "0"
            xrow = x.off([*ridx, "0"])
            w("float yr_rm = -INFINITY;")
            w("#pragma omp simd reduction(max:yr_rm)")
            with w.block(f"for (int j = 0; j < {ncols}; ++j)"):
                w(f"const float yr_v = {x.ptr}[{xrow} + j];")
                w("yr_rm = yr_v > yr_rm ? yr_v : yr_rm;")
            w(f"const float yr_mo = {mx}[{r}];")
            w("const float yr_mn = yr_rm > yr_mo ? yr_rm : yr_mo;")
            w(f"{sc}[{r}] = (yr_mo == -INFINITY) ? 0.0f : yr_exp(yr_mo - yr_mn);")
            w(f"{mx}[{r}] = yr_mn;")
            orow = out.off([*ridx, "0"])
            w("#pragma omp simd")
            with w.block(f"for (int j = 0; j < {cols}; ++j)"):
                e = f"yr_exp({x.ptr}[{xrow} + j] - yr_mn)"
                if pad is not None:
                    e = f"j < yr_nv ? {e} : 0.0f"
                w(f"{out.ptr}[{orow} + j] = {e};")

    def _emit_binary(self, w: _Writer, oid: int, op: TileOp) -> None:
        a = self.tiles[op.args[0]]
        b = self.tiles[op.args[1]]
        dims = self._dims(oid)
        name = str(op.attr("binop"))
        template = _BINARY[name]
        out = self._private(oid, dims)
        self.tiles[oid] = out
        if name == "div" and _prod(b.dims) * 4 <= _prod(dims):
            # A divisor broadcast over ≥ 4 elements each (QK-norm's K / rms over d): one
            # reciprocal per divisor element, then multiplies (a vector divide costs ~10x a
            # multiply; the result differs from a / b by at most an ulp or so).
            rb = self._private(oid, b.dims, prefix="yr_rcp")
            with self._nest(w, b.dims) as idx:
                w(f"{rb.at(idx)} = 1.0f / {b.at(idx)};")
            b, template = rb, _BINARY["mul"]
        with self._nest(w, dims) as idx:
            w(f"{out.at(idx)} = {template.format(a=a.at(idx), b=b.at(idx))};")

    def _emit_matmul(self, w: _Writer, oid: int, op: TileOp) -> None:
        a = self.tiles[op.args[0]]
        b = self.tiles[op.args[1]]
        dims = self._dims(oid)
        m, kk, n = a.dims[-2], a.dims[-1], b.dims[-1]
        acc_id = self.fused_into.get(oid)
        if acc_id is not None:
            out = self.tiles[acc_id]
            mode = "+="
            self._emit_rescale(w, acc_id)
        else:
            out = self._private(oid, dims)
            self.tiles[oid] = out
            mode = "="
        batch = dims[:-2]
        with self._nest(w, batch, simd=False) as bidx:
            pa = a.off([*bidx, "0", "0"])
            pb = b.off([*bidx, "0", "0"])
            pc = out.off([*bidx, "0", "0"])
            if a.strides[-1] != 1 or b.strides[-1] != 1 or out.strides[-1] != 1:
                raise self._err(f"matmul op {oid}: tiles must be contiguous in their last dim")
            mm = _Matmul(
                a=f"{a.ptr} + {pa}",
                sa=a.strides[-2],
                b=f"{b.ptr} + {pb}",
                sb=b.strides[-2],
                c=f"{out.ptr} + {pc}",
                sc=out.strides[-2],
                m=m,
                k=kk,
                n=n,
                accumulate=mode == "+=",
                bt=b.dtype,
                b_stream=STREAM_PREFETCH and not b.private,
                b_step=b.iter_step if self.phase[oid] == "loop" else 0,
            )
            dot = oid in self.dot_mm
            if dot:
                a_id = op.args[0]
                kp = (kk + 1) // 2
                pairs = _Tile(
                    f"yr_ap{a_id}", (*a.dims[:-1], kp), _row_major((*a.dims[:-1], kp)), True
                )
                w("#if defined(YR_MM_BF16_DOT)")
                self._emit_dot_microkernel(w, mm, f"{pairs.ptr} + {pairs.off([*bidx, '0', '0'])}")
                w("#else")
            nfull = (n // self.vl) * self.vl if self.vl > 1 else 0
            if nfull:
                self._emit_microkernel(w, mm, nfull)
            if nfull < n:
                self._emit_matmul_columns(w, mm, nfull)
            if dot:
                w("#endif")

    def _emit_dot_microkernel(self, w: _Writer, mm: _Matmul, pairs: str) -> None:
        """C (+)= A·B with vdpbf16ps: B's rows k and k+1 interleaved per column
        (``vpunpcklwd``/``vpunpckhwd`` of the two rows, 32 columns a unit) and A's pair
        ``(a[k], a[k+1])`` (from ``pairs``, :meth:`_emit_dot_operand`) broadcast as one
        32-bit word; the sums come out in the unpacks' column order and are put back in
        order as they are stored (``yr_dot_cols``). Register-blocked like
        :meth:`_emit_microkernel` (``mb`` rows by ``c`` units, B's rows prefetched in the
        first row block); a column tail of fewer than 32 is one more unit with masked loads
        and stores; an odd K's last row pairs with zero."""
        units, tail = divmod(mm.n, 32)
        j0 = self._fresh("j")
        with w.block(""):
            w(f"const uint32_t *restrict yr_pa = {pairs};")
            if units:
                c, mb = _dot_blocking(mm.m, units, self.vregs)
                pf = self._stream_prefetch(mm, j0, 32 * c)
                with w.block(f"for (int {j0} = 0; {j0} < {units * 32}; {j0} += {32 * c})"):
                    if pf is not None:
                        w(f"const int64_t yr_pf = {pf};")
                    self._dot_row_blocks(w, mm, j0, c, mb, 0, pf is not None)
            if tail:
                _, mb = _dot_blocking(mm.m, 1, self.vregs)
                self._dot_row_blocks(w, mm, str(units * 32), 1, mb, tail, False)

    def _dot_row_blocks(
        self, w: _Writer, mm: _Matmul, j0: str, c: int, mb: int, width: int, prefetch: bool
    ) -> None:
        """The row blocks of one column step at ``j0``: ``c`` units of 32 columns (``width``
        columns of one unit when masked); the first block prefetches B's rows."""
        full = (mm.m // mb) * mb
        start = 0
        if full and prefetch:
            self._dot_body(w, mm, j0, c, mb, "0", width, True)
            start = mb
        if full > start:
            i0 = self._fresh("i")
            with w.block(f"for (int {i0} = {start}; {i0} < {full}; {i0} += {mb})"):
                self._dot_body(w, mm, j0, c, mb, i0, width, False)
        if mm.m % mb:
            self._dot_body(w, mm, j0, c, mm.m % mb, str(full), width, prefetch and not full)

    def _dot_body(
        self,
        w: _Writer,
        mm: _Matmul,
        j0: str,
        c: int,
        rows: int,
        i0: str,
        width: int,
        fetch: bool,
    ) -> None:
        """``rows`` rows by ``c`` units: two accumulators a unit (the unpacks' low and high
        columns), k in pairs; few accumulators split the pairs over ``u`` sets (the dot's
        latency, as in :meth:`_emit_microkernel`)."""
        kk = mm.k
        npairs = kk // 2
        kp = (kk + 1) // 2
        u = 1
        while rows * 2 * c * u < 8 and rows * 4 * c * u + 4 * c * u + 2 <= self.vregs:
            u *= 2
        u = max(1, min(u, npairs))
        pmain = (npairs // u) * u
        mask = f"(__mmask32){(1 << width) - 1:#x}u" if width else None
        pf_lines = c  # a unit's row is 32 bfloat16: one cache line
        acc = [
            [[(f"yr_d{r}_{v}_{h}l", f"yr_d{r}_{v}_{h}h") for h in range(u)] for v in range(c)]
            for r in range(rows)
        ]

        def load(ptr: str) -> str:
            if mask is None:
                return f"_mm512_loadu_si512((const void *)({ptr}))"
            return f"_mm512_maskz_loadu_epi16({mask}, (const void *)({ptr}))"

        def step(pexpr: str, h: int, odd: bool) -> None:
            bk = f"yr_bk{h}"
            w(f"const uint16_t *restrict {bk} = {mm.b} + 2 * ({pexpr}) * {mm.sb} + {j0};")
            if fetch:
                for row in ("",) if odd else ("", f" + {mm.sb}"):
                    for line in range(pf_lines):
                        at = f" + {64 * line}" if line else ""
                        w(f"YR_PREFETCH((const char *)({bk}{row} + yr_pf){at});")
            for v in range(c):
                col = f" + {32 * v}" if v else ""
                hi = "_mm512_setzero_si512()" if odd else load(f"{bk} + {mm.sb}{col}")
                w(f"const __m512i yr_r{v}_{h} = {load(bk + col)}, yr_s{v}_{h} = {hi};")
                w(f"const __m512bh yr_l{v}_{h} = YR_BF_LO(yr_r{v}_{h}, yr_s{v}_{h});")
                w(f"const __m512bh yr_h{v}_{h} = YR_BF_HI(yr_r{v}_{h}, yr_s{v}_{h});")
            for r in range(rows):
                w(f"const __m512bh yr_q{r}_{h} = YR_BF_PAIR(yr_p{r}[{pexpr}]);")
                for v in range(c):
                    lo, hi_ = acc[r][v][h]
                    w(f"{lo} = _mm512_dpbf16_ps({lo}, yr_l{v}_{h}, yr_q{r}_{h});")
                    w(f"{hi_} = _mm512_dpbf16_ps({hi_}, yr_h{v}_{h}, yr_q{r}_{h});")

        with w.block(""):
            for r in range(rows):
                w(f"const uint32_t *restrict yr_p{r} = yr_pa + ({i0} + {r}) * {kp};")
            for r in range(rows):
                names = [x for v in range(c) for h in range(u) for x in acc[r][v][h]]
                w("__m512 " + ", ".join(f"{x} = _mm512_setzero_ps()" for x in names) + ";")
            if pmain:
                with w.block(f"for (int p = 0; p < {pmain}; p += {u})"):
                    for h in range(u):
                        with w.block(""):
                            step(f"p + {h}" if h else "p", h, False)
            if pmain < npairs:
                with w.block(f"for (int p = {pmain}; p < {npairs}; ++p)"):
                    step("p", 0, False)
            if kk % 2:
                with w.block(""):
                    step(str(npairs), 0, True)
            for r in range(rows):
                w(f"float *restrict yr_cr{r} = {mm.c} + ({i0} + {r}) * {mm.sc} + {j0};")
                for v in range(c):
                    lo, hi_ = acc[r][v][0]
                    if u > 1:
                        w(f"{lo} = {' + '.join(acc[r][v][h][0] for h in range(u))};")
                        w(f"{hi_} = {' + '.join(acc[r][v][h][1] for h in range(u))};")
                    halves = (
                        (0, f"YR_DOT_COLS0({lo}, {hi_})"),
                        (16, f"YR_DOT_COLS1({lo}, {hi_})"),
                    )
                    for half, val in halves:
                        dst = f"yr_cr{r} + {32 * v + half}"
                        n = min(16, width - half) if width else 16
                        if n <= 0:
                            continue
                        self._dot_store(w, dst, val, n, mm.accumulate)

    @staticmethod
    def _dot_store(w: _Writer, dst: str, val: str, n: int, accumulate: bool) -> None:
        """Store (or add) 16 floats at ``dst``, the first ``n`` of them when masked."""
        if n == 16:
            if accumulate:
                w(f"_mm512_storeu_ps({dst}, _mm512_add_ps(_mm512_loadu_ps({dst}), {val}));")
            else:
                w(f"_mm512_storeu_ps({dst}, {val});")
            return
        m = f"(__mmask16){(1 << n) - 1:#x}u"
        if accumulate:
            old = f"_mm512_maskz_loadu_ps({m}, {dst})"
            w(f"_mm512_mask_storeu_ps({dst}, {m}, _mm512_add_ps({old}, {val}));")
        else:
            w(f"_mm512_mask_storeu_ps({dst}, {m}, {val});")

    def _emit_microkernel(self, w: _Writer, mm: _Matmul, nfull: int) -> None:
        """Register-blocked C[:, :nfull] (+)= A·B: ``mb`` rows by ``c`` vectors of independent
        accumulators, k outermost, B's vectors loaded once per k and broadcast A scalars."""
        vl, vlb = self.vl, self.vl * 4
        nv = nfull // vl
        c, mb = _blocking(mm.m, nv, self.vregs)
        j0 = self._fresh("j")
        bct = _DTYPE_C[mm.bt]
        widen = _VEC_LOAD.get(mm.bt)
        pf = self._stream_prefetch(mm, j0, c * vl)
        pf_lines = -(-c * vl * _ITEMSIZE[mm.bt] // 64)

        def body(rows: int, i0: str, fetch: bool) -> None:
            # Few accumulators (e.g. 4 query rows x 1 vector) leave the FMA latency exposed:
            # split k over `u` accumulator sets, summed at the end.
            u = 1
            while rows * c * u * 2 <= 8 and (rows * c * u * 2 + c + 2) <= self.vregs:
                u *= 2
            u = max(1, min(u, mm.k))
            kmain = (mm.k // u) * u
            acc = [[[f"yr_c{r}_{v}_{h}" for h in range(u)] for v in range(c)] for r in range(rows)]
            with w.block(""):
                for r in range(rows):
                    w(f"const float *restrict yr_a{r} = {mm.a} + ({i0} + {r}) * {mm.sa};")
                for r in range(rows):
                    names = [n for v in range(c) for n in acc[r][v]]
                    w("yr_vf " + ", ".join(f"{n} = {{0.0f}}" for n in names) + ";")

                def step(kexpr: str, h: int) -> None:
                    bk = f"yr_bk{h}"
                    w(f"const {bct} *restrict {bk} = {mm.b} + ({kexpr}) * {mm.sb} + {j0};")
                    if fetch:
                        for line in range(pf_lines):
                            at = f" + {64 * line}" if line else ""
                            w(f"YR_PREFETCH((const char *)({bk} + yr_pf){at});")
                    for v in range(c):
                        if widen is None:
                            w(f"yr_vf yr_b{v}_{h};")
                            w(f"memcpy(&yr_b{v}_{h}, {bk} + {v * vl}, {vlb});")
                        else:
                            w(f"yr_vf yr_b{v}_{h};")
                            w(f"{widen}({bk} + {v * vl}, &yr_b{v}_{h});")
                    for r in range(rows):
                        w(f"const float yr_s{r}_{h} = yr_a{r}[{kexpr}];")
                        for v in range(c):
                            w(f"{acc[r][v][h]} += yr_s{r}_{h} * yr_b{v}_{h};")

                with w.block(f"for (int k = 0; k < {kmain}; k += {u})"):
                    for h in range(u):
                        step(f"k + {h}" if h else "k", h)
                if kmain < mm.k:
                    with w.block(f"for (int k = {kmain}; k < {mm.k}; ++k)"):
                        step("k", 0)
                for r in range(rows):
                    w(f"float *restrict yr_cr{r} = {mm.c} + ({i0} + {r}) * {mm.sc} + {j0};")
                    for v in range(c):
                        total = " + ".join(acc[r][v])
                        if u > 1:
                            w(f"{acc[r][v][0]} = {total};")
                        src = acc[r][v][0]
                        if mm.accumulate:
                            dst = f"yr_cr{r} + {v * vl}"
                            w(
                                f"{{ yr_vf yr_t; memcpy(&yr_t, {dst}, {vlb}); "
                                f"yr_t += {src}; memcpy({dst}, &yr_t, {vlb}); }}"
                            )
                        else:
                            w(f"memcpy(yr_cr{r} + {v * vl}, &{src}, {vlb});")

        with w.block(f"for (int {j0} = 0; {j0} < {nfull}; {j0} += {c * vl})"):
            if pf is not None:
                w(f"const int64_t yr_pf = {pf};")
            # the first row block prefetches B's lines (once: the later blocks find them)
            full = (mm.m // mb) * mb
            start = 0
            if full and pf is not None:
                body(mb, "0", True)
                start = mb
            if full > start:
                i0 = self._fresh("i")
                with w.block(f"for (int {i0} = {start}; {i0} < {full}; {i0} += {mb})"):
                    body(mb, i0, False)
            if mm.m % mb:
                body(mm.m % mb, str(full), pf is not None and not full)

    def _stream_prefetch(self, mm: _Matmul, j0: str, chunk: int) -> str | None:
        """C expression of how many elements past the micro-kernel's B loads at column
        ``j0`` (``chunk`` columns) to prefetch, or None where B is a private tile (in cache).
        A fixed distance along the row while the prefetched chunk stays in it; past the row's
        end, the same row of the next iteration's tile, where this block's stream continues
        (the current chunk in the last iteration). Rows too short for the distance prefetch
        the next tile's chunk at the same place. Every address stays inside B's buffer."""
        if not mm.b_stream:
            return None
        ahead = max(1, _STREAM_PREFETCH_BYTES // _ITEMSIZE[mm.bt])
        last = f"iter + 1 < {self.loop_range}"
        moves = mm.b_step != 0 and self.loop_range > 1
        if ahead + chunk > mm.n:
            return f"({last} ? (int64_t){mm.b_step} : 0)" if moves else None
        # the next tile's row from column j0 + ahead - n (from 0 while that is negative)
        wrap = f"(int64_t){mm.b_step} + ({j0} + {ahead} > {mm.n} ? {ahead - mm.n} : -{j0})"
        tail = f"({last} ? {wrap} : 0)" if moves else "0"
        return f"{j0} + {ahead + chunk} <= {mm.n} ? {ahead} : {tail}"

    def _emit_matmul_columns(self, w: _Writer, mm: _Matmul, j_start: int) -> None:
        """C[:, j_start:] (+)= A·B row by row (the columns left over by the micro-kernel)."""
        width = mm.n - j_start
        mode = "+=" if mm.accumulate else "="
        row = self._fresh("mi")
        bct = _DTYPE_C[mm.bt]
        bj = _LOAD[mm.bt].format("yr_br[j]")
        with w.block(f"for (int {row} = 0; {row} < {mm.m}; ++{row})"):
            w(f"const float *restrict yr_ar = {mm.a} + {row} * {mm.sa};")
            w(f"float *restrict yr_cr = {mm.c} + {row} * {mm.sc} + {j_start};")
            if width <= _MATMUL_ROW_ACC_MAX:
                w(f"float yr_acc[{width}] __attribute__((aligned({self.align})));")
                w("#pragma omp simd")
                w(f"for (int j = 0; j < {width}; ++j) yr_acc[j] = 0.0f;")
                with w.block(f"for (int k = 0; k < {mm.k}; ++k)"):
                    w("const float yr_a = yr_ar[k];")
                    w(f"const {bct} *restrict yr_br = {mm.b} + k * {mm.sb} + {j_start};")
                    w("#pragma omp simd")
                    w(f"for (int j = 0; j < {width}; ++j) yr_acc[j] += yr_a * {bj};")
                w("#pragma omp simd")
                w(f"for (int j = 0; j < {width}; ++j) yr_cr[j] {mode} yr_acc[j];")
            else:
                if mode == "=":
                    w("#pragma omp simd")
                    w(f"for (int j = 0; j < {width}; ++j) yr_cr[j] = 0.0f;")
                with w.block(f"for (int k = 0; k < {mm.k}; ++k)"):
                    w("const float yr_a = yr_ar[k];")
                    w(f"const {bct} *restrict yr_br = {mm.b} + k * {mm.sb} + {j_start};")
                    w("#pragma omp simd")
                    w(f"for (int j = 0; j < {width}; ++j) yr_cr[j] += yr_a * {bj};")

    def _emit_reduction(self, w: _Writer, oid: int, op: TileOp) -> None:
        x = self.tiles[op.args[0]]
        dim = int(op.attr("dim"))
        dims = self._dims(oid)
        out = self._private(oid, dims)
        self.tiles[oid] = out
        if op.op == "reduction":
            dimx, groups = 1, x.dims[dim]
        else:
            dimx = int(op.attr("dimx"))
            groups = x.dims[dim] // dimx
        self._reduce_into(w, out, x, dim, dimx, groups, "=")

    def _reduce_into(
        self,
        w: _Writer,
        out: _Tile,
        x: _Tile,
        dim: int,
        dimx: int,
        groups: int,
        mode: str,
        square: bool = False,
    ) -> None:
        """``out[.., j, ..] (mode) Σ_g x[.., g·dimx + j, ..]`` over ``dim`` (strided groups,
        as the core's reference evaluator: side-by-side partials add up elementwise)."""
        val = "yr_v * yr_v" if square else "yr_v"
        last = len(x.dims) - 1
        if dim == last:
            with self._nest(w, out.dims, simd=False) as idx:
                xrow = x.off([*idx[:-1], "0"])
                jj = idx[-1]
                start = xrow if jj == "0" else f"{xrow} + {jj}"
                w("float yr_s = 0.0f;")
                w("#pragma omp simd reduction(+:yr_s)")
                with w.block(f"for (int g = 0; g < {groups}; ++g)"):
                    w(f"const float yr_v = {x.ptr}[{start} + g * {dimx}];")
                    w(f"yr_s += {val};")
                w(f"{out.at(idx)} {mode} yr_s;")
            return
        if mode == "=":
            w("#pragma omp simd")
            w(f"for (int j = 0; j < {_prod(out.dims)}; ++j) {out.ptr}[j] = 0.0f;")
        g = self._fresh("g")
        with w.block(f"for (int {g} = 0; {g} < {groups}; ++{g})"):
            with self._nest(w, out.dims) as idx:
                xi = list(idx)
                if groups > 1:
                    xi[dim] = f"{g} * {dimx}" if idx[dim] == "0" else f"({g} * {dimx} + {idx[dim]})"
                w(f"const float yr_v = {self._at_raw(x, xi)};")
                w(f"{out.at(idx)} += {val};")

    @staticmethod
    def _at_raw(t: _Tile, idx: Sequence[str]) -> str:
        terms = []
        for i, s in zip(idx, t.strides, strict=True):
            if i == "0":
                continue
            terms.append(i if s == 1 else f"{i} * {s}")
        return f"{t.ptr}[{' + '.join(terms) if terms else '0'}]"

    def _emit_rms_norm(self, w: _Writer, oid: int, op: TileOp) -> None:
        x = self.tiles[op.args[0]]
        dims = self._dims(oid)
        eps = _flt(float(op.attr("eps")))
        out = self._private(oid, dims)
        self.tiles[oid] = out
        cols = dims[-1]
        with self._nest(w, dims[:-1], simd=False) as ridx:
            xrow = x.off([*ridx, "0"])
            orow = out.off([*ridx, "0"])
            w("float yr_s = 0.0f;")
            w("#pragma omp simd reduction(+:yr_s)")
            with w.block(f"for (int j = 0; j < {cols}; ++j)"):
                w(f"const float yr_v = {x.ptr}[{xrow} + j];")
                w("yr_s += yr_v * yr_v;")
            w(f"const float yr_r = 1.0f / sqrtf(yr_s / {_flt(cols)} + {eps});")
            w("#pragma omp simd")
            w(
                f"for (int j = 0; j < {cols}; ++j) "
                f"{out.ptr}[{orow} + j] = {x.ptr}[{xrow} + j] * yr_r;"
            )

    def _emit_concat(self, w: _Writer, oid: int, op: TileOp) -> None:
        parts = [self.tiles[a] for a in op.args]
        dims = self._dims(oid)
        dim = int(op.attr("dim"))
        out = self._private(oid, dims)
        self.tiles[oid] = out
        start = 0
        for p in parts:
            with self._nest(w, p.dims) as idx:
                oi = list(idx)
                if start:
                    oi[dim] = f"({idx[dim]} + {start})" if idx[dim] != "0" else str(start)
                w(f"{self._at_raw(out, oi)} = {p.at(idx)};")
            start += p.dims[dim]
        if start != dims[dim]:
            raise self._err(f"concat op {oid}: parts do not add up to {dims}")

    # -- accumulators ----------------------------------------------------------------------
    @staticmethod
    def _acc_kind(op: TileOp) -> str:
        return str(op.attr("acc"))

    def _declare_accum(self, w: _Writer, oid: int, op: TileOp) -> None:
        dims = self._dims(oid)
        t = self._private(oid, dims, prefix="acc")
        self.tiles[oid] = t
        w(f"for (int j = 0; j < {_prod(dims)}; ++j) {t.ptr}[j] = 0.0f;")

    def _emit_rescale(self, w: _Writer, acc_id: int) -> None:
        factors = []
        for e, d in self.rescales.get(acc_id, []):
            factors.extend([f"yr_s{e}[r]"] * d if d > 0 else [f"(1.0f / yr_s{e}[r])"] * -d)
        if acc_id in self.carry_accums:
            factors.append("yr_cA[r]")
        if not factors:
            return
        t = self.tiles[acc_id]
        rows = _prod(t.dims[:-1])
        cols = t.dims[-1]
        with w.block(f"for (int r = 0; r < {rows}; ++r)"):
            w(f"const float yr_f = {' * '.join(factors)};")
            w("#pragma omp simd")
            w(f"for (int j = 0; j < {cols}; ++j) {t.ptr}[r * {cols} + j] *= yr_f;")

    def _emit_accum(self, w: _Writer, oid: int, op: TileOp) -> None:
        if oid in self.fused_accums:
            return  # the producing matmul adds into it directly
        acc = self.tiles[oid]
        x = self.tiles[op.args[0]]
        kind = self._acc_kind(op)
        self._emit_rescale(w, oid)
        if kind == "iter":
            with self._nest(w, acc.dims) as idx:
                w(f"{acc.at(idx)} += {x.at(idx)};")
            return
        last = len(x.dims) - 1
        if kind in ("sum", "rms"):
            self._reduce_into(w, acc, x, last, 1, x.dims[-1], "+=", square=kind == "rms")
            return
        dimx = int(op.attr("dimx"))
        self._reduce_into(w, acc, x, last, dimx, x.dims[-1] // dimx, "+=")

    def _finish_accum(self, w: _Writer, oid: int, op: TileOp) -> None:
        if self._acc_kind(op) != "rms":
            return
        acc = self.tiles[oid]
        extent = int(op.attr("extent"))
        eps = _flt(float(op.attr("eps")))
        w("#pragma omp simd")
        with w.block(f"for (int j = 0; j < {_prod(acc.dims)}; ++j)"):
            w(f"{acc.ptr}[j] = sqrtf({acc.ptr}[j] / {_flt(extent)} + {eps});")

    # -- outputs ---------------------------------------------------------------------------
    def _emit_output(self, w: _Writer, index: int, out: TileAccess) -> None:
        bid = out.buffer
        buf = self.buffers[bid]
        bdims = buf.dims
        assert out.src is not None  # outputs name the op they store
        src = self.tiles[out.src]
        tile = out.tile
        off = self._offset_expr(out.offsets, bdims, out)
        bstrides = _row_major(bdims)
        conv = _STORE[buf.dtype]
        srct = _Tile(src.ptr, tile, _row_major(tile), True) if src.dims != tile else src
        base = f"yr_o{index}"
        w(f"const int64_t {base} = {off};")
        dst_tile = _Tile(f"B{bid}", tile, bstrides, False)
        row_store = buf.dtype in _ROW_STORE and tile[-1] >= _HALF_ROW_MIN
        # along a masked dim the grid splits, the last tile was shifted back: the elements
        # before its own start belong to the block before, which stores them
        own = {
            d: f"(({' + '.join(f'(int64_t){t.var} * {t.stride}' for t in out.offsets[d])})"
            f" - {self._start(out, d)})"
            for d in self._grid_masked(out)
        }
        if own:
            for d, skip in own.items():
                w(f"const int64_t yr_skip{index}_{d} = {skip};")
        masked = bool(self._masked_dims(out) or own)
        if not masked and row_store and srct.strides[-1] == 1:
            with self._nest(w, tile[:-1], simd=False) as ridx:
                idx = [*ridx, "0"]
                dst = self._at_raw(dst_tile, idx).replace(f"B{bid}[", f"&B{bid}[{base} + ", 1)
                conv = _ROW_STORE[buf.dtype]
                w(f"{conv}({srct.ptr} + {srct.off(idx)}, {dst}, {tile[-1]});")
            return
        with self._nest(w, tile) as idx:  # scale_outputs too: they are stored shifted
            dst = self._at_raw(_Tile(f"B{bid}", tile, bstrides, False), idx)
            dst = dst.replace(f"B{bid}[", f"B{bid}[{base} + ", 1)
            guard = self._edge_guard(out, idx)  # masked edge tiles: nothing past the extent
            conds = [guard] if guard is not None else []
            conds += [f"{idx[d]} >= yr_skip{index}_{d}" for d in own]
            guard = " && ".join(conds) if conds else None
            store = f"{dst} = {conv.format(srct.at(idx))};"
            w(f"if ({guard}) {store}" if guard is not None else store)

    def _emit_shift_store(self, w: _Writer, exp: int, store: TileAccess) -> None:
        """The running max of ``exp``'s group, one per row of its argument."""
        mb = store.buffer
        mdims = self.buffers[mb].dims
        tile = store.tile
        rows = self._dims(self.ops[exp].args[0])[:-1]
        dst = _Tile(f"B{mb}", tile, _row_major(mdims), False)
        with w.block(""):
            w(f"const int64_t yr_ms = {self._offset_expr(store.offsets, mdims)};")
            with self._nest(w, tile) as idx:
                w(f"B{mb}[yr_ms + {dst.off(idx)}] = yr_m{exp}[{self._lin(idx[:-1], rows)}];")

    # -- the function ----------------------------------------------------------------------
    def _emit_op(self, w: _Writer, oid: int) -> None:
        op = self.ops[oid]
        kind = op.op
        if kind == "input":
            self._emit_input(w, oid, op)  # views must stay visible: no scope of their own
            if oid in self.dot_a:
                self._emit_dot_operand(w, oid)
            return
        if kind == "accum" and oid in self.fused_accums:
            return
        w(f"{{ /* op {oid}: {kind} */")
        w.ind += 1
        self._emit_op_body(w, oid, op, kind)
        w.ind -= 1
        w("}")
        if kind != "accum" and oid in self.dot_a:  # an accumulator's value is final later
            self._emit_dot_operand(w, oid)

    def _emit_op_body(self, w: _Writer, oid: int, op: TileOp, kind: str) -> None:
        if kind == "unary":
            self._emit_unary(w, oid, op)
        elif kind == "binary":
            self._emit_binary(w, oid, op)
        elif kind == "matmul":
            self._emit_matmul(w, oid, op)
        elif kind in ("reduction", "reduction_to_dimx"):
            self._emit_reduction(w, oid, op)
        elif kind == "rms_norm":
            self._emit_rms_norm(w, oid, op)
        elif kind == "concat":
            self._emit_concat(w, oid, op)
        elif kind == "accum":
            self._emit_accum(w, oid, op)
        else:
            raise self._err(f"unknown tile op {kind!r} (op {oid})")

    def print(self) -> str:
        order = list(self.ops)
        pre = [o for o in order if self.phase[o] == "pre"]
        loop = [o for o in order if self.phase[o] in ("loop", "accum")]
        epi = [o for o in order if self.phase[o] == "epilogue"]
        accums = [o for o in order if self.ops[o].op == "accum"]

        body = _Writer(0)
        for o in accums:
            self._declare_accum(body, o, self.ops[o])
        for e in self.softmax_of_exp:
            x_dims = self._dims(self.ops[e].args[0])
            rows = _prod(x_dims[:-1])
            body(f"float yr_m{e}[{rows}];")
            body(f"float yr_s{e}[{rows}];")
            body(
                f"for (int j = 0; j < {rows}; ++j) {{ yr_m{e}[j] = -INFINITY; yr_s{e}[j] = 1.0f; }}"
            )
            body(f"(void)yr_s{e};")
        if self.carry_ops:
            rows = _prod(self.carry_rows)
            body(f"float yr_cM[{rows}];")
            body(f"float yr_cA[{rows}];")
            body(f"for (int j = 0; j < {rows}; ++j) {{ yr_cM[j] = -INFINITY; yr_cA[j] = 1.0f; }}")
            body("(void)yr_cA;")
        for o in pre:
            self._emit_op(body, o)
        f = self.loop_range
        if f > 1 and any(_walked(i, m.dim) for i in self.k.inputs for m in i.masked):
            # a masked loop: the iterations before the last read whole tiles in place
            self.before_last = True
            with body.block(f"for (int iter = 0; iter < {f - 1}; ++iter)"):
                for o in loop:
                    self._emit_op(body, o)
            self.before_last = False
            with body.block(f"for (int iter = {f - 1}; iter < {f}; ++iter)"):
                for o in loop:
                    self._emit_op(body, o)
        else:
            with body.block(f"for (int iter = 0; iter < {f}; ++iter)"):
                for o in loop:
                    self._emit_op(body, o)
        for o in accums:
            self._finish_accum(body, o, self.ops[o])
        for o in accums:
            if o in self.dot_a:
                self._emit_dot_operand(body, o)
        for o in epi:
            self._emit_op(body, o)
        for i, out in enumerate(self.k.outputs):
            self._emit_output(body, i, out)
        for e, grp in self.softmax_of_exp.items():
            if grp.shift_store is not None:
                self._emit_shift_store(body, e, grp.shift_store)
        return self._function(body)

    @staticmethod
    def _declare(w: _Writer, d: _Decl, decl: str) -> None:
        """One private array's declaration (dot-path arrays only where that path compiles)."""
        if d.dot:
            w("#if defined(YR_MM_BF16_DOT)")
        w(decl)
        if d.dot:
            w("#endif")

    def _function(self, body: _Writer) -> str:
        stores = {g.shift_store.buffer for g in self.k.safe_softmax if g.shift_store is not None}
        loads = {i.shift_load.access.buffer for i in self.k.inputs if i.shift_load is not None}
        used_bufs = sorted(
            {i.buffer for i in self.k.inputs} | {o.buffer for o in self.k.outputs} | stores | loads
        )
        out_bufs = {o.buffer for o in self.k.outputs} | stores
        nblocks = _prod(self.grid)
        heap = sum(d.count for d in self.private_decls) * 4 > _STACK_LIMIT
        w = _Writer()
        w(f"/* kernel {self._name()!r}: grid {list(self.grid)}, forloop_range {self.loop_range} */")
        with w.block(f"int {self.symbol}(void **buffers)"):
            for bid in used_bufs:
                ctype = _DTYPE_C[self.buffers[bid].dtype]
                const = "" if bid in out_bufs else "const "
                w(f"{const}{ctype} *restrict B{bid} = ({const}{ctype} *)buffers[{bid}];")
            w("int yr_status = 0;")
            if nblocks > 1:
                w("#pragma omp parallel num_threads(yr_threads())")
            with w.block(""):
                if heap:
                    total = sum(-(-d.count // 16) * 16 for d in self.private_decls)
                    w(f"float *yr_scratch = (float *)aligned_alloc({self.align}, {total * 4});")
                    w("const int yr_fail = (yr_scratch == NULL);")
                live = [a for a in (2, 1, 0) if self.grid[a] > 1]
                if live:
                    w(f"#pragma omp for collapse({len(live)}) schedule({SCHEDULE})")
                    for a in live[:-1]:
                        v = _BLOCK_VARS[a]
                        w(f"for (int {v} = 0; {v} < {self.grid[a]}; ++{v})")
                    v = _BLOCK_VARS[live[-1]]
                    head = f"for (int {v} = 0; {v} < {self.grid[live[-1]]}; ++{v})"
                else:
                    head = ""
                with w.block(head):
                    for a in (0, 1, 2):
                        if self.grid[a] == 1:
                            w(f"const int {_BLOCK_VARS[a]} = 0;")
                    w("(void)bx; (void)by; (void)bz;")
                    if heap:
                        w("if (yr_fail) continue;" if live else "if (yr_fail) goto yr_done;")
                        off = 0
                        for d in self.private_decls:
                            ptr = "" if d.ctype == "float" else f"({d.ctype} *)"
                            decl = f"{d.ctype} *restrict {d.name} = {ptr}(yr_scratch + {off});"
                            self._declare(w, d, decl)
                            off += -(-d.count // 16) * 16
                    else:
                        for d in self.private_decls:
                            aligned = f"__attribute__((aligned({self.align})))"
                            self._declare(w, d, f"{d.ctype} {d.name}[{d.count}] {aligned};")
                    w.lines.extend(_reindent(body.lines, w.ind))
                    if heap and not live:
                        w("yr_done:;")
                if heap:
                    w("free(yr_scratch);")
                    with w.block("if (yr_fail)"):
                        w("#pragma omp atomic write")
                        w("yr_status = 1;")
            w("return yr_status;")
        return w.text()


def _reindent(lines: list[str], levels: int) -> list[str]:
    pad = "    " * levels
    return [pad + ln if ln else ln for ln in lines]


# -- library kernels printed as C --------------------------------------------------------------

#: Library ops the printer turns into C functions (elementwise, reductions, rms_norm,
#: softmax, matmul). numpy runs elementwise ops on one core with a temporary per step, and
#: its BLAS keeps a thread pool of its own that fights the generated kernels' OpenMP
#: threads for the cores between steps (measured: a 10-kernel plan ran ~2x slower than the
#: sum of its kernels); printed, every step runs on the one OpenMP pool in one pass over
#: memory. concat, chunk and collectives stay with the runtime.
PRINTED_LIBRARY_OPS = frozenset({"unary", "binary", "reduction", "rms_norm", "softmax", "matmul"})
#: Bytes of B tile a printed library matmul streams per for-loop step (about L1d).
_LIB_MM_B_TILE = 32 * 1024
#: A printed library kernel runs on one thread below this many elements (an OpenMP
#: parallel region costs about a microsecond).
_PAR_MIN_ELEMS = 32768
#: Elements per chunk of an elementwise library kernel on float16 (two float temporaries of
#: 4 KiB each stay in L1).
_HALF_CHUNK = 1024
#: Inner-dim chunk of reductions/softmax over a non-last dim (partial sums kept in a local
#: array while the reduced dim is walked).
_LIB_CHUNK = 256


def _pow2_tile(extent: int, cap: int, floor: int = 1) -> int:
    """The largest power of two ≤ ``cap`` dividing ``extent`` (at least ``floor``), else
    ``extent`` itself."""
    t = 1
    while t * 2 <= cap and extent % (t * 2) == 0:
        t *= 2
    return t if t >= floor else extent


def library_matmul_kernel(
    kernel: LibraryKernel, buffers: Mapping[int, Buffer]
) -> GeneratedKernel | None:
    """A library matmul as a generated kernel (grid over N tiles, M tiles and batch, for-loop
    over K tiles, the product added straight into one iteration accumulator), printed by the
    generated kernels' printer; ``None`` where the shapes do not fit that form (numpy runs
    it)."""
    if len(kernel.inputs) != 2 or len(kernel.outputs) != 1:
        return None
    a, b = kernel.inputs
    (c,) = kernel.outputs
    ad, bd, cd = (buffers[x].dims for x in (a, b, c))
    r = len(ad)
    if r < 2 or r > 4 or len(bd) != r or ad[:-2] != bd[:-2] or ad[-1] != bd[-2]:
        return None
    m, k, n = ad[-2], ad[-1], bd[-1]
    if cd != (*ad[:-1], n):
        return None
    batch = ad[:-2]
    nt = _pow2_tile(n, 512, 16)
    mt = m if m <= 64 else _pow2_tile(m, 64, 8)
    if len(batch) == 2 and mt != m:
        return None  # three grid axes at most
    kt = _pow2_tile(k, max(16, _LIB_MM_B_TILE // (4 * nt)), 8)
    axes: list[tuple[int, int, int]] = [(r - 1, n // nt, nt)]  # (dim, parts, tile)
    if mt != m:
        axes.append((r - 2, m // mt, mt))
    axes.extend((d, batch[d], 1) for d in range(len(batch)) if batch[d] > 1)
    if len(axes) > 3:
        return None
    grid = [1, 1, 1]
    var_of: dict[int, tuple[str, int]] = {}
    for ax, (d, parts, tile) in enumerate(axes):
        grid[ax] = parts
        if parts > 1:
            var_of[d] = (_BLOCK_VARS[ax], tile)

    def batch_offsets() -> list[list[OffsetTerm]]:
        """Offsets of the batch dims (one block per batch index), none yet for the last two."""
        return [[OffsetTerm(var_of[d][0], 1)] if d in var_of else [] for d in range(r - 2)] + [
            [],
            [],
        ]

    ct = (*(1 for _ in batch), mt, nt)
    at = (*(1 for _ in batch), mt, kt)
    bt = (*(1 for _ in batch), kt, nt)
    a_off, b_off, c_off = batch_offsets(), batch_offsets(), batch_offsets()
    for d, offs in ((r - 2, (a_off, c_off)), (r - 1, (b_off, c_off))):
        if d in var_of:  # M tiles of A and C, N tiles of B and C
            v, t = var_of[d]
            for o in offs:
                o[d].append(OffsetTerm(v, t))
    f = k // kt
    if f > 1:
        a_off[r - 1].append(OffsetTerm("iter", kt))
        b_off[r - 2].append(OffsetTerm("iter", kt))
    # as the core's lowering would: a loop of one step loads once (phase pre), a looping
    # product adds straight into its accumulator
    phase = "loop" if f > 1 else "pre"

    def frozen(offs: list[list[OffsetTerm]]) -> tuple[tuple[OffsetTerm, ...], ...]:
        return tuple(tuple(x) for x in offs)

    return GeneratedKernel(
        name="matmul",
        grid=(grid[0], grid[1], grid[2]),
        block_threads=1,
        warps=1,
        forloop_range=f,
        inputs=(TileAccess(a, at, frozen(a_off)), TileAccess(b, bt, frozen(b_off))),
        ops=(
            TileOp(0, "input", (), at, phase, {"input": 0}),
            TileOp(1, "input", (), bt, phase, {"input": 1}),
            TileOp(2, "matmul", (0, 1), ct, phase, {}, 3 if f > 1 else None),
            TileOp(3, "accum", (2,), ct, "accum", {"acc": "iter"}),
        ),
        outputs=(TileAccess(c, ct, frozen(c_off), 3),),
        safe_softmax=(),
        smem_bytes=0,
    )


def _pad_dims(dims: Sequence[int], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(dims)) + tuple(int(d) for d in dims)


class _LibraryPrinter:
    """One library kernel of the plan as ``int <symbol>(void **buffers)``."""

    def __init__(self, kernel: LibraryKernel, buffers: Mapping[int, Buffer], symbol: str) -> None:
        self.k = kernel
        self.buffers = buffers
        self.symbol = symbol
        self.op = kernel.op
        self.params = kernel.params
        self.ins = list(kernel.inputs)
        self.outs = list(kernel.outputs)

    def _dims(self, b: int) -> tuple[int, ...]:
        return self.buffers[b].dims

    def _load(self, b: int, idx: str) -> str:
        return _LOAD[self.buffers[b].dtype].format(f"B{b}[{idx}]")

    def _store(self, idx: str, val: str) -> str:
        o = self.outs[0]
        return f"B{o}[{idx}] = {_STORE[self.buffers[o].dtype].format(val)};"

    def _par(self, elems: int, extra: str = "") -> str:
        clause = f" if({elems} >= {_PAR_MIN_ELEMS})" if elems < 1 << 62 else ""
        return f"#pragma omp parallel for{extra} schedule(static) num_threads(yr_threads()){clause}"

    def print(self) -> str:
        w = _Writer()
        w(f"/* library kernel: {self.op} {json.dumps(self.params, sort_keys=True)} */")
        with w.block(f"int {self.symbol}(void **buffers)"):
            for b in sorted(set(self.ins) | set(self.outs)):
                ctype = _DTYPE_C[self.buffers[b].dtype]
                const = "" if b in self.outs else "const "
                w(f"{const}{ctype} *restrict B{b} = ({const}{ctype} *)buffers[{b}];")
            getattr(self, f"_{self.op}")(w)
            w("return 0;")
        return w.text()

    def _unary(self, w: _Writer) -> None:
        (x,) = self.ins
        n = _prod(self._dims(x))
        if n != _prod(self._dims(self.outs[0])):
            raise CodegenError(
                f"unary library kernel: {self._dims(x)} -> {self._dims(self.outs[0])}"
            )
        expr = unary_expr(
            str(self.params.get("op")), [float(v) for v in self.params.get("params", [])], "yr_v"
        )
        if "shift_dims" in self.params:
            self._shifted_exp(w, x)
            return
        if self._halves([x]):
            self._half_chunks(w, n, [x], expr.replace("yr_v", "yr_x0[j]"))
            return
        w(self._par(n, " simd"))
        with w.block(f"for (int64_t i = 0; i < {n}; ++i)"):
            w(f"const float yr_v = {self._load(x, 'i')};")
            w(self._store("i", expr))

    def _halves(self, ins: Sequence[int]) -> bool:
        """Whether an elementwise kernel reads or writes a 16-bit type (it runs in chunks)."""
        return any(self.buffers[b].dtype in _ROW_LOAD for b in (*ins, self.outs[0]))

    def _half_chunks(self, w: _Writer, n: int, ins: Sequence[int], expr: str) -> None:
        """An elementwise kernel over ``n`` elements in chunks of :data:`_HALF_CHUNK`: 16-bit
        operands widen a chunk at a time with the ISA's conversion instructions (the row
        functions) into ``yr_x<k>``, ``expr`` (of ``yr_x<k>[j]``) runs in float into
        ``yr_y``, and a 16-bit result narrows the chunk back."""
        c = _HALF_CHUNK
        w(self._par(n))
        with w.block(f"for (int64_t yr_c = 0; yr_c < {-(-n // c)}; ++yr_c)"):
            w(f"const int64_t i0 = yr_c * {c};")
            w(f"const int64_t yr_n = {n} - i0 < {c} ? {n} - i0 : {c};")
            for k, b in enumerate(ins):
                dtype = self.buffers[b].dtype
                if dtype == "float32":
                    w(f"const float *restrict yr_x{k} = B{b} + i0;")
                    continue
                w(f"float yr_x{k}[{c}] __attribute__((aligned(64)));")
                w(f"{_ROW_LOAD[dtype]}(B{b} + i0, yr_x{k}, yr_n);")
            o = self.outs[0]
            if self.buffers[o].dtype in _ROW_STORE:
                w(f"float yr_y[{c}] __attribute__((aligned(64)));")
                w("#pragma omp simd")
                w(f"for (int64_t j = 0; j < yr_n; ++j) yr_y[j] = {expr};")
                w(f"{_ROW_STORE[self.buffers[o].dtype]}(yr_y, B{o} + i0, yr_n);")
            else:
                w("#pragma omp simd")
                w(f"for (int64_t j = 0; j < yr_n; ++j) {self._store('i0 + j', expr)}")

    def _shifted_exp(self, w: _Writer, x: int) -> None:
        """``exp(x - m)``, m the max over ``shift_dims`` (0 where that max is not finite, so
        infinities and NaNs behave as in the unshifted exp): the plan puts it where the factor
        ``exp(-m)`` cancels before any output (docs/kernel-plan.md)."""
        if self.params.get("op") != "exp":
            raise CodegenError(f"shift_dims on a {self.params.get('op')!r} library kernel")
        dims = _pad_dims(self._dims(x), 4)
        rank = len(self._dims(x))
        shifted = {int(d) % rank + 4 - rank for d in self.params["shift_dims"]}
        mdims = tuple(1 if k in shifted else e for k, e in enumerate(dims))
        mstride = tuple(0 if k in shifted else s for k, s in enumerate(_row_major(mdims)))
        idx = [f"i{k}" for k in range(4)]
        flat = " + ".join(f"{i} * {s}" for i, s in zip(idx, _row_major(dims), strict=True))
        mflat = " + ".join(f"{i} * {s}" for i, s in zip(idx, mstride, strict=True) if s) or "0"
        loops = [f"for (int64_t {i} = 0; {i} < {e}; ++{i})" for i, e in zip(idx, dims, strict=True)]
        w(f"float *yr_m = (float *)malloc({_prod(mdims)} * sizeof(float));")
        w("if (!yr_m) return 1;")
        w(f"for (int64_t j = 0; j < {_prod(mdims)}; ++j) yr_m[j] = -INFINITY;")
        for loop in loops:
            w(loop)
        with w.block(""):
            w(f"const float yr_v = {self._load(x, flat)};")
            w(f"if (yr_v > yr_m[{mflat}]) yr_m[{mflat}] = yr_v;")
        w(f"for (int64_t j = 0; j < {_prod(mdims)}; ++j) if (!isfinite(yr_m[j])) yr_m[j] = 0.0f;")
        w(self._par(_prod(dims), " collapse(4)"))
        for loop in loops:
            w(loop)
        with w.block(""):
            w(self._store(flat, f"expf({self._load(x, flat)} - yr_m[{mflat}])"))
        w("free(yr_m);")

    def _binary(self, w: _Writer) -> None:
        a, b = self.ins
        out = self._dims(self.outs[0])
        name = str(self.params.get("op"))
        template = _BINARY.get(name)
        if template is None:
            raise CodegenError(f"unknown binary op {name!r} in a library kernel")
        n = _prod(out)
        if self._dims(a) == out and self._dims(b) == out and self._halves([a, b]):
            self._half_chunks(w, n, [a, b], template.format(a="yr_x0[j]", b="yr_x1[j]"))
            return
        if self._dims(a) == out and self._dims(b) == out:
            w(self._par(n, " simd"))
            with w.block(f"for (int64_t i = 0; i < {n}; ++i)"):
                val = template.format(a=self._load(a, "i"), b=self._load(b, "i"))
                w(self._store("i", val))
            return
        rank = max(4, len(out))
        od = _pad_dims(out, rank)

        def bstrides(buf: int) -> tuple[int, ...]:
            d = _pad_dims(self._dims(buf), rank)
            for x, y in zip(d, od, strict=True):
                if x != y and x != 1:
                    raise CodegenError(f"binary library kernel: {self._dims(buf)} vs output {out}")
            st = _row_major(d)
            return tuple(0 if x == 1 else s for x, s in zip(d, st, strict=True))

        sa, sb = bstrides(a), bstrides(b)
        so = _row_major(od)
        outer = od[:-1]
        idx = [f"i{k}" for k in range(len(outer))]
        w(self._par(n, f" collapse({len(outer)})"))
        for k, e in enumerate(outer):
            w(f"for (int64_t {idx[k]} = 0; {idx[k]} < {e}; ++{idx[k]})")
        with w.block(""):

            def base(st: tuple[int, ...]) -> str:
                terms = [f"{i} * {s}" for i, s in zip(idx, st[:-1], strict=True) if s]
                return " + ".join(terms) if terms else "0"

            w(f"const int64_t yr_a = {base(sa)}, yr_b = {base(sb)}, yr_o = {base(so)};")
            w("#pragma omp simd")
            with w.block(f"for (int64_t j = 0; j < {od[-1]}; ++j)"):

                def el(buf: int, s: int, b0: str) -> str:
                    idx = f"{b0} + j" if s == 1 else f"{b0} + j * {s}" if s else b0
                    return self._load(buf, idx)

                val = template.format(a=el(a, sa[-1], "yr_a"), b=el(b, sb[-1], "yr_b"))
                w(self._store("yr_o + j", val))

    def _split(self, dims: tuple[int, ...], dim: int) -> tuple[int, int, int]:
        return _prod(dims[:dim]), dims[dim], _prod(dims[dim + 1 :])

    def _reduction(self, w: _Writer) -> None:
        (x,) = self.ins
        xd = self._dims(x)
        dim = int(self.params.get("dim", -1)) % len(xd)
        outer, red, inner = self._split(xd, dim)
        if _prod(self._dims(self.outs[0])) != outer * inner:
            raise CodegenError(
                f"reduction library kernel: {xd} over {dim} -> {self._dims(self.outs[0])}"
            )
        if inner == 1:
            w(self._par(outer * red))
            with w.block(f"for (int64_t o = 0; o < {outer}; ++o)"):
                w("float yr_s = 0.0f;")
                w("#pragma omp simd reduction(+:yr_s)")
                with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                    w(f"yr_s += {self._load(x, f'o * {red} + r')};")
                w(self._store("o", "yr_s"))
            return
        with self._column_chunks(w, outer, red, inner) as c:
            w(f"float yr_acc[{c}] __attribute__((aligned(64)));")
            w("#pragma omp simd")
            w("for (int64_t j = 0; j < jn; ++j) yr_acc[j] = 0.0f;")
            with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                w(f"const int64_t yr_x = (o * {red} + r) * {inner} + j0;")
                w("#pragma omp simd")
                w(f"for (int64_t j = 0; j < jn; ++j) yr_acc[j] += {self._load(x, 'yr_x + j')};")
            w("#pragma omp simd")
            with w.block("for (int64_t j = 0; j < jn; ++j)"):
                w(self._store(f"o * {inner} + j0 + j", "yr_acc[j]"))

    @contextlib.contextmanager
    def _column_chunks(self, w: _Writer, outer: int, red: int, inner: int) -> Iterator[int]:
        """Parallel ``for o`` x ``for jb`` over chunks of at most ``_LIB_CHUNK`` of the
        ``inner`` columns of a reduction over a strided dim (``j0``: first column, ``jn``:
        columns in this chunk); yields the chunk size."""
        c = min(_LIB_CHUNK, inner)
        w(self._par(outer * red * inner, " collapse(2)"))
        w(f"for (int64_t o = 0; o < {outer}; ++o)")
        with w.block(f"for (int64_t jb = 0; jb < {-(-inner // c)}; ++jb)"):
            w(f"const int64_t j0 = jb * {c};")
            w(f"const int64_t jn = j0 + {c} < {inner} ? {c} : {inner} - j0;")
            yield c

    def _rms_norm(self, w: _Writer) -> None:
        x = self.ins[0]
        xd = self._dims(x)
        nn = int(self.params.get("num_normalized_dims", 1))
        cols = _prod(xd[len(xd) - nn :])
        rows = _prod(xd) // max(1, cols)
        eps = _flt(float(self.params.get("eps", 0.0)))
        weight = self.ins[1] if self.params.get("has_weight") and len(self.ins) > 1 else None
        if weight is not None and _prod(self._dims(weight)) != cols:
            raise CodegenError(
                f"rms_norm library kernel: weight {self._dims(weight)} vs {cols} columns"
            )
        w(self._par(rows * cols))
        with w.block(f"for (int64_t o = 0; o < {rows}; ++o)"):
            w(f"const int64_t yr_r = o * {cols};")
            w("float yr_s = 0.0f;")
            w("#pragma omp simd reduction(+:yr_s)")
            with w.block(f"for (int64_t j = 0; j < {cols}; ++j)"):
                w(f"const float yr_v = {self._load(x, 'yr_r + j')};")
                w("yr_s += yr_v * yr_v;")
            w(f"const float yr_f = 1.0f / sqrtf(yr_s / {_flt(cols)} + {eps});")
            w("#pragma omp simd")
            with w.block(f"for (int64_t j = 0; j < {cols}; ++j)"):
                val = f"{self._load(x, 'yr_r + j')} * yr_f"
                if weight is not None:
                    val = f"{val} * {self._load(weight, 'j')}"
                w(self._store("yr_r + j", val))

    def _softmax(self, w: _Writer) -> None:
        (x,) = self.ins
        xd = self._dims(x)
        dim = int(self.params.get("dim", -1)) % len(xd)
        outer, red, inner = self._split(xd, dim)
        # Three passes over each row (max, sum of exp, normalised exp): the row is in cache,
        # and the output may be a 16-bit buffer that cannot hold the unnormalised exp.
        if inner == 1:
            w(self._par(outer * red))
            with w.block(f"for (int64_t o = 0; o < {outer}; ++o)"):
                w(f"const int64_t yr_r = o * {red};")
                w("float yr_m = -INFINITY;")
                w("#pragma omp simd reduction(max:yr_m)")
                with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                    w(f"const float yr_v = {self._load(x, 'yr_r + r')};")
                    w("yr_m = yr_v > yr_m ? yr_v : yr_m;")
                w("float yr_s = 0.0f;")
                w("#pragma omp simd reduction(+:yr_s)")
                e = f"yr_exp({self._load(x, 'yr_r + r')} - yr_m)"
                w(f"for (int64_t r = 0; r < {red}; ++r) yr_s += {e};")
                w("const float yr_f = 1.0f / yr_s;")
                w("#pragma omp simd")
                with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                    w(self._store("yr_r + r", f"yr_exp({self._load(x, 'yr_r + r')} - yr_m) * yr_f"))
            return
        with self._column_chunks(w, outer, red, inner) as c:
            w(f"float yr_m[{c}] __attribute__((aligned(64)));")
            w(f"float yr_s[{c}] __attribute__((aligned(64)));")
            with w.block("for (int64_t j = 0; j < jn; ++j)"):
                w("yr_m[j] = -INFINITY;")
                w("yr_s[j] = 0.0f;")
            xi = f"(o * {red} + r) * {inner} + j0 + j"
            with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                w("#pragma omp simd")
                with w.block("for (int64_t j = 0; j < jn; ++j)"):
                    w(f"const float yr_v = {self._load(x, xi)};")
                    w("yr_m[j] = yr_v > yr_m[j] ? yr_v : yr_m[j];")
            with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                w("#pragma omp simd")
                e = f"yr_exp({self._load(x, xi)} - yr_m[j])"
                w(f"for (int64_t j = 0; j < jn; ++j) yr_s[j] += {e};")
            w("for (int64_t j = 0; j < jn; ++j) yr_s[j] = 1.0f / yr_s[j];")
            with w.block(f"for (int64_t r = 0; r < {red}; ++r)"):
                w("#pragma omp simd")
                with w.block("for (int64_t j = 0; j < jn; ++j)"):
                    w(self._store(xi, f"yr_exp({self._load(x, xi)} - yr_m[j]) * yr_s[j]"))


# -- the whole program -----------------------------------------------------------------------

_PRELUDE = r"""/* Generated by yirage-cpu (printer version %(codegen)s) from a yirage.kernel_plan.
 * graph %(graph_hash)s; SIMD width %(simd)d bits.
 * One function per generated kernel: int yr_<name>(void **buffers), buffers indexed by
 * plan buffer id. Returns 0 on success, nonzero when scratch memory could not be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

/* float16 and bfloat16 are storage types only: loads widen to float, the arithmetic is
 * float, stores round back to nearest even. The element conversions below are branch-free
 * integer/float code that GCC and Clang vectorise inside the `omp simd` loops on any ISA
 * (subnormals, infinities and NaN exact). Whole contiguous rows of float16 go through
 * yr_h2f_row/yr_f2h_row, which use the widest conversion instruction the compile targets:
 * one path per ISA, chosen at compile time (YR_HALF_PATH, reported by yr_half_path()). */
#if defined(YR_SOFT_HALF)
#define YR_HALF_PATH "portable"
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__)
#define YR_HALF_PATH "avx512f"
#define YR_HALF_AVX512 1
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__F16C__) && defined(__AVX__)
#define YR_HALF_PATH "f16c"
#define YR_HALF_F16C 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define YR_HALF_PATH "neon"
#define YR_HALF_NEON 1
#else
#define YR_HALF_PATH "portable"
#endif
#if defined(YR_HALF_AVX512) || defined(YR_HALF_F16C)
#include <immintrin.h>
#elif defined(YR_HALF_NEON)
#include <arm_neon.h>
#endif

typedef uint16_t yr_half;
static inline float yr_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t yr_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* binary16 -> float, exact: the bits moved into float position and scaled by 2^112 (this
 * also scales subnormals right); exponent 31 becomes infinity / NaN with its payload. */
static inline float yr_h2f(yr_half h) {
    const int32_t em = (int32_t)(h & 0x7fffu);
    const int32_t fin = (int32_t)yr_f2u(yr_u2f((uint32_t)em << 13) * 0x1p112f);
    const int32_t inf = (int32_t)(0x7f800000u | ((uint32_t)em << 13));
    const int32_t bits = em >= 0x7c00 ? inf : fin;
    return yr_u2f((uint32_t)bits | ((uint32_t)(h & 0x8000u) << 16));
}

/* float -> binary16, round to nearest even: above the largest half, infinity (or a quiet
 * NaN); below the smallest normal half, the float adder rounds |f| + 0.5 at the subnormal
 * step; otherwise the exponent is rebiased and the mantissa rounded in integer arithmetic.
 * Signed compares: SSE2 has no unsigned ones. */
static inline yr_half yr_f2h(float f) {
    const uint32_t u = yr_f2u(f);
    const int32_t a = (int32_t)(u & 0x7fffffffu);
    const int32_t big = a > 0x7f800000 ? 0x7e00 : 0x7c00;
    const int32_t sub = (int32_t)yr_f2u(yr_u2f((uint32_t)a) + 0.5f) - 0x3f000000;
    const int32_t nrm = (int32_t)(((uint32_t)a + 0xc8000fffu + (((uint32_t)a >> 13) & 1u)) >> 13);
    const int32_t h = a >= 0x47800000 ? big : (a < 0x38800000 ? sub : nrm);
    return (yr_half)((uint32_t)h | ((u >> 16) & 0x8000u));
}

/* The elements the conversion instructions leave over (all of them on the portable path). */
static inline void yr_h2f_tail(const yr_half *restrict src, float *restrict dst, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = yr_h2f(src[j]);
}
static inline void yr_f2h_tail(const float *restrict src, yr_half *restrict dst, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = yr_f2h(src[j]);
}

/* n contiguous float16 -> float (dst[i] = yr_h2f(src[i])). */
static inline void yr_h2f_row(const yr_half *restrict src, float *restrict dst, int64_t n) {
    int64_t i = 0;
#if defined(YR_HALF_AVX512)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#elif defined(YR_HALF_F16C)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#elif defined(YR_HALF_NEON)
    for (; i + 4 <= n; i += 4)
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
#endif
    yr_h2f_tail(src + i, dst + i, n - i);
}

/* n contiguous float -> float16, round to nearest even (dst[i] = yr_f2h(src[i])). */
static inline void yr_f2h_row(const float *restrict src, yr_half *restrict dst, int64_t n) {
    int64_t i = 0;
#if defined(YR_HALF_AVX512)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(YR_HALF_F16C)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(YR_HALF_NEON)
    for (; i + 4 <= n; i += 4)
        vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
#endif
    yr_f2h_tail(src + i, dst + i, n - i);
}

/* The float16 conversion path this compile took. */
const char *yr_half_path(void) { return YR_HALF_PATH; }

/* One SIMD register of floats (GCC/Clang vector extension). */
typedef float yr_vf __attribute__((vector_size(%(vlb)d)));

/* bfloat16 is the top half of a float: widening is a shift (vpslld), narrowing rounds to
 * nearest even in integer arithmetic (keeps subnormals, which vcvtneps2bf16 flushes) and
 * quiets NaN. Both vectorise in plain C. */
static inline float yr_bf2f(uint16_t v) { return yr_u2f((uint32_t)v << 16); }
static inline uint16_t yr_f2bf(float f) {
    const uint32_t u = yr_f2u(f);
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);
}

static inline void yr_f2bf_tail(const float *restrict src, uint16_t *restrict dst, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = yr_f2bf(src[j]);
}

/* n contiguous bfloat16 -> float (a shift each: vectorised as it is). */
static inline void yr_bf2f_row(const uint16_t *restrict src, float *restrict dst, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = yr_bf2f(src[j]);
}

/* n contiguous float -> bfloat16. With AVX512-BF16, vcvtneps2bf16 narrows 16 floats at once
 * (nearest even, NaN quieted); it flushes subnormals to zero, so a vector holding one goes
 * through yr_f2bf instead (then the result is the same bit for bit). */
static inline void yr_f2bf_row(const float *restrict src, uint16_t *restrict dst, int64_t n) {
    int64_t i = 0;
#if !defined(YR_SOFT_HALF) && defined(__AVX512BF16__) && defined(__AVX512F__)
    const __m512i yr_abs = _mm512_set1_epi32(0x7fffffff), yr_exp = _mm512_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(src + i);
        const __m512i u = _mm512_castps_si512(v);
        const __mmask16 tiny = _mm512_mask_testn_epi32_mask(
            _mm512_test_epi32_mask(u, yr_abs), u, yr_exp);
        if (tiny) {
            for (int k = 0; k < 16; ++k) dst[i + k] = yr_f2bf(src[i + k]);
        } else {
            const __m256bh r = _mm512_cvtneps_pbh(v);
            memcpy(dst + i, &r, 32);
        }
    }
#endif
    yr_f2bf_tail(src + i, dst + i, n - i);
}

%(vec_widen)s
/* exp for float that vectorises (no libm call, no branches: GCC if-converts the selects):
 * Cody-Waite range reduction around n = rint(x / ln 2) and a degree-6 polynomial (about
 * 1 ulp); the scale 2^n is applied in two halves so results underflow to denormals/zero
 * and overflow to infinity like expf. NaN propagates. */
static inline float yr_exp(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    xc = (x != x) ? 0.0f : xc;
    const float fn = rintf(xc * 1.44269504088896341f);
    const int32_t n = (int32_t)fn;
    float r = xc - fn * 0.693359375f;
    r = r + fn * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t n1 = n >> 1;
    const int32_t n2 = n - n1;
    const uint32_t b1 = (uint32_t)(n1 + 127) << 23;
    const uint32_t b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    const float y = p * s1 * s2;
    return (x != x) ? x : y;
}

/* A read prefetch into L2 (prefetcht1 on x86, PRFM PLDL2KEEP on Arm), of the B rows a matmul
 * streams from memory; defined before this prelude, it replaces the builtin. */
#ifndef YR_PREFETCH
#define YR_PREFETCH(p) __builtin_prefetch((p), 0, 2)
#endif

/* Threads of the next parallel region, written by the runtime before each call (it follows
 * the idle cores: yirage_cpu._threads); 0 or less: OpenMP's default. */
int yr_nt = 0;
static inline int yr_threads(void) { return yr_nt > 0 ? yr_nt : omp_get_max_threads(); }
"""


def _f16_vec_c(vlb: int) -> str:
    """The body of ``yr_h2f_vec`` for a ``vlb``-byte register: the ISA's conversion
    instruction per 8 (or 16) floats on the F16C / AVX-512 / NEON paths, else yr_h2f per
    element (the portable path)."""
    vl = vlb // 4
    lines = []
    if vlb == 64:
        lines += [
            "#if defined(YR_HALF_AVX512)",
            "    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));",
            "    memcpy(f, &x, 64);",
            "#elif defined(YR_HALF_F16C)",
        ]
    else:
        lines.append("#if defined(YR_HALF_AVX512) || defined(YR_HALF_F16C)")
    if vlb >= 32:
        lines += [
            f"    for (int c = 0; c < {vl // 8}; ++c) {{",
            "        const __m128i h = _mm_loadu_si128((const __m128i *)(p + 8 * c));",
            "        const __m256 x = _mm256_cvtph_ps(h);",
            "        memcpy((float *)f + 8 * c, &x, 32);",
            "    }",
        ]
    elif vlb == 16:
        lines += [
            "    const __m128 x = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));",
            "    memcpy(f, &x, 16);",
        ]
    else:
        lines.append(f"    for (int i = 0; i < {vl}; ++i) (*f)[i] = yr_h2f(p[i]);")
    if vlb >= 16:
        lines += [
            "#elif defined(YR_HALF_NEON)",
            f"    for (int c = 0; c < {vl // 4}; ++c)",
            "        vst1q_f32((float *)f + 4 * c,",
            "                  vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * c))));",
        ]
    lines += ["#else", f"    for (int i = 0; i < {vl}; ++i) (*f)[i] = yr_h2f(p[i]);", "#endif"]
    return "\n".join(lines)


def _vec_widen_c(vlb: int, bf16_dot: bool = False) -> str:
    """``yr_bf2f_vec`` / ``yr_h2f_vec``: one register of floats from 16-bit memory, for a
    matmul that reads its B tile in place (none for registers of one float: the micro-kernel
    is not printed then); with ``bf16_dot``, the bfloat16 dot path's helpers too."""
    if vlb < 8:
        return _MATMUL_HALF_PATH % {"bf16_isa": "0", "bf16_dot": "0"}
    isa = "!defined(YR_SOFT_HALF) && defined(__AVX2__)" if vlb >= 32 else "0"
    dot = "!defined(YR_SOFT_HALF) && defined(__AVX512BF16__) && defined(__AVX512BW__)"
    paths = {"bf16_isa": isa, "bf16_dot": dot if bf16_dot else "0"}
    return (
        _MATMUL_HALF_PATH % paths
        + _BF16_DOT
        + _VEC_WIDEN
        % {
            "vlb": vlb,
            "hvlb": vlb // 2,
            "f16_body": _f16_vec_c(vlb),
            "bf16_body": _bf16_vec_c(vlb),
        }
    )


def _bf16_vec_c(vlb: int) -> str:
    """The body of ``yr_bf2f_vec``: ``vpmovzxwd`` + ``vpslld`` per 8 or 16 floats with
    AVX2 / AVX-512 (GCC splits the generic form into halves and re-joins them), the vector
    extension's zero extension and shift elsewhere."""
    vl = vlb // 4
    generic = [
        "    yr_vh h;",
        "    memcpy(&h, p, sizeof h);",
        "    const yr_vu u = __builtin_convertvector(h, yr_vu) << 16;",
        "    memcpy(f, &u, sizeof *f);",
    ]
    if vlb < 32:
        return "\n".join(generic)
    if vlb == 64:
        lines = [
            "#if !defined(YR_SOFT_HALF) && defined(__AVX512F__)",
            "    const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));",
            "    const __m512i u = _mm512_slli_epi32(x, 16);",
            "    memcpy(f, &u, 64);",
            "#elif !defined(YR_SOFT_HALF) && defined(__AVX2__)",
        ]
    else:
        lines = ["#if !defined(YR_SOFT_HALF) && defined(__AVX2__)"]
    lines += [
        f"    for (int c = 0; c < {vl // 8}; ++c) {{",
        "        const __m128i h = _mm_loadu_si128((const __m128i *)(p + 8 * c));",
        "        const __m256i x = _mm256_cvtepu16_epi32(h);",
        "        const __m256i u = _mm256_slli_epi32(x, 16);",
        "        memcpy((float *)f + 8 * c, &u, 32);",
        "    }",
        "#else",
        *generic,
        "#endif",
    ]
    return "\n".join(lines)


_MATMUL_HALF_PATH = r"""/* How a matmul multiplies 16-bit B tiles in this compile
 * (yr_matmul_half_path): bfloat16 by AVX512-BF16 dot products (YR_MM_BF16_DOT) where A
 * is bfloat16 too, else widened with AVX2 / AVX-512 zero extensions (or the portable
 * vector code); float16 widened by YR_HALF_PATH. */
#if %(bf16_dot)s
#define YR_MM_BF16_DOT 1
#define YR_MM_BF16_PATH "avx512_bf16"
#elif %(bf16_isa)s
#define YR_MM_BF16_PATH "avx2"
#else
#define YR_MM_BF16_PATH "portable"
#endif
const char *yr_matmul_half_path(void) {
    return "bfloat16 " YR_MM_BF16_PATH ", float16 " YR_HALF_PATH;
}
"""

_BF16_DOT = r"""#if defined(YR_MM_BF16_DOT)
/* The bfloat16 dot path: vdpbf16ps adds a[k]*b[k] + a[k+1]*b[k+1] per 32-bit lane, the
 * pairs in the low and high halves. B's rows k and k+1 interleaved by vpunpcklwd /
 * vpunpckhwd give the pairs of columns 0-3, 8-11, 16-19, 24-27 (low) and 4-7, 12-15, 20-23,
 * 28-31 (high) of a 32-column unit; YR_DOT_COLS0/1 put the sums of columns 0-15 / 16-31
 * back in order. A's pair is one 32-bit word, broadcast. Subnormal inputs count as zero
 * and subnormal results are flushed (the instruction ignores MXCSR). */
#include <immintrin.h>
#define YR_BF_LO(r0, r1) ((__m512bh)_mm512_unpacklo_epi16((r0), (r1)))
#define YR_BF_HI(r0, r1) ((__m512bh)_mm512_unpackhi_epi16((r0), (r1)))
#define YR_BF_PAIR(q) ((__m512bh)_mm512_set1_epi32((int)(q)))
#define YR_DOT_COLS0(lo, hi) _mm512_permutex2var_ps((lo), _mm512_setr_epi32( \
    0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), (hi))
#define YR_DOT_COLS1(lo, hi) _mm512_permutex2var_ps((lo), _mm512_setr_epi32( \
    8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), (hi))
#endif
"""

_VEC_WIDEN = r"""/* A matmul's B tile of float16/bfloat16 is read in place and widened one register
 * at a time as the micro-kernel loads it (no float copy of the tile is staged). bfloat16:
 * zero extension and a shift (vpmovzxwd + vpslld with AVX2 / AVX-512, the vector
 * extension's code elsewhere); float16: the conversion instruction of YR_HALF_PATH, yr_h2f
 * per element when portable. */
#if !defined(YR_SOFT_HALF) && (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__)
#include <immintrin.h>
#endif
typedef uint16_t yr_vh __attribute__((vector_size(%(hvlb)d)));
typedef uint32_t yr_vu __attribute__((vector_size(%(vlb)d)));
static inline void yr_bf2f_vec(const uint16_t *restrict p, yr_vf *restrict f) {
%(bf16_body)s
}
static inline void yr_h2f_vec(const yr_half *restrict p, yr_vf *restrict f) {
%(f16_body)s
}
"""


def _graph_dtype(buffers: Sequence[Buffer]) -> str | None:
    """The dtype every input and output buffer of the plan shares (the graph's: the IR
    rejects mixed dtypes), None where they differ (a hand-written plan)."""
    dtypes = {b.dtype for b in buffers if b.role in ("input", "output")}
    return dtypes.pop() if len(dtypes) == 1 else None


def bf16_dot_enabled(simd_width_bits: int, isa_features: Collection[str] | None) -> bool:
    """Whether matmuls print the bfloat16 dot path (compiled where the flags enable
    AVX512-BF16): 512-bit vectors and a target whose ``isa_features`` name ``avx512_bf16``
    (None: not pinned, the preprocessor alone decides)."""
    return simd_width_bits >= 512 and (isa_features is None or "avx512_bf16" in isa_features)


def generate(
    plan: Any,
    *,
    simd_width_bits: int = 256,
    isa_features: Collection[str] | None = None,
    bf16_dot: bool = True,
) -> CpuSource:
    """Print ``plan`` (anything :func:`yirage.plan.parse_plan` reads: a dict, JSON text, an
    object with ``to_json()``) as C source for ``simd_width_bits``-wide vectors.
    ``isa_features`` pins the target's vector ISA features (/proc/cpuinfo's spelling, as
    :func:`yirage_cpu._device_spec.isa_features` records them): an ISA path whose feature
    it lacks is not printed (the bfloat16 dot path needs ``avx512_bf16``); None prints every
    path and the preprocessor picks by the compile flags. ``bf16_dot=False`` leaves the
    bfloat16 dot path out where the target has it (its matmuls widen B instead)."""
    p = parse_plan(plan)
    for b in p.buffers:
        if b.dtype not in _DTYPE_C:
            raise CodegenError(
                f"plan buffer {b.id} has dtype {b.dtype!r}; the CPU backend supports "
                f"{', '.join(_DTYPE_C)}"
            )
    buffers = {b.id: b for b in p.buffers}
    dot = bf16_dot and bf16_dot_enabled(simd_width_bits, isa_features)
    took_dot = False
    graph_dtype = _graph_dtype(p.buffers)
    functions: list[str] = []
    steps: list[Step] = []
    used: set[str] = set()
    for index, kernel in enumerate(p.kernels):
        if isinstance(kernel, LibraryKernel):
            op = kernel.op
            gk = library_matmul_kernel(kernel, buffers) if op == "matmul" else None
            if op not in PRINTED_LIBRARY_OPS or (op == "matmul" and gk is None):
                steps.append(Step("library", index))
                continue
            symbol = f"yr_lib{index}_{_ident(op)}"
            used.add(symbol)
            if gk is not None:
                printer = _KernelPrinter(gk, buffers, symbol, simd_width_bits, dot, graph_dtype)
                functions.append(printer.print())
                took_dot = took_dot or bool(printer.dot_mm)
            else:
                functions.append(_LibraryPrinter(kernel, buffers, symbol).print())
            steps.append(Step("generated", index, symbol))
            continue
        base = "yr_" + _ident(kernel.name)
        symbol = base
        n = 1
        while symbol in used:
            symbol = f"{base}_{n}"
            n += 1
        used.add(symbol)
        printer = _KernelPrinter(kernel, buffers, symbol, simd_width_bits, dot, graph_dtype)
        functions.append(printer.print())
        took_dot = took_dot or bool(printer.dot_mm)
        steps.append(Step("generated", index, symbol))
    plan_dict: dict[str, Any] = json.loads(p.text)
    prelude = _PRELUDE % {
        "codegen": CODEGEN_VERSION,
        "graph_hash": str(plan_dict.get("graph_hash", "?"))[:64].replace("*/", ""),
        "simd": simd_width_bits,
        "vlb": max(4, simd_width_bits // 8),
        "vec_widen": _vec_widen_c(max(4, simd_width_bits // 8), dot),
    }
    code = prelude + "\n" + "\n\n".join(functions) + "\n"
    return CpuSource(
        code=code,
        plan=plan_dict,
        steps=tuple(steps),
        simd_width_bits=simd_width_bits,
        bf16_dot=took_dot,
    )
