"""A job that ends badly keeps everything it did: SIGTERM, SIGHUP, `--on-hang kill` (also with
`--on-demand`) and a program's own exit leave every process's final step log and whole-run record,
and the summary counts every step that ran, not the steps up to the last saved window."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import profiler_steps, run_stepcli, stepcli_env, trace_files, write_script

LIMIT_S = 180.0  # a generous bound for anything to appear on a busy 2-core machine

# Steps until it is killed; after each step it writes how many it has made (before the next one
# starts).
ENDLESS = """
    import os, sys, time
    from pathlib import Path
    import torch
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = Path(sys.argv[1])
    for i in range(10**9):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        done.with_suffix(".tmp").write_text(str(i + 1))
        os.replace(done.with_suffix(".tmp"), done)  # never seen half-written
        time.sleep(0.002)
"""

# 20 steps, then blocks in a sleep (its Python can run: a signal's handler runs at once).
STEPS_THEN_NAP = """
    import sys, time
    from pathlib import Path
    import torch
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(20):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    Path(sys.argv[1]).write_text("20")
    time.sleep(600)
"""


def _wait_until(condition: Any, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended (exit {proc.returncode}) before {what}:\n{log.read_text()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {LIMIT_S} s:\n{log.read_text()}")
        time.sleep(0.05)


def _steps_done(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _summary_line(stderr: str, name: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith(name + " "))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_stepcli_after_the_window_keeps_every_step(tmp_path: Path, signum: int) -> None:
    # GIVEN a program past its window (steps 2-4) by far WHEN stepcli alone gets SIGTERM or SIGHUP
    # (a scheduler)
    script = write_script(tmp_path, "endless.py", ENDLESS)
    done, log, out = tmp_path / "done", tmp_path / "log", tmp_path / "out"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepcli",
                "run",
                "-o",
                str(out),
                "--json",
                str(tmp_path / "run.json"),
            ]
            + [str(script), str(done)],
            cwd=tmp_path,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_until(lambda: _steps_done(done) >= 60, proc, log, "60 steps")
        proc.send_signal(signum)  # to the launcher alone, forwarded to the program
        proc.wait(timeout=LIMIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    made = _steps_done(done)
    stderr = log.read_text()
    # THEN the program died of that signal, and the summary counts every step it made (not the 5 of
    # the window)
    assert proc.returncode == 128 + signum, stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    assert made <= summary["steps"]["global"] <= made + 1, (made, summary["steps"], stderr)
    assert summary["step_time_ms"]["untouched"]["count"] >= made - 6, summary["step_time_ms"]
    (process,) = summary["processes"]
    assert process["exit"] == signal.Signals(signum).name
    (record,) = summary["step_record"]  # the whole-run record was written too
    assert made <= record["steps"] <= made + 1
    assert not [note for note in summary["notes"] if "never written" in note], summary["notes"]
    assert _summary_line(stderr, "steps").split()[1] == str(summary["steps"]["global"])
    assert any(line.startswith("whole run ") for line in stderr.splitlines()), stderr


# 12 steps, then SIGTERM to itself; a second SIGTERM lands as stepcli's save begins (torchrun
# forwarding the scheduler's signal to a worker that already got it from the scheduler's cgroup-wide
# kill).
SECOND_SIGTERM_MID_SAVE = """
    import os, signal, time
    import torch
    import _stepcli_agent.steplogwriter as steplog  # the hook loads stepcli.agent under this name

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    save = steplog.save_at_exit

    def second_signal_first(agent, reason, blocked):
        if reason == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)  # its Python handler runs on this thread, before the save
            for _ in range(1000):
                pass
        return save(agent, reason, blocked)

    steplog.save_at_exit = second_signal_first
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(600)
"""  # noqa: E501


def test_a_second_sigterm_during_the_save_waits_for_it(tmp_path: Path) -> None:
    # GIVEN a process that gets SIGTERM again just as its SIGTERM's save begins
    script = write_script(tmp_path, "twice.py", SECOND_SIGTERM_MID_SAVE)
    result = run_stepcli(
        "run", "-o", tmp_path / "out", "--json", tmp_path / "run.json", script, cwd=tmp_path
    )
    # THEN it still dies of SIGTERM, and only after its step log and whole-run record were written
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    (process,) = summary["processes"]
    assert (process["exit"], process["global_steps"]) == ("SIGTERM", 12), summary["processes"]
    (record,) = summary["step_record"]
    assert record["steps"] == 12
    assert not [
        note for note in summary["notes"] if "running" in note or "never written" in note
    ], summary["notes"]


def test_on_demand_run_killed_after_a_hang_counts_its_steps(tmp_path: Path) -> None:
    # GIVEN --on-demand (no window ever saved) WHEN the job hangs after 20 steps and --on-hang kill
    # ends it
    script = write_script(tmp_path, "nap.py", STEPS_THEN_NAP)
    result = run_stepcli(
        "run",
        "--on-demand",
        "--hang-timeout",
        "2s",
        "--on-hang",
        "kill",
        "-o",
        tmp_path / "out",
        "--json",
        tmp_path / "run.json",
        script,
        tmp_path / "stepped",
        cwd=tmp_path,
        timeout=LIMIT_S,
    )
    assert result.returncode == 124, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    # THEN its 20 steps are counted and timed (not "steps 0"), with its whole-run record
    assert summary["steps"]["global"] == 20, (summary["steps"], result.stderr)
    assert _summary_line(result.stderr, "steps").split()[1] == "20"
    # every step but the first (start-up)
    assert summary["step_time_ms"]["untouched"]["count"] == 19
    assert [r["steps"] for r in summary["step_record"]] == [20]
    assert not any("no steps observed" in note for note in summary["notes"]), summary["notes"]
    assert "hang: at step 20" in result.stderr


def test_a_program_that_exits_with_an_error_keeps_every_step(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "fails.py",
        STEPS_THEN_NAP.replace("time.sleep(600)", "sys.exit(3)"),
    )
    result = run_stepcli(
        "run",
        "-o",
        tmp_path / "out",
        "--json",
        tmp_path / "run.json",
        script,
        tmp_path / "m",
        cwd=tmp_path,
    )
    assert result.returncode == 3, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["steps"]["global"] == 20 and [r["steps"] for r in summary["step_record"]] == [20]


def test_a_process_killed_with_sigkill_after_it_stalled_still_counts_its_steps(
    tmp_path: Path,
) -> None:
    # GIVEN a process that stopped stepping after 20 steps, its hang reported (--on-hang keep),
    # inside its window
    script = write_script(tmp_path, "nap.py", STEPS_THEN_NAP)
    log, out = tmp_path / "log", tmp_path / "out"
    argv = [
        sys.executable,
        "-m",
        "stepcli",
        "run",
        "--hang-timeout",
        "2s",
        "--active",
        "100",
        "-o",
        str(out),
    ]
    argv += ["--json", str(tmp_path / "run.json"), str(script), str(tmp_path / "stepped")]
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_until(lambda: len(list(out.glob("hang-1/*.json"))) == 1, proc, log, "the hang dump")
        (dump,) = [json.loads(path.read_text()) for path in out.glob("hang-1/*.json")]
        # WHEN it is killed where no handler can run
        os.kill(int(dump["pid"]), signal.SIGKILL)
        proc.wait(timeout=LIMIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # THEN the step log its stacks thread saved when it stalled counts every step, and the note says
    # so
    assert proc.returncode == 128 + signal.SIGKILL, log.read_text()
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["steps"]["global"] == 20, (summary["steps"], log.read_text())
    assert [r["steps"] for r in summary["step_record"]] == [20]
    assert any(
        "saved when the process stopped stepping, at step 20" in note for note in summary["notes"]
    ), summary
    # AND the window it was killed in is said to be lost to the kill, not to a schedule the program
    # never reached
    assert summary["traces"] == [] and not any(
        "lower --wait" in note for note in summary["notes"]
    ), summary
    assert any(
        "ended (exit 137) at step 20, inside the window of steps 2-101" in n
        for n in summary["notes"]
    ), summary


# Ctrl-C (SIGINT) arrives while stepcli saves the window's trace: the program's wrapper of the
# profiler's export sends it to the process as the export begins, inside stepcli's save, so it
# always lands mid-save (a thread watching for the export's temporary folder missed it on a loaded
# machine).
CTRL_C_MID_SAVE = """
    import os, signal, sys, time
    import torch
    import torch.profiler

    export = torch.profiler.profile.export_chrome_trace

    def interrupted_export(self, path):
        os.kill(os.getpid(), signal.SIGINT)
        return export(self, path)

    torch.profiler.profile.export_chrome_trace = interrupted_export
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + 120  # steps on until the interrupt, delivered once the save (a thread's) is done
    while time.monotonic() < deadline:
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
    print("the interrupt never came", file=sys.stderr)
