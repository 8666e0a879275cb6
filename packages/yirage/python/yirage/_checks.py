"""Type checks on Python arguments before they reach the native core.

The core validates every value (rank, sizes, ranges, divisibility, eps …) and names the fix
in its message. These helpers only make sure a value *can* be handed over: a wrong type or
an int outside int64 would otherwise surface as a TypeError/OverflowError from the binding
instead of a YirageError.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from yirage._errors import YirageError

_I64 = 2**63


def check_int(value: object, what: str, exc: type[YirageError]) -> int:
    """``value`` as an int within int64 (bools and non-integral numbers are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise exc(f"{what} must be an int, got {value!r}")
    v = int(value)
    if not -_I64 <= v < _I64:
        raise exc(f"{what}={v} is out of range")
    return v


def check_positive(value: object, what: str, exc: type[YirageError], limit: int = 2**32) -> int:
    """``value`` as an int in ``1..limit-1`` (for counts handed to unsigned parameters)."""
    v = check_int(value, what, exc)
    if not 1 <= v < limit:
        raise exc(f"{what} must be a positive integer below {limit}, got {v}")
    return v


def check_float(value: object, what: str, exc: type[YirageError]) -> float:
    """``value`` as a float (the core decides which values are allowed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise exc(f"{what} must be a real number, got {value!r}")
    return float(value)


def check_ints(value: object, what: str, exc: type[YirageError]) -> list[int]:
    """A sequence of ints (a single int is a 1-sequence)."""
    if isinstance(value, numbers.Integral):  # a bool is rejected by check_int below
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise exc(f"{what} must be a tuple of ints, got {value!r}")
    return [check_int(v, f"{what} entry", exc) for v in value]


def check_triple(value: object, what: str, exc: type[YirageError]) -> tuple[int, int, int]:
    """A 3-tuple of ints (x, y, z)."""
    ints = check_ints(value, what, exc)
    if len(ints) != 3:
        raise exc(f"{what} must be a tuple of 3 ints (x, y, z), got {value!r}")
    return (ints[0], ints[1], ints[2])
