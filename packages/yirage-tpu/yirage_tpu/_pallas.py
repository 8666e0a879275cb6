"""KernelPlan → JAX Pallas (Mosaic TPU): one ``pallas_call`` per generated kernel, library
kernels as plain ``jax.numpy``, chained by one ``forward`` function.

The printed module is plain Python; it exposes ``forward(*inputs, interpret=False)`` (a list
of output arrays), ``PLAN_HASH``, ``INPUTS`` / ``OUTPUTS`` ((dims, dtype) per graph input /
output) and ``KERNELS`` (per generated kernel: the pallas grid and its block shapes).

Printing rules (docs/kernel-plan.md gives the plan semantics):

* The plan's grid ``(bx, by, bz)`` plus the for-loop become the ``pallas_call`` grid
  ``(gx, gy, gz, forloop_range)``; the loop is the innermost axis, marked ``"arbitrary"``
  (its steps run in order on one core and share the scratch), the others ``"parallel"``.
* Every tile access (input, output, ``shift_load``, ``shift_store``) is a ``BlockSpec`` of
  the tile's shape; its index map gives block indices, ``Σ var · stride / tile`` per dim.
  Every block shape is checked against the DeviceSpec's tiling rule first
  (:func:`check_blocks`), so an illegal one is refused here, naming the rule, before Mosaic
  sees it.
* Accumulators, running maxima and ``pre`` values read after the first step live in VMEM
  scratch (fp32): initialised under ``pl.when(it == 0)`` (``pre`` ops are computed there,
  once), updated every step, finalised and stored under ``pl.when(it == last)``.
* Matmuls are ``jnp.dot`` (``lax.dot_general`` for batched tiles) with
  ``preferred_element_type=float32``: bf16 tiles go to the MXU as they are, everything else
  is fp32 at ``Precision.HIGHEST``. Every other op computes in fp32.
* ``safe_softmax`` groups keep a running row max ``m`` (scratch, -inf at first), compute
  ``exp(min(x - m, 0))`` and rescale the accumulators the plan lists by
  ``exp(m_old - m_new)**degree`` before they add; ``scale_outputs`` are stored as they are and
  ``m`` at the group's ``shift_store``. A ``shift_carry`` kernel keeps the running max ``M`` of
  its shifted inputs' maxima, rescales the listed accumulators by ``exp(M_old - M_new)`` and
  uses each shifted tile as ``x · exp(m - M)`` (a row whose maxima are all -inf uses 0).
* Masked edge tiles (an access's ``masked`` dims): the plan's grid is already
  ``cdiv(extent, tile)`` blocks, so the last block of such a BlockSpec is partial. What a
  kernel reads past the extent there is undefined on a TPU (interpret mode reads NaN), so
  every masked input is loaded as ``jnp.where(inside, x, 0)``, ``inside`` comparing the
  block's start (``pl.program_id`` · stride) plus a ``broadcasted_iota`` over the block with
  the extent: loads read zero past it, as the plan states, before any op sees them. Stores
  need no mask: Pallas drops the part of a partial output block past the array on a TPU,
  and interpret mode slices it off. A masked block obeys the tiling rule like any other
  (only a whole dim is exempt); masked tiles with shifted partials are refused. An exp
  over a masked loop's padding (the op's ``masked`` dim) is 0 there, its safe-softmax max
  taken over the elements before the extent only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from yirage.plan import (
    CodegenError,
    GeneratedKernel,
    LibraryKernel,
    Plan,
    TileAccess,
    TileOp,
    parse_plan,
)
from yirage.plugin import DeviceSpec

__all__ = ["CODEGEN_VERSION", "PallasSource", "check_blocks", "generate_pallas"]

#: Bumped whenever the printed text for the same plan changes (part of cache keys).
CODEGEN_VERSION = "pallas-4"
#: Grid axis names in the printed index maps (the plan's block indices, then the loop).
_AXES = ("bx", "by", "bz", "it")
_JNP_DTYPE = {"float32": "jnp.float32", "float16": "jnp.float16", "bfloat16": "jnp.bfloat16"}
_F32 = "jnp.float32"
#: The scoped VMEM every printed kernel asks Mosaic for (the DeviceSpec's
#: shared_mem_per_block is half of it: Pallas double-buffers the blocks it streams).
VMEM_LIMIT_BYTES = 16 * 2**20


@dataclass(frozen=True)
class PallasSource:
    """A printed module: its text and the plan it prints."""

    plan: Plan
    text: str
    codegen_version: str = CODEGEN_VERSION

    @property
    def key(self) -> str:
        """Content hash of the text and printer version (cache key)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self.codegen_version.encode())
        h.update(self.text.encode())
        return h.hexdigest()

    def __str__(self) -> str:
        return self.text


