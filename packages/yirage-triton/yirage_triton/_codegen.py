"""KernelPlan → Triton: one ``@triton.jit`` kernel per generated kernel plus a host launcher.

The printed module is plain Python source (Triton needs a real source file for ``@jit``);
:func:`~yirage_triton.write_triton_module` writes it into the cache and
:func:`~yirage_triton.load_triton_module` imports it. The module exposes

* ``launch(inputs) -> list[torch.Tensor]``: allocates outputs and intermediates on the
  inputs' device through torch (so the caching allocator serves CUDA-graph captures), runs the
  kernels in plan order on the current stream; library kernels go through torch
  (``torch.matmul`` → cuBLAS …). No host synchronisation, so it is CUDA-graph capturable.
* ``warmup(inputs)``: compiles every generated kernel for ``inputs`` without running any
  (library kernels are skipped, their outputs only allocated); called under
  ``triton.AsyncCompileMode`` it queues the compilations in a thread pool.
* ``PLAN_HASH``, ``INPUTS`` / ``OUTPUTS`` (dims, dtype per graph input / output), ``KERNELS``
  (per generated kernel: grid, warps, stages).

Printing rules (docs/kernel-plan.md gives the plan semantics):

* Tile shapes become power-of-two Triton blocks: each tile dim is padded to the next power of
  two and loads/stores are masked only where padding exists. Dims taking part in a tile
  matmul (M, N, K) are padded to at least 16 so ``tl.dot`` can use tensor cores. Padding sizes
  are unified across ops (union-find over tile dims linked by elementwise ops and matmuls),
  so every op sees operands of consistent block shapes.
* Masked edge tiles (an access's ``masked`` dims): loads and stores are also masked by the
  global index against the buffer's extent, so the last block reads zeros past it and
  writes nothing there (the plan's semantics; such dims are never reduced in the kernel).
* An exp over a masked loop's padding (the op's ``masked`` dim) is 0 there: the printer
  compares the loop's running index (``it * tile + lane``) with the extent, keeps those
  elements out of a safe-softmax group's max (-inf) and zeroes the exp. A masked loop is
  printed as the iterations before its last, without these masks (their tiles are whole),
  then the last iteration with them (a split loop keeps the masks in every iteration).
* Padded lanes hold zeros after loads; the printer tracks which ops keep them zero and masks
  values (0 for sums and matmul contractions, -∞ for running maxima) before any reduction
  over a padded dim whose lanes may be non-zero.
* An RMS accumulator over a streamed 16-bit tile that a loop matmul reads as its A operand
  sums the diagonal of ``A·Aᵀ`` (a second ``tl.dot`` on the same tile), so A stays in the
  dot's shared-memory pipeline; other tiles a dot and an elementwise op both read are
  loaded twice, once for each.
* Everything is computed in fp32; loaded 16-bit tiles are fed to ``tl.dot`` as they are
  (fp32 accumulation), computed fp32 operands of a matmul are rounded to the graph's 16-bit
  dtype first (or, for fp32 graphs, multiplied with ``input_precision`` from the options).
* Grids over two axes (row tiles x column tiles) run in the grouped tile order of
  :func:`grouped_order_lines` (the order the core's cost model assumes for L2 reuse within a
  wave); the pipeline depth is the most stages whose padded stream buffers fit the shared
  memory budget (:meth:`_KernelPrinter.pipelined_bytes`).
* Phases: ``pre`` ops and loop-invariant loads are hoisted before the loop, ``loop`` ops and
  accumulator updates run in ``tl.range(0, forloop_range, num_stages=NUM_STAGES)``,
  ``epilogue`` ops and the stores after it. A matmul the plan marks ``accumulate_into`` an
  ``iter`` accumulator is fused into ``tl.dot(a, b, acc)``.
* ``safe_softmax`` groups keep a running row max ``m``, compute ``exp(x - m)`` and rescale
  their accumulators by ``exp(m_old - m_new)``; outputs listed in ``scale_outputs`` are
  stored shifted and ``m`` is stored at the group's ``shift_store``.
* A ``shift_carry`` kernel (the reader of shifted partials) is printed as one more running-max
  group: where its shifted inputs are loaded it loads their maxima (``shift_load``: a column
  where one max covers a tile's row, so a row needs one exp, else expanded to the columns;
  each distinct max tile once), raises its running max ``M`` to them, rescales the listed
  accumulators by ``exp(M_old - M_new)`` and multiplies each shifted tile by ``exp(m - M)``.
  A row whose maxima are all ``-inf`` (padding) uses 0 for ``M`` so no lane turns NaN.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from yirage.plan import (
    CodegenError,
    GeneratedKernel,
    Plan,
    TileAccess,
    TileOp,
    parse_plan,
)
from yirage_triton._align import misaligned_inputs, padded_view
from yirage_triton._fold import FoldedMask, fold_unit_batch
from yirage_triton._host import fmt_float as _fmt_float
from yirage_triton._host import launcher_lines
from yirage_triton._subtile import subtile_kernel

__all__ = ["CODEGEN_VERSION", "TritonOptions", "TritonSource", "generate_triton"]

#: Bumped whenever the printed code changes; part of every cache key.
CODEGEN_VERSION = "triton-23"

_TL_DTYPE = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}
_INT32_LIMIT = 2**31 - 1


#: Software-pipelining depth of a streaming for-loop by default, and of the "deep" variants
#: (memory-bound loops with few blocks per SM keep more bytes in flight: on the H100 the
#: fused gated MLP ran 25 µs with 5 stages against 27-34 µs with 3).
DEFAULT_STAGES = 3
DEEP_STAGES = 5

#: Tiles of the longer grid axis per group of the grouped tile order (see
#: :func:`grouped_order_lines`); the core's cost model assumes the same order and group
#: (``cost::wave::GROUP_TILES``) when it charges re-reads within a wave to L2.
GROUP_TILES = 8


def grouped_axes(grid: Sequence[int]) -> tuple[int, int] | None:
    """(grouped axis, other axis) of a grid printed in the grouped tile order, or None.

    A grid with exactly two axes of more than one block (row tiles x column tiles) runs its
    blocks in groups of :data:`GROUP_TILES` tiles of the longer axis (the lower axis on a
    tie), the other axis after them, group after group: consecutive blocks, which run in the
    same wave, then share their tiles of both operands through L2."""
    axes = [d for d in range(3) if grid[d] > 1]
    if len(axes) != 2:
        return None
    lo, hi = axes
    return (hi, lo) if grid[hi] > grid[lo] else (lo, hi)


def grouped_order_lines(grid: Sequence[int]) -> list[str] | None:
    """Triton lines binding ``bx``, ``by``, ``bz`` in the grouped tile order (None: the
    grid is not tiled over two axes, and the launch order stays as it is)."""
    axes = grouped_axes(grid)
    if axes is None:
        return None
    a, b = axes
    lo, hi = sorted(axes)
    ga, gb = grid[a], grid[b]
    names = ["bx", "by", "bz"]
    lines = [
        f"# grouped tile order: {GROUP_TILES} tiles of axis {a} ({ga}), then axis {b} ({gb})",
        f"pid = tl.program_id({hi}) * {grid[lo]} + tl.program_id({lo})",
        f"first = (pid // {GROUP_TILES * gb}) * {GROUP_TILES}",
        f"size = tl.minimum({ga} - first, {GROUP_TILES})",
        f"local = pid % {GROUP_TILES * gb}",
        f"{names[a]} = first + local % size",
        f"{names[b]} = local // size",
    ]
    rest = next(d for d in range(3) if d not in axes)
    lines.append(f"{names[rest]} = tl.program_id({rest})")
    return lines


@dataclass(frozen=True)
class TritonOptions:
    """Knobs of the printer that are not in the plan.

    ``num_stages``: software-pipelining depth of the for-loop (None: ``max_stages`` when the
    loop streams tiles and that many stage buffers fit in ``smem_limit``, else fewer; 1 without
    a streaming loop). ``fp32_dot_precision``: ``input_precision`` of ``tl.dot`` on fp32
    operands ("ieee", "tf32", "tf32x3"). ``smem_limit``: shared memory per block (bytes) the
    stage count must respect (None: not checked; a forced ``num_stages`` is lowered only
    where Triton's own ``num_stages - 1`` buffers would not fit). ``bf16_dot_as_fp32``:
    multiply bfloat16 tiles as fp32 (the Triton interpreter's ``tl.dot`` is wrong on bfloat16
    operands in Triton 3.9, so the interpreter backend sets it; GPUs never need it).
    ``split_loop``: (kernel name, S) pairs; such a kernel is printed as a part kernel running
    1/S of its for-loop in S times as many blocks (the plan's ``loop_split``) whose last
    part per block combines the parts, or with ``last_block_combine`` off a separate combine
    kernel does.
    ``scale_after_dot``: a matmul operand divided by a vector that is constant along the
    contracted dim (qknorm's K tile over its row norms) is multiplied raw and the product
    scaled instead (see :meth:`_KernelPrinter._scaled_after_dot`); the backend profiles it as
    a variant of its own. ``subtile``: (kernel name, f) pairs; such a kernel's loop chunks are
    cut f ways (:func:`~yirage_triton._subtile.subtile_kernel`, a CodegenError where that does
    not apply). ``pdl``: launch with programmatic dependent launch (sm_90+): every kernel
    first waits for the grids before it in the stream (``griddepcontrol.wait``, before any
    global memory access, so it may read what they wrote) and then lets the next grid launch,
    whose blocks get resident and wait while this one runs: back-to-back kernels no longer
    pay the launch gap and the ramp-up between them. ``dot_sum_precision``: ``input_precision``
    of the ``tl.dot`` that sums a tile's squares (see :meth:`_KernelPrinter._dot_sums`; "tf32"
    where the target has it, "ieee" on AMD's gfx90a/gfx1100). ``launch_options``: (name,
    value) compile options of the vendor's Triton backend printed into every launch and kept
    in ``KERNELS`` (AMD: ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``).
    ``eager_library``: a plan of library kernels alone runs as PyTorch eager runs the graph (see
    :mod:`yirage_triton._host`); the backend profiles it as a variant of its own.
    ``fused_attention``: attention chains of library kernels run as one call of PyTorch's
    fused attention (see :mod:`yirage_triton._sdpa`).
    ``align_rows``: graph inputs whose rows are no multiple of 16 bytes are copied into
    row-padded buffers first, which the kernels read (see :mod:`yirage_triton._align`).
    ``exact_softmax_shift``: kernels with a safe-softmax group or a shift carry are compiled
    without multiply-add contraction (``enable_fp_fusion=False``; for Triton backends that
    have the option): contracted, ``s * c - max(s * c)`` is ``fma(s, c, -max)``, which at
    scores of 1e8 misses zero by tens at the maximum itself, so every weight of the row
    underflows and the row divides zero by zero.

    With ``last_block_combine`` the module keeps zeroed arrival counters per device and
    stream (each kernel's last parts zero them again); CUDA graphs captured on one stream
    share them, so replay such graphs one after the other, not concurrently."""

    num_stages: int | None = None
    fp32_dot_precision: str = "ieee"
    smem_limit: int | None = None
    bf16_dot_as_fp32: bool = False
    split_loop: tuple[tuple[str, int], ...] = ()
    max_stages: int = DEFAULT_STAGES
    last_block_combine: bool = True
    scale_after_dot: bool = False
    subtile: tuple[tuple[str, int], ...] = ()
    pdl: bool = False
    dot_sum_precision: str = "tf32"
    launch_options: tuple[tuple[str, int], ...] = ()
    eager_library: bool = False
    fused_attention: bool = False
    exact_softmax_shift: bool = False
    align_rows: bool = False

    def key(self) -> str:
        key = (
            f"stages={self.num_stages};fp32dot={self.fp32_dot_precision};smem={self.smem_limit};"
            f"bf16dot32={self.bf16_dot_as_fp32};split={list(self.split_loop)};"
            f"max_stages={self.max_stages};last_block={self.last_block_combine};"
            f"scale_after_dot={self.scale_after_dot};subtile={list(self.subtile)};"
            f"pdl={self.pdl}"
        )
        # only where set, so the keys of existing printings stay what they were
        if self.dot_sum_precision != "tf32":
            key += f";dotsum={self.dot_sum_precision}"
        if self.launch_options:
            key += f";launch={list(self.launch_options)}"
        if self.eager_library:
            key += ";eager"
        if self.fused_attention:
            key += ";sdpa"
        if self.exact_softmax_shift:
            key += ";exactshift"
        if self.align_rows:
            key += ";align"
        return key


@dataclass(frozen=True)
class TritonSource:
    """Printed Triton module for one plan."""

    text: str
    plan: Plan
    options: TritonOptions
    kernel_names: tuple[str, ...]
    language: str = "triton"
    codegen_version: str = CODEGEN_VERSION

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _np2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


# ---------------------------------------------------------------------------------------------
# padding classes


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}

    def find(self, x: tuple[int, int]) -> tuple[int, int]:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def padded_dims(k: GeneratedKernel) -> dict[int, tuple[int, ...]]:
    """Padded (power-of-two) block shape of every op's value, by op id: the shapes the
    printed kernel holds (a vendor's resource checker sizes its buffers by them)."""
    uf = _UnionFind()
    by_id = {o.id: o for o in k.ops}
    mma: set[tuple[int, int]] = set()
    for o in k.ops:
        for d in range(len(o.dims)):
            uf.find((o.id, d))
        args = [by_id[a] for a in o.args]
        r = len(o.dims)
        if o.op in ("unary", "rms_norm") or (o.op == "accum" and o.attr("acc") == "iter"):
            for d in range(r):
                uf.union((o.id, d), (args[0].id, d))
        elif o.op == "binary":
            for d in range(r):
                for a in args:
                    if a.dims[d] == o.dims[d]:
                        uf.union((o.id, d), (a.id, d))
        elif o.op in ("reduction", "reduction_to_dimx", "concat"):
            for d in range(r):
                if d != o.attr("dim"):
                    for a in args:
                        uf.union((o.id, d), (a.id, d))
        elif o.op == "accum":
            for d in range(r - 1):
                uf.union((o.id, d), (args[0].id, d))
        elif o.op == "matmul":
            a, b = args
            for d in range(r - 2):
                uf.union((o.id, d), (a.id, d))
                uf.union((o.id, d), (b.id, d))
            uf.union((a.id, r - 1), (b.id, r - 2))  # K
            uf.union((o.id, r - 2), (a.id, r - 2))  # M
            uf.union((o.id, r - 1), (b.id, r - 1))  # N
            mma.update({(a.id, r - 1), (o.id, r - 2), (o.id, r - 1)})
    size: dict[tuple[int, int], int] = {}
    for o in k.ops:
        for d, n in enumerate(o.dims):
            root = uf.find((o.id, d))
            size[root] = max(size.get(root, 1), _np2(n))
    for m in mma:
        root = uf.find(m)
        size[root] = max(size[root], 16)
    return {o.id: tuple(size[uf.find((o.id, d))] for d in range(len(o.dims))) for o in k.ops}


# ---------------------------------------------------------------------------------------------
# values


@dataclass
class _Val:
    name: str
    dims: tuple[int, ...]  # logical
    pdims: tuple[int, ...]  # padded block shape
    dtype: str  # "float32" (computed) or a buffer dtype (loaded, not yet converted)
    clean: frozenset[int] = field(default_factory=frozenset)  # dims whose padding holds zeros
    # logical size-1 dims whose padded lanes repeat lane 0 (a sum printed as a tl.dot)
    rep: frozenset[int] = field(default_factory=frozenset)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def padded(self, d: int) -> bool:
        return self.pdims[d] != self.dims[d]


def _shape(dims: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _expand(expr: str, d: int, rank: int) -> str:
    """``expr`` (1-D along dim d) broadcast to rank ``rank``."""
    if rank == 1:
        return expr
    idx = ", ".join(":" if i == d else "None" for i in range(rank))
    return f"({expr})[{idx}]"


class _KernelPrinter:
    def __init__(self, plan: Plan, k: GeneratedKernel, opts: TritonOptions) -> None:
        self.plan = plan
        self.k = k
        self.opts = opts
        self.lines: list[str] = []
        self.indent = 1
        self.vals: dict[int, _Val] = {}
        self.pdims = padded_dims(k)
        self.tmp = 0
        self.helpers: set[str] = set()
        self.by_id = {o.id: o for o in k.ops}
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
        # the shift carry is one more running-max group, numbered after the safe-softmax ones
        self.carry_gi = len(k.safe_softmax)
        self.carry_loads = [
            o for o in k.ops if o.op == "input" and k.inputs[o.attr("input")].shift_load is not None
        ]
        self.carry_emitted = False  # its maxima are loaded in the kernel body printed now
        self.carry_m: dict[int, str] = {}  # shifted load -> the max tile it is scaled by
        if k.shift_carry is not None:
            for a in k.shift_carry.accums:
                self.groups_of_acc.setdefault(a, []).append(self.carry_gi)
        # buffer params, in first-use order
        self.params: list[int] = []
        shifts = [a.shift_load.access for a in k.inputs if a.shift_load is not None]
        shifts += [g.shift_store for g in k.safe_softmax if g.shift_store is not None]
        for acc in (*k.inputs, *k.outputs, *shifts):
            if acc.buffer not in self.params:
                self.params.append(acc.buffer)
        self.invariant = self.k.invariant_ops()
        # printing a masked loop's iterations before its last: every walked tile is whole
        self.whole_iters = False
        # accum id -> matmul id fused into tl.dot(a, b, acc) (the plan's accumulate_into)
        self.fused = {
            acc: mm for acc, mm in k.fused_accums().items() if self.pdims[mm] == self.pdims[acc]
        }
        self.fused_mm = set(self.fused.values())
        self.scaled = self._scaled_after_dot() if opts.scale_after_dot else {}
        self.absorbed = {div for div, _, _ in self.scaled.values()}
        self.dot_sums: dict[int, int] = {}
        for rid, (rows, chain) in self._dot_sums().items():
            self.dot_sums[rid] = rows
            for oid in chain:  # the sum and the unary ops after it hold `rows` equal rows
                pd = list(self.pdims[oid])
                pd[-2] = rows
                self.pdims[oid] = tuple(pd)
        self.round_for_dot = self._rounded_for_dot()
        self.gram = self._gram_sums()
        self.log2_groups = self._log2_groups()
        self.scale_folded = self._folded_scales()
        self._check_groups()

    def _log2_groups(self) -> set[int]:
        """Safe-softmax groups whose running max stays inside the kernel (nothing stored
        shifted, no shift carry): their scores are kept in base-2 units, ``x·log2(e)``,
        and raised with ``exp2``, so a positive score scale and the exp's own ``log2(e)``
        are one multiply per element instead of two."""
        if self.k.shift_carry is not None:
            return set()
        return {
            gi
            for gi, g in enumerate(self.k.safe_softmax)
            if g.shift_store is None and not g.scale_outputs
        }

    def _folded_scales(self) -> set[int]:
        """Score scales (``mul_scalar`` ops) read by nothing but a base-2 group's exp, which
        folds them: they are not printed on their own."""
        out = set()
        stored = {o.src for o in self.k.outputs}
        for gi in self.log2_groups:
            exp = self.by_id[self.k.safe_softmax[gi].exp]
            x_id = exp.args[0]
            readers = [o.id for o in self.k.ops if x_id in o.args]
            if self._score_scale(x_id) and readers == [exp.id] and x_id not in stored:
                out.add(x_id)
        return out

    def _score_scale(self, x_id: int) -> tuple[int, float] | None:
        """``(v, c)`` when score ``x_id`` is ``mul_scalar(v, c)`` with a finite ``c > 0``
        (then ``max(v·c) = max(v)·c`` and the scale folds into the base-2 factor)."""
        op = self.by_id.get(x_id)
        if op is None or op.op != "unary" or op.attr("unop") != "mul_scalar":
            return None
        c = float(op.attr("params")[0])
        if not (math.isfinite(c) and c > 0.0):
            return None
        return op.args[0], c

    def _operand_dtype(self, o: TileOp) -> str:
        """The dtype a tile is bound with: an input's buffer dtype (a shifted load is scaled
        in float32), float32 for every computed tile."""
        if o.op != "input":
            return "float32"
        acc = self.k.inputs[o.attr("input")]
        return "float32" if acc.shift_load is not None else self.plan.buffer(acc.buffer).dtype

    def _rounded_for_dot(self) -> dict[int, str]:
        """Computed tiles that a 16-bit ``tl.dot`` reads (rounded to 16 bits there) and
        something else reads too, by id → the dot's dtype. They are rounded once where they
        are computed, so every reader sees the value the dot multiplied: a softmax's row sums
        then add exactly the weights its values were multiplied by, and the quotient, a
        convex combination of the values, cannot round past the dtype's largest finite value
        (it did by up to 5e-4 with 16-bit weights over float32 sums: inf for values near it)."""
        low = {"float16"} if self.opts.bf16_dot_as_fp32 else {"float16", "bfloat16"}
        readers: dict[int, int] = {}
        for o in self.k.ops:
            for x in o.args:
                readers[x] = readers.get(x, 0) + 1
        for out in self.k.outputs:
            if out.src is not None:
                readers[out.src] = readers.get(out.src, 0) + 1
        rounded: dict[int, str] = {}
        for o in self.k.ops:
            if o.op != "matmul" or o.id in self.scaled:
                continue
            a, b = (self.by_id[x] for x in o.args)
            da, db = self._operand_dtype(a), self._operand_dtype(b)
            target = da if da in low else db if db in low else self.plan.compute_dtype
            if target not in low:
                continue
            for t in (a, b):
                if t.op != "input" and readers.get(t.id, 0) > 1:
                    rounded[t.id] = target
        return rounded

    def _dot_sums(self) -> dict[int, tuple[int, list[int]]]:
        """Sums over a tile's rows that reach a scaled dot's divisor through unary ops only
        (qknorm's K column norms: ``sqrt(sum(K * K, d) / d)`` beside ``dot(q, K)``): reduction
        id -> (rows of the dot's product, the reduction and the unary ops after it). They are
        printed as ``tl.dot(ones, x * x)``, which
        lands the norms in the product's own layout, every row the same (``_Val.rep``),
        instead of a cross-warp ``tl.sum`` whose result must change layout. The summand goes
        to the tensor cores as tf32 (fp32 range, 11 significant bits, as many as the fp16 K
        itself): qknorm_gqa split 16 ways 12.4 µs on the H100, against 14.8 with tl.sum,
        12.8 with one bfloat16 dot (8 bits) and 14.5 with a bfloat16 high and low part
        (benchmarks/probes/qknorm_probe.py)."""
        out: dict[int, tuple[int, list[int]]] = {}
        if self.plan.compute_dtype == "float32":
            return out  # fp32 graphs keep the fp32 sum
        for m_id, (div_id, _, r_id) in self.scaled.items():
            if self.by_id[m_id].args[1] != div_id or [c.id for c in self.k.consumers(r_id)] != [
                div_id
            ]:
                continue  # a divided A operand, or a divisor used elsewhere too
            red = self.by_id[r_id]
            chain = [r_id]
            while red.op == "unary":
                red = self.by_id[red.args[0]]
                if [c.id for c in self.k.consumers(red.id)] != [chain[-1]]:
                    break  # a value of the chain has another user
                chain.append(red.id)
            rank = len(red.dims)
            if chain[-1] != red.id or red.op != "reduction" or red.attr("dim") != rank - 2:
                continue
            xp = self.pdims[red.args[0]]
            out_p = self.pdims[m_id]
            if (
                xp[-2] < 16
                or xp[-1] < 16
                or xp[-1] != out_p[-1]
                or math.prod(xp[:-2]) != 1
                or math.prod(out_p[:-2]) != 1
                or red.id in self.invariant
            ):
                continue
            out[red.id] = (out_p[-2], chain)
        return out

    def _gram_sums(self) -> set[int]:
        """RMS accumulators over a streamed 16-bit tile that a loop matmul also reads as its
        A operand (RMSNorm + Linear's sum of squares of X beside X @ W). They are printed as
        the diagonal of ``X·Xᵀ`` accumulated by a second ``tl.dot`` on the same tile, so X
        never leaves the dot's shared-memory pipeline: the products of 16-bit values are
        exact in the fp32 accumulator, as in the elementwise sum. On an H200 the fused
        kernel at 24x3000x7000 ran 16.8 µs against 26.1 with the sum of squares in
        registers, 14.5 against 25.3 at 64x4096x4096
        (benchmarks/probes/rows_stream_probe.py)."""
        a_of_dots = {o.args[0] for o in self.k.ops if o.op == "matmul" and o.phase == "loop"}
        out: set[int] = set()
        for o in self.k.ops:
            if o.op != "accum" or o.attr("acc") != "rms":
                continue
            x = self.by_id[o.args[0]]
            if x.op != "input" or x.id in self.invariant or x.id not in a_of_dots:
                continue
            acc = self.k.inputs[x.attr("input")]
            pd = self.pdims[x.id]
            if (
                acc.shift_load is not None
                or self.plan.buffer(acc.buffer).dtype not in ("float16", "bfloat16")
                or len(pd) != 2
                or min(pd) < 16
                or self.pdims[o.id] != (pd[0], 1)
            ):
                continue
            out.add(o.id)
        return out

    def _emit_gram_diagonals(self) -> None:
        """After the loop: each Gram accumulator (see :meth:`_gram_sums`) becomes its
        diagonal, the row sums of squares the rms accumulator holds elsewhere."""
        for aid in sorted(self.gram):
            pm = self.pdims[aid][0]
            eye = f"tl.arange(0, {pm})[:, None] == tl.arange(0, {pm})[None, :]"
            self.emit(f"acc{aid} = tl.sum(tl.where({eye}, acc{aid}, 0.0), axis=1, keep_dims=True)")

    def _scaled_after_dot(self) -> dict[int, tuple[int, int, int]]:
        """Matmuls whose operand is ``x / r`` with ``r`` constant along the contracted dim
        (r of shape [.., 1, N] for B, [.., M, 1] for A), the quotient used by nothing else:
        ``matmul -> (div id, x id, r id)``. They are printed as ``dot(.., x) * (1 / r)``: the
        loaded tile goes to ``tl.dot`` as it is and the division is done on the product
        instead of on the tile (qknorm: [G, L] scores against a [d, L] K tile), which saves
        elementwise work but costs registers; the backend times both printings."""
        outputs = {o.src for o in self.k.outputs}
        found: dict[int, tuple[int, int, int]] = {}
        for m in self.k.ops:
            if m.op != "matmul" or m.id in self.fused_mm:
                continue
            for side in (1, 0):
                div = self.by_id[m.args[side]]
                if (
                    div.op != "binary"
                    or div.attr("binop") != "div"
                    or div.id in outputs
                    or [c.id for c in self.k.consumers(div.id)] != [m.id]
                    or div.phase != m.phase
                    or (div.id in self.invariant) != (m.id in self.invariant)
                    or m.args[0] == m.args[1]
                ):
                    continue
                x, r = (self.by_id[a] for a in div.args)
                out = self.pdims[m.id]
                rp = self.pdims[r.id]
                keep = -1 if side == 1 else -2  # the operand's dim that the product keeps
                if (
                    self.pdims[x.id] != self.pdims[div.id]
                    or x.dims != div.dims
                    or len(rp) != len(out)
                    or rp[-1 if side == 0 else -2] != 1
                    or rp[keep] not in (1, out[keep])
                    or any(p not in (1, q) for p, q in zip(rp[:-2], out[:-2], strict=True))
                ):
                    continue
                found[m.id] = (div.id, x.id, r.id)
                break
        return found

    # -- utilities -------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def fresh(self, prefix: str = "v") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def _check_groups(self) -> None:
        shifted = self.k.shift_carry is not None or any(
            g.shift_store is not None for g in self.k.safe_softmax
        )
        if shifted and self.k.masked_accesses:
            raise CodegenError(
                f"kernel {self.k.name!r}: masked edge tiles with shifted partials (shift_store/"
                "shift_carry) are not printed; lower with a grid that divides the split dims"
            )
        order = {o.id: i for i, o in enumerate(self.k.ops)}
        for g in self.k.safe_softmax:
            e = self.by_id[g.exp]
            for a in g.accums:
                if order[a] < order[g.exp]:
                    raise CodegenError(
                        f"kernel {self.k.name!r}: safe_softmax accumulator {a} is updated "
                        f"before exp {g.exp}"
                    )
                acc_p = self.pdims[a]
                m_p = (*self.pdims[e.args[0]][:-1], 1)
                if len(acc_p) != len(m_p) or any(
                    x != 1 and x != y for x, y in zip(m_p, acc_p, strict=True)
                ):
                    raise CodegenError(
                        f"kernel {self.k.name!r}: safe_softmax row max of shape {list(m_p)} "
                        "does not "
                        f"broadcast to accumulator {a} of shape {list(acc_p)}"
                    )
            if e.phase == "epilogue" and g.accums:
                raise CodegenError(
                    f"kernel {self.k.name!r}: epilogue exp {g.exp} cannot feed accumulators"
                )
        if self.k.shift_carry is None:
            return
        rows = {self.pdims[o.id][:-1] for o in self.carry_loads}
        if len(rows) != 1:
            raise CodegenError(
                f"kernel {self.k.name!r}: shifted inputs pad their rows differently {sorted(rows)}"
            )
        m_p = self._row_max_shape(self.carry_gi)
        for a in self.k.shift_carry.accums:
            acc_p = self.pdims[a]
            if len(acc_p) != len(m_p) or any(
                x != 1 and x != y for x, y in zip(m_p, acc_p, strict=True)
            ):
                raise CodegenError(
                    f"kernel {self.k.name!r}: shift_carry row max of shape {list(m_p)} does not "
                    f"broadcast to accumulator {a} of shape {list(acc_p)}"
                )

    def f32(self, v: _Val) -> str:
        return v.name if v.dtype == "float32" else f"{v.name}.to(tl.float32)"

    def arange_mask(self, d: int, v: _Val) -> str:
        return _expand(f"tl.arange(0, {v.pdims[d]}) < {v.dims[d]}", d, v.rank)

    def masked(self, v: _Val, dims: Sequence[int], fill: str = "0.0", force: bool = False) -> str:
        """fp32 expression of ``v`` with padded lanes along ``dims`` set to ``fill``."""
        expr = self.f32(v)
        conds = [
            self.arange_mask(d, v) for d in dims if v.padded(d) and (force or d not in v.clean)
        ]
        if not conds:
            return expr
        return f"tl.where({' & '.join(conds)}, {expr}, {fill})"

    def bind(
        self,
        op_id: int,
        expr: str,
        dtype: str = "float32",
        clean: Iterable[int] = (),
        rep: Iterable[int] = (),
    ) -> _Val:
        o = self.by_id[op_id]
        name = f"t{op_id}"
        pd = self.pdims[op_id]
        reps = frozenset(rep)
        if o.op != "input" and any(
            n == 1 and p > 1 and d not in reps
            for d, (n, p) in enumerate(zip(o.dims, pd, strict=True))
        ):
            # a size-1 dim padded for tl.dot: reductions/broadcasts may yield extent 1 there
            expr = f"tl.broadcast_to({expr}, {_shape(pd)})"
        if op_id in self.round_for_dot and dtype == "float32":
            expr = f"({expr}).to({_TL_DTYPE[self.round_for_dot[op_id]]}).to(tl.float32)"
        self.emit(f"{name} = {expr}")
        v = _Val(name, o.dims, pd, dtype, frozenset(clean), reps)
        self.vals[op_id] = v
        return v

    def broadcast_operand(self, v: _Val, out_dims: Sequence[int], out_pdims: Sequence[int]) -> str:
        """fp32 expression of ``v`` ready to broadcast against a result of ``out_dims``: a logical
        size-1 dim that was padded (it takes part in a matmul) is reduced to its first lane."""
        expr = self.f32(v)
        for d in range(v.rank):
            if d in v.rep and v.pdims[d] == out_pdims[d]:
                continue  # every lane already holds the value
            if v.dims[d] == 1 and v.pdims[d] > 1 and out_dims[d] > 1:
                first = _expand(f"tl.arange(0, {v.pdims[d]}) == 0", d, v.rank)
                expr = f"tl.sum(tl.where({first}, {expr}, 0.0), axis={d}, keep_dims=True)"
            elif v.pdims[d] != out_pdims[d] and v.pdims[d] != 1:
                raise CodegenError(
                    f"kernel {self.k.name!r}: operand {v.name} block {list(v.pdims)} does not "
                    f"broadcast to {list(out_pdims)}"
                )
        return expr

    # -- loads and stores ------------------------------------------------------------------
    def _access(
        self, acc: TileAccess, pdims: Sequence[int], it: str, width: int = 1
    ) -> tuple[str, str | None]:
        """(pointer, mask) of tile ``acc`` in a ``pdims`` block; with ``width`` > 1 each
        element of the tile's last dim fills ``width`` consecutive lanes (the maxima of a
        ``shift_load`` expanded to the columns they belong to)."""
        buf = self.plan.buffer(acc.buffer)
        rank = len(acc.tile)
        wide = buf.numel > _INT32_LIMIT
        terms = []
        masks = []
        edge = {m.dim: m for m in acc.masked}
        for d in range(rank):
            lanes = acc.tile[d] * (width if d == rank - 1 else 1)
            parts = []
            for t in acc.offsets[d]:
                var = it if t.var == "iter" else t.var
                if t.stride == 0:
                    continue
                if wide:
                    var = f"{var}.to(tl.int64)" if var != "0" else var
                parts.append(f"{var} * {t.stride}" if t.stride != 1 else var)
            ar = f"tl.arange(0, {pdims[d]})"
            if d == rank - 1 and width > 1:
                ar = f"({ar} // {width})"
            if wide:
                ar = f"{ar}.to(tl.int64)"
            idx = f"({' + '.join(parts)} + {ar})" if parts else ar
            stride = buf.strides[d]
            if buf.dims[d] == 1 and pdims[d] == 1:
                continue
            terms.append(_expand(f"{idx} * {stride}" if stride != 1 else idx, d, rank))
            if pdims[d] != lanes:
                masks.append(_expand(f"tl.arange(0, {pdims[d]}) < {lanes}", d, rank))
            walked = any(t.var == "iter" and t.stride for t in acc.offsets[d])
            if d in edge and not (walked and self.whole_iters):  # nothing past the extent
                m = edge[d]
                bound = [str(m.extent)]
                base = m.base if isinstance(m, FoldedMask) else ()
                for t in base:  # a folded batch's first row
                    var = it if t.var == "iter" else t.var
                    var = f"{var}.to(tl.int64)" if wide else var
                    bound.append(f"{var} * {t.stride}")
                masks.append(_expand(f"{idx} < {' + '.join(bound)}", d, rank))
        offs = " + ".join(terms) if terms else "0"
        ptr = f"buf{acc.buffer} + {offs}"
        if not terms or all(p == 1 for p in pdims):
            # scalar-shaped tile: keep the block shape
            ptr = f"buf{acc.buffer} + ({offs}) + tl.zeros({_shape(pdims)}, tl.int32)"
        return ptr, (" & ".join(masks) if masks else None)

    def emit_load(self, o: TileOp, it: str) -> None:
        acc = self.k.inputs[o.attr("input")]
        buf = self.plan.buffer(acc.buffer)
        ptr, mask = self._access(acc, self.pdims[o.id], it)
        if mask:
            expr = f"tl.load({ptr}, mask={mask}, other=0.0)"
        else:
            expr = f"tl.load({ptr})"
        if acc.shift_load is not None:
            self.emit_carry_update(it)
            raw = self.fresh("x")
            self.emit(f"{raw} = {expr}")
            scale = f"sc{self.carry_m[o.id]}"
            self.bind(o.id, f"{raw}.to(tl.float32) * {scale}", clean=range(len(o.dims)))
            return
        self.bind(o.id, expr, dtype=buf.dtype, clean=range(len(o.dims)))

    def emit_carry_update(self, it: str) -> None:
        """Once per printed body, before its first shifted tile: the maxima of the shifted
        tiles (``ml<op>``, -inf in padded lanes; loaded once per distinct max tile, as a
        column where one max covers a tile's row, else expanded to the tile's columns), the
        running max ``m<G>`` raised to them, ``alpha<G>`` = exp(old - new) when it runs in
        the loop, ``mz<G>`` (the max with -inf rows, i.e. padding, read as 0) and the scale
        ``scml<op>`` = exp(m - mz) of each max tile."""
        if self.carry_emitted:
            return
        self.carry_emitted = True
        gi = self.carry_gi
        looping = self._group_looping(gi)
        neg = _fmt_float(-math.inf)
        new = f"m{gi}" if looping else None
        loaded: dict[tuple[TileAccess, tuple[int, ...], int], str] = {}
        for o in self.carry_loads:
            sl = self.k.inputs[o.attr("input")].shift_load
            assert sl is not None
            pd = self.pdims[o.id]
            column = sl.access.tile[-1] == 1
            shape = (*pd[:-1], 1) if column else pd
            width = 1 if column else sl.width
            key = (sl.access, shape, width)
            if key not in loaded:
                name = loaded[key] = f"ml{o.id}"
                ptr, mask = self._access(sl.access, shape, it, width)
                load = f"tl.load({ptr}, mask={mask}, other={neg})" if mask else f"tl.load({ptr})"
                self.emit(f"{name} = {load}")
                rowmax = name if column else f"tl.max({name}, axis={len(pd) - 1}, keep_dims=True)"
                new = rowmax if new is None else f"tl.maximum({new}, {rowmax})"
            self.carry_m[o.id] = loaded[key]
        self.emit(f"mn{gi} = {new}")
        self.emit(f"mz{gi} = tl.where(mn{gi} == {neg}, 0.0, mn{gi})")
        if looping:
            self.emit(f"alpha{gi} = tl.exp(m{gi} - mz{gi})")
        self.emit(f"m{gi} = mn{gi}")
        for name in loaded.values():
            self.emit(f"sc{name} = tl.exp({name} - mz{gi})")

    def emit_store(self, idx: int, acc: TileAccess) -> None:
        buf = self.plan.buffer(acc.buffer)
        v = self.vals[acc.src]  # type: ignore[index]
        expr = self.f32(v)  # scale_outputs are stored shifted (their max goes to shift_store)
        ptr, mask = self._access(acc, v.pdims, "0")
        val = f"({expr}).to({_TL_DTYPE[buf.dtype]})"
        if mask:
            self.emit(f"tl.store({ptr}, {val}, mask={mask})")
        else:
            self.emit(f"tl.store({ptr}, {val})")

    # -- ops -------------------------------------------------------------------------------
    def dot_operands(self, o: TileOp) -> tuple[str, str, str, list[int]]:
        """(a, b, extra kwargs, batch pdims) for a tile matmul."""
        a, b = (self.vals[x] for x in o.args)
        r = a.rank
        ea = self.masked(a, [r - 1]) if a.padded(r - 1) and (r - 1) not in a.clean else None
        eb = self.masked(b, [r - 2]) if b.padded(r - 2) and (r - 2) not in b.clean else None
        low = {"float16", "bfloat16"}
        if self.opts.bf16_dot_as_fp32:
            low = {"float16"}
        if ea is None and eb is None and a.dtype == b.dtype and a.dtype in low:
            xa, xb, kw = a.name, b.name, ""
        else:
            target = (
                a.dtype
                if a.dtype in low
                else b.dtype
                if b.dtype in low
                else self.plan.compute_dtype
            )
            if target not in low:
                target = "float32"
            xa = ea if ea is not None else (a.name if a.dtype == target else self.f32(a))
            xb = eb if eb is not None else (b.name if b.dtype == target else self.f32(b))
            if target in low:
                if not (ea is None and a.dtype == target):
                    xa = f"({xa}).to({_TL_DTYPE[target]})"
                if not (eb is None and b.dtype == target):
                    xb = f"({xb}).to({_TL_DTYPE[target]})"
                kw = ""
            else:
                kw = f", input_precision={self.opts.fp32_dot_precision!r}"
        batch = list(a.pdims[:-2])
        return xa, xb, kw, batch

    def dot_expr(self, o: TileOp, acc: str | None) -> str:
        xa, xb, kw, batch = self.dot_operands(o)
        a, b = (self.vals[x] for x in o.args)
        m, kk = a.pdims[-2:]
        n = b.pdims[-1]
        out = self.pdims[o.id]
        nb = math.prod(batch)
        if len(batch) == 0:
            return f"tl.dot({xa}, {xb}{', ' + acc if acc else ''}{kw})"
        if nb == 1:
            a2, b2 = f"tl.reshape({xa}, [{m}, {kk}])", f"tl.reshape({xb}, [{kk}, {n}])"
            c2 = f", tl.reshape({acc}, [{m}, {n}])" if acc else ""
        elif len(batch) == 1:
            a2, b2 = xa, xb
            c2 = f", {acc}" if acc else ""
            return f"tl.dot({a2}, {b2}{c2}{kw})"
        else:
            a2, b2 = f"tl.reshape({xa}, [{nb}, {m}, {kk}])", f"tl.reshape({xb}, [{nb}, {kk}, {n}])"
            c2 = f", tl.reshape({acc}, [{nb}, {m}, {n}])" if acc else ""
        return f"tl.reshape(tl.dot({a2}, {b2}{c2}{kw}), {_shape(out)})"

    def emit_compute(self, o: TileOp, it: str) -> None:
        kind = o.op
        if kind == "input":
            self.emit_load(o, it)
        elif kind == "matmul":
            if o.id in self.fused_mm:
                return
            if o.id in self.scaled:
                self.emit_scaled_dot(o)
                return
            a, b = (self.vals[x] for x in o.args)
            r = a.rank
            clean = [d for d in range(r - 2) if d in a.clean and d in b.clean]
            if (r - 2) in a.clean:
                clean.append(r - 2)
            if (r - 1) in b.clean:
                clean.append(r - 1)
            self.bind(o.id, self.dot_expr(o, None), clean=clean)
        elif kind == "unary":
            self.emit_unary(o)
        elif kind == "binary":
            if o.id not in self.absorbed:  # printed by its matmul (emit_scaled_dot)
                self.emit_binary(o)
        elif kind == "reduction":
            x = self.vals[o.args[0]]
            d = o.attr("dim")
            keep = [i for i in x.clean if i != d]
            if o.id in self.dot_sums:
                self.bind(o.id, self.dot_sum(x, self.dot_sums[o.id]), clean=keep, rep=[d])
            else:
                expr = f"tl.sum({self.masked(x, [d])}, axis={d}, keep_dims=True)"
                self.bind(o.id, expr, clean=keep)
        elif kind == "reduction_to_dimx":
            x = self.vals[o.args[0]]
            d = o.attr("dim")
            self.bind(
                o.id,
                self.to_dimx(x, d, o.attr("dimx"), self.pdims[o.id][d]),
                clean=[i for i in x.clean if i != d],
            )
        elif kind == "rms_norm":
            x = self.vals[o.args[0]]
            r = x.rank
            xs = self.fresh("x")
            self.emit(f"{xs} = {self.f32(x)}")
            sq = self.masked(_Val(f"({xs} * {xs})", x.dims, x.pdims, "float32", x.clean), [r - 1])
            ms = f"tl.sum({sq}, axis={r - 1}, keep_dims=True) / {x.dims[-1]}"
            eps = _fmt_float(o.attr("eps"))
            self.bind(
                o.id, f"{xs} / tl.sqrt({ms} + {eps})", clean=[i for i in x.clean if i != r - 1]
            )
        elif kind == "concat":
            self.emit_concat(o)
        else:  # pragma: no cover - validated by the parser
            raise CodegenError(f"kernel {self.k.name!r}: cannot print op {kind!r}")

    def dot_sum(self, x: _Val, rows: int) -> str:
        """``x`` summed over its rows (dim -2) by ``tl.dot(ones[rows, R], x)``: a [.., rows, C]
        block whose rows all hold the sum (see :meth:`_dot_sums`)."""
        big, cols = x.pdims[-2:]
        s = self.fresh("s")
        self.emit(f"{s} = tl.reshape({self.masked(x, [x.rank - 2])}, [{big}, {cols}])")
        ones = f"tl.full([{rows}, {big}], 1.0, tl.float32)"
        # the interpreter multiplies in exact fp32 whatever the precision
        prod = f"tl.dot({ones}, {s}, input_precision={self.opts.dot_sum_precision!r})"
        return f"tl.reshape({prod}, {_shape((*x.pdims[:-2], rows, cols))})"

    def emit_scaled_dot(self, o: TileOp) -> None:
        """``dot(a, x / r)`` as ``dot(a, x) * (1 / r)`` (see :meth:`_scaled_after_dot`)."""
        div, x, r = self.scaled[o.id]
        raw = replace(o, args=tuple(x if a == div else a for a in o.args))
        a, b = (self.vals[i] for i in raw.args)
        rank = a.rank
        clean = [d for d in range(rank - 2) if d in a.clean and d in b.clean]
        if (rank - 2) in a.clean:
            clean.append(rank - 2)
        if (rank - 1) in b.clean:
            clean.append(rank - 1)
        rv = self.vals[r]
        pad = [d for d in range(rv.rank) if rv.padded(d) and d not in rv.rep]
        if pad:  # padded divisor lanes read 1, as in emit_binary
            den = self.masked(rv, pad, fill="1.0", force=True)
            rv = _Val(f"({den})", rv.dims, rv.pdims, "float32", rep=rv.rep)
        out = self.by_id[o.id]
        scale = self.broadcast_operand(rv, out.dims, self.pdims[o.id])
        self.bind(o.id, f"{self.dot_expr(raw, None)} * (1.0 / ({scale}))", clean=clean)

    def loop_valid(self, o: TileOp) -> tuple[int, str] | None:
        """(dim, mask) of an exp over a masked loop's padding (``o.masked``): true where the
        element lies before the loop's extent (and in the tile's lanes), else None."""
        if not o.masked or self.whole_iters:
            return None
        m = o.masked[0]
        pd = self.pdims[o.id]
        ar = f"tl.arange(0, {pd[m.dim]})"
        cond = f"(it * {o.dims[m.dim]} + {ar} < {m.extent})"
        if pd[m.dim] != o.dims[m.dim]:
            cond = f"{cond} & ({ar} < {o.dims[m.dim]})"
        return m.dim, _expand(cond, m.dim, len(o.dims))

    def emit_unary(self, o: TileOp) -> None:
        x = self.vals[o.args[0]]
        name = o.attr("unop")
        p = o.attr("params")
        if o.id in self.group_of_exp:
            self.emit_safe_exp(o, x)
            return
        valid = self.loop_valid(o)
        if valid is not None:  # exp of a masked loop's padding is 0 (the plan's semantics)
            d, mask = valid
            self.bind(o.id, f"tl.where({mask}, tl.exp({self.f32(x)}), 0.0)", clean={*x.clean, d})
            return
        if o.id in self.scale_folded:  # its exp multiplies by it (see emit_safe_exp)
            expr = f"({self.f32(x)} * {_fmt_float(float(p[0]))})"
            self.vals[o.id] = _Val(expr, tuple(o.dims), self.pdims[o.id], "float32", x.clean)
            return
        xe = self.f32(x)
        if name not in ("neg", "mul_scalar", "relu", "square") and not xe.isidentifier():
            tmp = self.fresh("x")
            self.emit(f"{tmp} = {xe}")
            xe = tmp
        zero_safe = {"square", "sqrt", "silu", "gelu", "relu", "tanh", "neg", "mul_scalar"}
        exprs = {
            "exp": f"tl.exp({xe})",
            "square": f"{xe} * {xe}",
            "sqrt": f"tl.sqrt({xe})",
            "rsqrt": f"tl.rsqrt({xe})",
            "silu": f"{xe} * tl.sigmoid({xe})",
            "gelu": f"0.5 * {xe} * (1.0 + tl.erf({xe} * 0.7071067811865476))",
            "relu": f"tl.maximum({xe}, 0.0)",
            "sigmoid": f"tl.sigmoid({xe})",
            "tanh": f"2.0 * tl.sigmoid(2.0 * {xe}) - 1.0",
            "neg": f"-{xe}",
            "mul_scalar": f"{xe} * {_fmt_float(p[0]) if p else '1.0'}",
            "add_scalar": f"({xe} + {_fmt_float(p[0]) if p else '0.0'})",
            "clamp": (
                f"tl.minimum(tl.maximum({xe}, {_fmt_float(p[0])}), {_fmt_float(p[1])})"
                if len(p) == 2
                else xe
            ),
        }
        clean = x.clean if name in zero_safe else frozenset()
        if name == "clamp" and len(p) == 2 and p[0] <= 0.0 <= p[1]:
            clean = x.clean
        self.bind(o.id, exprs[name], clean=clean, rep=x.rep)

    def emit_binary(self, o: TileOp) -> None:
        a, b = (self.vals[x] for x in o.args)
        out_p = self.pdims[o.id]
        if o.attr("binop") == "div":
            # padded lanes of the divisor hold 0 (or garbage): make them 1 so the padded
            # lanes of the quotient stay finite (0/0 warns in the interpreter); the real
            # lanes, and the quotient's (unclaimed) padding, are unaffected
            pad = [d for d in range(b.rank) if b.padded(d) and d not in b.rep]
            if pad:
                den = self.masked(b, pad, fill="1.0", force=True)
                b = _Val(f"({den})", b.dims, b.pdims, "float32", b.clean, b.rep)
        ea = self.broadcast_operand(a, o.dims, out_p)
        eb = self.broadcast_operand(b, o.dims, out_p)
        name = o.attr("binop")
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
        if name == "pow":
            self.helpers.add("pow")
            expr = f"_yr_pow({ea}, {eb})"
        elif name == "div" and math.prod(b.pdims) < math.prod(out_p):
            # a broadcast divisor (a row's norm): one reciprocal per divisor element, then
            # multiplies (QK-norm attention divides 32 KB K tiles by 128 norms each
            # iteration: 15.9 against 16.7 µs on the H100); within 1 ulp of the quotient
            # unless the divisor exceeds 2^126
            expr = f"({ea}) * (1.0 / ({eb}))"
        else:
            expr = f"({ea}) {sym[name]} ({eb})"

        def contrib(v: _Val, d: int) -> bool:
            return v.dims[d] == o.dims[d] and d in v.clean

        clean = []
        for d in range(len(o.dims)):
            ca, cb = contrib(a, d), contrib(b, d)
            if (name == "mul" and (ca or cb)) or (name in ("add", "sub") and ca and cb):
                clean.append(d)
        self.bind(o.id, expr, clean=clean)

    def to_dimx(self, x: _Val, d: int, dimx: int, out_pd: int) -> str:
        n = x.dims[d]
        groups = n // dimx
        gp = x.pdims[d] // dimx if x.pdims[d] % dimx == 0 else 0
        if dimx == _np2(dimx) and out_pd == dimx and gp and _np2(groups) == gp:
            xs = self.masked(x, [d])
            shape = [*x.pdims[:d], gp, dimx, *x.pdims[d + 1 :]]
            return f"tl.sum(tl.reshape({xs}, {_shape(shape)}), axis={d})"
        if d != x.rank - 1:
            raise CodegenError(
                f"kernel {self.k.name!r}: reduction to dimx {dimx} of a non-power-of-two tile "
                f"along dim {d} (not the last) is not supported by the Triton printer"
            )
        p = x.pdims[d]
        xs = self.masked(x, [d])
        sel = (
            f"((tl.arange(0, {p})[:, None] % {dimx}) == tl.arange(0, {out_pd})[None, :]) & "
            f"(tl.arange(0, {p})[:, None] < {n})"
        )
        lead = ", ".join(":" for _ in range(x.rank))
        sel_b = "(" + sel + ")[" + ", ".join("None" for _ in range(x.rank - 1)) + ", :, :]"
        return f"tl.sum(tl.where({sel_b}, ({xs})[{lead}, None], 0.0), axis={x.rank - 1})"

    def emit_concat(self, o: TileOp) -> None:
        d = o.attr("dim")
        parts = [self.vals[a] for a in o.args]
        out_p = self.pdims[o.id]
        rank = len(o.dims)
        idx = self.fresh("ci")
        self.emit(
            f"{idx} = tl.broadcast_to("
            f"{_expand(f'tl.arange(0, {out_p[d]})', d, rank)}, {_shape(out_p)})"
        )
        expr = None
        start = 0
        pieces = []
        for v in parts:
            src = self.f32(v)
            index = f"tl.minimum(tl.maximum({idx} - {start}, 0), {v.pdims[d] - 1})"
            gathered = f"tl.gather({src}, {index}, {d})"
            pieces.append((start, start + v.dims[d], gathered))
            start += v.dims[d]
        expr = pieces[-1][2]
        for lo, hi, g in reversed(pieces[:-1]):
            expr = f"tl.where({idx} < {hi}, {g}, {expr})"
            del lo
        self.bind(o.id, expr)

    # -- safe softmax ----------------------------------------------------------------------
    def emit_safe_exp(self, o: TileOp, x: _Val) -> None:
        gi = self.group_of_exp[o.id]
        r = x.rank
        xs = self.fresh("x")
        exp = "tl.exp"
        if gi in self.log2_groups:
            # base-2 units: exp(x - m) = exp2(x·log2(e) - m·log2(e)), one rounded product
            # per score (v·(c·log2(e)) where x = v·c), so the max and the shift stay exact
            exp = "tl.exp2"
            folded = self._score_scale(o.args[0])
            v, c = (self.vals[folded[0]], folded[1]) if folded else (x, 1.0)
            if v.dims != x.dims or v.pdims != x.pdims:
                v, c = x, 1.0
            self.emit(f"{xs} = {self.f32(v)} * {_fmt_float(c * math.log2(math.e))}")
            xv = _Val(xs, x.dims, x.pdims, "float32", v.clean)
        else:
            self.emit(f"{xs} = {self.f32(x)}")
            xv = _Val(xs, x.dims, x.pdims, "float32", x.clean)
        xm = self.masked(xv, [r - 1], fill=_fmt_float(-math.inf), force=True)
        valid = self.loop_valid(o)
        if valid is not None and valid[0] == r - 1:
            # the padding past a masked loop's extent is -inf: out of the max (a max over its
            # zeros could sit far above every score and underflow each exp to 0 / 0); the
            # mask covers the padded lanes too
            xm = f"tl.where({valid[1]}, {xs}, {_fmt_float(-math.inf)})"
        rowmax = f"tl.max({xm}, axis={r - 1}, keep_dims=True)"
        if o.phase == "loop" and o.id not in self.invariant:
            self.emit(f"mn{gi} = tl.maximum(m{gi}, {rowmax})")
            self.emit(f"alpha{gi} = {exp}(m{gi} - mn{gi})")
            self.emit(f"m{gi} = mn{gi}")
        else:
            self.emit(f"m{gi} = {rowmax}")
        # x - m <= 0 exactly, but the compiler may recompute x for the exp apart from the
        # max (e.g. a score scale contracted into an FMA): with |x| ~ 1e8 that lands ulps of
        # 64 above 0, and the exp overflows. The clamp keeps the exact value.
        e = f"{exp}(tl.minimum({xs} - m{gi}, 0.0))"
        if valid is not None:  # exp of the padding is 0
            self.bind(o.id, f"tl.where({valid[1]}, {e}, 0.0)", clean={*xv.clean, valid[0]})
        else:
            self.bind(o.id, e)

    def rescaled(self, acc_id: int, acc: str) -> str:
        for gi in self.groups_of_acc.get(acc_id, []):
            if self._group_looping(gi):
                acc = f"{acc} * alpha{gi}"
        return acc

    # -- accumulators ----------------------------------------------------------------------
    def emit_accum_update(self, o: TileOp) -> None:
        name = f"acc{o.id}"
        kind = o.attr("acc")
        if o.id in self.fused:
            mm = self.by_id[self.fused[o.id]]
            self.emit(f"{name} = {self.dot_expr(mm, self.rescaled(o.id, name))}")
            return
        x = self.vals[o.args[0]]
        r = x.rank
        if o.id in self.gram:
            if x.dtype == "float32" or not {0, 1} <= x.clean:
                raise CodegenError(f"kernel {self.k.name!r}: op {o.id} cannot be a Gram sum")
            xs, kw = x.name, ""
            if x.dtype == "bfloat16" and self.opts.bf16_dot_as_fp32:  # (the interpreter)
                xs = f"{x.name}.to(tl.float32)"
                kw = f", input_precision={self.opts.fp32_dot_precision!r}"
            self.emit(f"{name} = tl.dot({xs}, tl.trans({xs}), {name}{kw})")
            return
        if kind == "iter":
            upd = self.f32(x)
        elif kind == "sum":
            upd = f"tl.sum({self.masked(x, [r - 1])}, axis={r - 1}, keep_dims=True)"
        elif kind == "rms":
            xs = self.fresh("x")
            self.emit(f"{xs} = {self.f32(x)}")
            sq = self.masked(_Val(f"({xs} * {xs})", x.dims, x.pdims, "float32", x.clean), [r - 1])
            upd = f"tl.sum({sq}, axis={r - 1}, keep_dims=True)"
        else:
            upd = self.to_dimx(x, r - 1, o.attr("dimx"), self.pdims[o.id][-1])
        self.emit(f"{name} = {self.rescaled(o.id, name)} + {upd}")

    def finish_accum(self, o: TileOp) -> None:
        name = f"acc{o.id}"
        src = self.vals.get(o.args[0]) if o.id not in self.fused else None
        clean: list[int] = []
        if src is not None:
            clean = [d for d in src.clean if d < len(o.dims) - 1 or o.attr("acc") == "iter"]
        if o.attr("acc") == "rms":
            eps = _fmt_float(o.attr("eps"))
            self.bind(o.id, f"tl.sqrt({name} / {o.attr('extent')} + {eps})")
        else:
            self.vals[o.id] = _Val(name, o.dims, self.pdims[o.id], "float32", frozenset(clean))

    # -- kernel ----------------------------------------------------------------------------
    def stages(self) -> int:
        if self.opts.num_stages is not None:
            return self._forced_stages(self.opts.num_stages)
        streams = any(a.uses_iter() for a in self.k.inputs)
        if self.k.forloop_range <= 1 or not streams:
            return 1
        st = self.opts.max_stages
        if self.opts.smem_limit:
            per_stage, reserve = self.pipelined_bytes()
            room = self.opts.smem_limit - reserve
            st = max(1, min(st, room // max(1, per_stage)))
        if st > DEFAULT_STAGES:
            # deeper than the default only where the loop runs at least twice that many
            # iterations: on an H200 (Triton 3.6) a LoRA kernel looping 5 + 1 masked times
            # computed wrong values or faulted (illegal address) at 4 and 5 stages, and one
            # looping 2 + 1 times at 4 to 6; both were right at 3, and loops of 6 and 16
            # iterations at every depth up to 6 (a short loop gains nothing from the depth)
            st = max(DEFAULT_STAGES, min(st, self.k.forloop_range // 2))
        return st

    def _forced_stages(self, st: int) -> int:
        """A depth the options force (``num_stages``), lowered where Triton's buffers for it
        cannot fit ``smem_limit``: Triton keeps ``st - 1`` stage buffers (a GQA part kernel
        streaming 136 KB per stage asked 344 KB at three stages). The runtime would lower
        such a depth at the first launch, one recompilation at a time (1.1-1.5 s each on
        the H200 host, inside the numeric check); here it costs nothing."""
        if not self.opts.smem_limit or st <= 1:
            return st
        if self.k.forloop_range <= 1 or not any(a.uses_iter() for a in self.k.inputs):
            return st
        per_stage, reserve = self.pipelined_bytes()
        while st > 1 and (st - 1) * per_stage + reserve > self.opts.smem_limit:
            st -= 1
        return st

    def pipelined_bytes(self) -> tuple[int, int]:
        """(bytes of one pipeline stage, bytes kept beside the stages) in shared memory.

        Triton's software pipeline keeps one buffer per stage for every tile the loop
        streams, at its padded block shape and its buffer's element size (a second read of a
        dual-use tile is a buffer of its own); beside them the epilogue converts the largest
        stored tile's layout through shared memory. The plan's ``smem_bytes`` counts logical
        tiles once and accumulators (registers in Triton), so it cannot size the stages: a
        ragged gated MLP (K tiles of 125 padded to 128) needed 266 KB after pipelining where
        the plan counted a third of the 227 KB budget per stage."""
        loop_ops, _, _ = self._partition()
        dual = self._dual_use_loads(loop_ops)
        per_stage = 0
        for o in loop_ops:
            if o.op != "input" or o.id in self.invariant:
                continue
            acc = self.k.inputs[o.attr("input")]
            if not acc.uses_iter():
                continue
            size = self.plan.buffer(acc.buffer).elem_bytes
            per_stage += math.prod(self.pdims[o.id]) * size * (2 if o.id in dual else 1)
        reserve = 0
        for out in self.k.outputs:
            if out.src is not None and out.src in self.pdims:
                size = self.plan.buffer(out.buffer).elem_bytes
                reserve = max(reserve, math.prod(self.pdims[out.src]) * size)
        return per_stage, reserve

    def split_stages(self, n_split: int) -> int:
        """Pipeline depth of the part kernel of a loop split ``n_split`` ways: never deeper
        than its share of the loop (deeper buffers only cost shared memory), and by default
        shallow enough for two blocks per SM, since a split kernel hides latency with many
        resident blocks rather than a deep pipeline — but double-buffered where two stages
        fit one block (GQA decode with 64 KB K+V tiles split 16 ways ran 12.8 µs with two
        stages, 13.3 µs with one, on the H100); the deep printing (``max_stages`` above the
        default) keeps the deepest pipeline that fits instead."""
        st = min(self.stages(), max(1, self.k.forloop_range // n_split))
        if (
            self.opts.num_stages is None
            and self.opts.max_stages <= DEFAULT_STAGES
            and self.opts.smem_limit
            and self.k.smem_bytes
        ):
            two_blocks = self.opts.smem_limit // (2 * self.k.smem_bytes)
            double = 2 if 2 * self.k.smem_bytes <= self.opts.smem_limit else 1
            st = min(st, max(two_blocks, double))
        return st

    def _partition(self) -> tuple[list[TileOp], list[TileOp], list[TileOp]]:
        """(loop ops, hoisted ops the loop needs, hoisted ops only the epilogue reads)."""
        k = self.k
        loop_ops = [
            o
            for o in k.ops
            if o.id not in self.invariant and o.phase != "pre" and o.phase in ("loop", "accum")
        ]
        hoisted = [
            o
            for o in k.ops
            if (o.id in self.invariant or o.phase == "pre") and o.id not in self.fused_mm
        ]
        # loop-invariant values the loop needs are computed before it; those only the
        # epilogue reads are computed after it (shorter live ranges, fewer registers)
        needed: set[int] = set()
        for o in reversed(k.ops):
            if o in loop_ops or o.id in needed:
                needed.update(o.args)
        before = [o for o in hoisted if o.id in needed]
        after = [o for o in hoisted if o.id not in needed]
        return loop_ops, before, after

    def _group_looping(self, gi: int) -> bool:
        """Whether running-max group ``gi`` (safe-softmax, or the shift carry) moves its max
        in the loop: its exp runs there, or its shifted tiles walk it."""
        if gi == self.carry_gi:
            return bool(self.carry_loads) and self.carry_loads[0].id not in self.invariant
        e = self.by_id[self.k.safe_softmax[gi].exp]
        return e.phase == "loop" and e.id not in self.invariant

    def _loop_groups(self) -> list[int]:
        """Running-max groups that keep their max through the loop."""
        return [gi for gi in range(self.carry_gi + 1) if self._group_looping(gi)]

    def _row_max_dims(self, gi: int) -> tuple[int, ...]:
        """Logical shape of group ``gi``'s row max."""
        if gi == self.carry_gi:
            return (*self.carry_loads[0].dims[:-1], 1)
        e = self.by_id[self.k.safe_softmax[gi].exp]
        return (*self.by_id[e.args[0]].dims[:-1], 1)

    def _row_max_shape(self, gi: int) -> tuple[int, ...]:
        """Padded block shape of group ``gi``'s row max."""
        if gi == self.carry_gi:
            return (*self.pdims[self.carry_loads[0].id][:-1], 1)
        e = self.by_id[self.k.safe_softmax[gi].exp]
        return (*self.pdims[e.args[0]][:-1], 1)

    def _head(self, name: str, extra: str = "") -> list[str]:
        params = ", ".join(f"buf{b}" for b in self.params)
        head = ["@triton.jit", f"def {name}({params}{extra}, NUM_STAGES: tl.constexpr):"]
        if self.opts.pdl:
            head += [
                "    tl.extra.cuda.gdc_wait()  # the grids before have finished and flushed",
                "    tl.extra.cuda.gdc_launch_dependents()  # the next grid may launch",
            ]
        return head

    def _dual_use_loads(self, loop_ops: list[TileOp]) -> set[int]:
        """Streamed loads that feed a ``tl.dot`` and also a non-dot op in the loop.

        Triton pipelines a dot operand through shared memory only while the dot is its one
        user; a second, elementwise user of the same tile (RMSNorm's sum of squares of X
        beside X @ W) left the H100 loop unpipelined: 48 µs against 21 µs with the
        elementwise user reading its own copy of the tile (benchmarks/probes/tile_sweep.py)."""
        in_loop = {o.id for o in loop_ops}
        absorbed_by = {div: m for m, (div, _, _) in self.scaled.items()}
        out: set[int] = set()
        for o in loop_ops:
            if o.op != "input" or o.id in self.invariant or o in self.carry_loads:
                continue  # (a shifted tile's value is its scaled load, not a second read)
            # a quotient printed by its matmul (emit_scaled_dot) counts as that matmul
            users = [
                self.by_id[absorbed_by.get(c.id, c.id)]
                for c in self.k.consumers(o.id)
                if c.id in in_loop
            ]
            dots = [c.op == "matmul" or c.id in self.gram for c in users]
            if any(dots) and not all(dots):
                out.add(o.id)
        return out

    def emit_second_load(self, o: TileOp, it: str) -> _Val:
        """A second read of the tile of load ``o`` (see :meth:`_dual_use_loads`). Its mask
        carries an always-true term, so the compiler keeps the two loads apart."""
        acc = self.k.inputs[o.attr("input")]
        pd = self.pdims[o.id]
        ptr, mask = self._access(acc, pd, it)
        r = len(pd)
        apart = _expand(f"tl.arange(0, {pd[-1]}) < {pd[-1]}", r - 1, r)
        mask = f"{mask} & {apart}" if mask else apart
        name = f"t{o.id}e"
        self.emit(f"{name} = tl.load({ptr}, mask={mask}, other=0.0)")
        dtype = self.plan.buffer(acc.buffer).dtype
        return _Val(name, o.dims, pd, dtype, frozenset(range(len(o.dims))))

    def _emit_loop(
        self, loop_ops: list[TileOp], lo: str, n: int, stages: int, hi: str | None = None
    ) -> None:
        """The for-loop over iterations ``lo .. lo + n`` (or ``lo .. hi``, a count known only
        at run time: ``n`` is then 0) with accumulator updates included, software-pipelined
        ``stages`` deep."""
        if not loop_ops:
            return
        if n == 1 and hi is None:
            self.emit(f"it = {lo}")
        else:
            end = hi if hi is not None else f"{lo} + {n}"
            self.emit(f"for it in tl.range({lo}, {end}, num_stages=NUM_STAGES):")
            self.indent += 1
        # a second read only helps the software pipeline; without one it is just more loads
        # (qknorm_gqa split 16 ways, one stage: 12.7 against 14.1 µs on the H100)
        dual = self._dual_use_loads(loop_ops) if (n != 1 or hi) and stages > 1 else set()
        second: dict[int, _Val] = {}
        for o in loop_ops:
            dot = o.op == "matmul" or o.id in self.gram
            swapped = {a: self.vals[a] for a in o.args if a in second} if not dot else {}
            for a in swapped:
                self.vals[a] = second[a]
            if o.op == "accum":
                self.emit_accum_update(o)
            else:
                self.emit_compute(o, "it")
            self.vals.update(swapped)
            if o.id in dual:
                second[o.id] = self.emit_second_load(o, "it")
        if n != 1 or hi is not None:
            self.indent -= 1

    def _emit_init_accums(self) -> None:
        for gi in self._loop_groups():
            m_shape = self._row_max_shape(gi)
            self.emit(f"m{gi} = tl.full({_shape(m_shape)}, float('-inf'), tl.float32)")
        for o in self.k.ops:
            if o.op == "accum":
                pd = self.pdims[o.id]
                shape = (pd[0], pd[0]) if o.id in self.gram else pd
                self.emit(f"acc{o.id} = tl.zeros({_shape(shape)}, tl.float32)")

    def _emit_finish(self, after: list[TileOp]) -> None:
        """After the loop: epilogue-only hoisted ops, accumulator finish, epilogue, stores."""
        for o in after:
            self.emit_compute(o, "0")
        for o in self.k.ops:
            if o.op == "accum":
                self.finish_accum(o)
            elif o.phase == "epilogue":
                self.emit_compute(o, "0")
        for i, out in enumerate(self.k.outputs):
            self.emit_store(i, out)
        for gi, g in enumerate(self.k.safe_softmax):
            if g.shift_store is not None:
                ptr, mask = self._access(g.shift_store, self._row_max_shape(gi), "0")
                self.emit(f"tl.store({ptr}, m{gi}{f', mask={mask}' if mask else ''})")

    def print(self) -> list[str]:
        k = self.k
        head = self._head(k.name)
        self.emit(
            f"# grid {list(k.grid)}, forloop {k.forloop_range}, {k.warps} warps, "
            f"plan smem {k.smem_bytes} B"
        )
        for line in grouped_order_lines(k.grid) or [
            "bx = tl.program_id(0)",
            "by = tl.program_id(1)",
            "bz = tl.program_id(2)",
        ]:
            self.emit(line)
        loop_ops, before, after = self._partition()
        for o in before:
            self.emit_compute(o, "0")
        self._emit_init_accums()
        if self._loop_masked() and k.forloop_range > 1:
            # a masked loop: the iterations before the last read whole tiles, unmasked; the
            # last one masks its loads and its exps' padding
            self.whole_iters = True
            self._emit_loop(loop_ops, "0", k.forloop_range - 1, self.stages())
            self.whole_iters = False
            self._emit_loop(loop_ops, str(k.forloop_range - 1), 1, self.stages())
        else:
            self._emit_loop(loop_ops, "0", k.forloop_range, self.stages())
        self._emit_gram_diagonals()
        self._emit_finish(after)
        return head + self.lines

    def _loop_masked(self) -> bool:
        """Whether the loop is masked: an input masks a dim the loop walks."""
        return any(
            any(t.var == "iter" and t.stride for t in a.offsets[m.dim])
            for a in self.k.inputs
            for m in a.masked
        )

    # -- split loop (split-K / flash-decoding) -----------------------------------------------
    def records(self) -> list[tuple[str, tuple[int, ...]]]:
        """Per-split partial state a part kernel leaves in the workspace: every accumulator
        (raw, before its finish) and the running max of every looping safe-softmax group."""
        recs = [(f"acc{o.id}", self.pdims[o.id]) for o in self.k.ops if o.op == "accum"]
        recs += [(f"m{gi}", self._row_max_shape(gi)) for gi in self._loop_groups()]
        return recs

    def record_size(self) -> int:
        return sum(math.prod(p) for _, p in self.records())

    def _flat(self, pdims: Sequence[int]) -> str:
        r = len(pdims)
        terms = []
        stride = 1
        for d in reversed(range(r)):
            if pdims[d] > 1:
                ar = f"tl.arange(0, {pdims[d]})"
                terms.append(_expand(f"{ar} * {stride}" if stride != 1 else ar, d, r))
            stride *= pdims[d]
        if not terms:
            return f"tl.zeros({_shape(pdims)}, tl.int32)"
        return " + ".join(reversed(terms))

    def _emit_block_id(self) -> None:
        gx, gy, _ = self.k.grid
        self.emit(f"blk = (bz * {gy} + by) * {gx} + bx")

    def _record_mask(self, name: str) -> str | None:
        """Mask of a record's real lanes: padded lanes (rows padded to 16 for ``tl.dot``)
        are neither stored nor loaded, which cuts a record of GQA decode's 4 query rows
        padded to 16 to a quarter. Loaded as zeros, they stay harmless: the printer never
        relies on padded lanes of an accumulator it has not masked itself."""
        if name.startswith("acc"):
            o = self.by_id[int(name[3:])]
            dims, pdims = o.dims, self.pdims[o.id]
        else:
            dims = self._row_max_dims(int(name[1:]))
            pdims = self._row_max_shape(int(name[1:]))
        r = len(pdims)
        conds = [
            _expand(f"tl.arange(0, {p}) < {n}", d, r)
            for d, (n, p) in enumerate(zip(dims, pdims, strict=True))
            if p != n
        ]
        return " & ".join(conds) or None

    def _record_at(self, name: str, off: int, base: str = "rec") -> tuple[str, str]:
        """(pointer, mask keyword) of record ``name`` at ``off`` past ``base``."""
        pd = dict(self.records())[name]
        mask = self._record_mask(name)
        return f"{base} + {off} + {self._flat(pd)}", f", mask={mask}" if mask else ""

    def _emit_combine(self, split: int, rec: int, after: list[TileOp], cache: str) -> list[str]:
        """Sum the ``split`` partial states at ``rec`` (rescaling safe-softmax accumulators
        to the common row max), then the epilogue and the stores. One part's records are
        read by small ``@triton.jit`` helpers, returned here, that the unrolled loops call:
        Triton's frontend then generates them once instead of once per part (about 1 s less
        for the thread-pooled compile of GQA decode's candidates on the H100 host)."""
        offs: dict[str, int] = {}
        off = 0
        for name, pd in self.records():
            offs[name] = off
            off += math.prod(pd)

        def load(name: str) -> str:
            ptr, mask = self._record_at(name, offs[name], "r")
            other = ", other=0.0" if mask else ""
            return f"tl.load({ptr}{mask}{other}{cache})"

        helpers: list[str] = []
        groups = self._loop_groups()
        ms = ", ".join(f"m{gi}" for gi in groups)
        if groups:
            helpers += [
                "@triton.jit",
                f"def {self.k.name}_rec_max(r):",
                f"    return {', '.join(load(f'm{gi}') for gi in groups)}",
                "",
            ]
            self.emit(f"{ms} = {self.k.name}_rec_max(rec)")
            self.emit(f"for s in tl.static_range(1, {split}):")
            ns = ", ".join(f"n{gi}" for gi in groups)
            self.emit(f"    {ns} = {self.k.name}_rec_max(rec + s * {rec})")
            for gi in groups:
                self.emit(f"    m{gi} = tl.maximum(m{gi}, n{gi})")
        accs = [o for o in self.k.ops if o.op == "accum"]
        names = ", ".join(f"acc{o.id}" for o in accs)
        body = [
            f"    sc{gi} = {'tl.exp2' if gi in self.log2_groups else 'tl.exp'}"
            f"({load(f'm{gi}')} - m{gi})"
            for gi in groups
        ]
        for o in accs:
            part_val = load(f"acc{o.id}")
            for gi in self.groups_of_acc.get(o.id, []):
                if gi in groups:
                    part_val = f"{part_val} * sc{gi}"
            body.append(f"    acc{o.id} = acc{o.id} + {part_val}")
        helpers += [
            "@triton.jit",
            f"def {self.k.name}_rec_add(r, {ms + ', ' if ms else ''}{names}):",
            *body,
            f"    return {names}",
            "",
        ]
        for o in accs:
            self.emit(f"acc{o.id} = tl.zeros({_shape(self.pdims[o.id])}, tl.float32)")
        self.emit(f"for s in tl.static_range(0, {split}):")
        args = f"rec + s * {rec}, {ms + ', ' if ms else ''}{names}"
        self.emit(f"    {names} = {self.k.name}_rec_add({args})")
        self._emit_finish(after)
        return helpers

    def print_split(self, split: int, last_block: bool = True) -> list[str]:
        """``<name>`` runs 1/split of the loop per block (grid x times split) and stores its
        partial state. With ``last_block`` the last part of each block to finish (an
        arrival counter per block, zeroed again by that part) sums the partial states and
        runs the epilogue in the same kernel; otherwise a second kernel ``<name>_combine``
        does. A combine kernel cost about 4 µs of GQA decode's 13.4 on the H100 (its 16
        blocks wait for the whole part kernel, then read the records with 16 SMs)."""
        k = self.k
        f = k.forloop_range
        if split < 2 or split > f:
            raise CodegenError(
                f"kernel {k.name!r}: split {split} must be between 2 and forloop {f}"
            )
        rec = self.record_size()
        loop_ops, before, after = self._partition()
        # part kernel
        head = self._head(k.name, ", ws, cnt" if last_block else ", ws")
        share = f"{f // split}" if f % split == 0 else f"{f // split}-{-(-f // split)}"
        self.emit(
            f"# grid {list(k.grid)} x split {split}, forloop {share} of {f}, "
            f"{k.warps} warps, plan smem {k.smem_bytes} B"
        )
        self.emit("pid = tl.program_id(0)")
        self.emit(f"bx = pid // {split}")
        self.emit(f"sp = pid % {split}")
        self.emit("by = tl.program_id(1)")
        self.emit("bz = tl.program_id(2)")
        for o in before:
            self.emit_compute(o, "0")
        self._emit_init_accums()
        if f % split == 0:
            self._emit_loop(loop_ops, f"sp * {f // split}", f // split, self.split_stages(split))
        else:
            # balanced shares: part sp walks iterations sp·F/S .. (sp+1)·F/S (floors), one
            # or two counts that differ by one, none empty (S ≤ F)
            self._emit_loop(
                loop_ops,
                f"sp * {f} // {split}",
                0,
                self.split_stages(split),
                hi=f"(sp + 1) * {f} // {split}",
            )
        self._emit_gram_diagonals()
        self._emit_block_id()
        self.emit(f"rec = ws + (blk * {split} + sp) * {rec}")
        off = 0
        for name, pd in self.records():
            ptr, mask = self._record_at(name, off)
            self.emit(f"tl.store({ptr}, {name}{mask})")
            off += math.prod(pd)
        if last_block:
            # every warp's record stores come before the arrival (release); the last part
            # to arrive reads the others' records after it (acquire), bypassing L1
            self.emit("tl.debug_barrier()")
            self.emit('arrived = tl.atomic_add(cnt + blk, 1, sem="acq_rel", scope="gpu")')
            self.emit(f"if arrived == {split - 1}:")
            self.indent += 1
            self.emit("tl.store(cnt + blk, 0)  # zero again for the next launch")
            self.emit(f"rec = ws + blk * {split * rec}")
            helpers = self._emit_combine(split, rec, after, ', cache_modifier=".cg"')
            self.indent -= 1
            return [*helpers, "", *head, *self.lines]
        part = head + self.lines
        # combine kernel: a fresh printer state for the second kernel
        self.lines, self.vals, self.indent = [], {}, 1
        self.carry_emitted = False
        head = self._head(f"{k.name}_combine", ", ws")
        self.emit(f"# combine {split} partial states of {k.name}, then its epilogue")
        self.emit("bx = tl.program_id(0)")
        self.emit("by = tl.program_id(1)")
        self.emit("bz = tl.program_id(2)")
        for o in before:
            self.emit_compute(o, "0")
        self._emit_block_id()
        self.emit(f"rec = ws + blk * {split * rec}")
        helpers = self._emit_combine(split, rec, after, "")
        return [*helpers, "", *part, "", *head, *self.lines]


def _arrivals_helper(n: int) -> list[str]:
    """Module-level arrival counters of last-block-combine split kernels."""
    return [
        "_ARRIVALS = {}",
        "",
        "",
        "def _arrivals(dev):",
        '    """Zeroed arrival counters of the split kernels, one set per device and stream',
        '    (each kernel\'s last parts zero them again, so launches in one stream reuse them)."""',
        "    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == 'cuda' else 0",
        "    key = (str(dev), stream)",
        "    cnt = _ARRIVALS.get(key)",
        "    if cnt is None:",
        f"        cnt = _ARRIVALS[key] = torch.zeros(({n},), dtype=torch.int32, device=dev)",
        "    return cnt",
        "",
    ]


_HELPERS = {
    "pow": [
        "@triton.jit",
        "def _yr_pow(x, y):",
        "    # real power: |x|**y, sign for integral y, nan for negative x with non-integral y",
        "    r = tl.exp2(y * tl.log2(tl.abs(x)))",
        "    integral = tl.floor(y) == y",
        "    odd = integral & (tl.floor(y * 0.5) * 2.0 != y)",
        "    r = tl.where(x < 0.0, tl.where(integral, tl.where(odd, -r, r), float('nan')), r)",
        "    return tl.where(y == 0.0, 1.0, r)",
    ]
}


def _exact_shift(k: GeneratedKernel, opts: TritonOptions) -> bool:
    """Whether ``k`` is compiled without multiply-add contraction (see
    ``TritonOptions.exact_softmax_shift``)."""
    return opts.exact_softmax_shift and (bool(k.safe_softmax) or k.shift_carry is not None)


def generate_triton(plan: object, options: TritonOptions | None = None) -> TritonSource:
    """Print ``plan`` (any form :func:`parse_plan` accepts) as a Triton module."""
    p = parse_plan(plan)
    opts = options or TritonOptions()
    out: list[str] = [
        f"# Generated by yirage-triton ({CODEGEN_VERSION}) from KernelPlan "
        f"{p.graph_hash or '<unhashed>'}.",
        "# Do not edit: regenerated from the plan. Semantics: docs/kernel-plan.md.",
        "import torch",
        "import triton",
        "import triton.language as tl",
        "",
        f"PLAN_HASH = {p.graph_hash!r}",
        f"INPUTS = {[(tuple(b.dims), b.dtype) for b in p.inputs]!r}",
        f"OUTPUTS = {[(tuple(b.dims), b.dtype) for b in p.outputs]!r}",
    ]
    kernel_blocks: list[list[str]] = []
    kinfo: dict[str, dict[str, object]] = {}
    helpers: set[str] = set()
    printers: dict[str, _KernelPrinter] = {}
    splits = dict(opts.split_loop)
    fine = dict(opts.subtile)
    rows = misaligned_inputs(p) if opts.align_rows else {}
    padded = padded_view(p, rows)
    for k in p.generated:
        if fine.get(k.name, 1) > 1:
            cut = subtile_kernel(k, fine[k.name])
            if cut is None:
                raise CodegenError(
                    f"kernel {k.name!r}: its loop chunks cannot be cut {fine[k.name]} ways "
                    "(something other than a sum over the loop reads them)"
                )
            k = cut
        view, k = fold_unit_batch(padded, k)
        pr = _KernelPrinter(view, k, opts)
        n_split = splits.get(k.name, 1)
        info = {
            "grid": list(k.grid),
            "num_warps": k.warps,
            "num_stages": pr.stages(),
            "pdl": opts.pdl,
        }
        if opts.launch_options:
            info["options"] = dict(opts.launch_options)
        if _exact_shift(k, opts):
            info["options"] = {**dict(opts.launch_options), "enable_fp_fusion": False}
        if n_split > 1:
            kernel_blocks.append(pr.print_split(n_split, opts.last_block_combine))
            gx, gy, gz = k.grid
            kinfo[k.name] = {
                **info,
                "grid": [gx * n_split, gy, gz],
                "split": n_split,
                "num_stages": pr.split_stages(n_split),
            }
            if not opts.last_block_combine:
                kinfo[f"{k.name}_combine"] = {**info, "num_stages": 1}
        else:
            kernel_blocks.append(pr.print())
            kinfo[k.name] = info
        helpers |= pr.helpers
        printers[k.name] = pr
    out.append(f"KERNELS = {kinfo!r}")
    out.append("")
    for h in sorted(helpers):
        out += ["", *_HELPERS[h], ""]
    counted = [k for k in p.generated if splits.get(k.name, 1) > 1 and opts.last_block_combine]
    if counted:
        n_cnt = max(k.blocks for k in counted)
        out += ["", *_arrivals_helper(n_cnt)]
    for block in kernel_blocks:
        out += ["", *block, ""]

    def launch_line(k: GeneratedKernel, names: dict[int, str], warm: bool = False) -> list[str]:
        """One kernel's launch, or with ``warm`` its compilation only (``JITFunction.warmup``:
        under ``triton.AsyncCompileMode`` it returns at once and compiles in the pool)."""

        def call(name: str, grid: tuple[int, ...], args: str, kw: str) -> str:
            if warm:
                return f"{name}.warmup({args}, {kw}, grid={grid})"
            return f"{name}[{grid}]({args}, {kw})"

        args = ", ".join(
            f"{names[b]}_al" if b in rows else names[b] for b in printers[k.name].params
        )
        extra = ", launch_pdl=True" if opts.pdl else ""
        extra += "".join(f", {name}={value!r}" for name, value in opts.launch_options)
        if _exact_shift(k, opts):
            extra += ", enable_fp_fusion=False"
        n_split = splits.get(k.name, 1)
        if n_split == 1:
            return [
                f"st = KERNELS[{k.name!r}]['num_stages']  # lowered if smem runs out",
                call(
                    k.name,
                    tuple(k.grid),
                    args,
                    f"NUM_STAGES=st, num_warps={k.warps}, num_stages=st{extra}",
                ),
            ]
        gx, gy, gz = k.grid
        size = gx * gy * gz * n_split * printers[k.name].record_size()
        ws = [f"ws = torch.empty(({size},), dtype=torch.float32, device=dev)  # partial states"]
        st = f"st = KERNELS[{k.name!r}]['num_stages']  # lowered by the runtime if smem runs out"
        if opts.last_block_combine:
            return [
                *ws,
                "cnt = _arrivals(dev)",
                st,
                call(
                    k.name,
                    (gx * n_split, gy, gz),
                    f"{args}, ws, cnt",
                    f"NUM_STAGES=st, num_warps={k.warps}, num_stages=st{extra}",
                ),
            ]
        return [
            *ws,
            st,
            call(
                k.name,
                (gx * n_split, gy, gz),
                f"{args}, ws",
                f"NUM_STAGES=st, num_warps={k.warps}, num_stages=st{extra}",
            ),
            call(
                f"{k.name}_combine",
                tuple(k.grid),
                f"{args}, ws",
                f"NUM_STAGES=1, num_warps={k.warps}, num_stages=1{extra}",
            ),
        ]

    def warm_line(k: GeneratedKernel, names: dict[int, str]) -> list[str]:
        return launch_line(k, names, warm=True)

    def staged(copy: bool) -> list[str]:
        """The row-padded copies of misaligned inputs (``align_rows``)."""
        lines = []
        for bid, row in rows.items():
            b = p.buffer(bid)
            name = f"buf{bid}"
            shape = (*b.dims[:-1], row)
            lines.append(
                f"{name}_al = torch.empty({shape}, dtype={name}.dtype, device=dev)"
                f"[..., :{b.dims[-1]}]  # rows padded to 16 bytes"
            )
            if copy:
                lines.append(f"{name}_al.copy_({name})")
        return lines

    out += [
        "",
        *launcher_lines(
            p,
            launch_line,
            eager_library=opts.eager_library,
            fused_attention=opts.fused_attention,
            prologue=staged(True),
        ),
        "",
    ]
    warm = launcher_lines(
        p, warm_line, warmup=True, fused_attention=opts.fused_attention, prologue=staged(False)
    )
    out += ["", *warm, ""]
    return TritonSource("\n".join(out), p, opts, tuple(printers))
