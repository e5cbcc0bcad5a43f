"""Two `stepcli run`s into one `-o` folder stay apart: `table`, `merge` and `report` read the newest run."""

from __future__ import annotations

import json
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


def test_two_runs_into_one_folder_stay_apart(tmp_path: Path) -> None:
    # GIVEN two runs of a rank-0 process (RANK=0 names its traces rank0.*) into the same -o folder
    script = write_script(tmp_path, "stepper.py", STEPPER)
    out = tmp_path / "reuse"
    for _ in range(2):
        done = run_stepcli("run", "-q", "--no-report", "-o", out, script, env={"RANK": "0"})
        assert done.returncode == 0, done.stderr
    assert len(trace_files(out)) == 2 and all(p.name.startswith("rank0.") for p in trace_files(out))
    newest = sorted((out / ".stepcli").iterdir())[-1].name
    # WHEN the folder is summarized THEN rank 0's recorded steps 2-4 appear once each, from the newest run, and
    # one line says the older run's trace was left out
    result = run_stepcli("table", "--json", out)
    assert result.returncode == 0, result.stderr
    steps = [(row["rank"], row["step"]) for row in json.loads(result.stdout)["steps"]]
    assert steps == [(0, 2), (0, 3), (0, 4)], steps
    note = [line for line in result.stderr.splitlines() if "runs in this folder" in line]
    assert len(note) == 1 and newest in note[0] and "1 trace(s) of older runs left out" in note[0], result.stderr
    # AND the terminal table lists one window for rank 0
    text = run_stepcli("table", out)
    assert text.returncode == 0 and text.stdout.count("2-4") <= 1, text.stdout
    # AND each trace file given by name is still read
    both = run_stepcli("table", "--json", *trace_files(out))
    assert len(json.loads(both.stdout)["steps"]) == 6
