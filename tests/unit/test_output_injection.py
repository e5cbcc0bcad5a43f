"""Text from programs and files is shown, never obeyed (issue 30, items 8-10): a frame path, a
heartbeat or a culprit's evidence holding ESC/OSC/BEL sequences, bidi overrides, rich markup or HTML
reaches the terminal, the page and the Markdown as visible escapes or entities."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from stepcli.fmt import say
from stepcli.report import lateness
from stepcli.run.live import hangdoctor as hang
from stepcli.run.live.liveview import render
from stepcli.run.summary.console import _print_hang
from stepcli.run.summary.hangreport import hang_summary
from stepcli.runfolder.layout import STACKS_SCHEMA
from stepcli.runfolder.summaryfile import RunSummary
from stepcli.traces.render.formats import csv_report, markdown_report

HOSTILE = "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\x1b[2J\u202eyp.niart"
RAW = ("\x1b", "\x07", "\u202e")


def _clean(text: str) -> None:
    assert not any(raw in text for raw in RAW), repr(text)


def _dump(tmp_path: Path) -> Path:
    folder = tmp_path / "hang-1"
    folder.mkdir()
    frames = [{"function": "step" + HOSTILE, "file": "/app/" + HOSTILE + ".py", "line": 3}]
    document = {
        "schema": STACKS_SCHEMA,
        "worker": "rank0",
        "rank": 0,
        "pid": 7,
        "host": "h",
        "time": 10.0,
        "step": 4,
        "last_step_s_ago": 30.0,
        "collective": None,
        "collectives_hooked": False,
        "threads": [{"name": "MainThread", "main": True, "frames": frames}],
    }
    (folder / "rank0.h.7.json").write_text(json.dumps(document))
    return folder


def test_stepcli_lines_show_control_characters_as_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say(f"saved {HOSTILE}")
    hang._say(f"hang: {HOSTILE}")  # the live hang block's lines
    err = capsys.readouterr().err
    _clean(err)
    assert "\\x1b]8;;http://evil.example\\x07" in err and "\\u202e" in err and err.count("\n") == 2


def test_the_hang_block_of_the_summary_shows_frame_paths_as_escapes(tmp_path: Path) -> None:
    section = hang_summary([str(_dump(tmp_path))], 0.0, timeout_s=10.0, on_hang="keep")
    assert section is not None
    out = io.StringIO()
    _print_hang(RunSummary(hang=section), Console(file=out, width=200))
    _clean(out.getvalue())
    assert "\\x1b" in out.getvalue()


def test_top_shows_heartbeat_text_as_text(tmp_path: Path) -> None:
    row: dict[str, Any] = {
        "worker": "[bold red]rank0" + HOSTILE,
        "step": 3,
        "steps_per_s": 1.0,
        "last_ms": 2.0,
        "median_ms": 2.0,
        "ended": "[blink]bye" + HOSTILE,
        "no_step_for_s": None,
        "recording": False,
        "pending": 0,
        "slowest": False,
    }
    out = io.StringIO()
    Console(file=out, width=300, force_terminal=True).print(
        render({"run_id": "r1", "running": True, "ranks": [row]})
    )
    text = out.getvalue()
    assert "[bold red]rank0" in text and "[blink]bye" in text  # not read as markup
    assert "\u202e" not in text and "\x07" not in text and "\x1b]8;;http" not in text


def _culprit(evidence: str) -> dict[str, Any]:
    found = {"rank": 1, "cause": "gc", "evidence": evidence}
    return {
        "collectives": 4,
        "per_step": [{"step": 1, "lateness_ms": {"0": 0.0, "1": 5.0}}],
        "alignment": {"error_ms": 0.1, "one_clock": True},
        "culprit": found,
        "ranks": [],
    }


def test_the_pages_culprit_card_shows_control_characters_as_escapes() -> None:
    html = lateness.section(_culprit("rank 1 <b>late</b> " + HOSTILE))
    assert 'id="culprit-finding"' in html
    _clean(html)
    assert "<b>late</b>" not in html


def test_table_markdown_shows_html_from_traces_as_text() -> None:
    data = {
        "culprit": _culprit('<img src=x onerror="alert(1)"> ' + HOSTILE),
        "ranks": [{"rank": 0, "file": "a<b>.json"}],
        "files": ["a.json"],
        "events": 1,
        "steps": [],
        "cpu_ops": [],
        "device_kernels": [],
    }
    markdown = markdown_report(data)
    assert "Culprit: " in markdown and "a&lt;b&gt;.json" in markdown
    _clean(markdown)
    assert "<img" not in markdown and "&lt;img" in markdown


def _op(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "calls": 1,
        "self_ms": 1.0,
        "total_ms": 1.0,
        "avg_ms": 1.0,
        "self_share": 0.5,
    }


def test_operator_names_are_never_links_images_or_formulas() -> None:
    linky = "a`b ![img](http://evil.example/x.png) [click](http://evil.example)"
    formula = '=HYPERLINK("http://evil.example","x")'
    data = {
        "files": ["a.json"],
        "ranks": [],
        "events": 2,
        "steps": [],
        "cpu_ops": [_op(linky), _op(formula)],
    }
    data["device_kernels"] = []
    # Markdown: a name with a backtick is still one code span (a longer fence), so nothing in it
    # renders
    markdown = markdown_report(data)
    assert f"| `` {linky} `` |" in markdown
    # CSV: a name a spreadsheet would run as a formula starts with an apostrophe; others are as
    # written
    rows = list(csv.DictReader(io.StringIO(csv_report(data))))
    assert sorted(r["name"] for r in rows) == sorted([linky, "'" + formula])
