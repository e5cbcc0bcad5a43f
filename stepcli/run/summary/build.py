"""The run summary: step logs + traces of one `stepcli run` -> a versioned document, printed and/or
saved.

The document (schema "stepcli.run", typed in stepcli.runfolder.summaryfile, documented field by
field in docs/reference/summary-json.md) is what `--json` writes and what `stepcli compare` and
`stepcli report` read, so building it (here, advice included) is kept apart from rendering it
(stepcli.run.summary.console for the terminal, stepcli.report for the page).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from stepcli import __version__
from stepcli.agent.config import AgentConfig
from stepcli.agent.schedule import NONE
from stepcli.agent.tracker import AFTER_WINDOW, FOREIGN
from stepcli.errors import StepcliError
from stepcli.run.summary.compilesteps import compile_summary, compiled_steps
from stepcli.run.summary.culpritsection import culprit_section
from stepcli.run.summary.hangreport import hang_summary
from stepcli.run.summary.runnotes import hook_and_process_notes, primary_notes, why_no_steps
from stepcli.run.summary.threads import threads_section
from stepcli.run.summary.whatifline import what_would_help
from stepcli.runfolder.layout import SUMMARY_SCHEMA, SUMMARY_VERSION
from stepcli.runfolder.summaryfile import (
    AdviceItem,
    OtherMs,
    OutsideSteps,
    PeakMemory,
    PopulationStats,
    Process,
    RecordedWith,
    RunSummary,
    Steps,
    StepTimeMs,
    SummaryOpRow,
    SummaryStepTimes,
    SummaryWindow,
)
from stepcli.stats import describe
from stepcli.steptimes import process_steps
from stepcli.traces.analyses.shares import STEP_KEY

if TYPE_CHECKING:
    from stepcli.traces.analyses.results import OpRow as TraceOpRow
    from stepcli.traces.analyses.results import TraceSummary
    from stepcli.traces.runtraces import RunTraces

TOP_N = 20


# What the device's work and its collectives ran under: the hardware queues per device, and NCCL's
# settings.
_RECORDED_ENVIRONMENT = re.compile(r"CUDA_DEVICE_MAX_CONNECTIONS|NCCL_[A-Z0-9_]*")
_MAX_VALUE = 1000  # characters of a value kept


def recorded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`CUDA_DEVICE_MAX_CONNECTIONS` and the `NCCL_*` variables the program was started with, by
    name: they change how streams overlap and how collectives run, so a comparison of two runs must
    be able to see them."""
    return {
        name: environ[name][:_MAX_VALUE]
        for name in sorted(environ)
        if _RECORDED_ENVIRONMENT.fullmatch(name)
    }


def _step_time_ms(
    logs: list[dict[str, Any]],
    untouched: list[float],
    profiled: list[float],
    first: list[float],
    after: list[float],
) -> StepTimeMs:
    """Each population's statistics over every process's steps together, with `per_process`: its
    count in each process (in `processes` order), so that a count can be said per rank, as `steps`
    and the advice say theirs."""
    counts = [_step_populations([log])[:4] for log in logs]

    def population(index: int, values: list[float]) -> PopulationStats | None:
        stats = describe(values)
        return (
            PopulationStats(**stats, per_process=[len(c[index]) for c in counts]) if stats else None
        )

    return StepTimeMs(
        untouched=population(0, untouched),
        profiled=population(1, profiled),
        first_step=population(2, first),
        after_window=population(3, after),
    )


def _step_populations(
    logs: list[dict[str, Any]],
) -> tuple[list[float], list[float], list[float], list[float], int]:
    """Untouched, profiled and after-a-window step times (ms) over all processes; step 0 (start-up)
    is kept apart, and the first step after each window too: it pays for the profiler's stop and
    save (AFTER_WINDOW)."""
    untouched: list[float] = []
    profiled: list[float] = []
    first: list[float] = []
    after: list[float] = []
    foreign = 0
    for log in logs:
        # torch.compile steps: kept apart like step 0 (see compilereport)
        compiled = compiled_steps(log)
        for index, (micros, phase) in enumerate(
            zip(log.get("durations_us", []), log.get("phases", ""))
        ):
            millis = micros / 1000.0
            code = int(phase)
            if index == 0:
                first.append(millis)
            elif index in compiled:
                continue
            elif code == FOREIGN:
                foreign += 1
            elif code == AFTER_WINDOW:
                after.append(millis)
            elif code == NONE:
                untouched.append(millis)
            else:
                profiled.append(millis)
    return untouched, profiled, first, after, foreign


