"""`stepcli run --on-demand` + `stepcli capture`: a running 2-rank job traced on request, at the
same steps."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import load_trace, profiler_steps, run_stepcli, stepcli_env, trace_files, write_script

from stepcli.agent import controlfiles, ondemand
from stepcli.agent.config import AgentConfig, atomic_write_json
from stepcli.agent.ondemand import OnDemand, WindowSchedule
from stepcli.agent.schedule import NONE, RECORD, RECORD_AND_SAVE, WARMUP, Schedule
from stepcli.agent.tracker import AFTER_WINDOW, NEVER, StepTracker
from stepcli.run.controldir import read_control as _read_control
from stepcli.run.controldir import read_requests as _read_requests
from stepcli.run.controldir import still_wanted as _still_wanted
from stepcli.run.live.captureplan import CaptureRequest, plan_request
from stepcli.run.live.capturewindow import (
    Ping,
    _outcome,
    _ping,
    _withdraw,
    await_heartbeats,
    wait_for_answers,
)
from stepcli.run.live.liverun import LiveRun

# Steps until rank 0 sees <control>/pause, then idles (no steps) until <control>/end. Rank 0 decides
# and broadcasts, so both ranks stop at the same iteration and no collective is left waiting. Rank 0
# keeps the number of steps made in <control>/step.
DDP_LOOP = """
    import sys
    import time
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    control = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def rank0_sees(name):
        flag = torch.tensor([float((control / name).exists())])
        dist.broadcast(flag, 0)
        return bool(flag.item())

    step = 0
    while not rank0_sees("pause"):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if rank == 0:
            (control / "step.tmp").write_text(str(step))
            (control / "step.tmp").replace(control / "step")
        if rank == 0 and step == 5:
            (control / "ready").touch()
        time.sleep(0.05)
    if rank == 0:
        (control / "paused").touch()
    while not rank0_sees("end"):
        time.sleep(0.1)
    dist.barrier()
    del model, opt  # DDP's reducer holds gloo's group: freed here, not at exit, where torch 2.13 can abort
    import gc; gc.collect()
    dist.destroy_process_group()
