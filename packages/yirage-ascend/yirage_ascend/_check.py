"""The static checker: a printing of a KernelPlan for Triton-Ascend held to the target's limits
(:class:`~yirage_ascend._rules.AscendRules`) before it is compiled or run, so a kernel BiSheng
would refuse (UB overflow, a dot the cube unit cannot take, too many programs) is rejected
here, by the printer's own block shapes, with the rule named.

The UB model is simple and errs high: a tile value is live from the op that computes it to
its last reader (no buffer is shared between two live values, none is freed early), tiles
computed by the printer are fp32, loaded tiles keep their dtype, a tile row takes whole
32-byte blocks, and tiles loaded inside the for-loop count once per buffer of the
multibuffer. Values the loop keeps (hoisted ``pre`` tiles, accumulators, running maxima) are
live throughout; the footprint is those plus the peak of the loop or of the epilogue.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from yirage.plan import CodegenError, GeneratedKernel, Plan, TileOp
from yirage_ascend._rules import ATLAS_A2, AscendRules
from yirage_triton import TritonSource, padded_dims, subtile_kernel

__all__ = ["AscendLimitError", "Finding", "KernelFootprint", "check_printing", "footprints"]

_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
#: every ``input_precision`` a printed ``tl.dot`` asks for
_PRECISION = re.compile(r"input_precision=['\"](\w+)['\"]")

#: The rules the checker applies, by the name a Finding carries.
RULES = (
    "dtype",
    "grid",
    "ub-bytes",
    "dot-shape",
    "dot-dtype",
    "dot-precision",
    "cube-l1-bytes",
    "cube-l0c-bytes",
)


class AscendLimitError(CodegenError):
    """A printing breaks a limit of the Ascend target; ``findings`` name each rule."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        super().__init__("; ".join(str(f) for f in findings))


@dataclass(frozen=True)
class Finding:
    """One broken rule: which, in which kernel, the value against the limit, and the fix."""

    rule: str
    kernel: str
    detail: str
    fix: str

    def __str__(self) -> str:
        return (
            f"Ascend rule '{self.rule}' broken by kernel {self.kernel}: {self.detail} ({self.fix})"
        )


@dataclass(frozen=True)
class KernelFootprint:
    """UB bytes of one generated kernel by the checker's model, and its program count."""

    kernel: str
    ub_bytes: int
    programs: int


def _tile_bytes(pdims: tuple[int, ...], elem: int, rules: AscendRules) -> int:
    rows = math.prod(pdims[:-1]) if len(pdims) > 1 else 1
    return rows * rules.padded_row_bytes(pdims[-1] if pdims else 1, elem)


def _op_dtypes(plan: Plan, k: GeneratedKernel) -> dict[int, str]:
    """Element type of each op's tile: loads keep their buffer's dtype, the rest is fp32."""
    by_buffer = {b.id: b.dtype for b in plan.buffers}
    out = {}
    for o in k.ops:
        if o.op == "input":
            out[o.id] = by_buffer[k.inputs[o.attr("input")].buffer]
        else:
            out[o.id] = "float32"
    return out


def _kernels(source: TritonSource) -> Iterable[GeneratedKernel]:
    """The generated kernels as printed (loop chunks cut where the options say so)."""
    fine = dict(source.options.subtile)
    for k in source.plan.generated:
        cut = subtile_kernel(k, fine[k.name]) if k.name in fine else None
        yield cut if cut is not None else k


def _peak(ops: list[TileOp], k: GeneratedKernel, size: dict[int, int]) -> int:
    """The most bytes live at once while ``ops`` (one phase, in plan order) run: a value is
    live from its op to its last reader in the kernel."""
    index = {o.id: i for i, o in enumerate(k.ops)}
    last = {o.id: index[o.id] for o in ops}
    for reader in k.ops:
        for arg in reader.args:
            if arg in last:
                last[arg] = max(last[arg], index[reader.id])
    peak = 0
    for o in ops:
        at = index[o.id]
        peak = max(peak, sum(size[v.id] for v in ops if index[v.id] <= at <= last[v.id]))
    return peak


def _ub_bytes(plan: Plan, k: GeneratedKernel, rules: AscendRules) -> int:
    pdims = padded_dims(k)
    dtypes = _op_dtypes(plan, k)
    fused = {o.id for o in k.ops if o.accumulate_into is not None}
    size = {
        o.id: _tile_bytes(pdims[o.id], _BYTES[dtypes[o.id]], rules)
        * (rules.multibuffer if o.op == "input" and o.phase == "loop" else 1)
        for o in k.ops
    }
    kept = sum(size[o.id] for o in k.ops if o.phase in ("pre", "accum"))
    for group in k.safe_softmax:  # the running max: one fp32 per row of the exp's argument
        kept += _tile_bytes((*pdims[group.exp][:-1], 1), 4, rules)
    loop = [o for o in k.ops if o.phase == "loop" and o.id not in fused]
    epilogue = [o for o in k.ops if o.phase == "epilogue"]
    return kept + max(_peak(loop, k, size), _peak(epilogue, k, size))


