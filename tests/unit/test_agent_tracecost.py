"""A window's cost (issue 46.7): when a trace counts as large, the cheaper ways named, and the lines
during a long save; and the progress lines of a long read (stepcli.slowwork)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stepcli.agent import tracecost
from stepcli.agent.config import AgentConfig
from stepcli.agent.schedule import Schedule


@pytest.mark.parametrize(
    ("size", "pause", "large"),
    [
        (200 * 1000 * 1000, 10.0, False),  # at both thresholds: not yet
        (200 * 1000 * 1000 + 1, 0.5, True),
        (1000, 10.1, True),
        (1000, None, False),
    ],
)
def test_large_means_over_200_mb_or_over_10_s(size: int, pause: float | None, large: bool) -> None:
    assert tracecost.is_large(size, pause) is large


def test_the_cheaper_ways_are_the_options_this_run_used() -> None:
    base = {"run_id": "r", "out_dir": "/tmp/x", "launcher_pid": 0}
    plain = AgentConfig(**base, schedule=Schedule(active=1))
    assert tracecost.cheaper_ways(plain) == []
    assert "its steps alone are this large" in tracecost.cost_line(
        "step 2", 300 * 2**20, 12.0, plain
    )
    heavy = AgentConfig(
        **base,
        schedule=Schedule(active=2, repeat=0),
        with_stack=True,
        record_shapes=True,
        memory_entries=1000,
    )
    assert tracecost.cheaper_ways(heavy) == [
        "--active 1 (now 2)",
        "no --with-stack",
        "no --record-shapes",
        "--memory off",
    ]
    line = tracecost.cost_line("steps 2-3", 785 * 2**20, 31.6, heavy)
    assert line.startswith(
        "the trace of steps 2-3 is 785.0 MiB and saving it paused the program 31.6 s; each later"
    )
    assert tracecost.first_window_cost([{"bytes": 10, "save_s": 0.1}], "step 2", heavy) == ""
    big = {"bytes": 785 * 2**20, "save_s": 31.6}
    assert tracecost.first_window_cost([big], "steps 2-3", heavy) == line
    # said once, after the first
    assert tracecost.first_window_cost([big, big], "steps 7-8", heavy) == ""


def test_a_long_save_says_so_while_it_lasts(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    ticked = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        ticked.set()

    monkeypatch.setattr(tracecost, "say", say)
    monkeypatch.setattr(tracecost, "TICK_S", 0.01)
    clock = tracecost.SaveClock()
    clock.start("steps 2-3")
    assert ticked.wait(60)  # (a line once a tick has passed)
    pause = clock.stop()
    assert (
        pause is not None
        and pause > 0
        and said[0].startswith("still saving the trace of steps 2-3 (")
    )
    assert clock.stop() is None  # stopped once
    assert tracecost.took(0.4) == "" and tracecost.took(31.64) == " in 31.6 s"


def test_a_long_read_says_so_and_a_short_one_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stepcli import slowwork

    trace = tmp_path / "t.pt.trace.json"
    trace.write_text("{}")
    said: list[str] = []
    first = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        first.set()

    monkeypatch.setattr(slowwork, "_say", say)
    with slowwork.reading([str(tmp_path)]):  # small, not a terminal: silent however long
        pass
    assert said == []
    monkeypatch.setattr(slowwork, "LARGE_INPUT_BYTES", 1)
    monkeypatch.setattr(slowwork, "SAY_AFTER_S", 0.0)
    with slowwork.reading([str(tmp_path)]):
        assert first.wait(60)  # the read "takes" until its first line was said
    assert said[0] == "reading the traces (2 B) ..." and said[-1].startswith(
        "reading the traces (2 B): done in "
    )
