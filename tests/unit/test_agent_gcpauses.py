"""The agent's garbage-collection accounting (stepcli.agent.gcpauses), and the run summary's culprit
section and advice built on it (stepcli.run.summary.culpritsection)."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from stepcli.advice.rules import Evidence, advise
from stepcli.agent.gcpauses import GcPauses
from stepcli.run.summary.culpritsection import culprit_lines, culprit_section


def test_counts_every_collection_per_generation() -> None:
    ticks = iter(range(0, 10**9, 1_000_000))  # each clock read 1 ms after the last
    pauses = GcPauses(clock=lambda: next(ticks))
    pauses.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        pauses.uninstall()
    log = pauses.to_log()
    assert log["collections"][0] >= 1 and log["collections"][2] >= 1
    assert log["pause_ms"][2] == pytest.approx(1.0 * log["collections"][2])
    assert log["max_pause_ms"][2] == pytest.approx(1.0)
    gc.collect(2)  # uninstalled: no longer counted
    assert pauses.to_log()["collections"] == log["collections"]


def test_a_failing_mark_never_breaks_collections() -> None:
    pauses = GcPauses()
    pauses._enabled = lambda: True
    pauses._ours = lambda: True

    def broken(name: str, args: Any) -> Any:
        raise RuntimeError("no profiler")

    pauses._enter = broken
    pauses.install()
    try:
        gc.collect()
    finally:
        pauses.uninstall()
    assert sum(pauses.to_log()["collections"]) >= 1  # counted all the same, and nothing raised


def test_run_summary_section_checks_gc_rows() -> None:
    good = {
        "collections": [3, 1, 2],
        "pause_ms": [0.1, 0.2, 40.0],
        "max_pause_ms": [0.1, 0.2, 30.0],
        "collected": [1, 2, 3],
    }
    logs = [
        {"worker": "rank0", "rank": 0, "gc": good},
        # malformed: left out
        {"worker": "rank1", "rank": 1, "gc": {**good, "collections": [1, 2]}},
        {"worker": "rank2", "rank": 2},
    ]
    section = culprit_section(None, logs)
    assert section is not None and [row["rank"] for row in section["gc"]] == [0]
    assert culprit_section(None, [{"worker": "w", "rank": None}]) is None


def test_culprit_lines_and_advice_threshold() -> None:
    found = {
        "rank": 1,
        "last_share": 0.9,
        "lateness_ms_per_step": 41.0,
        "wait_caused_ms_per_step": 41.0,
        "cause": "gc",
        "cause_ms_per_step": 38.0,
        "top": [],
        "evidence": "rank 1 arrives last at 90% of the collectives, 41.0 ms/step late",
    }
    section = {
        "collectives": 10,
        "alignment": {"error_ms": 0.5},
        "thresholds": {"min_last_share": 0.6, "min_lateness_ms_per_step": 1.0},
        "culprit": found,
        "gc": [],
    }
    assert culprit_lines(section)[0].startswith("culprit: rank 1 arrives last")
    advice = advise(Evidence(culprit=section))
    assert [a.rule for a in advice] == ["culprit"] and "Schedule garbage collection" in advice[
        0
    ].suggestion
    small = {**section, "culprit": {**found, "wait_caused_ms_per_step": 0.5}}
    assert advise(Evidence(culprit=small)) == []


def test_a_ctrl_c_inside_the_callback_reaches_the_program() -> None:
    # GIVEN Ctrl-C arriving while stepcli's gc callback runs (Python drops what a gc callback
    # raises)
    calls: list[int] = []

    def interrupted() -> int:  # Ctrl-C arrives once, during the first clock read
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return 0

    pauses = GcPauses(clock=interrupted)
    pauses.install()
    # WHEN a collection runs THEN the program still gets its KeyboardInterrupt, just after
    try:
        with pytest.raises(KeyboardInterrupt):
            gc.collect(0)
            pauses.uninstall()
            # (delivered from another thread, at the next check after the callback)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pass
    finally:
        pauses.uninstall()
