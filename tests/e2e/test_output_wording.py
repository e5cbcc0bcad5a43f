"""Output read in a CI log (issue 19.14/16): 80 columns on a pipe, no trailing spaces, singular and
plural right, one name for one step set, nothing cut silently, a hint where a column would be
empty."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TRAIN_LOOP, run_stepcli, write_script

PIPE_80 = {"COLUMNS": "80"}  # run_stepcli's output is a pipe (no TTY)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run with a one-step window per step (`--active 1 --repeat 0`), its terminal summary at 80
    columns."""
    root = tmp_path_factory.mktemp("wording")
    script = write_script(root, "train.py", TRAIN_LOOP)
    result = run_stepcli(
        "run", "--active", "1", "--repeat", "0", "-o", root / "out", script, "12", env=PIPE_80
    )
    assert result.returncode == 0, result.stderr
    return root / "out", result.stderr


def test_run_summary_on_a_pipe_has_no_trailing_spaces_and_says_step_for_one(
    run_folder: tuple[Path, str],
) -> None:
    _out, summary = run_folder
    lines = summary[summary.index("stepcli summary") :].splitlines()
    assert all(line == line.rstrip() for line in lines), [
        line for line in lines if line != line.rstrip()
    ]
    windows = [line for line in lines if line.startswith("trace ")]
    # not "trace steps 4"
    assert windows and all(re.match(r"trace step \d+ ", line) for line in windows), windows


def test_terminal_and_report_name_the_profiled_steps_alike(run_folder: tuple[Path, str]) -> None:
    out, summary = run_folder
    terminal = re.search(r"^profiled steps +n=(\d+) +median (\S+)", summary, re.M)
    assert terminal, summary
    html = (out / "report.html").read_text()
    assert "recorded steps: median" not in html
    assert "profiled steps: median" in html


def test_table_on_a_pipe_at_80_columns_has_no_trailing_spaces(run_folder: tuple[Path, str]) -> None:
    out, _ = run_folder
    result = run_stepcli("table", out, env=PIPE_80)
    assert result.returncode == 0, result.stderr
    assert all(line == line.rstrip() and len(line) <= 80 for line in result.stdout.splitlines()), (
        result.stdout
    )


@pytest.mark.parametrize("columns", ["0", "-1"])
def test_columns_that_are_no_width_read_as_80_on_a_pipe(
    run_folder: tuple[Path, str], columns: str
) -> None:
    # GIVEN COLUMNS=0, as some shells and CI runners set it: rich alone drew nothing at all, exit 0
    out, _ = run_folder
    result = run_stepcli("table", out, env={"COLUMNS": columns})
    # THEN the output is the one at 80 columns
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout == run_stepcli("table", out, env=PIPE_80).stdout
        and "CPU operators" in result.stdout
    )


def test_table_at_80_columns_wraps_between_clauses_and_captions_to_the_width(
    run_folder: tuple[Path, str],
) -> None:
    out, _ = run_folder
    lines = run_stepcli("table", out, "--limit", "3", env=PIPE_80).stdout.splitlines()
    # THEN no line starts with a unit torn from its figure ("min 0.177" / "ms, max ..."), and the
    # narrow steps table's caption is one line at the console's width, not folded to the table's
    # ("first 3 of 4" / "steps")
    assert not [line for line in lines if re.match(r"\s*(ms|%)\b", line)], lines
    assert any(re.fullmatch(r"first 3 of \d+ steps", line) for line in lines), lines
    assert all(len(line) <= 80 for line in lines)


def test_markdown_limit_says_when_it_cuts_the_steps_table(run_folder: tuple[Path, str]) -> None:
    out, _ = run_folder
    result = run_stepcli("table", out, "--markdown", "--limit", "3")
    assert result.returncode == 0, result.stderr
    steps = result.stdout.split("### Steps", 1)[1].split("###", 1)[0]
    rows = [line for line in steps.splitlines() if re.match(r"\| \S+ \| \d+ \|", line)]
    assert len(rows) == 3, steps
    assert re.search(r"First 3 steps of each process shown \(3 of \d+, --limit\)", steps), steps


def test_group_by_shape_without_shapes_says_how_to_record_them(
    run_folder: tuple[Path, str],
) -> None:
    out, _ = run_folder
    result = run_stepcli("table", out, "--group-by-shape")
    assert result.returncode == 0, result.stderr
    assert "no input shapes; record them with `stepcli run --record-shapes`" in result.stderr
