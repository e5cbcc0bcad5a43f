"""Event names PyTorch writes with bare double quotes (pytorch/pytorch#146900): found, escaped,
nothing else touched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepcli.agent.tracenames import escape_names, repair_file
from stepcli.traces.read.tracereader import load_trace

DATA = Path(__file__).resolve().parent.parent / "data"
REAL = DATA / "train_cpu.pt.trace.json"
WEIRD = '{"device": "cpu"}/gen.py(1): weird'


def _kineto_text(names: list[str]) -> bytes:
    """A trace laid out as Kineto writes it: one field per line, each name written without
    escaping."""
    events = []
    for index, name in enumerate(names):
        events.append(
            "  {\n"
            '    "ph": "X", "cat": "python_function",\n'
            f'    "name": "{name}",\n'
            f'    "pid": 7, "tid": 7,\n    "ts": {index * 10}.5, "dur": 4.0\n'
            "  }"
        )
    meta = (
        '  {\n    "name": "process_name", "ph": "M", "pid": 7, "tid": 0,\n    "args": {\n      '
        '"name": "python"\n    }\n  }'
    )
    return (
        '{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + ",\n".join([*events, meta]) + "\n]}\n"
    ).encode()


@pytest.mark.parametrize(
    "name",
    [
        WEIRD,
        'say "hi"',
        '"',
        'a", "b',
        'ends with "',
        '"starts',
        'already \\"escaped\\" and "bare"',
    ],
)
def test_bare_quotes_in_names_are_escaped_and_read_back(name: str) -> None:
    broken = _kineto_text(["aten::mm", name, "plain"])
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    fixed = escape_names(broken)
    assert fixed is not None
    names = [e["name"] for e in json.loads(fixed)["traceEvents"]]
    expected = name.replace('\\"', '"')  # an escaped quote was already one quote
    assert names == ["aten::mm", expected, "plain", "process_name"]


def test_a_valid_trace_needs_nothing() -> None:
    assert escape_names(_kineto_text(["aten::mm", "no quotes (here)", "back\\\\slash"])) is None
    assert escape_names(REAL.read_bytes()) is None


def test_repair_file_fixes_in_place_and_leaves_a_clean_file_alone(tmp_path: Path) -> None:
    clean = tmp_path / "clean.pt.trace.json"
    clean.write_bytes(REAL.read_bytes())
    before = os.stat(clean)
    assert repair_file(str(clean)) == 0
    after = os.stat(clean)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert repair_file(str(empty)) == 0

    broken = tmp_path / "broken.pt.trace.json"
    broken.write_bytes(_kineto_text([WEIRD, "ok", WEIRD]))
    assert repair_file(str(broken)) == 2
    assert [e["name"] for e in json.loads(broken.read_bytes())["traceEvents"]][:3] == [
        WEIRD,
        "ok",
        WEIRD,
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.pt.trace.json",
        "clean.pt.trace.json",
        "empty.json",
    ]


def test_the_reader_forgives_bare_quotes_but_not_other_damage(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pt.trace.json"
    broken.write_bytes(_kineto_text(["aten::mm", WEIRD]))
    assert [e.name for e in load_trace(str(broken)).events] == ["aten::mm", WEIRD]
    # a trace given to read is never rewritten
    assert broken.read_bytes() == _kineto_text(["aten::mm", WEIRD])
    worse = tmp_path / "worse.pt.trace.json"
    worse.write_bytes(
        _kineto_text(["aten::mm", WEIRD]).replace(b'"dur": 4.0', b'"dur": 4.0 4.0', 1)
    )
    with pytest.raises(Exception, match="invalid JSON"):
        load_trace(str(worse))
