"""`stepcli compare`: load two measurements, decide the CI verdict (pure), and render it (table, Markdown).

Verdict rules (the contract the tests pin down):
- The deciding number is one statistic (`--metric`, default median) of step durations in ms.
- Regression iff `delta > tolerance * baseline` AND `delta > min_delta_ms`, i.e. iff the delta exceeds
  `max(tolerance * baseline, min_delta_ms)`. A delta equal to that limit (to float rounding) passes.
- Which steps decide ("populations"):
  * run summary vs run summary: the steps the profiler never touched ("untouched"), so profiler overhead
    cannot decide. When either side has no untouched steps, both sides fall back to the warmup+recorded
    steps ("profiled") and the report says so.
  * trace vs trace: the recorded `ProfilerStep#N` steps ("recorded"): that is all a trace has.
  * run summary vs trace: the run's "profiled" steps against the trace's recorded ones, so both sides ran
    under the profiler (like with like); the report names both populations.
- A side that measured nothing (0 steps, 0 events, no step statistics, an empty trace folder) gives
  EXIT_NOTHING_MEASURED, never a pass. Bad input raises StepcliError (exit 2) before anything is decided.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from stepcli.shares import STEP_KEY
from stepcli.errors import EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, StepcliError
from stepcli.gate import exceeds
from stepcli.stats import STAT_NAMES, Stats

if TYPE_CHECKING:
    from rich.console import Console

RUN_SCHEMA = "stepcli.run"
RUN_SCHEMA_VERSIONS = (1,)
METRICS = ("median", "mean", "p90", "min", "max")
TOP_OPS = 10

# Files above this size are not parsed here just to tell a run summary (a few KB) from a trace:
# they go straight to the trace reader, so a big trace is parsed once.
_SNIFF_LIMIT_BYTES = 8 * 1024 * 1024

Kind = Literal["run", "trace"]
Verdict = Literal["pass", "regression", "nothing_measured"]


@dataclass(frozen=True)
class OpTime:
    """One operator's times on one side, totals over that side's recorded steps."""

    name: str
    calls: int
    self_ms: float
    total_ms: float


@dataclass(frozen=True)
class Measurement:
    """One side of a comparison, whatever file it came from."""

    label: str
    kind: Kind
    steps: int  # run: global steps; trace: ProfilerStep#N annotations
    populations: Mapping[str, Stats | None]  # ordered; run: untouched, profiled; trace: recorded
    ops: tuple[OpTime, ...] = ()
    # Run summaries keep only their top operators: an op missing there may just be below the cut.
    ops_complete: bool = True
    events: int | None = None  # trace events; None for run summaries (they do not count them)
    exit_status: int | None = None  # the profiled program's, for run summaries
    empty_reason: str | None = None  # set when loading already found nothing to measure

    @property
    def description(self) -> str:
        what = "run summary" if self.kind == "run" else "trace"
        extra = f", {self.events} events" if self.events is not None else ""
        return f"{what}, {self.steps} steps{extra}"

    def nothing_measured(self) -> str | None:
        """Why this side cannot be compared at all, or None when it measured something."""
        if self.empty_reason:
            return self.empty_reason
        if self.events == 0:
            return "0 trace events"
        no_stats = all(stats is None for stats in self.populations.values())
        if self.kind == "trace" and (no_stats or self.steps == 0):
            return f"no ProfilerStep#N step annotations in its {self.events} events"
        if self.steps == 0:
            return "0 steps"
        if no_stats:
            return "no step times"
        return None


@dataclass(frozen=True)
class StepRow:
    """One statistic of one step population, both sides."""

    population: str  # "untouched", "profiled", "recorded" or "profiled/recorded"
    stat: str
    baseline: float | None
    current: float | None
    decides: bool


@dataclass(frozen=True)
class OpRow:
    """One operator's self-time change; `status` says when the op is missing on one side."""

    name: str
    baseline_ms: float | None
    current_ms: float | None
    status: str


