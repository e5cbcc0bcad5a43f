"""`stepcli report PATH...` and the report.html written at the end of `stepcli run`: find the
inputs, hand the page a run summary with its advice.

PATHs name one run (its output folder or its `--json` summary) and any traces. A run folder's
summary is the one `stepcli run` saved beside the step logs (`.stepcli/<run id>/summary.json`); a
folder without one (an older run) gets a summary rebuilt from its step logs. Inputs that carry no
advice (plain traces, older summaries) get it computed here, by the same rules and from the same
numbers as `stepcli run` (stepcli.advice.rules). Every file is read through stepcli.inputs: regular
files only, bounded in size, never blocking.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UnsetType

from stepcli.errors import StepcliError, TraceError
from stepcli.inputs import outline, read_document
from stepcli.runfolder.layout import STEP_LOG_SUFFIX, SUMMARY_FILE, SUMMARY_SCHEMA, SUMMARY_VERSION
from stepcli.runfolder.runs import (
    contained,
    read_saved,
    read_saved_json,
    rerooted,
    run_dirs,
    written_traces,
)
from stepcli.runfolder.summaryfile import AdviceItem, RunSummary, SummaryStepTimes
from stepcli.runfolder.summaryread import read_run_summary
from stepcli.steptimes import process_steps, trace_process_steps

if TYPE_CHECKING:
    from stepcli.report.data import ReportData
    from stepcli.traces.runtraces import RunTraces


def step_logs(run_dir: Path) -> list[dict[str, Any]]:
    """The per-process step logs of one run (`<run dir>/*.steps.json`), in rank order; unreadable
    ones skipped."""
    logs: list[dict[str, Any]] = []
    for path in sorted(run_dir.glob(f"*{STEP_LOG_SUFFIX}")):
        log = read_saved_json(path)  # (a link, or a file of another user's: left out)
        if log is not None:
            logs.append(log)
    logs.sort(key=lambda log: (log.get("rank") is None, log.get("rank") or 0, log.get("pid", 0)))
    return logs


def _saved_summary(run_dir: Path, folder: str) -> RunSummary | None:
    """The run summary `stepcli run` saved beside the step logs in the run folder `folder`,
    validated, its paths inside `folder` (runsummary.rerooted); None when there is none of this
    user's (a link is not followed)."""
    path = run_dir / SUMMARY_FILE
    data = read_saved(path)
    if data is None:
        return None
    return rerooted(read_run_summary(data, str(path)), folder)


def _logs_for_summary(summary: RunSummary) -> list[dict[str, Any]]:
    """The step logs of the run a summary describes: the newest run in its folder whose processes
    are the same."""
    pids = {p.pid for p in summary.processes if p.pid is not None}
    out_dir = summary.out_dir
    if not out_dir or not pids:
        return []
    for run_dir in run_dirs(out_dir):
        logs = step_logs(run_dir)
        if pids <= {log.get("pid") for log in logs}:
            return logs
    return []


def _run_traces(
    summary: RunSummary | None, logs: list[dict[str, Any]], folder: str | None = None
) -> list[str]:
    """The traces this run wrote that still exist (a reused folder also holds older runs' traces);
    with `folder` (a run folder read back), only those inside it, links followed: what a step log
    names is not trusted."""
    named = list((summary.traces if summary else None) or []) or [
        w["trace"] for log in logs for w in log.get("windows") or []
    ]
    return [
        path
        for path in named
        if isinstance(path, str)
        and os.path.exists(path)
        and (folder is None or contained(path, folder))
    ]


@dataclass
class _Inputs:
    summary: RunSummary | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)
    trace_paths: list[str] = field(default_factory=list)
    runs: int = 0
    # the run folder's traces were checked (written_traces): none more are taken from it
    checked: bool = False


