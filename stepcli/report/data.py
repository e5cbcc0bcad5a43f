"""The numbers one report page shows, taken from a run summary and the traces; nothing here computes
a new figure.

The page renders a RunSummary (stepcli.runfolder.summaryfile: its step times, tables, notes and
advice, all computed by `stepcli run`) plus what only the traces hold (operators by input shape, one
breakdown bar per rank, the memory curve), read through stepcli.traces. Finding the inputs of
`stepcli report PATH` and computing the advice of inputs that carry none is
stepcli.run.summary.htmlreport's job.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UnsetType

from stepcli.errors import StepcliError
from stepcli.fmt import plural
from stepcli.runfolder.summaryfile import (
    Advice,
    AdviceItem,
    HangSection,
    RunSummary,
    StepRecord,
    WhatWouldHelp,
)
from stepcli.stats import Stats, describe
from stepcli.steptimes import (
    ProcessSteps,
    process_steps,
    slowest_by_steps,
    trace_process_steps,
    worker_label,
)
from stepcli.traces.analyses.shares import STEP_KEY, overlap_note

if TYPE_CHECKING:
    from stepcli.traces.analyses.results import FilePart
    from stepcli.traces.runtraces import RunTraces

TOP_ROWS = 25  # operator rows per table in the page (sortable); the terminal shows 10


@dataclass
class ReportData:
    """Everything one report page shows, already computed."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)  # (label, path)
    notes: list[str] = field(default_factory=list)
    processes: list[ProcessSteps] = field(default_factory=list)
    slowest: str | None = None
    # the straggler's evidence, the sentence the terminal prints
    slowest_evidence: str | None = None
    distribution: list[float] = field(default_factory=list)
    distribution_label: str = ""
    stats: list[tuple[str, Stats]] = field(default_factory=list)
    breakdowns: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    device: dict[str, float] | None = None
    # ranks[] entries, each with its `device`
    device_ranks: list[dict[str, Any]] = field(default_factory=list)
    cpu_ops: list[dict[str, Any]] = field(default_factory=list)
    outside_note: str | None = None  # host events outside every recorded step, left out of cpu_ops
    # the CPU table's Self % adds up to over 100% (other threads), and why
    overlap_note: str | None = None
    kernels: list[dict[str, Any]] = field(default_factory=list)
    shape_ops: list[dict[str, Any]] = field(default_factory=list)
    memory_peaks: list[tuple[str, int | None, int | None]] = field(default_factory=list)
    memory_curves: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    culprit: dict[str, Any] | None = None  # the `culprit` section (stepcli.traces.analyses.culprit)
    # the run's output folder, where `stepcli run --memory` leaves oom-*.pickle
    out_dir: str | None = None
    # the snapshot files of the run (names in out_dir) its summary lists; None for a summary from
    # before it did
    memory_snapshots: list[str] | None = None
    after_window: int = 0  # steps set aside after a window (phase "5"), all processes
    step_record: list[StepRecord] = field(default_factory=list)  # shown by report/wholerun.py
    # the windows --capture-on-slow placed
    triggered: list[dict[str, Any]] = field(default_factory=list)
    hang: HangSection | None = None  # --hang-timeout's reports, shown by report/hang.py
    # the run's, which the hang section says when --on-hang kill ended the job
    exit_status: int | None = None
    what_would_help: WhatWouldHelp | None = None  # the run summary's (whatif's answer, kept short)
    # the flame graph's stacks (stepcli.traces.analyses.pystacks)
    python_stacks: dict[str, Any] | None = None
    stacks_recorded: bool = False  # the traces hold Python frames (none may fall inside a step)
    stacks_known: bool = False  # the traces were read here (a summary alone cannot say)
    # the breakdown's "other" explained (render/stacksection.py)
    other_lines: list[str] = field(default_factory=list)