@dataclass(frozen=True)
class Comparison:
    """Everything the verdict and its report need; built by `decide`, printed by the renderers."""

    baseline: Measurement
    current: Measurement
    metric: str
    tolerance: float
    min_delta_ms: float
    verdict: Verdict
    exit_code: int
    message: str  # the verdict line without its PASS/REGRESSION prefix
    baseline_population: str | None = None
    current_population: str | None = None
    baseline_value: float | None = None
    current_value: float | None = None
    limit_ms: float | None = None
    step_rows: tuple[StepRow, ...] = ()
    op_rows: tuple[OpRow, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def delta_ms(self) -> float | None:
        if self.baseline_value is None or self.current_value is None:
            return None
        return self.current_value - self.baseline_value

    @property
    def headline(self) -> str:
        return {"pass": "PASS", "regression": "REGRESSION", "nothing_measured": "NOTHING MEASURED"}[self.verdict]

    @property
    def verdict_line(self) -> str:
        return f"{self.headline}: {self.message}"


# --------------------------------------------------------------------------- verdict (pure)


def parse_tolerance(text: str | float) -> float:
    """`10%` -> 0.1 and `0.1` -> 0.1; raises ValueError otherwise.

    A bare number above 1 is refused rather than guessed: `10` could mean 10% or 1000%.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        if not math.isfinite(value) or not 0 <= value <= 1:
            raise ValueError(f"expected a fraction between 0 and 1; got {text!r}")
        return value
    raw = str(text).strip()
    hint = "expected a percentage such as 10% or a fraction such as 0.1"
    percent = raw.endswith("%")
    number = raw[:-1].strip() if percent else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{hint}; got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{hint}; got {raw!r}")
    if percent:
        return value / 100.0
    if value > 1:
        raise ValueError(f"{hint}; got {raw!r} (did you mean {raw}%?)")
    return value


def choose_populations(baseline: Measurement, current: Measurement) -> tuple[list[tuple[str, str]], list[str]]:
    """The step populations to show, deciding pair first, and notes explaining any fallback.

    See the module docstring for why each pairing is the like-with-like one.
    """
    notes: list[str] = []
    if baseline.kind == "trace" and current.kind == "trace":
        return [("recorded", "recorded")], notes
    if baseline.kind == "run" and current.kind == "run":
        missing = [m.label for m in (baseline, current) if m.populations.get("untouched") is None]
        if missing and baseline.populations.get("profiled") and current.populations.get("profiled"):
            notes.append(
                f"no untouched steps in {', '.join(missing)}: compared the profiled (warmup+recorded) steps, "
                "which include profiler overhead"
            )
            return [("profiled", "profiled"), ("untouched", "untouched")], notes
        return [("untouched", "untouched"), ("profiled", "profiled")], notes
    run_side = "baseline" if baseline.kind == "run" else "current"
    notes.append(
        f"the {run_side} is a run summary and the other side a trace: compared the run's profiled "
        "(warmup+recorded) steps with the trace's recorded steps, since a trace has nothing else"
    )
    if baseline.kind == "run":
        return [("profiled", "recorded")], notes
    return [("recorded", "profiled")], notes


def decide(
    baseline: Measurement,
    current: Measurement,
    *,
    tolerance: float,
    min_delta_ms: float,
    metric: str = "median",
    top: int = TOP_OPS,
) -> Comparison:
    """The verdict of `current` against `baseline`; no I/O, no printing."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite fraction >= 0; got {tolerance!r}")
    if not (math.isfinite(min_delta_ms) and min_delta_ms >= 0):
        raise ValueError(f"min_delta_ms must be finite and >= 0; got {min_delta_ms!r}")

    pairs, notes = choose_populations(baseline, current)
    step_rows = _step_rows(baseline, current, pairs)
    op_rows = _op_rows(baseline, current, top)
    for side in (baseline, current):
        if side.exit_status not in (None, 0):
            notes.append(f"{side.label}: the profiled program exited with status {side.exit_status}")
    common: dict[str, Any] = dict(
        baseline=baseline,
        current=current,
        metric=metric,
        tolerance=tolerance,
        min_delta_ms=min_delta_ms,
        step_rows=step_rows,
        op_rows=op_rows,
    )

    sides = (("baseline", baseline), ("current", current))
    empty = [(side, m, reason) for side, m in sides if (reason := m.nothing_measured())]
    b_pop, c_pop = pairs[0]
    b_stats, c_stats = baseline.populations.get(b_pop), current.populations.get(c_pop)
    if not empty and (b_stats is None or c_stats is None):
        # Each side measured something, but not the steps this comparison needs.
        empty = [
            (side, m, f"no {pop} steps")
            for (side, m), pop, stats in zip(sides, (b_pop, c_pop), (b_stats, c_stats))
            if stats is None
        ]
    if empty:
        why = "; ".join(f"{side} {m.label} has {reason}" for side, m, reason in empty)
        return Comparison(
            verdict="nothing_measured",
            exit_code=EXIT_NOTHING_MEASURED,
            message=f"{why}; a comparison needs step times on both sides",
            notes=tuple(notes),
            **common,
        )

    assert b_stats is not None and c_stats is not None
    base = float(b_stats[metric])  # type: ignore[literal-required]
    cur = float(c_stats[metric])  # type: ignore[literal-required]
    delta = cur - base
    limit = max(tolerance * base, min_delta_ms)
    regression = exceeds(delta, limit)
    for label, stats in (("baseline", b_stats), ("current", c_stats)):
        if stats["count"] < 3:
            notes.append(f"only {stats['count']} step(s) on the {label} side decide; the verdict is noisy")

    population = b_pop if b_pop == c_pop else f"{b_pop}/{c_pop}"
    change = f"{_fmt_ms(base)} ms -> {_fmt_ms(cur)} ms ({_signed(delta)} ms, {_pct(delta, base)})"
    allowed = (
        f"the allowed +{_fmt_ms(limit)} ms (larger of tolerance {_fmt_pct(tolerance)} of baseline "
        f"= {_fmt_ms(tolerance * base)} ms and --min-delta-ms {_fmt_ms(min_delta_ms)})"
    )
    message = f"{metric} step time ({population} steps) {change} {'exceeds' if regression else 'is within'} {allowed}"
    return Comparison(
        verdict="regression" if regression else "pass",
        exit_code=EXIT_REGRESSION if regression else EXIT_OK,
        message=message,
        baseline_population=b_pop,
        current_population=c_pop,
        baseline_value=base,
        current_value=cur,
        limit_ms=limit,
        notes=tuple(notes),
        **common,
    )


