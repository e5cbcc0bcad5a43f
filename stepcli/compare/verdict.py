"""The CI verdict of `stepcli compare` (pure: no I/O, no printing).

Verdict rules (the contract the tests pin down):
- The deciding number is one statistic (`--metric`, default median) of step durations in ms. Its change from
  baseline to current gets a bootstrap confidence interval (stepcli.compare.inference) over every step of every run.
- The allowed change is `limit = max(tolerance * baseline, min_delta_ms)`; a change equal to it (to float
  rounding) is within it.
  * regression: the whole interval lies above +limit: the slowdown is significantly beyond both the tolerance
    and --min-delta-ms (so a change within the tolerance is called a regression at most (1-confidence)/2 of
    the time, however noisy the steps);
  * improvement: the whole interval lies below -limit;
  * no change: the interval does not reach beyond +limit;
  * inconclusive: the interval straddles +limit: the data cannot tell a regression beyond the tolerance from
    noise (the message says about how many more steps or runs would).
- Inputs without every step's time (hand-made or schema 1 summaries without a timeline) are decided on the two
  statistics alone, as before intervals existed, and the report says so.
- Steps that decide: warm-up steps are detected per run (MSER-5) and left out, unless `--skip-steps N` sets the
  first step used. Populations:
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stepcli.compare.attribution import OpChange
from stepcli.compare.budgets import exceeds
from stepcli.compare.inference import (
    DEFAULT_RESAMPLES,
    Change,
    block_length,
    estimate_change,
    more_needed,
    warmup_length,
)
from stepcli.compare.model import Measurement
from stepcli.errors import EXIT_INCONCLUSIVE, EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_REGRESSION
from stepcli.fmt import ms_fixed as _fmt_ms
from stepcli.stats import METRICS, STAT_NAMES, Stats, describe

TOP_OPS = 10

Verdict = Literal["regression", "improvement", "no_change", "inconclusive", "nothing_measured"]
HEADLINES = {
    "regression": "REGRESSION",
    "improvement": "IMPROVEMENT",
    "no_change": "NO CHANGE",
    "inconclusive": "INCONCLUSIVE",
    "nothing_measured": "NOTHING MEASURED",
}


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
    message: str  # the verdict line without its headline
    baseline_population: str | None = None
    current_population: str | None = None
    baseline_value: float | None = None
    current_value: float | None = None
    limit_ms: float | None = None
    step_rows: tuple[StepRow, ...] = ()
    op_rows: tuple[OpRow, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    confidence: float = 0.95
    change: Change | None = None  # None: decided on two statistics, without an interval
    method: str | None = None  # how the interval was made, in words
    steps_used: tuple[str, ...] = ()  # which steps of each run decided, in words
    baseline_samples: tuple[float, ...] = ()  # the deciding steps, for the distributions
    current_samples: tuple[float, ...] = ()
    op_changes: tuple[OpChange, ...] = ()

    @property
    def delta_ms(self) -> float | None:
        if self.baseline_value is None or self.current_value is None:
            return None
        return self.current_value - self.baseline_value

    @property
    def headline(self) -> str:
        return HEADLINES[self.verdict]

    @property
    def verdict_line(self) -> str:
        return f"{self.headline}: {self.message}"


# --------------------------------------------------------------------------- option parsing


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


def parse_confidence(text: str | float) -> float:
    """`95%` or `0.95` -> 0.95; between 50% and 99.9%, since the interval's ends are resampled percentiles."""
    try:
        value = parse_tolerance(text)
    except ValueError:
        value = math.nan
    if not 0.5 <= value <= 0.999:
        raise ValueError(f"expected a level such as 95% or 0.95, between 50% and 99.9%; got {str(text).strip()!r}")
    return value


