"""The CI verdict of `stepcli compare` (pure: no I/O, no printing).

Verdict rules (the contract the tests pin down):
- The deciding number is one statistic (`--metric`, default median) of step durations in ms. Its change from
  baseline to current gets a bootstrap confidence interval (stepcli.compare.inference) over every step of every run.
- The allowed change is `limit = max(tolerance * baseline, min_delta_ms)`; a change equal to it (to float
  rounding) is within it. Each part is judged in its own scale: the tolerance on the interval of the ratio
  current/baseline (log step times), the floor on the interval of the difference in ms; "beyond the limit"
  means beyond both.
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
  * run summary vs run summary with fewer than MIN_STEPS untouched step positions on a side (a short run) and more
    profiled ones on both: the profiled steps decide, and the report says so (they include profiler overhead,
    which is the same on both sides).
- Too little data for an interval: fewer than MIN_STEPS step positions on a side (stepcli.compare.inference) give
  no interval. Overwhelming evidence still decides (`separation`): when every current step (per position, ranks
  averaged) is slower than every baseline step by more than the limit in both scales (the smallest current step
  above the largest baseline one x (1 + tolerance), and beyond it by more than --min-delta-ms), and a separation
  that complete has a chance of at most (1-confidence)/2 when nothing changed (1 / C(n+m, n), the exact
  Mann-Whitney tail: 4 vs 4 steps is 1/70, enough at 95%; 3 vs 4 is 1/35, not), it is a regression; the mirror image an improvement. Anything
  else is inconclusive and says how many steps are needed.
- Inconclusive exits EXIT_INCONCLUSIVE: a gate that cannot decide does not pass, unless the caller allows it
  (`--allow-inconclusive`, exit 0 with a warning).
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
    MIN_STEPS,
    Change,
    block_length,
    estimate_change,
    more_needed,
    pooled,
    statistic,
    step_positions,
)
from stepcli.compare.model import Measurement
from stepcli.compare.populations import StepRow, UsedRuns, choose_populations, first_steps, step_rows, steps_used, used
from stepcli.compare.wording import ci as _ci
from stepcli.compare.wording import fmt_level as _fmt_level
from stepcli.compare.wording import fmt_ms as _fmt_ms
from stepcli.compare.wording import fmt_pct as _fmt_pct
from stepcli.compare.wording import pct as _pct
from stepcli.compare.wording import signed as _signed
from stepcli.errors import EXIT_INCONCLUSIVE, EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_REGRESSION
from stepcli.stats import METRICS, Stats

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
    # False when too few recorded steps to judge an operator: op_rows are shown as totals only, without changes
    ops_judged: bool = True

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


def _check_arguments(metric: str, tolerance: float, min_delta_ms: float, confidence: float) -> None:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite fraction >= 0; got {tolerance!r}")
    if not (math.isfinite(min_delta_ms) and min_delta_ms >= 0):
        raise ValueError(f"min_delta_ms must be finite and >= 0; got {min_delta_ms!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1; got {confidence!r}")


@dataclass
class _Sides:
    """Both sides' deciding populations, their first steps and the (step, ms) they keep."""

    baseline: Measurement
    current: Measurement
    pops: tuple[str, str]
    skip_steps: int | None
    with_samples: bool
    first: tuple[dict[int, int], dict[int, int]] = ({}, {})
    runs: tuple[UsedRuns, UsedRuns] = ([], [])

    def __post_init__(self) -> None:
        if self.with_samples:
            b_pop, c_pop = self.pops
            self.first = (
                first_steps(self.baseline, b_pop, self.skip_steps),
                first_steps(self.current, c_pop, self.skip_steps),
            )
            self.runs = (used(self.baseline, b_pop, self.first[0]), used(self.current, c_pop, self.first[1]))

    @property
    def population(self) -> str:
        b_pop, c_pop = self.pops
        return b_pop if b_pop == c_pop else f"{b_pop}/{c_pop}"

    def nothing_measured(self) -> list[tuple[str, Measurement, str]]:
        """(side, measurement, why) for each side that gives nothing to compare."""
        sides = (("baseline", self.baseline), ("current", self.current))
        empty = [(side, m, reason) for side, m in sides if (reason := m.nothing_measured())]
        if empty:
            return empty
        stats = (self.baseline.populations.get(self.pops[0]), self.current.populations.get(self.pops[1]))
        if None in stats:  # each side measured something, but not the steps this comparison needs
            return [(side, m, f"no {pop} steps") for (side, m), pop, st in zip(sides, self.pops, stats) if st is None]
        if self.with_samples and not all(self.runs):
            skip = self.skip_steps
            return [
                (side, m, f"no {pop} steps from step {skip} on (--skip-steps {skip})")
                for (side, m), pop, runs in zip(sides, self.pops, self.runs)
                if not runs
            ]
        return []

    def steps_used(self) -> tuple[str, ...]:
        return tuple(steps_used("baseline", self.baseline, self.pops[0], self.first[0], self.skip_steps)) + tuple(
            steps_used("current", self.current, self.pops[1], self.first[1], self.skip_steps)
        )

    def samples(self, index: int) -> tuple[float, ...]:
        """The deciding step times of one side (0 baseline, 1 current), for the distributions."""
        return tuple(ms for run in self.runs[index] for p in run for _, ms in p)


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
    allow_inconclusive: bool = False,
    op_changes: Sequence[OpChange] = (),
    resamples: int = DEFAULT_RESAMPLES,
) -> Comparison:
    """The verdict of `current` against `baseline`; no I/O, no printing."""
    _check_arguments(metric, tolerance, min_delta_ms, confidence)
    pairs, notes = choose_populations(baseline, current)
    sides = _Sides(baseline, current, pairs[0], skip_steps, bool(baseline.runs and current.runs))
    for side in (baseline, current):
        if side.exit_status not in (None, 0):
            notes.append(f"{side.label}: the profiled program exited with status {side.exit_status}")
    common: dict[str, Any] = dict(
        baseline=baseline,
        current=current,
        metric=metric,
        tolerance=tolerance,
        min_delta_ms=min_delta_ms,
        step_rows=step_rows(baseline, current, pairs, sides.first if sides.with_samples else None, skip_steps),
        op_rows=_op_rows(baseline, current, top),
        confidence=confidence,
        op_changes=tuple(op_changes),
    )
    empty = sides.nothing_measured()
    if empty:
        why = "; ".join(f"{side} {m.label} has {reason}" for side, m, reason in empty)
        return Comparison(
            verdict="nothing_measured",
            exit_code=EXIT_NOTHING_MEASURED,
            message=f"{why}; a comparison needs step times on both sides",
            notes=tuple(notes),
            **common,
        )
    b_stats, c_stats = baseline.populations.get(sides.pops[0]), current.populations.get(sides.pops[1])
    assert b_stats is not None and c_stats is not None
    if not sides.with_samples:
        return _decide_on_statistics(b_stats, c_stats, sides.population, notes, common)
    positions = (step_positions(_times(sides.runs[0])), step_positions(_times(sides.runs[1])))
    if min(positions) < MIN_STEPS:
        return _too_few_steps(sides, positions, notes, allow_inconclusive, common)
    change = estimate_change(
        _times(sides.runs[0]), _times(sides.runs[1]), metric, confidence=confidence, resamples=resamples
    )
    limit = max(tolerance * change.baseline, min_delta_ms)
    verdict = _interval_verdict(change, tolerance, min_delta_ms)
    numbers = (
        f"{_fmt_ms(change.baseline)} ms -> {_fmt_ms(change.current)} ms ({_signed(change.delta)} ms, "
        f"{_pct(change.delta, change.baseline)}, {_fmt_level(confidence)} CI "
        f"{_ci(change)})"
    )
    return Comparison(
        verdict=verdict,
        exit_code=_exit_code(verdict, allow_inconclusive),
        message=f"{metric} step time ({sides.population} steps) {numbers} {_clause(verdict, change, limit, common)}",
        baseline_population=sides.pops[0],
        current_population=sides.pops[1],
        baseline_value=change.baseline,
        current_value=change.current,
        limit_ms=limit,
        notes=tuple(notes),
        change=change,
        method=_method(change, sides.runs[0] + sides.runs[1]),
        steps_used=sides.steps_used(),
        baseline_samples=sides.samples(0),
        current_samples=sides.samples(1),
        **common,
    )