"""  # noqa: E501


@dataclass
class Scenario:
    out: Path
    first: subprocess.CompletedProcess[str]
    first_s: float
    second: subprocess.CompletedProcess[str]
    stalled: subprocess.CompletedProcess[str]
    stalled_s: float
    run_status: int
    run_stderr: str
    after_end: subprocess.CompletedProcess[str]
    summary: dict[str, Any]
    quiet: list[dict[str, Any]]  # the heartbeats after `quiet_step` steps and no capture
    quiet_step: int
    # the heartbeats a poll interval after the second capture returned
    after_captures: list[dict[str, Any]]
    later: list[dict[str, Any]]  # the same, `later_steps` steps after that
    later_steps: int
    # signal -> (pinged, exit status, stderr, file left behind)
    interrupted: dict[str, tuple[bool, int, str, bool]]


def _wait_for(path: Path, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"{path.name} never appeared:\n{log.read_text()}"
        time.sleep(0.1)


def _steps_made(control: Path) -> int:
    try:
        return int((control / "step").read_text())
    except (OSError, ValueError):
        return 0


def _wait_for_step(control: Path, step: int, proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 120
    while (made := _steps_made(control)) < step:
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"step {step} never came:\n{log.read_text()}"
        time.sleep(0.1)
    return made


def _interrupt_capture(out: Path, sig: signal.Signals) -> tuple[bool, int, str, bool]:
    """A capture waiting on a run that idles, stopped by `sig` once its ping is in the control
    folder."""
    requests = next(out.glob(".stepcli/*/control")) / "requests.json"
    capture = subprocess.Popen(
        [sys.executable, "-m", "stepcli", "capture", str(out), "--timeout", "60"],
        env=stepcli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not requests.exists() and capture.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pinged = requests.exists() and bool(json.loads(requests.read_text()).get("pings"))
    capture.send_signal(sig)
    _, err = capture.communicate(timeout=60)
    return pinged, capture.returncode, err, requests.exists()


def _heartbeats(out: Path) -> list[dict[str, Any]]:
    files = sorted(out.glob(".stepcli/*/control/proc.*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda h: int(h["rank"]))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    """One 2-rank torchrun job under `stepcli run --on-demand`: two captures while it steps, one
    while it idles, one after it ended."""
    tmp = tmp_path_factory.mktemp("capture")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    script = write_script(tmp, "ddp.py", DDP_LOOP)
    out, control, log = tmp / "out", tmp / "control", tmp / "run.log"
    control.mkdir()
    argv = [
        sys.executable,
        "-m",
        "stepcli",
        "run",
        "--on-demand",
        "-o",
        str(out),
        "--json",
        str(tmp / "run.json"),
        "--",
        torchrun,
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        str(control),
    ]
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=tmp,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_for(control / "ready", 180, proc, log)
        # 3 s of steps at least: a few polls, nobody listening
        _wait_for_step(control, 60, proc, log)
        quiet = _heartbeats(out)
        quiet_step = _steps_made(control)
        start = time.monotonic()
        first = run_stepcli("capture", out, "--active", "2", timeout=120)
        first_s = time.monotonic() - start
        # the launcher's pid
        second = run_stepcli("capture", str(proc.pid), "--active", "2", "--json", timeout=120)
        time.sleep(1.5)  # a poll that began before the request was withdrawn may still write
        after_captures = _heartbeats(out)
        later_from = _steps_made(control)
        later_steps = _wait_for_step(control, later_from + 40, proc, log) - later_from
        later = _heartbeats(out)
        (control / "pause").touch()
        _wait_for(control / "paused", 60, proc, log)
        start = time.monotonic()
        stalled = run_stepcli("capture", out, "--timeout", "3", timeout=120)
        stalled_s = time.monotonic() - start
        interrupted = {
            sig.name: _interrupt_capture(out, sig)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        (control / "end").touch()
        status = proc.wait(timeout=120)
        after_end = run_stepcli("capture", out, "--timeout", "3", timeout=60)
    finally:
        (control / "pause").touch()
        (control / "end").touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    summary = json.loads((tmp / "run.json").read_text())
    yield Scenario(
        out,
        first,
        first_s,
        second,
        stalled,
        stalled_s,
        status,
        log.read_text(),
        after_end,
        summary,
        quiet,
        quiet_step,
        after_captures,
        later,
        later_steps,
        interrupted,
    )


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _trace_of(line: str) -> Path:
    return Path(next(part for part in line.split() if part.endswith(".pt.trace.json")))


def test_capture_records_the_same_steps_on_every_rank(scenario: Scenario) -> None:
    result = scenario.first
    assert result.returncode == 0, result.stderr
    # about a second plus the steps, on a loaded machine
    assert scenario.first_s < 20, scenario.first_s
    lines = _lines(result.stdout)
    assert [line.split()[0] for line in lines] == ["rank0", "rank1"], result.stdout
    steps = [profiler_steps(_trace_of(line)) for line in lines]
    assert len(steps[0]) == 2 and steps[0][1] == steps[0][0] + 1, steps
    assert steps[1] == steps[0]  # the same global steps on both ranks, and only those
    assert all(f"steps {steps[0][0]}-{steps[0][1]}" in line for line in lines)
    assert "asked run" in result.stderr and f"steps {steps[0][0]}-{steps[0][1]}" in result.stderr


def test_second_capture_by_pid_records_later_steps(scenario: Scenario) -> None:
    result = scenario.second
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "stepcli.capture" and document["not_captured"] == []
    traces = document["traces"]
    assert [t["rank"] for t in traces] == [0, 1]
    first_steps = profiler_steps(_trace_of(_lines(scenario.first.stdout)[0]))
    request = document["request"]
    assert request["first_step"] > first_steps[-1]
    for trace in traces:
        assert (trace["first_step"], trace["last_step"]) == (
            request["first_step"],
            request["last_step"],
        )
        assert profiler_steps(Path(trace["path"])) == [request["first_step"], request["last_step"]]
        assert trace["bytes"] == os.path.getsize(trace["path"]) and trace["complete"] is True


def test_heartbeats_are_written_only_at_the_first_step_and_while_a_capture_listens(
    scenario: Scenario,
) -> None:
    # No capture yet: each rank wrote its heartbeat at its first step and once more a poll interval
    # later, with its pace, while the run made many more steps.
    assert scenario.quiet_step >= 60
    assert [(h["rank"], h["writes"], h["ended"]) for h in scenario.quiet] == [
        (0, 2, ""),
        (1, 2, ""),
    ]
    assert all(
        1 < h["step"] < scenario.quiet_step - 10 and h["steps_per_s"] > 0 for h in scenario.quiet
    )
    # During the captures they wrote fresh heartbeats: the last ones are past the second window.
    second = json.loads(scenario.second.stdout)["request"]
    after = scenario.after_captures
    assert [h["rank"] for h in after] == [0, 1]
    assert all(h["writes"] >= 4 and h["step"] >= second["last_step"] for h in after), after
    assert all(h["steps_per_s"] > 0 for h in after)
    # Nobody listens any more: many steps, no write.
    assert scenario.later_steps >= 40
    assert [(h["writes"], h["step"]) for h in scenario.later] == [
        (h["writes"], h["step"]) for h in after
    ]


def test_capture_of_a_run_that_stopped_stepping_exits_3_after_the_timeout(
    scenario: Scenario,
) -> None:
    result = scenario.stalled
    assert result.returncode == 3, result.stderr
    assert 3 <= scenario.stalled_s < 20
    assert result.stdout == ""
    lines = _lines(result.stderr)  # what it asked for, and one line saying why nothing came
    assert len(lines) == 2 and lines[0].startswith("stepcli: asked run"), lines
    assert lines[1].startswith(
        "stepcli: nothing captured: the run stopped stepping: its last step ("
    ), lines
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_capture_stopped_by_a_signal_withdraws_its_ping(scenario: Scenario, sig: str) -> None:
    pinged, status, stderr, left = scenario.interrupted[sig]
    assert pinged  # it was waiting, its ping in requests.json ...
    assert status != 0 and "Traceback" not in stderr, stderr
    assert not left  # ... and took it back: the processes stop writing heartbeats


def test_the_run_summary_lists_both_captured_windows(scenario: Scenario) -> None:
    assert scenario.run_status == 0, scenario.run_stderr
    traces = trace_files(scenario.out)
    # two windows x two ranks; the request made while it idled recorded nothing
    assert len(traces) == 4
    for trace in traces:
        # listed in the summary's trace rows
        assert trace.name in scenario.run_stderr.replace("\n", "")
    second = json.loads(scenario.second.stdout)["request"]
    assert sorted({tuple(profiler_steps(t)) for t in traces})[-1] == (
        second["first_step"],
        second["last_step"],
    )
    assert "no `stepcli capture`" not in scenario.run_stderr
    assert scenario.summary["on_demand"] is True
    windows = scenario.summary["windows"]
    assert sorted((w["worker"], w["first_step"]) for w in windows) == sorted(
        (f"rank{r}", first) for r in (0, 1) for first in {w["first_step"] for w in windows}
    )
    captures = {w["capture"] for w in windows}
    assert len(captures) == 2 and json.loads(scenario.second.stdout)["request"]["id"] in captures


def test_the_run_leaves_no_request_behind(scenario: Scenario) -> None:
    control = list(scenario.out.glob(".stepcli/*/control"))
    assert len(control) == 1
    assert (control[0].stat().st_mode & 0o777) == 0o700  # only the run's owner can ask
    assert not (control[0] / "requests.json").exists() and not (control[0] / "run.json").exists()


def test_capture_after_the_run_ended_exits_2(scenario: Scenario) -> None:
    result = scenario.after_end
    assert result.returncode == 2
    assert _lines(result.stderr) == [
        f"stepcli: error: {scenario.out}: no running stepcli run writes to this folder"
    ]


@pytest.mark.parametrize("target", ["empty", "missing", "pid"])
def test_capture_of_something_that_is_not_a_running_run_exits_2(
    tmp_path: Path, target: str
) -> None:
    (tmp_path / "empty").mkdir()
    arg = str(os.getpid()) if target == "pid" else str(tmp_path / target)
    result = run_stepcli("capture", arg, "--timeout", "1", timeout=30)
    assert result.returncode == 2
    assert len(_lines(result.stderr)) == 1 and result.stderr.startswith("stepcli: error: "), (
        result.stderr
    )
    assert result.stdout == ""


def test_on_demand_refuses_schedule_flags(tmp_path: Path) -> None:
    script = write_script(tmp_path, "noop.py", "print('ran')\n")
    result = run_stepcli(
        "run", "--on-demand", "--active", "2", "-o", tmp_path / "out", script, timeout=30
    )
    assert result.returncode == 2
    assert "--on-demand opens no scheduled window: drop --active" in result.stderr
    assert not (tmp_path / "out").exists() and "ran" not in result.stdout


def test_the_programs_own_profiler_wins_with_a_line_and_a_scheduled_run_answers_too(
    tmp_path: Path,
) -> None:
    script = write_script(
        tmp_path,
        "own.py",
        """
        import sys
        import time
        from pathlib import Path
        import torch

        control = Path(sys.argv[1])
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            time.sleep(0.05)

        with torch.profiler.profile() as prof:
            while not (control / "own_done").exists():
                step()
                prof.step()
                if prof.step_num == 5:
                    (control / "ready").touch()
        prof.export_chrome_trace(str(control / "own.json"))
        (control / "own_exported").touch()
        while not (control / "end").exists():
            step()
    """,
    )
    control, log, out = tmp_path / "control", tmp_path / "run.log", tmp_path / "out"
    control.mkdir()
    # a scheduled run: its window falls while the program's profiler runs
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepcli",
                "run",
                "--wait",
                "2",
                "--active",
                "1",
                "-o",
                str(out),
                str(script),
                str(control),
            ],
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_for(control / "ready", 120, proc, log)
        refused = run_stepcli("capture", out, "--timeout", "20", timeout=60)
        (control / "own_done").touch()
        _wait_for(control / "own_exported", 60, proc, log)
        after = run_stepcli("capture", out, "--warmup", "0", "--active", "1", timeout=60)
    finally:
        (control / "own_done").touch()
        (control / "end").touch()
        assert proc.wait(timeout=60) == 0, log.read_text()
    assert refused.returncode == 3, refused.stderr
    lines = _lines(refused.stderr)
    assert len(lines) == 2 and refused.stdout == "", lines
    assert re.fullmatch(
        r"stepcli: nothing captured: \S+_\d+: the program's own profiler is running .*", lines[1]
    ), lines
    own = load_trace(control / "own.json")["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in own)  # the program's own trace is intact
    assert after.returncode == 0, after.stderr + log.read_text()
    traces = trace_files(out)
    # no empty trace from the refused request
    assert len(traces) == 1 and str(traces[0]) in after.stdout
    step = int(after.stdout.split()[2])
    assert profiler_steps(traces[0]) == [step]


# -- pure parts
# --------------------------------------------------------------------------------------------------
def test_window_schedule_adds_on_demand_windows_to_the_run_schedule() -> None:
    windows = WindowSchedule(None)
    assert windows.next_profiled_step(0) is None
    windows.add(10, 11, 12)
    assert [windows.action(s) for s in range(9, 14)] == [
        NONE,
        WARMUP,
        RECORD,
        RECORD_AND_SAVE,
        NONE,
    ]
    assert windows.starts_cycle(10) and not windows.starts_cycle(11)
    assert windows.next_profiled_step(3) == 10 and windows.next_profiled_step(11) == 11
    assert windows.first_busy(0, 9) is None and windows.first_busy(5, 20) == 10
    windows.forget_before(13)
    assert windows.next_profiled_step(0) is None

    scheduled = WindowSchedule(Schedule(wait=1, warmup=1, active=2))
    scheduled.add(20, 20, 20)
    assert [scheduled.action(s) for s in (1, 3, 20)] == [WARMUP, RECORD_AND_SAVE, RECORD_AND_SAVE]
    assert scheduled.next_profiled_step(0) == 1 and scheduled.next_profiled_step(4) == 20


def _process(
    step: int, rate: float, age: float, now: float = 1000.0, ended: str = ""
) -> dict[str, object]:
    return {"step": step, "steps_per_s": rate, "time": now - age, "ended": ended}


def test_plan_starts_past_the_fastest_rank_by_the_polling_margin() -> None:
    now = 1000.0
    request = plan_request(
        [_process(100, 10.0, 0.5), _process(98, 10.0, 0.2)], [], None, 0, 1, 2, now
    )
    # rank at 100 + 0.5 s x 10 steps/s = 105, then 1.5 s of steps (15) and 2 spare steps
    assert (request.open_at, request.first_step, request.last_step) == (122, 123, 124)
    waited = plan_request([_process(100, 10.0, 0.5)], [], None, 5, 0, 3, now)
    assert (waited.open_at, waited.first_step, waited.last_step) == (127, 127, 129)
    stalled = plan_request([_process(100, 10.0, 60.0)], [], None, 0, 1, 1, now)
    assert stalled.open_at == 100 + 15 + 2  # an idle process is not projected forward


def test_plan_avoids_scheduled_windows_and_other_captures() -> None:
    now = 1000.0
    # cycles touch steps 20-23, 44-47, ...
    schedule = Schedule(wait=20, warmup=1, active=3, repeat=0)
    request = plan_request([_process(0, 10.0, 0.0)], [], schedule, 0, 1, 2, now)
    assert request.open_at == 25  # 17 would run into the cycle at 20-23
    other = {"open_at": 30, "last_step": 35}
    after = plan_request([_process(20, 10.0, 0.0)], [other], None, 0, 1, 2, now)
    assert after.open_at == 38
    with pytest.raises(Exception, match="no room"):
        plan_request(
            [_process(0, 10.0, 0.0)],
            [],
            Schedule(wait=0, warmup=1, active=1, repeat=0),
            0,
            1,
            2,
            now,
        )


def _control(tmp_path: Path, processes: list[dict[str, Any]]) -> Path:
    folder = tmp_path / ".stepcli" / "run1" / "control"
    folder.mkdir(parents=True)
    folder.chmod(0o700)  # as the launcher makes it: private
    (folder / "run.json").write_text(json.dumps({"run_id": "run1"}))
    for index, process in enumerate(processes):
        (folder / f"proc.host.{index}.json").write_text(json.dumps(process))
    return folder


def test_a_rank_that_hangs_does_not_hold_up_the_others(tmp_path: Path) -> None:
    now = time.time()
    request = CaptureRequest("r1", 10, 11, 12)
    saved = {
        "status": "saved",
        "first_step": 11,
        "last_step": 12,
        "trace": "/t/rank0.json",
        "bytes": 5,
        "complete": True,
    }
    folder = _control(
        tmp_path,
        [
            {
                "rank": 0,
                "worker": "rank0",
                "step": 14,
                "time": now,
                "steps_per_s": 10.0,
                "responses": {"r1": saved},
            },
            {
                "rank": 1,
                "worker": "rank1",
                "step": 9,
                "time": now - 30,
                "steps_per_s": 10.0,
                "responses": {"r1": {"status": "accepted"}},
            },
            {
                "rank": 2,
                "worker": "rank2",
                "step": 3,
                "time": now - 60,
                "steps_per_s": 10.0,
                "ended": "exit",
                "responses": {},
            },
        ],
    )
    run = LiveRun("run1", str(folder), None)
    start = time.monotonic()
    processes, stop = wait_for_answers(run, request, timeout_at=now + 30)
    assert time.monotonic() - start < 1 and stop == ""
    outcome = _outcome(processes, request, stop, 30, time.time())
    assert [t["worker"] for t in outcome["traces"]] == ["rank0"]
    assert [(m["worker"], m["reason"].split(" (")[0]) for m in outcome["not_captured"]] == [
        ("rank1", "stopped stepping at step 9")
    ]  # rank2 ended before the request: not part of it


def test_requests_of_captures_that_died_are_dropped(tmp_path: Path) -> None:
    folder = _control(tmp_path, [])
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    mine = dict(CaptureRequest("a", 1, 2, 3).to_dict())
    gone = dict(CaptureRequest("b", 5, 6, 7).to_dict(), pid=int(dead.stdout))
    elsewhere = dict(
        CaptureRequest("c", 8, 9, 9).to_dict(), host="another-node", pid=int(dead.stdout)
    )
    (folder / "requests.json").write_text(
        json.dumps({"run_id": "run1", "requests": [mine, gone, elsewhere]})
    )
    requests = _read_requests(str(folder), "run1")
    assert [r["id"] for r in requests if _still_wanted(r)] == ["a", "c"]
    # ... but the dead capture's window is still avoided: processes may already be recording it
    here = [r for r in requests if r["id"] != "c"]  # a: steps 1-3, b (dead): 5-7
    now = time.time()
    assert plan_request([_process(0, 1.0, 0.0, now=now)], here[:1], None, 0, 0, 1, now).open_at == 6
    assert plan_request([_process(0, 1.0, 0.0, now=now)], here, None, 0, 0, 1, now).open_at == 10
    assert _read_requests(str(folder), "another-run") == []  # a request names its run


def test_the_tracker_polls_by_time_not_by_step() -> None:
    ticks = iter(range(0, 10**12, 100_000_000))  # every clock read is 0.1 s later
    tracker = StepTracker(clock=lambda: next(ticks))
    woken: list[int] = []
    tracker.set_listener(lambda step: (woken.append(step) or NONE, NEVER), wake_at=NEVER)
    polled: list[int] = []

    def poll(step: int) -> None:
        polled.append(step)
        if step == 1:
            tracker.wake_at_step(4)  # a window asked for on demand opens at step 4

    tracker.set_poller(poll, interval_s=1.0)
    for _ in range(30):
        tracker.step("opt")
    assert polled[0] == 1  # the first step boundary, then at most once a second of clock time
    # 30 steps of about 0.1 s: about 3 s, so 3 or 4 polls, each about 10 steps apart
    assert all(b - a >= 8 for a, b in zip(polled, polled[1:])) and 3 <= len(polled) <= 4, polled
    assert woken == [4]
    assert len(tracker.durations_ns) == 30
    tracker.set_poller(None)
    before = len(polled)
    tracker.step("opt")
    assert len(polled) == before


def _listening_process(tmp_path: Path, recorder: Any = None) -> tuple[OnDemand, Path]:
    """A process's side of the protocol on a real tracker, with no recorder (requests would be
    refused)."""
    config = AgentConfig(
        run_id="run1", out_dir=str(tmp_path), launcher_pid=0, on_demand=True, quiet=True
    )
    folder = Path(ondemand.open_control(str(tmp_path), "run1", {"run_id": "run1"}))
    agent = SimpleNamespace(
        config=config,
        enabled=True,
        foreign=set(),
        pid=os.getpid(),
        recorder=recorder,
        tracker=StepTracker(),
    )
    process = OnDemand(agent)  # type: ignore[arg-type]
    assert process.active
    return process, folder / f"proc.{process.host}.{os.getpid()}.json"


def test_a_process_writes_its_heartbeat_only_while_a_capture_listens(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process, path = _listening_process(tmp_path)
    requests = path.parent / "requests.json"

    def beat() -> tuple[int, int, list[str]]:
        document = json.loads(path.read_text())
        return document["writes"], document["step"], document["pings"]

    process.poll(1)
    assert beat() == (1, 1, [])  # the first step: capture can find the process
    process.poll(2)
    assert beat() == (2, 2, [])  # the next poll: its pace
    for step in range(3, 50):
        process.poll(step)
    assert beat() == (2, 2, [])  # nobody listens: no write
    reads: list[str] = []
    read = controlfiles.read_bounded
    monkeypatch.setattr(
        controlfiles,
        "read_bounded",
        lambda fd, limit, name: reads.append(name) or read(fd, limit, name),
    )
    atomic_write_json(
        str(requests), {"run_id": "run1", "requests": [], "pings": [{"id": "p1", "lease_s": 600}]}
    )
    for step in range(50, 55):
        process.poll(step)
    assert beat() == (7, 54, ["p1"])  # heard: a fresh heartbeat at every poll
    assert reads == ["requests.json"]  # read once: the file did not change since
    requests.unlink()  # the capture withdrew its ping
    for step in range(55, 60):
        process.poll(step)
    assert beat() == (7, 54, ["p1"])
    # A ping nobody renews (its capture was killed) lapses after its lease.
    atomic_write_json(
        str(requests), {"run_id": "run1", "requests": [], "pings": [{"id": "p2", "lease_s": 1}]}
    )
    process.poll(60)
    assert beat() == (8, 60, ["p2"])
    time.sleep(1.1)
    process.poll(61)
    assert beat() == (8, 60, ["p2"])
    # Another run's ping is not obeyed.
    atomic_write_json(
        str(requests), {"run_id": "run0", "requests": [], "pings": [{"id": "p3", "lease_s": 600}]}
    )
    process.poll(62)
    assert beat() == (8, 60, ["p2"])
    process.finish("exit")  # and it says when it ends
    assert beat() == (9, 0, ["p2"]) and json.loads(path.read_text())["ended"] == "exit"


def test_a_request_file_that_could_not_be_read_is_read_again_at_the_next_poll(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process, path = _listening_process(tmp_path)
    requests = path.parent / "requests.json"
    process.poll(1)
    # GIVEN a capture's ping, and a shared file system that fails the first read of it
    atomic_write_json(
        str(requests), {"run_id": "run1", "requests": [], "pings": [{"id": "p1", "lease_s": 600}]}
    )
    read, failures = controlfiles.read_bounded, [1]

    def flaky(fd: int, limit: int, name: str) -> bytes:
        if failures:
            failures.pop()
            raise OSError(5, "Input/output error")
        return read(fd, limit, name)

    monkeypatch.setattr(controlfiles, "read_bounded", flaky)
    process.poll(2)
    assert json.loads(path.read_text())["pings"] == []
    # WHEN the next poll comes (the file unchanged) THEN it reads it again and hears the ping
    process.poll(3)
    assert json.loads(path.read_text())["pings"] == ["p1"]


def test_capture_waits_for_fresh_heartbeats_but_not_for_ended_or_quiet_processes(
    tmp_path: Path,
) -> None:
    now = time.time()
    ping = Ping("p1", now)
    folder = _control(
        tmp_path,
        [
            {
                "rank": 0,
                "step": 500,
                "time": now,
                "steps_per_s": 10.0,
                "pings": ["p1"],
                "ended": "",
            },
            {
                "rank": 2,
                "step": 3,
                "time": now - 60,
                "steps_per_s": 0.0,
                "pings": [],
                "ended": "exit",
            },
        ],
    )
    run = LiveRun("run1", str(folder), None)
    renewals: list[float] = []
    start = time.monotonic()
    assert len(await_heartbeats(run, ping, now + 30, lambda: renewals.append(time.time()))) == 2
    assert time.monotonic() - start < 1  # every process that has not ended answered
    # A process quiet since an earlier capture: waited for a poll interval plus a few of its steps,
    # then not.
    quiet = {
        "rank": 1,
        "step": 200,
        "time": now - 3600,
        "steps_per_s": 10.0,
        "pings": ["p0"],
        "ended": "",
    }
    (folder / "proc.host.9.json").write_text(json.dumps(quiet))
    ping = Ping("p1", time.time())
    start = time.monotonic()
    processes = await_heartbeats(run, ping, time.time() + 30, lambda: renewals.append(time.time()))
    assert 2.0 <= time.monotonic() - start < 4.5 and len(processes) == 3
    assert len(renewals) >= 5  # the ping is kept alive while capture waits
    # ... and when it answers, capture stops waiting at once.
    ping = Ping("p2", time.time())
    answer = dict(quiet, pings=["p2"], time=time.time() + 0.5, step=530)
    timer = threading.Timer(
        0.5, lambda: atomic_write_json(str(folder / "proc.host.9.json"), answer)
    )
    timer.start()
    (folder / "proc.host.0.json").write_text(
        json.dumps(dict(quiet, rank=0, pings=["p2"], time=time.time()))
    )
    start = time.monotonic()
    processes = await_heartbeats(run, ping, time.time() + 30, lambda: None)
    timer.join()
    assert 0.4 <= time.monotonic() - start < 1.5 and max(p["step"] for p in processes) == 530


def test_a_run_quiet_since_before_capture_asked_is_said_to_have_stopped_stepping() -> None:
    now = time.time()
    ping = Ping("p1", now - 20)
    request = CaptureRequest("r1", 210, 211, 212)
    quiet = [
        {
            "rank": r,
            "worker": f"rank{r}",
            "step": 1,
            "time": now - 3600,
            "steps_per_s": 0.0,
            "pings": [],
            "ended": "",
        }
        for r in (0, 1)
    ]
    outcome = _outcome(quiet, request, "timeout", 20, now, ping)
    assert outcome["traces"] == [] and outcome["not_captured"] == []
    assert (
        outcome["reason"]
        == "the run stopped stepping: its last step (at least 1) came before this capture asked, "
        "20 s ago"
    )
    # then stopped
    heard = [dict(p, pings=["p1"], step=200, steps_per_s=10.0, time=now - 15) for p in quiet]
    assert (
        _outcome(heard, request, "timeout", 20, now, ping)["reason"]
        == "the run stopped stepping: its last step (200) was 15 s ago"
    )


def test_a_capture_pings_renews_and_withdraws_leaving_no_file(tmp_path: Path) -> None:
    folder = _control(tmp_path, [])
    run = LiveRun("run1", str(folder), None)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    # a capture killed before it could withdraw
    gone = dict(Ping("gone", 0.0).to_dict(), pid=int(dead.stdout))
    elsewhere = dict(Ping("far", 0.0).to_dict(), host="another-node")
    request = CaptureRequest("r1", 5, 6, 7)
    atomic_write_json(
        str(folder / "requests.json"),
        {"run_id": "run1", "requests": [request.to_dict()], "pings": [gone, elsewhere]},
    )
    ping = Ping("mine", time.time())
    _ping(run, ping)
    requests, pings = _read_control(str(folder), "run1")
    assert [r["id"] for r in requests] == ["r1"] and [p["id"] for p in pings] == ["far", "mine"]
    first = pings[-1]["renewed_at"]
    time.sleep(0.01)
    _ping(run, ping)  # renewed: a new document, so every process restarts its lease
    pings = _read_control(str(folder), "run1")[1]
    assert [p["id"] for p in pings] == ["far", "mine"] and pings[-1]["renewed_at"] > first
    _withdraw(run, ping, request)
    assert _read_control(str(folder), "run1") == ([], [elsewhere])
    _withdraw(run, Ping("far", 0.0), None)
    # nobody asks: the processes' check finds no file
    assert not (folder / "requests.json").exists()
    (folder / "run.json").unlink()  # the run ended: nothing brings requests.json back
    _ping(run, ping)
    assert not (folder / "requests.json").exists()


# -- a single-process job, attacked and asked badly
# ---------------------------------------------------------------- Steps until <control>/end
# appears, keeping the number of steps made in <control>/step.
SOLO_LOOP = """
    import sys
    import time
    from pathlib import Path
    import torch

    control = Path(sys.argv[1])
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while not (control / "end").exists():
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        step += 1
        (control / "step.tmp").write_text(str(step))
        (control / "step.tmp").replace(control / "step")
        time.sleep(0.05)
