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

# stepcli's own entry point, counting every fork of the stepcli process (its worker processes) into
# a file.
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
        [
            sys.executable,
            "-c",
            _COUNT_FORKS,
            str(counter),
            "table",
            "--json",
            "--jobs",
            "10000",
            str(folder),
        ],
        REPO,
        None,
        240,
    )
    # THEN it answers like one job does, having forked no more workers than this machine's cores
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["files"]) == 24
    forks = int(counter.read_text())
    assert 1 <= forks <= len(os.sched_getaffinity(0)), forks
    one = _run(
        [sys.executable, "-m", "stepcli", "table", "--json", "--jobs", "1", str(folder)],
        REPO,
        None,
        240,
    )
    assert json.loads(one.stdout) == json.loads(result.stdout)


def _big_gz_trace(path: Path) -> bytes:
    """A .gz trace of ~9 MB of text (the real CPU trace's events, 80 times over, each copy later in
    time), over the sizes from which `table` reads one .gz trace ahead
    (stepcli.traces.read.readahead, 4 MB) and decodes it in two processes
    (stepcli.traces.read.twoprocess, 8 MB); its bytes."""
    document = json.loads((DATA / "train_cpu.pt.trace.json").read_text())
    events = document["traceEvents"]
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(times) - min(times) + 1000
    copies = []
    for k in range(80):
        for event in events:
            copy = dict(event)
            if isinstance(copy.get("ts"), (int, float)):
                copy["ts"] = copy["ts"] + k * span
            copies.append(copy)
    document["traceEvents"] = copies
    text = json.dumps(document).encode()
    assert len(text) > 8 * 1024 * 1024
    path.write_bytes(gzip.compress(text, compresslevel=1))
    return path.read_bytes()


def test_one_gz_trace_is_read_ahead_and_answers_like_one_job(tmp_path: Path) -> None:
    # GIVEN one .gz trace of 9 MB of text
    trace = tmp_path / "big.pt.trace.json.gz"
    data = _big_gz_trace(trace)
    counter = tmp_path / "forks"
    # WHEN `stepcli table --json` reads it, and `--jobs 1` too
    result = _run(
        [sys.executable, "-c", _COUNT_FORKS, str(counter), "table", "--json", str(trace)],
        REPO,
        None,
        240,
    )
    one = _run(
        [sys.executable, "-m", "stepcli", "table", "--json", "--jobs", "1", str(trace)],
        REPO,
        None,
        240,
    )
    # THEN on several cores it forked the child that inflates it and the one that decodes half, and
    # answered alike
    assert result.returncode == 0, result.stderr
    assert int(counter.read_text()) == (2 if len(os.sched_getaffinity(0)) > 1 else 0)
    assert json.loads(result.stdout) == json.loads(one.stdout)
    # AND a copy whose compressed stream is cut (its gzip trailer kept) gets the one-job error, word
    # for word
    cut = tmp_path / "cut.pt.trace.json.gz"
    cut.write_bytes(data[: len(data) // 2] + data[-8:])
    bad = _run([sys.executable, "-m", "stepcli", "table", str(cut)], REPO, None, 240)
    bad_one = _run(
        [sys.executable, "-m", "stepcli", "table", "--jobs", "1", str(cut)], REPO, None, 240
    )
    assert (bad.returncode, bad.stderr, bad.stdout) == (
        bad_one.returncode,
        bad_one.stderr,
        bad_one.stdout,
    )
    assert (
        bad.returncode != 0
        and "corrupt gzip" in bad.stderr
        and len(bad.stderr.strip().splitlines()) == 1
    )
