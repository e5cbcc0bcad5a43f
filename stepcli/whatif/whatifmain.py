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
from stepcli.whatif.answer import SCHEMA, WhatifRequest, loader_workers_note, solve


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


def untouched_median(
    paths: Sequence[str], all_runs: bool = False
) -> tuple[float | None, list[str]]:
    """The untouched steps' median (ms) of the run PATH names (a run folder's latest, or
    FOLDER/.stepcli/RUN_ID), from the run summary `stepcli run` saved there; None for anything else
    (several runs read together). And a note when PATH is a run whose summary could not be read
    (missing, not a file of this user's, not a run summary): the answer goes on at the profiler's
    pace only, and says why the program's pace is missing."""
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        return None, []
    from stepcli.runfolder.layout import SUMMARY_FILE
    from stepcli.runfolder.runs import pick_run, read_saved
    from stepcli.runfolder.summaryread import read_run_summary

    pick = pick_run(paths[0])
    if pick is None or (all_runs and pick.others and not pick.named):
        return None, []
    newest = pick.run_dir
    path = newest / SUMMARY_FILE
    pace = "no untouched steps' median: predictions at the profiler's pace only"
    data = read_saved(path)
    if data is None:
        why = "is not a regular file of yours" if os.path.lexists(path) else "is missing"
        return None, [f"{path} {why}: {pace}"]
    try:
        summary = read_run_summary(data, str(path))
    except StepcliError as exc:
        return None, [f"{exc.message}: {pace}"]
    untouched = summary.step_time_ms.untouched if summary.step_time_ms else None
    if untouched is None or untouched.median <= 0:
        return None, []
    return float(untouched.median), []


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
        # named: among a job's files, the odd one out (another program's trace, an earlier
        # `--trace` output written beside them)
        rankless = next(lane for lane in chosen if lane.rank is None)
        raise StepcliError(
            f"these traces mix a trace without a rank ({rankless.path}) with ranked ones: give "
            "one job's traces",
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

    check_outputs(json_path, trace_path)
    files = list_trace_files(runs_to_read(paths, all_runs))
    if not files:
        raise StepcliError(f"no trace files in {', '.join(paths)}", EXIT_USAGE)
    lanes, notes = pick_lanes(map_files(read_lane, files, jobs, scheduler, scheduler_wait), step)
    untouched, unread = untouched_median(paths, all_runs)
    notes += unread
    solved = solve(lanes, WhatifRequest(changes, step), untouched, release=True)
    doc = solved.doc
    notes += filter(None, [loader_workers_note(lanes, doc)])
    if json_path == "-":
        print_document(doc, notes)
    elif json_path is not None:
        write_json(json_path, doc)
    if trace_path is not None:
        if solved.graph is None or doc["verdict"] != "ok":
            # the answer still shows (its replay figures, its notes), then why there is no trace
            if json_path != "-":
                print_answer(doc, notes)
            raise StepcliError(
                f"--trace {trace_path}: not written: {doc['reason']}", EXIT_INCONCLUSIVE
            )
        from stepcli.whatif.tracefile import write_trace

        write_trace(trace_path, solved.graph, solved.path)
    if json_path != "-":
        print_answer(doc, notes)
    return EXIT_OK if doc["verdict"] == "ok" else EXIT_INCONCLUSIVE


_OURS = re.compile(rb'\s*\{\s*"schema"\s*:\s*"' + re.escape(SCHEMA.encode()))


def check_outputs(json_path: str | None, trace_path: str | None) -> None:
    """--json and --trace may be written where they name, checked before any trace is read: a
    refusal reads nothing and writes nothing (not the JSON answer before refusing the trace)."""
    from stepcli.whatif import tracefile

    if trace_path == "-":
        raise StepcliError(
            "--trace -: the trace is for Perfetto or chrome://tracing, not the terminal: "
            "give a FILE",
            EXIT_USAGE,
        )
    if (
        json_path not in (None, "-")
        and trace_path is not None
        and os.path.realpath(json_path) == os.path.realpath(trace_path)
    ):
        raise StepcliError(
            f"--json and --trace both name {json_path}: give each its own file", EXIT_USAGE
        )
    outputs = (("--json", json_path, _OURS.match), ("--trace", trace_path, tracefile.is_ours))
    for flag, path, ours in outputs:
        if path is None or path == "-":
            continue
        problem = safefile.why_not_replace(path, ours)
        if problem is not None:
            raise StepcliError(f"{flag} {path}: {problem}; not replaced", EXIT_USAGE)
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise StepcliError(f"{flag} {path}: no folder {folder} to write it in", EXIT_USAGE)


def print_document(doc: dict[str, Any], notes: Sequence[str]) -> None:
    """`--json -`: the answer document on stdout in place of the report (as `compare --json -`),
    so a pipe gets JSON alone; the notes go to stderr."""
    import sys

    import orjson

    from stepcli.whatif.whatifrender import note_lines

    for line in note_lines(notes):
        print(line, file=sys.stderr)
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()


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
