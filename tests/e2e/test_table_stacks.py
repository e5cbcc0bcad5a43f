"""Python stacks (`stepcli run --with-stack`), input shapes and the breakdown's "other" phase, end
to end: one real run recorded with stacks and shapes, then `table --stacks` (terminal, JSON, CSV),
the run summary's pointers, and the report's flame graph in a real browser."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from browser import artifacts_dir
from conftest import REPO, run_stepcli, write_script

# torch.profiler's, shapes but no stacks
PLAIN_TRACE = REPO / "tests" / "data" / "train_cpu.pt.trace.json"

# A step whose time is mostly Python outside any operator (busy_python), called through a helper
# loaded from a file whose name holds markup: frame names come from traces, and the page must show
# them, never run them.
HELPER = """
    def busy_python(n):
        total = 0
        for i in range(n):
            total += i * i
        return total
"""
SCRIPT = """
    import importlib.util
    import torch

    spec = importlib.util.spec_from_file_location("helper", "x<b>&y.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)

    def train_step(model, opt, x):
        helper.busy_python(60000)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 16)
    for _ in range(6):
        train_step(model, opt, x)
"""


@pytest.fixture(scope="module")
def stack_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run recorded with --with-stack and --record-shapes (2 steps), at 80 columns."""
    work = tmp_path_factory.mktemp("stacks")
    write_script(work, "x<b>&y.py", HELPER)
    script = write_script(work, "train.py", SCRIPT)
    out = work / "out"
    result = run_stepcli(
        "run",
        "--with-stack",
        "--record-shapes",
        "--active",
        "2",
        "-o",
        out,
        script,
        cwd=work,
        env={"COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    return {"work": work, "out": out, "result": result, "summary": result.stdout + result.stderr}


def _table(*args: Any) -> Any:
    return run_stepcli("table", *args, env={"COLUMNS": "80"})


def test_table_stacks_lists_the_top_python_stacks_in_80_columns(stack_run: dict[str, Any]) -> None:
    result = _table(stack_run["out"], "--stacks", "5")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Python stacks by self time" in text
    section = text[text.index("Python stacks by self time") :].splitlines()
    rows = [line for line in section if line.startswith("│")]
    # a stack takes up to two lines
    assert len([line for line in rows if line.endswith("% │")]) == 5
    # the code that spent the step, innermost frame first
    assert "busy_python (x<b>&y.py:" in rows[0]
    assert "< train_step (train.py:" in rows[1]
    assert "5 of " in text and "recorded steps" in text
    # (a path: whole)
    wide = [line for line in text.splitlines() if len(line) > 80 and not line.startswith("/")]
    assert wide == []
    # `--stacks` without N before the folder: the folder is no number, so it is the path, N its
    # default
    default = _table("--stacks", stack_run["out"])
    assert default.returncode == 0, default.stderr
    shown = default.stdout[default.stdout.index("Python stacks") :].splitlines()
    assert len([line for line in shown if line.startswith("│") and line.endswith("% │")]) == 10


def test_table_stacks_json_and_csv_hold_every_stack(stack_run: dict[str, Any]) -> None:
    result = _table(stack_run["out"], "--stacks", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    stacks = data["python_stacks"]
    assert stacks["steps"] == 2 and stacks["step_ms"] > 0
    rows = stacks["stacks"]
    top = rows[0]
    assert top["stack"][-1].endswith("): busy_python") and "x<b>&y.py" in top["stack"][-1]
    assert any(frame.endswith("): train_step") for frame in top["stack"])
    assert top["self_share"] > 0.3 and top["outside_operators_ms"] > 0.9 * top["self_ms"]
    assert [r["self_ms"] for r in rows] == sorted((r["self_ms"] for r in rows), reverse=True)
    assert all(r["total_ms"] >= r["self_ms"] - 1e-9 for r in rows)
    # the self times of every stack add up to the steps' time (frames cover the step's thread)
    assert sum(r["self_ms"] for r in rows) == pytest.approx(stacks["step_ms"], rel=0.05)
    module = next(r for r in rows if len(r["stack"]) == 1 and r["stack"][0].endswith("<module>"))
    assert module["total_share"] > 0.9
    assert data["recorded_with"] == {"stacks": True, "shapes": True}

    table = list(csv.DictReader(io.StringIO(_table(stack_run["out"], "--stacks", "--csv").stdout)))
    stack_rows = [r for r in table if r["kind"] == "python_stack"]
    assert len(stack_rows) == len(rows)
    assert stack_rows[0]["name"].split(";") == top["stack"]  # folded-stack lines: outermost first
    assert float(stack_rows[0]["self_ms"]) == pytest.approx(top["self_ms"], abs=0.001)


def test_plain_table_computes_no_stacks_but_says_how_to_see_them(stack_run: dict[str, Any]) -> None:
    data = json.loads(_table(stack_run["out"], "--json").stdout)
    assert data["python_stacks"] is None
    text = _table(stack_run["out"]).stdout
    assert "Python stacks by self time" not in text
    assert "by Python stack: stepcli table --stacks" in text


def test_stacks_of_traces_without_them_say_how_to_record_them() -> None:
    for args in (("--stacks", PLAIN_TRACE), (PLAIN_TRACE, "--stacks", "--json")):
        result = _table(*args)
        assert result.returncode == 0, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "stepcli run --with-stack" in lines[0], result.stderr
    assert json.loads(_table(PLAIN_TRACE, "--stacks", "--json").stdout)["python_stacks"] is None
    zero = _table(PLAIN_TRACE, "--stacks", "0")
    assert zero.returncode == 2 and "Traceback" not in zero.stderr


def test_shapes_are_pointed_to_when_recorded(stack_run: dict[str, Any], tmp_path: Path) -> None:
    out = stack_run["out"]
    run_text = stack_run["summary"]
    next_lines = run_text[run_text.index("next:") :].splitlines()
    assert any("--group-by-shape" in line and "stepcli table" in line for line in next_lines), (
        next_lines
    )
    assert any("--stacks" in line and "stepcli table" in line for line in next_lines), next_lines
    assert all(len(line) <= 80 for line in next_lines[:4])
    assert "--group-by-shape gives one row per shape" in _table(out).stdout
    assert "--group-by-shape gives one row per shape" not in _table(out, "--group-by-shape").stdout
    # a trace with no shapes (no record_shapes) gets no pointer
    bare = tmp_path / "bare.pt.trace.json"
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
    ]
    bare.write_text(json.dumps({"traceEvents": events}))
    plain = _table(bare)
    assert plain.returncode == 0 and "group-by-shape" not in plain.stdout
    assert json.loads(_table(bare, "--json").stdout)["recorded_with"] == {
        "stacks": False,
        "shapes": False,
    }


def test_the_other_phase_is_explained(stack_run: dict[str, Any]) -> None:
    out = stack_run["out"]
    data = json.loads(_table(out, "--stacks", "--json").stdout)
    other = data["other_ms"]
    assert other["outside_operators"] + other["inside_operators"] == pytest.approx(
        data["breakdown_ms"]["other"]
    )
    assert other["outside_operators"] > 0.5 * data["breakdown_ms"]["other"]
    for text in (_table(out, "--stacks").stdout, stack_run["summary"]):
        assert "outside every operator" in text
    lines = _table(out, "--stacks").stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("other ") and "ms/step" in line)
    by_stack = lines[at : at + 6]
    assert any("Python time outside operators, by stack" in line for line in by_stack), by_stack
    assert any("busy_python" in line for line in by_stack), by_stack


def test_report_draws_a_flame_graph_of_the_stacks(
    stack_run: dict[str, Any], browser: Any, tmp_path: Path
) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    page = stack_run["out"] / "report.html"
    html = page.read_text()
    flame = html[
        html.index('<svg class="chart flame"') : html.index(
            "</svg>", html.index('<svg class="chart flame"')
        )
    ]
    assert "<b>" not in flame and "x&lt;b&gt;&amp;y.py" in flame  # names escaped, never markup
    assert "<script" not in flame and "http" not in flame
    assert 'id="other-phase"' in html and "busy_python" in html[html.index('id="other-phase"') :]

    browser.get(page.resolve().as_uri())
    frames = browser.find_elements(By.CSS_SELECTOR, "svg.flame g.frame")
    assert len(frames) > 10
    assert browser.find_elements(By.CSS_SELECTOR, "svg.flame b") == []
    titles = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg.flame g.frame > title')).map(t => "
        "t.textContent)"
    )
    busy = [t for t in titles if "busy_python" in t]
    # the hover title: the full name, figures
    assert busy and "x<b>&y.py" in busy[0] and "per step" in busy[0]
    width = browser.execute_script(
        "const r = Array.from(document.querySelectorAll('svg.flame g.frame')).find(g => "
        "g.querySelector('title').textContent.includes('busy_python')).querySelector('rect');"
        "return r.getBoundingClientRect().width / "
        "document.querySelector('svg.flame').getBoundingClientRect().width"
    )
    assert width > 0.3  # the frame that took most of the step is drawn that wide
    section = browser.find_element(By.ID, "stacks")
    browser.execute_script("arguments[0].scrollIntoView()", section)
    shot = artifacts_dir(tmp_path) / "report-flame-graph.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000


