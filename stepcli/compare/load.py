"""Loading one side of `stepcli compare`: run summaries (schema 1 or 2), traces, folders, several
runs at once.

Every input becomes a Measurement; bad input raises StepcliError (exit 2) naming the file and the
problem. A side given as several inputs (`--baseline a1.json --baseline a2.json`, or a folder of run
summaries) is one Measurement with one RunSteps per run, so the statistics can resample runs as well
as steps.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec

from stepcli.compare.measurement import MeasuredProcess, Measurement, OpSteps, OpTime, RunSteps
from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.runfolder.layout import RUN_FOLDER, SUMMARY_FILE, SUMMARY_SCHEMA
from stepcli.runfolder.summaryfile import (
    PopulationStats,
    RunSummary,
    SummaryOpRow,
    SummaryStepTimes,
)
from stepcli.runfolder.summaryread import invalid, load_run_summary, read_run_summary
from stepcli.stats import STAT_NAMES, Stats, describe
from stepcli.traces.analyses.shares import STEP_KEY
from stepcli.traces.read.files import reads_as_document

if TYPE_CHECKING:
    from stepcli.traces.analyses.results import TraceSummary

_NEEDED = ("schema_version", "steps", "step_time_ms")  # what a verdict cannot do without


def measurement_from_run(doc: RunSummary | Mapping[str, Any], label: str) -> Measurement:
    """A run summary (`stepcli run --json`; a decoded document is checked first) as a Measurement;
    StepcliError (exit 2) if malformed."""
    summary = (
        doc if isinstance(doc, RunSummary) else load_run_summary(dict(doc), label, required=_NEEDED)
    )
    times = summary.step_time_ms
    populations: dict[str, Stats | None] = {
        "untouched": _counted(times.untouched if times else None),
        "profiled": _counted(times.profiled if times else None),
    }
    processes = _run_processes(summary, label)
    run_id = summary.run_id
    trace_files = tuple(p for p in summary.traces or [] if os.path.isfile(p))
    return Measurement(
        label=label,
        kind="run",
        steps=summary.steps.global_ if summary.steps else 0,
        populations=populations,
        ops=_ops(summary.top_operators or []) + _ops(summary.top_kernels or []),
        ops_complete=False,
        exit_status=summary.exit_status,
        runs=(RunSteps(label, run_id, processes, True),) if processes else (),
        trace_files=(trace_files,) if trace_files else (),
        programs=frozenset(filter(None, [program_of(summary.command)])),
    )


def program_of(command: Any) -> str | None:
    """The program a run's command ran, for telling two different programs apart: the module of
    `-m`, else the first Python file's name (`python train.py`, `torchrun ... train.py`), else the
    command's name."""
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(word, str) for word in command)
    ):
        return None
    if "-m" in command[:-1]:
        return f"-m {command[command.index('-m') + 1]}"
    script = next((word for word in command[1:] if word.endswith(".py")), None)
    return os.path.basename(script or command[0]) or None


def _counted(stats: Stats | PopulationStats | None) -> Stats | None:
    """Validated statistics, None when they count no step."""
    if isinstance(stats, PopulationStats):
        stats = stats.stats()
    if stats is None or stats["count"] == 0:
        return None
    return Stats(**{**stats, "count": int(stats["count"])})


def _run_processes(summary: RunSummary, label: str) -> tuple[MeasuredProcess, ...]:
    """Every step of every process: `step_times` (schema 2), else the primary process's timeline
    (schema 1)."""
    entries = summary.step_times
    if entries is None:
        if not summary.timeline_ms:
            return ()  # statistics only: compare falls back to them and says so
        timeline, phases = summary.timeline_ms, summary.timeline_phases
        if not isinstance(phases, str) or len(phases) != len(timeline):
            raise invalid(label, "timeline_ms[0] needs durations_ms and one phase digit per step")
        entries = [SummaryStepTimes(worker="primary", durations_ms=timeline, phases=phases)]
    processes = []
    for index, entry in enumerate(entries):
        times = entry.durations_ms
        if times:
            name = str(entry.worker or f"process{index}")
            processes.append(
                MeasuredProcess(
                    name, tuple(range(len(times))), tuple(map(float, times)), entry.phases
                )
            )
    return tuple(processes)


