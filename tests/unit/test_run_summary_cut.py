"""A signal that reaches `stepcli run` after the program ended, while the traces are read (a
scheduler's time limit, a Ctrl-C on a long read): the summary is cut short, the program's status and
the `--json` file CI reads next stay."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepcli.agent.config import AgentConfig
from stepcli.run import launcher
from stepcli.run.controldir import prepare_control_dir
from stepcli.run.summary import build
from stepcli.runfolder.layout import SUMMARY_FILE


def _signalled_read(signum: int, **_: Any) -> Any:
    """build_run_summary as a long read that a real signal interrupts."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the handler raises at the next bytecode boundary
        time.sleep(0.01)
    raise AssertionError("the signal did not cut the read short")


@pytest.mark.parametrize(
    ("signum", "program_status", "expected"), [(signal.SIGTERM, 0, 143), (signal.SIGINT, 3, 3)]
)
def test_a_signal_while_summarizing_keeps_the_status_and_the_json(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signum: int,
    program_status: int,
    expected: int,
) -> None:
    # GIVEN a run whose program ended with `program_status`, summarized with --json
    out = tmp_path / "out"
    out.mkdir()
    prepare_control_dir(out, "run-1")
    config = AgentConfig("run-1", str(out), os.getpid())
    request = launcher.RunRequest(
        argv=[sys.executable, "train.py"],
        label="train",
        schedule=config.schedule,
        json_path=str(tmp_path / "run.json"),
    )
    monkeypatch.setattr(build, "build_run_summary", lambda *a, **k: _signalled_read(signum))
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    # WHEN a signal arrives during the read
    status = launcher._report(request, config, program_status, time.time(), 1.0)
    # THEN the program's failure stands, or the signal's status for one that succeeded (the run was
    # stopped)
    assert status == expected
    # AND --json and the saved summary exist, valid, saying why they measured nothing
    for path in (tmp_path / "run.json", out / ".stepcli" / "run-1" / SUMMARY_FILE):
        document = json.loads(path.read_text())
        assert document["exit_status"] == program_status
        assert signal.Signals(signum).name in document["notes"][0]
    name = signal.Signals(signum).name
    assert (
        f"{name}: the summary was cut short (the program had ended: exit {program_status})"
        in capsys.readouterr().err
    )
    # AND the handlers are as they were
    assert {s: signal.getsignal(s) for s in before} == before
