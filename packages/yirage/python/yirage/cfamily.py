"""The C-family SIMT printer shared by the CUDA C++ (yirage-cuda) and Metal Shading Language
(yirage-mps) code generators.

Both languages print a generated kernel of an analysed KernelPlan (:mod:`yirage.plan`) the
same way: every tile value lives in block-shared memory (CUDA ``__shared__``, Metal
``threadgroup``), loaded tiles in their buffer dtype and computed values in fp32, slots reused
once their value is dead (first-fit over live ranges); ops run one after another over the
whole block with a barrier between them; elementwise ops use a block-stride loop, reductions
along the last dim one warp (SIMD-group) per row with a warp reduction, other reductions one
thread per output; accumulators, hoisted phases, safe-softmax groups (the plan's rescale
degrees, ``scale_outputs`` stored shifted, the row max stored at ``shift_store``) and the
``shift_carry`` follow docs/kernel-plan.md. Masked edge tiles (an access's ``masked`` dims)
guard every global load and store of the access by the element's global index against the
buffer's extent: a load reads zero past it, a store writes nothing there; the zeros then take
part in every op like any tile element, as the IR defines them (the search masks only dims no
op reduces). An exp over a masked loop's padding (the op's ``masked`` dim) is zero there, and a
safe-softmax group's max leaves the padding out (:meth:`CFamilyPrinter.loop_valid`).
:class:`CFamilyPrinter` holds that structure; a dialect subclass says how the language spells
types, conversions, math functions, barriers, warp reductions, the kernel signature and the
shared-memory declaration, and may print tile matmuls and loads its own way (tensor-core MMA,
``simdgroup_matrix``, vector loads).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from yirage.plan import CodegenError, GeneratedKernel, Plan, TileAccess, TileOp

__all__ = [
    "ALIGN",
    "CFamilyPrinter",
    "Slot",
    "Step",
    "bcast_index",
    "c_float",
    "const_code",
    "coord",
    "strides",
]

#: Byte alignment of every shared-memory slot (16: vector loads and 8x8 matrix loads).
ALIGN = 16


def const_code(lines: list[str]) -> Callable[[], list[str]]:
    """A step's code that was printed eagerly."""
    return lambda: lines


def strides(dims: Sequence[int]) -> list[int]:
    """Row-major strides of ``dims`` (in elements)."""
    out = [1] * len(dims)
    for d in range(len(dims) - 2, -1, -1):
        out[d] = out[d + 1] * dims[d + 1]
    return out


def coord(i: str, dims: Sequence[int], d: int) -> str:
    """Coordinate along dim ``d`` of flat index ``i`` over ``dims`` (row-major)."""
    s = strides(dims)[d]
    if dims[d] == 1:
        return "0"
    expr = i if s == 1 else f"({i} / {s})"
    if d == 0:
        return expr
    return f"({expr} % {dims[d]})"


def bcast_index(i: str, out_dims: Sequence[int], src_dims: Sequence[int]) -> str:
    """Flat index into a ``src_dims`` operand broadcast to ``out_dims`` for out index ``i``."""
    if tuple(out_dims) == tuple(src_dims):
        return i
    ss = strides(src_dims)
    terms = []
    for d, n in enumerate(src_dims):
        if n == 1:
            continue
        c = coord(i, out_dims, d)
        terms.append(c if ss[d] == 1 else f"{c} * {ss[d]}")
    return " + ".join(terms) if terms else "0"


def c_float(x: float, inf: str = "(1.0f/0.0f)", nan: str = "(0.0f/0.0f)") -> str:
    """A float literal of ``x`` in C syntax that round-trips; ``inf`` and ``nan`` spell the
    non-finite values (-inf is ``inf`` negated)."""
    if math.isinf(x):
        return inf if x > 0 else f"(-{inf})"
    if math.isnan(x):
        return nan
    r = repr(float(x))
    if "e" not in r and "." not in r:
        r += ".0"
    return f"{r}f"


@dataclass
class Slot:
    """A tile value in block-shared memory: fp32 (``kind`` "f32") or a 16-bit buffer dtype.
    ``storage`` is its element type in the dialect and ``read_fmt`` formats one element read
    as fp32 (``{}`` is the element)."""

    name: str
    kind: str  # "f32" | "float16" | "bfloat16"
    numel: int
    storage: str = "float"
    read_fmt: str = "{}"
    start: int = 0  # live range (schedule positions)
    end: int = 0
    offset: int = -1

    @property
    def nbytes(self) -> int:
        return self.numel * (4 if self.kind == "f32" else 2)

    def ctype(self) -> str:
        return self.storage

    def read(self, idx: str) -> str:
        return self.read_fmt.format(f"{self.name}[{idx}]")


@dataclass
class Step:
    """One scheduled piece of code with the slots it defines and reads (``section``: pre,
    init, loop or post; the allocator keeps values read in the loop live for all of it)."""

    code: Callable[[], list[str]]
    defines: list[Slot] = field(default_factory=list)
    reads: list[Slot] = field(default_factory=list)
    temps: list[Slot] = field(default_factory=list)
    section: str = "pre"  # pre | loop | post


