"""Verdicts of `stepcli compare` made without a bootstrap interval.

Two cases (the rules are verdict.py's contract, see its docstring): too few step positions on a side
for an interval, where only a complete separation far beyond the limit decides (`separation`); and
inputs without per-step times (hand-made or schema 1 summaries), decided on the two statistics
alone. `decide` (stepcli.compare.verdict) sends each here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stepcli.compare.budgets import exceeds
from stepcli.compare.comparison import Comparison, Verdict, exit_code
from stepcli.compare.inference import MIN_STEPS, pooled, statistic
from stepcli.compare.populations import Sides, UsedRuns, times_ms
from stepcli.compare.wording import allowed as _allowed
from stepcli.compare.wording import fmt_ms as _fmt_ms
from stepcli.compare.wording import fmt_pct as _fmt_pct
from stepcli.compare.wording import pct as _pct
from stepcli.compare.wording import signed as _signed
from stepcli.errors import EXIT_OK, EXIT_REGRESSION
from stepcli.stats import Stats


def position_means(runs: UsedRuns) -> list[float]:
    """One value per step position of a side: per run, the mean over its processes at each position
    (ranks that step together count once, as in step_positions)."""
    out: list[float] = []
    for run in runs:
        series = [[ms for _, ms in p] for p in run]
        longest = max((len(p) for p in series), default=0)
        for i in range(longest):
            values = [p[i] for p in series if i < len(p)]
            out.append(sum(values) / len(values))
    return out


def separation(
    baseline: Sequence[float],
    current: Sequence[float],
    tolerance: float,
    min_delta_ms: float,
    confidence: float,
) -> tuple[Verdict, float] | None:
    """("regression" | "improvement", chance) when the two samples are completely separated beyond
    the limit and a separation that complete has at most (1-confidence)/2 chance without a change (1
    / C(n+m, n)); else None.

    Beyond the limit in both of its scales: the smallest current step over the largest baseline step
    x (1 + tolerance) and more than --min-delta-ms above it (the mirror image for an improvement,
    with (1 - tolerance)). Shifting every current step back by the limit still leaves them all above
    the baseline, so the exact Mann-Whitney test of "no more than the limit" rejects at that chance.
    """
    if len(baseline) < 2 or len(current) < 2:
        return None
    chance = 1.0 / math.comb(len(baseline) + len(current), len(baseline))
    if not _within_chance(chance, confidence):
        return None
    split = split_beyond(baseline, current, tolerance, min_delta_ms)
    return None if split is None else (split, chance)


def _within_chance(chance: float, confidence: float) -> bool:
    return chance <= (1 - confidence) / 2 * (1 + 1e-9)  # 1/20 at 90% is at the level, not above it


def split_beyond(
    baseline: Sequence[float], current: Sequence[float], tolerance: float, min_delta_ms: float
) -> Verdict | None:
    """ "regression" | "improvement" when every step of one side is beyond the limit from every step
    of the other, whatever the chance of that; else None."""
    if not baseline or not current:
        return None
    low_b, high_b, low_c, high_c = min(baseline), max(baseline), min(current), max(current)
    if exceeds(low_c, high_b * (1 + tolerance)) and exceeds(low_c - high_b, min_delta_ms):
        return "regression"
    if exceeds(low_b * (1 - tolerance), high_c) and exceeds(low_b - high_c, min_delta_ms):
        return "improvement"
    return None


def steps_to_decide(confidence: float) -> int:
    """The fewest steps per side whose complete separation can decide at `confidence` (4 at 95%:
    1/70)."""
    n = 2
    while not _within_chance(1.0 / math.comb(2 * n, n), confidence):
        n += 1
    return n


def too_few_steps(
    sides: Sides,
    positions: tuple[int, int],
    notes: list[str],
    allow_inconclusive: bool,
    common: dict[str, Any],
) -> Comparison:
    """Too few steps for a bootstrap to mean anything: decided only by a complete separation far
    beyond the limit (see `separation`), else inconclusive without an interval."""
    metric = common["metric"]
    base = float(statistic(pooled(times_ms(sides.runs[0])), metric))
    cur = float(statistic(pooled(times_ms(sides.runs[1])), metric))
    limit = max(common["tolerance"] * base, common["min_delta_ms"])
    counts = " and ".join(f"{n} {label}" for n, label in zip(positions, ("baseline", "current")))
    numbers = (
        f"{metric} step time ({sides.population} steps) {_fmt_ms(base)} ms -> {_fmt_ms(cur)} ms "
        f"({_signed(cur - base)} ms, {_pct(cur - base, base)})"
    )
    b_means, c_means = position_means(sides.runs[0]), position_means(sides.runs[1])
    separated = separation(
        b_means, c_means, common["tolerance"], common["min_delta_ms"], common["confidence"]
    )
    verdict: Verdict
    if separated is not None:
        verdict, chance = separated
        b_ms, c_ms = (
            (max(b_means), min(c_means))
            if verdict == "regression"
            else (min(b_means), max(c_means))
        )
        slower = "slower" if verdict == "regression" else "faster"
        edge = (
            ("fastest current", "slowest baseline")
            if verdict == "regression"
            else ("slowest current", "fastest baseline")
        )
        message = (
            f"{numbers}: every one of the {len(c_means)} current steps is {slower} than every one "
            f"of the {len(b_means)} baseline steps by more than tolerance "
            f"{_fmt_pct(common['tolerance'])} and --min-delta-ms {_fmt_ms(common['min_delta_ms'])} "
            f"({edge[0]} {_fmt_ms(c_ms)} ms, {edge[1]} {_fmt_ms(b_ms)} ms); too few steps for an "
            f"interval (at least {MIN_STEPS} per side), but a separation this complete happens by "
            f"chance with probability 1/{round(1 / chance)} at most"
        )
    else:
        verdict = "inconclusive"
        split = split_beyond(b_means, c_means, common["tolerance"], common["min_delta_ms"])
        needed = steps_to_decide(common["confidence"])
        if split is not None and min(len(b_means), len(c_means)) >= 1:
            chance = 1.0 / math.comb(len(b_means) + len(c_means), len(b_means))
            message = (
                f"{numbers}: every step of one side is beyond the limit ({_fmt_ms(limit)} ms) from "
                f"every step of the other, but with {counts} step positions such a split happens "
                f"by chance 1 time in {round(1 / chance)}, more than "
                f"{_fmt_pct(common['confidence'])} confidence allows; {needed} steps per side "
                f"would decide it (ranks that step together count once)"
            )
        else:
            message = (
                f"{numbers}: too few steps to decide ({counts} step positions; at least "
                f"{MIN_STEPS} per side for an interval, ranks that step together count once; from "
                f"{needed} per side a split where every step of one side is beyond the limit of "
                f"{_fmt_ms(limit)} ms from every step of the other decides, and these "
                "steps are not split so)"
            )
    return Comparison(
        verdict=verdict,
        exit_code=exit_code(verdict, allow_inconclusive),
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


def decide_on_statistics(
    b_stats: Stats, c_stats: Stats, population: str, notes: list[str], common: dict[str, Any]
) -> Comparison:
    """The verdict from two statistics when an input lacks per-step times: no interval, the limit
    alone."""
    metric, tolerance, min_delta_ms = common["metric"], common["tolerance"], common["min_delta_ms"]
    base = float(b_stats[metric])  # type: ignore[literal-required]
    cur = float(c_stats[metric])  # type: ignore[literal-required]
    delta = cur - base
    limit = max(tolerance * base, min_delta_ms)
    verdict: Verdict = (
        "regression"
        if exceeds(delta, limit)
        else "improvement"
        if exceeds(-delta, limit)
        else "no_change"
    )
    for label, stats in (("baseline", b_stats), ("current", c_stats)):
        if stats["count"] < 3:
            notes.append(
                f"only {stats['count']} step(s) on the {label} side decide; the verdict is noisy"
            )
    missing = [m.label for m in (common["baseline"], common["current"]) if not m.runs]
    notes.append(
        f"{', '.join(missing)} has no per-step times (a schema 1 run summary without timeline_ms): "
        f"decided on the two {metric}s alone, without a confidence interval"
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
