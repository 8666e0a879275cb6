"""Host side of a printed plan, shared by the Triton and CUDA C++ printers.

``launcher_lines`` prints ``def launch(inputs)``: it binds the inputs, allocates outputs and
intermediates with ``torch.empty`` on the inputs' device (the caching allocator, so CUDA-graph
capture works), runs library kernels through torch (matmul → cuBLAS via ``torch.matmul``) and
generated kernels through the printer-specific launch line, in plan order, on the current
stream, with no host synchronisation.

Library ops compute in fp32 and cast to the destination buffer's dtype (operands that already
have the destination dtype go to torch as they are: its 16-bit kernels compute in fp32 and
round once, so the result is the same without the fp32 copies), except matmul, which
multiplies in the 16-bit dtype of its operands when one is 16-bit (tensor cores, fp32
accumulation inside cuBLAS) and in fp32 otherwise. Two refinements: a library RMSNorm is
one Triton kernel on GPUs (:func:`~yirage_triton.rms_norm_rows`), and a float32
intermediate that only 16-bit matmuls read is stored in their dtype
(:func:`narrowed_intermediates`).

A plan of library kernels alone (the search's baseline: the graph as it was written) is also
printed *eagerly* (``eager_library``): every op on its operands in the graph's dtype,
intermediates in that dtype, the same torch calls in the same order as PyTorch eager runs
the graph. The backend races it as a variant of its own beside the float32-intermediate
printing: it is as fast as eager, but like eager a 16-bit intermediate can overflow where the
graph has a finite value (silu of -inf is NaN), so the checks drop it where the float32
printing passes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from yirage.plan import CodegenError, GeneratedKernel, LibraryKernel, Plan

__all__ = [
    "TORCH_DTYPE",
    "fmt_float",
    "is_library_plan",
    "launcher_lines",
    "library_lines",
    "narrowed_intermediates",
]

TORCH_DTYPE = {"float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32"}


def fmt_float(x: float) -> str:
    """A Python/C literal of ``x`` that round-trips (inf/nan spelled for Python)."""
    if math.isinf(x):
        return "float('inf')" if x > 0 else "float('-inf')"
    if math.isnan(x):
        return "float('nan')"
    return repr(float(x))


def _unary_torch(name: str, x: str, prm: list[float]) -> str:
    table = {
        "exp": f"torch.exp({x})",
        "square": f"torch.square({x})",
        "sqrt": f"torch.sqrt({x})",
        "rsqrt": f"torch.rsqrt({x})",
        "silu": f"torch.nn.functional.silu({x})",
        "gelu": f"torch.nn.functional.gelu({x})",
        "relu": f"torch.relu({x})",
        "sigmoid": f"torch.sigmoid({x})",
        "tanh": f"torch.tanh({x})",
        "neg": f"torch.neg({x})",
    }
    if name == "mul_scalar":
        return f"({x} * {fmt_float(prm[0])})"
    if name == "add_scalar":
        return f"({x} + {fmt_float(prm[0])})"
    if name == "clamp":
        return f"torch.clamp({x}, {fmt_float(prm[0])}, {fmt_float(prm[1])})"
    return table[name]


def library_lines(
    plan: Plan, k: LibraryKernel, names: dict[int, str], *, eager: bool = False
) -> list[str]:
    """Python lines computing library kernel ``k`` into its output buffer's name; ``eager``:
    as PyTorch eager would, in the operands' dtype (see the module doc)."""
    out_buf = plan.buffer(k.outputs[0])
    store = out_buf.dtype if eager else narrowed_intermediates(plan).get(out_buf.id, out_buf.dtype)
    ins = [names[b] for b in k.inputs]
    p = k.params
    lines = [f"# library {k.op} {list(k.inputs)} -> {list(k.outputs)}"]
    if eager and k.op == "matmul":
        expr = f"torch.matmul({ins[0]}, {ins[1]})"
    elif k.op == "matmul":
        in_dtypes = {plan.buffer(b).dtype for b in k.inputs}
        low = [d for d in ("float16", "bfloat16") if d in in_dtypes]
        cd = TORCH_DTYPE[low[0]] if low else "torch.float32"
        expr = f"torch.matmul({ins[0]}.to({cd}), {ins[1]}.to({cd}))"
        if len(low) == 1 and len(in_dtypes) == 1 and out_buf.dtype == "float32":
            # 16-bit operands into a float32 intermediate: float32 straight from cuBLAS
            lines.append("from yirage_triton import matmul_fp32 as _yr_matmul_fp32")
            expr = f"_yr_matmul_fp32({ins[0]}, {ins[1]})"
    else:
        # torch computes 16-bit elementwise ops, sums, softmax and rms_norm in fp32 and
        # rounds once, so operands already in the destination dtype need no fp32 copies
        native = eager or all(plan.buffer(b).dtype == out_buf.dtype for b in k.inputs)
        f = list(ins) if native else [f"{x}.float()" for x in ins]
        if k.op == "unary":
            x = f[0]
            if "shift_dims" in p:  # exp(x - m), m the max over the dims (0 where not finite)
                dims = tuple(int(d) for d in p["shift_dims"])
                m = f"torch.amax({x}, dim={dims}, keepdim=True)"
                x = f"({x} - torch.nan_to_num({m}, nan=0.0, posinf=0.0, neginf=0.0))"
            expr = _unary_torch(str(p["op"]), x, [float(v) for v in p.get("params", [])])
        elif k.op == "binary":
            op = {
                "add": "torch.add",
                "sub": "torch.sub",
                "mul": "torch.mul",
                "div": "torch.div",
                "pow": "torch.pow",
            }
            expr = f"{op[p['op']]}({f[0]}, {f[1]})"
        elif k.op == "reduction":
            expr = f"torch.sum({f[0]}, dim={int(p['dim'])}, keepdim=True)"
        elif k.op == "rms_norm" and not eager:
            # one Triton kernel on GPUs, in the stored dtype (see _rownorm)
            n = int(p.get("num_normalized_dims", 1))
            w = ins[1] if p.get("has_weight") else "None"
            eps = fmt_float(float(p.get("eps", 1e-6)))
            lines.append("from yirage_triton import rms_norm_rows as _yr_rms_norm_rows")
            expr = f"_yr_rms_norm_rows({ins[0]}, {n}, {w}, {eps}, {TORCH_DTYPE[store]})"
        elif k.op == "rms_norm":
            n = int(p.get("num_normalized_dims", 1))
            w = f[1] if p.get("has_weight") else "None"
            if p.get("has_weight") and len(plan.buffer(k.inputs[1]).dims) > n:
                w = f"{w}.reshape({f[0]}.shape[-{n}:])"  # torch wants exactly normalized_shape
            eps = fmt_float(float(p.get("eps", 1e-6)))
            expr = f"torch.nn.functional.rms_norm({f[0]}, {f[0]}.shape[-{n}:], {w}, {eps})"
        elif k.op == "softmax":
            expr = f"torch.softmax({f[0]}, dim={int(p['dim'])})"
        elif k.op == "concat":
            expr = f"torch.cat([{', '.join(f)}], dim={int(p['dim'])})"
        elif k.op == "chunk":
            expr = (
                f"torch.chunk({f[0]}, {int(p['chunks'])}, dim={int(p['dim'])})[{int(p['index'])}]"
            )
        elif k.op == "reduce_max":
            expr = f"torch.amax({f[0]}, dim={int(p['dim'])}, keepdim=True)"
        elif k.op == "permute":
            expr = f"{f[0]}.permute({tuple(int(d) for d in p['perm'])})"
        elif k.op == "reshape":
            expr = f"{f[0]}.reshape({tuple(int(d) for d in p['dims'])})"
        elif k.op == "all_reduce":
            # the sum over the ranks through the calling thread's collective
            # (yirage.plugin.all_reduce: torch.distributed by default), in place on an
            # intermediate no other kernel reads, else on a copy (never on an input)
            lines.append("from yirage.plugin import all_reduce as _yr_all_reduce")
            operand = f[0] if _summed_in_place(plan, k) else f"{f[0]}.clone()"
            expr = f"_yr_all_reduce({operand}, {int(p.get('world_size', 1))})"
        else:  # pragma: no cover - validated by the parser
            raise CodegenError(f"library op {k.op!r} has no torch lowering")
    name = names[out_buf.id]
    if eager and out_buf.role != "output":
        lines.append(f"{name} = {expr}")
    else:
        lines.append(
            f"{name} = ({expr}).to({TORCH_DTYPE[store]})"
            f".reshape({tuple(out_buf.dims)}).contiguous()"
        )
    return lines