"""  # noqa: E501


def test_ctrl_c_while_a_trace_is_saved_keeps_the_trace_and_reaches_the_program(
    tmp_path: Path,
) -> None:
    # GIVEN a window of 30 steps recorded with Python stacks (a save that takes a moment)
    script = write_script(tmp_path, "train.py", CTRL_C_MID_SAVE)
    out = tmp_path / "out"
    # WHEN Ctrl-C comes in the middle of saving it
    result = run_stepcli(
        "run", "--active", "30", "--with-stack", "-o", out, script, out, cwd=tmp_path, timeout=300
    )
    # THEN the program still gets its KeyboardInterrupt (exit 130), at its own line, after the save
    assert result.returncode == 130, result.stderr
    assert "the interrupt never came" not in result.stderr
    tail = result.stderr[result.stderr.index("Traceback (most recent call last):") :]
    assert (
        "KeyboardInterrupt" in tail
        and "train.py" in tail
        and "stepcli" not in tail.split("KeyboardInterrupt")[0]
    )
    # AND the window's trace is whole: every step of it, and the summary names it
    (trace,) = [t for t in trace_files(out)]
    assert profiler_steps(trace) == list(range(2, 32))
    assert "saved trace of steps 2-31" in result.stderr
    assert not [p for p in out.iterdir() if p.name.startswith(".stepcli-export")]


def test_a_sigterm_after_the_program_ended_keeps_its_status_and_the_json(tmp_path: Path) -> None:
    # GIVEN a program that fails (exit 3) after a window of many operators (seconds of trace reading
    # on a busy machine), and a scheduler whose time limit strikes the moment the program has gone
    script = write_script(
        tmp_path,
        "fails.py",
        """
        import os, sys
        import torch
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(40)])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(40):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
        print(os.getpid(), flush=True)
        sys.exit(3)
    """,
    )
    argv = [
        sys.executable,
        "-m",
        "stepcli",
        "run",
        "-q",
        "--active",
        "30",
        "--record-shapes",
        "-o",
        str(tmp_path / "out"),
    ]
    proc = subprocess.Popen(
        [*argv, "--json", str(tmp_path / "run.json"), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stepcli_env(),
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        program = int(proc.stdout.readline())
        deadline = time.monotonic() + LIMIT_S
        while _running(program) and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=LIMIT_S)
    finally:
        proc.kill()
    # THEN stepcli exits with the program's status (it was 143, "Terminated", and no --json for the
    # CI step after)
    assert proc.returncode == 3, err
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["exit_status"] == 3
    assert "Traceback" not in err


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has: stepcli reaps it at once)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_process_killed_mid_window_is_not_told_to_lower_wait(tmp_path: Path) -> None:
    # GIVEN a program that stalls at step 5 (its step log saved then, --hang-timeout), steps on, and
    # is SIGKILLed (an out-of-memory kill, say) at step 30, inside the window of steps 2-101, before
    # any final step log: the last log it saved holds an earlier count
    script = write_script(
        tmp_path,
        "oom.py",
        """
        import glob, json, os, signal, sys, time
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def saved(test):
            while True:  # the step log stepcli saved, once it passes `test`
                for path in glob.glob(os.path.join(sys.argv[1], ".stepcli", "*", "*.steps.json")):
                    try:
                        log = json.load(open(path))
                    except ValueError:
                        continue
                    if test(log):
                        return
                time.sleep(0.01)

        for i in range(100):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if i == 4:
                saved(lambda log: log.get("progress") == "stalled")
            if i == 5:
                saved(lambda log: log.get("progress") != "stalled" and log["global_steps"] >= 6)
            if i == 29:
                os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--active",
        "100",
        "--hang-timeout",
        "1s",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        out,
    )
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    notes = json.loads((tmp_path / "run.json").read_text())["notes"]
    # THEN the note gives that count as a lower bound and blames the kill, not a schedule it never
    # reached
    assert not any("lower --wait" in note for note in notes), notes
    (note,) = [note for note in notes if note.startswith("no trace:")]
    assert "(exit 137) at step 6 or later (its last saved count)" in note, note
    assert (
        "window of steps 2-101, before its trace could be saved (SIGKILL leaves no time)" in note
    ), note


