"""Step-time budgets for `stepcli run --fail-over STAT=MS`: parsing a budget and checking stats
against it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from stepcli.fmt import ms_exact as _ms  # budgets read back the way the user typed them
from stepcli.fmt import plural
from stepcli.stats import Stats

# Names a user may type -> the Stats key they mean. p50 is what most CI dashboards call the median.
BUDGET_STATS: dict[str, str] = {
    "p50": "median",
    "median": "median",
    "mean": "mean",
    "p90": "p90",
    "min": "min",
    "max": "max",
}


def parse_budget(spec: str) -> tuple[str, float]:
    """`p50=25` -> ("median", 25.0); raises ValueError with a message fit for a usage error.

    The stat is returned as its Stats key so callers can index Stats directly; a trailing
    `ms` on the number is accepted because people write it.
    """
    stat, sep, raw = spec.partition("=")
    stat = stat.strip().lower()
    raw = raw.strip().lower()
    if raw.endswith("ms"):
        raw = raw[:-2].strip()
    choices = ", ".join(BUDGET_STATS)
    if not sep or not stat or not raw:
        raise ValueError(f"expected STAT=MS such as p50=25 (STAT one of {choices}); got {spec!r}")
    if stat not in BUDGET_STATS:
        raise ValueError(f"unknown statistic {stat!r} in {spec!r}; expected one of {choices}")
    try:
        budget = float(raw)
    except ValueError:
        raise ValueError(f"budget in {spec!r} is not a number of milliseconds") from None
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget in {spec!r} must be a positive number of milliseconds")
    return BUDGET_STATS[stat], budget


def stat_label(stat: str) -> str:
    """How a budget's statistic is named in messages (median also by the p50 most users type)."""
    return "median (p50)" if stat == "median" else stat


def exceeds(value: float, limit: float) -> bool:
    """True when `value` is over `limit`; equal (to float rounding) is within budget.

    Shared with `stepcli compare` so both gates agree on what "at the limit" means.
    """
    return value > limit and not math.isclose(value, limit, rel_tol=1e-9, abs_tol=1e-9)


def check_budgets(
    budgets: Sequence[tuple[str, float]], stats: Stats | None, *, what: str = "step time"
) -> list[str]:
    """One message per exceeded budget; empty when all hold.

    Stats of None means no step was measured: that fails every gate (one message naming
    the budgets), because a gate that passes on a missing measurement protects nothing.
    """
    if not budgets:
        return []
    if stats is None or stats["count"] == 0:
        wanted = ", ".join(f"{stat_label(stat)} <= {_ms(limit)} ms" for stat, limit in budgets)
        return [f"no {what} was measured, so the --fail-over budget ({wanted}) cannot pass"]
    failures = []
    for stat, limit in budgets:
        value = float(stats[stat])  # type: ignore[literal-required]
        if exceeds(value, limit):
            failures.append(
                f"{stat_label(stat)} {what} {_ms(value)} ms exceeds the --fail-over budget of "
                f"{_ms(limit)} ms (over {plural(stats['count'], 'step')})"
            )
    return failures


def budgets_held(
    budgets: Sequence[tuple[str, float]], stats: Stats | None, *, what: str = "step time"
) -> str | None:
    """The one line saying every budget held, with the figures (`stepcli run --fail-over` passing
    says so, as failing does); None when one did not (check_budgets says which)."""
    if (
        not budgets
        or stats is None
        or stats["count"] == 0
        or check_budgets(budgets, stats, what=what)
    ):
        return None
    held = ", ".join(
        f"{stat_label(stat)} {what} {_ms(float(stats[stat]))} ms <= {_ms(limit)} ms"  # type: ignore[literal-required]
        for stat, limit in budgets
    )
    return f"passed: {held} (over {plural(stats['count'], 'step')})"
