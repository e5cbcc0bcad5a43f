"""`stepcli capture RUN --memory-snapshot` on a real running CPU job: no CUDA memory, one line, the
job goes on.

The snapshot itself needs CUDA: its writing is checked with the CUDA calls stubbed in
tests/unit/test_agent_cudamemory.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import run_stepcli, stepcli_env, write_script

# Steps three times, says so in a file, waits (without stepping) until the test says go, then ends
# with exit 0.
WAITER = """
    import sys
    import time
    from pathlib import Path
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    Path(sys.argv[1]).write_text("stepped")
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
"""

LIMIT_S = 180.0  # a generous upper bound for anything to appear on a busy 2-core machine


def _wait_until(condition: Any, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended (exit {proc.returncode}) before {what}:\n{log.read_text()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {LIMIT_S} s:\n{log.read_text()}")
        time.sleep(0.1)


def test_memory_snapshot_of_a_cpu_job_says_no_cuda_memory_exits_3_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    script = write_script(tmp_path, "waiter.py", WAITER)
    marker, go, log, out = tmp_path / "stepped", tmp_path / "go", tmp_path / "log", tmp_path / "out"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepcli",
                "run",
                "-o",
                str(out),
                str(script),
                str(marker),
                str(go),
            ],
            cwd=tmp_path,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_until(marker.exists, proc, log, "three steps")
        result = run_stepcli("capture", out, "--memory-snapshot", cwd=tmp_path, timeout=LIMIT_S)
        assert result.returncode == 3, (result.stdout, result.stderr)
        lines = result.stdout.splitlines()
        assert len(lines) == 1 and lines[0].endswith(": no CUDA memory (its torch has no CUDA)"), (
            result.stdout
        )
        assert not list(out.glob("memory-*")) and proc.poll() is None
        go.write_text("go")
        assert proc.wait(timeout=LIMIT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not list((out / ".stepcli").glob("*/control/memory-*"))  # the answers folder is removed


def test_memory_snapshot_refuses_window_options(tmp_path: Path) -> None:
    result = run_stepcli("capture", tmp_path, "--memory-snapshot", "--active", "2", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--memory-snapshot records no window: drop --active" in result.stderr
