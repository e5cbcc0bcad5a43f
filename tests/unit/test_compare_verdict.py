"""Unit tests of compare's pure parts: the verdict at its boundaries, populations, loading
documents, Markdown."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import markdown_tables

from stepcli.compare.comparemain import (
    Measurement,
    OpTime,
    decide,
    measurement_from_run,
    measurement_from_summary,
    parse_tolerance,
    render_markdown,
)
from stepcli.errors import (
    EXIT_NOTHING_MEASURED,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_USAGE,
    StepcliError,
)
from stepcli.stats import Stats, describe


def stats(
    median: float,
    *,
    count: int = 10,
    mean: float | None = None,
    p90: float | None = None,
    low: float | None = None,
    high: float | None = None,
) -> Stats:
    """Stats with an explicit median and (by default) the other statistics derived from it."""
    return Stats(
        count=count,
        mean=median if mean is None else mean,
        median=median,
        p90=median * 1.5 if p90 is None else p90,
        min=median * 0.5 if low is None else low,
        max=median * 2 if high is None else high,
    )


def run(
    median: float | None,
    *,
    profiled: float | None = None,
    steps: int = 10,
    label: str = "run.json",
    ops: tuple[OpTime, ...] = (),
    **kw: Any,
) -> Measurement:
    untouched = None if median is None else stats(median, **kw)
    return Measurement(
        label=label,
        kind="run",
        steps=steps,
        ops=ops,
        populations={
            "untouched": untouched,
            "profiled": None if profiled is None else stats(profiled, count=4),
        },
    )


def trace(
    median: float | None, *, events: int = 100, label: str = "trace.json", **kw: Any
) -> Measurement:
    return Measurement(
        label=label,
        kind="trace",
        steps=0 if median is None else 3,
        events=events,
        populations={"recorded": None if median is None else stats(median, **kw)},
    )


# ---------------------------------------------------------------- tolerance boundary (min delta 0)


@pytest.mark.parametrize(
    ("current", "verdict", "code"),
    [
        (10.999999, "no_change", EXIT_OK),  # just under +10%
        (11.0, "no_change", EXIT_OK),  # exactly +10%: equal to the threshold passes
        (11.000001, "regression", EXIT_REGRESSION),  # just over
        (5.0, "improvement", EXIT_OK),  # faster is never a regression
    ],
)
def test_tolerance_boundary(current: float, verdict: str, code: int) -> None:
    result = decide(run(10.0), run(current), tolerance=0.1, min_delta_ms=0.0)
    assert (result.verdict, result.exit_code) == (verdict, code)
    assert result.limit_ms == pytest.approx(1.0)


@pytest.mark.parametrize("base", [3.0, 0.7, 123.456, 1e5])
def test_exactly_at_tolerance_passes_despite_float_rounding(base: float) -> None:
    # base * 1.1 - base is not exactly 0.1 * base in binary floating point; it must still pass.
    assert (
        decide(run(base), run(base * 1.1), tolerance=0.1, min_delta_ms=0.0).verdict == "no_change"
    )
    assert (
        decide(run(base), run(base * 1.1 * 1.0001), tolerance=0.1, min_delta_ms=0.0).verdict
        == "regression"
    )


# ---------------------------------------------------------------- min-delta floor boundary
# (tolerance 0..small)


@pytest.mark.parametrize(
    ("current", "verdict"),
    [(1.499999, "no_change"), (1.5, "no_change"), (1.500001, "regression")],
)
def test_min_delta_boundary(current: float, verdict: str) -> None:
    # GIVEN a 1 ms step, 10% tolerance (0.1 ms) and a 0.5 ms floor: the floor is the binding limit.
    result = decide(run(1.0), run(current), tolerance=0.1, min_delta_ms=0.5)
    assert result.verdict == verdict
    assert result.limit_ms == pytest.approx(0.5)


def test_both_conditions_must_hold() -> None:
    # +50% but only 0.2 ms: jitter on a tiny step does not fail.
    assert decide(run(0.4), run(0.6), tolerance=0.1, min_delta_ms=0.5).verdict == "no_change"
    # +5 ms but only +5%: within the relative tolerance.
    assert decide(run(100.0), run(105.0), tolerance=0.1, min_delta_ms=0.5).verdict == "no_change"
    # Both exceeded.
    assert decide(run(100.0), run(111.0), tolerance=0.1, min_delta_ms=0.5).verdict == "regression"


def test_zero_tolerance_and_zero_floor_fail_any_slowdown() -> None:
    assert decide(run(10.0), run(10.0), tolerance=0.0, min_delta_ms=0.0).verdict == "no_change"
    assert decide(run(10.0), run(10.001), tolerance=0.0, min_delta_ms=0.0).verdict == "regression"


def test_zero_baseline_uses_floor_and_reports_no_percentage() -> None:
    # (a median of 0 ms among steps that took time: all-zero steps are nothing measured)
    result = decide(run(0.0, high=0.2), run(0.3), tolerance=0.1, min_delta_ms=0.5)
    assert result.verdict == "no_change"
    assert "n/a" in result.message


# ---------------------------------------------------------------- metric selection


@pytest.mark.parametrize(
    ("metric", "verdict"),
    [
        ("median", "no_change"),
        ("mean", "regression"),
        ("p90", "regression"),
        ("min", "no_change"),
        ("max", "regression"),
    ],
)
def test_metric_selects_the_statistic(metric: str, verdict: str) -> None:
    # GIVEN equal medians and minimums but a slower tail on the current side.
    base = run(10.0, mean=10.0, p90=12.0, low=9.0, high=13.0)
    cur = run(10.0, mean=14.0, p90=20.0, low=9.0, high=40.0)
    result = decide(base, cur, tolerance=0.1, min_delta_ms=0.0, metric=metric)
    assert result.verdict == verdict
    assert result.message.startswith(f"{metric} step time")
    assert [r.stat for r in result.step_rows if r.decides and r.stat == metric] == [metric]


def test_unknown_metric_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        decide(run(1.0), run(1.0), tolerance=0.1, min_delta_ms=0.0, metric="p99")


# ---------------------------------------------------------------- nothing measured is never a pass


@pytest.mark.parametrize(
    ("baseline", "current", "why"),
    [
        (run(10.0), run(None, steps=0), "current run.json has 0 steps"),
        (run(None, steps=0), run(10.0), "baseline run.json has 0 steps"),
        (run(10.0), run(None, steps=5), "no step times"),
        (trace(10.0), trace(None, events=0), "0 trace events"),
        (trace(10.0), trace(None, events=50), "no ProfilerStep#N step annotations"),
        (run(10.0, profiled=12.0), trace(None, events=0), "0 trace events"),
        # Each side measured something, but not what a run-vs-trace comparison needs.
        (run(10.0), trace(10.0), "baseline run.json has no profiled steps"),
        # Steps without time (a trace whose clock did not move): no ratio, no "+0 ms within
        # tolerance"
        (
            trace(0.0, high=0.0),
            trace(0.0, high=0.0),
            "baseline trace.json has only recorded steps of 0 ms",
        ),
        (trace(10.0), trace(0.0, high=0.0), "current trace.json has only recorded steps of 0 ms"),
    ],
)
def test_nothing_measured(baseline: Measurement, current: Measurement, why: str) -> None:
    result = decide(baseline, current, tolerance=0.1, min_delta_ms=0.0)
    assert result.verdict == "nothing_measured"
    assert result.exit_code == EXIT_NOTHING_MEASURED
    assert why in result.message
    assert result.verdict_line.startswith("NOTHING MEASURED: ")


def test_nothing_measured_beats_regression_even_on_huge_values() -> None:
    empty = Measurement(
        label="e",
        kind="trace",
        steps=0,
        populations={"recorded": None},
        events=0,
        empty_reason="no trace files in this folder",
    )
    assert (
        decide(trace(1.0), empty, tolerance=0.0, min_delta_ms=0.0).exit_code
        == EXIT_NOTHING_MEASURED
    )


# ---------------------------------------------------------------- which steps decide


def test_runs_decide_on_untouched_steps_not_profiled_ones() -> None:
    # Profiled steps got 3x slower (profiler overhead), untouched ones did not: no regression.
    result = decide(
        run(10.0, profiled=10.0), run(10.0, profiled=30.0), tolerance=0.1, min_delta_ms=0.0
    )
    assert result.verdict == "no_change"
    assert (result.baseline_population, result.current_population) == ("untouched", "untouched")
    # profiled still shown
    assert {r.population for r in result.step_rows} == {"untouched", "profiled"}


def test_runs_without_untouched_steps_fall_back_to_profiled_and_say_so() -> None:
    result = decide(
        run(None, profiled=10.0),
        run(10.0, profiled=20.0, label="cur.json"),
        tolerance=0.1,
        min_delta_ms=0.0,
    )
    assert result.verdict == "regression"
    assert result.baseline_population == result.current_population == "profiled"
    assert any("no untouched steps in run.json" in note for note in result.notes)


def test_run_vs_trace_compares_profiled_with_recorded() -> None:
    result = decide(run(5.0, profiled=10.0), trace(10.5), tolerance=0.1, min_delta_ms=0.0)
    assert result.verdict == "no_change"
    assert (result.baseline_population, result.current_population) == ("profiled", "recorded")
    assert "profiled/recorded steps" in result.message
    assert any("run summary and the other side a trace" in note for note in result.notes)
    reverse = decide(trace(10.0), run(50.0, profiled=20.0), tolerance=0.1, min_delta_ms=0.0)
    assert reverse.verdict == "regression"
    assert (reverse.baseline_population, reverse.current_population) == ("recorded", "profiled")


def test_failed_program_and_few_steps_are_noted() -> None:
    failed = Measurement(
        label="f.json",
        kind="run",
        steps=2,
        exit_status=1,
        populations={"untouched": stats(10.0, count=2), "profiled": None},
    )
    result = decide(run(10.0), failed, tolerance=0.1, min_delta_ms=0.0)
    assert any("exited with status 1" in n for n in result.notes)
    assert any("only 2 step(s) on the current side" in n for n in result.notes)


# ---------------------------------------------------------------- operators


def test_operator_rows_match_by_name_and_mark_new_and_removed() -> None:
    base_ops = (
        OpTime("aten::mm", 10, 50.0, 60.0),
        OpTime("aten::add", 10, 5.0, 5.0),
        OpTime("old", 1, 1.0, 1.0),
    )
    cur_ops = (
        OpTime("aten::mm", 10, 80.0, 90.0),
        OpTime("aten::add", 10, 4.0, 4.0),
        OpTime("aten::sleep", 1, 100.0, 100.0),
    )
    result = decide(
        run(10.0, ops=base_ops), run(10.0, ops=cur_ops), tolerance=0.1, min_delta_ms=0.0, top=3
    )
    assert [(r.name, r.baseline_ms, r.current_ms, r.status) for r in result.op_rows] == [
        ("aten::sleep", None, 100.0, "new"),
        ("aten::mm", 50.0, 80.0, ""),
        ("aten::add", 5.0, 4.0, ""),
    ]
    everything = decide(
        run(1.0, ops=base_ops), run(1.0, ops=cur_ops), tolerance=0.1, min_delta_ms=0.0
    )
    assert ("old", "removed") in [(r.name, r.status) for r in everything.op_rows]


def test_missing_from_a_run_summarys_top_list_is_not_called_new() -> None:
    base = measurement_from_run(run_doc(), "base.json")  # lists aten::mm only
    cur = measurement_from_run(
        run_doc(top_operators=[{"name": "aten::bmm", "self_ms": 9.0}]), "cur.json"
    )
    rows = {r.name: r.status for r in decide(base, cur, tolerance=0.1, min_delta_ms=0.0).op_rows}
    assert rows == {"aten::bmm": "not in baseline top", "aten::mm": "not in current top"}


# ---------------------------------------------------------------- tolerance parsing


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10%", 0.1),
        ("0.1", 0.1),
        (" 5 % ", 0.05),
        ("0", 0.0),
        ("0%", 0.0),
        ("1", 1.0),
        ("150%", 1.5),
        ("2.5%", 0.025),
        (0.2, 0.2),
    ],
)
def test_parse_tolerance(text: str, value: float) -> None:
    assert parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "%",
        "ten",
        "10",
        "1.5",
        "-5%",
        "-0.1",
        "nan",
        "inf%",
        "10%%",
        "0.1ms",
        "1_0%",
        "\u0661\u0660%",
        "0.\u0661",
    ],
)
def test_parse_tolerance_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="10% or a fraction"):
        parse_tolerance(text)


# ---------------------------------------------------------------- documents -> measurements


def run_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "stepcli.run",
        "schema_version": 1,
        "command": ["python", "train.py"],
        "exit_status": 0,
        "steps": {"global": 10, "requesters": {"SGD#0": 10}},
        "step_time_ms": {
            "untouched": dict(stats(10.0, count=5)),
            "profiled": dict(stats(12.0, count=4)),
        },
        "top_operators": [
            {
                "name": "aten::mm",
                "calls": 4,
                "self_ms": 3.0,
                "total_ms": 4.0,
                "avg_ms": 1.0,
                "self_share": 0.3,
            }
        ],
        "traces": [],
    }
    doc.update(changes)
    return doc


def test_measurement_from_run() -> None:
    m = measurement_from_run(run_doc(), "r.json")
    assert (m.kind, m.steps, m.exit_status) == ("run", 10, 0)
    assert m.populations["untouched"]["median"] == 10.0  # type: ignore[index]
    assert m.ops == (OpTime("aten::mm", 4, 3.0, 4.0),)
    assert m.nothing_measured() is None


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"schema_version": 3}, "unsupported run summary schema_version 3"),
        ({"schema_version": None}, "unsupported run summary schema_version None"),
        ({"steps": {}}, "steps.global"),
        ({"step_time_ms": None}, "step_time_ms is missing"),
        (
            {"step_time_ms": {"untouched": {"count": 3, "median": "fast"}, "profiled": None}},
            "step_time_ms.untouched.mean",
        ),
        ({"step_time_ms": {"untouched": [1, 2], "profiled": None}}, "neither null nor an object"),
        ({"top_operators": [{"calls": 1}]}, "without a name"),
    ],
)
def test_malformed_run_summary_is_bad_input(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(StepcliError) as info:
        measurement_from_run(run_doc(**changes), "r.json")
    assert info.value.exit_code == EXIT_USAGE
    assert problem in info.value.message and info.value.message.startswith("r.json: ")


def test_measurement_from_summary() -> None:
    summary = {
        "step_ms": describe([1.0, 2.0, 3.0]),
        "steps": [{"rank": 0, "step": n, "dur_ms": float(n - 1)} for n in (2, 3, 4)],
        "cpu_ops": [
            {
                "name": "aten::mm",
                "calls": 3,
                "self_ms": 1.5,
                "total_ms": 2.0,
                "avg_ms": 0.5,
                "self_share": 0.4,
            }
        ],
        "device_kernels": [
            {
                "name": "gemm",
                "calls": 3,
                "self_ms": 0.5,
                "total_ms": 0.5,
                "avg_ms": 0.2,
                "self_share": 0.6,
            }
        ],
        "events": 287,
        "files": ["t.json"],
    }
    m = measurement_from_summary(summary, "t.json")
    assert (m.kind, m.steps, m.events) == ("trace", 3, 287)
    assert m.populations["recorded"]["median"] == 2.0  # type: ignore[index]
    assert [op.name for op in m.ops] == ["aten::mm", "gemm"]
    empty = measurement_from_summary(
        {"step_ms": None, "steps": [], "cpu_ops": [], "device_kernels": [], "events": 0}, "e"
    )
    assert empty.nothing_measured() == "0 trace events"


# ---------------------------------------------------------------- Markdown


def test_markdown_is_valid_tables_and_escapes_pipes() -> None:
    ops = (OpTime("weird|op_name", 1, 2.0, 2.0),)
    result = decide(
        run(10.0, profiled=12.0, ops=ops),
        run(20.0, profiled=24.0, ops=ops),
        tolerance=0.1,
        min_delta_ms=0.0,
    )
    text = render_markdown(result)
    steps, operators = markdown_tables(text)
    assert steps[0][:6] == ["steps", "stat", "baseline", "current", "delta", "delta %"]
    assert len(steps) == 1 + 12  # header + 6 stats x (untouched, profiled)
    assert ["untouched", "**median**", "10.000", "20.000", "+10.000", "+100.0%", "decides"] in steps
    assert operators[1][0] == "`weird\\|op_name`"
    assert "**REGRESSION**:" in text