def _step_rows(baseline: Measurement, current: Measurement, pairs: list[tuple[str, str]]) -> tuple[StepRow, ...]:
    rows: list[StepRow] = []
    for index, (b_pop, c_pop) in enumerate(pairs):
        b_stats, c_stats = baseline.populations.get(b_pop), current.populations.get(c_pop)
        if index > 0 and b_stats is None and c_stats is None:
            continue
        population = b_pop if b_pop == c_pop else f"{b_pop}/{c_pop}"
        for stat in STAT_NAMES:
            rows.append(
                StepRow(
                    population=population,
                    stat=stat,
                    baseline=None if b_stats is None else float(b_stats[stat]),  # type: ignore[literal-required]
                    current=None if c_stats is None else float(c_stats[stat]),  # type: ignore[literal-required]
                    decides=index == 0,
                )
            )
    return tuple(rows)


def _op_rows(baseline: Measurement, current: Measurement, top: int) -> tuple[OpRow, ...]:
    """Operators matched by name, the `top` with the largest self time on either side."""
    before = {op.name: op.self_ms for op in baseline.ops}
    after = {op.name: op.self_ms for op in current.ops}
    names = sorted(set(before) | set(after), key=lambda n: (-max(before.get(n, 0.0), after.get(n, 0.0)), n))
    rows = []
    for name in names[: max(top, 0)]:
        if name not in before:
            status = "new" if baseline.ops_complete else "not in baseline top"
        elif name not in after:
            status = "removed" if current.ops_complete else "not in current top"
        else:
            status = ""
        rows.append(OpRow(name=name, baseline_ms=before.get(name), current_ms=after.get(name), status=status))
    return tuple(rows)