def build(
    summary: RunSummary | None,
    trace_paths: Sequence[str],
    *,
    advice: Sequence[AdviceItem] | None = None,
    sources: Sequence[str] = (),
    traces: RunTraces | None = None,
) -> ReportData:
    """The page's data from a run summary (or None) and trace files (may be none). `advice`: the
    summary's own unless given. `traces` holds what was already read of these files (after `stepcli
    run`, by the run summary); without it they are read here, once."""
    from stepcli.traces.runtraces import RunTraces

    traces = traces if traces is not None else RunTraces()
    data = ReportData(title="stepcli report", out_dir=(summary.out_dir if summary else None))
    data.memory_snapshots = summary.memory_snapshots if summary else None
    data.step_record = list((summary.step_record if summary else None) or [])
    data.triggered = list((summary.triggered if summary else None) or [])
    data.hang = summary.hang if summary else None
    data.exit_status = summary.exit_status if summary else None
    data.what_would_help = summary.what_would_help if summary else None
    parts = _trace_parts(data, traces, trace_paths, summary is not None)
    analysis = traces.summary(list(trace_paths)).to_dict() if parts else None
    if summary is not None and summary.command is not None:
        _add_run_facts(data, summary)
    else:  # traces only, or a run folder without its summary
        data.facts.append(("inputs", ", ".join(sources) or ", ".join(trace_paths)))
        data.notes.extend((summary.notes if summary else None) or [])
    _add_step_times(data, summary, analysis)
    if analysis:
        _add_trace_tables(data, analysis, parts)
        data.device = _at_the_runs_pace(data.device, summary)
    elif summary is not None:
        _add_summary_tables(data, summary)
    # The slowest rank is the straggler of stepcli.traces.analyses.ranks or nobody: the terminal and
    # --json say the same.
    ranks_analysed = (
        len((analysis or {}).get("ranks") or (summary.ranks if summary else None) or []) > 1
    )
    slowest = slowest_by_steps(data.processes)
    # step logs alone: the advice's step-time rule speaks for them
    if not ranks_analysed and slowest is not None:
        data.slowest = f"rank {slowest}"
    memory = (summary.processes if summary else None) or []
    data.memory_peaks = [(worker_label(p), p.peak_rss_bytes, p.cuda_peak_bytes) for p in memory]
    data.memory_curves = traces.memory_curves(trace_paths)
    data.files = [("trace", str(path)) for path in trace_paths]
    if summary is None and not trace_paths and not data.processes:
        raise StepcliError("nothing to report: no steps and no traces in the inputs")
    data.culprit = (summary.culprit if summary else None) or (analysis or {}).get("culprit")
    data.advice = [
        Advice.from_item(item)
        for item in (advice if advice is not None else (summary.advice if summary else None) or [])
    ]
    if not ranks_analysed and not any(a.rule == "straggler" for a in data.advice):
        data.slowest = None  # a balanced run has no slowest rank
    if ranks_analysed:
        _one_slowest_rank(data, summary, analysis)
    data.overlap_note = overlap_note(data.cpu_ops)  # over every row, before the cut
    data.cpu_ops = data.cpu_ops[:TOP_ROWS]
    data.kernels = data.kernels[:TOP_ROWS]
    return data


def _trace_parts(
    data: ReportData, traces: RunTraces, paths: Sequence[str], run: bool
) -> list[list[FilePart]]:
    """Per trace file: its plain part and its by-shape part. A run's page still shows what its
    summary measured when a trace cannot be read (e.g. one cut short by a kill): a note says why the
    tables are thin."""
    if not paths:
        return []
    try:
        return traces.parts(list(paths), shapes=True)
    except StepcliError as exc:
        if not run:
            raise
        data.notes.append(f"could not read the traces: {exc.message}")
        return []


def _add_step_times(
    data: ReportData, summary: RunSummary | None, analysis: dict[str, Any] | None
) -> None:
    """Step times over the run (every process the summary holds, else the traces' recorded steps)
    and their distribution: untouched steps (no profiler overhead) when there are any, else the
    recorded ones."""
    processes = process_steps(summary) if summary is not None else []
    if not processes and analysis:
        processes = trace_process_steps(analysis["steps"])
    data.processes = processes
    untouched = [
        v
        for p in processes
        for s, v, c in zip(p.steps, p.values_ms, p.phases)
        if c == "0" and s != 0
    ]
    # The profiled steps (warmup + recorded): the set and the name of the run summary's terminal and
    # --json.
    recorded = [
        v
        for p in processes
        for s, v, c in zip(p.steps, p.values_ms, p.phases)
        if c in "123" and s != 0
    ]
    if untouched:
        data.distribution = untouched
        data.distribution_label = "untouched steps (no profiler running), start-up left out"
    elif recorded:
        data.distribution, data.distribution_label = recorded, "profiled steps"
    # The first step after each window pays for its stop and save: neither untouched nor recorded,
    # only counted.
    data.after_window = sum(
        1 for p in processes for s, c in zip(p.steps, p.phases) if c == "5" and s != 0
    )
    for label, values in (("untouched steps", untouched), ("profiled steps", recorded)):
        stats = describe(values)
        if stats:
            data.stats.append((label, stats))


