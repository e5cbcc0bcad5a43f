"""The CI verdict of `stepcli compare` (pure: no I/O, no printing).

Verdict rules (the contract the tests pin down):
- The deciding number is one statistic (`--metric`, default median) of step durations in ms. Its
  change from baseline to current gets a bootstrap confidence interval (stepcli.compare.inference)
  over every step of every run.
- The allowed change is `limit = max(tolerance * baseline, min_delta_ms)`; a change equal to it (to
  float rounding) is within it. Each part is judged in its own scale: the tolerance on the interval
  of the ratio current/baseline (log step times), the floor on the interval of the difference in ms;
  "beyond the limit" means beyond both.
  * regression: the whole interval lies above +limit: the slowdown is significantly beyond both the
    tolerance and --min-delta-ms (so a change within the tolerance is called a regression at most
    (1-confidence)/2 of the time, however noisy the steps);
  * improvement: the whole interval lies below -limit;
  * no change: the interval does not reach beyond +limit;
  * inconclusive: the interval straddles +limit: the data cannot tell a regression beyond the
    tolerance from noise (the message says about how many more steps or runs would).
- Inputs without every step's time (hand-made or schema 1 summaries without a timeline) are decided
  on the two statistics alone, as before intervals existed, and the report says so.
- Steps that decide: warm-up steps are detected per run (MSER-5) and left out, unless `--skip-steps
  N` sets the first step used. Populations:
  * run summary vs run summary: the steps the profiler never touched ("untouched"), so profiler
    overhead cannot decide. When either side has no untouched steps, both sides fall back to the
    warmup+recorded steps ("profiled") and the report says so.
  * trace vs trace: the recorded `ProfilerStep#N` steps ("recorded"): that is all a trace has.
  * run summary vs trace: the run's "profiled" steps against the trace's recorded ones, so both
    sides ran under the profiler (like with like); the report names both populations.
  * run summary vs run summary with fewer than MIN_STEPS untouched step positions on a side (a short
    run) and more profiled ones on both: the profiled steps decide, and the report says so (they
    include profiler overhead, which is the same on both sides).
- Too little data for an interval: fewer than MIN_STEPS step positions on a side
  (stepcli.compare.inference) give no interval. Overwhelming evidence still decides (`separation`,
  in stepcli.compare.withoutinterval): when every current step (per position, ranks averaged) is
  slower than every baseline step by more than the limit in both scales (the smallest current step
  above the largest baseline one x (1 + tolerance), and beyond it by more than --min-delta-ms), and
  a separation that complete has a chance of at most (1-confidence)/2 when nothing changed (1 /
  C(n+m, n), the exact Mann-Whitney tail: 4 vs 4 steps is 1/70, enough at 95%; 3 vs 4 is 1/35, not),
  it is a regression; the mirror image an improvement. Anything else is inconclusive and says how
  many steps are needed.
- Inconclusive exits EXIT_INCONCLUSIVE: a gate that cannot decide does not pass, unless the caller
  allows it (`--allow-inconclusive`, exit 0 with a warning).
- A side that measured nothing (0 steps, 0 events, no step statistics, an empty trace folder) gives
  EXIT_NOTHING_MEASURED, never a pass. Bad input raises StepcliError (exit 2) before anything is
  decided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stepcli.compare.attribution import OpChange
from stepcli.compare.budgets import exceeds
from stepcli.compare.comparison import ComparedOpRow, Comparison, Verdict, exit_code
from stepcli.compare.inference import (
    DEFAULT_RESAMPLES,
    MIN_STEPS,
    Change,
    block_length,
    estimate_change,
    more_needed,
    step_positions,
)
from stepcli.compare.measurement import Measurement
from stepcli.compare.populations import (
    Sides,
    UsedRuns,
    choose_populations,
    step_rows,
    table_steps_used,
    times_ms,
)
from stepcli.compare.withoutinterval import decide_on_statistics, too_few_steps
from stepcli.compare.wording import allowed as _allowed
from stepcli.compare.wording import ci as _ci
from stepcli.compare.wording import fmt_level as _fmt_level
from stepcli.compare.wording import fmt_ms as _fmt_ms
from stepcli.compare.wording import pct as _pct
from stepcli.compare.wording import signed as _signed
from stepcli.errors import EXIT_NOTHING_MEASURED
from stepcli.stats import METRICS

TOP_OPS = 10


# --------------------------------------------------------------------------- option parsing


def parse_tolerance(text: str | float) -> float:
    """`10%` -> 0.1 and `0.1` -> 0.1 (and `150%` -> 1.5); raises ValueError otherwise.

    A bare number above 1 in text is refused rather than guessed: `10` could mean 10% or 1000%. A
    number (the Python API, or the command line's already parsed value) is a fraction: 1.5 is 150%.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"expected a fraction >= 0 (1.5 is 150%); got {text!r}")
        return value
    raw = str(text).strip()
    hint = "expected a percentage such as 10% or a fraction such as 0.1"
    percent = raw.endswith("%")
    number = raw[:-1].strip() if percent else raw
    try:
        # float() would take "1_0" and other scripts' digits
        if not number.isascii() or "_" in number:
            raise ValueError(number)
        value = float(number)
    except ValueError:
        raise ValueError(f"{hint}; got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{hint}; got {raw!r}")
    if percent:
        return round(value / 100.0, 15)  # (99.9% is 0.999, not 0.9990000000000001)
    if value > 1:
        raise ValueError(f"{hint}; got {raw!r} (did you mean {raw}%?)")
    return value


def parse_confidence(text: str | float) -> float:
    """`95%` or `0.95` -> 0.95; between 50% and 99.9%, since the interval's ends are resampled
    percentiles."""
    try:
        value = parse_tolerance(text)
    except ValueError:
        value = math.nan
    if not 0.5 <= value <= 0.999:
        raise ValueError(
            f"expected a level such as 95% or 0.95, between 50% and 99.9%; got "
            f"{str(text).strip()!r}"
        )
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
    sides = Sides(baseline, current, pairs[0], skip_steps, bool(baseline.runs and current.runs))
    for side in (baseline, current):
        if side.exit_status not in (None, 0):
            notes.append(
                f"{side.label}: the profiled program exited with status {side.exit_status}"
            )
    common: dict[str, Any] = dict(
        baseline=baseline,
        current=current,
        metric=metric,
        tolerance=tolerance,
        min_delta_ms=min_delta_ms,
        step_rows=step_rows(
            baseline, current, pairs, sides.first if sides.with_samples else None, skip_steps
        ),
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
    b_stats, c_stats = (
        baseline.populations.get(sides.pops[0]),
        current.populations.get(sides.pops[1]),
    )
    assert b_stats is not None and c_stats is not None
    if not sides.with_samples:
        return decide_on_statistics(b_stats, c_stats, sides.population, notes, common)
    positions = (step_positions(times_ms(sides.runs[0])), step_positions(times_ms(sides.runs[1])))
    if min(positions) < MIN_STEPS:
        return too_few_steps(sides, positions, notes, allow_inconclusive, common)
    change = estimate_change(
        times_ms(sides.runs[0]),
        times_ms(sides.runs[1]),
        metric,
        confidence=confidence,
        resamples=resamples,
    )
    limit = max(tolerance * change.baseline, min_delta_ms)
    verdict = _interval_verdict(change, tolerance, min_delta_ms)
    numbers = (
        f"{_fmt_ms(change.baseline)} ms -> {_fmt_ms(change.current)} ms ({_signed(change.delta)} "
        f"ms, {_pct(change.delta, change.baseline)}, {_fmt_level(confidence)} CI {_ci(change)})"
    )
    return Comparison(
        verdict=verdict,
        exit_code=exit_code(verdict, allow_inconclusive),
        message=f"{metric} step time ({sides.population} steps) {numbers} "
        f"{_clause(verdict, change, limit, common)}",
        baseline_population=sides.pops[0],
        current_population=sides.pops[1],
        baseline_value=change.baseline,
        current_value=change.current,
        limit_ms=limit,
        notes=tuple(notes),
        change=change,
        method=_method(change, sides.runs[0] + sides.runs[1]),
        steps_used=sides.steps_used() + table_steps_used(baseline, current, pairs, skip_steps),
        baseline_samples=sides.samples(0),
        current_samples=sides.samples(1),
        **common,
    )


def _interval_verdict(change: Change, tolerance: float, min_delta_ms: float) -> Verdict:
    """Where the intervals lie against the limit (see the module docstring): the tolerance is a
    share of the baseline, judged on the relative interval; the floor is in ms, judged on the ms
    interval. A change passes the limit, the larger of the two, when it passes both."""
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


def _clause(verdict: Verdict, change: Change, limit: float, common: dict[str, Any]) -> str:
    allowed = _allowed(limit, common["tolerance"], change.baseline, common["min_delta_ms"])
    return {
        "regression": f"exceeds {allowed}, all of its interval",
        "improvement": f"is faster by more than "
        f"{allowed.replace('the allowed +', 'the allowed ')}, all of its interval",
        "no_change": f"is within {allowed}",
        "inconclusive": f"may or may not exceed {allowed}: {_more_data(change, limit)}",
    }[verdict]


def _method(change: Change, runs: UsedRuns) -> str:
    """How the interval was made, in words: resampling scheme, block lengths, resamples, the log
    scale."""
    runs_text = (
        f"runs resampled ({change.baseline_runs} baseline, {change.current_runs} current), then "
        if change.baseline_runs > 1 or change.current_runs > 1
        else ""
    )
    one_run = (
        "; one run per side, so run-to-run variation is not in the interval (pass several "
        "--baseline/--current runs)"
        if change.baseline_runs == 1 and change.current_runs == 1
        else ""
    )
    blocks = sorted({block_length(len(p)) for run in runs for p in run})
    unit = "step" if blocks == [1] else "steps"
    m_of_n = ""
    if change.subsample is not None:  # long runs: m out of n (stepcli.compare.inference.subsampled)
        blocks, unit = [block_length(change.subsample)], "steps"
        m_of_n = (
            f", {change.subsample:,} steps of each run per resample, the spread scaled to all steps"
        )
    return (
        f"{change.method}: {runs_text}circular blocks of {'/'.join(map(str, blocks))} "
        f"{unit}{m_of_n}, {change.resamples} resamples, ratio interval on log step times, ms "
        f"interval on the difference, fixed seed{one_run}"
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
    return (
        f"about {max(1, math.ceil(steps * (factor - 1)))} more steps per side (or more runs) would "
        f"decide it"
    )


def _op_rows(baseline: Measurement, current: Measurement, top: int) -> tuple[ComparedOpRow, ...]:
    """Operators matched by name, the `top` with the largest self time on either side."""
    before = {op.name: op.self_ms for op in baseline.ops}
    after = {op.name: op.self_ms for op in current.ops}
    names = sorted(
        set(before) | set(after), key=lambda n: (-max(before.get(n, 0.0), after.get(n, 0.0)), n)
    )
    rows = []
    for name in names[: max(top, 0)]:
        if name not in before:
            status = "new" if baseline.ops_complete else "not in baseline top"
        elif name not in after:
            status = "removed" if current.ops_complete else "not in current top"
        else:
            status = ""
        rows.append(
            ComparedOpRow(
                name=name, baseline_ms=before.get(name), current_ms=after.get(name), status=status
            )
        )
    return tuple(rows)
