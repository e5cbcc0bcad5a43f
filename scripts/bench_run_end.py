"""How long the end of `stepcli run` spends on a torchrun job's traces: the run summary plus
report.html.

Usage: python scripts/bench_run_end.py [--ranks 4] [--rank-mb 40] [--folder DIR] [--repeat 3]

Builds (or reuses, with --folder) --ranks rank traces of --rank-mb each with
scripts/bench_table.py's generator, then times, in this one process and alternately, the two ways
the end of a run can read them:

  before: the run summary summarizes the traces (stepcli.traces.engine.summarize_paths), then the
          page reads them again (stepcli.run.summary.htmlreport.build with no RunTraces: by-shape
          parts, plus a scan of every file for memory events);
  after:  one stepcli.traces.runtraces.RunTraces read (plain and by-shape parts), the summary merged
          from its plain parts and the page built from the same parts (a run without
          --profile-memory scans no file for memory).

An idle thread runs meanwhile, as the launcher's watchdog does, so worker processes start as they do
at the end of a run (forkserver, not fork). Best of --repeat for each, and the median of each
round's before / after (steadier on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_table import make_folder  # noqa: E402 (the generator lives beside this script)


def before(paths: list[str]) -> None:
    """The end of a run as it was: two reads of every trace (plus a memory-event scan)."""
    from stepcli.report.page import render
    from stepcli.run.summary.htmlreport import build
    from stepcli.traces.engine import summarize_paths

    summarize_paths(paths).to_dict()
    render(build(None, [], paths), "report.html")


def after(paths: list[str], memory: bool = False) -> None:
    """The end of a run now: one read, shared by the summary and the page."""
    from stepcli.report.page import render
    from stepcli.run.summary.htmlreport import build
    from stepcli.traces.analyses.mergeparts import merge_parts
    from stepcli.traces.runtraces import RunTraces

    traces = RunTraces(shapes=True, memory=memory)
    merge_parts([parts[0] for parts in traces.parts(paths)]).to_dict()
    render(build(None, [], paths, traces=traces), "report.html")


def best(work: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    assert __doc__
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="rank traces in the run folder")
    parser.add_argument(
        "--rank-mb", type=float, default=40.0, help="approximate size of each rank trace"
    )
    parser.add_argument(
        "--folder", type=Path, help="use (or create) the rank traces in this folder"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per measurement; the best is reported"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="stepcli-bench-run-end-") as tmp:
        folder = args.folder or Path(tmp) / "ranks"
        files = make_folder(folder, args.ranks, args.rank_mb, Path(tmp))
        paths = [str(f) for f in files]
        idle = threading.Event()
        # as the launcher's: workers start by forkserver
        watchdog = threading.Thread(target=idle.wait, daemon=True)
        watchdog.start()
        try:
            after(paths)  # warm the page cache and the worker start-up for both sides
            old = new = new_memory = float("inf")
            ratios: list[float] = []
            # alternate, so drift on a shared machine hits both sides alike
            for _ in range(args.repeat):
                round_old = best(lambda: before(paths), 1)
                round_new = best(lambda: after(paths), 1)
                old, new = min(old, round_old), min(new, round_new)
                new_memory = min(new_memory, best(lambda: after(paths, memory=True), 1))
                ratios.append(round_old / round_new)
        finally:
            idle.set()
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        mb = 1024 * 1024
        size = sum(f.stat().st_size for f in files)
        print(
            f"run end: {len(files)} rank traces x {files[0].stat().st_size / mb:,.0f} MiB = "
            f"{size / mb:,.0f} MiB, {cores} cores, best of {args.repeat}"
        )
        print(f"{'':52}{'wall s':>8}")
        print(f"{'before: summary read + report read':52}{old:8.2f}")
        print(f"{'after: one read (no --profile-memory)':52}{new:8.2f}")
        print(f"{'after: one read + memory scan (--profile-memory)':52}{new_memory:8.2f}")
        print(
            f"RUN-END RATIO  before / after: {old / new:.2f}x of the best times, "
            f"{statistics.median(ratios):.2f}x the median of the rounds' ratios (--profile-memory: "
            f"{old / new_memory:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