def measurement_from_summary(
    summary: Mapping[str, Any], label: str, op_steps: tuple[OpSteps, ...] | None = None
) -> Measurement:
    """A trace summary document (`stepcli table --json`, `TraceSummary.to_dict()`) as a Measurement,
    checked."""
    stats = _stats_or_none(summary.get("step_ms"), label, "step_ms")
    steps_list = summary.get("steps") or []
    events = summary.get("events")
    rows = [*_named_rows(summary.get("cpu_ops") or [], label, "cpu_ops")]
    rows += _named_rows(summary.get("device_kernels") or [], label, "device_kernels")
    return _trace_measurement(
        label,
        stats,
        [r for r in steps_list if isinstance(r, Mapping)] if isinstance(steps_list, list) else [],
        _ops(rows),
        int(events) if isinstance(events, (int, float)) and not isinstance(events, bool) else None,
        op_steps,
    )


def measurement_from_trace_summary(
    summary: TraceSummary, label: str, op_steps: tuple[OpSteps, ...] | None = None
) -> Measurement:
    """The typed summary of traces just read (nothing to re-check) as a Measurement."""
    ops = tuple(
        OpTime(row.name, row.calls, row.self_ms, row.total_ms)
        for row in (*summary.cpu_ops, *summary.device_kernels)
        if row.name != STEP_KEY
    )
    steps = [{"rank": row.rank, "step": row.step, "dur_ms": row.dur_ms} for row in summary.steps]
    return _trace_measurement(
        label, _counted(summary.step_ms), steps, ops, summary.events, op_steps
    )


def _trace_measurement(
    label: str,
    stats: Stats | None,
    step_rows: Sequence[Mapping[str, Any]],
    ops: tuple[OpTime, ...],
    events: int | None,
    op_steps: tuple[OpSteps, ...] | None,
) -> Measurement:
    steps = max(len(step_rows), stats["count"]) if stats is not None else len(step_rows)
    processes = _trace_processes(step_rows)
    return Measurement(
        label=label,
        kind="trace",
        steps=steps,
        populations={"recorded": stats},
        ops=ops,
        events=events,
        runs=(RunSteps(label, None, processes, False),) if processes else (),
        op_steps=op_steps,
    )


def _named_rows(rows: Any, label: str, where: str) -> list[Mapping[str, Any]]:
    if not isinstance(rows, list):
        raise invalid(label, f"{where} is not a list")
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
            raise invalid(label, f"{where} has an entry without a name")
        if not all(
            isinstance(row.get(k, 0), (int, float)) for k in ("calls", "self_ms", "total_ms")
        ):
            raise invalid(label, f"{where}: {row['name']!r} has non-numeric times")
    return rows


def _trace_processes(rows: Sequence[Any]) -> tuple[MeasuredProcess, ...]:
    """ProfilerStep#N durations per rank; traces without a rank that repeat a step number are
    separate processes."""
    series: dict[tuple[Any, int], list[tuple[int, float]]] = defaultdict(list)
    seen: dict[tuple[Any, int], int] = defaultdict(int)
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("step"), int):
            continue
        key = (row.get("rank"), row["step"])
        copy = seen[key]
        seen[key] += 1
        series[(row.get("rank"), copy)].append((row["step"], float(row.get("dur_ms") or 0.0)))
    out = []
    for (rank, copy), items in sorted(
        series.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
    ):
        items.sort()
        name = f"rank{rank}" if rank is not None else f"trace{copy}"
        out.append(
            MeasuredProcess(
                name, tuple(s for s, _ in items), tuple(t for _, t in items), "2" * len(items)
            )
        )
    return tuple(out)


def load_side(paths: Sequence[str]) -> Measurement:
    """One side from one or more inputs; several inputs (or a folder of run summaries) are several
    runs."""
    measurements = [load_measurement(path) for path in paths]
    if len(measurements) == 1:
        return measurements[0]
    return combine(measurements, " + ".join(paths))