def _add_folder(inputs: _Inputs, path: str) -> None:
    """A stepcli run folder (its latest run and that run's traces, or the run FOLDER/.stepcli/RUN_ID
    names), else a folder of traces."""
    from stepcli.fmt import say
    from stepcli.runfolder.runs import other_runs_note, pick_run
    from stepcli.traces.read.files import list_trace_files

    pick = pick_run(path)
    newest = pick.run_dir if pick is not None else None
    if pick is not None and newest is not None:
        path = pick.folder
        note = other_runs_note(pick, all_runs=False)
        if note:
            say(note)
        inputs.runs += 1
        inputs.logs = step_logs(newest)
        inputs.summary = _saved_summary(newest, path) or inputs.summary
        own = _run_traces(inputs.summary, inputs.logs, path)
        # (only the very files the run wrote: a forgery renamed over one since is left out, said)
        if own:
            inputs.trace_paths.extend(written_traces(newest, path, own))
            inputs.checked = True
            return
    try:
        inputs.trace_paths.extend(list_trace_files([path]))
    except TraceError:
        if newest is None:
            raise StepcliError(
                f"{path}: neither a stepcli run folder nor a folder of traces"
            ) from None


def _add_file(inputs: _Inputs, path: str) -> None:
    """A run summary (by its content), else a trace (the trace reader names the problem if it is
    neither)."""
    from stepcli.traces.read.files import reads_as_document

    name = os.path.basename(path)
    # (a gzipped trace is not inflated here first: only a stepcli document saved as NAME.json.gz)
    if ".pt.trace.json" in name or (name.endswith(".gz") and not reads_as_document(path)):
        inputs.trace_paths.append(path)
        return
    data = read_document(path)  # a regular file of bounded size, or one line saying why not
    if outline(data)[0] != "run":
        inputs.trace_paths.append(path)
        return
    inputs.runs += 1
    inputs.summary = read_run_summary(data, path)


def _classify(paths: Sequence[str]) -> _Inputs:
    """Sort the command line's PATHs into one run (summary and/or run folder) and any number of
    traces."""
    inputs = _Inputs()
    for path in paths:
        if os.path.isdir(path):
            _add_folder(inputs, path)
        elif not os.path.exists(path):
            from stepcli.inputs import broken_link

            raise StepcliError(f"{path}: {broken_link(path) or 'no such file or folder'}")
        else:
            _add_file(inputs, path)
    if inputs.runs > 1:
        raise StepcliError(
            "one run per report: give one run folder or run summary (plus any traces)"
        )
    if inputs.summary is not None and not inputs.logs:
        inputs.logs = _logs_for_summary(inputs.summary)
    if inputs.summary is not None and not inputs.trace_paths and not inputs.checked:
        inputs.trace_paths = _run_traces(inputs.summary, [])
    return inputs


def _step_times(logs: list[dict[str, Any]]) -> list[SummaryStepTimes]:
    return [
        SummaryStepTimes(
            worker=log.get("worker"),
            rank=log.get("rank"),
            pid=log.get("pid"),
            durations_ms=[d / 1000.0 for d in log.get("durations_us") or []],
            phases=str(log.get("phases") or "").ljust(len(log.get("durations_us") or []), "0"),
        )
        for log in logs
    ]


def with_step_logs(summary: RunSummary | None, logs: list[dict[str, Any]]) -> RunSummary | None:
    """The summary the page shows: the run's own, with every process's step times from the step logs
    when it lacks them (schema 1); without one, a summary rebuilt from the step logs (no command:
    the page says which inputs it read instead)."""
    if not logs or (summary is not None and summary.step_times):
        return summary
    from stepcli.run.summary.build import process_entry
    from stepcli.run.summary.compilesteps import compile_summary

    if summary is None:
        rebuilt = RunSummary(
            schema=SUMMARY_SCHEMA,
            schema_version=SUMMARY_VERSION,
            processes=[process_entry(log) for log in logs],
            traces=_run_traces(None, logs),
        )
    else:
        rebuilt = msgspec.structs.replace(summary)
    rebuilt.step_times = _step_times(logs)
    if not rebuilt.compile:
        rebuilt.compile = compile_summary(logs)
    return rebuilt


