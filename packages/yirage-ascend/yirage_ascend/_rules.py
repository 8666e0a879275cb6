"""Triton-Ascend's programming-model rules as data (docs/backends.md, "The Ascend backend",
says which rule comes from where).

An Ascend AI Core is not a SIMT processor: each program of the grid runs on one physical core
(a cube core for kernels with ``tl.dot``, a vector core otherwise), there are no warps, and a
program's tiles live in on-chip buffers the compiler allocates: the Unified Buffer (UB) of a
vector core for elementwise work and reductions, L1 and L0A/L0B/L0C of the cube core for
matrix products. BiSheng refuses a kernel whose tiles overflow those buffers, so the printer's
block shapes must fit them; the static checker (``_check``) holds a printing to these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ATLAS_A2", "AscendRules"]


@dataclass(frozen=True)
class AscendRules:
    """The limits one Ascend generation puts on a Triton kernel.

    ``ub_bytes``: Unified Buffer per vector core. ``multibuffer``: how many copies of a tile
    loaded inside a loop the compiler keeps (Triton-Ascend double-buffers loop loads by
    default, so those count twice). ``ub_align_bytes``: the UB stores a tile's last axis in
    whole 32-byte blocks (a shorter axis is padded up to one). ``l1_bytes``, ``l0a_bytes``,
    ``l0b_bytes``, ``l0c_bytes``: the cube core's buffers for the operands and the fp32
    accumulator of a ``tl.dot``. ``cube_fractal``: the cube unit multiplies (16 x 32 bytes)
    operand fractals, so a dot's M and N are multiples of 16 and K a multiple of 32 bytes of
    the operand type. ``cube_align_bytes``: L0A/L0B take whole 512-byte fractals.
    ``max_grid``: programs one launch may have (the runtime's task limit). ``dtypes``: tensor
    element types the printer may use; ``dot_dtypes``: operand types the cube unit takes.
    ``fp32_dot_precisions``: ``tl.dot`` ``input_precision`` values on float32 operands."""

    name: str
    ub_bytes: int
    multibuffer: int
    ub_align_bytes: int
    l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    l0c_bytes: int
    cube_fractal: int
    cube_align_bytes: int
    max_grid: int
    dtypes: frozenset[str]
    dot_dtypes: frozenset[str]
    fp32_dot_precisions: tuple[str, ...]

    def padded_row_bytes(self, elems: int, elem_bytes: int) -> int:
        """Bytes a tile row of ``elems`` elements takes in the UB (whole 32-byte blocks)."""
        raw = elems * elem_bytes
        return -(-raw // self.ub_align_bytes) * self.ub_align_bytes


#: Atlas A2 (Ascend 910B) and Atlas A3 (910C, two 910B-class dies): the same AI Core.
ATLAS_A2 = AscendRules(
    name="Atlas A2/A3 (Ascend 910B, 910C)",
    ub_bytes=192 * 1024,
    multibuffer=2,
    ub_align_bytes=32,
    l1_bytes=512 * 1024,
    l0a_bytes=64 * 1024,
    l0b_bytes=64 * 1024,
    l0c_bytes=128 * 1024,
    cube_fractal=16,
    cube_align_bytes=512,
    max_grid=65535,
    dtypes=frozenset({"float16", "bfloat16", "float32"}),
    dot_dtypes=frozenset({"float16", "bfloat16", "float32"}),
    fp32_dot_precisions=("ieee", "hf32"),
)