def combine(measurements: Sequence[Measurement], label: str) -> Measurement:
    """Several runs of one side as one Measurement; every run must have per-step times."""
    kinds = {m.kind for m in measurements}
    if len(kinds) > 1:
        raise StepcliError(
            f"{label}: a side mixes run summaries and traces; give one kind per side", EXIT_USAGE
        )
    measured = [m for m in measurements if m.nothing_measured() is None]
    if not measured:
        first = measurements[0]
        return Measurement(
            label=label,
            kind=first.kind,
            steps=0,
            populations=dict.fromkeys(first.populations),
            events=first.events,
            empty_reason="; ".join(f"{m.label}: {m.nothing_measured()}" for m in measurements),
        )
    without = [m.label for m in measured if not m.runs]
    if without:
        raise StepcliError(
            f"{without[0]}: has step statistics but not every step's time (a schema 1 summary "
            f"without timeline_ms), "
            "so it cannot be one of several runs on a side; compare it alone or re-create it with "
            "`run --json`",
            EXIT_USAGE,
        )
    runs = tuple(run for m in measured for run in m.runs)
    seen: dict[str, str] = {}
    # the same run twice would count its steps twice and narrow the interval for nothing
    for run in runs:
        if run.run_id and run.run_id in seen:
            raise StepcliError(
                f"{run.label}: the same run (run_id {run.run_id[:12]}) as {seen[run.run_id]}; give "
                f"each run once per side",
                EXIT_USAGE,
            )
        if run.run_id:
            seen[run.run_id] = run.label
    names = list(measured[0].populations)
    populations: dict[str, Stats | None] = {}
    for name in names:
        values = [ms for run in runs for process in run.population(name) for _, ms in process]
        populations[name] = describe(values)
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for m in measured:
        for op in m.ops:  # totals per run, averaged over the runs, so 2 runs compare fairly with 3
            row = ops[op.name]
            row[0] += op.calls / len(measured)
            row[1] += op.self_ms / len(measured)
            row[2] += op.total_ms / len(measured)
    op_steps = (
        tuple(s for m in measured for s in (m.op_steps or ()))
        if all(m.op_steps for m in measured)
        else None
    )
    statuses = [m.exit_status for m in measured if m.exit_status not in (None, 0)]
    events = [m.events for m in measured if m.events is not None]
    return Measurement(
        label=label,
        kind=measured[0].kind,
        steps=sum(m.steps for m in measured),
        populations=populations,
        ops=tuple(OpTime(name, round(r[0]), r[1], r[2]) for name, r in ops.items()),
        ops_complete=all(m.ops_complete for m in measured),
        events=sum(events) if events else None,
        exit_status=statuses[0] if statuses else measured[0].exit_status,
        runs=runs,
        trace_files=tuple(files for m in measured for files in m.trace_files)
        if all(m.trace_files for m in measured)
        else (),
        op_steps=op_steps,
        programs=frozenset().union(*(m.programs for m in measured)),
    )


def load_measurement(path: str) -> Measurement:
    """Read one input: a run summary JSON, a trace file, a folder of run summaries, or a folder of
    traces."""
    target = Path(path)
    if not target.exists():
        from stepcli.inputs import broken_link

        raise StepcliError(
            f"{path}: {broken_link(path) or 'no such file or directory'}", EXIT_USAGE
        )
    if target.is_dir():
        run = _run_folder_summary(target)
        if run is not None:
            return measurement_from_run(run[1], run[0])
        summaries = _folder_run_summaries(target)
        if summaries:
            if len(summaries) == 1:
                return measurement_from_run(summaries[0][1], summaries[0][0])
            return combine(
                [measurement_from_run(doc, name) for name, doc in summaries],
                f"{path} ({len(summaries)} runs)",
            )
        files = _folder_traces(target)
        if not files:
            # A run whose program never stepped writes no trace: that is "nothing measured", not bad
            # input.
            return Measurement(
                label=path,
                kind="trace",
                steps=0,
                populations={"recorded": None},
                events=0,
                empty_reason="no trace files in this folder",
            )
        return _load_traces(path, files)
    if path.endswith(".gz") and not reads_as_document(path):
        return _load_traces(path)  # a gzipped trace: inflated once, by the trace reader
    from stepcli.inputs import outline, read_document

    data = read_document(path)  # a regular file of bounded size, or one line saying why not
    if not data or data.isspace():
        raise StepcliError(f"{path}: empty file", EXIT_USAGE)
    kind, schema = outline(data)  # by content, whatever the size
    if kind == "run":
        if schema != SUMMARY_SCHEMA:
            raise StepcliError(
                f"{path}: unknown document schema {str(schema)[:80]!r}; expected a "
                f"{SUMMARY_SCHEMA!r} run summary or a trace",
                EXIT_USAGE,
            )
        return measurement_from_run(read_run_summary(data, path, required=_NEEDED), path)
    if kind in ("trace", "broken"):
        del data  # the trace reader reads it again and names any JSON problem precisely
        return _load_traces(path)
    raise StepcliError(
        f"{path}: neither a stepcli run summary (schema {SUMMARY_SCHEMA!r}) nor a profiler trace "
        f"(no traceEvents)",
        EXIT_USAGE,
    )


