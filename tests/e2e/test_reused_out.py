"""Two `stepcli run`s into one `-o` folder stay apart (docs/commands/table.md: two runs into one
folder stay two columns), also when their traces carry the same rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import run_stepcli, trace_files, write_script

STEPPER = """
    import torch

    weight = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([weight], lr=0.1)
    for _ in range(8):
        weight.grad = torch.ones(4)
        opt.step()
"""


def test_two_runs_of_rank_0_into_one_folder_stay_two_processes(tmp_path: Path) -> None:
    # GIVEN two runs of a rank-0 process (RANK=0 names its traces rank0.*) into the same -o folder
    script = write_script(tmp_path, "stepper.py", STEPPER)
    out = tmp_path / "reuse"
    for _ in range(2):
        done = run_stepcli(
            "run", "-q", "--no-report", "-o", out, script, env={"RANK": "0"}, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
    assert len(trace_files(out)) == 2 and all(p.name.startswith("rank0.") for p in trace_files(out))
    # WHEN the folder is summarized THEN rank 0 is two processes (one per run, told apart by pid),
    # each with its own window of steps 2-4 and its own value for every step, not one process with
    # "steps 2-4" twice
    result = run_stepcli("table", "--json", "--all-runs", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    processes = [row["process"] for row in doc["ranks"]]
    assert len(processes) == 2 and all(re.fullmatch(r"rank 0 \(pid \d+\)", p) for p in processes), (
        processes
    )
    assert all(
        len(row["windows"]) == 1 and row["windows"][0]["steps"] == "steps 2-4"
        for row in doc["ranks"]
    )
    by_process = {
        p: sorted(s["step"] for s in doc["steps"] if s["process"] == p) for p in processes
    }
    assert all(steps == [2, 3, 4] for steps in by_process.values()), by_process
    # AND the terminal's Steps table has a column per run
    text = run_stepcli("table", "--all-runs", out, cwd=tmp_path, env={"COLUMNS": "200"})
    header = next(line for line in text.stdout.splitlines() if line.startswith("┃ Step"))
    assert all(f"{p} ms" in header for p in processes), header


def test_two_rankless_runs_with_the_same_pid_stay_two_processes(tmp_path: Path) -> None:
    # GIVEN two rankless runs of two windows each into one folder, from containers: each program PID
    # 1 on a host of the same name, so their traces are all `box_1.<ns>.pt.trace.json` with pid 1
    # inside (the second run is the first again, an hour later by its file names' clock)
    script = write_script(tmp_path, "stepper.py", STEPPER.replace("range(8)", "range(10)"))
    out = tmp_path / "containers"
    out.mkdir()
    done = run_stepcli(
        "run", "-q", "--no-report", "--repeat", "2", "-o", tmp_path / "run", script, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    for trace in trace_files(tmp_path / "run"):
        document = json.loads(trace.read_text())
        pids = {
            event.get("pid")
            for event in document["traceEvents"]
            if isinstance(event.get("pid"), int)
        }
        for event in document["traceEvents"]:
            if event.get("pid") in pids:
                event["pid"] = 1
        clock = int(trace.name.split(".")[1])
        for later in (0, 3600 * 10**9):
            (out / f"box_1.{clock + later}.pt.trace.json").write_text(json.dumps(document))
    assert len(trace_files(out)) == 4
    # WHEN the folder is summarized THEN the runs are two processes, each with its windows of steps
    # 2-4 and 7-9, never one process with every step twice
    result = run_stepcli("table", "--json", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [row["process"] for row in doc["ranks"]] == ["box_1 #1", "box_1 #2"]
    assert all(
        [w["steps"] for w in row["windows"]] == ["steps 2-4", "steps 7-9"] for row in doc["ranks"]
    )
    by_process = {
        p: sorted(s["step"] for s in doc["steps"] if s["process"] == p)
        for p in ("box_1 #1", "box_1 #2")
    }
    assert all(steps == [2, 3, 4, 7, 8, 9] for steps in by_process.values()), by_process