def _times(runs: UsedRuns) -> list[list[list[float]]]:
    return [[[ms for _, ms in p] for p in run] for run in runs]


def _interval_verdict(change: Change, tolerance: float, min_delta_ms: float) -> Verdict:
    """Where the intervals lie against the limit (see the module docstring): the tolerance is a share of the
    baseline, judged on the relative interval; the floor is in ms, judged on the ms interval. A change passes the
    limit, the larger of the two, when it passes both."""
    relative = change.relative_interval()
    low, high = (
        (change.low, change.high)
        if relative is None
        else (relative[0] * change.baseline, relative[1] * change.baseline)
    )
    by_share = tolerance * change.baseline

    def beyond(share_end: float, ms_end: float) -> bool:
        return exceeds(share_end, by_share) and exceeds(ms_end, min_delta_ms)

    if beyond(low, change.low):
        return "regression"
    if beyond(-high, -change.high):
        return "improvement"
    if beyond(high, change.high):
        return "inconclusive"
    return "no_change"


def _exit_code(verdict: Verdict, allow_inconclusive: bool) -> int:
    return {
        "regression": EXIT_REGRESSION,
        "inconclusive": EXIT_OK if allow_inconclusive else EXIT_INCONCLUSIVE,
    }.get(verdict, EXIT_OK)


def _clause(verdict: Verdict, change: Change, limit: float, common: dict[str, Any]) -> str:
    allowed = _allowed(limit, common["tolerance"], change.baseline, common["min_delta_ms"])
    return {
        "regression": f"exceeds {allowed}, all of its interval",
        "improvement": f"is faster by more than {allowed.replace('the allowed +', 'the allowed ')}, all of its interval",
        "no_change": f"is within {allowed}",
        "inconclusive": f"may or may not exceed {allowed}: {_more_data(change, limit)}",
    }[verdict]


