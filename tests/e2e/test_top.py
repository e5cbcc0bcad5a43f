"""`stepcli top`: a running 2-rank job seen rank by rank, a finished run said so, a non-run
refused."""

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

# Two ranks stepping on their own (no collective per step): rank 1 takes 6x as long per step. They
# stop when <control>/end appears.
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


def _wait(
    condition: object, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"{what} never happened:\n{log.read_text()}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    tmp = tmp_path_factory.mktemp("top")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    script = write_script(tmp, "two.py", TWO_PACES)
    out, log = tmp / "out", tmp / "run.log"
    argv = [
        sys.executable,
        "-m",
        "stepcli",
        "run",
        "-q",
        "--on-demand",
        "--no-report",
        "-o",
        str(out),
    ]
    argv += ["--", torchrun, "--standalone", "--nproc-per-node", "2", str(script), str(tmp)]
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=tmp,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(
            lambda: len(list(out.glob(".stepcli/*/control/proc.*.json"))) == 2,
            "both ranks stepping",
            proc,
            log,
        )
        running_text = run_stepcli("top", "--once", out, cwd=tmp, timeout=120)
        running_json = run_stepcli("top", "--json", out, cwd=tmp, timeout=120)
        requests_left = any(out.glob(".stepcli/*/control/requests.json"))
        (tmp / "end").touch()
        assert proc.wait(timeout=180) == 0, log.read_text()
        finished = run_stepcli("top", "--once", out, cwd=tmp, timeout=120)
        yield Seen(out, running_text, running_json, requests_left, finished)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_top_once_shows_both_ranks_and_names_no_slowest_without_the_culprit_analysis(
    seen: Seen,
) -> None:
    assert seen.running_text.returncode == 0, seen.running_text.stderr
    lines = seen.running_text.stdout.splitlines()
    assert "(running)" in lines[0]
    header = next(line for line in lines if "windows / state" in line)
    # no empty, unlabelled last column
    assert header.split("┃")[-2].strip() == "windows / state", header
    rank0 = next(line for line in lines if "rank0" in line)
    rank1 = next(line for line in lines if "rank1" in line)
    # no trace saved (--on-demand): the culprit analysis knows nothing, so nobody is named, and top
    # says why
    assert "slowest" not in rank1 and "slowest" not in rank0
    assert (
        "slowest: nobody (no saved trace with collectives on two or more ranks yet)"
        in seen.running_text.stdout
    )
    document = json.loads(seen.running_json.stdout)
    assert document["running"] is True and document["slowest"] is None
    assert document["culprit"]["rank"] is None and document["culprit"]["collectives"] == 0
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
def test_top_on_something_that_is_not_a_run_is_one_line_and_exit_2(
    tmp_path: Path, target: str
) -> None:
    path = tmp_path if target == "folder" else tmp_path / "missing"
    result = run_stepcli("top", "--once", path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert ("not a stepcli run folder" if target == "folder" else "no such folder") in result.stderr
    assert result.stdout == ""


# Two DDP ranks; rank 1 sleeps 15 ms more per step before its forward (it arrives last at the
# gradient all-reduce, the only collective of a step). They stop together: when <control>/end
# appears, rank 0 names a step 5 ahead in the job's store (no collective: one where both arrive
# together would halve rank 1's share of last arrivals), and both stop there. A rank that stopped on
# seeing `end` alone would leave the other in an all-reduce.
DDP_LATE_RANK = """
    import sys
    import time
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    control = Path(sys.argv[1])
    store = dist.distributed_c10d._get_default_store()
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, stop_at = 0, None
    while stop_at is None or step < stop_at:
        if stop_at is None:
            if rank == 0 and (control / "end").exists():
                store.set("stop_at", str(step + 5))
            if store.check(["stop_at"]):
                stop_at = int(store.get("stop_at"))
        time.sleep(0.02 if rank == 1 else 0.005)
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        step += 1
    del model, opt
    dist.destroy_process_group()
"""

# Two ranks all-reducing every step; both hang at step 30: rank 1 blocks before the all-reduce, rank
# 0 waits in it.
HUNG_AT_30 = """
    import sys
    import threading
    from pathlib import Path
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100):
        model(torch.randn(4, 8)).sum().backward()
        if step == 30 and rank == 1:
            threading.Event().wait()
        dist.all_reduce(torch.ones(1))
        opt.step()
"""


def _torchrun() -> str:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    return torchrun


def _start(
    tmp: Path, options: list[str], script: Path, *args: str
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out, log = tmp / "out", tmp / "run.log"
    argv = [sys.executable, "-m", "stepcli", "run", *options, "-o", str(out)]
    argv += ["--", _torchrun(), "--standalone", "--nproc-per-node", "2", str(script), *args]
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=tmp,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, out, log


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_top_on_a_hung_job_shows_the_step_of_the_hang_and_names_nobody(tmp_path: Path) -> None:
    # GIVEN both ranks hung at step 30 (rank 0 in the all-reduce's C++ wait, rank 1 in a lock), the
    # hang dumped
    script = write_script(tmp_path, "hung.py", HUNG_AT_30)
    proc, out, log = _start(tmp_path, ["--hang-timeout", "4s"], script)
    try:
        _wait(lambda: len(list(out.glob("hang-1/*.json"))) == 2, "the hang dump", proc, log)
        dumps = [json.loads(path.read_text()) for path in sorted(out.glob("hang-1/*.json"))]
        assert [d["step"] for d in dumps] == [30, 30]
        # WHEN top looks
        once = run_stepcli("top", "--once", out, cwd=tmp_path, timeout=120)
        document = json.loads(run_stepcli("top", "--json", out, cwd=tmp_path, timeout=120).stdout)
    finally:
        _kill(proc)
    # THEN it shows the step the hang analysis shows, the last step's time, and that no step came
    # since
    assert once.returncode == 0, once.stderr
    for row in document["ranks"]:
        assert row["step"] == 30, document
        assert isinstance(row["last_ms"], (int, float)) and isinstance(
            row["median_ms"], (int, float)
        ), row
        assert row["no_step_for_s"] is not None and row["no_step_for_s"] >= 4.0, row
    rows = [line for line in once.stdout.splitlines() if "rank0" in line or "rank1" in line]
    assert len(rows) == 2 and all(" 30 " in line and "no step for" in line for line in rows), (
        once.stdout
    )
    # top names whom the culprit analysis of the saved traces names (steps 2-4 are balanced by
    # design, but on a loaded machine one rank can be consistently late there, and then both name
    # it), never a step-time guess
    table = run_stepcli("table", "--json", out, cwd=tmp_path, timeout=120)
    found = (json.loads(table.stdout).get("culprit") or {}).get("culprit")
    expected = found["rank"] if found else None
    assert document["slowest"] == expected, (document, found)
    assert [row["rank"] for row in document["ranks"] if row["slowest"]] == (
        [] if expected is None else [expected]
    )
    if expected is None:
        assert "slowest" not in "".join(rows)


def test_top_names_the_rank_the_culprit_analysis_names_every_time(tmp_path: Path) -> None:
    # GIVEN DDP with rank 1 15 ms late at every gradient all-reduce, 12 recorded steps saved
    script = write_script(tmp_path, "late.py", DDP_LATE_RANK)
    proc, out, log = _start(
        tmp_path, ["--active", "12", "--json", str(tmp_path / "run.json")], script, str(tmp_path)
    )
    try:
        _wait(lambda: len(list(out.glob("rank*.pt.trace.json"))) == 2, "both traces", proc, log)
        # WHEN top looks five times
        snapshots = [
            json.loads(run_stepcli("top", "--json", out, cwd=tmp_path, timeout=120).stdout)
            for _ in range(5)
        ]
        (tmp_path / "end").touch()
        assert proc.wait(timeout=180) == 0, log.read_text()
    finally:
        _kill(proc)
    summary = json.loads((tmp_path / "run.json").read_text())
    # THEN it names the rank the run summary's culprit analysis names, every time, and says on what
    # evidence
    assert summary["culprit"]["culprit"]["rank"] == 1, summary["culprit"]
    assert [s["slowest"] for s in snapshots] == [1] * 5, [s["culprit"] for s in snapshots]
    assert all(s["culprit"]["why"].startswith("rank 1 arrives last at") for s in snapshots), (
        snapshots[0]["culprit"]
    )
