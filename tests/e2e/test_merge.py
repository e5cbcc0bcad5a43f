"""`stepcli merge` on hostile traces (issue 47): memory bounded as `table`'s on a trace of tiny
events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import stepcli_env

_PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * "
    "1024)"
)


def _peak_bytes(*args: str | Path) -> int:
    """The largest resident size of `stepcli ARGS` (or of a process it started)."""
    argv = [sys.executable, "-c", _PEAK, sys.executable, "-m", "stepcli", *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=stepcli_env())
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_merge_holds_no_file_of_tiny_events_as_objects(tmp_path: Path) -> None:
    # GIVEN a crafted 8 MB trace of 450,000 tiny events (as Python objects: ~25 times its size)
    trace = tmp_path / "tiny.pt.trace.json"
    trace.write_bytes(b'{"traceEvents":[' + b",".join([b'{"ph":"i","ts":1}'] * 450_000) + b"]}")
    size = trace.stat().st_size
    # WHEN table and merge read it
    table = _peak_bytes("table", trace)
    merged = tmp_path / "merged.json"
    merge = _peak_bytes("merge", trace, "-o", merged)
    # THEN merge streams it through table's decoder: its peak memory is table's, plus a few times
    # the text (it took 25 times the file before, issue 47 item 7), and every event is written
    assert merge < table + 3 * size, (merge, table, size)
    assert len(json.loads(merged.read_bytes())["traceEvents"]) == 450_000
