"""Tensor element types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from yirage._errors import DTypeError

__all__ = ["DType", "bfloat16", "bfloat16_bits", "float16", "float32"]


@dataclass(frozen=True)
class DType:
    """An element type of yirage tensors.

    ``numpy_dtype`` is ``None`` for bfloat16: numpy has no bfloat16 type. The reference
    evaluator works in float64 regardless of the declared dtype, so this only matters for
    code that allocates device buffers.
    """

    name: str
    itemsize: int
    numpy_dtype: np.dtype[Any] | None

    def __repr__(self) -> str:
        return f"yirage.{self.name}"

    __str__ = __repr__


float16 = DType("float16", 2, np.dtype(np.float16))
bfloat16 = DType("bfloat16", 2, None)
float32 = DType("float32", 4, np.dtype(np.float32))

_BY_NAME: dict[str, DType] = {d.name: d for d in (float16, bfloat16, float32)}


def bfloat16_bits(x: Any) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even; NaN stays a quiet NaN) as their
    uint16 bit patterns: numpy has no bfloat16, so buffers hold the bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits: np.ndarray = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return bits


def _check_dtype(dtype: object) -> DType:
    """Return ``dtype`` if it is a yirage dtype, else raise DTypeError listing the valid ones."""
    if isinstance(dtype, DType) and _BY_NAME.get(dtype.name) == dtype:
        return dtype
    valid = ", ".join(f"yirage.{n}" for n in _BY_NAME)
    raise DTypeError(f"unsupported dtype {dtype!r}: expected one of {valid}")


def _from_name(name: str) -> DType:
    """The DType called ``name`` (as returned by the native core)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        valid = ", ".join(_BY_NAME)
        raise DTypeError(f"unknown dtype name {name!r}: expected one of {valid}") from None