# --------------------------------------------------------------------------- loading


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
    return Measurement(
        label=label,
        kind="run",
        steps=steps,
        populations=populations,
        ops=_ops(doc.get("top_operators") or [], label, "top_operators")
        + _ops(doc.get("top_kernels") or [], label, "top_kernels"),
        ops_complete=False,
        exit_status=exit_status,
    )


def measurement_from_summary(summary: Mapping[str, Any], label: str) -> Measurement:
    """A trace summary (`stepcli.summary.summarize(...).to_dict()`) as a Measurement."""
    stats = _stats_or_none(summary.get("step_ms"), label, "step_ms")
    steps_list = summary.get("steps") or []
    steps = len(steps_list) if isinstance(steps_list, list) else 0
    if stats is not None:
        steps = max(steps, stats["count"])
    events = summary.get("events")
    ops = _ops(summary.get("cpu_ops") or [], label, "cpu_ops") + _ops(
        summary.get("device_kernels") or [], label, "device_kernels"
    )
    return Measurement(
        label=label,
        kind="trace",
        steps=steps,
        populations={"recorded": stats},
        ops=ops,
        events=int(events) if isinstance(events, (int, float)) and not isinstance(events, bool) else None,
    )


def load_measurement(path: str) -> Measurement:
    """Read one side: a run summary JSON, a trace file, or a folder of traces."""
    target = Path(path)
    if not target.exists():
        raise StepcliError(f"{path}: no such file or directory", EXIT_USAGE)
    if target.is_dir():
        files = _folder_traces(target)
        if not files:
            # A run whose program never stepped writes no trace: that is "nothing measured", not bad input.
            return Measurement(label=path, kind="trace", steps=0, populations={"recorded": None}, events=0,
                               empty_reason="no trace files in this folder")
        return _load_traces(path, files)
    try:
        size = target.stat().st_size
    except OSError as exc:
        raise StepcliError(f"{path}: cannot read ({exc.strerror or exc})", EXIT_USAGE) from None
    if size == 0:
        raise StepcliError(f"{path}: empty file", EXIT_USAGE)
    if path.endswith(".gz") or size > _SNIFF_LIMIT_BYTES:
        return _load_traces(path)
    import orjson

    try:
        data = target.read_bytes()
    except OSError as exc:
        raise StepcliError(f"{path}: cannot read ({exc.strerror or exc})", EXIT_USAGE) from None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StepcliError(f"{path}: not valid JSON ({exc})", EXIT_USAGE) from None
    if isinstance(doc, dict) and "schema" in doc:
        if doc["schema"] != RUN_SCHEMA:
            raise StepcliError(
                f"{path}: unknown document schema {doc['schema']!r}; expected a {RUN_SCHEMA!r} run summary or a trace",
                EXIT_USAGE,
            )
        return measurement_from_run(doc, path)
    if isinstance(doc, dict) and "traceEvents" in doc:
        return _load_traces(path)
    raise StepcliError(
        f"{path}: neither a stepcli run summary (schema {RUN_SCHEMA!r}) nor a profiler trace (no traceEvents)",
        EXIT_USAGE,
    )


def _load_traces(label: str, files: Sequence[str] | None = None) -> Measurement:
    # Lazy: the trace reader and summarizer are only needed for trace inputs.
    from stepcli.summary import summarize
    from stepcli.traces import load_paths

    return measurement_from_summary(summarize(load_paths(list(files or [label]))).to_dict(), label)


