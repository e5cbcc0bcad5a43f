"""Loading one side of `stepcli compare`: run summaries (schema 1 or 2), traces, folders, several runs at once.

Every input becomes a Measurement; bad input raises StepcliError (exit 2) naming the file and the problem.
A side given as several inputs (`--baseline a1.json --baseline a2.json`, or a folder of run summaries) is one
Measurement with one RunSteps per run, so the statistics can resample runs as well as steps.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepcli.compare.model import Measurement, OpSteps, OpTime, ProcessSteps, RunSteps
from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.stats import STAT_NAMES, Stats, describe
from stepcli.traces.shares import STEP_KEY

if TYPE_CHECKING:
    from stepcli.traces.reader import Trace

RUN_SCHEMA = "stepcli.run"
RUN_SCHEMA_VERSIONS = (1, 2)


def measurement_from_run(doc: Mapping[str, Any], label: str) -> Measurement:
    """A run summary document (`stepcli run --json`) as a Measurement; StepcliError if malformed."""
    version = doc.get("schema_version")
    if isinstance(version, bool) or version not in RUN_SCHEMA_VERSIONS:
        supported = ", ".join(map(str, RUN_SCHEMA_VERSIONS))
        raise StepcliError(
            f"{label}: unsupported run summary schema_version {version!r} (this stepcli reads {supported}); "
            "re-create it with this stepcli's `run --json`",
            EXIT_USAGE,
        )
    steps_doc = doc.get("steps")
    steps = steps_doc.get("global") if isinstance(steps_doc, Mapping) else None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise _invalid_run(label, "steps.global is not a non-negative integer")
    times = doc.get("step_time_ms")
    if not isinstance(times, Mapping):
        raise _invalid_run(label, "step_time_ms is missing")
    populations = {
        name: _stats_or_none(times.get(name), label, f"step_time_ms.{name}") for name in ("untouched", "profiled")
    }
    exit_status = doc.get("exit_status")
    if isinstance(exit_status, bool) or not isinstance(exit_status, (int, type(None))):
        raise _invalid_run(label, "exit_status is not an integer")
    from stepcli.inputs import run_paths_problem

    paths_problem = run_paths_problem(dict(doc))
    if paths_problem:
        raise _invalid_run(label, paths_problem)
    processes = _run_processes(doc, label)
    run_id = doc.get("run_id")
    traces = doc.get("traces")
    trace_files = (
        tuple(p for p in traces if isinstance(p, str) and os.path.isfile(p)) if isinstance(traces, list) else ()
    )
    return Measurement(
        label=label,
        kind="run",
        steps=steps,
        populations=populations,
        ops=_ops(doc.get("top_operators") or [], label, "top_operators")
        + _ops(doc.get("top_kernels") or [], label, "top_kernels"),
        ops_complete=False,
        exit_status=exit_status,
        runs=(RunSteps(label, run_id if isinstance(run_id, str) else None, processes, True),) if processes else (),
        trace_files=(trace_files,) if trace_files else (),
    )


def _run_processes(doc: Mapping[str, Any], label: str) -> tuple[ProcessSteps, ...]:
    """Every step of every process: `step_times` (schema 2), else the primary process's timeline (schema 1)."""
    entries = doc.get("step_times")
    where = "step_times"
    if entries is None:
        if "timeline_ms" not in doc:
            return ()  # statistics only: compare falls back to them and says so
        entries = [{"worker": "primary", "durations_ms": doc.get("timeline_ms"), "phases": doc.get("timeline_phases")}]
        where = "timeline_ms"
    if not isinstance(entries, list):
        raise _invalid_run(label, f"{where} is not a list")
    processes = []
    for index, entry in enumerate(entries):
        times = entry.get("durations_ms") if isinstance(entry, Mapping) else None
        phases = entry.get("phases") if isinstance(entry, Mapping) else None
        if not isinstance(times, list) or not isinstance(phases, str) or len(phases) != len(times):
            raise _invalid_run(label, f"{where}[{index}] needs durations_ms and one phase digit per step")
        if not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 for t in times
        ):
            raise _invalid_run(label, f"{where}[{index}].durations_ms has a value that is not a non-negative number")
        if times:
            name = str(entry.get("worker") or f"process{index}")
            processes.append(ProcessSteps(name, tuple(range(len(times))), tuple(map(float, times)), phases))
    return tuple(processes)


