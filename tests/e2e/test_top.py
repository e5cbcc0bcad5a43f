"""`stepcli top`: a running 2-rank job seen rank by rank, a finished run said so, a non-run refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_stepcli, stepcli_env, write_script

# Two ranks stepping on their own (no collective per step): rank 1 takes 6x as long per step. They stop when
# <control>/end appears.
TWO_PACES = """
    import sys
    import time
    from pathlib import Path
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    control = Path(sys.argv[1])
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while not (control / "end").exists():
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.12 if rank == 1 else 0.02)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
"""


@dataclass
class Seen:
    out: Path
    running_text: subprocess.CompletedProcess[str]
    running_json: subprocess.CompletedProcess[str]
    requests_left: bool
    finished: subprocess.CompletedProcess[str]


def _wait(condition: object, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"{what} never happened:\n{log.read_text()}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    tmp = tmp_path_factory.mktemp("top")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    script = write_script(tmp, "two.py", TWO_PACES)
    out, log = tmp / "out", tmp / "run.log"
    argv = [sys.executable, "-m", "stepcli", "run", "-q", "--on-demand", "--no-report", "-o", str(out)]
    argv += ["--", torchrun, "--standalone", "--nproc-per-node", "2", str(script), str(tmp)]
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            argv, cwd=tmp, env=stepcli_env(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait(lambda: len(list(out.glob(".stepcli/*/control/proc.*.json"))) == 2, "both ranks stepping", proc, log)
        running_text = run_stepcli("top", "--once", out, timeout=120)
        running_json = run_stepcli("top", "--json", out, timeout=120)
        requests_left = any(out.glob(".stepcli/*/control/requests.json"))
        (tmp / "end").touch()
        assert proc.wait(timeout=180) == 0, log.read_text()
        finished = run_stepcli("top", "--once", out, timeout=120)
        yield Seen(out, running_text, running_json, requests_left, finished)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_top_once_shows_both_ranks_and_marks_the_slow_one(seen: Seen) -> None:
    assert seen.running_text.returncode == 0, seen.running_text.stderr
    lines = seen.running_text.stdout.splitlines()
    assert "(running)" in lines[0]
    rank0 = next(line for line in lines if "rank0" in line)
    rank1 = next(line for line in lines if "rank1" in line)
    assert "slowest" in rank1 and "slowest" not in rank0
    document = json.loads(seen.running_json.stdout)
    assert document["running"] is True and document["slowest"] == 1
    ranks = {row["rank"]: row for row in document["ranks"]}
    assert set(ranks) == {0, 1}
    assert ranks[0]["step"] > 0 and ranks[1]["step"] > 0
    assert ranks[1]["median_ms"] > ranks[0]["median_ms"]
    assert ranks[1]["steps_per_s"] < ranks[0]["steps_per_s"]


def test_top_withdraws_its_ping(seen: Seen) -> None:
    assert not seen.requests_left


def test_top_on_a_finished_run_says_so_and_exits_0(seen: Seen) -> None:
    assert seen.finished.returncode == 0, seen.finished.stderr
    assert "has finished" in seen.finished.stdout
    assert "ended (exit)" in seen.finished.stdout


@pytest.mark.parametrize("target", ["folder", "missing"])
def test_top_on_something_that_is_not_a_run_is_one_line_and_exit_2(tmp_path: Path, target: str) -> None:
    path = tmp_path if target == "folder" else tmp_path / "missing"
    result = run_stepcli("top", "--once", path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert ("not a stepcli run folder" if target == "folder" else "no such folder") in result.stderr
    assert result.stdout == ""
