"""Exceptions, signals and exits: a window open when the program ends is still saved, whole and
parseable."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    load_trace,
    profiler_steps,
    run_stepcli,
    stepcli_env,
    trace_files,
    write_script,
)

# Trains forever-ish; announces on stdout when it is inside the recording window (global step 3).
SLOW_LOOP = """
    import sys, time
    import torch
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(1000):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        if i == 3:
            print("in-window", flush=True)
        time.sleep(0.05)
"""


# SLOW_LOOP that first starts a long-lived child of its own and leaves its pid in child.pid (in its
# working folder).
SLOW_LOOP_WITH_A_CHILD = (
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open("child.pid", "w").write(str(child.pid))"""
    + SLOW_LOOP
)


def start_stepcli(tmp_path: Path, script: Path, *options: str) -> subprocess.Popen[str]:
    # A new session stands in for a terminal: its process group gets the terminal's Ctrl-C.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepcli",
            "run",
            "--wait",
            "1",
            "--warmup",
            "1",
            "--active",
            "50",
            *options,
            "-o",
            str(tmp_path / "out"),
            str(script),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stepcli_env(),
        start_new_session=True,
    )


def wait_for_window(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "in-window" in line:
            return
        assert line, "program ended before its window"
    raise AssertionError("program never reached its window")


def assert_partial_trace(out: Path) -> list[int]:
    (trace,) = trace_files(out)
    steps = profiler_steps(trace)  # parses as JSON: the file is whole
    assert steps[0] == 2 and len(steps) >= 2
    assert not list(out.rglob("*.tmp*"))
    return steps


def test_exception_during_the_window_keeps_a_valid_trace(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "crash.py",
        """
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(10):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if i == 4:
                raise RuntimeError("diverged")
    """,
    )
    result = run_stepcli(
        "run", "--wait", "1", "--warmup", "1", "--active", "10", "-o", tmp_path / "out", script
    )
    assert result.returncode == 1
    assert "RuntimeError: diverged" in result.stderr
    assert assert_partial_trace(tmp_path / "out") == [2, 3, 4, 5]
    (trace,) = trace_files(tmp_path / "out")
    # step 5 only began: table/compare skip it
    assert load_trace(trace)["stepcli_incomplete_step"] == "5"
    assert "cut short: the program exited" in result.stderr


def test_work_after_the_last_step_of_a_cut_window_gets_no_share_of_step_time(
    tmp_path: Path,
) -> None:
    # GIVEN a program that exits inside its window, after heavy work past its last optimizer step
    # (an evaluation)
    script = write_script(
        tmp_path,
        "then_eval.py",
        """
        import torch
        model = torch.nn.Linear(32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(4):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
        y = torch.randn(300, 300)
        for _ in range(40):
            y = y @ y / 300
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli("run", "--wait", "1", "--warmup", "0", "--active", "10", "-o", out, script)
    assert result.returncode == 0, result.stderr
    # THEN the recorded steps' operator shares are shares of their time: the matmuls of the cut step
    # are not among them (they were counted over 3 steps' time: Self % of hundreds)
    table = run_stepcli("table", "--json", out)
    data = json.loads(table.stdout)
    assert data["step_ms"]["count"] == 3
    calls = {row["name"]: row["calls"] for row in data["cpu_ops"]}
    assert calls["ProfilerStep*"] == 3 and calls["aten::mm"] < 40
    assert sum(row["self_ms"] for row in data["cpu_ops"]) <= data["step_ms"]["mean"] * 3 * 1.01
    shares = re.findall(
        r"│ +([0-9.]+)% │",
        result.stderr.split("Top CPU operators", 1)[1].split("Step breakdown")[0],
    )
    assert shares and max(float(share) for share in shares) <= 100.0, result.stderr


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A program with a long-lived child of its own, inside its window when stepcli alone gets
    SIGTERM."""
    tmp = tmp_path_factory.mktemp("sigterm")
    script = write_script(tmp, "parent.py", SLOW_LOOP_WITH_A_CHILD)
    proc = start_stepcli(tmp, script)
    wait_for_window(proc)
    child_pid = int((tmp / "child.pid").read_text())
    proc.send_signal(signal.SIGTERM)  # to the launcher alone
    _, stderr = proc.communicate(timeout=120)
    # the child is given its 10 s to go here, not after the tests that run between
    deadline = time.time() + 10
    while time.time() < deadline and _alive(child_pid):
        time.sleep(0.1)
    return {
        "returncode": proc.returncode,
        "stderr": stderr,
        "out": tmp / "out",
        "child_alive": _alive(child_pid),
    }


def test_sigterm_to_stepcli_is_forwarded_and_the_window_saved(sigterm_run: dict[str, Any]) -> None:
    stderr = sigterm_run["stderr"]
    assert sigterm_run["returncode"] == 128 + signal.SIGTERM, stderr
    assert_partial_trace(sigterm_run["out"])
    assert "cut short: SIGTERM" in stderr
    assert "stepcli summary" in stderr
    # the status, and what it means
    assert re.search(r"status +exit 143 \(SIGTERM\), ", stderr), stderr


def test_ctrl_c_reaches_the_program_and_stepcli_still_reports(tmp_path: Path) -> None:
    script = write_script(tmp_path, "slow.py", SLOW_LOOP)
    proc = start_stepcli(tmp_path, script)
    wait_for_window(proc)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, stderr = proc.communicate(timeout=120)
    assert "KeyboardInterrupt" in stderr  # the program got it, as under plain python
    assert proc.returncode == 128 + signal.SIGINT
    assert_partial_trace(tmp_path / "out")
    assert "stepcli summary" in stderr


def test_os_exit_in_the_window_still_saves(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "hard_exit.py",
        """
        import os
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(10):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if i == 3:
                os._exit(7)
    """,
    )
    result = run_stepcli(
        "run", "--wait", "1", "--warmup", "1", "--active", "10", "-o", tmp_path / "out", script
    )
    assert result.returncode == 7
    assert assert_partial_trace(tmp_path / "out") == [2, 3, 4]


def test_forked_child_neither_profiles_nor_writes_and_exits_as_it_says(tmp_path: Path) -> None:
    # GIVEN a program that forks helpers which end the way Python programs end: sys.exit() inside
    # the window, an uncaught exception after it (a profiler has run in their parent: torch's Kineto
    # hangs such a child at exit on its own, plain torch.profiler too)
    script = write_script(
        tmp_path,
        "forks.py",
        """
        import atexit, os, sys
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        statuses = []
        for i in range(8):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if i in (2, 6):  # inside the window, then after it was saved
                pid = os.fork()
                if pid == 0:
                    opt.step(); opt.step()
                    atexit.register(lambda: open(f"atexit-{i}", "w").close())
                    print(f"child {i} done")
                    if i == 2:
                        sys.exit(5)
                    raise RuntimeError("the helper failed")
                statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        print("statuses", statuses)
    """,
    )
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "3",
        "-o",
        tmp_path / "out",
        script,
        cwd=tmp_path,
        timeout=90,
    )
    # THEN the children exit with their own statuses after their Python exit work (atexit, buffered
    # prints) ran
    assert result.returncode == 0, result.stderr
    assert "statuses [5, 1]" in result.stdout
    assert "child 2 done" in result.stdout and "child 6 done" in result.stdout
    assert (tmp_path / "atexit-2").exists() and (tmp_path / "atexit-6").exists()
    assert "RuntimeError: the helper failed" in result.stderr
    # AND they neither profile nor write: one trace of the parent's window, one step log, one
    # summary
    assert [profiler_steps(t) for t in trace_files(tmp_path / "out")] == [[2, 3, 4]]
    assert len(list((tmp_path / "out" / ".stepcli").rglob("*.steps.json"))) == 1
    assert result.stderr.count("stepcli summary") == 1


def test_no_orphan_survives_a_forwarded_sigterm(sigterm_run: dict[str, Any]) -> None:
    # GIVEN a program that started a long-lived child of its own WHEN stepcli alone gets SIGTERM
    # THEN the program died of it and its child did not outlive it
    assert sigterm_run["returncode"] == 128 + signal.SIGTERM
    assert not sigterm_run["child_alive"]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_program_does_not_outlive_a_killed_stepcli(tmp_path: Path) -> None:
    # GIVEN a running program; WHEN stepcli itself is SIGKILLed (no chance to forward anything)
    script = write_script(
        tmp_path,
        "sleeper.py",
        """
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
        print(os.getpid(), child.pid, flush=True)
        time.sleep(120)
    """,  # noqa: E501
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepcli", "run", "-q", "-o", str(tmp_path / "out"), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stepcli_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    program_pid, child_pid = (int(pid) for pid in proc.stdout.readline().split())
    proc.kill()
    proc.wait(timeout=30)
    # THEN the program is told to stop too (Linux parent-death signal), instead of running on as an
    # orphan
    deadline = time.time() + 10
    while time.time() < deadline and _alive(program_pid):
        time.sleep(0.1)
    assert not _alive(program_pid)
    # AND the watchdog ends its process group: the child that ignores SIGTERM gets SIGKILL after the
    # grace
    deadline = time.time() + 60
    while time.time() < deadline and _alive(child_pid):
        time.sleep(0.1)
    assert not _alive(child_pid)


# The program of a job started from a shell script in a terminal: it starts a child, and a daemon
# (double fork) that the launcher adopts; it leaves its own pid, stepcli's, its child's and the
# daemon's in pids.txt.
_JOB_WITH_A_DAEMON = """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    reader, writer = os.pipe()
    if os.fork() == 0:
        if os.fork() == 0:
            os.write(writer, str(os.getpid()).encode())
            time.sleep(120)
        os._exit(0)
    os.close(writer)
    daemon = int(os.read(reader, 32))
    with open("pids.tmp", "w") as handle:
        handle.write(f"{os.getpid()} {os.getppid()} {child.pid} {daemon}")
    os.rename("pids.tmp", "pids.txt")
    time.sleep(120)
"""


def _read_when_there(path: Path, timeout: float = 120.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path.name} never appeared")


def test_a_killed_stepcli_ends_the_program_but_not_the_script_that_called_it(
    tmp_path: Path,
) -> None:
    # GIVEN a shell script in a terminal's foreground that runs stepcli (so stepcli, its program and
    # the script share one process group), and that starts processes of its own while the program
    # runs
    import fcntl
    import pty
    import termios

    script = write_script(tmp_path, "job.py", _JOB_WITH_A_DAEMON)
    stepcli = f"{sys.executable} -m stepcli run -q -o out {script.name}"
    shell = (
        f"{stepcli} & job=$!; while [ ! -e pids.txt ]; do sleep 0.05; done; "
        "sleep 120 & echo $! > mine.tmp; mv mine.tmp mine.txt; "
        # a helper it orphans on purpose
        "( sleep 120 & echo $! > orphan.tmp; mv orphan.tmp orphan.txt ); "
        'wait "$job"; echo "went on after exit $?" > after.txt; '
        'while [ ! -e done.txt ]; do sleep 0.05; done; kill "$(cat mine.txt)" "$(cat orphan.txt)"'
    )
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    caller = subprocess.Popen(
        ["bash", "-c", shell],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=tmp_path,
        env=stepcli_env(),
        preexec_fn=controlling_terminal,
    )
    os.close(slave)
    try:
        program, launcher, child, daemon = (
            int(pid) for pid in _read_when_there(tmp_path / "pids.txt").split()
        )
        mine = int(_read_when_there(tmp_path / "mine.txt"))
        orphan = int(_read_when_there(tmp_path / "orphan.txt"))
        # one group, as in a terminal
        assert os.getpgid(launcher) == os.getpgid(caller.pid) == os.getpgid(program)
        # WHEN stepcli itself is SIGKILLed
        os.kill(launcher, signal.SIGKILL)
        # THEN the program, its child and its daemon are ended, while the script runs on
        deadline = time.time() + 60
        while time.time() < deadline and any(_alive(pid) for pid in (program, child, daemon)):
            time.sleep(0.1)
        assert [pid for pid in (program, child, daemon) if _alive(pid)] == []
        assert (
            _read_when_there(tmp_path / "after.txt").strip()
            == f"went on after exit {128 + signal.SIGKILL}"
        )
        # AND what the script started itself is not stepcli's to end (a wrong SIGTERM went out with
        # the child's), not even a helper it orphaned while the program ran (it looked like one of
        # the job's daemons)
        assert caller.poll() is None and _alive(mine) and _alive(orphan)
        (tmp_path / "done.txt").write_text("")
        assert caller.wait(timeout=60) == 0
    finally:
        try:
            os.killpg(caller.pid, signal.SIGKILL)
        except OSError:
            pass
        os.close(master)