# -- block shapes ---------------------------------------------------------------------------


def _accesses(k: GeneratedKernel) -> list[tuple[str, TileAccess]]:
    """Every block the kernel loads or stores, with a name for messages."""
    out: list[tuple[str, TileAccess]] = []
    for i, a in enumerate(k.inputs):
        out.append((f"input {i}", a))
        if a.shift_load is not None:
            out.append((f"input {i}'s shift_load", a.shift_load.access))
    out += [(f"output {i}", a) for i, a in enumerate(k.outputs)]
    for gi, g in enumerate(k.safe_softmax):
        if g.shift_store is not None:
            out.append((f"safe_softmax group {gi}'s shift_store", g.shift_store))
    return out


def check_blocks(plan: Plan, spec: DeviceSpec) -> None:
    """Refuse (CodegenError naming the rule) a plan with a block the device's tiling rule
    forbids (:meth:`DeviceSpec.block_error`), before any compiler sees it."""
    for k in plan.generated:
        for what, acc in _accesses(k):
            buf = plan.buffer(acc.buffer)
            why = spec.block_error(acc.tile, buf.dims, buf.dtype)
            if why is not None:
                edge = (
                    " (a masked edge tile: its partial last block is no whole dim, so the rule "
                    "applies to it)"
                    if acc.masked
                    else ""
                )
                raise CodegenError(
                    f"kernel {k.name!r}, {what} (buffer {buf.id}): {why}{edge}; search with "
                    f"this DeviceSpec (its tiling field) so the search proposes legal tiles"
                )


def _index_map(acc: TileAccess, where: str) -> str:
    """``lambda bx, by, bz, it: (...)``: block indices of the access's tile per dim."""
    dims = []
    for d, (terms, t) in enumerate(zip(acc.offsets, acc.tile, strict=True)):
        parts = []
        for term in terms:
            if term.stride % t:
                raise CodegenError(
                    f"{where}: dim {d} moves by {term.stride} elements per {term.var}, not a "
                    f"whole number of its {t}-element blocks; Pallas BlockSpecs index whole "
                    f"blocks"
                )
            step = term.stride // t
            name = "it" if term.var == "iter" else term.var
            parts.append(name if step == 1 else f"{name} * {step}")
        dims.append(" + ".join(parts) if parts else "0")
    body = ", ".join(dims) + ("," if len(dims) == 1 else "")
    return f"lambda {', '.join(_AXES)}: ({body})"


def _block_spec(acc: TileAccess, where: str) -> str:
    shape = ", ".join(str(t) for t in acc.tile) + ("," if len(acc.tile) == 1 else "")
    return f"pl.BlockSpec(({shape}), {_index_map(acc, where)})"


def _edge_mask(acc: TileAccess) -> str:
    """``_in_bounds(shape, (dim, start, extent), ...)``: where the access's block lies inside
    the buffer along each masked dim (start = the block's first index, from the grid; the
    loop is the grid's last axis, so a masked loop's iteration counts the same way)."""
    edges = []
    for m in acc.masked:
        starts = [
            f"pl.program_id({_AXES.index('it' if t.var == 'iter' else t.var)}) * {t.stride}"
            for t in acc.offsets[m.dim]
        ]
        edges.append(f"({m.dim}, {' + '.join(starts) or '0'}, {m.extent})")
    return f"_in_bounds({_shape(acc.tile)}, {', '.join(edges)})"


def _refuse_shifted_masks(k: GeneratedKernel) -> None:
    """Masked edge tiles with shifted partials: the lowering never emits them (MappingError),
    and the running maxima of a partial block would need their own masks."""
    shifted = k.shift_carry is not None or any(g.shift_store is not None for g in k.safe_softmax)
    if shifted and k.masked_accesses:
        raise CodegenError(
            f"kernel {k.name!r}: masked edge tiles with shifted partials (shift_store/"
            "shift_carry) are not printed; lower with a grid that divides the split dims"
        )


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('inf')" if x > 0 else "float('-inf')"
    return repr(float(x))