def _load_traces(label: str, files: Sequence[str] | None = None) -> Measurement:
    # Lazy: the trace reader and summarizer are only needed for trace inputs.
    from stepcli.compare.attribution import op_steps_from_traces
    from stepcli.traces.analyses.mergeparts import merge_parts
    from stepcli.traces.analyses.traceanalysis import summarize_read
    from stepcli.traces.read.columns import load_columns
    from stepcli.traces.read.files import list_trace_files
    from stepcli.traces.read.splitread import read_blocked

    # Each file read once, straight into columns as `stepcli table` reads it (no object per event):
    # its summary and its steps' figures both come from them.
    traces = [
        read_blocked(path, False) or load_columns(path)
        for path in list_trace_files(list(files or [label]))
    ]
    try:
        op_steps: tuple[OpSteps, ...] | None = (op_steps_from_traces(traces, label),)
    # per-operator attribution only explains a verdict; without it the verdict still stands
    except Exception:
        op_steps = None
    # = summarize of the files
    summary = merge_parts([summarize_read(trace.columns, trace) for trace in traces])
    return measurement_from_trace_summary(summary, label, op_steps)


def _run_folder_summary(folder: Path) -> tuple[str, RunSummary] | None:
    """A stepcli run folder (`-o`): the run summary `stepcli run` saved beside its newest run's step
    logs (`.stepcli/<run id>/summary.json`), as `stepcli report` reads it; None for any other
    folder. A summary has every step of every process, the folder's traces only the recorded ones:
    read as traces, a run folder would be decided on 3 steps. A run folder whose newest run has no
    saved summary (it never finished writing one) is refused in one line rather than silently judged
    on its traces."""
    from stepcli.fmt import say
    from stepcli.runfolder.runs import (
        other_runs_note,
        pick_run,
        read_saved,
        rerooted,
        run_dirs_readable,
        written_traces,
    )

    pick = pick_run(str(folder))
    if pick is None:
        if os.path.lexists(folder / RUN_FOLDER) and not run_dirs_readable(str(folder)):
            # a run folder, but not one of this user's own making: said, not judged on traces
            raise StepcliError(
                f"{folder}: its {RUN_FOLDER}/ is a link or another user's, so its run summary is "
                f"not read; give that "
                "run's `--json` file, or its traces",
                EXIT_USAGE,
            )
        return None
    newest, folder = pick.run_dir, Path(pick.folder)
    note = other_runs_note(pick, all_runs=False)
    if note:
        say(note)
    path = newest / SUMMARY_FILE
    data = read_saved(path)
    if data is None:
        why = "is not a regular file of yours" if os.path.lexists(path) else "is missing"
        raise StepcliError(
            f"{folder}: a stepcli run folder whose newest run ({newest.name}) saved no run summary "
            f"({path} {why}); "
            "give that run's `--json` file, or its traces",
            EXIT_USAGE,
        )
    label = f"{folder} (run {newest.name})"
    summary = rerooted(read_run_summary(data, str(path), required=_NEEDED), str(folder))
    listed = [t for t in summary.traces if os.path.lexists(t)]
    # the very files the run wrote, and only while so
    summary.traces = written_traces(newest, str(folder), listed)
    return label, summary


