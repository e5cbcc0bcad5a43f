"""Coercing JSON values of unexpected types (the reader's slow, lenient path): a time that cannot be
placed becomes NaN or inf (so its event is skipped and counted), a name or id that is no string or
integer a bounded text."""

from __future__ import annotations

import math
from typing import Any, TypeGuard


def as_time(value: Any) -> float:
    """A number or numeric string as a float; anything else (missing, null, bool, list, other text)
    as NaN, and an integer too big for a float as inf: either way the event is skipped and counted,
    like 1e400."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


def is_int64(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else short_repr(value)


def short_repr(value: Any) -> str:
    """str() of a JSON value, bounded: a huge nested value must not become a huge name."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return "<integer past 64 bits>"  # str() of a 5000-digit int raises in Python >= 3.11
    text = (
        str(value)
        if isinstance(value, (int, float, bool)) or value is None
        else type(value).__name__
    )
    return text[:200]


def as_id(value: Any) -> int | str:
    if is_int64(value):
        return value
    return value if isinstance(value, str) else short_repr(value)
