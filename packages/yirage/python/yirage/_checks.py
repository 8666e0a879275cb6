"""Type checks on Python arguments before they reach the native core.

The core validates every value (rank, sizes, ranges, divisibility, eps …) and names the fix
in its message. These helpers only make sure a value *can* be handed over: a wrong type, an
int outside int64 or a number beyond float64 would otherwise surface as a
TypeError/OverflowError from the binding (or from ``float()``) instead of a YirageError.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from yirage._errors import YirageError

_I64 = 2**63
#: Ints with more bits than this are described, not printed: printing an int of more than
#: 4300 digits raises ValueError (Python's int-to-str limit), and long ones bury the message.
_PRINTABLE_BITS = 256


def describe_int(value: int) -> str:
    """``value`` for an error message: the digits, or its size when it is huge."""
    bits = value.bit_length()
    if bits <= _PRINTABLE_BITS:
        return str(value)
    digits = int(bits * 0.30103) + 1  # log10(2): an estimate, within one digit
    return f"{'-' if value < 0 else ''}<an int of about {digits} digits>"


def show(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message: huge ints described, long reprs shortened, and
    never an exception (a repr can raise, e.g. a Fraction of a huge int)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return describe_int(value)
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_int(value: object, what: str, exc: type[YirageError]) -> int:
    """``value`` as an int within int64 (bools and non-integral numbers are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise exc(f"{what} must be an int, got {show(value)}")
    v = int(value)
    if not -_I64 <= v < _I64:
        raise exc(f"{what}={describe_int(v)} is out of range: expected an int in -2**63..2**63-1")
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
        raise exc(f"{what} must be a real number, got {show(value)}")
    try:
        return float(value)
    except OverflowError:  # an int (or Fraction …) beyond float64's range, e.g. 10**400
        raise exc(
            f"{what}={show(value)} is too large for a float: expected a finite real number "
            "with magnitude below 1.8e308"
        ) from None
    except (TypeError, ValueError) as err:  # a numbers.Real whose __float__ is broken
        raise exc(f"{what} must be a real number, got {show(value)}: {err}") from None


def check_ints(value: object, what: str, exc: type[YirageError]) -> list[int]:
    """A sequence of ints (a single int is a 1-sequence)."""
    if isinstance(value, numbers.Integral):  # a bool is rejected by check_int below
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise exc(f"{what} must be a tuple of ints, got {show(value)}")
    return [check_int(v, f"{what} entry", exc) for v in value]


def check_triple(value: object, what: str, exc: type[YirageError]) -> tuple[int, int, int]:
    """A 3-tuple of ints (x, y, z)."""
    ints = check_ints(value, what, exc)
    if len(ints) != 3:
        raise exc(f"{what} must be a tuple of 3 ints (x, y, z), got {show(value)}")
    return (ints[0], ints[1], ints[2])