def test_report_without_stacks_says_why_in_one_line(tmp_path: Path) -> None:
    page = tmp_path / "plain.html"
    result = run_stepcli("report", PLAIN_TRACE, "-o", page)
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert 'class="chart flame"' not in html and 'id="stacks"' not in html
    line = html[html.index('id="stacks-missing"') :].split("</p>", 1)[0]
    assert "stepcli run --with-stack" in line


def test_stepcli_s_own_work_at_a_step_boundary_is_never_inside_a_recorded_step(
    stack_run: dict[str, Any],
) -> None:
    # The agent's bookkeeping between steps (its CPU-time samples, the `saving trace ...` line and
    # the save ticker's thread) used to run inside `ProfilerStep#N`, counted as the program's time
    # ("other"): milliseconds per step on a short step. With Python stacks recorded, every frame of
    # it shows where it ran.
    from conftest import trace_files

    (trace,) = trace_files(stack_run["out"])
    events = json.loads(Path(trace).read_text())["traceEvents"]
    steps = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    assert len(steps) == 2
    # its bookkeeping: the CPU-time samples, the save's announcement and ticker, the clock and
    # trigger marks
    bookkeeping = (
        "/stepcli/agent/cpuwait.py",
        "/stepcli/agent/tracecost.py",
        "_announce_save",
        "mark_clock",
    )
    inside = [
        e["name"]
        for e in events
        if e.get("cat") == "python_function"
        and any(part in str(e.get("name", "")) for part in bookkeeping)
        # overlaps a step
        and any(start < e["ts"] + e.get("dur", 0) and e["ts"] < end for start, end in steps)
    ]
    assert inside == [], inside
