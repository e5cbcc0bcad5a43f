"""Checks of decoded JSON from untrusted files: each returns why a value is wrong, in a few words that say where
(`processes[0].rank is not an integer`), or None; a document's checks are built from these (stepcli.runfolder.summaryfile).
Standard library only."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Check = Callable[[Any], "str | None"]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def simple(test: Callable[[Any], bool], what: str) -> Check:
    return lambda value: None if test(value) else f"is not {what}"


STR = simple(lambda v: isinstance(v, str), "a string")
INT = simple(is_int, "an integer")
COUNT = simple(lambda v: is_int(v) and v >= 0, "a non-negative integer")
NUMBER = simple(is_number, "a number")
AMOUNT = simple(lambda v: is_number(v) and v >= 0, "a non-negative number")
BOOL = simple(lambda v: isinstance(v, bool), "true or false")


def at(where: str, problem: str) -> str:
    """`key` + `.sub is ...` -> `key.sub is ...`; `key` + `is ...` -> `key is ...`."""
    return f"{where}{problem}" if problem[:1] in ".[" else f"{where} {problem}"


def optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def list_of(check: Check) -> Check:
    def checked(value: Any) -> str | None:
        if not isinstance(value, list):
            return "is not a list"
        for index, item in enumerate(value):
            problem = check(item)
            if problem:
                return at(f"[{index}]", problem)
        return None

    return checked


def map_of(check: Check) -> Check:
    def checked(value: Any) -> str | None:
        if not isinstance(value, dict):
            return "is not an object"
        for key, item in value.items():
            problem = check(item)
            if problem:
                return at(f".{shown(key)}", problem)
        return None

    return checked


def shown(key: str) -> str:
    """A key of a hostile document as it can be shown in a one-line message (printable, at most 40 characters)."""
    return key if key.isprintable() and len(key) <= 40 else repr(key[:40])


def object_of(fields: Mapping[str, Check], required: Sequence[str] = ()) -> Check:
    """An object whose listed fields, where present, pass their checks (other keys are kept as they are)."""

    def checked(value: Any) -> str | None:
        if not isinstance(value, dict):
            return "is not an object"
        for key in required:
            if key not in value:
                return f".{key} is missing"
        for key, check in fields.items():
            if key in value:
                problem = check(value[key])
                if problem:
                    return at(f".{key}", problem)
        return None

    return checked


def pair(first: Check, second: Check) -> Check:
    """A two-item list, such as a slow step's `[step, microseconds]`."""

    def checked(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) != 2:
            return "is not a pair"
        return first(value[0]) or second(value[1])

    return checked