def _dot_findings(
    plan: Plan, k: GeneratedKernel, source: TritonSource, rules: AscendRules
) -> list[Finding]:
    pdims = padded_dims(k)
    dtypes = _op_dtypes(plan, k)
    sixteen = [d for d in dtypes.values() if d != "float32"]
    out: list[Finding] = []
    for o in k.ops:
        if o.op != "matmul":
            continue
        a, b = (k.op(i) for i in o.args)
        # computed operands are rounded to the graph's 16-bit type (fp32 graphs: fp32)
        ta = dtypes[a.id] if a.op == "input" else (sixteen[0] if sixteen else "float32")
        tb = dtypes[b.id] if b.op == "input" else (sixteen[0] if sixteen else "float32")
        m, kk = pdims[a.id][-2:]
        n = pdims[b.id][-1]
        where = f"matmul op {o.id} ({m}x{kk} @ {kk}x{n})"
        for t in (ta, tb):
            if t not in rules.dot_dtypes:
                out.append(
                    Finding(
                        "dot-dtype",
                        k.name,
                        f"{where} has {t} operands",
                        f"the cube unit takes {sorted(rules.dot_dtypes)}",
                    )
                )
        # a fractal is cube_fractal rows of (cube_align_bytes / cube_fractal) bytes
        k_step = rules.cube_align_bytes // rules.cube_fractal // _BYTES.get(ta, 4)
        if m % rules.cube_fractal or n % rules.cube_fractal or kk % k_step:
            out.append(
                Finding(
                    "dot-shape",
                    k.name,
                    f"{where}: M and N must be multiples of {rules.cube_fractal} and K of "
                    f"{k_step} ({ta} operands fill {rules.cube_align_bytes}-byte fractals)",
                    "pad the dot's block dims to the cube fractal",
                )
            )
        l1 = (m * kk * _BYTES.get(ta, 4)) + (kk * n * _BYTES.get(tb, 4))
        if l1 > rules.l1_bytes:
            out.append(
                Finding(
                    "cube-l1-bytes",
                    k.name,
                    f"{where} stages {l1} B of operands, L1 holds {rules.l1_bytes} B",
                    "choose smaller M, N or K tiles",
                )
            )
        l0c = m * n * 4
        if l0c > rules.l0c_bytes:
            out.append(
                Finding(
                    "cube-l0c-bytes",
                    k.name,
                    f"{where} accumulates {l0c} B in fp32, L0C holds {rules.l0c_bytes} B",
                    "choose smaller M or N tiles",
                )
            )
    return out


def footprints(source: TritonSource, rules: AscendRules = ATLAS_A2) -> list[KernelFootprint]:
    """The UB bytes and program count of every generated kernel of ``source``."""
    splits = dict(source.options.split_loop)
    return [
        KernelFootprint(k.name, _ub_bytes(source.plan, k, rules), k.blocks * splits.get(k.name, 1))
        for k in _kernels(source)
    ]


def check_printing(source: TritonSource, rules: AscendRules = ATLAS_A2) -> list[Finding]:
    """Every rule of ``rules`` that ``source`` breaks (empty: it fits the target)."""
    out = [
        Finding(
            "dtype",
            "(plan)",
            f"buffer {b.id} is {b.dtype}",
            f"Triton-Ascend kernels here take {sorted(rules.dtypes)}",
        )
        for b in source.plan.buffers
        if b.dtype not in rules.dtypes
    ]
    out.extend(
        Finding(
            "dot-precision",
            "(module)",
            f"a tl.dot asks input_precision={prec!r}",
            f"Triton-Ascend offers {list(rules.fp32_dot_precisions)}",
        )
        for prec in sorted(set(_PRECISION.findall(source.text)))
        if prec not in rules.fp32_dot_precisions
    )
    kernels = {k.name: k for k in _kernels(source)}
    for fp in footprints(source, rules):
        if fp.programs > rules.max_grid:
            out.append(
                Finding(
                    "grid",
                    fp.kernel,
                    f"{fp.programs} programs, a launch takes at most {rules.max_grid}",
                    "give each program more work",
                )
            )
        if fp.ub_bytes > rules.ub_bytes:
            out.append(
                Finding(
                    "ub-bytes",
                    fp.kernel,
                    f"tiles take {fp.ub_bytes} B of the Unified "
                    f"Buffer, which holds {rules.ub_bytes} B per core",
                    "choose smaller tiles (a search with this device's spec does)",
                )
            )
        out.extend(_dot_findings(source.plan, kernels[fp.kernel], source, rules))
    return out


def require_fits(source: TritonSource, rules: AscendRules = ATLAS_A2) -> None:
    """Raise :class:`AscendLimitError` naming every broken rule; return when it fits."""
    findings = check_printing(source, rules)
    if findings:
        raise AscendLimitError(findings)
