"""The messages a newcomer's mistakes and first runs get (issue 49): each says what happened and
what to type."""

from __future__ import annotations

from pathlib import Path

from conftest import run_stepcli, write_script


def test_ctrl_c_before_the_first_step_says_the_program_was_interrupted(tmp_path: Path) -> None:
    # GIVEN a program interrupted (SIGINT, as Ctrl-C sends) after importing torch, before any step
    script = write_script(
        tmp_path, "slow_start.py", "import os, signal, torch\nos.kill(os.getpid(), signal.SIGINT)\n"
    )
    result = run_stepcli("run", "--no-report", "-o", tmp_path / "out", script)
    # THEN the program's status, and the summary says it was interrupted before its first step (not
    # that a kill left stepcli no time to save)
    assert result.returncode == 130, result.stderr
    assert "interrupted (SIGINT) before its first step" in result.stderr, result.stderr
    assert "no time to save" not in result.stderr


def test_a_script_given_as_a_command_is_told_how_to_run_it(tmp_path: Path) -> None:
    write_script(tmp_path, "train.py", "print('hi')\n")
    result = run_stepcli("run", "--", "train.py", "--epochs", "2", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "stepcli: error: command not found: train.py; a script runs as `-- python train.py "
        "--epochs 2`"
    )


def test_demo_help_is_the_demos_help_and_writes_nothing(tmp_path: Path) -> None:
    result = run_stepcli("demo", "--", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: stepcli demo" in result.stdout and "--iterations" in result.stdout, result.stdout
    assert "stepcli summary" not in result.stderr and list(tmp_path.iterdir()) == []


def test_run_help_shows_the_ranges_people_need_not_the_overflow_bound() -> None:
    result = run_stepcli("run", "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "1099511627776" not in result.stdout
    active = next(
        line for line in result.stdout.splitlines() if line.strip().startswith("--active")
    )
    assert (
        active.split()
        == "--active INTEGER Steps recorded in each trace. [default: 3; x>=1]".split()
    ), active