def measurement_from_summary(
    summary: Mapping[str, Any], label: str, op_steps: tuple[OpSteps, ...] | None = None
) -> Measurement:
    """A trace summary (`stepcli.traces.analysis.summarize(...).to_dict()`) as a Measurement."""
    stats = _stats_or_none(summary.get("step_ms"), label, "step_ms")
    steps_list = summary.get("steps") or []
    steps = len(steps_list) if isinstance(steps_list, list) else 0
    if stats is not None:
        steps = max(steps, stats["count"])
    events = summary.get("events")
    ops = _ops(summary.get("cpu_ops") or [], label, "cpu_ops") + _ops(
        summary.get("device_kernels") or [], label, "device_kernels"
    )
    processes = _trace_processes(steps_list if isinstance(steps_list, list) else [])
    return Measurement(
        label=label,
        kind="trace",
        steps=steps,
        populations={"recorded": stats},
        ops=ops,
        events=int(events) if isinstance(events, (int, float)) and not isinstance(events, bool) else None,
        runs=(RunSteps(label, None, processes, False),) if processes else (),
        op_steps=op_steps,
    )


def _trace_processes(rows: list[Any]) -> tuple[ProcessSteps, ...]:
    """ProfilerStep#N durations per rank; traces without a rank that repeat a step number are separate processes."""
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
    for (rank, copy), items in sorted(series.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])):
        items.sort()
        name = f"rank{rank}" if rank is not None else f"trace{copy}"
        out.append(ProcessSteps(name, tuple(s for s, _ in items), tuple(t for _, t in items), "2" * len(items)))
    return tuple(out)


def load_side(paths: Sequence[str]) -> Measurement:
    """One side from one or more inputs; several inputs (or a folder of run summaries) are several runs."""
    measurements = [load_measurement(path) for path in paths]
    if len(measurements) == 1:
        return measurements[0]
    return combine(measurements, " + ".join(paths))


def combine(measurements: Sequence[Measurement], label: str) -> Measurement:
    """Several runs of one side as one Measurement; every run must have per-step times."""
    kinds = {m.kind for m in measurements}
    if len(kinds) > 1:
        raise StepcliError(f"{label}: a side mixes run summaries and traces; give one kind per side", EXIT_USAGE)
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
            f"{without[0]}: has step statistics but not every step's time (a schema 1 summary without timeline_ms), "
            "so it cannot be one of several runs on a side; compare it alone or re-create it with `run --json`",
            EXIT_USAGE,
        )
    runs = tuple(run for m in measured for run in m.runs)
    seen: dict[str, str] = {}
    for run in runs:  # the same run twice would count its steps twice and narrow the interval for nothing
        if run.run_id and run.run_id in seen:
            raise StepcliError(
                f"{run.label}: the same run (run_id {run.run_id[:12]}) as {seen[run.run_id]}; give each run once per side",
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
    op_steps = tuple(s for m in measured for s in (m.op_steps or ())) if all(m.op_steps for m in measured) else None
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
    )


def load_measurement(path: str) -> Measurement:
    """Read one input: a run summary JSON, a trace file, a folder of run summaries, or a folder of traces."""
    target = Path(path)
    if not target.exists():
        raise StepcliError(f"{path}: no such file or directory", EXIT_USAGE)
    if target.is_dir():
        summaries = _folder_run_summaries(target)
        if summaries:
            if len(summaries) == 1:
                return measurement_from_run(summaries[0][1], summaries[0][0])
            return combine(
                [measurement_from_run(doc, name) for name, doc in summaries], f"{path} ({len(summaries)} runs)"
            )
        files = _folder_traces(target)
        if not files:
            # A run whose program never stepped writes no trace: that is "nothing measured", not bad input.
            return Measurement(
                label=path,
                kind="trace",
                steps=0,
                populations={"recorded": None},
                events=0,
                empty_reason="no trace files in this folder",
            )
        return _load_traces(path, files)
    if path.endswith(".gz"):  # stepcli writes run summaries as plain JSON: a .gz is a trace
        return _load_traces(path)
    from stepcli.inputs import outline, read_input

    data = read_input(path)  # a regular file of bounded size, or one line saying why not
    if not data or data.isspace():
        raise StepcliError(f"{path}: empty file", EXIT_USAGE)
    kind, schema = outline(data)  # by content, whatever the size
    if kind == "run":
        if schema != RUN_SCHEMA:
            raise StepcliError(
                f"{path}: unknown document schema {str(schema)[:80]!r}; expected a {RUN_SCHEMA!r} run summary or a trace",
                EXIT_USAGE,
            )
        import orjson

        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise StepcliError(f"{path}: not valid JSON ({exc})", EXIT_USAGE) from None
        return measurement_from_run(doc, path)
    if kind in ("trace", "broken"):
        del data  # the trace reader reads it again and names any JSON problem precisely
        return _load_traces(path)
    raise StepcliError(
        f"{path}: neither a stepcli run summary (schema {RUN_SCHEMA!r}) nor a profiler trace (no traceEvents)",
        EXIT_USAGE,
    )