"""
_SAFETY_AS_BYTES = 4 << 30  # a regression that reads /dev/zero fails the test, not the machine


@dataclass
class Solo:
    out: Path
    pid: int  # the stepping process
    run_status: int
    run_stderr: str
    summary: dict[str, Any]
    # attack -> (steps made while it lasted, RSS growth in bytes)
    attacks: dict[str, tuple[int, int]]
    forged: subprocess.CompletedProcess[str]  # a capture after forged requests
    forged_answers: dict[str, Any]  # the process's answers to the forged requests
    gave_up: subprocess.CompletedProcess[str]  # --active 1000 --timeout 3
    gave_up_answer: dict[str, Any]  # the process's last answer to that request
    by_pid: subprocess.CompletedProcess[str]  # capture PROGRAM_PID --active 2
    not_ours: dict[str, subprocess.CompletedProcess[str]]  # capture of pids that are not the run's


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _answer_of(out: Path, rid: str, pending: tuple[str, ...], deadline_s: float) -> dict[str, Any]:
    """The process's answer to request `rid`, once it is no longer one of `pending` (or the deadline
    passed)."""
    deadline = time.monotonic() + deadline_s
    answer: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for beat in out.glob(".stepcli/*/control/proc.*.json"):
            try:
                answer = json.loads(beat.read_text())["responses"].get(rid) or {}
            except (OSError, ValueError, KeyError):
                continue
        if answer and answer.get("status") not in pending:
            return answer
        time.sleep(0.1)
    return answer


def _attack(
    control: Path, steps: Path, pid: int, proc: subprocess.Popen[bytes], log: Path, plant: Any
) -> tuple[int, int]:
    """Plant something in the control folder while the job steps; (steps made over 3 s of polls, RSS
    growth)."""
    before, rss = _wait_for_step(steps, 1, proc, log), _rss(pid)
    plant()
    # 60 steps of >= 50 ms: 3 polls at least
    made = _wait_for_step(steps, before + 60, proc, log) - before
    return made, _rss(pid) - rss


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Solo]:
    import resource

    tmp = tmp_path_factory.mktemp("solo")
    script = write_script(tmp, "solo.py", SOLO_LOOP)
    out, steps, log = tmp / "out", tmp / "steps", tmp / "run.log"
    steps.mkdir()
    argv = [
        sys.executable,
        "-m",
        "stepcli",
        "run",
        "--on-demand",
        "-o",
        str(out),
        "--json",
        str(tmp / "run.json"),
    ]

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (_SAFETY_AS_BYTES, _SAFETY_AS_BYTES))

    with open(log, "w") as handle:
        proc = subprocess.Popen(
            [*argv, str(script), str(steps)],
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=limit_memory,
        )
    try:
        _wait_for_step(steps, 20, proc, log)
        control = next(out.glob(".stepcli/*/control"))
        pid = int(next(control.glob("proc.*.json")).name.split(".")[-2])
        requests = control / "requests.json"
        attacks = {
            "dev_zero_link": _attack(
                control, steps, pid, proc, log, lambda: requests.symlink_to("/dev/zero")
            ),
            "fifo": _attack(
                control, steps, pid, proc, log, lambda: (requests.unlink(), os.mkfifo(requests))
            ),
        }
        requests.unlink()
        moved = control.with_name("control.moved")

        def swap_folder() -> None:  # what another user who can write to -o could do
            control.rename(moved)
            control.mkdir(mode=0o700)
            (control / "requests.json").symlink_to("/dev/zero")

        attacks["swapped_folder"] = _attack(control, steps, pid, proc, log, swap_folder)
        shutil.rmtree(control)
        attacks["folder_link"] = _attack(
            control, steps, pid, proc, log, lambda: control.symlink_to("/dev/zero")
        )
        control.unlink()
        moved.rename(control)
        # Forged requests: a list as id, steps in the wrong order; then a real capture must still
        # work.
        forged = [
            {"id": ["x"], "open_at": 1, "first_step": 2, "last_step": 3},
            {"id": "backwards", "open_at": 10**6, "first_step": 10**6 + 5, "last_step": 10**6 + 1},
        ]
        atomic_write_json(
            str(requests), {"run_id": control.parent.name, "requests": forged, "pings": []}
        )
        forged_answers = {"backwards": _answer_of(out, "backwards", (), 30)}
        forged_capture = run_stepcli(
            "capture", out, "--warmup", "0", "--active", "1", "--timeout", "60", timeout=120
        )
        gave_up = run_stepcli(
            "capture", out, "--active", "1000", "--timeout", "3", "--json", timeout=120
        )
        rid = json.loads(gave_up.stdout)["request"]["id"] if gave_up.stdout else ""
        gave_up_answer = _answer_of(out, rid, ("accepted",), 30)
        by_pid = run_stepcli("capture", str(pid), "--active", "2", "--timeout", "60", timeout=120)
        not_ours = {
            # the run's ancestor
            "pytest": run_stepcli("capture", str(os.getpid()), "--timeout", "5", timeout=60),
            "init": run_stepcli("capture", "1", "--timeout", "5", timeout=60),
        }
        (steps / "end").touch()
        status = proc.wait(timeout=120)
    finally:
        (steps / "end").touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    yield Solo(
        out,
        pid,
        status,
        log.read_text(),
        json.loads((tmp / "run.json").read_text()),
        attacks,
        forged_capture,
        forged_answers,
        gave_up,
        gave_up_answer,
        by_pid,
        not_ours,
    )


@pytest.mark.parametrize("attack", ["dev_zero_link", "fifo", "swapped_folder", "folder_link"])
def test_a_swapped_control_file_neither_blocks_nor_bloats_the_job(solo: Solo, attack: str) -> None:
    made, growth = solo.attacks[attack]
    # it kept stepping (a FIFO opened blocking would have stopped it at the next poll)
    assert made >= 60
    assert growth < 64 << 20, growth  # reading /dev/zero whole grows by gigabytes
    assert solo.run_status == 0, solo.run_stderr
    peaks = [p["peak_rss_bytes"] for p in solo.summary["processes"]]
    assert len(peaks) == 1 and peaks[0] < 1 << 30, peaks  # not even for an instant


def test_a_refused_control_file_is_said_once(solo: Solo) -> None:
    lines = [line for line in _lines(solo.run_stderr) if "ignoring the control folder's" in line]
    assert [line.split("folder's ", 1)[1] for line in lines] == [
        "requests.json is a link, not a regular file",
        "requests.json is not a regular file (a FIFO or a device?)",
        # one line each, however many polls met it; a folder put in the control folder's place is
        # never seen
    ], lines


def test_forged_requests_are_refused_once_and_capture_still_works(solo: Solo) -> None:
    answer = solo.forged_answers["backwards"]
    assert answer["status"] == "refused" and answer["reason"].startswith(
        "malformed request: it needs open_at <="
    )
    ignored = [line for line in _lines(solo.run_stderr) if "malformed request" in line]
    assert ignored == [
        "stepcli: on-demand capture: ignoring a malformed request: its id is not a string of 1 to "
        "64 letters, digits, '-', '_' or '.'",
        "stepcli: on-demand capture: refusing a malformed request: it needs open_at <= first_step "
        "<= last_step",
    ]
    # capture was not disabled for the rest of the run
    assert solo.forged.returncode == 0, solo.forged.stderr
    assert "disabled" not in solo.run_stderr


def test_a_capture_that_gives_up_leaves_no_window_recording(solo: Solo) -> None:
    assert solo.gave_up.returncode == 3, solo.gave_up.stderr
    assert solo.gave_up_answer == dict(
        solo.gave_up_answer,
        status="not_recorded",
        reason="withdrawn: the capture that asked for it gave up",
    )
    request = json.loads(solo.gave_up.stdout)["request"]
    # dropped, not saved
    assert all(w["first_step"] != request["first_step"] for w in solo.summary["windows"])
    # A window open when its capture gave up was closed unsaved, and the notes say so; on a loaded
    # machine the program may not have reached it yet (withdrawn from the schedule before it opened:
    # nothing to say)
    withdrawn = [note for note in solo.summary["notes"] if "withdrawn" in note]
    at, open_at = solo.gave_up_answer["at_step"], request["warmup_from"]
    if at > open_at:
        assert len(withdrawn) == 1 and withdrawn[0].endswith(
            f"was not saved ({ondemand.WITHDRAWN})"
        ), withdrawn
    elif at < open_at:
        assert withdrawn == [], withdrawn


@pytest.mark.parametrize(
    "bound", [("--active", "1001"), ("--wait", "100001"), ("--warmup", "1001")]
)
def test_capture_bounds_are_a_usage_error(tmp_path: Path, bound: tuple[str, str]) -> None:
    result = run_stepcli("capture", tmp_path, *bound, timeout=30)
    assert result.returncode == 2
    assert _lines(result.stderr) == [
        f"stepcli: error: Invalid value for '{bound[0]}': {bound[1]} is not in the range "
        f"{0 if bound[0] != '--active' else 1}<=x<={1000 if bound[0] != '--wait' else 100000}. "
        "(see 'stepcli capture --help')"
    ]


def test_capture_of_a_process_of_the_run_works_and_of_any_other_exits_2(solo: Solo) -> None:
    assert solo.by_pid.returncode == 0, solo.by_pid.stderr
    for name, result in solo.not_ours.items():
        assert result.returncode == 2, (name, result.stderr)
        lines = _lines(result.stderr)
        assert len(lines) == 1, lines
        # Init's environment may not be readable (in a container, or to another user): said so, not
        # guessed.
        assert lines[0].startswith(
            f"stepcli: error: {result.args[-3]}: not a process of a stepcli run"
        ) or (
            name == "init" and "a process of another user (root)" in lines[0] and os.getuid() != 0
        ), lines
        assert "asked run" not in result.stderr


def test_an_on_demand_window_gets_a_folder_of_its_own(solo: Solo) -> None:
    traces = trace_files(solo.out)
    windows = sorted({t.parent.name for t in traces})
    # the forged-requests capture and the one by pid
    assert len(traces) == 2 and len(windows) == 2, traces
    for trace in traces:
        assert (
            trace.parent.parent == solo.out
            and trace.parent.name == f"window-step{profiler_steps(trace)[0]}"
        )
    hta = next(line for line in _lines(solo.run_stderr) if "TraceAnalysis(trace_dir=" in line)
    # one window, not -o
    assert any(f'{window}\\"' in hta or f'{window}"' in hta for window in windows), hta


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0 or not shutil.which("setpriv"),
    reason="needs root",
)
@pytest.mark.parametrize("config", [True, False])
def test_capture_of_another_users_process_says_whose_it_is(tmp_path: Path, config: bool) -> None:
    env = stepcli_env(
        {"STEPCLI_CONFIG": json.dumps({"out_dir": str(tmp_path), "run_id": "r", "launcher_pid": 1})}
    )
    if not config:
        env.pop("STEPCLI_CONFIG")
    sleeper = subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ],
        env=env,
    )
    try:
        result = run_stepcli("capture", str(sleeper.pid), "--timeout", "5", timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == 2
    lines = _lines(result.stderr)
    assert len(lines) == 1, lines
    if config:  # a run of another user, named as such
        assert re.fullmatch(
            rf"stepcli: error: {sleeper.pid}: a stepcli run of another user \(\S+\); only its "
            rf"owner can capture it",
            lines[0],
        )
    else:
        assert lines[0].startswith(
            f"stepcli: error: {sleeper.pid}: not a process of a stepcli run"
        ), lines


class _Recorder(SimpleNamespace):
    """What OnDemand asks of the recorder, without torch: no window open unless `prof` is set."""

    def __init__(self) -> None:
        super().__init__(disabled=False, windows=[], notes=[], prof=None, dropped=[])

    def _profiler_already_running(self) -> bool:
        return False

    def drop(self, reason: str) -> None:
        self.dropped.append(reason)
        self.prof = None


def _ask(requests: Path, *entries: Any) -> None:
    atomic_write_json(str(requests), {"run_id": "run1", "requests": list(entries), "pings": []})


def _answers(path: Path) -> dict[str, Any]:
    return {
        rid: (a["status"], a.get("reason", ""))
        for rid, a in json.loads(path.read_text())["responses"].items()
    }


def test_a_forged_request_is_refused_and_said_once_and_capture_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    process, path = _listening_process(tmp_path, _Recorder())
    requests = path.parent / "requests.json"
    forged = [
        {"id": ["x"], "open_at": 1, "first_step": 2, "last_step": 3},  # an unhashable id
        {"id": "back", "open_at": 20, "first_step": 25, "last_step": 21},
        {"id": "huge", "open_at": 20, "first_step": 21, "last_step": 10**9},
    ]
    _ask(requests, *forged)
    process.poll(1)
    _ask(requests, *forged, {"id": "also-back", "open_at": 30, "first_step": 35, "last_step": 31})
    process.poll(2)
    assert process.active and process.agent.tracker._poller is not None  # type: ignore[attr-defined]
    answers = _answers(path)
    assert answers["back"] == (
        "refused",
        "malformed request: it needs open_at <= first_step <= last_step",
    )
    assert answers["huge"] == ("refused", "malformed request: it records more than 1000 steps")
    err = capfd.readouterr().err.splitlines()
    assert err == [
        "stepcli: on-demand capture: ignoring a malformed request: its id is not a string of 1 to "
        "64 letters, digits, '-', '_' or '.'",
        "stepcli: on-demand capture: refusing a malformed request: it needs open_at <= first_step "
        "<= last_step",
        "stepcli: on-demand capture: refusing a malformed request: it records more than 1000 steps",
    ]  # once each, though the file was read twice and a second request was backwards too
    _ask(requests, {"id": "good", "open_at": 10, "first_step": 11, "last_step": 12})
    process.poll(3)
    assert _answers(path)["good"] == ("accepted", "")


def test_a_withdrawn_request_drops_its_window(tmp_path: Path) -> None:
    recorder = _Recorder()
    process, path = _listening_process(tmp_path, recorder)
    requests = path.parent / "requests.json"
    _ask(requests, {"id": "later", "open_at": 50, "first_step": 51, "last_step": 52})
    _ask(
        requests,
        {"id": "now", "open_at": 10, "first_step": 11, "last_step": 40},
        *json.loads(requests.read_text())["requests"],
    )
    process.poll(1)
    assert _answers(path) == {"now": ("accepted", ""), "later": ("accepted", "")}
    recorder.prof = object()  # the window of "now" records
    # "now" withdrawn
    _ask(requests, {"id": "later", "open_at": 50, "first_step": 51, "last_step": 52})
    process.poll(20)
    assert _answers(path)["now"] == (
        "not_recorded",
        "withdrawn: the capture that asked for it gave up",
    )
    assert recorder.dropped == ["withdrawn: the capture that asked for it gave up"]
    assert process.schedule.windows == [(50, 51, 52)] and list(process.pending) == ["later"]
    requests.unlink()  # the last capture gave up too: a window not open yet is only forgotten
    process.poll(21)
    assert _answers(path)["later"][0] == "not_recorded" and process.schedule.windows == []
    assert len(recorder.dropped) == 1


def test_a_capture_the_run_outpaced_asks_again_further_ahead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job much faster than its last heartbeat said (a loaded machine, a burst): the first
    placement is already behind it. The capture withdraws it and asks for later steps instead of
    giving up."""
    from stepcli.run.controldir import read_control
    from stepcli.run.live.capturewindow import capture_main

    folder = _control(tmp_path, [])
    atomic_write_json(
        str(folder / "run.json"),
        {
            "run_id": "run1",
            "launcher_pid": os.getpid(),
            "host": socket.gethostname(),
            "on_demand": True,
        },
    )
    done = threading.Event()
    asked: list[dict[str, Any]] = []

    def fast_process() -> None:  # says 10 steps/s, makes 400 steps/s
        step, responses = 100, {}
        while not done.is_set():
            step += 20
            requests, pings = read_control(str(folder), "run1")
            for request in requests:
                rid = request["id"]
                if rid in responses:
                    continue
                asked.append(request)
                if len(asked) == 1:
                    reason = f"already at step {step}, past step {request['first_step']}"
                    responses[rid] = {"status": "refused", "reason": reason, "late": True}
                else:
                    trace = str(tmp_path / "t.pt.trace.json")
                    first, last = request["first_step"], request["last_step"]
                    saved = {
                        "first_step": first,
                        "last_step": last,
                        "trace": trace,
                        "bytes": 1,
                        "complete": True,
                    }
                    responses[rid] = {"status": "saved", **saved}
            beat = {
                "rank": 0,
                "worker": "rank0",
                "host": "h",
                "pid": 1,
                "step": step,
                "time": time.time(),
            }
            beat.update(
                steps_per_s=10.0, ended="", pings=[p["id"] for p in pings], responses=responses
            )
            atomic_write_json(str(folder / "proc.h.1.json"), beat)
            time.sleep(0.05)

    thread = threading.Thread(target=fast_process, daemon=True)
    thread.start()
    try:
        status = capture_main(str(tmp_path), wait=0, warmup=1, active=2, timeout=30, as_json=False)
    finally:
        done.set()
        thread.join()
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert len(asked) == 2 and asked[1]["first_step"] > asked[0]["first_step"]
    lines = _lines(captured.err)
    assert lines[0].startswith("stepcli: asked run run1 to record steps ")
    assert lines[1].endswith(f"(the run was already past step {asked[0]['first_step']})"), lines
    assert f"steps {asked[1]['first_step']}-{asked[1]['last_step']}" in captured.out
    assert not (folder / "requests.json").exists()  # both requests withdrawn


def test_a_window_dropped_from_another_thread_is_closed_unsaved_at_the_main_threads_next_step() -> (
    None
):
    from stepcli.agent.recorder import Recorder

    class Profile:  # what the recorder calls on a torch profile object while closing it
        stopped = 0

        def stop(self) -> None:
            Profile.stopped += 1

    config = AgentConfig(run_id="run1", out_dir="/nonexistent", launcher_pid=0, quiet=True)
    recorder = Recorder(config, StepTracker(), set(), lambda: None)
    recorder.prof = Profile()
    worker = threading.Thread(
        target=recorder.drop, args=("withdrawn: the capture that asked for it gave up",)
    )
    worker.start()
    worker.join()
    # Kineto's session is the main thread's to stop
    assert recorder.prof is not None and Profile.stopped == 0
    # (the step after it paid for the stop: "after a window", not untouched)
    assert recorder.on_step(7)[0] == AFTER_WINDOW
    assert (
        recorder.prof is None
        and Profile.stopped == 1
        and recorder.windows == []
        and not recorder.disabled
    )
