"""How long `stepcli report` takes, and how big the page is, for a long many-rank run.

Usage: python scripts/bench_report.py [--steps 10000] [--ranks 8] [--keep DIR]

Builds a synthetic run folder (one step log per rank, every step timed, a recording window every
1,000 steps, a straggler rank and a few stalls, plus the run summary `stepcli run` saves) and times
building the page from it, after the summaries exist, as `stepcli run` does at the end of a run. No
traces: this measures the report itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def make_synthetic_run(folder: Path, steps: int = 10_000, ranks: int = 8, seed: int = 0) -> Path:
    """A run folder shaped like one `stepcli run` writes: .stepcli/<run
    id>/{rank<R>.steps.json,summary.json}."""
    rng = random.Random(seed)
    logs_dir = folder / ".stepcli" / "20260101-000000-1"
    logs_dir.mkdir(parents=True, exist_ok=True)
    phases = "".join(
        "0"
        if i % 1000 < 5 or i % 1000 >= 10
        else "1"
        if i % 1000 == 5
        else "3"
        if i % 1000 == 9
        else "2"
        for i in range(steps)
    )
    processes = []
    for rank in range(ranks):
        base = 50.0 * (1.15 if rank == ranks - 1 else 1.0)
        durations = [int(rng.gauss(base, 2.0) * 1000) for _ in range(steps)]
        durations[0] = 4_000_000  # start-up
        for stall in range(4000, steps, 4000):
            durations[stall] = 900_000
        log = {
            "schema_version": 1,
            "worker": f"rank{rank}",
            "rank": rank,
            "pid": 1000 + rank,
            "host": "node",
            "argv": ["train.py"],
            "python": "3.11",
            "torch": "2.13.0",
            "global_steps": steps,
            "requesters": [{"name": "AdamW#0", "calls": steps, "first_step": 0}],
            "durations_us": durations,
            "phases": phases,
            "windows": [],
            "skipped_windows": 0,
            "notes": [],
            "exit": "exit",
            "peak_rss_bytes": 3_000_000_000 + rank * 10_000_000,
            "cuda_peak_bytes": 20_000_000_000,
        }
        (logs_dir / f"rank{rank}.steps.json").write_text(json.dumps(log))
        processes.append(
            {
                k: log[k]
                for k in (
                    "worker",
                    "rank",
                    "pid",
                    "argv",
                    "global_steps",
                    "exit",
                    "peak_rss_bytes",
                    "cuda_peak_bytes",
                )
            }
        )
    summary = {
        "schema": "stepcli.run",
        "schema_version": 1,
        "stepcli_version": "0",
        "command": ["torchrun", "train.py"],
        "exit_status": 0,
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 600.0,
        "host": "node",
        "platform": "Linux",
        "python": "3.11",
        "torch": "2.13.0",
        "out_dir": str(folder),
        "schedule": {"skip_first": 0, "wait": 5, "warmup": 1, "active": 4, "repeat": 0},
        "steps": {"global": steps, "requesters": {"AdamW#0": steps}},
        "step_time_ms": {},
        "timeline_ms": [],
        "timeline_phases": "",
        "processes": processes,
        "windows": [],
        "traces": [],
        "top_operators": [
            {
                "name": f"aten::op{i}",
                "calls": 1000 * (i + 1),
                "self_ms": 100.0 / (i + 1),
                "total_ms": 200.0 / (i + 1),
                "avg_ms": 0.1,
                "self_share": 0.3 / (i + 1),
            }
            for i in range(20)
        ],
        "top_kernels": [],
        "ranks": [],
        "slowest_rank": None,
        "breakdown_ms": {
            "dataloader": 2.0,
            "forward": 15.0,
            "backward": 25.0,
            "optimizer": 5.0,
            "other": 3.0,
        },
        "device": None,
        "peak_memory": {"rss_bytes": None, "cuda_bytes": None},
        "notes": [],
    }
    (logs_dir / "summary.json").write_text(json.dumps(summary))
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--keep", help="build the run folder here and keep it")
    args = parser.parse_args()

    from stepcli.run.summary.htmlreport import report_main

    folder = Path(args.keep or tempfile.mkdtemp(prefix="stepcli-bench-report-"))
    make_synthetic_run(folder, args.steps, args.ranks)
    start = time.perf_counter()
    page = report_main([str(folder)], None)
    elapsed = time.perf_counter() - start
    size = os.path.getsize(page)
    print(
        f"{args.steps} steps x {args.ranks} ranks: {page} written in {elapsed:.2f} s, "
        f"{size / 1e6:.2f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