def _load_traces(label: str, files: Sequence[str] | None = None) -> Measurement:
    # Lazy: the trace reader and summarizer are only needed for trace inputs.
    from stepcli.compare.attribution import op_steps_from_traces
    from stepcli.traces.analysis import summarize
    from stepcli.traces.reader import load_paths

    traces: list[Trace] = load_paths(list(files or [label]))
    summary = summarize(traces).to_dict()
    try:
        op_steps: tuple[OpSteps, ...] | None = (op_steps_from_traces(traces, label),)
    except Exception:  # per-operator attribution only explains a verdict; without it the verdict still stands
        op_steps = None
    return measurement_from_summary(summary, label, op_steps)


def _json_files(folder: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # .stepcli/ holds step logs
        found += [
            os.path.join(dirpath, name)
            for name in filenames
            if name.endswith((".json", ".json.gz")) and not name.startswith(".") and ".tmp" not in name
        ]
    return sorted(found)


def _folder_traces(folder: Path) -> list[str]:
    """The trace files of a folder, as `stepcli table` picks them, minus run summaries kept beside them."""
    found = _json_files(folder)
    named = [p for p in found if ".pt.trace.json" in os.path.basename(p)]
    return sorted(named or [p for p in found if _read_run_summary(p) is None])


def _folder_run_summaries(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """The run summaries in a folder (recursively): each is one run. They win over traces beside them, since a
    summary has every step, a trace only the recorded ones; a summary's traces still serve attribution."""
    out = []
    for path in _json_files(folder):
        if ".pt.trace.json" in os.path.basename(path):
            continue
        doc = _read_run_summary(path)
        if doc is not None:
            out.append((path, doc))
    return out


def _read_run_summary(path: str) -> dict[str, Any] | None:
    import orjson

    from stepcli.inputs import outline, read_input

    if path.endswith(".gz"):
        return None
    try:
        data = read_input(path)
        if outline(data) != ("run", RUN_SCHEMA):
            return None  # traces and anything else: the trace reader reports them
        doc = orjson.loads(data)
    except (StepcliError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == RUN_SCHEMA else None


def _invalid_run(label: str, problem: str) -> StepcliError:
    return StepcliError(f"{label}: not a valid stepcli run summary: {problem}", EXIT_USAGE)


def _stats_or_none(value: Any, label: str, where: str) -> Stats | None:
    """Validated Stats, so a hand-edited or corrupt file fails with a line instead of a NaN verdict."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _invalid_run(label, f"{where} is neither null nor an object")
    out: dict[str, Any] = {}
    for key in STAT_NAMES:
        number = value.get(key)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0:
            raise _invalid_run(label, f"{where}.{key} is not a non-negative number")
        out[key] = number
    if out["count"] == 0:
        return None
    out["count"] = int(out["count"])
    return Stats(**out)  # type: ignore[typeddict-item]


def _ops(rows: Any, label: str, where: str) -> tuple[OpTime, ...]:
    if not isinstance(rows, list):
        raise _invalid_run(label, f"{where} is not a list")
    merged: dict[str, OpTime] = {}
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
            raise _invalid_run(label, f"{where} has an entry without a name")
        if row["name"] == STEP_KEY:
            continue  # the step annotation, not an operator: the run summary leaves it out too (stepcli.traces.shares)
        try:
            op = OpTime(
                name=row["name"],
                calls=int(row.get("calls") or 0),
                self_ms=float(row.get("self_ms") or 0.0),
                total_ms=float(row.get("total_ms") or 0.0),
            )
        except (TypeError, ValueError):
            raise _invalid_run(label, f"{where}: {row['name']!r} has non-numeric times") from None
        old = merged.get(op.name)
        if old is not None:  # e.g. the same op on several ranks: one row per name
            op = OpTime(op.name, old.calls + op.calls, old.self_ms + op.self_ms, old.total_ms + op.total_ms)
        merged[op.name] = op
    return tuple(merged.values())