class CFamilyPrinter:
    """Prints one generated kernel of a plan in a C-family SIMT language.

    Subclasses set the dialect: the class attributes below and :meth:`storage_type`,
    :meth:`read_fmt`, :meth:`write_fmt`, :meth:`kernel_head`; they may override
    :meth:`matmul_step` and :meth:`vector_load`. :meth:`build` returns the kernel's lines and
    the shared-memory bytes it needs (a :class:`yirage.plan.CodegenError` when that exceeds
    ``smem_limit``).
    """

    #: the language's name in error messages ("CUDA C++", "MSL")
    LANGUAGE: str
    #: the block barrier statement
    SYNC: str
    #: -inf as an fp32 expression
    NEG_INF: str
    #: +inf and NaN as fp32 expressions (for literals of non-finite op parameters)
    INF: str
    NAN: str
    #: the warp (SIMD-group) sum and max of a float over the 32 lanes
    WARP_SUM: str
    WARP_MAX: str
    #: stride of the lane loop of a row reduction; the condition of the lane that writes
    LSTRIDE: str
    LANE0: str
    #: the 64-bit index type and its literal suffix
    INDEX: str
    INDEX_SUFFIX: str
    #: fp32 math functions by name: exp, max, min, sqrt, rsqrt, tanh, erf, pow
    MATH: ClassVar[Mapping[str, str]]

    def __init__(self, plan: Plan, k: GeneratedKernel, smem_limit: int) -> None:
        self.plan = plan
        self.k = k
        self.smem_limit = smem_limit
        self.placed: list[Slot] = []
        self.smem_bytes = 0  # set by allocate()
        self.threads = max(32, ((k.block_threads + 31) // 32) * 32)
        self.warps = self.threads // 32
        self.by_id = {o.id: o for o in k.ops}
        self.slots: dict[int, Slot] = {}
        self.steps: list[Step] = []
        self.params: list[int] = []
        self.stores = [g.shift_store for g in k.safe_softmax if g.shift_store is not None]
        shifts = [a.shift_load.access for a in k.inputs if a.shift_load is not None]
        for acc in (*k.inputs, *k.outputs, *shifts, *self.stores):
            if acc.buffer not in self.params:
                self.params.append(acc.buffer)
        # accumulator id -> the matmul that adds into it in place (the plan's accumulate_into):
        # such a product takes no slot of its own
        self.fused_accums = k.fused_accums()
        self.group_of_exp = {g.exp: i for i, g in enumerate(k.safe_softmax)}
        self.groups_of_acc: dict[int, list[int]] = {}
        for i, g in enumerate(k.safe_softmax):
            for r in g.rescale:  # the plan's rescale degrees
                if r.degree != 1:
                    raise CodegenError(
                        f"kernel {k.name!r}: accumulator {r.accum} holds exp(-m)**{r.degree}; "
                        "this printer rescales accumulators of degree 1 only"
                    )
                self.groups_of_acc.setdefault(r.accum, []).append(i)
        # the shift carry: one more running-max group, numbered after the safe-softmax ones
        self.carry_gi = len(k.safe_softmax)
        self.carry_loads = [
            o for o in k.ops if o.op == "input" and k.inputs[o.attr("input")].shift_load
        ]
        self.carry_raised = False  # the first shifted load's step raises the max
        if k.shift_carry is not None:
            for a in k.shift_carry.accums:
                self.groups_of_acc.setdefault(a, []).append(self.carry_gi)
        self._refuse_masked_shifts()
        self.invariant = self.k.invariant_ops()
        self.group_m: dict[int, Slot] = {}
        self.group_alpha: dict[int, Slot] = {}
        self.group_rows: dict[int, tuple[int, ...]] = {}
        self.group_running: dict[int, bool] = {}

    def _refuse_masked_shifts(self) -> None:
        """Masked edge tiles with shifted partials are not printed (the lowering never emits
        them: it refuses ``shift_store``/``shift_carry`` with masked tiles)."""
        k = self.k
        shifted = k.shift_carry is not None or any(
            g.shift_store is not None for g in k.safe_softmax
        )
        if shifted and k.masked_accesses:
            name, acc = k.masked_accesses[0]
            raise CodegenError(
                f"kernel {k.name!r} {name}: the {self.LANGUAGE} printer does not print masked "
                f"edge tiles (dim {acc.masked[0].dim}, extent {acc.masked[0].extent}) in a "
                "kernel with shifted partials (shift_store/shift_carry); lower with a grid "
                "that divides the split dims"
            )

    # -- dialect hooks --------------------------------------------------------------------------
    def storage_type(self, kind: str) -> str:
        """The element type of a slot of ``kind`` ("f32", "float16", "bfloat16")."""
        raise NotImplementedError

    def read_fmt(self, kind: str) -> str:
        """Format of an fp32 read of one ``kind`` element (``{}`` is the element)."""
        raise NotImplementedError

    def write_fmt(self, kind: str) -> str:
        """Format of an fp32 value converted to a ``kind`` element (``{}`` is the value)."""
        raise NotImplementedError

    def storage_zero(self, kind: str) -> str:
        """A zero element of a slot of ``kind`` (what a masked load reads past the extent)."""
        return self.write_fmt(kind).format("0.0f")

    def kernel_head(self) -> list[str]:
        """The kernel's signature line(s), its thread/lane/warp/block indices (``tid``,
        ``lane``, ``warp``, ``bx``, ``by``, ``bz``) and one pointer per placed slot."""
        raise NotImplementedError

    def stride(self, n: int) -> str:
        """Stride of a block-stride loop over ``n`` threads."""
        return str(n)

    def wstride(self, n: int) -> str:
        """Stride of a loop over the ``n`` warps of the block."""
        return str(n)

    def fn(self, name: str) -> str:
        """The dialect's name of fp32 math function ``name``."""
        return self.MATH[name]

    def flt(self, x: float) -> str:
        """An fp32 literal of ``x``."""
        return c_float(x, self.INF, self.NAN)

    def slot_kind(self, dtype: str) -> str:
        """The slot kind of a tile loaded from a buffer of ``dtype``."""
        return "f32" if dtype == "float32" else dtype

    def smem_error(self, total: int) -> str:
        """The message when the kernel's slots need ``total`` bytes (> ``smem_limit``)."""
        return (
            f"kernel {self.k.name!r}: the {self.LANGUAGE} printer needs {total} bytes of "
            f"shared memory (> {self.smem_limit})"
        )

    def vector_load(
        self, acc: TileAccess, slot: Slot, g: str, esize: int, it: str
    ) -> list[str] | None:
        """A vectorised tile load's loop, or None for the element loop. With masked edge
        tiles (``acc.masked``) it must read zeros past the extent (:meth:`edge_guard`) or
        return None."""
        return None

    # -- slots ------------------------------------------------------------------------------------
    def slot_for(self, o: TileOp, kind: str = "f32", numel: int | None = None) -> Slot:
        s = self.temp(f"s{o.id}", kind, numel if numel is not None else math.prod(o.dims))
        self.slots[o.id] = s
        return s

    def temp(self, name: str, kind: str, numel: int) -> Slot:
        """A slot not bound to an op (staging tiles, row maxima, row statistics)."""
        return Slot(name, kind, numel, self.storage_type(kind), self.read_fmt(kind))

    # -- code helpers -----------------------------------------------------------------------------
    def loop(self, n: int, body: Sequence[str], var: str = "i") -> list[str]:
        head = f"for (int {var} = tid; {var} < {n}; {var} += {self.stride(self.threads)}) {{"
        return [head, *("  " + b for b in body), "}"]

    def row_reduce(
        self,
        rows: int,
        cols: int,
        expr: Callable[[str, str], str],
        result: Callable[[str, str], list[str]],
        op: str = "sum",
    ) -> list[str]:
        init = "0.0f" if op == "sum" else self.NEG_INF
        comb = "a += {e};" if op == "sum" else f"a = {self.fn('max')}(a, {{e}});"
        red = self.WARP_SUM if op == "sum" else self.WARP_MAX
        return [
            f"for (int r = warp; r < {rows}; r += {self.wstride(self.warps)}) {{",
            f"  float a = {init};",
            f"  for (int c = lane; c < {cols}; c += {self.LSTRIDE}) {{ "
            f"{comb.format(e=expr('r', 'c'))} }}",
            f"  a = {red}(a);",
            f"  if ({self.LANE0}) {{",
            *("    " + line for line in result("r", "a")),
            "  }",
            "}",
        ]

    # -- global memory ----------------------------------------------------------------------------
    def _base(self, acc: TileAccess, it: str) -> str:
        buf = self.plan.buffer(acc.buffer)
        terms = []
        for d, offs in enumerate(acc.offsets):
            for t in offs:
                if t.stride == 0:
                    continue
                var = it if t.var == "iter" else t.var
                mult = t.stride * buf.strides[d]
                terms.append(f"({self.INDEX}){var} * {mult}{self.INDEX_SUFFIX}")
        return " + ".join(terms) if terms else f"0{self.INDEX_SUFFIX}"

    def _gidx(self, acc: TileAccess, e: str) -> str:
        buf = self.plan.buffer(acc.buffer)
        terms = []
        for d, t in enumerate(acc.tile):
            if t == 1:
                continue
            c = coord(e, acc.tile, d)
            s = buf.strides[d]
            terms.append(c if s == 1 else f"{c} * {s}")
        return " + ".join(terms) if terms else "0"

    def edge_guard(self, acc: TileAccess, e: str, it: str = "0") -> str | None:
        """The condition that element ``e`` of tile ``acc`` lies inside the buffer in every
        masked dim (tile start + coordinate < extent), or None for an unmasked tile. The
        start is the block's (grid terms) or, for a dim a masked loop walks, iteration
        ``it``'s."""
        conds = []
        for m in acc.masked:
            starts = []
            for t in acc.offsets[m.dim]:
                if t.stride == 0:
                    continue
                var = it if t.var == "iter" else t.var
                starts.append(f"{var} * {t.stride}" if t.stride != 1 else var)
            at = " + ".join([*starts, coord(e, acc.tile, m.dim)])
            conds.append(f"{at} < {m.extent}")
        if not conds:
            return None
        return " && ".join(f"({c})" for c in conds) if len(conds) > 1 else conds[0]

    def loop_valid(self, o: TileOp, j: str, it: str) -> str:
        """For an exp over a masked loop's padding (``o.masked``): the condition that the
        element at coordinate ``j`` of the masked dim lies before the loop's extent in
        iteration ``it`` (the same index the masked loads' ``iter`` offsets use)."""
        m = o.masked[0]
        return f"{it} * {o.dims[m.dim]} + {j} < {m.extent}"

    def load_code(self, o: TileOp, slot: Slot, it: str) -> list[str]:
        acc = self.k.inputs[o.attr("input")]
        buf = self.plan.buffer(acc.buffer)
        esize = 4 if buf.dtype == "float32" else 2
        n = math.prod(acc.tile)
        lines = [
            f"{{  // load input {o.attr('input')} (buffer {acc.buffer}) tile {list(acc.tile)}",
            f"  const {self.INDEX} base = {self._base(acc, it)};",
        ]
        g = f"g{acc.buffer}"
        vec = self.vector_load(acc, slot, g, esize, it)
        if vec is not None:
            lines += ["  " + x for x in vec]
        else:
            el = f"{g}[base + {self._gidx(acc, 'e')}]"
            guard = self.edge_guard(acc, "e", it)
            if guard is not None:  # zero past the extent of a masked edge tile
                el = f"({guard}) ? {el} : {self.storage_zero(slot.kind)}"
            body = [f"{slot.name}[e] = {el};"]
            lines += ["  " + x for x in self.loop(n, body, "e")]
        lines.append("}")
        return lines

    def shifted_load_code(self, o: TileOp, slot: Slot, it: str, raise_max: bool) -> list[str]:
        """A shifted tile loaded times exp(m - M) (M read as 0 where it is -inf), after
        raising the running max first if ``raise_max``."""
        acc = self.k.inputs[o.attr("input")]
        sl = acc.shift_load
        assert sl is not None
        buf = self.plan.buffer(acc.buffer)
        conv = self.read_fmt(self.slot_kind(buf.dtype))
        cols, mcols = acc.tile[-1], sl.access.tile[-1]
        big_m = self.group_m[self.carry_gi]
        el = conv.format(f"g{acc.buffer}[base + {self._gidx(acc, 'e')}]")
        m = f"g{sl.access.buffer}[mbase + {self._gidx(sl.access, 'me')}]"
        body = [
            f"const int r = e / {cols};",
            f"const int me = r * {mcols} + (e % {cols}) / {sl.width};",
            f"const float mz = {big_m.name}[r] == {self.NEG_INF} ? 0.0f : {big_m.name}[r];",
            f"{slot.name}[e] = {el} * {self.fn('exp')}({m} - mz);",
        ]
        lines = [*self.carry_raise_code(it), self.SYNC] if raise_max else []
        return [
            *lines,
            f"{{  // load shifted input {o.attr('input')} (buffer {acc.buffer}) times exp(m - M)",
            f"  const {self.INDEX} base = {self._base(acc, it)};",
            f"  const {self.INDEX} mbase = {self._base(sl.access, it)};",
            *("  " + x for x in self.loop(math.prod(acc.tile), body, "e")),
            "}",
        ]

    def carry_raise_code(self, it: str) -> list[str]:
        """The running max of every row raised to the maxima of all shifted tiles (with
        ``carryalpha`` = exp(old - new), 0 while the old one is -inf, when it runs in the loop)."""
        gi = self.carry_gi
        big_m, alpha = self.group_m[gi], self.group_alpha[gi]
        body = [f"float mx = {self.NEG_INF};"]
        for o in self.carry_loads:
            sl = self.k.inputs[o.attr("input")].shift_load
            assert sl is not None
            c = sl.access.tile[-1]
            base = self._base(sl.access, it)
            m = f"g{sl.access.buffer}[{base} + {self._gidx(sl.access, f'(r * {c} + c)')}]"
            body.append(f"for (int c = 0; c < {c}; ++c) mx = {self.fn('max')}(mx, {m});")
        if self.group_running[gi]:
            body += [
                f"const float mo = {big_m.name}[r];",
                f"const float mn = {self.fn('max')}(mo, mx);",
                f"{alpha.name}[r] = mo == {self.NEG_INF} ? 0.0f : {self.fn('exp')}(mo - mn);",
                f"{big_m.name}[r] = mn;",
            ]
        else:
            body.append(f"{big_m.name}[r] = mx;")
        return [
            "// raise the running max of the shifted partials",
            *self.loop(big_m.numel, body, "r"),
        ]

    def shift_store_code(self) -> list[str]:
        """Each group's row max into its ``shift_store`` (one value per row)."""
        out = []
        for gi, g in enumerate(self.k.safe_softmax):
            st = g.shift_store
            if st is None:
                continue
            body = [f"g{st.buffer}[base + {self._gidx(st, 'e')}] = {self.group_m[gi].name}[e];"]
            out += [
                f"{{  // store the row max of group {gi} (buffer {st.buffer})",
                f"  const {self.INDEX} base = {self._base(st, '0')};",
                *("  " + x for x in self.loop(math.prod(st.tile), body, "e")),
                "}",
            ]
        return out

    def store_code(self, idx: int, acc: TileAccess) -> list[str]:
        assert acc.src is not None
        buf = self.plan.buffer(acc.buffer)
        src = self.slots[acc.src]
        val = src.read("e")
        conv = self.write_fmt(self.slot_kind(buf.dtype))
        store = f"g{acc.buffer}[base + {self._gidx(acc, 'e')}] = {conv.format(val)};"
        guard = self.edge_guard(acc, "e")  # nothing past the extent of a masked edge tile
        body = [store if guard is None else f"if ({guard}) {store}"]
        return [
            f"{{  // store output {idx} (buffer {acc.buffer}) from op {acc.src}",
            f"  const {self.INDEX} base = {self._base(acc, '0')};",
            *("  " + x for x in self.loop(math.prod(acc.tile), body, "e")),
            "}",
        ]

    # -- ops --------------------------------------------------------------------------------------
    def unary_expr(self, name: str, x: str, p: Sequence[float]) -> str:
        f = self.fn
        return {
            "exp": f"{f('exp')}({x})",
            "square": f"{x} * {x}",
            "sqrt": f"{f('sqrt')}({x})",
            "rsqrt": f"{f('rsqrt')}({x})",
            "silu": f"{x} / (1.0f + {f('exp')}(-{x}))",
            "gelu": f"0.5f * {x} * (1.0f + {f('erf')}({x} * 0.70710678118654752f))",
            "relu": f"{f('max')}({x}, 0.0f)",
            "sigmoid": f"1.0f / (1.0f + {f('exp')}(-{x}))",
            "tanh": f"{f('tanh')}({x})",
            "neg": f"-{x}",
            "mul_scalar": f"{x} * {self.flt(p[0]) if p else '1.0f'}",
            "add_scalar": f"({x} + {self.flt(p[0]) if p else '0.0f'})",
            "clamp": (
                f"{f('min')}({f('max')}({x}, {self.flt(p[0])}), {self.flt(p[1])})"
                if len(p) == 2
                else x
            ),
        }[name]

    def op_step(self, o: TileOp, it: str) -> Step:
        kind = o.op
        args = [self.slots[a] for a in o.args]
        adims = [self.by_id[a].dims for a in o.args]
        n = math.prod(o.dims)
        if kind == "input":
            buf = self.plan.buffer(self.k.inputs[o.attr("input")].buffer)
            if self.k.inputs[o.attr("input")].shift_load is not None:
                s = self.slot_for(o)
                first, self.carry_raised = not self.carry_raised, True
                carry = [self.group_m[self.carry_gi], self.group_alpha[self.carry_gi]]
                return Step(lambda: self.shifted_load_code(o, s, it, first), [s], carry)
            s = self.slot_for(o, "f32" if buf.dtype == "float32" else buf.dtype)
            return Step(lambda: self.load_code(o, s, it), [s])
        if kind == "matmul":
            return self.matmul_step(o)
        if kind == "unary":
            if o.id in self.group_of_exp:
                return self.safe_exp_step(o, it)
            s = self.slot_for(o)
            x = args[0]
            expr = self.unary_expr(o.attr("unop"), "x", o.attr("params"))
            if o.masked:  # exp of a masked loop's padding is 0 (its input counts as -inf)
                j = coord("i", o.dims, o.masked[0].dim)
                expr = f"({self.loop_valid(o, j, it)}) ? {expr} : 0.0f"
            body = [f"const float x = {x.read('i')};", f"{s.name}[i] = {expr};"]
            return Step(lambda: self.loop(n, body), [s], [x])
        if kind == "binary":
            s = self.slot_for(o)
            a, b = args
            ea = a.read(bcast_index("i", o.dims, adims[0]))
            eb = b.read(bcast_index("i", o.dims, adims[1]))
            name = o.attr("binop")
            expr = (
                f"{self.fn('pow')}({ea}, {eb})"
                if name == "pow"
                else f"{ea} {dict(add='+', sub='-', mul='*', div='/')[name]} {eb}"
            )
            return Step(lambda: self.loop(n, [f"{s.name}[i] = {expr};"]), [s], [a, b])
        if kind == "reduction":
            s = self.slot_for(o)
            x = args[0]
            d = o.attr("dim")
            xd = adims[0]
            if d == len(xd) - 1 and xd[-1] >= 32:
                cols = xd[-1]
                lines = self.row_reduce(
                    n,
                    cols,
                    lambda r, c: x.read(f"{r} * {cols} + {c}"),
                    lambda r, a_: [f"{s.name}[{r}] = {a_};"],
                )
                return Step(lambda: lines, [s], [x])
            return Step(lambda: self.loop(n, self.sum_along(s, x, o.dims, xd, d, "i")), [s], [x])
        if kind == "reduction_to_dimx":
            s = self.slot_for(o)
            x = args[0]
            return Step(
                lambda: self.loop(
                    n,
                    self.to_dimx(
                        s, x, o.dims, adims[0], o.attr("dim"), o.attr("dimx"), f"{s.name}[i] = acc;"
                    ),
                ),
                [s],
                [x],
            )
        if kind == "rms_norm":
            s = self.slot_for(o)
            x = args[0]
            cols = o.dims[-1]
            rows = n // cols
            tmp = self.temp(f"r{o.id}", "f32", rows)
            eps = self.flt(o.attr("eps"))

            def code() -> list[str]:
                out = self.row_reduce(
                    rows,
                    cols,
                    lambda r, c: (
                        f"{x.read(f'{r} * {cols} + {c}')} * {x.read(f'{r} * {cols} + {c}')}"
                    ),
                    lambda r, a_: [
                        f"{tmp.name}[{r}] = {self.fn('sqrt')}({a_} / {cols}.0f + {eps});"
                    ],
                )
                out.append(self.SYNC)
                out += self.loop(n, [f"{s.name}[i] = {x.read('i')} / {tmp.name}[i / {cols}];"])
                return out

            return Step(code, [s], [x], [tmp])
        if kind == "concat":
            s = self.slot_for(o)
            d = o.attr("dim")
            body = [f"const int c = {coord('i', o.dims, d)};"]
            start = 0
            conds = []
            for a, dims in zip(args, adims, strict=True):
                # index into the piece: same coords, coordinate along d shifted by start
                strides_o = strides(o.dims)
                strides_a = strides(dims)
                terms = []
                for dd in range(len(dims)):
                    c = f"(c - {start})" if dd == d else coord("i", o.dims, dd)
                    if dims[dd] == 1:
                        continue
                    terms.append(c if strides_a[dd] == 1 else f"{c} * {strides_a[dd]}")
                del strides_o
                conds.append((start + dims[d], a.read(" + ".join(terms) if terms else "0")))
                start += dims[d]
            expr = conds[-1][1]
            for hi, e in reversed(conds[:-1]):
                expr = f"(c < {hi} ? {e} : {expr})"
            body.append(f"{s.name}[i] = {expr};")
            return Step(lambda: self.loop(n, body), [s], list(args))
        raise CodegenError(
            f"kernel {self.k.name!r}: {self.LANGUAGE} printer has no rule for op {kind!r}"
        )

    def sum_along(
        self, s: Slot, x: Slot, odims: Sequence[int], xdims: Sequence[int], d: int, i: str
    ) -> list[str]:
        xs = strides(xdims)
        base_terms = []
        for dd in range(len(xdims)):
            if dd == d or xdims[dd] == 1:
                continue
            c = coord(i, odims, dd)
            base_terms.append(c if xs[dd] == 1 else f"{c} * {xs[dd]}")
        base = " + ".join(base_terms) if base_terms else "0"
        return [
            f"const int b0 = {base};",
            "float acc = 0.0f;",
            f"for (int r = 0; r < {xdims[d]}; ++r) acc += {x.read(f'b0 + r * {xs[d]}')};",
            f"{s.name}[{i}] = acc;",
        ]

    def to_dimx(
        self,
        s: Slot,
        x: Slot,
        odims: Sequence[int],
        xdims: Sequence[int],
        d: int,
        dimx: int,
        result: str,
    ) -> list[str]:
        xs = strides(xdims)
        terms = []
        for dd in range(len(xdims)):
            if xdims[dd] == 1:
                continue
            c = coord("i", odims, dd)
            terms.append(c if xs[dd] == 1 else f"{c} * {xs[dd]}")
        base = " + ".join(terms) if terms else "0"
        groups = xdims[d] // dimx
        return [
            f"const int b0 = {base};",
            "float acc = 0.0f;",
            f"for (int g = 0; g < {groups}; ++g) acc += {x.read(f'b0 + g * {dimx * xs[d]}')};",
            result,
        ]

    # -- matmul -----------------------------------------------------------------------------------
    def product_slot(self, o: TileOp) -> tuple[Slot, int | None]:
        """Where matmul ``o`` writes its product: its accumulator's slot and id when the plan
        fuses it into one (``accumulate_into``; the product is then added in place), else a
        slot of its own and None."""
        if o.accumulate_into is not None:
            return self.slots[o.accumulate_into], o.accumulate_into
        return self.slot_for(o), None

    def write_product(self, dst: str, idx: str, value: str, acc_id: int | None) -> str:
        """``dst = value``, or for a fused product ``dst = dst·alpha + value`` (the
        accumulator's safe-softmax rescaling; ``idx`` is the flat index into its tile)."""
        if acc_id is None:
            return f"{dst} = {value};"
        return f"{dst} = {dst}{self.rescale(acc_id, idx)} + {value};"

    def product_step(
        self,
        s: Slot,
        acc_id: int | None,
        code: Callable[[], list[str]],
        reads: list[Slot],
        temps: list[Slot] | None = None,
    ) -> Step:
        """The step of a matmul writing ``s``: it defines its own slot, or reads and updates
        the accumulator (and its groups' rescaling factors) it is fused into."""
        if acc_id is None:
            return Step(code, [s], reads, temps or [])
        groups = [self.group_alpha[g] for g in self.groups_of_acc.get(acc_id, [])]
        return Step(code, [], [*reads, s, *groups], temps or [])

    def matmul_step(self, o: TileOp) -> Step:
        """A tile matmul, one thread per output element with an fp32 FMA loop (dialects
        override it with matrix instructions where the shapes allow)."""
        a_id, b_id = o.args
        a, b = self.slots[a_id], self.slots[b_id]
        ad, bd = self.by_id[a_id].dims, self.by_id[b_id].dims
        batch = math.prod(ad[:-2])
        m, kk = ad[-2], ad[-1]
        nn = bd[-1]
        s, acc_id = self.product_slot(o)
        body = [
            f"const int bb = i / {m * nn}, mi = (i / {nn}) % {m}, ni = i % {nn};",
            "float acc = 0.0f;",
            f"for (int k = 0; k < {kk}; ++k) acc += "
            f"{a.read(f'bb * {m * kk} + mi * {kk} + k')} * "
            f"{b.read(f'bb * {kk * nn} + k * {nn} + ni')};",
            self.write_product(f"{s.name}[i]", "i", "acc", acc_id),
        ]
        return self.product_step(s, acc_id, lambda: self.loop(batch * m * nn, body), [a, b])

    # -- safe softmax -----------------------------------------------------------------------------
    def safe_exp_step(self, o: TileOp, it: str) -> Step:
        gi = self.group_of_exp[o.id]
        x = self.slots[o.args[0]]
        xd = self.by_id[o.args[0]].dims
        cols = xd[-1]
        rows = math.prod(xd) // cols
        s = self.slot_for(o)
        m = self.group_m[gi]
        alpha = self.group_alpha[gi]
        running = self.group_running[gi]

        def result(r: str, a: str) -> list[str]:
            if running:
                return [
                    f"const float mn = {self.fn('max')}({m.name}[{r}], {a});",
                    f"{alpha.name}[{r}] = {self.fn('exp')}({m.name}[{r}] - mn);",
                    f"{m.name}[{r}] = mn;",
                ]
            return [f"{m.name}[{r}] = {a};"]

        pad = o.masked[0] if o.masked else None

        def xmax(r: str, c: str) -> str:
            v = x.read(f"{r} * {cols} + {c}")
            if pad is not None and pad.dim == len(xd) - 1:
                # a masked loop's padding is -inf in the max: a max over its zeros could lie
                # far above every score and underflow each exp to 0 / 0
                return f"({self.loop_valid(o, c, it)}) ? {v} : {self.NEG_INF}"
            return v

        def code() -> list[str]:
            out = self.row_reduce(rows, cols, xmax, result, op="max")
            out.append(self.SYNC)
            e = f"{self.fn('exp')}({x.read('i')} - {m.name}[i / {cols}])"
            if pad is not None:  # exp of the padding is 0
                e = f"({self.loop_valid(o, coord('i', o.dims, pad.dim), it)}) ? {e} : 0.0f"
            out += self.loop(rows * cols, [f"{s.name}[i] = {e};"])
            return out

        return Step(code, [s], [x, m, alpha])

    def rescale(self, acc_id: int, idx: str) -> str:
        """Factor ``* alpha`` for the safe-softmax groups of accumulator ``acc_id``."""
        f = ""
        o = self.by_id[acc_id]
        for gi in self.groups_of_acc.get(acc_id, []):
            if self.group_running[gi]:
                alpha = self.group_alpha[gi]
                f += f" * {alpha.read(bcast_index(idx, o.dims, self.group_rows[gi]))}"
        return f

    # -- accumulators -----------------------------------------------------------------------------
    def accum_step(self, o: TileOp) -> Step:
        s = self.slots[o.id]
        x = self.slots[o.args[0]]
        xd = self.by_id[o.args[0]].dims
        kind = o.attr("acc")
        n = math.prod(o.dims)
        groups = [self.group_alpha[g] for g in self.groups_of_acc.get(o.id, [])]
        if kind == "iter":
            body = [f"{s.name}[i] = {s.name}[i]{self.rescale(o.id, 'i')} + {x.read('i')};"]
            return Step(lambda: self.loop(n, body), [], [s, x, *groups])
        if kind in ("sum", "rms"):
            cols = xd[-1]
            sq = kind == "rms"

            def expr(r: str, c: str) -> str:
                v = x.read(f"{r} * {cols} + {c}")
                return f"{v} * {v}" if sq else v

            def code() -> list[str]:
                return self.row_reduce(
                    n,
                    cols,
                    expr,
                    lambda r, a: [f"{s.name}[{r}] = {s.name}[{r}]{self.rescale(o.id, r)} + {a};"],
                )

            return Step(code, [], [s, x, *groups])
        dimx = o.attr("dimx")
        line = f"{s.name}[i] = {s.name}[i]{self.rescale(o.id, 'i')} + acc;"
        return Step(
            lambda: self.loop(n, self.to_dimx(s, x, o.dims, xd, len(xd) - 1, dimx, line)),
            [],
            [s, x, *groups],
        )

    # -- kernel -----------------------------------------------------------------------------------
    def build(self) -> tuple[list[str], int]:
        k = self.k
        hoisted = [o for o in k.ops if o.phase == "pre" or o.id in self.invariant]
        loop_ops = [o for o in k.ops if o not in hoisted and o.phase in ("loop", "accum")]
        # invariant values only the epilogue reads are computed after the loop (their
        # shared memory is then free during it)
        needed: set[int] = set()
        for o in reversed(k.ops):
            if o in loop_ops or o.id in needed:
                needed.update(o.args)
        pre_ops = [o for o in hoisted if o.id in needed]
        post_ops = [o for o in hoisted if o.id not in needed]
        post_ops += [o for o in k.ops if o.phase == "epilogue"]
        accums = [o for o in k.ops if o.op == "accum"]
        # group state
        for gi, g in enumerate(k.safe_softmax):
            e = self.by_id[g.exp]
            xd = self.by_id[e.args[0]].dims
            self.group_rows[gi] = (*xd[:-1], 1)
            rows = math.prod(xd[:-1])
            self.group_m[gi] = self.temp(f"rowmax{gi}", "f32", rows)
            self.group_alpha[gi] = self.temp(f"rowalpha{gi}", "f32", rows)
            self.group_running[gi] = e.phase == "loop" and e.id not in self.invariant
            if e.phase == "epilogue" and g.accums:
                raise CodegenError(
                    f"kernel {k.name!r}: epilogue exp {g.exp} cannot feed accumulators"
                )
            for a in g.accums:
                od = self.by_id[a].dims
                if len(od) != len(xd) or any(
                    p != 1 and p != q for p, q in zip(self.group_rows[gi], od, strict=True)
                ):
                    raise CodegenError(
                        f"kernel {k.name!r}: safe_softmax rows {list(self.group_rows[gi])} "
                        f"do not broadcast to "
                        f"accumulator {a} {list(od)}"
                    )
        if self.carry_loads:
            gi = self.carry_gi
            carry_rows = self.carry_loads[0].dims[:-1]
            self.group_rows[gi] = (*carry_rows, 1)
            self.group_m[gi] = self.temp("carrymax", "f32", math.prod(carry_rows))
            self.group_alpha[gi] = self.temp("carryalpha", "f32", math.prod(carry_rows))
            self.group_running[gi] = self.carry_loads[0].id not in self.invariant
            for a in self.k.shift_carry.accums if self.k.shift_carry else ():
                od = self.by_id[a].dims
                if od[:-1] != carry_rows:
                    raise CodegenError(
                        f"kernel {k.name!r}: shift_carry rows {list(carry_rows)} are not "
                        f"those of accumulator {a} {list(od)}"
                    )
        for o in accums:
            self.slot_for(o)
        # schedule
        for o in pre_ops:
            st = self.op_step(o, "0")
            st.section = "pre"
            self.steps.append(st)
        acc_slots = [self.slots[o.id] for o in accums]
        gm = list(self.group_m.values()) + list(self.group_alpha.values())

        def init_code() -> list[str]:
            out = []
            for s in acc_slots:
                out += self.loop(s.numel, [f"{s.name}[i] = 0.0f;"])
            for gi, m in self.group_m.items():
                if self.group_running[gi]:
                    out += self.loop(
                        m.numel,
                        [
                            f"{m.name}[i] = {self.NEG_INF};",
                            f"{self.group_alpha[gi].name}[i] = 1.0f;",
                        ],
                    )
            return out

        self.steps.append(Step(init_code, [*acc_slots, *gm], [], section="init"))
        for o in loop_ops:
            if o.id in self.fused_accums:
                continue  # its matmul adds into it in place
            st = self.accum_step(o) if o.op == "accum" else self.op_step(o, "it")
            st.section = "loop"
            self.steps.append(st)
        for o in accums:
            if o.attr("acc") == "rms":
                s = self.slots[o.id]
                eps, ext = self.flt(o.attr("eps")), o.attr("extent")
                body = [f"{s.name}[i] = {self.fn('sqrt')}({s.name}[i] / {ext}.0f + {eps});"]
                lines = self.loop(s.numel, body)
                self.steps.append(Step(const_code(lines), [], [s], section="post"))
        for o in post_ops:
            st = self.op_step(o, "0")
            st.section = "post"
            self.steps.append(st)
        store_reads = [self.slots[out.src] for out in k.outputs if out.src is not None]
        store_reads += [self.group_m[gi] for gi, g in enumerate(k.safe_softmax) if g.shift_store]

        def stores() -> list[str]:
            out = []
            for i, acc in enumerate(k.outputs):
                out += self.store_code(i, acc)
            return out + self.shift_store_code()

        self.steps.append(Step(stores, [], store_reads, section="post"))
        smem = self.allocate()
        return self.emit(), smem

    def allocate(self) -> int:
        """First-fit shared-memory offsets over live ranges; returns the bytes needed."""
        pos = {}
        first_loop = next((i for i, s in enumerate(self.steps) if s.section == "loop"), None)
        last_loop = max((i for i, s in enumerate(self.steps) if s.section == "loop"), default=None)
        all_slots: dict[int, Slot] = {}
        for i, st in enumerate(self.steps):
            for s in (*st.defines, *st.temps):
                if id(s) not in pos:
                    pos[id(s)] = [i, i]
                    all_slots[id(s)] = s
            for s in st.reads:
                if id(s) not in pos:
                    pos[id(s)] = [i, i]
                    all_slots[id(s)] = s
                pos[id(s)][1] = max(pos[id(s)][1], i)
        if first_loop is not None and last_loop is not None:
            for key, (a, b) in pos.items():
                # read inside the loop but defined before it: live for the whole loop
                if a < first_loop and first_loop <= b <= last_loop:
                    pos[key][1] = last_loop
                # accumulators / running maxima defined before the loop and read in it
        placed: list[Slot] = []
        for key in sorted(pos, key=lambda k: (pos[k][0], -all_slots[k].nbytes)):
            s = all_slots[key]
            s.start, s.end = pos[key]
            size = -(-s.nbytes // ALIGN) * ALIGN
            off = 0
            for other in sorted(
                (p for p in placed if not (p.end < s.start or s.end < p.start)),
                key=lambda p: p.offset,
            ):
                osize = -(-other.nbytes // ALIGN) * ALIGN
                if off + size <= other.offset:
                    break
                off = max(off, other.offset + osize)
            s.offset = off
            placed.append(s)
        total = max((p.offset + -(-p.nbytes // ALIGN) * ALIGN for p in placed), default=0)
        self.placed = placed
        self.smem_bytes = total
        if total > self.smem_limit:
            raise CodegenError(self.smem_error(total))
        return total

    def emit(self) -> list[str]:
        """The kernel: its head, then every step with a barrier after it (the loop steps
        inside ``for it``)."""
        k = self.k
        lines = self.kernel_head()
        in_loop = False
        for st in self.steps:
            if st.section == "loop" and not in_loop:
                lines.append(f"  {self.SYNC}")
                lines.append(f"  for (int it = 0; it < {k.forloop_range}; ++it) {{")
                lines.append(f"    {self.SYNC}")
                in_loop = True
            elif st.section != "loop" and in_loop:
                lines.append("  }")
                in_loop = False
            ind = "    " if in_loop else "  "
            lines += [ind + line for line in st.code()]
            lines.append(ind + self.SYNC)
        if in_loop:
            lines.append("  }")
        lines.append("}")
        return lines
