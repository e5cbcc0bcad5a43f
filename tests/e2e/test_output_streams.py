"""stdout and stderr that cannot take stepcli's output: a reader gone keeps the command's status, a
stream that cannot be written at all (closed, a full disk) is one error line and exit 2, never
"internal error"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import stepcli_env, write_script


def _steps_trace(path: Path, step_ms: float, steps: int = 12) -> Path:
    """A trace of `steps` ProfilerStep#N spans of `step_ms` each, one operator inside each."""
    events = []
    for step in range(steps):
        ts = step * (step_ms + 1) * 1000
        events.append(
            {
                "name": f"ProfilerStep#{step}",
                "ph": "X",
                "cat": "user_annotation",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": step_ms * 1000,
            }
        )
        events.append(
            {
                "name": "aten::mm",
                "ph": "X",
                "cat": "cpu_op",
                "pid": 1,
                "tid": 1,
                "ts": ts + 1,
                "dur": step_ms * 900,
            }
        )
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.fixture(scope="module")
def slower(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("streams")
    return _steps_trace(root / "base.json", 10.0), _steps_trace(root / "current.json", 20.0)


def _stepcli(args: list[str], **streams: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepcli", *args],
        text=True,
        env=stepcli_env(),
        stdin=subprocess.DEVNULL,
        timeout=120,
        **streams,  # type: ignore[call-overload]
    )


def _close_stdout() -> None:
    os.close(1)


def _argv(command: str, traces: tuple[Path, Path], tmp_path: Path) -> list[str]:
    """`command`'s words and its inputs: traces for table and compare, a file to write for report
    and merge."""
    words = command.split()
    if words[0] in ("report", "merge"):
        return [
            *words,
            "-o",
            str(tmp_path / ("report.html" if words[0] == "report" else "merged.json")),
            str(traces[0]),
        ]
    if words[0] == "table":
        return [*words, str(traces[0])]
    return [*words, *map(str, traces)] if words[0] == "compare" else words


# table, compare and top write through rich or print(); report, merge, --help and --version through
# click.echo
_COMMANDS = [
    "table",
    "table --json",
    "compare",
    "compare --markdown -",
    "report",
    "merge",
    "--help",
    "--version",
]


@pytest.mark.parametrize("command", _COMMANDS)
@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_stdout_that_takes_nothing_is_one_error_line(
    slower: tuple[Path, Path], command: str, stdout: str, tmp_path: Path
) -> None:
    # GIVEN stdout on a full disk (/dev/full) or closed (`>&-`)
    argv = _argv(command, slower, tmp_path)
    if stdout == "full":
        with open("/dev/full", "w") as full:
            result = _stepcli(argv, stdout=full, stderr=subprocess.PIPE)
    else:
        result = _stepcli(argv, stderr=subprocess.PIPE, preexec_fn=_close_stdout)
    # THEN one line says so, exit 2: the user's setup, not a bug in stepcli (it was "internal
    # error", exit 70; click.echo's commands said nothing and exited 0)
    reason = "No space left on device" if stdout == "full" else "it is closed"
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"stepcli: error: cannot write the output to stdout: {reason}"
    ]


@pytest.mark.parametrize("command", ["report", "merge", "--help"])
def test_a_reader_gone_is_not_an_error(
    slower: tuple[Path, Path], command: str, tmp_path: Path
) -> None:
    # GIVEN stdout a pipe whose reader has gone (`stepcli --help | head -1` once head has its line)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = _stepcli(
            _argv(command, slower, tmp_path), stdout=write_end, stderr=subprocess.PIPE
        )
    finally:
        os.close(write_end)
    # THEN the command's own status, and nothing on stderr (it was exit 1 and "Exception ignored ...
    # BrokenPipeError")
    assert (result.returncode, result.stderr) == (0, "")
    if command != "--help":
        assert any(tmp_path.iterdir()), "the file was not written"


