"""Untrusted text made safe to show: operator, kernel, file and process names come from traces and
programs stepcli does not control. A name holding ESC sequences would clear or rewrite the terminal
of whoever reads the table, BEL would ring, bidi overrides would reorder what is shown. Every output
meant for people (terminal, CSV, Markdown, HTML) shows them as escapes instead, through `visible`;
JSON keeps the names exact (its encoding escapes control characters by itself).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar, cast

T = TypeVar("T")

# C0 controls (tab and newline too: they break table rows), DEL, C1 controls, and the bidi
# embeddings, overrides and isolates that reorder text on screen.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control character shown as `\\xNN` (`\\uNNNN` for bidi controls); unchanged
    otherwise."""
    return _CONTROL.sub(_escape, text)


def html_escape(text: str) -> str:
    """`text` for HTML: special characters escaped, control characters shown as `visible` shows
    them."""
    # (only the page escapes: html's entity table costs `stepcli table` ~4 ms to import)
    import html

    return html.escape(visible(text))


def visible_all(value: T) -> T:
    """`value` with `visible` applied to every string inside it: dict keys and values, lists,
    tuples, dataclass fields and msgspec Struct fields, at any depth; everything else is returned as
    it is."""
    return cast(T, _visible_all(value))  # the same shape back: each string replaced by a string


_PLAIN = (float, int, bool, type(None))  # no string inside: returned as they are


def _visible_all(value: Any) -> Any:
    if isinstance(value, str):
        return visible(value) if _CONTROL.search(value) else value
    if isinstance(value, dict):
        return {_visible_all(k): _visible_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and all(type(item) in _PLAIN for item in value):
        # (a step's numbers, 100,000 of them per operator in `compare`: no call per number)
        return value
    if isinstance(value, list):
        return [_visible_all(item) for item in value]
    if isinstance(value, tuple):
        items = [_visible_all(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    # a msgspec Struct (the typed run summary)
    fields = getattr(type(value), "__struct_fields__", None)
    if fields is not None and not isinstance(value, type):
        import msgspec  # (loaded already: a Struct is here)

        return msgspec.structs.replace(
            value, **{name: _visible_all(getattr(value, name)) for name in fields}
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _visible_all(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    return value