def _json_files(folder: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        # .stepcli/ holds step logs
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [
            os.path.join(dirpath, name)
            for name in filenames
            if name.endswith((".json", ".json.gz"))
            and not name.startswith(".")
            and ".tmp" not in name
        ]
    return sorted(found)


def _folder_traces(folder: Path) -> list[str]:
    """The trace files of a folder, as `stepcli table` picks them, minus run summaries kept beside
    them."""
    found = _json_files(folder)
    named = [p for p in found if ".pt.trace.json" in os.path.basename(p)]
    return sorted(named or [p for p in found if _read_run_summary(p) is None])


def _folder_run_summaries(folder: Path) -> list[tuple[str, RunSummary | dict[str, Any]]]:
    """The run summaries in a folder (recursively): each is one run, from a run folder (`-o`) inside
    it or a `--json` file. They win over traces beside them, since a summary has every step, a trace
    only the recorded ones; a summary's traces still serve attribution. A run found both ways (`-o
    r1 --json r1.json`, both kept) counts once."""
    out: list[tuple[str, RunSummary | dict[str, Any]]] = [
        run for run in map(_run_folder_summary, _run_folders_inside(folder)) if run is not None
    ]
    runs = {doc.run_id if isinstance(doc, RunSummary) else doc.get("run_id") for _, doc in out} - {
        None
    }
    for path in _json_files(folder):
        if ".pt.trace.json" in os.path.basename(path):
            continue
        doc = _read_run_summary(path)
        if doc is not None and doc.get("run_id") not in runs:
            out.append((path, doc))
    return out


def _run_folders_inside(folder: Path) -> list[Path]:
    """The stepcli run folders (a `.stepcli` inside) below `folder`, not itself: a folder of
    downloaded `-o` folders is a folder of runs, not of traces. Hidden folders and links are not
    followed."""
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(folder):
        if dirpath != str(folder) and RUN_FOLDER in dirnames:
            found.append(Path(dirpath))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return found


def _read_run_summary(path: str) -> dict[str, Any] | None:
    import orjson

    from stepcli.inputs import outline, read_document

    if path.endswith(".gz") and not reads_as_document(path):
        return None  # a gzipped trace: not inflated to find that out
    try:
        data = read_document(path)
        if outline(data) != ("run", SUMMARY_SCHEMA):
            return None  # traces and anything else: the trace reader reports them
        doc = orjson.loads(data)
    except (StepcliError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SUMMARY_SCHEMA else None


def _stats_or_none(value: Any, label: str, where: str) -> Stats | None:
    """Validated Stats, so a hand-edited or corrupt file fails with a line instead of a NaN
    verdict."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise invalid(label, f"{where} is neither null nor an object")
    out: dict[str, Any] = {}
    for key in STAT_NAMES:
        number = value.get(key)
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not math.isfinite(number)
            or number < 0
        ):
            raise invalid(label, f"{where}.{key} is not a non-negative number")
        out[key] = number
    if out["count"] == 0:
        return None
    out["count"] = int(out["count"])
    return cast(Stats, out)  # every key of Stats checked above, so the JSON object is one


def _ops(rows: Sequence[Mapping[str, Any] | SummaryOpRow]) -> tuple[OpTime, ...]:
    """Operator rows (already validated) as OpTimes, one per name."""
    merged: dict[str, OpTime] = {}
    for row in (msgspec.to_builtins(r) if isinstance(r, SummaryOpRow) else r for r in rows):
        if row["name"] == STEP_KEY:
            # the step annotation, not an operator: the run summary leaves it out too
            # (stepcli.traces.analyses.shares)
            continue
        op = OpTime(
            name=row["name"],
            calls=int(row.get("calls") or 0),
            self_ms=float(row.get("self_ms") or 0.0),
            total_ms=float(row.get("total_ms") or 0.0),
        )
        old = merged.get(op.name)
        if old is not None:  # e.g. the same op on several ranks: one row per name
            op = OpTime(
                op.name, old.calls + op.calls, old.self_ms + op.self_ms, old.total_ms + op.total_ms
            )
        merged[op.name] = op
    return tuple(merged.values())
