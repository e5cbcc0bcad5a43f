"""The wording of a problem in decoded JSON from an untrusted file: msgspec's `Expected `int`, got
`str` - at `$.processes[0].rank`` said as stepcli says it, `.processes[0].rank is not an integer`,
from the declared type (a `Meta(description=...)` names the kind of value; `Meta(extra={"missing":
...})` words a missing field).

A document's types are declared as msgspec Structs (stepcli.runfolder.summaryfile); this module
knows none of them.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Union

import msgspec
from msgspec import Meta, Struct, UnsetType


def at(where: str, problem: str) -> str:
    """`key` + `.sub is ...` -> `key.sub is ...`; `key` + `is ...` -> `key is ...`."""
    return f"{where}{problem}" if problem[:1] in ".[" else f"{where} {problem}"


def shown(key: str) -> str:
    """A key of a hostile document as it can be shown in a one-line message (printable, at most 40
    characters)."""
    return key if key.isprintable() and len(key) <= 40 else repr(key[:40])


def wording(error: msgspec.ValidationError, document: Any, kind: Any) -> str:
    """Why `document` is not a `kind`, as a path relative to it and a predicate: `.rank is not an
    integer`."""
    text, _, where = str(error).partition(" - at `$")
    path = _steps(where.rstrip("`"))
    value, declared, shown_path, pair_at = document, kind, "", None
    for step in path:
        # a key of a map: msgspec does not say which, so find the first wrong value
        if step == "[...]":
            inner = _item_type(declared, step)
            for key, item in (value or {}).items():
                try:
                    msgspec.convert(item, inner)
                except msgspec.ValidationError as deeper:
                    return at(f"{shown_path}.{shown(str(key))}", wording(deeper, item, inner))
            break
        # an item of a pair is named at the pair
        pair_at = shown_path if _is_tuple(declared) else None
        declared = _item_type(declared, step)
        value = _child(value, step)
        shown_path += step if step.startswith("[") else f".{step}"
    if text.startswith("Object missing required field `"):
        first = _first_wrong_field(_unwrapped(declared), value)
        if first is not None:
            return (
                at(f"{shown_path}.{first[0]}", first[1])
                if first[0]
                else at(_path_of(path[:-1]), first[1])
            )
        return f"{shown_path}.{text.split('`')[1]} is missing"
    if text.startswith(("Expected ", "Number out of range")):
        first = _first_wrong_field(
            _parent_struct(kind, path), _child_of(document, path[:-1]), named_only=True
        )
        # the first wrong field in declaration order, as a reader would check them
        if first is not None:
            return (
                at(_path_of(path[:-1]) + f".{first[0]}", first[1])
                if first[0]
                else at(_path_of(path[:-2]), first[1])
            )
        return at(pair_at or shown_path, _predicate(declared))
    return at(shown_path, text)  # a check of a Struct's own (none yet): its message as it is


def _path_of(path: list[str]) -> str:
    return "".join(step if step.startswith("[") else f".{step}" for step in path)


def _child_of(document: Any, path: list[str]) -> Any:
    for step in path:
        document = _child(document, step)
    return document


def _parent_struct(kind: Any, path: list[str]) -> Any:
    """The Struct holding the field at `path` (None when the last step is not a field of one)."""
    for step in path[:-1]:
        kind = _item_type(kind, step)
    parent = _unwrapped(kind)
    return parent if path and not path[-1].startswith("[") else None


def _first_wrong_field(
    kind: Any, value: Any, *, named_only: bool = False
) -> tuple[str, str] | None:
    """(field, problem) for the first field of Struct `kind` that `value` lacks or gets wrong, in
    declaration order; field "" when the problem is said of the list holding `value` (a row without
    a name). `named_only`: a missing field counts only where its type names the wording (a
    statistic, an operator's name)."""
    if not (isinstance(kind, type) and issubclass(kind, Struct)) or not isinstance(value, dict):
        return None
    for field in msgspec.structs.fields(kind):
        extra = _meta_extra(field.type)
        if field.encode_name not in value:
            if field.required and (extra.get("missing") or not named_only):
                missing = extra.get("missing", "is missing")
                return ("", missing) if missing.startswith("has ") else (field.encode_name, missing)
            continue
        try:
            msgspec.convert(value[field.encode_name], field.type)
        except msgspec.ValidationError:
            return field.encode_name, _predicate(field.type)
    return None


def _meta_extra(declared: Any) -> dict[str, Any]:
    while typing.get_origin(declared) is Annotated:
        for meta in typing.get_args(declared)[1:]:
            if isinstance(meta, Meta) and meta.extra:
                return dict(meta.extra)
        declared = typing.get_args(declared)[0]
    return {}


def _predicate(declared: Any) -> str:
    """`is not a string`; a description that starts with "is " is the whole predicate."""
    description = _description(declared)
    return description if description.startswith("is ") else f"is not {description}"


def _steps(where: str) -> list[str]:
    """`.processes[0].rank` -> `processes`, `[0]`, `rank`; a map's value is `[...]`."""
    return [name or index for name, index in re.findall(r"\.([^.\[]+)|(\[[^\]]*\])", where)]


def _child(value: Any, step: str) -> Any:
    if step.startswith("[") and isinstance(value, list):
        return value[int(step[1:-1])]
    return value.get(step) if isinstance(value, dict) else None


def _unwrapped(declared: Any) -> Any:
    """The type under Annotated and Optional/UNSET: the one a value in the file would have."""
    while typing.get_origin(declared) is Annotated:
        declared = typing.get_args(declared)[0]
    if typing.get_origin(declared) is Union or isinstance(declared, type(int | None)):
        kinds = [t for t in typing.get_args(declared) if t not in (type(None), UnsetType)]
        if len(kinds) == 1:
            return _unwrapped(kinds[0])
    return declared


def _is_tuple(declared: Any) -> bool:
    return typing.get_origin(_unwrapped(declared)) is tuple


def _item_type(declared: Any, step: str) -> Any:
    """The declared type one step (`.field`, `[3]`, `[...]`) inside `declared`."""
    kind = _unwrapped(declared)
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, Struct):
        return next((f.type for f in msgspec.structs.fields(kind) if f.encode_name == step), Any)
    if origin is list:
        return typing.get_args(kind)[0]
    if origin is dict:
        return typing.get_args(kind)[1]
    if origin is tuple:
        return typing.get_args(kind)[int(step[1:-1])]
    return Any


def _description(declared: Any) -> str:
    """How a value of `declared` is named in a message: its description, else its JSON kind."""
    while True:
        if typing.get_origin(declared) is Annotated:
            meta = [
                m for m in typing.get_args(declared)[1:] if isinstance(m, Meta) and m.description
            ]
            if meta:
                return str(meta[-1].description)
            declared = typing.get_args(declared)[0]
            continue
        if typing.get_origin(declared) is Union or isinstance(declared, type(int | None)):
            kinds = [t for t in typing.get_args(declared) if t not in (type(None), UnsetType)]
            if len(kinds) == 1:  # an optional value is named by what it is when present
                declared = kinds[0]
                continue
        break
    origin = typing.get_origin(declared)
    if origin in (list, tuple):
        return "a list"
    if origin is dict or (isinstance(declared, type) and issubclass(declared, (Struct, dict))):
        return "an object"
    return {str: "a string", int: "an integer", bool: "true or false"}.get(
        declared, "of the declared type"
    )