def buffer_readers(plan: Plan) -> dict[int, list[int]]:
    """Buffer id -> indices of the kernels that read it (a generated kernel's tile loads and
    the running maxima of its shifted loads)."""
    out: dict[int, list[int]] = {}
    for i, k in enumerate(plan.kernels):
        if isinstance(k, LibraryKernel):
            reads = set(k.inputs)
        else:
            reads = {a.buffer for a in k.inputs}
            reads |= {a.shift_load.access.buffer for a in k.inputs if a.shift_load is not None}
        for b in reads:
            out.setdefault(b, []).append(i)
    return out


def library_writers(plan: Plan) -> dict[int, int]:
    """Buffer id -> index of the library kernel that writes it."""
    return {
        o: i for i, k in enumerate(plan.kernels) if isinstance(k, LibraryKernel) for o in k.outputs
    }


def narrowed_intermediates(plan: Plan) -> dict[int, str]:
    """Float32 intermediates stored in a 16-bit dtype instead, by buffer id: those a library
    kernel writes and only library matmuls read, each multiplying in that dtype (its other
    operand is a graph buffer of it). Such a matmul rounds the float32 values to the 16-bit
    dtype first (see the module doc), so storing them rounded gives the same product without
    the float32 buffer and the conversion kernel."""
    writers, readers = library_writers(plan), buffer_readers(plan)
    out: dict[int, str] = {}
    for buf in plan.intermediates:
        if buf.dtype != "float32" or buf.id not in writers or buf.id not in readers:
            continue
        if plan.kernels[writers[buf.id]].op not in _ALLOCATING_OPS:
            continue  # a view of another buffer keeps that buffer's dtype
        low = set()
        for i in readers[buf.id]:
            reader = plan.kernels[i]
            if not isinstance(reader, LibraryKernel) or reader.op != "matmul":
                break
            others = [plan.buffer(x) for x in reader.inputs if x != buf.id]
            if len(others) != 1 or others[0].role == "intermediate":
                break
            if others[0].dtype not in ("float16", "bfloat16"):
                break
            low.add(others[0].dtype)
        else:
            if len(low) == 1:
                out[buf.id] = low.pop()
    return out