def _add_trace_tables(
    data: ReportData, analysis: dict[str, Any], parts: list[list[FilePart]]
) -> None:
    """Breakdown, operator tables and shapes from the traces: every operator, one breakdown bar per
    rank."""
    from stepcli.traces.analyses.mergeparts import breakdown_of, merge_parts
    from stepcli.traces.render.stacksection import other_lines
    from stepcli.traces.render.terminal import left_out_notes, outside_note, repeated_note

    data.cpu_ops = [op for op in analysis["cpu_ops"] if op["name"] != STEP_KEY]
    data.python_stacks = analysis.get("python_stacks")
    data.stacks_recorded = bool((analysis.get("recorded_with") or {}).get("stacks"))
    data.stacks_known = True
    data.other_lines = other_lines(analysis, width=100)
    data.outside_note = outside_note(analysis.get("outside_steps"))
    data.kernels = analysis["device_kernels"]
    data.device = analysis["device"]
    data.device_ranks = analysis["ranks"]
    by_rank: dict[int | None, list[FilePart]] = {}
    for plain, _shaped in parts:
        by_rank.setdefault(plain.rank, []).append(plain)
    if len(by_rank) > 1:  # one bar per rank (all its windows), so the slowest rank stands out
        for rank, rank_parts in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            per = breakdown_of(rank_parts)
            if per is not None:
                data.breakdowns.append(
                    (f"rank {rank}" if rank is not None else "no rank", per.to_dict())
                )
    elif analysis["breakdown_ms"]:
        data.breakdowns.append(
            ("all steps" if len(parts) == 1 else "all traces", analysis["breakdown_ms"])
        )
    if analysis["slowest_rank"] is not None:
        data.slowest = f"rank {analysis['slowest_rank']}"
    if any(shaped.has_shapes for _plain, shaped in parts):
        shaped_ops = merge_parts([p[1] for p in parts], group_by_shape=True).to_dict()["cpu_ops"]
        data.shape_ops = [op for op in shaped_ops if op["name"] != STEP_KEY][:TOP_ROWS]
    if analysis.get("skipped_events"):
        data.notes.append(
            f"{analysis['skipped_events']} trace event(s) had unusable times and were left out"
        )
    for note in (repeated_note(analysis.get("repeated_ranks")), analysis.get("mixed_jobs")):
        if note:
            data.notes.append(note)
    data.notes.extend(left_out_notes(analysis))


def _at_the_runs_pace(
    device: dict[str, Any] | None, summary: RunSummary | None
) -> dict[str, Any] | None:
    """The traces' device figures with the run summary's FLOP/s and MFU when the summary took them
    at the untouched steps' pace (stepcli.run.summary.build): the traces alone only know the
    recorded steps' pace."""
    flops = summary.flops if summary else None
    if not device or not flops or flops.get("pace") != "untouched":
        return device
    return device | {key: flops[key] for key in flops if key in device}


def _one_slowest_rank(
    data: ReportData, summary: RunSummary | None, analysis: dict[str, Any] | None
) -> None:
    """The slowest rank and its evidence as the terminal and --json have them: the run summary's own
    answer when there is one (`slowest_rank`, `straggler`: what `stepcli run` printed), else the
    traces' analysis; nobody when that answer is nobody. One answer, shown the same everywhere
    (never a second computation that could differ)."""
    if summary is not None and not isinstance(summary.slowest_rank, UnsetType):
        rank, straggler = summary.slowest_rank, summary.straggler or {}
    elif analysis is not None:
        rank, straggler = analysis.get("slowest_rank"), analysis.get("straggler") or {}
    else:
        return
    data.slowest = f"rank {rank}" if rank is not None else None
    data.slowest_evidence = straggler.get("evidence") if rank is not None else None


def _add_summary_tables(data: ReportData, summary: RunSummary) -> None:
    """Without readable traces: what the run summary kept of them."""
    data.cpu_ops = [msgspec.to_builtins(op) for op in summary.top_operators]
    data.kernels = [msgspec.to_builtins(op) for op in summary.top_kernels]
    data.device = summary.device
    data.device_ranks = [dict(rank) for rank in summary.ranks or []]
    breakdown = summary.breakdown_ms
    if breakdown:
        data.breakdowns.append(("recorded steps", breakdown))
    if isinstance(summary.slowest_rank, int):
        data.slowest = f"rank {summary.slowest_rank}"


def _add_run_facts(data: ReportData, summary: RunSummary) -> None:
    """The run's facts (command, status, where and when, schedule, steps) and its notes."""
    command = summary.command or []
    data.title = f"stepcli report: {shlex.join(command)}" if command else "stepcli report"
    status = summary.exit_status
    facts = data.facts
    facts.append(("command", shlex.join(command)))
    if status is not None:
        facts.append(("exit status", str(status)))
    for key, label in (
        ("started_at", "started"),
        ("duration_s", "duration (s)"),
        ("host", "host"),
        ("platform", "platform"),
        ("python", "python"),
        ("torch", "torch"),
        ("stepcli_version", "stepcli"),
    ):
        value = getattr(summary, key)
        if value is not None:
            facts.append((label, str(value)))
    schedule = summary.schedule or {}
    if schedule:
        facts.append(
            ("schedule", ", ".join(f"{k.replace('_', '-')} {v}" for k, v in schedule.items()))
        )
    steps = summary.steps
    if steps:
        requesters = ", ".join(f"{k} {v}" for k, v in steps.requesters.items())
        facts.append(("steps", f"{steps.global_}" + (f" ({requesters})" if requesters else "")))
    processes = summary.processes or []
    if len(processes) > 1:
        facts.append(
            (
                "processes",
                ", ".join(
                    f"{worker_label(p)}: {plural(p.global_steps or 0, 'step')}" for p in processes
                ),
            )
        )
    if summary.out_dir:
        facts.append(("output folder", str(summary.out_dir)))
    data.notes.extend(str(n) for n in summary.notes or [])