# --------------------------------------------------------------------------- verdict


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
    confidence: float = 0.95,
    skip_steps: int | None = None,
    strict: bool = False,
    op_changes: Sequence[OpChange] = (),
    resamples: int = DEFAULT_RESAMPLES,
) -> Comparison:
    """The verdict of `current` against `baseline`; no I/O, no printing."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite fraction >= 0; got {tolerance!r}")
    if not (math.isfinite(min_delta_ms) and min_delta_ms >= 0):
        raise ValueError(f"min_delta_ms must be finite and >= 0; got {min_delta_ms!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1; got {confidence!r}")

    pairs, notes = choose_populations(baseline, current)
    b_pop, c_pop = pairs[0]
    with_samples = bool(baseline.runs and current.runs)
    b_first = _first_steps(baseline, b_pop, skip_steps) if with_samples else {}
    c_first = _first_steps(current, c_pop, skip_steps) if with_samples else {}
    step_rows = _step_rows(baseline, current, pairs, (b_first, c_first) if with_samples else None)
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
        confidence=confidence,
        op_changes=tuple(op_changes),
    )

    sides = (("baseline", baseline), ("current", current))
    empty = [(side, m, reason) for side, m in sides if (reason := m.nothing_measured())]
    b_stats, c_stats = baseline.populations.get(b_pop), current.populations.get(c_pop)
    if not empty and (b_stats is None or c_stats is None):
        # Each side measured something, but not the steps this comparison needs.
        empty = [
            (side, m, f"no {pop} steps")
            for (side, m), pop, stats in zip(sides, (b_pop, c_pop), (b_stats, c_stats))
            if stats is None
        ]
    b_runs = _used(baseline, b_pop, b_first) if with_samples else []
    c_runs = _used(current, c_pop, c_first) if with_samples else []
    if not empty and with_samples and not (b_runs and c_runs):
        empty = [
            (side, m, f"no {pop} steps from step {skip_steps} on (--skip-steps {skip_steps})")
            for (side, m), pop, runs in zip(sides, (b_pop, c_pop), (b_runs, c_runs))
            if not runs
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
    population = b_pop if b_pop == c_pop else f"{b_pop}/{c_pop}"
    if not with_samples:
        return _decide_on_statistics(b_stats, c_stats, population, notes, common)

    change = estimate_change(
        [[[ms for _, ms in p] for p in run] for run in b_runs],
        [[[ms for _, ms in p] for p in run] for run in c_runs],
        metric,
        confidence=confidence,
        resamples=resamples,
    )
    base, cur, delta = change.baseline, change.current, change.delta
    limit = max(tolerance * base, min_delta_ms)
    if exceeds(change.low, limit):
        verdict: Verdict = "regression"
    elif exceeds(-change.high, limit):
        verdict = "improvement"
    elif exceeds(change.high, limit):
        verdict = "inconclusive"
    else:
        verdict = "no_change"
    for label, count in (("baseline", change.baseline_steps), ("current", change.current_steps)):
        if count < 10:
            notes.append(f"only {count} step(s) on the {label} side decide; the interval is rough")
    interval = f"{_fmt_level(confidence)} CI {_ci(change.low, change.high, base)}"
    numbers = f"{_fmt_ms(base)} ms -> {_fmt_ms(cur)} ms ({_signed(delta)} ms, {_pct(delta, base)}, {interval})"
    allowed = _allowed(limit, tolerance, base, min_delta_ms)
    clause = {
        "regression": f"exceeds {allowed}, all of its interval",
        "improvement": f"is faster by more than {allowed.replace('the allowed +', 'the allowed ')}, all of its interval",
        "no_change": f"is within {allowed}",
        "inconclusive": f"may or may not exceed {allowed}: {_more_data(change, limit)}",
    }[verdict]
    runs_text = (
        f"runs resampled ({change.baseline_runs} baseline, {change.current_runs} current), then "
        if change.baseline_runs > 1 or change.current_runs > 1
        else ""
    )
    one_run = (
        "; one run per side, so run-to-run variation is not in the interval (pass several --baseline/--current runs)"
        if change.baseline_runs == 1 and change.current_runs == 1
        else ""
    )
    blocks = sorted({block_length(len(p)) for run in b_runs + c_runs for p in run})
    method = (
        f"{change.method}: {runs_text}circular blocks of {'/'.join(map(str, blocks))} steps, "
        f"{change.resamples} resamples, fixed seed{one_run}"
    )
    return Comparison(
        verdict=verdict,
        exit_code={
            "regression": EXIT_REGRESSION,
            "inconclusive": EXIT_INCONCLUSIVE if strict else EXIT_OK,
        }.get(verdict, EXIT_OK),
        message=f"{metric} step time ({population} steps) {numbers} {clause}",
        baseline_population=b_pop,
        current_population=c_pop,
        baseline_value=base,
        current_value=cur,
        limit_ms=limit,
        notes=tuple(notes),
        change=change,
        method=method,
        steps_used=tuple(_steps_used("baseline", baseline, b_pop, b_first, skip_steps))
        + tuple(_steps_used("current", current, c_pop, c_first, skip_steps)),
        baseline_samples=tuple(ms for run in b_runs for p in run for _, ms in p),
        current_samples=tuple(ms for run in c_runs for p in run for _, ms in p),
        **common,
    )


def _decide_on_statistics(
    b_stats: Stats, c_stats: Stats, population: str, notes: list[str], common: dict[str, Any]
) -> Comparison:
    """The verdict from two statistics when an input lacks per-step times: no interval, the limit alone."""
    metric, tolerance, min_delta_ms = common["metric"], common["tolerance"], common["min_delta_ms"]
    base = float(b_stats[metric])  # type: ignore[literal-required]
    cur = float(c_stats[metric])  # type: ignore[literal-required]
    delta = cur - base
    limit = max(tolerance * base, min_delta_ms)
    verdict: Verdict = (
        "regression" if exceeds(delta, limit) else "improvement" if exceeds(-delta, limit) else "no_change"
    )
    for label, stats in (("baseline", b_stats), ("current", c_stats)):
        if stats["count"] < 3:
            notes.append(f"only {stats['count']} step(s) on the {label} side decide; the verdict is noisy")
    missing = [m.label for m in (common["baseline"], common["current"]) if not m.runs]
    notes.append(
        f"{', '.join(missing)} has no per-step times (a schema 1 run summary without timeline_ms): decided on the "
        f"two {metric}s alone, without a confidence interval"
    )
    change = f"{_fmt_ms(base)} ms -> {_fmt_ms(cur)} ms ({_signed(delta)} ms, {_pct(delta, base)})"
    allowed = _allowed(limit, tolerance, base, min_delta_ms)
    clause = {
        "regression": f"exceeds {allowed}",
        "improvement": f"is faster by more than {allowed.replace('the allowed +', 'the allowed ')}",
        "no_change": f"is within {allowed}",
    }[verdict]
    pops = population.split("/")
    return Comparison(
        verdict=verdict,
        exit_code=EXIT_REGRESSION if verdict == "regression" else EXIT_OK,
        message=f"{metric} step time ({population} steps) {change} {clause}",
        baseline_population=pops[0],
        current_population=pops[-1],
        baseline_value=base,
        current_value=cur,
        limit_ms=limit,
        notes=tuple(notes),
        **common,
    )


def _allowed(limit: float, tolerance: float, base: float, min_delta_ms: float) -> str:
    return (
        f"the allowed +{_fmt_ms(limit)} ms (larger of tolerance {_fmt_pct(tolerance)} of baseline "
        f"= {_fmt_ms(tolerance * base)} ms and --min-delta-ms {_fmt_ms(min_delta_ms)})"
    )


def _more_data(change: Change, limit: float) -> str:
    """How much more data would likely decide, in runs when a side has several, else in steps."""
    factor = more_needed(change, limit)
    if factor is None:
        return "the estimate sits on the limit, so no amount of data decides it"
    if change.baseline_runs > 1 or change.current_runs > 1:
        runs = max(change.baseline_runs, change.current_runs)
        return f"about {max(1, math.ceil(runs * (factor - 1)))} more runs per side would decide it"
    steps = max(change.baseline_steps, change.current_steps)
    return f"about {max(1, math.ceil(steps * (factor - 1)))} more steps per side (or more runs) would decide it"


def _first_steps(m: Measurement, population: str, skip_steps: int | None) -> dict[int, int]:
    """Per run (by index), the first step used: `--skip-steps`, else the end of the warm-up MSER-5 finds."""
    out: dict[int, int] = {}
    for index, run in enumerate(m.runs):
        if skip_steps is not None:
            out[index] = skip_steps
            continue
        series = run.population(population)
        if not series:
            out[index] = 0
            continue
        # One value per position: the mean over processes, so ranks that move together count once.
        longest = max(series, key=len)
        means = [
            sum(p[i][1] for p in series if i < len(p)) / sum(1 for p in series if i < len(p))
            for i in range(len(longest))
        ]
        cut = warmup_length(means)
        out[index] = longest[cut][0] if cut else 0
    return out


def _used(m: Measurement, population: str, first: dict[int, int]) -> list[list[list[tuple[int, float]]]]:
    """Per run, per process, the (step, ms) that decide; runs left with no step are dropped."""
    runs = [run.population(population, first.get(index, 0)) for index, run in enumerate(m.runs)]
    return [run for run in runs if run]


def _steps_used(side: str, m: Measurement, population: str, first: dict[int, int], skip: int | None) -> list[str]:
    lines = []
    for index, run in enumerate(m.runs[:4]):
        kept = [step for p in run.population(population, first.get(index, 0)) for step, _ in p]
        if not kept:
            lines.append(f"{side} {run.label}: no {population} steps left")
            continue
        text = f"{side} {run.label}: {population} steps {min(kept)}-{max(kept)} ({len(kept)} step times)"
        all_steps = [step for p in run.population(population) for step, _ in p]
        cut = [s for s in all_steps if s < first.get(index, 0)]
        if cut:
            why = f"--skip-steps {skip}" if skip is not None else "warm-up detected (MSER-5)"
            text += f"; steps {min(cut)}-{max(cut)} left out: {why}"
        lines.append(text)
    if len(m.runs) > 4:
        lines.append(f"{side}: +{len(m.runs) - 4} more runs")
    return lines


def _step_rows(
    baseline: Measurement,
    current: Measurement,
    pairs: list[tuple[str, str]],
    first: tuple[dict[int, int], dict[int, int]] | None = None,
) -> tuple[StepRow, ...]:
    rows: list[StepRow] = []
    for index, (b_pop, c_pop) in enumerate(pairs):
        if first is None:
            b_stats, c_stats = baseline.populations.get(b_pop), current.populations.get(c_pop)
        else:  # the steps actually used, so the table agrees with the verdict
            b_stats = _describe_used(baseline, b_pop, first[0])
            c_stats = _describe_used(current, c_pop, first[1])
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


def _describe_used(m: Measurement, population: str, first: dict[int, int]) -> Stats | None:
    return describe(ms for run in _used(m, population, first) for p in run for _, ms in p)


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


# --------------------------------------------------------------------------- numbers in words


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


def _fmt_level(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def _ci(low: float, high: float, base: float) -> str:
    """`+5.1% .. +9.3%`, or in ms when the baseline is 0."""
    if base == 0:
        return f"{_signed(low)} .. {_signed(high)} ms"
    return f"{_pct(low, base)} .. {_pct(high, base)}"
