"""`stepcli whatif`: read each trace into a lane (in worker processes, as `table` reads), answer,
print, write.

PATH is a run folder, a folder of traces or one trace. A run folder also gives the untouched steps'
median, so each prediction is given at the program's own pace too (stepcli.whatif.answer explains
the rest).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from stepcli import safefile
from stepcli.errors import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_USAGE, StepcliError
from stepcli.traces.analyses.lanes import RankLane
from stepcli.whatif.answer import SCHEMA, WhatifRequest, solve


def read_lane(path: str) -> RankLane:
    """One trace file's lane (module level: run in a worker process)."""
    from stepcli.traces.analyses.lanes import lane_of
    from stepcli.traces.read.columns import load_columns
    from stepcli.traces.read.typedcolumns import DEVICE

    trace = load_columns(path)
    if not (trace.columns.kind >= DEVICE).any():
        return lane_of(trace)
    from stepcli.inputs import read_input
    from stepcli.traces.read.syncevents import stream_waits

    # the cross-stream waits, where recorded
    return lane_of(trace, stream_waits(read_input(path)))


def untouched_median(paths: Sequence[str], all_runs: bool = False) -> float | None:
    """The untouched steps' median (ms) of the run PATH names (a run folder's latest, or
    FOLDER/.stepcli/RUN_ID), from the run summary `stepcli run` saved there; None for anything else
    (several runs read together)."""
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        return None
    from stepcli.runfolder.layout import SUMMARY_FILE
    from stepcli.runfolder.runs import pick_run, read_saved
    from stepcli.runfolder.summaryfile import read_run_summary

    pick = pick_run(paths[0])
    if pick is None or (all_runs and pick.others and not pick.named):
        return None
    newest = pick.run_dir
    data = read_saved(newest / SUMMARY_FILE)
    if data is None:
        return None
    try:
        summary = read_run_summary(data, str(newest / SUMMARY_FILE))
    except StepcliError:
        return None
    untouched = summary.step_time_ms.untouched if summary.step_time_ms else None
    return float(untouched.median) if untouched is not None and untouched.median > 0 else None


def pick_lanes(lanes: list[RankLane], step: int | None) -> tuple[list[RankLane], list[str]]:
    """One lane per rank (a folder given twice the same rank: the trace holding `step`, else the one
    with the most steps), and a note per trace left out."""
    by_rank: dict[int | None, list[RankLane]] = {}
    for lane in lanes:
        by_rank.setdefault(lane.rank, []).append(lane)
    chosen, notes = [], []
    for rank, group in by_rank.items():
        best = max(
            group, key=lambda lane: (step in lane.steps if step is not None else 0, len(lane.steps))
        )
        chosen.append(best)
        for lane in group:
            if lane is not best:
                who = f"rank {rank}" if rank is not None else "the process"
                notes.append(f"{lane.path}: left out ({who} is read from {best.path})")
    if len(chosen) > 1 and any(lane.rank is None for lane in chosen):
        raise StepcliError(
            "these traces mix a trace without a rank with ranked ones: give one job's traces",
            EXIT_USAGE,
        )
    chosen.sort(key=lambda lane: (lane.rank is None, lane.rank or 0))
    return chosen, notes


def whatif_main(
    paths: Sequence[str],
    changes: list[tuple[str, str]],
    step: int | None,
    json_path: str | None,
    jobs: int | None = None,
    trace_path: str | None = None,
    all_runs: bool = False,
    scheduler: str | None = None,
    scheduler_wait: float | None = None,
) -> int:
    """Read each trace into its lane (here, or on the Dask cluster at `scheduler`: the same lanes),
    answer here."""
    from stepcli.runfolder.runs import runs_to_read
    from stepcli.traces.engine import map_files
    from stepcli.traces.read.files import list_trace_files
    from stepcli.whatif.whatifrender import print_answer

    files = list_trace_files(runs_to_read(paths, all_runs))
    if not files:
        raise StepcliError(f"no trace files in {', '.join(paths)}", EXIT_USAGE)
    lanes, notes = pick_lanes(map_files(read_lane, files, jobs, scheduler, scheduler_wait), step)
    solved = solve(
        lanes, WhatifRequest(changes, step), untouched_median(paths, all_runs), release=True
    )
    doc = solved.doc
    if json_path is not None:
        write_json(json_path, doc)
    if trace_path is not None:
        if solved.graph is None or doc["verdict"] != "ok":
            raise StepcliError(
                f"--trace {trace_path}: not written: {doc['reason']}", EXIT_INCONCLUSIVE
            )
        from stepcli.whatif.tracefile import write_trace

        write_trace(trace_path, solved.graph, solved.path)
    print_answer(doc, notes)
    return EXIT_OK if doc["verdict"] == "ok" else EXIT_INCONCLUSIVE


_OURS = re.compile(rb'\s*\{\s*"schema"\s*:\s*"' + re.escape(SCHEMA.encode()))


def write_json(path: str, doc: dict[str, Any]) -> None:
    """The answer document at `path`, replacing only an earlier answer (never a user's file or an
    input)."""
    import orjson

    problem = safefile.why_not_replace(path, _OURS.match)
    if problem is not None:
        raise StepcliError(f"--json {path}: {problem}; not replaced", EXIT_USAGE)
    try:
        safefile.write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise StepcliError(
            f"--json {path}: cannot write ({exc.strerror or exc})", EXIT_USAGE
        ) from None
