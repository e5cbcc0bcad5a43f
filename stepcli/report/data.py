"""Gather what the HTML report shows from a run summary, a run folder's step logs, and traces.

The run summary's layout is read only through the small accessors at the top of this module (`_process_steps`,
`_summary_*`), so a new schema version changes one place. Numbers come from the existing engine
(`stepcli.traces.analysis.summarize`, the run summary); nothing here recomputes an operator table.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepcli.agent.config import STEP_LOG_SUFFIX
from stepcli.errors import StepcliError, TraceError
from stepcli.run.advice import Advice, Evidence, advise
from stepcli.run.compiles import compiled_steps
from stepcli.run.deviceadvice import advise_device
from stepcli.stats import Stats, describe
from stepcli.traces.shares import overlap_note

if TYPE_CHECKING:
    from stepcli.traces.model import FilePart
    from stepcli.traces.readonce import RunTraces

TOP_ROWS = 25  # operator rows per table in the page (sortable); the terminal shows 10
RUN_SCHEMA = "stepcli.run"
SUMMARY_FILE = "summary.json"  # written by `stepcli run` next to the step logs, so `stepcli report DIR` has it all


# ---------------------------------------------------------------------------------------------------------------
# Accessors for the run summary and step logs. Schema v1 holds one timeline (the primary process); a later schema
# may hold every process's step times: both are read here and nowhere else.


@dataclass(frozen=True)
class ProcessSteps:
    """One process's step times over the whole run."""

    label: str
    rank: int | None
    steps: list[int]
    values_ms: list[float]
    phases: str


def _process_steps_from_summary(summary: dict[str, Any]) -> list[ProcessSteps]:
    out: list[ProcessSteps] = []
    for proc in summary.get("processes") or []:
        for key in ("step_times_ms", "durations_ms", "timeline_ms"):
            values = proc.get(key)
            if isinstance(values, list) and values:
                phases = str(proc.get("phases") or proc.get("timeline_phases") or "").ljust(len(values), "0")
                phases = _mark_compiles(phases, _compiled_by_worker(summary).get(str(proc.get("worker")), set()))
                out.append(
                    ProcessSteps(
                        label=_worker_label(proc),
                        rank=proc.get("rank"),
                        steps=list(range(len(values))),
                        values_ms=[float(v) for v in values],
                        phases=phases[: len(values)],
                    )
                )
                break
    if out:
        return out
    timeline = summary.get("timeline_ms") or []
    if timeline:
        procs = summary.get("processes") or [{}]
        primary = next((p for p in procs if p.get("rank") == 0), None) or max(
            procs, key=lambda p: p.get("global_steps") or 0
        )
        phases = str(summary.get("timeline_phases") or "").ljust(len(timeline), "0")
        out.append(
            ProcessSteps(
                label=_worker_label(primary),
                rank=primary.get("rank"),
                steps=list(range(len(timeline))),
                values_ms=[float(v) for v in timeline],
                phases=phases[: len(timeline)],
            )
        )
    return out


def _mark_compiles(phases: str, compiled: set[int]) -> str:
    """Untouched steps in which torch compiled get their own code, "c", so the step-time chart shows them apart
    (the statistics already leave them out). Step 0, start-up, keeps its own look."""
    return "".join("c" if code == "0" and 0 < step and step in compiled else code for step, code in enumerate(phases))


def _compiled_by_worker(summary: dict[str, Any]) -> dict[str, set[int]]:
    compiled: dict[str, set[int]] = {}
    for entry in (summary.get("compile") or {}).get("by_step") or []:
        if isinstance(entry, dict) and isinstance(entry.get("step"), int):
            compiled.setdefault(str(entry.get("worker")), set()).add(entry["step"])
    return compiled


