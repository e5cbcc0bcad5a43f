"""Pure parts of --capture-on-slow, the whole-run step record and `stepcli top`."""

from __future__ import annotations

import json
import random
from array import array

import msgspec
import pytest

from stepcli.agent.slowrule import baseline, parse, threshold_ns
from stepcli.agent.steprecord import build
from stepcli.agent.tracker import NEVER, StepTracker
from stepcli.run.live.liveview import snapshot
from stepcli.runfolder.steprecordreader import stats
from stepcli.runfolder.summaryfile import RunSummary, StepRecord


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3x", ("x", 3.0)),
        ("2.5X", ("x", 2.5)),
        ("+50ms", ("plus", 0.05)),
        ("+1.5s", ("plus", 1.5)),
        ("z4", ("z", 4.0)),
    ],
)
def test_rules_parse(text: str, expected: tuple[str, float]) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    "text", ["", "3", "1x", "0.5x", "+0ms", "+ms", "z0", "z-1", "nanx", "z inf", "+infms"]
)
def test_bad_rules_say_the_syntax(text: str) -> None:
    with pytest.raises(ValueError, match="expected 3x"):
        parse(text)


def test_thresholds_from_the_baseline() -> None:
    median, spread = baseline([10_000_000] * 30 + [11_000_000] * 30 + [300_000_000])
    assert median == 11_000_000 or median == 10_000_000
    assert threshold_ns("x", 3, median, spread) == 3 * median
    assert threshold_ns("plus", 0.05, median, spread) == median + 50_000_000
    # the 300 ms outlier does not widen it
    assert median < threshold_ns("z", 4, median, spread) < 2 * median


def test_the_tracker_calls_the_watch_before_the_listener_and_only_when_asked() -> None:
    now = [0]
    tracker = StepTracker(started_ns=0, clock=lambda: now[0])
    calls: list[tuple[str, int]] = []

    def listener(step: int) -> tuple[int, int]:
        calls.append(("listener", step))
        return 0, NEVER

    tracker.set_listener(listener, wake_at=NEVER)

    def watch(new_step: int, duration: int) -> tuple[int, int]:
        calls.append(("watch", new_step))
        tracker.wake_at_step(new_step)  # a slow step opens a window at the very next step
        return 5, NEVER

    tracker.watch_slow(watch, first_check=3)
    for duration in (1, 1, 1, 1, 9, 1):
        now[0] += duration
        tracker.step("opt")
    # called at step 3 (asked for), then at 5 (the step 4 took 9 > 5); the listener ran right after,
    # same step
    assert calls == [("watch", 3), ("listener", 3), ("watch", 5), ("listener", 5)]


def test_the_whole_run_record_of_a_million_steps_is_small_and_keeps_the_slow_ones() -> None:
    rng = random.Random(0)
    durations = array("q", (rng.randint(9_000_000, 11_000_000) for _ in range(1_000_000)))
    durations[500_000] = 400_000_000
    record = build(durations, "rank0", 0)
    assert len(json.dumps(record)) < 64 * 1024
    assert record["steps"] == 1_000_000 and len(record["recent"]) == 1000
    assert sum(record["histogram"].values()) == 999_999
    assert [500_000, 400_000] in record["slowest"]
    assert len(record["blocks"]) <= 200
    assert max(block[1] for block in record["blocks"]) == 400_000
    ms = stats(record)
    assert 9.5 * 0.95 < ms["p50"] < 10.5 * 1.05 and ms["max"] == 400.0 and ms["p99"] <= 11.0 * 1.05


def test_top_marks_the_culprit_only_and_a_rank_that_stopped() -> None:
    now = 1000.0
    beat = {"steps_per_s": 10.0, "ended": "", "responses": {}}
    processes = [
        beat
        | {
            "rank": 1,
            "worker": "rank1",
            "step": 50,
            "time": now,
            "median_ms": 90.0,
            "last_ms": 95.0,
        },
        beat
        | {
            "rank": 0,
            "worker": "rank0",
            "step": 51,
            "time": now,
            "median_ms": 20.0,
            "last_ms": 21.0,
        },
        beat | {"rank": 2, "worker": "rank2", "step": 9, "time": now - 60, "median_ms": 20.0},
    ]
    document = snapshot(processes, "run", True, now)
    assert [r["rank"] for r in document["ranks"]] == [0, 1, 2]
    assert document["slowest"] is None  # step times name nobody: only the culprit analysis does
    assert document["culprit"] == {
        "rank": None,
        "collectives": 0,
        "why": "no saved trace with collectives on two or more ranks yet",
    }
    culprit = {
        "collectives": 12,
        "culprit": {"rank": 0, "evidence": "rank 0 arrives last at 100% of 12 collectives"},
    }
    named = snapshot(processes, "run", True, now, culprit)
    assert named["slowest"] == 0 and [r["slowest"] for r in named["ranks"]] == [True, False, False]
    assert named["culprit"]["why"].startswith("rank 0 arrives last")
    nobody = snapshot(processes, "run", True, now, {"collectives": 3, "culprit": None})
    assert nobody["slowest"] is None and nobody["culprit"]["why"].endswith(
        "consistently enough at 3 collectives"
    )
    decided = {
        "collectives": 3,
        "culprit": None,
        "no_culprit": {"reason": "chance", "words": "rank 1 arrives last"},
    }
    assert snapshot(processes, "run", True, now, decided)["culprit"]["why"] == "rank 1 arrives last"
    # a main thread that makes no step is still heard (its stacks thread writes the heartbeat):
    # stalled, not fresh-looking
    stuck = snapshot(
        [beat | {"rank": 0, "worker": "rank0", "step": 30, "time": now, "no_step_for_s": 12.0}],
        "r",
        True,
        now,
    )
    assert stuck["ranks"][0]["no_step_for_s"] == 12.0 and stuck["ranks"][0]["step"] == 30
    assert document["ranks"][2]["no_step_for_s"] == 60.0
    assert document["ranks"][0]["no_step_for_s"] is None


def test_a_whole_run_line_uses_the_units_of_its_neighbours_and_names_its_population() -> None:
    from stepcli.runfolder.steprecordreader import lines

    record = {
        "worker": "rank0",
        "steps": 40,
        "ms": {"count": 39, "p50": 16065.9, "p90": 17100.0, "p99": 17900.0, "max": 18000.0},
        "slowest": [[7, 18_000_000]],
    }
    (line,) = lines(RunSummary(step_record=[msgspec.convert(record, StepRecord)]))
    # it was "p50 ~16065.9 ms" beside "first step 4.31 s": fmt.ms's units, and the steps it counts
    # said
    assert line == (
        "whole run rank0: 40 steps; after the first (start-up), profiled ones included: p50 ~16.07 "
        "s, p90 ~17.10 s, p99 ~17.90 s, max 18.00 s; longest steps 7 (18.00 s)"
    )


def test_the_summary_gives_a_line_to_the_slowest_processes_only() -> None:
    from stepcli.runfolder.steprecordreader import lines

    records: list[dict[str, object]] = [
        {
            "worker": f"rank{i}",
            "ms": {"count": 9, "p50": 10.0, "p90": 11.0, "p99": 12.0 + i, "max": 20.0 + i},
            "slowest": [[5, 20_000]],
        }
        for i in range(10)
    ]
    text = lines(RunSummary(step_record=[msgspec.convert(r, StepRecord) for r in records]))
    assert [line.split(":")[0] for line in text[:4]] == [f"whole run rank{i}" for i in (6, 7, 8, 9)]
    assert text[4] == "whole run: 6 more processes in --json and report.html"
    assert len(text) == 5