def _method(change: Change, runs: UsedRuns) -> str:
    """How the interval was made, in words: resampling scheme, block lengths, resamples, the log scale."""
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
    blocks = sorted({block_length(len(p)) for run in runs for p in run})
    unit = "step" if blocks == [1] else "steps"
    return (
        f"{change.method}: {runs_text}circular blocks of {'/'.join(map(str, blocks))} {unit}, "
        f"{change.resamples} resamples, ratio interval on log step times, ms interval on the difference, "
        f"fixed seed{one_run}"
    )


def position_means(runs: UsedRuns) -> list[float]:
    """One value per step position of a side: per run, the mean over its processes at each position (ranks that
    step together count once, as in step_positions)."""
    out: list[float] = []
    for run in runs:
        series = [[ms for _, ms in p] for p in run]
        longest = max((len(p) for p in series), default=0)
        for i in range(longest):
            values = [p[i] for p in series if i < len(p)]
            out.append(sum(values) / len(values))
    return out


def separation(
    baseline: Sequence[float], current: Sequence[float], tolerance: float, min_delta_ms: float, confidence: float
) -> tuple[Verdict, float] | None:
    """("regression" | "improvement", chance) when the two samples are completely separated beyond the limit and a
    separation that complete has at most (1-confidence)/2 chance without a change (1 / C(n+m, n)); else None.

    Beyond the limit in both of its scales: the smallest current step over the largest baseline step x (1 +
    tolerance) and more than --min-delta-ms above it (the mirror image for an improvement, with (1 - tolerance)).
    Shifting every current step back by the limit still leaves them all above the baseline, so the exact
    Mann-Whitney test of "no more than the limit" rejects at that chance.
    """
    if len(baseline) < 2 or len(current) < 2:
        return None
    chance = 1.0 / math.comb(len(baseline) + len(current), len(baseline))
    if chance > (1 - confidence) / 2 * (1 + 1e-9):  # 1/20 at 90% is at the level, not above it
        return None
    low_b, high_b, low_c, high_c = min(baseline), max(baseline), min(current), max(current)
    if exceeds(low_c, high_b * (1 + tolerance)) and exceeds(low_c - high_b, min_delta_ms):
        return "regression", chance
    if exceeds(low_b * (1 - tolerance), high_c) and exceeds(low_b - high_c, min_delta_ms):
        return "improvement", chance
    return None


def _too_few_steps(
    sides: _Sides, positions: tuple[int, int], notes: list[str], allow_inconclusive: bool, common: dict[str, Any]
) -> Comparison:
    """Too few steps for a bootstrap to mean anything: decided only by a complete separation far beyond the limit
    (see `separation`), else inconclusive without an interval."""
    metric = common["metric"]
    base = float(statistic(pooled(_times(sides.runs[0])), metric))
    cur = float(statistic(pooled(_times(sides.runs[1])), metric))
    limit = max(common["tolerance"] * base, common["min_delta_ms"])
    counts = " and ".join(f"{n} {label}" for n, label in zip(positions, ("baseline", "current")))
    numbers = (
        f"{metric} step time ({sides.population} steps) {_fmt_ms(base)} ms -> {_fmt_ms(cur)} ms "
        f"({_signed(cur - base)} ms, {_pct(cur - base, base)})"
    )
    b_means, c_means = position_means(sides.runs[0]), position_means(sides.runs[1])
    separated = separation(b_means, c_means, common["tolerance"], common["min_delta_ms"], common["confidence"])
    verdict: Verdict
    if separated is not None:
        verdict, chance = separated
        b_ms, c_ms = (max(b_means), min(c_means)) if verdict == "regression" else (min(b_means), max(c_means))
        slower = "slower" if verdict == "regression" else "faster"
        edge = (
            ("fastest current", "slowest baseline")
            if verdict == "regression"
            else ("slowest current", "fastest baseline")
        )
        message = (
            f"{numbers}: every one of the {len(c_means)} current steps is {slower} than every one of the "
            f"{len(b_means)} baseline steps by more than tolerance {_fmt_pct(common['tolerance'])} and --min-delta-ms "
            f"{_fmt_ms(common['min_delta_ms'])} ({edge[0]} {_fmt_ms(c_ms)} ms, {edge[1]} {_fmt_ms(b_ms)} ms); too few "
            f"steps for an interval (at least {MIN_STEPS} per side), but a separation this complete happens by chance "
            f"with probability 1/{round(1 / chance)} at most"
        )
    else:
        verdict = "inconclusive"
        message = (
            f"{numbers}: too few steps to decide ({counts} step positions; at least {MIN_STEPS} per side needed, "
            "ranks that step together count once, unless every step of one side is beyond the limit from every "
            "step of the other)"
        )
    return Comparison(
        verdict=verdict,
        exit_code=_exit_code(verdict, allow_inconclusive),
        message=message,
        baseline_population=sides.pops[0],
        current_population=sides.pops[1],
        baseline_value=base,
        current_value=cur,
        limit_ms=limit,
        notes=tuple(notes),
        steps_used=sides.steps_used(),
        baseline_samples=sides.samples(0),
        current_samples=sides.samples(1),
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
