"""docs/reference/summary-json.md against the run summary's declaration
(stepcli.runfolder.summaryfile): every field it documents is declared and every declared field is
documented, and its "Types" section is the one generated from the declaration. `python
tests/unit/test_summary_doc.py` rewrites that section after a change to the Structs."""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import msgspec
from msgspec import Meta, Struct, UnsetType

from stepcli.runfolder import summaryfile as runsummary
from stepcli.runfolder.summaryfile import RunSummary

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "summary-json.md"
BEGIN = (
    "<!-- generated from stepcli.runfolder.summaryfile by tests/unit/test_summary_doc.py: do not "
    "edit -->"
)
END = "<!-- end of generated types -->"


def _structs() -> list[type[Struct]]:
    """RunSummary and every public Struct its fields reach, in the order they are first met."""
    found: list[type[Struct]] = []

    def visit(declared: Any) -> None:
        if isinstance(declared, type) and issubclass(declared, Struct):
            if declared not in found and not declared.__name__.startswith("_"):
                found.append(declared)
                for field in msgspec.structs.fields(declared):
                    visit(field.type)
            return
        for arg in typing.get_args(declared):
            visit(arg)

    visit(RunSummary)
    return found


def type_text(declared: Any) -> str:
    """A field's type as the page says it: the description of its kind, or its JSON shape."""
    description = None
    while typing.get_origin(declared) is Annotated:
        metas = [m for m in typing.get_args(declared)[1:] if isinstance(m, Meta) and m.description]
        description = description or (metas[-1].description if metas else None)
        declared = typing.get_args(declared)[0]
    origin = typing.get_origin(declared)
    if origin is Union or isinstance(declared, type(int | None)):
        args = typing.get_args(declared)
        kinds = [type_text(t) for t in args if t not in (type(None), UnsetType)]
        text = (
            " or ".join(kinds) if not description or description.startswith("is ") else description
        )
        return (
            text
            + (" or null" if type(None) in args else "")
            + (" (may be absent)" if UnsetType in args else "")
        )
    if description and not description.startswith("is "):
        return description
    if origin is list:
        return f"a list, each {type_text(typing.get_args(declared)[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_text(t) for t in typing.get_args(declared)) + "]"
    if origin is dict and typing.get_args(declared)[1] is Any:
        return "an object (its keys: the field table above)"
    if origin is dict:
        return f"an object, each value {type_text(typing.get_args(declared)[1])}"
    if isinstance(declared, type) and issubclass(declared, Struct):
        return f"`{declared.__name__}`"
    return {str: "a string", int: "an integer", bool: "true or false", Any: "any"}.get(
        declared, str(declared)
    )


def generated() -> str:
    """The "Types" section: one table per Struct, fields in the order `stepcli run` writes them."""
    lines = [BEGIN, ""]
    for struct in _structs():
        lines += [f"`{struct.__name__}`", "", "| field | type |", "|---|---|"]
        for field in msgspec.structs.fields(struct):
            lines.append(f"| `{field.encode_name}` | {type_text(field.type).replace('|', '/')} |")
        lines.append("")
    return "\n".join([*lines, END])


def _field_table() -> list[str]:
    """The hand-written part of the page (the generated types follow it)."""
    return DOC.read_text().partition(BEGIN)[0].splitlines()


def _documented_keys() -> set[str]:
    """The top-level keys the field table names (its first column: `a`, `b.c`, `d[]`)."""
    keys: set[str] = set()
    for line in _field_table():
        if line.startswith("| `"):
            first = line.split("|")[1]
            keys |= {re.split(r"[.\[]", key)[0] for key in re.findall(r"`([^`]+)`", first)}
    return keys


def test_every_field_is_documented_and_every_documented_field_declared() -> None:
    declared = {field.encode_name for field in msgspec.structs.fields(RunSummary)}
    documented = _documented_keys()
    assert declared - documented == set(), (
        "declared in stepcli.runfolder.summaryfile but not in the field table"
    )
    assert documented - declared == set(), (
        "in the field table but not declared in stepcli.runfolder.summaryfile"
    )


def test_every_field_of_a_section_is_named_in_its_row() -> None:
    """A section declared as a Struct (`processes[]`, `windows[]` ...) names each of its fields in
    its row."""
    rows = {
        key: line
        for line in _field_table()
        if line.startswith("| `")
        for key in re.findall(r"`([^`]+)`", line.split("|")[1])
    }
    for field in msgspec.structs.fields(RunSummary):
        inner = field.type
        while typing.get_args(inner) and not (
            isinstance(inner, type) and issubclass(inner, Struct)
        ):
            inner = next(
                (t for t in typing.get_args(inner) if t not in (type(None), UnsetType)), None
            )
        if not (isinstance(inner, type) and issubclass(inner, Struct)):
            continue
        text = " ".join(
            line for key, line in rows.items() if re.split(r"[.\[]", key)[0] == field.encode_name
        )
        for sub in msgspec.structs.fields(inner):
            names = (
                sub.encode_name,
                f"{sub.encode_name}[]",
                f"{field.encode_name}.{sub.encode_name}",
            )
            named = any(f"`{name}`" in text for name in names)
            assert named, f"{field.encode_name}: its field {sub.encode_name} is not documented"


def test_the_types_section_is_generated_from_the_declaration() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC.name} lacks its generated types section"
    current = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert current == generated(), (
        f"run `python {Path(__file__).relative_to(DOC.parents[2])}` to regenerate"
    )


def test_the_types_name_the_kinds_a_reader_can_count_on() -> None:
    # the page's words come from the same declaration as the loader's messages
    assert type_text(runsummary.Count) == "a non-negative integer"
    assert type_text(msgspec.structs.fields(RunSummary)[1].type) == "an integer or null"


if __name__ == "__main__":
    text = DOC.read_text()
    if BEGIN in text:
        text = text[: text.index(BEGIN)] + generated() + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n## Types\n\n" + generated() + "\n"
    DOC.write_text(text)
    sys.exit(0)