def _process_steps_from_logs(logs: list[dict[str, Any]]) -> list[ProcessSteps]:
    out = []
    for log in logs:
        durations = log.get("durations_us") or []
        if not durations:
            continue
        phases = _mark_compiles(str(log.get("phases") or "").ljust(len(durations), "0"), compiled_steps(log))
        out.append(
            ProcessSteps(
                label=_worker_label(log),
                rank=log.get("rank"),
                steps=list(range(len(durations))),
                values_ms=[d / 1000.0 for d in durations],
                phases=phases[: len(durations)],
            )
        )
    return out


def _worker_label(proc: dict[str, Any]) -> str:
    if proc.get("rank") is not None:
        return f"rank {proc['rank']}"
    return str(proc.get("worker") or proc.get("pid") or "process")


def run_dirs(out_dir: str) -> list[Path]:
    """The step-log folders of a run folder (`.stepcli/<run id>/`), newest run first. A folder given to `-o` more
    than once holds one per run; the run id starts with its start time."""
    found = [p for p in Path(out_dir, ".stepcli").glob("*/") if p.is_dir()]
    return sorted(found, key=lambda p: (p.name[:15], p.stat().st_mtime), reverse=True)


def step_logs(run_dir: Path) -> list[dict[str, Any]]:
    """The per-process step logs of one run (`<run dir>/*.steps.json`), in rank order."""
    logs: list[dict[str, Any]] = []
    for path in sorted(run_dir.glob(f"*{STEP_LOG_SUFFIX}")):
        try:
            logs.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    logs.sort(key=lambda log: (log.get("rank") is None, log.get("rank") or 0, log.get("pid", 0)))
    return logs


def _saved_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        document = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("schema") == RUN_SCHEMA else None