def page_advice(
    summary: RunSummary | None, trace_paths: Sequence[str], traces: RunTraces
) -> list[AdviceItem]:
    """The summary's advice, or (inputs that carry none) the advice `stepcli run` would have given
    them."""
    if summary is not None and not isinstance(summary.advice, UnsetType):
        return summary.advice
    from stepcli.advice.gather import advise_run

    analysis = None
    if trace_paths:
        try:
            # read once, with the shapes the page will want
            traces.parts(list(trace_paths), shapes=True)
            analysis = traces.summary(list(trace_paths)).to_dict()
        except StepcliError:
            analysis = None  # the page says why in a note
    processes = process_steps(summary) if summary is not None else []
    if not processes and analysis:
        processes = trace_process_steps(analysis["steps"])
    return [item.to_item() for item in advise_run(summary, analysis, processes)]


def build(
    summary: RunSummary | None,
    logs: list[dict[str, Any]],
    trace_paths: Sequence[str],
    *,
    sources: Sequence[str] = (),
    traces: RunTraces | None = None,
) -> ReportData:
    """The page's data for a run summary (or None), its step logs (may be empty) and trace files
    (may be none)."""
    from stepcli.report.data import build as page_data
    from stepcli.traces.runtraces import RunTraces

    traces = traces if traces is not None else RunTraces()
    shown = with_step_logs(summary, logs)
    advice = page_advice(shown, trace_paths, traces)
    return page_data(shown, trace_paths, advice=advice, sources=sources, traces=traces)


def gather(paths: Sequence[str]) -> ReportData:
    """`stepcli report PATH...`: read the inputs and compute the page's data."""
    inputs = _classify(paths)
    return build(inputs.summary, inputs.logs, inputs.trace_paths, sources=list(paths))


def report_main(paths: Sequence[str], out: str | None) -> str:
    """`stepcli report`: build the page for PATHs and write it; returns the path written."""
    from stepcli.report import check_output, default_output, write_page
    from stepcli.slowwork import reading

    with reading(paths):  # a large trace takes seconds: said, not silent
        data = gather(paths)
    if out is None:
        from stepcli.runfolder.runs import pick_run

        pick = pick_run(paths[0]) if os.path.isdir(paths[0]) else None
        named = pick is not None and pick.named
        # a run named by its id gets its own page beside the folder's (never inside the private
        # .stepcli/)
        out = (
            os.path.join(pick.folder, f"report-{pick.run_dir.name}.html")
            if pick and named
            else default_output(paths[0])
        )
    check_output(out)
    return write_page(data, out)


def write_run_report(summary: RunSummary, traces: RunTraces | None = None) -> str:
    """After `stepcli run`: report.html in the output folder (report-N.html when the user's own
    report.html is there: it is never overwritten); returns its path.

    The launcher has saved the summary beside the step logs, so `stepcli report OUT_DIR` rebuilds
    the same page. `traces`: what the run summary already read (stepcli.traces.runtraces), so no
    trace is read a second time.
    """
    from stepcli.fmt import say
    from stepcli.report import REPORT_NAME, run_report_path, write_new_file, write_page
    from stepcli.report.data import build as page_data
    from stepcli.report.page import render

    paths = [p for p in summary.traces or [] if os.path.exists(p)]
    data = page_data(summary, paths, traces=traces)
    out_dir = summary.out_dir
    path = run_report_path(out_dir or ".")
    if os.path.basename(path) == REPORT_NAME:
        return write_page(data, path)
    write_new_file(render(data, path), path)  # the user's own report.html is kept
    say(f"{REPORT_NAME} in {out_dir} was not written by stepcli: kept, this run's page is {path}")
    return path
