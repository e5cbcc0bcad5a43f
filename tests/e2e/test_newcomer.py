"""Rough edges a newcomer hits (issue 29, items 10-17): 80 columns, one step count everywhere, machine formats whole,
what the gc counts cover, operator changes compare cannot judge, tracebacks and notes, a clean test retry."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import run_stepcli, write_script

PIPE_80 = {"COLUMNS": "80"}  # run_stepcli's output is a pipe (no TTY)


def test_a_torchrun_retry_starts_with_a_clean_output_folder(tmp_path: Path) -> None:
    # GIVEN a "torchrun" that dies in torch's gloo teardown the first time, after writing into the output folder
    out = tmp_path / "out"
    counter = tmp_path / "attempts"
    fake = write_script(
        tmp_path / "bin",
        "torchrun",
        f"""
        #!{sys.executable}
        import sys
        from pathlib import Path
        counter = Path({str(counter)!r})
        attempt = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(attempt))
        Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
        (Path(sys.argv[1]) / f"attempt{{attempt}}.txt").write_text("trace")
        if attempt == 1:
            print("terminate called without an active exception", file=sys.stderr)
            print("Signal 6 (SIGABRT) received by PID 1", file=sys.stderr)
            sys.exit(1)
        """,
    )
    os.chmod(fake, 0o755)
    # WHEN the suite's helper runs it and retries after the native abort
    result = run_stepcli("run", "-q", "-o", out, "--", fake, out / "mine")
    # THEN the retry found a clean folder: only the second attempt's files are there
    assert result.returncode == 0, result.stderr
    assert counter.read_text() == "2"
    assert sorted(p.name for p in (out / "mine").iterdir()) == ["attempt2.txt"]