# Steps 3 times, waits for the process's periodic save (step log and whole-run record), steps on
# past the window of steps 2-4 (saved at step 5, with its step log), then dies of SIGKILL at step 8,
# before any final save.
PAUSE_THEN_SIGKILL = """
    import json, os, signal, time
    from pathlib import Path
    import torch

    def saved(pattern, ready):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for path in Path("out").glob(pattern):
                try:
                    if ready(json.loads(path.read_text())):
                        return
                except ValueError:
                    pass
            time.sleep(0.05)

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(8):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        if i == 2:
            saved(".stepcli/*/*.steptimes.json", lambda record: True)
        if i == 5:
            saved(".stepcli/*/*.steps.json", lambda log: log["windows"])
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_after_a_window_gives_one_step_count(tmp_path: Path) -> None:
    # GIVEN a process SIGKILLed after its window was saved, its whole-run record written earlier by
    # a periodic save
    script = write_script(tmp_path, "dies.py", PAUSE_THEN_SIGKILL)
    result = run_stepcli("run", "-o", "out", "--json", "run.json", script, cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [w["last_step"] for w in summary["windows"]] == [4], summary["windows"]
    # THEN the whole-run record was saved with the window's step log: both count the same steps
    (record,) = summary["step_record"]
    assert summary["steps"]["global"] >= 5 and record["steps"] == summary["steps"]["global"], (
        result.stderr
    )
    line = _summary_line(result.stderr, "steps")
    assert line.split()[1] == str(record["steps"]), line