def _folder_traces(folder: Path) -> list[str]:
    """The trace files of a folder, as `stepcli table` picks them, minus run summaries kept beside them.

    `run -o out --json out/summary.json` puts a run summary in the run folder; when the program never
    stepped it is the only JSON there, and it must read as "no traces", not as a broken trace.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]  # .stepcli/ holds step logs
        found += [
            os.path.join(dirpath, name)
            for name in filenames
            if name.endswith((".json", ".json.gz")) and not name.startswith(".") and ".tmp" not in name
        ]
    named = [p for p in found if ".pt.trace.json" in os.path.basename(p)]
    return sorted(named or [p for p in found if not _is_run_summary(p)])


def _is_run_summary(path: str) -> bool:
    import orjson

    try:
        if path.endswith(".gz") or os.path.getsize(path) > _SNIFF_LIMIT_BYTES:
            return False
        doc = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("schema") == RUN_SCHEMA


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
            continue  # the step annotation, not an operator: the run summary leaves it out too (stepcli.shares)
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


# --------------------------------------------------------------------------- rendering


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _pct(delta: float | None, base: float | None) -> str:
    if delta is None or base is None:
        return "-"
    if base == 0:
        return "n/a"
    return f"{delta / base * 100:+.1f}%"


def _fmt_pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _step_cells(row: StepRow) -> list[str]:
    if row.stat == "count":
        fmt = lambda v: "-" if v is None else str(int(v))  # noqa: E731
        delta = None if row.baseline is None or row.current is None else row.current - row.baseline
        return [fmt(row.baseline), fmt(row.current), "-" if delta is None else f"{int(delta):+d}", _pct(delta, row.baseline)]
    delta = None if row.baseline is None or row.current is None else row.current - row.baseline
    return [_fmt_ms(row.baseline), _fmt_ms(row.current), _signed(delta), _pct(delta, row.baseline)]


def _op_cells(row: OpRow) -> list[str]:
    delta = None if row.baseline_ms is None or row.current_ms is None else row.current_ms - row.baseline_ms
    return [_fmt_ms(row.baseline_ms), _fmt_ms(row.current_ms), _signed(delta), _pct(delta, row.baseline_ms), row.status]


def render_console(comparison: Comparison, console: Console) -> None:
    """The human report: sides, step-time table, operator table, notes, verdict line."""
    from rich.table import Table
    from rich.text import Text

    from stepcli.render import NAME_WIDTH, shorten

    c = comparison
    # Plain lines never wrap (soft_wrap): CI logs are grepped for the verdict and paths.
    console.print(f"baseline: {c.baseline.label} ({c.baseline.description})", markup=False, highlight=False, soft_wrap=True)
    console.print(f"current:  {c.current.label} ({c.current.description})", markup=False, highlight=False, soft_wrap=True)

    steps = Table(title="Step time (ms)", title_justify="left")
    for name, justify in (("steps", "left"), ("stat", "left"), ("baseline", "right"), ("current", "right"),
                          ("delta", "right"), ("delta %", "right"), ("", "left")):
        steps.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in c.step_rows:
        decides = row.decides and row.stat == c.metric and c.verdict != "nothing_measured"
        steps.add_row(row.population, row.stat, *_step_cells(row), "<- decides" if decides else "",
                      style="bold" if decides else None)
    console.print(steps)

    if c.op_rows:
        ops = Table(title="Top operators by self time (ms)", caption="totals over each side's recorded steps",
                    title_justify="left", caption_justify="left")
        for name, justify in (("operator", "left"), ("baseline", "right"), ("current", "right"),
                              ("delta", "right"), ("delta %", "right"), ("", "left")):
            ops.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        # Names are shortened in the middle, as `table` and `run` do, never wrapped mid-word.
        cells = [_op_cells(op) for op in c.op_rows]
        headers = ("baseline", "current", "delta", "delta %", "")
        fixed = sum(max([len(h), *(len(cell[i]) for cell in cells)]) for i, h in enumerate(headers))
        name_width = max(12, min(NAME_WIDTH, console.width - fixed - 3 * 6 - 1))
        for op, op_cells in zip(c.op_rows, cells):
            ops.add_row(Text(shorten(op.name, name_width)), *op_cells)
        console.print(ops)

    for note in c.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    style = {"pass": "bold green", "regression": "bold red", "nothing_measured": "bold yellow"}[c.verdict]
    console.print(Text(c.verdict_line, style=style), soft_wrap=True)


def render_markdown(comparison: Comparison) -> str:
    """The same report as GitHub-flavoured Markdown (for --markdown and $GITHUB_STEP_SUMMARY)."""
    c = comparison
    lines = [
        f"### stepcli compare: {c.headline}",
        "",
        f"- baseline: `{_md_code(c.baseline.label)}` ({c.baseline.description})",
        f"- current: `{_md_code(c.current.label)}` ({c.current.description})",
        "",
        "**Step time (ms)**",
        "",
        "| steps | stat | baseline | current | delta | delta % | |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in c.step_rows:
        decides = row.decides and row.stat == c.metric and c.verdict != "nothing_measured"
        cells = [row.population, f"**{row.stat}**" if decides else row.stat, *_step_cells(row), "decides" if decides else ""]
        lines.append(_md_row(cells))
    if c.op_rows:
        lines += [
            "",
            "**Top operators by self time (ms, totals over each side's recorded steps)**",
            "",
            "| operator | baseline | current | delta | delta % | |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for op in c.op_rows:
            lines.append(_md_row([f"`{_md_code(op.name, in_table=True)}`", *_op_cells(op)]))
    lines.append("")
    for note in c.notes:
        lines += [f"> note: {_md_escape(note)}", ""]
    lines += [f"**{c.headline}**: {_md_escape(c.message)}", ""]
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    # Pipes would split table cells; the other characters would start emphasis or HTML.
    for char in ("\\", "|", "*", "_", "<", "`", "["):
        text = text.replace(char, "\\" + char)
    return text


def _md_code(text: str, *, in_table: bool = False) -> str:
    # Inside a code span backslashes are literal and a backtick would end the span; in a table
    # cell GFM still splits on a bare pipe, so there (only) it is escaped.
    text = text.replace("`", "'")
    return text.replace("|", "\\|") if in_table else text


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("\n", " ") if cell else " " for cell in cells) + " |"


# --------------------------------------------------------------------------- command


def compare_main(
    baseline: str,
    current: str,
    *,
    tolerance: str | float = "10%",
    min_delta_ms: float = 0.0,
    metric: str = "median",
    markdown_path: str | None = None,
) -> int:
    """`stepcli compare`: load, decide, print; returns the exit code (StepcliError for bad input)."""
    try:
        fraction = parse_tolerance(tolerance)
    except ValueError as exc:
        raise StepcliError(f"--tolerance: {exc}", EXIT_USAGE) from None
    if not math.isfinite(min_delta_ms) or min_delta_ms < 0:
        raise StepcliError(f"--min-delta-ms must be a number >= 0; got {min_delta_ms!r}", EXIT_USAGE)
    if metric not in METRICS:
        raise StepcliError(f"--metric: expected one of {', '.join(METRICS)}; got {metric!r}", EXIT_USAGE)

    comparison = decide(
        load_measurement(baseline),
        load_measurement(current),
        tolerance=fraction,
        min_delta_ms=min_delta_ms,
        metric=metric,
    )

    markdown = render_markdown(comparison)
    if markdown_path == "-":
        sys.stdout.write(markdown)
        sys.stdout.flush()
    else:
        from rich.console import Console

        render_console(comparison, Console())
        if markdown_path:
            try:
                Path(markdown_path).write_text(markdown, encoding="utf-8")
            except OSError as exc:
                raise StepcliError(f"{markdown_path}: cannot write the Markdown report ({exc.strerror or exc})",
                                   EXIT_USAGE) from None
    _append_step_summary(markdown)
    return comparison.exit_code


def _append_step_summary(markdown: str) -> None:
    """Append (never overwrite) to GitHub's job summary file when Actions provides one."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write("\n" + markdown)
    except OSError as exc:
        # The verdict is the product; a summary we cannot write only costs the pretty report.
        print(f"stepcli: warning: could not append to GITHUB_STEP_SUMMARY {target}: {exc.strerror or exc}",
              file=sys.stderr)
