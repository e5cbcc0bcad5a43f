"""The step log one profiled process writes, and its save at exit, without torch or a subprocess.

tests/e2e/test_run_summary.py and test_run_endings.py read the same files after real runs.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from fake_torch import fake_clock

from stepcli.agent import output
from stepcli.agent import steplogwriter as steplog
from stepcli.agent.config import AgentConfig
from stepcli.agent.gcpauses import GcPauses
from stepcli.agent.schedule import NONE, RECORD
from stepcli.agent.signing import signature_matches
from stepcli.agent.tracker import StepTracker
from stepcli.runfolder.layout import SIGNATURE_KEY, STEP_LOG_SUFFIX, STEP_RECORD_SUFFIX

KEY = "run-key"


class FakeRecorder:
    def __init__(self) -> None:
        self.busy = False
        self.prof: Any = None
        self.windows: list[dict[str, Any]] = [
            {"first_step": 2, "last_step": 3, "trace": "t.json", "complete": True}
        ]
        self.skipped_windows = 1
        self.notes = ["a note"]
        self.stops: list[str] = []
        self.failures: list[str] = []

    def stop(self, reason: str) -> None:
        self.stops.append(reason)

    def stop_after_write_failure(self, message: str) -> None:
        self.failures.append(message)

    def deliver_deferred_signal(self) -> None:
        pass


class FakeAgent:
    """What steplog.Agent declares: the agent's state a step log is made of."""

    def __init__(self, out_dir: Path, steps: int) -> None:
        self.config = AgentConfig("run-1", str(out_dir), launcher_pid=1, run_key=KEY)
        self.pid = os.getpid()
        self.tracker = StepTracker(clock=fake_clock(2_000_000))
        self.tracker.register("opt", "SGD#0")
        for step in range(steps):
            self.tracker.set_phase(RECORD if step in (2, 3) else NONE)
            self.tracker.step("opt")
        self.recorder: FakeRecorder | None = FakeRecorder()
        self.ondemand = None
        self.compiles = None
        self.gc_pauses = GcPauses()
        self.exit_reason = ""
        self.hook_notes = ["could not hook x:y"]
        self.wall_start = 1.0
        self.saved_steps = -1
        self.saved_stalled = False
        self.record_saved = False


@pytest.fixture(autouse=True)
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "current_rank", lambda: 0)


def _log(agent: FakeAgent) -> dict[str, Any]:
    path = Path(agent.config.log_dir) / f"{socket.gethostname()}.{agent.pid}{STEP_LOG_SUFFIX}"
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_the_step_log_holds_every_step_and_is_signed_with_the_run_key(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path, steps=5)
    steplog.write_step_log(agent, progress="running")
    log = _log(agent)
    assert log["global_steps"] == 5 and log["rank"] == 0 and log["worker"] == "rank0"
    assert log["durations_us"] == [2000] * 5  # one clock read per step: 2 ms each
    assert log["phases"] == "00220"
    assert log["requesters"] == [{"name": "SGD#0", "calls": 5, "first_step": 0}]
    assert log["windows"] == agent.recorder.windows and log["skipped_windows"] == 1  # type: ignore[union-attr]
    assert log["notes"] == ["could not hook x:y", "a note"]
    assert (log["exit"], log["progress"]) == ("running", "running")
    signature = log.pop(SIGNATURE_KEY)
    assert signature_matches(KEY, log, signature)
    assert not signature_matches("another run", log, signature)
    assert (agent.saved_steps, agent.saved_stalled, agent.record_saved) == (5, False, True)
    assert (
        Path(agent.config.log_dir) / f"{socket.gethostname()}.{agent.pid}{STEP_RECORD_SUFFIX}"
    ).is_file()
    assert oct(Path(agent.config.log_dir).stat().st_mode & 0o777) == "0o700"


def test_step_arrays_caught_mid_step_are_cut_to_one_length(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path, steps=3)
    # another thread saves between the two appends of a step
    agent.tracker.durations_ns.append(9_000_000)
    steplog.write_step_log(agent)
    log = _log(agent)
    assert len(log["durations_us"]) == len(log["phases"]) == 3


def test_the_save_at_exit_closes_the_window_then_writes_the_log_with_why_it_ended(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path, steps=4)
    steplog.save_at_exit(agent, "SIGTERM", blocked=False)
    assert agent.recorder is not None and agent.recorder.stops == ["cut short: SIGTERM"]
    log = _log(agent)
    assert (log["exit"], log["progress"], log["global_steps"]) == ("SIGTERM", "", 4)
    assert agent.record_saved  # the whole-run record is written at exit


def test_a_window_left_open_at_exit_is_named_in_the_notes(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path, steps=4)
    assert agent.recorder is not None
    agent.recorder.prof = object()  # the stop could not close it (the main thread is blocked)
    steplog.save_at_exit(agent, "exit", blocked=True)
    assert agent.recorder.stops == ["cut short: the program exited"]
    assert (
        _log(agent)["notes"][-1]
        == "the window open at exit could not be saved: the main thread was blocked"
    )


def test_a_process_that_never_stepped_writes_no_step_log(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path, steps=0)
    agent.recorder = None
    steplog.save_at_exit(agent, "exit", blocked=False)
    assert not Path(agent.config.log_dir).exists()


def test_a_step_log_that_cannot_be_written_stops_profiling_with_one_line(tmp_path: Path) -> None:
    (tmp_path / ".stepcli").write_text("a file where the folder goes")
    agent = FakeAgent(tmp_path, steps=2)
    steplog.save_at_exit(agent, "exit", blocked=False)  # never raises into the program's exit
    assert agent.recorder is not None
    assert len(agent.recorder.failures) == 1
    assert agent.recorder.failures[0].startswith(
        f"could not write the step log in {agent.config.log_dir}"
    )
