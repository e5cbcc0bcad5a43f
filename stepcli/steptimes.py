"""Step times per process, from a run summary or a trace analysis: what the page's chart, the advice
and the slowest-rank outline all read, so they agree.

Steps are numbered from 0 (start-up); phase digits are those of `timeline_phases` (0 untouched, 1
warmup, 2/3 recorded, 4 under the program's own profiler, 5 the first step after a window, which
pays for its stop and save), plus "c" for an untouched step in which torch compiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepcli.runfolder.summaryfile import Process, RunSummary, StepRecord, SummaryStepTimes


@dataclass(frozen=True)
class ProcessSteps:
    """One process's step times over the whole run (steps numbered from 0, phase digits as
    `timeline_phases`; "c" marks an untouched step in which torch compiled)."""

    label: str
    rank: int | None
    steps: list[int]
    values_ms: list[float]
    phases: str


def worker_label(process: Process | SummaryStepTimes) -> str:
    """`rank N`, else the worker name or pid."""
    if process.rank is not None:
        return f"rank {process.rank}"
    return str(process.worker or process.pid or "process")


def mark_compiles(phases: str, compiled: set[int]) -> str:
    """Untouched steps (and steps after a window) in which torch compiled get their own code, "c",
    so the step-time chart shows them apart (the statistics already leave them out, as compile steps
    first). Step 0, start-up, keeps its own look."""
    return "".join(
        "c" if code in "05" and 0 < step and step in compiled else code
        for step, code in enumerate(phases)
    )


def compiled_by_worker(summary: RunSummary) -> dict[str, set[int]]:
    """The steps of each worker during which torch compiled (from `compile.by_step`)."""
    compiled: dict[str, set[int]] = {}
    for entry in summary.compile.by_step if summary.compile else []:
        compiled.setdefault(str(entry.worker), set()).add(entry.step)
    return compiled


def _process_series(
    summary: RunSummary,
) -> list[tuple[Process | SummaryStepTimes, list[float], str]]:
    """(process, step times, phases) per process: `step_times` (schema 2), per-process times kept in
    `processes`, else the primary process's `timeline_ms`."""
    series: list[tuple[Process | SummaryStepTimes, list[float], str]] = []
    for entry in summary.step_times or []:
        if entry.durations_ms:
            series.append((entry, entry.durations_ms, entry.phases))
    if series:
        return series
    for proc in summary.processes or []:
        values = proc.step_times_ms or proc.durations_ms or proc.timeline_ms
        if values:
            series.append((proc, values, str(proc.phases or "")))
    if series:
        return series
    timeline = summary.timeline_ms or []
    if timeline:
        procs = list(summary.processes) or [Process()]
        primary = next((p for p in procs if p.rank == 0), None) or max(
            procs, key=lambda p: p.global_steps or 0
        )
        series.append((primary, timeline, summary.timeline_phases or ""))
    return series


def process_steps(summary: RunSummary) -> list[ProcessSteps]:
    """Every process's step times the summary holds, steps in which torch compiled marked "c"."""
    compiled = compiled_by_worker(summary)
    out = []
    for proc, values, phases in _process_series(summary):
        marked = mark_compiles(
            phases.ljust(len(values), "0"), compiled.get(str(proc.worker), set())
        )
        out.append(
            ProcessSteps(
                label=worker_label(proc),
                rank=proc.rank,
                steps=list(range(len(values))),
                values_ms=[float(v) for v in values],
                phases=marked[: len(values)],
            )
        )
    return out


def trace_process_steps(rows: Sequence[Mapping[str, Any]]) -> list[ProcessSteps]:
    """Per rank, the recorded steps of a trace analysis (`steps` rows: rank, step, dur_ms), all
    phase "2"."""
    by_rank: dict[Any, list[tuple[int, float]]] = {}
    for row in rows:
        by_rank.setdefault(row["rank"], []).append((row["step"], row["dur_ms"]))
    out = []
    for rank, items in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        items.sort()
        out.append(
            ProcessSteps(
                label=f"rank {rank}" if rank is not None else "trace",
                rank=rank,
                steps=[s for s, _ in items],
                values_ms=[v for _, v in items],
                phases="2" * len(items),
            )
        )
    return out


def rank_steps(processes: Sequence[ProcessSteps]) -> dict[int, list[float]]:
    """Step times of each rank over the steps every rank measured (untouched ones when there are
    any), start-up step left out, aligned by step number."""
    ranked = [p for p in processes if p.rank is not None]
    if len(ranked) < 2:
        return {}
    for untouched_only in (True, False):
        tables = {
            int(p.rank): {
                s: v
                for s, v, c in zip(p.steps, p.values_ms, p.phases)
                if s != 0 and (c == "0" or not untouched_only)
            }
            for p in ranked
            if p.rank is not None
        }
        common = sorted(set.intersection(*(set(t) for t in tables.values())))
        if common:
            return {rank: [table[s] for s in common] for rank, table in tables.items()}
    return {}


def slowest_by_steps(processes: Sequence[ProcessSteps]) -> int | None:
    """The rank with the longest mean step over the steps all ranks measured, or None (one rank or
    none)."""
    steps = rank_steps(processes)
    if not steps:
        return None
    means = {rank: sum(times) / len(times) for rank, times in steps.items()}
    return max(sorted(means), key=lambda r: means[r])


def slowest_first(records: list[StepRecord], limit: int) -> list[StepRecord]:
    """The whole-run step records (the run summary's `step_record`) to show: all of them when there
    are at most `limit`, else the `limit` slowest at p99, in rank order; the terminal and
    report.html show the same ones."""
    if len(records) <= limit:
        return records
    keep = {id(r) for r in sorted(records, key=lambda r: -float(r.ms.get("p99") or 0))[:limit]}
    return [r for r in records if id(r) in keep]
