"""Names a program chooses (`record_function`) reach every output: they never drive the reader's
terminal (control characters are shown as escapes in tables, CSV, Markdown, compare, the run summary
and the HTML page) and never crash a command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_trace, run_stepcli, trace_files, write_script

ESC_NAME = "\x1b[2J\x1b[H"  # clear the screen, cursor home
BEL_NAME = "ring\x07bell"
BIDI_NAME = "evil\u202eop"
HUGE_REGION = "Torch-Compiled Region: 0/" + "1" * 4400  # over int()'s 4,300-digit limit

# torch's Kineto writes a name holding control characters as "unknown", but a long digit run it
# keeps as it is.
_SCRIPT = f"""
    import time
    import torch
    from torch.profiler import record_function

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        with record_function({HUGE_REGION!r}):
            time.sleep(0.003)
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
"""
# Any trace handed to `table`, `compare` or `report` can hold any name: the run's trace with three
# renamed.
RENAMES = {
    "Optimizer.step#SGD.step": ESC_NAME,
    "aten::addmm": BEL_NAME,
    "Optimizer.zero_grad#SGD.zero_grad": BIDI_NAME,
}

RAW = ("\x1b", "\x07", "\u202e")
# the output folder's name: the agent's `saved trace ...: PATH` lines and the summary name it
OUT = "out\x1b[31m"


def _assert_clean(text: str, where: str) -> None:
    for char in RAW:
        assert char not in text, f"{where}: raw {char!r} in the output"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose program emits the huge region name, whose command line holds ESC and BEL and
    whose output folder's name ESC; then `hostile/`, its trace with operators renamed to ESC_NAME,
    BEL_NAME and BIDI_NAME."""
    tmp = tmp_path_factory.mktemp("hostile")
    script = write_script(tmp, "names.py", _SCRIPT)
    out = tmp / OUT
    result = run_stepcli("run", "--active", "2", "-o", out, script, ESC_NAME, BEL_NAME)
    assert result.returncode == 0, result.stderr
    (tmp / "run.stderr").write_text(result.stderr)
    document = load_trace(trace_files(out)[0])
    for event in document["traceEvents"]:
        event["name"] = RENAMES.get(event.get("name"), event.get("name"))
    (tmp / "hostile").mkdir()
    (tmp / "hostile" / "rank0.1.pt.trace.json").write_text(json.dumps(document))
    return tmp


def test_run_summary_and_report_html_survive_hostile_names(hostile_run: Path) -> None:
    # THEN the run's summary shows the command line's control characters as escapes
    stderr = (hostile_run / "run.stderr").read_text()
    _assert_clean(stderr, "run summary")
    assert "\\x1b[2J\\x1b[H" in stderr and "ring\\x07bell" in stderr
    # AND the output folder's name too, in the agent's lines (from inside the program) and in the
    # launcher's
    assert stderr.count("out\\x1b[31m") >= 2 and "saved trace of steps" in stderr
    # AND report.html is written despite the huge region number
    page = hostile_run / OUT / "report.html"
    assert page.is_file(), stderr
    assert "Torch-Compiled Region: 0/1111" in page.read_text()


def test_report_with_a_huge_compiled_region_number(hostile_run: Path) -> None:
    # WHEN the page is rebuilt from the run folder
    result = run_stepcli("report", hostile_run / OUT, "-o", hostile_run / "page.html")
    assert result.returncode == 0, result.stderr
    assert "Torch-Compiled Region: 0/1111" in (hostile_run / "page.html").read_text()
    result = run_stepcli("report", hostile_run / "hostile", "-o", hostile_run / "page.html")
    # THEN it is written (no exit 70 from the recompilation advice), with the names shown as escapes
    assert result.returncode == 0, result.stderr
    html = (hostile_run / "page.html").read_text()
    _assert_clean(html, "report")
    _assert_clean((hostile_run / OUT / "report.html").read_text(), "run's report.html")
    assert "\\x1b[2J" in html and "ring\\x07bell" in html


@pytest.mark.parametrize("flag", ["", "--csv", "--markdown"])
def test_table_shows_control_characters_as_escapes(hostile_run: Path, flag: str) -> None:
    result = run_stepcli("table", hostile_run / "hostile", *([flag] if flag else []))
    assert result.returncode == 0, result.stderr
    _assert_clean(result.stdout + result.stderr, f"table {flag}")
    # Markdown doubles the backslash
    assert "x07bell" in result.stdout and "u202eop" in result.stdout


def test_table_json_keeps_the_exact_names(hostile_run: Path) -> None:
    result = run_stepcli("table", hostile_run / "hostile", "--json")
    assert result.returncode == 0, result.stderr
    # JSON escapes them as \\u001b
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    names = {op["name"] for op in json.loads(result.stdout)["cpu_ops"]}
    assert {ESC_NAME, BEL_NAME, BIDI_NAME} <= names


@pytest.mark.parametrize("markdown", [False, True])
def test_compare_shows_control_characters_as_escapes(hostile_run: Path, markdown: bool) -> None:
    traces = trace_files(hostile_run / "hostile")
    args = ["compare", traces[0], traces[0], *(["--markdown", "-"] if markdown else [])]
    result = run_stepcli(*args)
    # 4: a trace against itself may be inconclusive
    assert result.returncode in (0, 3, 4), result.stderr
    _assert_clean(result.stdout + result.stderr, "compare")


def test_an_error_naming_a_hostile_file_shows_escapes(tmp_path: Path) -> None:
    # GIVEN a broken trace whose file name clears the screen
    bad = tmp_path / f"{ESC_NAME}{BEL_NAME}.json"
    bad.write_text('{"traceEvents": [')
    # WHEN table reads it THEN the one error line names it with escapes
    result = run_stepcli("table", tmp_path)
    assert result.returncode == 2, result.stderr
    _assert_clean(result.stderr, "error line")
    assert "\\x1b[2J\\x1b[Hring\\x07bell.json" in result.stderr


def test_memory_shows_control_characters_in_frame_names_as_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a CUDA memory snapshot whose program file name holds ESC and BEL
    import memory_snapshots as fx

    monkeypatch.setattr(fx, "SCRIPT", f"/work/{ESC_NAME}{BEL_NAME}.py")
    builder, info = fx.oom_in_forward(steps=4)
    path = builder.write(tmp_path / "oom-rank0.pickle", info)
    # WHEN `stepcli memory` reads it THEN the sites show the name with escapes
    result = run_stepcli("memory", path)
    assert result.returncode == 0, result.stderr
    _assert_clean(result.stdout + result.stderr, "memory")
    assert "\\x1b[2J\\x1b[Hring\\x07bell.py" in result.stdout
