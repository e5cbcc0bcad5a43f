"""`stepcli table --jobs N` never starts more worker processes than the cores (or the files)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path

from conftest import REPO, _run

DATA = Path(__file__).resolve().parent.parent / "data"

# stepcli's own entry point, counting every fork of the stepcli process (its worker processes) into a file.
_COUNT_FORKS = """
import atexit, os, runpy, sys
forks = []
os.register_at_fork(after_in_parent=lambda: forks.append(1))
counter = sys.argv.pop(1)
atexit.register(lambda: open(counter, "w").write(str(len(forks))))
sys.argv[0] = "stepcli"
runpy.run_module("stepcli", run_name="__main__")
"""


def test_jobs_10000_works_and_forks_no_more_than_the_cores(tmp_path: Path) -> None:
    # GIVEN a folder of 24 small traces, a third of them gzipped
    folder = tmp_path / "traces"
    folder.mkdir()
    for i in range(24):
        if i % 3:
            shutil.copy(DATA / "train_cpu.pt.trace.json", folder / f"host_{i}.pt.trace.json")
        else:
            (folder / f"host_{i}.pt.trace.json.gz").write_bytes(
                gzip.compress((DATA / "train_cpu.pt.trace.json").read_bytes())
            )
    counter = tmp_path / "forks"
    # WHEN `stepcli table --jobs 10000` reads it
    result = _run(
        [sys.executable, "-c", _COUNT_FORKS, str(counter), "table", "--json", "--jobs", "10000", str(folder)],
        REPO,
        None,
        240,
    )
    # THEN it answers like one job does, having forked no more workers than this machine's cores
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["files"]) == 24
    forks = int(counter.read_text())
    assert 1 <= forks <= len(os.sched_getaffinity(0)), forks
    one = _run([sys.executable, "-m", "stepcli", "table", "--json", "--jobs", "1", str(folder)], REPO, None, 240)
    assert json.loads(one.stdout) == json.loads(result.stdout)