def _logs_for_summary(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The step logs of the run a summary describes: the newest run in its folder whose processes are the same."""
    pids = {p.get("pid") for p in summary.get("processes") or [] if p.get("pid") is not None}
    if not summary.get("out_dir") or not pids:
        return []
    for run_dir in run_dirs(str(summary["out_dir"])):
        logs = step_logs(run_dir)
        if pids <= {log.get("pid") for log in logs}:
            return logs
    return []


def _run_traces(summary: dict[str, Any] | None, logs: list[dict[str, Any]]) -> list[str]:
    """The traces this run wrote that still exist (a reused folder also holds older runs' traces)."""
    named = list((summary or {}).get("traces") or []) or [w["trace"] for log in logs for w in log.get("windows") or []]
    return [path for path in named if os.path.exists(path)]


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ReportData:
    """Everything one report page shows, already computed."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)  # (label, path)
    notes: list[str] = field(default_factory=list)
    processes: list[ProcessSteps] = field(default_factory=list)
    slowest: str | None = None
    distribution: list[float] = field(default_factory=list)
    distribution_label: str = ""
    stats: list[tuple[str, Stats]] = field(default_factory=list)
    breakdowns: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    device: dict[str, float] | None = None
    device_ranks: list[dict[str, Any]] = field(default_factory=list)  # ranks[] entries, each with its `device`
    cpu_ops: list[dict[str, Any]] = field(default_factory=list)
    outside_note: str | None = None  # host events outside every recorded step, left out of cpu_ops
    overlap_note: str | None = None  # the CPU table's Self % adds up to over 100% (other threads), and why
    kernels: list[dict[str, Any]] = field(default_factory=list)
    shape_ops: list[dict[str, Any]] = field(default_factory=list)
    memory_peaks: list[tuple[str, int | None, int | None]] = field(default_factory=list)
    memory_curves: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    out_dir: str | None = None  # the run's output folder, where `stepcli run --memory` leaves oom-*.pickle


@dataclass
class _Inputs:
    summary: dict[str, Any] | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)
    trace_paths: list[str] = field(default_factory=list)


def _classify(paths: Sequence[str]) -> _Inputs:
    """Sort the command line's PATHs into one run (summary and/or run folder) and any number of traces."""
    from stepcli.traces.reader import list_trace_files

    inputs = _Inputs()
    runs = 0
    for path in paths:
        if os.path.isdir(path):
            newest = next(iter(run_dirs(path)), None)
            if newest is not None:  # a stepcli run folder: its newest run, and that run's traces
                runs += 1
                inputs.logs = step_logs(newest)
                inputs.summary = _saved_summary(newest) or inputs.summary
                own = _run_traces(inputs.summary, inputs.logs)
                if own:
                    inputs.trace_paths.extend(own)
                    continue
            try:
                inputs.trace_paths.extend(list_trace_files([path]))
            except TraceError:
                if newest is None:
                    raise StepcliError(f"{path}: neither a stepcli run folder nor a folder of traces") from None
            continue
        if not os.path.exists(path):
            raise StepcliError(f"{path}: no such file or folder")
        name = os.path.basename(path)
        if ".pt.trace.json" in name or name.endswith(".gz"):
            inputs.trace_paths.append(path)
            continue
        try:
            with open(path, "rb") as handle:
                head = handle.read(4096)
        except OSError as exc:
            raise StepcliError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if b'"traceEvents"' in head or b'"schema"' not in head:
            inputs.trace_paths.append(path)  # the trace reader names the problem if it is not a trace either
            continue
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StepcliError(f"{path}: not a readable run summary ({exc})") from None
        if not isinstance(document, dict) or document.get("schema") != RUN_SCHEMA:
            raise StepcliError(f"{path}: not a stepcli run summary (schema {RUN_SCHEMA!r}) nor a trace")
        runs += 1
        inputs.summary = document
    if runs > 1:
        raise StepcliError("one run per report: give one run folder or run summary (plus any traces)")
    if inputs.summary is not None and not inputs.logs:
        inputs.logs = _logs_for_summary(inputs.summary)
    if inputs.summary is not None and not inputs.trace_paths:
        inputs.trace_paths = _run_traces(inputs.summary, [])
    return inputs


def gather(paths: Sequence[str]) -> ReportData:
    """`stepcli report PATH...`: read the inputs and compute the page's data."""
    inputs = _classify(paths)
    return build(inputs.summary, inputs.logs, inputs.trace_paths, sources=list(paths))


def build(
    summary: dict[str, Any] | None,
    logs: list[dict[str, Any]],
    trace_paths: Sequence[str],
    *,
    sources: Sequence[str] = (),
    traces: RunTraces | None = None,
) -> ReportData:
    """The page's data from a run summary (or None), step logs (may be empty) and trace files (may be none).

    `traces` holds what was already read of these files (after `stepcli run`, by the run summary); without it
    they are read here, once.
    """
    from stepcli.traces.analysis import merge_parts
    from stepcli.traces.readonce import RunTraces
    from stepcli.traces.render import outside_note

    traces = traces if traces is not None else RunTraces()
    data = ReportData(title="stepcli report")
    parts: list[list[FilePart]] = []  # per trace file: its plain part and its by-shape part
    if trace_paths:
        try:
            parts = traces.parts(list(trace_paths), shapes=True)
        except StepcliError as exc:
            if summary is None and not logs:
                raise
            # A run's page still shows what its step logs and summary measured (e.g. a trace cut short by a kill).
            data.notes.append(f"could not read the traces: {exc.message}")
    analysis = merge_parts([p[0] for p in parts]).to_dict() if parts else None
    if summary is not None:
        _add_run_facts(data, summary)
        data.out_dir = str(summary["out_dir"]) if summary.get("out_dir") else None
    else:
        data.facts.append(("inputs", ", ".join(sources) or ", ".join(trace_paths)))

    # Step times over the run: every process's step log, else the summary's timeline(s), else the traces' steps.
    processes = _process_steps_from_logs(logs) or (_process_steps_from_summary(summary) if summary else [])
    if not processes and analysis:
        by_rank: dict[Any, list[tuple[int, float]]] = {}
        for row in analysis["steps"]:
            by_rank.setdefault(row["rank"], []).append((row["step"], row["dur_ms"]))
        for rank, rows in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            rows.sort()
            processes.append(
                ProcessSteps(
                    label=f"rank {rank}" if rank is not None else "trace",
                    rank=rank,
                    steps=[s for s, _ in rows],
                    values_ms=[v for _, v in rows],
                    phases="2" * len(rows),
                )
            )
    data.processes = processes

    # Distribution: untouched steps (no profiler overhead) when there are any, else the recorded ones.
    untouched = [v for p in processes for s, v, c in zip(p.steps, p.values_ms, p.phases) if c == "0" and s != 0]
    # The profiled steps (warmup + recorded): the set and the name of the run summary's terminal and --json.
    recorded = [v for p in processes for s, v, c in zip(p.steps, p.values_ms, p.phases) if c in "123" and s != 0]
    if untouched:
        data.distribution, data.distribution_label = (
            untouched,
            "untouched steps (no profiler running), start-up left out",
        )
    elif recorded:
        data.distribution, data.distribution_label = recorded, "profiled steps"
    for label, values in (("untouched steps", untouched), ("profiled steps", recorded)):
        stats = describe(values)
        if stats:
            data.stats.append((label, stats))

    # Breakdown and operator tables: from the traces, else what the run summary kept of them.
    if analysis:
        data.cpu_ops = [op for op in analysis["cpu_ops"] if op["name"] != "ProfilerStep*"]
        data.outside_note = outside_note(analysis.get("outside_steps"))
        data.kernels = analysis["device_kernels"]
        data.device = analysis["device"]
        data.device_ranks = analysis["ranks"]
        parts_by_rank: dict[int | None, list[FilePart]] = {}
        for plain, _shaped in parts:
            parts_by_rank.setdefault(plain.rank, []).append(plain)
        if len(parts_by_rank) > 1:  # one bar per rank (all its windows), so the slowest rank stands out
            for rank, rank_parts in sorted(parts_by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
                per = merge_parts(rank_parts).to_dict()
                if per["breakdown_ms"]:
                    data.breakdowns.append((f"rank {rank}" if rank is not None else "no rank", per["breakdown_ms"]))
        elif analysis["breakdown_ms"]:
            data.breakdowns.append(("all steps" if len(parts) == 1 else "all traces", analysis["breakdown_ms"]))
        if analysis["slowest_rank"] is not None:
            data.slowest = f"rank {analysis['slowest_rank']}"
        if any(shaped.has_shapes for _plain, shaped in parts):
            shaped_ops = merge_parts([p[1] for p in parts], group_by_shape=True).to_dict()["cpu_ops"]
            data.shape_ops = [op for op in shaped_ops if op["name"] != "ProfilerStep*"][:TOP_ROWS]
        if analysis.get("skipped_events"):
            data.notes.append(f"{analysis['skipped_events']} trace event(s) had unusable times and were left out")
    elif summary is not None:
        data.cpu_ops = list(summary.get("top_operators") or [])
        data.kernels = list(summary.get("top_kernels") or [])
        data.device = summary.get("device")
        data.device_ranks = list(summary.get("ranks") or [])
        if summary.get("breakdown_ms"):
            data.breakdowns.append(("recorded steps", summary["breakdown_ms"]))
        if summary.get("slowest_rank") is not None:
            data.slowest = f"rank {summary['slowest_rank']}"
    # The slowest rank is the straggler of stepcli.traces.ranks or nobody: the terminal and --json say the same.
    straggler = (analysis or summary or {}).get("straggler")
    ranks_analysed = len((analysis or summary or {}).get("ranks") or []) > 1
    rank_steps = _rank_steps(processes)
    if not ranks_analysed and rank_steps:  # step logs alone: the advice's step-time rule speaks for the ranks
        means = {rank: sum(times) / len(times) for rank, times in rank_steps.items()}
        data.slowest = f"rank {max(sorted(means), key=lambda r: means[r])}"

    # Memory.
    if summary is not None:
        data.memory_peaks = [
            (_worker_label(p), p.get("peak_rss_bytes"), p.get("cuda_peak_bytes"))
            for p in summary.get("processes") or []
        ]
    elif logs:
        data.memory_peaks = [
            (_worker_label(log), log.get("peak_rss_bytes"), log.get("cuda_peak_bytes")) for log in logs
        ]
    data.memory_curves = traces.memory_curves(trace_paths)

    # Files.
    for path in trace_paths:
        data.files.append(("trace", str(path)))
    if summary is None and not trace_paths and not processes:
        raise StepcliError("nothing to report: no steps and no traces in the inputs")

    lead = processes[0] if processes else None
    # Operator calls are summed over every trace, so per-step rates divide by the steps of every trace.
    recorded_steps = (
        len(analysis["steps"])
        if analysis
        else sum((r.get("step_ms") or {}).get("count", 0) for r in (summary or {}).get("ranks") or [])
    )
    evidence = Evidence(
        breakdown_ms=_mean_breakdown(data.breakdowns),
        device_busy_share=(data.device or {}).get("busy_share"),
        cpu_ops=data.cpu_ops,
        kernels=data.kernels,
        recorded_steps=recorded_steps,
        rank_steps=rank_steps,
        straggler=straggler,
        ranks_analysed=ranks_analysed,
        untouched_ms=[(s, v) for s, v, c in zip(lead.steps, lead.values_ms, lead.phases) if c == "0" and s != 0]
        if lead
        else (),
        device=data.device,
    )
    data.advice = advise(evidence) + advise_device(evidence)
    if not ranks_analysed and not any(a.rule == "straggler" for a in data.advice):
        data.slowest = None  # a balanced run has no slowest rank
    data.overlap_note = overlap_note(data.cpu_ops)  # over every row, before the cut
    data.cpu_ops = data.cpu_ops[:TOP_ROWS]
    data.kernels = data.kernels[:TOP_ROWS]
    return data


def _rank_steps(processes: list[ProcessSteps]) -> dict[int, list[float]]:
    """Step times of each rank over the steps every rank measured (untouched ones when there are any), start-up
    step left out, aligned by step number."""
    ranked = [p for p in processes if p.rank is not None]
    if len(ranked) < 2:
        return {}
    for untouched_only in (True, False):
        tables = {
            int(p.rank): {
                s: v for s, v, c in zip(p.steps, p.values_ms, p.phases) if s != 0 and (c == "0" or not untouched_only)
            }
            for p in ranked
            if p.rank is not None
        }
        common = sorted(set.intersection(*(set(t) for t in tables.values())))
        if common:
            return {rank: [table[s] for s in common] for rank, table in tables.items()}
    return {}


def _mean_breakdown(rows: list[tuple[str, dict[str, float]]]) -> dict[str, float] | None:
    if not rows:
        return None
    keys = {k for _, parts in rows for k in parts}
    return {k: sum(parts.get(k, 0.0) for _, parts in rows) / len(rows) for k in keys}


def _add_run_facts(data: ReportData, summary: dict[str, Any]) -> None:
    command = summary.get("command") or []
    data.title = f"stepcli report: {shlex.join(command)}" if command else "stepcli report"
    status = summary.get("exit_status")
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
        if summary.get(key) is not None:
            facts.append((label, str(summary[key])))
    schedule = summary.get("schedule") or {}
    if schedule:
        facts.append(("schedule", ", ".join(f"{k.replace('_', '-')} {v}" for k, v in schedule.items())))
    steps = summary.get("steps") or {}
    if steps:
        requesters = ", ".join(f"{k} {v}" for k, v in (steps.get("requesters") or {}).items())
        facts.append(("steps", f"{steps.get('global', 0)}" + (f" ({requesters})" if requesters else "")))
    processes = summary.get("processes") or []
    if len(processes) > 1:
        facts.append(("processes", ", ".join(f"{_worker_label(p)}: {p.get('global_steps')} steps" for p in processes)))
    if summary.get("out_dir"):
        facts.append(("output folder", str(summary["out_dir"])))
    data.notes.extend(str(n) for n in summary.get("notes") or [])
