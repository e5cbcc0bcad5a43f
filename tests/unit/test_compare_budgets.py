"""Unit tests of the `--fail-over STAT=MS` budget parser and checker."""

from __future__ import annotations

import pytest

from stepcli.compare.budgets import check_budgets, parse_budget
from stepcli.stats import Stats, describe


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("p50=25", ("median", 25.0)),
        ("median=25", ("median", 25.0)),
        ("MEAN=1.5", ("mean", 1.5)),
        ("p90 = 30ms", ("p90", 30.0)),
        ("max=100", ("max", 100.0)),
        ("min=0.25", ("min", 0.25)),
    ],
)
def test_parse_budget(spec: str, parsed: tuple[str, float]) -> None:
    assert parse_budget(spec) == parsed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("25", "expected STAT=MS"),
        ("p50", "expected STAT=MS"),
        ("p50=", "expected STAT=MS"),
        ("=25", "expected STAT=MS"),
        ("p99=25", "unknown statistic 'p99'"),
        ("p50=fast", "not a number"),
        ("p50=0", "positive"),
        ("p50=-3", "positive"),
        ("p50=nan", "positive"),
        ("p50=inf", "positive"),
    ],
)
def test_parse_budget_rejects(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_budget(spec)


STATS: Stats = Stats(count=8, mean=12.0, median=10.0, p90=20.0, min=5.0, max=30.0)


@pytest.mark.parametrize(
    ("budget", "fails"),
    [(9.999, True), (10.0, False), (10.001, False)],  # equal to the budget is within it
)
def test_budget_boundary(budget: float, fails: bool) -> None:
    failures = check_budgets([("median", budget)], STATS)
    assert bool(failures) is fails
    if fails:
        assert failures == [
            f"median (p50) step time 10 ms exceeds the --fail-over budget of {budget:g} ms (over 8 "
            f"steps)"
        ]


def test_one_message_per_exceeded_budget() -> None:
    failures = check_budgets(
        [("median", 100.0), ("p90", 15.0), ("max", 25.0), ("mean", 12.0)], STATS
    )
    assert len(failures) == 2
    assert failures[0].startswith("p90 step time 20 ms exceeds") and failures[1].startswith(
        "max step time 30 ms"
    )


def test_float_rounding_at_the_budget_passes() -> None:
    stats = describe([0.1 + 0.2])  # 0.30000000000000004
    assert check_budgets([("max", 0.3)], stats) == []


def test_nothing_measured_fails_the_gate() -> None:
    failures = check_budgets([("median", 25.0), ("p90", 40.0)], None)
    assert len(failures) == 1
    assert "no step time was measured" in failures[0]
    assert "median (p50) <= 25 ms, p90 <= 40 ms" in failures[0]


def test_no_budgets_no_failures_even_without_stats() -> None:
    assert check_budgets([], None) == []
