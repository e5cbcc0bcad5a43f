"""The summary `stepcli run` prints: every section, for the demo (for a two-rank torchrun run: see
below)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import profiler_steps, run_stepcli, trace_files

SECTIONS = [
    "stepcli summary",
    "command",
    "untouched steps",
    "profiled steps",
    "timeline",
    "peak memory",
    "trace",
    "Top CPU operators by self time",
    "Step breakdown",
    "next:\n  stepcli table",
]


def test_demo_prints_every_section_and_passes_options_after_dashdash_to_its_script(
    tmp_path: Path,
) -> None:
    # GIVEN nothing but stepcli; WHEN the demo runs with `-- --iterations 8` for its script
    result = run_stepcli(
        "demo",
        "--active",
        "2",
        "-o",
        tmp_path / "out",
        "--json",
        tmp_path / "demo.json",
        "--",
        "--iterations",
        "8",
        cwd=tmp_path,
    )
    # THEN it records a window and the summary shows every section
    assert result.returncode == 0, result.stderr
    assert "iteration   0" in result.stdout  # the demo's own output stays on stdout
    for section in SECTIONS:
        assert section in result.stderr, section
    # AND the script took the option: 8 steps, not its default 12
    assert re.search(r"^steps\s+8\s+\(AdamW#0 8\)", result.stderr, re.M), result.stderr
    # AND the command reads as people could type it, not as the script's path in site-packages
    # (issue 49)
    assert "\ncommand python -m stepcli.demo.train --iterations 8\n" in result.stderr, result.stderr
    (trace,) = trace_files(tmp_path / "out")
    assert profiler_steps(trace) == [2, 3]
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["steps"]["global"] == 8
    assert summary["top_operators"] and all(
        op["name"] != "ProfilerStep*" for op in summary["top_operators"]
    )
    assert set(summary["breakdown_ms"]) == {
        "dataloader",
        "forward",
        "backward",
        "optimizer",
        "other",
    }
    assert summary["breakdown_ms"]["optimizer"] > 0 and summary["breakdown_ms"]["backward"] > 0
    assert summary["peak_memory"]["rss_bytes"] > 10 * 2**20


# A two-rank torchrun run's summary (every section, both ranks) is checked in
# test_run_trace_layout.py, on the torchrun run that file records.