@pytest.mark.parametrize("markdown", [False, True])
def test_compare_keeps_its_verdict_when_the_reader_goes_away(
    slower: tuple[Path, Path], markdown: bool
) -> None:
    # GIVEN a regression (10 ms -> 20 ms steps) WHEN compare's reader has gone before it writes (`|
    # head -0`)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        args = [
            "compare",
            *(["--markdown", "-"] if markdown else []),
            str(slower[0]),
            str(slower[1]),
        ]
        result = _stepcli(args, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    # THEN the gate still fails on the regression (a CI job with pipefail sees it), without a
    # traceback
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_stdout_that_is_not_utf8_gets_everything_and_keeps_the_status(
    slower: tuple[Path, Path], encoding: str, tmp_path: Path
) -> None:
    # GIVEN stdout in an encoding without stepcli's characters (…, ≥, bars) and a trace naming an
    # operator in characters it lacks (issue 47, item 16: table printed nothing and exited 2,
    # compare turned exit 1 into 2)
    named = tmp_path / "named.json"
    document = json.loads(slower[0].read_text())
    for event in document["traceEvents"]:
        if event["name"] == "aten::mm":
            event["name"] = "aten::mm→ünï 😀"
    named.write_text(json.dumps(document))
    for command in _COMMANDS:
        argv = _argv(command, slower, tmp_path)
        utf8 = subprocess.run(
            [sys.executable, "-m", "stepcli", *argv],
            capture_output=True,
            env=stepcli_env(),
            timeout=120,
        )
        env = stepcli_env({"PYTHONIOENCODING": encoding})
        other = subprocess.run(
            [sys.executable, "-m", "stepcli", *argv], capture_output=True, env=env, timeout=120
        )
        # THEN the same status (compare's REGRESSION still exits 1) and the whole output, in that
        # encoding
        assert other.returncode == utf8.returncode, (command, other.stderr)
        assert b"cannot write" not in other.stderr, (command, other.stderr)
        assert other.stdout.count(b"\n") == utf8.stdout.count(b"\n") > 0, command
        other.stdout.decode(encoding)
    # AND --json reads back the same, the name escaped as JSON escapes it
    argv = [sys.executable, "-m", "stepcli", "table", "--json", str(named)]
    utf8 = subprocess.run(argv, capture_output=True, env=stepcli_env(), timeout=120)
    env = stepcli_env({"PYTHONIOENCODING": encoding})
    other = subprocess.run(argv, capture_output=True, env=env, timeout=120)
    assert other.returncode == 0 and json.loads(other.stdout.decode(encoding)) == json.loads(
        utf8.stdout
    )
    assert "aten::mm→ünï 😀" in json.loads(utf8.stdout)["cpu_ops"][0]["name"]
    # AND the table says the name with what the encoding has
    table = subprocess.run([*argv[:-2], str(named)], capture_output=True, env=env, timeout=120)
    assert table.returncode == 0 and "aten::mm->" in table.stdout.decode(encoding), table.stderr


_EXITS_3 = """
    import sys
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    sys.exit(int(sys.argv[1]))
"""


def test_run_keeps_the_programs_status_when_stderr_goes_away(tmp_path: Path) -> None:
    # GIVEN stepcli's stderr a pipe whose reader has gone (`stepcli run ... 2>&1 >/dev/null | head
    # -1`)
    script = write_script(tmp_path, "train.py", _EXITS_3)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        args = [
            "run",
            "--wait",
            "1",
            "--warmup",
            "0",
            "--active",
            "2",
            "--fail-over",
            "p50=1e9",
            "-o",
            "out",
        ]
        result = subprocess.run(
            [sys.executable, "-m", "stepcli", *args, str(script), "3"],
            cwd=tmp_path,
            env=stepcli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=write_end,
            timeout=300,
        )
    finally:
        os.close(write_end)
    # THEN stepcli exits with the program's status (rich's broken-pipe handling made it 1), the
    # budget checked without a crash on the way
    assert result.returncode == 3
    # AND the traces and the run summary were written all the same
    assert list((tmp_path / "out").rglob("*.pt.trace.json*"))
    assert list((tmp_path / "out").rglob("summary.json"))