def _primary(logs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The process that speaks for the run: rank 0, else the one that made the most steps."""
    if not logs:
        return None
    ranked = [log for log in logs if log.get("rank") == 0]
    return ranked[0] if ranked else max(logs, key=lambda log: log.get("global_steps", 0))


def _trace_analysis(
    trace_paths: list[str], notes: list[str], traces: RunTraces | None = None
) -> TraceSummary | None:
    """The merged summary of the run's traces; read through `traces` when given, so report.html
    reuses the read."""
    if not trace_paths:
        return None
    try:
        if traces is not None:
            return traces.summary(trace_paths)
        from stepcli.traces.engine import summarize_paths

        return summarize_paths(trace_paths)
    except StepcliError as exc:
        notes.append(f"could not summarize the traces: {exc.message}")
    except Exception as exc:  # a bug in the analysis must not hide what the run measured
        notes.append(f"could not summarize the traces: {type(exc).__name__}: {exc}")
    return None


def build_run_summary(
    config: AgentConfig,
    *,
    command: list[str],
    exit_status: int,
    started_at: float,
    duration_s: float,
    traces: RunTraces | None = None,
    on_hang: str | None = None,
    hang_ended: bool = False,
    hang_folders: Sequence[str] = (),
) -> RunSummary:
    """Everything the run measured, as a JSON-able document (schema `stepcli.run`, version 2), its
    advice included. With `traces`, the trace files are read through it (and kept there for
    report.html). `on_hang` and `hang_ended` (the launcher ended the job after a hang dump) go into
    the `hang` section, read from `hang_folders` only: the OUT/hang-<n>/ folders this run's hang
    watch wrote."""
    from stepcli.runfolder.steplogreader import load_step_logs

    # signed, schema-checked, traces inside out_dir
    logs, refused = load_step_logs(config, since=started_at)
    logs.sort(key=lambda log: (log.get("rank") is None, log.get("rank") or 0, log.get("pid", 0)))
    primary = _primary(logs)
    untouched, profiled, first, after, foreign = _step_populations(logs)
    windows = _windows(logs)
    trace_paths = [w.trace for w in windows if os.path.exists(w.trace)]
    notes: list[str] = list(refused)
    if primary is None:
        notes.append(why_no_steps(config, exit_status, command))
    else:
        notes += primary_notes(
            config, primary, logs, bool(windows), exit_status, hang_folders, hang_ended
        )
    notes += hook_and_process_notes(config, logs, notes, foreign)
    analysis = _trace_analysis(trace_paths, notes, traces)
    summary = RunSummary(
        schema=SUMMARY_SCHEMA,
        schema_version=SUMMARY_VERSION,
        stepcli_version=__version__,
        run_id=uuid.uuid4().hex,  # tells runs apart when several are compared per side
        command=list(command),
        exit_status=exit_status,
        started_at=datetime.fromtimestamp(started_at, timezone.utc).isoformat(timespec="seconds"),
        duration_s=round(duration_s, 3),
        host=socket.gethostname(),
        platform=platform.platform(),
        python=(primary or {}).get("python") or platform.python_version(),
        torch=next((log.get("torch") for log in logs if log.get("torch")), None),
        environment=recorded_environment(os.environ),
        out_dir=config.out_dir,
        schedule={key: value for key, value in config.schedule.to_dict().items()},
        on_demand=config.on_demand,
        steps=Steps(
            global_=(primary or {}).get("global_steps", 0),
            requesters={r["name"]: r["calls"] for r in (primary or {}).get("requesters", [])},
        ),
        step_time_ms=_step_time_ms(logs, untouched, profiled, first, after),
        timeline_ms=_durations_ms(primary or {}),
        timeline_phases=(primary or {}).get("phases", "")[:_MAX_STEPS],
        # every step of every process, for compare's intervals
        step_times=[_step_times_entry(log) for log in logs],
        processes=[process_entry(log) for log in logs],
        windows=windows,
        triggered=_not_recorded_triggers(logs),
        traces=trace_paths,
        peak_memory=_peak_memory(logs),
        threads=threads_section(logs),
        compile=compile_summary(logs),
        memory_snapshots=run_snapshots(logs, config.out_dir),
        hang=hang_summary(  # --hang-timeout reports (stepcli/run/summary/hangreport.py)
            hang_folders,
            started_at,
            timeout_s=config.hang_timeout or None,
            on_hang=on_hang if config.hang_timeout else None,
            ended_job=hang_ended,
        ),
        notes=notes,
    )
    analysed = _add_trace_sections(summary, analysis, logs, untouched)
    untouched_stats = describe(untouched)
    median = untouched_stats["median"] if untouched_stats else None
    summary.what_would_help = what_would_help(trace_paths, median, notes, traces)
    summary.advice = _advice(summary, analysed)
    return summary


# steps kept per process: a longer run keeps its first ones (step_record has them all)
_MAX_STEPS = 100_000


def _durations_ms(log: dict[str, Any]) -> list[float]:
    return [round(us / 1000.0, 3) for us in log.get("durations_us", [])][:_MAX_STEPS]


def _step_times_entry(log: dict[str, Any]) -> SummaryStepTimes:
    """One entry of `step_times`: one digit per step, as timeline_phases."""
    return SummaryStepTimes(
        worker=log.get("worker"),
        rank=log.get("rank"),
        pid=log.get("pid"),
        durations_ms=_durations_ms(log),
        phases=log.get("phases", "")[:_MAX_STEPS],
    )


def _windows(logs: list[dict[str, Any]]) -> list[SummaryWindow]:
    """Every process's saved windows, by first step, each with the process's worker name."""
    windows = [
        msgspec.convert(dict(window, worker=log["worker"]), SummaryWindow)
        for log in logs
        for window in log.get("windows", [])
    ]
    windows.sort(key=lambda w: (w.first_step, w.worker))
    return windows


def _not_recorded_triggers(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """--capture-on-slow windows a process did not record (stepcli.runfolder.steprecordreader.attach
    adds the recorded ones)."""
    return [
        dict(t, worker=log["worker"])
        for log in logs
        for t in log.get("triggers_not_recorded") or []
        if isinstance(t, dict)
        and isinstance(t.get("first_step"), int)
        and isinstance(t.get("last_step"), int)
    ]


def _peak_memory(logs: list[dict[str, Any]]) -> PeakMemory:
    rss = [log["peak_rss_bytes"] for log in logs if log.get("peak_rss_bytes")]
    cuda = [log["cuda_peak_bytes"] for log in logs if log.get("cuda_peak_bytes")]
    return PeakMemory(rss_bytes=max(rss) if rss else None, cuda_bytes=max(cuda) if cuda else None)


def _add_trace_sections(
    summary: RunSummary,
    analysis: TraceSummary | None,
    logs: list[dict[str, Any]],
    untouched: list[float],
) -> dict[str, Any] | None:
    """The sections read from the traces (operators, ranks, straggler, culprit, breakdown, device,
    FLOPs), set on `summary`; the analysis as the advice reads it (None without traces)."""
    analysed = analysis.to_dict() if analysis is not None else None
    summary.culprit = culprit_section(analysis.culprit if analysis else None, logs)
    summary.flops, summary.device = _at_program_pace(analysed, untouched)
    if analysis is None or analysed is None:
        return None
    # ProfilerStep* is the step annotation itself, not work: it would always top the list.
    summary.top_operators = [_op_row(op) for op in analysis.cpu_ops if op.name != STEP_KEY][:TOP_N]
    summary.top_kernels = [_op_row(op) for op in analysis.device_kernels[:TOP_N]]
    summary.ranks = analysed["ranks"]
    summary.slowest_rank = analysis.slowest_rank
    summary.straggler = analysis.straggler
    summary.share_of = analysis.share_of
    summary.outside_steps = OutsideSteps(
        events=analysis.outside_events, self_ms=analysis.outside_ms
    )
    summary.breakdown_ms = analysis.breakdown_ms.to_dict() if analysis.breakdown_ms else None
    summary.other_ms = (
        msgspec.convert(analysed["other_ms"], OtherMs) if analysed["other_ms"] else None
    )
    summary.recorded_with = RecordedWith(stacks=analysis.has_stacks, shapes=analysis.has_shapes)
    return analysed


def _op_row(row: TraceOpRow) -> SummaryOpRow:
    return SummaryOpRow(
        name=row.name,
        calls=row.calls,
        self_ms=row.self_ms,
        total_ms=row.total_ms,
        avg_ms=row.avg_ms,
        self_share=row.self_share,
        shape=row.shape if row.shape is not None else UNSET,
    )


def _at_program_pace(
    analysis: dict[str, Any] | None, untouched: list[float]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The `flops` and `device` sections with achieved FLOP/s and MFU at the untouched steps' pace
    (their median time: the program's own, without the profiler's cost) when there are untouched
    steps; the recorded steps' figures stay under `achieved_flops_per_s_recorded` and `mfu_recorded`
    (stepcli.traces.analyses.flops.at_untouched_pace)."""
    from stepcli.traces.analyses.flops import at_untouched_pace

    flops, device = (analysis or {}).get("flops"), (analysis or {}).get("device")
    stats = describe(untouched)
    paced = at_untouched_pace(flops, stats["median"] if stats else None)
    if paced is not flops and paced is not None and device is not None:
        device = device | {key: paced[key] for key in flops or {} if key in device}
    return paced, device


def _advice(summary: RunSummary, analysis: dict[str, Any] | None) -> list[AdviceItem]:
    """The run's advice; a bug in a rule must not hide what the run measured (it becomes a note)."""
    from stepcli.advice.gather import advise_run

    try:
        return [item.to_item() for item in advise_run(summary, analysis, process_steps(summary))]
    except Exception as exc:
        summary.notes.append(f"could not compute the advice: {type(exc).__name__}: {exc}")
        return []


def run_snapshots(logs: list[dict[str, Any]], out_dir: str) -> list[str]:
    """The CUDA memory snapshots this run's processes say they wrote (their signed step logs), each
    still a regular file of this user's in the output folder (not a link): a snapshot planted there
    is never read."""
    import stat

    names: list[str] = []
    for log in logs:
        listed = log.get("memory_snapshots")
        for name in listed if isinstance(listed, list) else []:
            if (
                not isinstance(name, str)
                or "/" in name
                or name.startswith(".")
                or not name.endswith(".pickle")
            ):
                continue
            try:
                info = os.lstat(os.path.join(out_dir, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and (
                not hasattr(os, "getuid") or info.st_uid == os.getuid()
            ):
                names.append(name)
    return sorted(set(names))


def process_entry(log: dict[str, Any]) -> Process:
    """One entry of `processes` from a process's step log."""
    return Process(
        worker=log.get("worker"),
        rank=log.get("rank"),
        pid=log.get("pid"),
        argv=log.get("argv"),
        global_steps=log.get("global_steps"),
        exit=log.get("exit"),
        peak_rss_bytes=log.get("peak_rss_bytes"),
        cuda_peak_bytes=log.get("cuda_peak_bytes"),
        intra_op_threads=log.get("intra_op_threads"),
        requesters={r["name"]: r["calls"] for r in log.get("requesters", [])},
    )


def analysis_progress(
    enabled: bool = True, out_dir: str | None = None
) -> AbstractContextManager[Any]:
    """A spinner on stderr while the traces are read after the program exits (seconds for large
    traces), so stepcli is not silent; on a terminal. Pipes and CI logs get no control characters:
    for large traces in `out_dir`, progress lines instead (stepcli.slowwork)."""
    try:
        interactive = enabled and sys.stderr.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        from stepcli.slowwork import reading

        return reading([out_dir], enabled) if out_dir else contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status("stepcli: reading the traces ...", spinner="dots")


def write_run_summary(summary: RunSummary, path: str, *, private_folder: bool = False) -> None:
    """`--json PATH`, written atomically through a new file (stepcli.safefile). `private_folder`:
    `path` is in the run's control folder, which must still be this user's private folder (not one
    put in its place)."""
    import orjson

    from stepcli import safefile
    from stepcli.agent.controlfiles import open_folder

    # orjson writes the builtins msgspec gives (fields in declaration order, UNSET ones left out),
    # so the bytes, numbers included, are those summaries always had.
    data = orjson.dumps(
        msgspec.to_builtins(summary), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
    )
    target = Path(path)
    try:
        if private_folder:
            fd = open_folder(str(target.parent))
            try:
                safefile.write_bytes(target.name, data, safefile.PRIVATE, dir_fd=fd)
            finally:
                os.close(fd)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            safefile.write_bytes(str(target), data)
    except OSError as exc:
        raise StepcliError(f"--json {path}: {exc.strerror or exc}") from None