#: Library ops whose torch lowering returns a new tensor (never a view of an operand).
_ALLOCATING_OPS = frozenset(
    ("matmul", "unary", "binary", "reduction", "rms_norm", "softmax", "concat", "reduce_max")
)


def _summed_in_place(plan: Plan, k: LibraryKernel) -> bool:
    """Whether all_reduce kernel ``k`` may sum its operand in place: an intermediate of the
    operand's dtype (no conversion copy) that no other kernel reads, written by an op that
    allocates it (a view such as reshape, permute or chunk may share an input's memory)."""
    src = plan.buffer(k.inputs[0])
    if src.role != "intermediate" or src.dtype != plan.buffer(k.outputs[0]).dtype:
        return False
    writer = library_writers(plan).get(src.id)
    if writer is not None and plan.kernels[writer].op not in _ALLOCATING_OPS:
        return False
    return all(plan.kernels[i] is k for i in buffer_readers(plan).get(src.id, []))


def is_library_plan(plan: Plan) -> bool:
    """Whether ``plan`` is library kernels alone on inputs of one dtype (the search's
    baseline), which can also run eagerly."""
    return all(isinstance(k, LibraryKernel) for k in plan.kernels) and (
        len({b.dtype for b in plan.inputs}) == 1
    )


def launcher_lines(
    plan: Plan,
    launch_line: Callable[[GeneratedKernel, dict[int, str]], list[str]],
    *,
    warmup: bool = False,
    eager_library: bool = False,
    fused_attention: bool = False,
    prologue: Sequence[str] = (),
) -> list[str]:
    """``def launch(inputs)`` for ``plan``; ``launch_line`` prints one generated kernel's launch.
    With ``warmup``: ``def warmup(inputs)``, which allocates the library kernels' outputs
    instead of running them (``launch_line`` then prints compile-only calls). With
    ``eager_library`` a plan of library kernels alone whose inputs share one dtype runs
    eagerly (see the module doc). With ``fused_attention`` every attention chain of library
    kernels runs as one SDPA call (see :mod:`yirage_triton._sdpa`). ``prologue``: lines run
    once the inputs are bound."""
    from ._sdpa import attention_chains, sdpa_lines

    names = {b.id: f"buf{b.id}" for b in plan.buffers}
    doc = (
        "Compile the generated kernels for ``inputs``; runs nothing."
        if warmup
        else "Run the plan on ``inputs`` (checked by the runtime); returns the outputs."
    )
    body = [f'"""{doc}"""']
    ins = [names[b.id] for b in plan.inputs]
    if ins:
        body.append(f"{', '.join(ins)}{',' if len(ins) == 1 else ''} = inputs")
        body.append(f"dev = {ins[0]}.device")
    else:
        body.append("dev = torch.device('cuda', torch.cuda.current_device())")
    body += prologue
    allocated = {b.id for b in plan.inputs}
    eager = eager_library and is_library_plan(plan)
    chains = attention_chains(plan) if fused_attention else []
    chain_at = {c.kernels[-1]: c for c in chains}
    in_chain = {i for c in chains for i in c.kernels}
    for i, k in enumerate(plan.kernels):
        if i in chain_at:
            c = chain_at[i]
            if warmup:
                b = plan.buffer(c.out)
                body.append(
                    f"{names[b.id]} = torch.empty({tuple(b.dims)}, "
                    f"dtype={TORCH_DTYPE[b.dtype]}, device=dev)"
                )
            else:
                body += sdpa_lines(plan, c, names)
            allocated.add(c.out)
            continue
        if i in in_chain:
            continue  # a link of an attention chain, computed with its last kernel
        if isinstance(k, LibraryKernel):
            if warmup:
                for o in k.outputs:
                    if o not in allocated:
                        b = plan.buffer(o)
                        body.append(
                            f"{names[b.id]} = torch.empty({tuple(b.dims)}, "
                            f"dtype={TORCH_DTYPE[b.dtype]}, device=dev)"
                        )
            else:
                body += library_lines(plan, k, names, eager=eager)
            allocated.update(k.outputs)
            continue
        stores = [g.shift_store for g in k.safe_softmax if g.shift_store is not None]
        for acc in (*k.outputs, *stores):  # outputs and the running maxima of shifted ones
            if acc.buffer not in allocated:
                b = plan.buffer(acc.buffer)
                body.append(
                    f"{names[b.id]} = torch.empty({tuple(b.dims)}, "
                    f"dtype={TORCH_DTYPE[b.dtype]}, device=dev)"
                )
                allocated.add(acc.buffer)
        body += launch_line(k, names)
    if not warmup:
        body.append(f"return [{', '.join(names[b.id] for b in plan.outputs)}]")
    return [f"def {'warmup' if warmup else 'launch'}(inputs):", *("    " + line for line in body)]