def _shape(dims: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


# -- one generated kernel ------------------------------------------------------------------


@dataclass
class _Val:
    expr: str
    dtype: str  # "float32" or the loaded buffer's dtype


@dataclass
class _KernelPrinter:
    plan: Plan
    k: GeneratedKernel
    lines: list[str] = field(default_factory=list)
    indent: int = 1
    vals: dict[int, _Val] = field(default_factory=dict)
    #: scratch refs by role: ("acc", op id), ("m", group), ("M", 0), ("pre", op id)
    scratch: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    names: dict[tuple[str, int], str] = field(default_factory=dict)
    in_refs: list[str] = field(default_factory=list)
    shift_refs: dict[int, str] = field(default_factory=dict)  # input index -> max ref
    out_refs: list[str] = field(default_factory=list)
    store_refs: dict[int, str] = field(default_factory=dict)  # group -> shift_store ref
    counter: int = 0
    carry_done: bool = False
    #: buffers the pallas_call returns, in order (outputs, then shift stores)
    out_bufs: list[int] = field(default_factory=list)

    @property
    def last(self) -> int:
        return self.k.forloop_range - 1

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def where(self, o: TileOp | None = None) -> str:
        return f"kernel {self.k.name!r}" + (f", op {o.id} ({o.op})" if o is not None else "")

    def add_scratch(self, role: str, key: int, dims: Sequence[int]) -> str:
        name = f"s_{role}{key}"
        self.names[(role, key)] = name
        self.scratch.append((name, tuple(dims)))
        return name

    # -- layout --------------------------------------------------------------------------
    def layout(self) -> None:
        k = self.k
        self.in_refs = [f"x{i}" for i in range(len(k.inputs))]
        for i, a in enumerate(k.inputs):
            if a.shift_load is not None:
                self.shift_refs[i] = f"ml{i}"
        self.out_refs = [f"o{i}" for i in range(len(k.outputs))]
        for gi, g in enumerate(k.safe_softmax):
            if g.shift_store is not None:
                self.store_refs[gi] = f"ms{gi}"
        for o in k.ops:
            if o.op == "accum":
                self.add_scratch("acc", o.id, o.dims)
        for gi, g in enumerate(k.safe_softmax):
            arg = k.op(k.op(g.exp).args[0])
            self.add_scratch("m", gi, (*arg.dims[:-1], 1))
        if k.shift_carry is not None:
            first = k.inputs[k.shift_carry.inputs[0]]
            self.add_scratch("M", 0, (*first.tile[:-1], 1))
        for o in k.ops:
            if o.phase == "pre" and not self.plain_load(o) and self.read_late(o.id):
                self.add_scratch("pre", o.id, o.dims)

    def plain_load(self, o: TileOp) -> bool:
        """An input read as it is (no shift): its ref can be read again in any step."""
        return o.op == "input" and self.k.inputs[o.attr("input")].shift_load is None

    def read_late(self, op_id: int) -> bool:
        """Is the op's value read outside the first step's ``pre`` block?"""
        if any(a.src == op_id for a in self.k.outputs):
            return True
        return any(op_id in o.args and o.phase != "pre" for o in self.k.ops)

    # -- values --------------------------------------------------------------------------
    def f32(self, v: _Val) -> str:
        return v.expr if v.dtype == "float32" else f"{v.expr}.astype({_F32})"

    def arg(self, op_id: int) -> _Val:
        return self.vals[op_id]

    def bind(self, o: TileOp, expr: str, dtype: str = "float32") -> None:
        name = f"t{o.id}"
        self.emit(f"{name} = {expr}")
        self.vals[o.id] = _Val(name, dtype)

    def pre_as_ref(self) -> None:
        """After the ``pre`` block: pre values read later come from their scratch."""
        for o in self.k.ops:
            if o.phase == "pre" and ("pre", o.id) in self.names:
                self.vals[o.id] = _Val(f"{self.names[('pre', o.id)]}[...]", "float32")
            elif o.phase == "pre" and self.plain_load(o):
                self.vals[o.id] = self.load_expr(o)

    # -- loads ---------------------------------------------------------------------------
    def load_expr(self, o: TileOp) -> _Val:
        idx = o.attr("input")
        acc = self.k.inputs[idx]
        buf = self.plan.buffer(acc.buffer)
        expr = f"x{idx}[...]"
        if acc.masked:  # zero past the extent: the partial block's tail is undefined
            expr = f"jnp.where(mk{idx}, {expr}, 0)"
        if tuple(o.dims) != tuple(acc.tile):
            expr = f"{expr}.reshape({_shape(o.dims)})"
        return _Val(expr, buf.dtype)

    def emit_load(self, o: TileOp) -> None:
        idx = o.attr("input")
        if self.k.inputs[idx].shift_load is not None:
            self.emit_carry()
            v = self.load_expr(o)
            self.bind(o, f"{self.f32(v)} * sc{idx}")
            return
        v = self.load_expr(o)
        if o.phase == "pre":
            self.vals[o.id] = v  # the block stays resident: read the ref where it is used
            return
        self.bind(o, v.expr, v.dtype)

    def emit_carry(self) -> None:
        """Before the first shifted tile of a body: raise the running max ``M`` to the
        maxima of every shifted tile, ``alpha_c`` = exp(M_old - M_new), ``sc<i>`` the scale
        exp(m - M) of each shifted input (rows whose maxima are all -inf use 0 for ``M``)."""
        if self.carry_done:
            return
        self.carry_done = True
        carry = self.k.shift_carry
        assert carry is not None
        mref = self.names[("M", 0)]
        new = f"{mref}[...]"
        for i in carry.inputs:
            new = f"jnp.maximum({new}, jnp.max(ml{i}[...], axis=-1, keepdims=True))"
        self.emit(f"mn_c = {new}")
        self.emit("mz_c = jnp.where(mn_c == float('-inf'), 0.0, mn_c)")
        self.emit(f"alpha_c = jnp.exp({mref}[...] - mz_c)")
        self.emit(f"{mref}[...] = mn_c")
        for i in carry.inputs:
            sl = self.k.inputs[i].shift_load
            assert sl is not None
            m = f"ml{i}[...]"
            if sl.access.tile[-1] != 1 and sl.width != 1:
                m = f"jnp.repeat({m}, {sl.width}, axis=-1)"
            self.emit(f"sc{i} = jnp.exp({m} - mz_c)")

    # -- ops -------------------------------------------------------------------------------
    def emit_op(self, o: TileOp) -> None:
        if o.op == "input":
            self.emit_load(o)
            return
        if o.accumulate_into is not None:
            return  # added straight into its accumulator (emit_accum_update)
        args = [self.arg(a) for a in o.args]
        if o.op == "matmul":
            self.bind(o, self.dot(o, args[0], args[1]))
        elif o.op == "unary":
            if self.group_of(o.id) is not None:
                self.emit_safe_exp(o, args[0])
            elif o.masked:  # exp of a masked loop's padding is 0 (the plan's semantics)
                self.bind(o, f"jnp.where({self.loop_valid(o)}, jnp.exp({self.f32(args[0])}), 0.0)")
            else:
                self.bind(o, _unary(o.attr("unop"), self.f32(args[0]), o.attrs.get("params", ())))
        elif o.op == "binary":
            self.bind(o, _binary(o.attr("binop"), self.f32(args[0]), self.f32(args[1])))
        elif o.op == "reduction":
            self.bind(o, f"jnp.sum({self.f32(args[0])}, axis={o.attr('dim')}, keepdims=True)")
        elif o.op == "reduction_to_dimx":
            src = self.k.op(o.args[0]).dims
            self.bind(o, _to_dimx(self.f32(args[0]), src, o.attr("dim"), o.attr("dimx")))
        elif o.op == "rms_norm":
            x = self.fresh("v")
            self.emit(f"{x} = {self.f32(args[0])}")
            eps = _fmt(o.attr("eps"))
            self.bind(o, f"{x} * lax.rsqrt(jnp.mean({x} * {x}, axis=-1, keepdims=True) + {eps})")
        elif o.op == "concat":
            parts = ", ".join(self.f32(a) for a in args)
            self.bind(o, f"jnp.concatenate([{parts}], axis={o.attr('dim')})")
        else:
            raise CodegenError(f"{self.where(o)}: the Pallas printer has no rule for this op")

    def dot(self, o: TileOp, a: _Val, b: _Val) -> str:
        """fp32-accumulated matmul: bf16 tiles as they are (one MXU pass), anything else in
        fp32 at full precision (the MXU's multi-pass fp32, not one bf16 pass)."""
        if a.dtype == b.dtype == "bfloat16":
            xa, xb, kw = a.expr, b.expr, f"preferred_element_type={_F32}"
        else:
            xa, xb = self.f32(a), self.f32(b)
            kw = f"preferred_element_type={_F32}, precision=lax.Precision.HIGHEST"
        rank = len(o.dims)
        if rank == 2:
            return f"jnp.dot({xa}, {xb}, {kw})"
        batch = tuple(range(rank - 2))
        dn = f"((({rank - 1},), ({rank - 2},)), ({batch}, {batch}))"
        return f"lax.dot_general({xa}, {xb}, {dn}, {kw})"

    def group_of(self, exp_id: int) -> int | None:
        for gi, g in enumerate(self.k.safe_softmax):
            if g.exp == exp_id:
                return gi
        return None

    def loop_valid(self, o: TileOp) -> str:
        """Where exp ``o``'s elements lie before its masked loop's extent (``o.masked``)."""
        m = o.masked[0]
        return f"_in_bounds({tuple(o.dims)}, ({m.dim}, it * {o.dims[m.dim]}, {m.extent}))"

    def emit_safe_exp(self, o: TileOp, x: _Val) -> None:
        gi = self.group_of(o.id)
        assert gi is not None
        m = self.names[("m", gi)]
        xs = self.fresh("v")
        self.emit(f"{xs} = {self.f32(x)}")
        valid = None
        if o.masked:  # the padding past the loop's extent is -inf: out of the max, exp 0
            valid = self.fresh("ok")
            self.emit(f"{valid} = {self.loop_valid(o)}")
            if o.masked[0].dim == len(o.dims) - 1:
                self.emit(f"{xs} = jnp.where({valid}, {xs}, -jnp.inf)")
        rowmax = f"jnp.max({xs}, axis=-1, keepdims=True)"
        if o.phase == "loop":
            self.emit(f"mn{gi} = jnp.maximum({m}[...], {rowmax})")
            self.emit(f"alpha{gi} = jnp.exp({m}[...] - mn{gi})")
            self.emit(f"{m}[...] = mn{gi}")
        else:
            self.emit(f"mn{gi} = {rowmax}")
            self.emit(f"{m}[...] = mn{gi}")
        # x - m <= 0 exactly; the clamp keeps it so where a compiler recomputes x apart
        # from the max (ulps above 0 on scores ~1e8 would overflow the exp)
        e = f"jnp.exp(jnp.minimum({xs} - mn{gi}, 0.0))"
        self.bind(o, e if valid is None else f"jnp.where({valid}, {e}, 0.0)")

    # -- accumulators ----------------------------------------------------------------------
    def rescale(self, acc_id: int, current: str) -> str:
        for gi, g in enumerate(self.k.safe_softmax):
            for r in g.rescale:
                if r.accum != acc_id:
                    continue
                if r.degree < 1:
                    raise CodegenError(
                        f"kernel {self.k.name!r}: accumulator {acc_id} has shift degree "
                        f"{r.degree}; this printer rescales positive degrees only"
                    )
                factor = f"alpha{gi}" if r.degree == 1 else f"alpha{gi} ** {r.degree}"
                current = f"{current} * {factor}"
        carry = self.k.shift_carry
        if carry is not None and acc_id in carry.accums:
            current = f"{current} * alpha_c"
        return current

    def emit_accum_update(self, o: TileOp) -> None:
        ref = self.names[("acc", o.id)]
        kind = o.attr("acc")
        fused = self.k.fused_accums().get(o.id)
        if fused is not None:
            mm = self.k.op(fused)
            upd = self.dot(mm, self.arg(mm.args[0]), self.arg(mm.args[1]))
        else:
            x = self.f32(self.arg(o.args[0]))
            if kind == "iter":
                upd = x
            elif kind == "sum":
                upd = f"jnp.sum({x}, axis=-1, keepdims=True)"
            elif kind == "rms":
                xs = self.fresh("v")
                self.emit(f"{xs} = {x}")
                upd = f"jnp.sum({xs} * {xs}, axis=-1, keepdims=True)"
            elif kind == "sum_todimx":
                src = self.k.op(o.args[0]).dims
                upd = _to_dimx(x, src, len(src) - 1, o.attr("dimx"))
            else:
                raise CodegenError(f"{self.where(o)}: unknown accumulator {kind!r}")
        self.emit(f"{ref}[...] = {self.rescale(o.id, f'{ref}[...]')} + {upd}")

    def finish_accum(self, o: TileOp) -> None:
        ref = self.names[("acc", o.id)]
        if o.attr("acc") == "rms":
            eps = _fmt(o.attr("eps"))
            self.bind(o, f"jnp.sqrt({ref}[...] / {o.attr('extent')} + {eps})")
        else:
            self.bind(o, f"{ref}[...]")

    # -- body ------------------------------------------------------------------------------
    def print_body(self) -> list[str]:
        k = self.k
        refs = [
            *self.in_refs,
            *self.shift_refs.values(),
            *self.out_refs,
            *self.store_refs.values(),
            *(n for n, _ in self.scratch),
        ]
        self.lines = [f"def {k.name}_body({', '.join(refs)}):"]
        self.emit("it = pl.program_id(3)")
        for i, a in enumerate(k.inputs):
            if a.masked:
                self.emit(f"mk{i} = {_edge_mask(a)}")
        self.emit("")
        self.emit("@pl.when(it == 0)")
        self.emit("def _first():")
        self.indent += 1
        for o in k.ops:
            if o.op == "accum":
                self.emit(f"{self.names[('acc', o.id)]}[...] = jnp.zeros({_shape(o.dims)}, {_F32})")
        for gi in range(len(k.safe_softmax)):
            m = self.names[("m", gi)]
            self.emit(f"{m}[...] = jnp.full({m}.shape, float('-inf'), {_F32})")
        if k.shift_carry is not None:
            m = self.names[("M", 0)]
            self.emit(f"{m}[...] = jnp.full({m}.shape, float('-inf'), {_F32})")
        for o in k.ops:
            if o.phase == "pre":
                self.emit_op(o)
                if ("pre", o.id) in self.names:
                    self.emit(f"{self.names[('pre', o.id)]}[...] = {self.f32(self.vals[o.id])}")
        self.emit("pass")
        self.indent -= 1
        self.emit("")
        self.pre_as_ref()
        self.carry_done = False
        for o in k.ops:
            if o.phase == "loop":
                self.emit_op(o)
            elif o.phase == "accum":
                self.emit_accum_update(o)
        self.emit("")
        self.emit(f"@pl.when(it == {self.last})")
        self.emit("def _last():")
        self.indent += 1
        for o in k.ops:
            if o.phase == "accum":
                self.finish_accum(o)
            elif o.phase == "epilogue":
                self.emit_op(o)
        for i, acc in enumerate(k.outputs):
            assert acc.src is not None
            v = self.vals[acc.src]
            expr = self.f32(v)
            if tuple(self.k.op(acc.src).dims) != tuple(acc.tile):
                expr = f"({expr}).reshape({_shape(acc.tile)})"
            self.emit(f"o{i}[...] = ({expr}).astype(o{i}.dtype)")
        for gi, ref in self.store_refs.items():
            st = k.safe_softmax[gi].shift_store
            assert st is not None
            self.emit(f"{ref}[...] = {self.names[('m', gi)]}[...].reshape({_shape(st.tile)})")
        self.indent -= 1
        return self.lines

    def print_call(self) -> list[str]:
        """``def <name>(*buffers, interpret)``: the pallas_call of the kernel."""
        k, plan = self.k, self.plan
        w = self.where()
        in_specs = [_block_spec(a, f"{w}, input {i}") for i, a in enumerate(k.inputs)]
        args = [a.buffer for a in k.inputs]
        for i in self.shift_refs:
            sl = k.inputs[i].shift_load
            assert sl is not None
            in_specs.append(_block_spec(sl.access, f"{w}, input {i}'s shift_load"))
            args.append(sl.access.buffer)
        outs = list(k.outputs)
        out_specs = [_block_spec(a, f"{w}, output {i}") for i, a in enumerate(outs)]
        for gi in self.store_refs:
            st = k.safe_softmax[gi].shift_store
            assert st is not None
            outs.append(st)
            out_specs.append(_block_spec(st, f"{w}, group {gi}'s shift_store"))
        out_bufs = [plan.buffer(a.buffer) for a in outs]
        if len({b.id for b in out_bufs}) != len(out_bufs):
            raise CodegenError(f"{w}: two outputs store into one buffer; not printable as Pallas")
        shapes = [
            f"jax.ShapeDtypeStruct({_shape(b.dims)}, {_JNP_DTYPE[b.dtype]})" for b in out_bufs
        ]
        scratch = [f"pltpu.VMEM({_shape(d)}, {_F32})" for _, d in self.scratch]
        grid = (*k.grid, k.forloop_range)
        # one parameter per operand: a kernel may read one buffer twice (e.g. two maxima)
        params = ", ".join(f"a{i}" for i in range(len(args)))
        lines = [
            f"def {k.name}({params}{', ' if params else ''}interpret=False):",
            "    return pl.pallas_call(",
            f"        {k.name}_body,",
            f"        grid={_shape(grid)},",
            "        in_specs=[",
            *(f"            {s}," for s in in_specs),
            "        ],",
            "        out_specs=[",
            *(f"            {s}," for s in out_specs),
            "        ],",
            "        out_shape=[",
            *(f"            {s}," for s in shapes),
            "        ],",
            f"        scratch_shapes=[{', '.join(scratch)}],",
            "        compiler_params=pltpu.CompilerParams(",
            '            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),',
            f"            vmem_limit_bytes={VMEM_LIMIT_BYTES},",
            "        ),",
            "        interpret=interpret,",
            f"        name={k.name!r},",
            f"    )({params})",
        ]
        self.out_bufs = [b.id for b in out_bufs]
        return lines


# -- elementwise rules ---------------------------------------------------------------------


def _unary(name: str, x: str, params: Sequence[float]) -> str:
    rules = {
        "exp": f"jnp.exp({x})",
        "square": f"({x}) * ({x})",
        "sqrt": f"jnp.sqrt({x})",
        "rsqrt": f"lax.rsqrt({x})",
        "silu": f"({x}) / (1.0 + jnp.exp(-({x})))",
        "gelu": f"0.5 * ({x}) * (1.0 + lax.erf(({x}) * {_fmt(1 / math.sqrt(2.0))}))",
        "relu": f"jnp.maximum({x}, 0.0)",
        "sigmoid": f"1.0 / (1.0 + jnp.exp(-({x})))",
        "tanh": f"jnp.tanh({x})",
        "neg": f"-({x})",
    }
    if name in rules:
        return rules[name]
    if name == "mul_scalar":
        return f"({x}) * {_fmt(params[0])}"
    if name == "add_scalar":
        return f"(({x}) + {_fmt(params[0])})"
    if name == "clamp":
        return f"jnp.clip({x}, {_fmt(params[0])}, {_fmt(params[1])})"
    raise CodegenError(f"the Pallas printer has no rule for unary op {name!r}")


def _binary(name: str, a: str, b: str) -> str:
    ops = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if name in ops:
        return f"({a}) {ops[name]} ({b})"
    if name == "pow":
        return f"jnp.power({a}, {b})"
    raise CodegenError(f"the Pallas printer has no rule for binary op {name!r}")


def _to_dimx(x: str, dims: Sequence[int], dim: int, dimx: int) -> str:
    """``out[..j..] = Σ_g x[..g·dimx + j..]`` along ``dim``: a sum of static slices."""
    groups = dims[dim] // dimx
    if groups == 1:
        return x
    pre = ", ".join([":"] * dim)
    sl = [f"({x})[{pre}{', ' if pre else ''}{g * dimx}:{(g + 1) * dimx}]" for g in range(groups)]
    return " + ".join(sl)


# -- library kernels -----------------------------------------------------------------------


def _library(k: LibraryKernel, plan: Plan) -> str:
    """One statement computing a library kernel's output buffer with jax.numpy (fp32)."""
    xs = [f"b{b}.astype({_F32})" for b in k.inputs]
    p = k.params
    op = k.op
    if op == "matmul":
        expr = f"jnp.matmul({xs[0]}, {xs[1]}, precision=lax.Precision.HIGHEST)"
    elif op == "unary":
        name = p["op"]
        shift = p.get("shift_dims")
        if name == "exp" and shift:
            axes = tuple(int(d) for d in shift)
            return _assign(
                k,
                plan,
                f"_shifted_exp({xs[0]}, {axes})",
            )
        expr = _unary(name, xs[0], list(p.get("params", [])))
    elif op == "binary":
        expr = _binary(p["op"], xs[0], xs[1])
    elif op == "reduction":
        expr = f"jnp.sum({xs[0]}, axis={p['dim']}, keepdims=True)"
    elif op == "rms_norm":
        n = int(p.get("num_normalized_dims", 1))
        rank = len(plan.buffer(k.inputs[0]).dims)
        axes = tuple(range(rank - n, rank))
        eps = _fmt(float(p.get("eps", 1e-6)))
        expr = f"_rms_norm({xs[0]}, {axes}, {eps})"
        if p.get("has_weight"):
            expr = f"{expr} * {xs[1]}"
    elif op == "softmax":
        expr = f"jax.nn.softmax({xs[0]}, axis={p['dim']})"
    elif op == "concat":
        expr = f"jnp.concatenate([{', '.join(xs)}], axis={p['dim']})"
    elif op == "chunk":
        expr = f"jnp.array_split({xs[0]}, {p['chunks']}, axis={p['dim']})[{p['index']}]"
    elif op == "reduce_max":
        expr = f"jnp.max({xs[0]}, axis={int(p['dim'])}, keepdims=True)"
    elif op == "permute":
        expr = f"jnp.transpose({xs[0]}, {tuple(int(d) for d in p['perm'])})"
    elif op == "reshape":
        expr = f"jnp.reshape({xs[0]}, {tuple(int(d) for d in p['dims'])})"
    elif op == "all_reduce":
        if int(p.get("world_size", 1)) != 1:
            raise CodegenError(
                "all_reduce over several TPU ranks is not printed by the tpu backend; "
                "superoptimize the single-rank graph"
            )
        expr = xs[0]
    else:
        raise CodegenError(f"the Pallas printer has no rule for library op {op!r}")
    return _assign(k, plan, expr)


def _assign(k: LibraryKernel, plan: Plan, expr: str) -> str:
    out = plan.buffer(k.outputs[0])
    return f"b{out.id} = ({expr}).astype({_JNP_DTYPE[out.dtype]})"


_HELPERS = '''
def _shifted_exp(x, axes):
    """exp(x - m), m the max over ``axes`` (0 where it is not finite)."""
    m = jnp.max(x, axis=axes, keepdims=True)
    return jnp.exp(x - jnp.where(jnp.isfinite(m), m, 0.0))


def _rms_norm(x, axes, eps):
    return x / jnp.sqrt(jnp.mean(x * x, axis=axes, keepdims=True) + eps)


def _in_bounds(shape, *edges):
    """Where a block's elements lie inside the array: per (dim, block start, extent), the
    start plus the element's index along dim stays below the extent."""
    inside = None
    for dim, start, extent in edges:
        ok = lax.broadcasted_iota(jnp.int32, shape, dim) + start < extent
        inside = ok if inside is None else inside & ok
    return inside
'''


# -- module --------------------------------------------------------------------------------


def generate_pallas(plan: object, spec: DeviceSpec | None = None) -> PallasSource:
    """Print ``plan`` (anything :func:`yirage.plan.parse_plan` reads) as a Pallas module;
    with ``spec``, its block shapes are checked against the spec's tiling rule first."""
    p = parse_plan(plan)
    if spec is not None:
        check_blocks(p, spec)
    written: set[int] = set()
    kernels: list[str] = []
    steps: list[str] = []
    table: list[str] = []
    for k in p.kernels:
        if isinstance(k, LibraryKernel):
            steps.append(_library(k, p))
            outs = list(k.outputs)
        else:
            _refuse_shifted_masks(k)
            kp = _KernelPrinter(p, k)
            kp.layout()
            body = kp.print_body()
            call = kp.print_call()
            kernels += [*body, "", "", *call, "", ""]
            outs = kp.out_bufs
            args = ", ".join(
                [f"b{a.buffer}" for a in k.inputs]
                + [f"b{k.inputs[i].shift_load.access.buffer}" for i in kp.shift_refs]  # type: ignore[union-attr]
            )
            lhs = ", ".join(f"b{b}" for b in outs) + ","
            steps.append(f"{lhs} = {k.name}({args}{', ' if args else ''}interpret=interpret)")
            blocks = [list(a.tile) for a in k.inputs] + [list(a.tile) for a in k.outputs]
            table.append(
                f"    {k.name!r}: {{'grid': {(*k.grid, k.forloop_range)!r}, 'blocks': {blocks!r}}},"
            )
        for b in outs:
            if b in written:
                raise CodegenError(
                    f"buffer {b} is written by two kernels; the Pallas printer needs one "
                    f"writer per buffer"
                )
            written.add(b)
    ins = [b for b in p.inputs]
    io = [
        f"PLAN_HASH = {p.graph_hash!r}",
        f"INPUTS = {[(tuple(b.dims), b.dtype) for b in ins]!r}",
        f"OUTPUTS = {[(tuple(b.dims), b.dtype) for b in p.outputs]!r}",
        "KERNELS = {",
        *table,
        "}",
    ]
    names = ", ".join(f"b{b.id}" for b in ins) + ("," if len(ins) == 1 else "")
    forward = [
        "def forward(*inputs, interpret=False):",
        f"    {names} = inputs" if ins else "    del inputs",
        *(f"    {s}" for s in steps),
        f"    return [{', '.join(f'b{b.id}' for b in p.outputs)}]",
    ]
    header = [
        f'"""Printed by yirage-tpu ({CODEGEN_VERSION}) from KernelPlan {p.graph_hash}."""',
        "",
        "import jax",
        "import jax.numpy as jnp",
        "from jax import lax",
        "from jax.experimental import pallas as pl",
        "from jax.experimental.pallas import tpu as pltpu",
        "",
        *io,
        _HELPERS,
    ]
    text = "\n".join([*header, "", *kernels, *forward]) + "\n"
    return PallasSource(p, text)
