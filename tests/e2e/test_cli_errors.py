"""Bad input: one clear line on stderr, a non-zero exit, never a traceback, nothing of the user's
touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_stepcli


def assert_one_line_error(result: object, status: int, *fragments: str) -> None:
    assert result.returncode == status, (result.returncode, result.stderr)  # type: ignore[attr-defined]
    lines = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, result.stderr  # type: ignore[attr-defined]
    assert lines[0].startswith("stepcli: error: ")
    assert "Traceback" not in result.stderr  # type: ignore[attr-defined]
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "--active", "0", "x.py"], "--active"),
        (["run", "--wait", "-1", "x.py"], "--wait"),
        # it ran the program, then failed with exit 70
        (["run", "--repeat", str(2**64), "x.py"], "--repeat"),
        (["run", "--skip-first", str(2**64), "x.py"], "--skip-first"),
        (["run", "--warmpu", "1", "x.py"], "--warmpu"),
        (["run", "missing.py"], "missing.py"),
        (["run"], "SCRIPT"),
        (["run", "--activities", "cpu,tpu", "x.py"], "activities"),
        (["run", "--step-on", "nocolon", "x.py"], "MODULE:QUALNAME"),
        (["run", "--step-on", "__main__:f", "x.py"], "__main__"),
        (["run", "-m", "not a module"], "module"),
        (["run", "--", "no-such-command-xyz"], "command not found"),
        (["run", "--fail-over", "p50", "x.py"], "fail-over"),
        (["bogus"], "bogus"),
        (["capture", "out", "--timeout", "nan"], "--timeout"),  # accepted, it waited forever
        (["capture", "out", "--timeout", "inf"], "--timeout"),
        # an option's missing value points at that command's help
        (["compare", "--tolerance"], "(see 'stepcli compare --help')"),
        (["merge", "x.json", "-o"], "(see 'stepcli merge --help')"),
        # an empty path is no name: never the current folder or the default file
        (["run", "-o", "", "x.py"], "an empty path"),
        (["report", "x.py", "-o", ""], "an empty path"),
        (["run", "--json", "", "x.py"], "an empty path"),
    ],
)
def test_usage_errors_exit_2_before_anything_starts(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    (tmp_path / "x.py").write_text("open('started', 'w').close()\n")
    result = run_stepcli(*args, cwd=tmp_path)
    assert_one_line_error(result, 2, fragment)
    assert not (tmp_path / "started").exists()
    assert not (tmp_path / "stepcli-runs").exists()


def test_unwritable_output_folder(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("open('started', 'w').close()\n")
    (tmp_path / "afile").write_text("keep me")
    result = run_stepcli("run", "-o", tmp_path / "afile" / "sub", "x.py", cwd=tmp_path)
    assert_one_line_error(result, 2, "output folder")
    assert (tmp_path / "afile").read_text() == "keep me"
    assert not (tmp_path / "started").exists()


def test_output_folder_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    (tmp_path / "out").write_text("keep me")
    result = run_stepcli("run", "-o", "out", "x.py", cwd=tmp_path)
    assert_one_line_error(result, 2, "out", "is a file")
    assert (tmp_path / "out").read_text() == "keep me"


def test_bare_stepcli_shows_the_usage_as_written() -> None:
    result = run_stepcli()
    assert result.returncode == 2 and not result.stdout
    lines = result.stderr.splitlines()
    assert lines[0] == "Usage: stepcli [OPTIONS] COMMAND [ARGS]..." and "Commands:" in lines, (
        result.stderr
    )
    assert "\\x0a" not in result.stderr and any(line.strip().startswith("run ") for line in lines)


def test_help_and_version() -> None:
    assert run_stepcli("--help").returncode == 0
    result = run_stepcli("run", "--help")
    assert result.returncode == 0 and "passed to the program untouched" in " ".join(
        result.stdout.split()
    )
    version = run_stepcli("--version")
    assert version.returncode == 0 and "stepcli" in version.stdout


def test_json_into_a_missing_folder_fails_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    # GIVEN --json naming a file in a folder that does not exist (docs/commands/run.md: its folder
    # must exist)
    (tmp_path / "x.py").write_text("open('started', 'w').close()\n")
    target = tmp_path / "nonexistent" / "dir" / "x.json"
    result = run_stepcli("run", "-q", "--json", target, "x.py", cwd=tmp_path)
    # THEN one line, exit 2, the program never started, and no folder was created
    assert_one_line_error(result, 2, f"--json {target}", "does not exist")
    assert not (tmp_path / "nonexistent").exists() and not (tmp_path / "started").exists()


# (The `--` first is docs/commands/demo.md's `stepcli demo -- --iterations 30`, run by
# tests/test_docs_examples.py; right after an option's value, test_run_summary's demo and demo.md's
# `--json demo.json -- --iterations 60`.)
@pytest.mark.parametrize("before", [["-o", "out", "--no-report"]])
def test_demo_options_after_the_double_dash_reach_the_demo_script(
    tmp_path: Path, before: list[str]
) -> None:
    # GIVEN README's `stepcli demo -- --iterations N`, the `--` after a flag (alone, or after an
    # option's value)
    result = run_stepcli("demo", *before, "--", "--iterations", "30", cwd=tmp_path)
    # THEN the demo script gets --iterations (30, not its default 12: it prints every 4th, up to
    # iteration 28)
    assert result.returncode == 0, result.stderr
    assert "No such option" not in result.stderr
    assert "iteration  28  loss" in result.stdout, result.stdout
