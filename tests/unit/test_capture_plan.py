"""Placing a capture window and answering the schedule's questions cost the same however long or far
the window."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from stepcli.agent.schedule import NONE, RECORD, WARMUP, Schedule, WindowSchedule
from stepcli.run.live.captureplan import plan_request


@pytest.fixture
def action_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every Schedule.action call: a per-step loop over a window shows up as millions of them."""
    calls: list[int] = []
    original = Schedule.action

    def counted(self: Schedule, step: int) -> int:
        calls.append(step)
        return original(self, step)

    monkeypatch.setattr(Schedule, "action", counted)
    return calls


def _process(step: int, rate: float = 10.0, now: float = 1000.0) -> dict[str, Any]:
    return {"step": step, "steps_per_s": rate, "time": now, "ended": ""}


def test_a_huge_window_far_ahead_is_placed_in_a_few_operations(action_calls: list[int]) -> None:
    # no room between its cycles
    schedule = Schedule(skip_first=0, wait=10, warmup=1, active=2, repeat=100_000)
    request = plan_request([_process(50)], [], schedule, 100_000, 1_000_000, 1_000_000, 1000.0)
    # after the last scheduled cycle (steps 10-12, ..., 1299997-1299999)
    assert request.open_at == 1_300_000 + 1
    assert (request.first_step, request.last_step) == (
        request.open_at + 1_000_000,
        request.open_at + 1_999_999,
    )
    others = [{"open_at": request.open_at, "last_step": request.last_step}]
    later = plan_request([_process(50)], others, schedule, 100_000, 1_000_000, 1_000_000, 1000.0)
    assert later.open_at == request.last_step + 3
    assert len(action_calls) < 50


def test_there_is_no_room_between_cycles_that_repeat_forever() -> None:
    with pytest.raises(Exception, match="no room for a window of 5 steps"):
        plan_request(
            [_process(0)], [], Schedule(wait=6, warmup=1, active=1, repeat=0), 0, 1, 4, 1000.0
        )
    fits = plan_request(
        [_process(0)], [], Schedule(wait=7, warmup=1, active=1, repeat=0), 0, 1, 4, 1000.0
    )
    # cycles touch 7-8, 16-17, 25-26: a free step either side
    assert (fits.open_at, fits.last_step) == (19, 23)


def test_the_window_schedule_answers_in_a_few_operations(action_calls: list[int]) -> None:
    # cycles touch steps up to 7999
    windows = WindowSchedule(Schedule(wait=5, warmup=1, active=2, repeat=1000))
    windows.add(10**9, 10**9 + 1000, 10**9 + 10**6)
    assert windows.first_busy(7000, 10**12) == 7005 and windows.first_busy(8000, 10**12) == 10**9
    assert windows.first_busy(10**9 + 10**6 + 1, 10**12) is None
    assert windows.recorded_span(10**9) == (10**9 + 1000, 10**9 + 10**6)
    assert windows.next_cycle_start(8000) == 10**9 and windows.next_cycle_start(10**9 + 1) is None
    assert len(action_calls) < 50


def _old_next_cycle_start(schedule: Any, step: int) -> int | None:
    """The recorder's former walk, step by step, kept here as the reference."""
    candidate = schedule.next_profiled_step(step)
    while candidate is not None and not schedule.starts_cycle(candidate):
        candidate = schedule.next_profiled_step(candidate + 1)
    return candidate


def _old_recorded_span(schedule: Any, step: int) -> tuple[int, int]:
    first = step
    while schedule.action(first) == WARMUP:
        first += 1
    last = first
    while schedule.action(last) == RECORD:
        last += 1
    return first, last


def test_the_arithmetic_agrees_with_the_step_by_step_walk() -> None:
    for skip, wait, warmup, active, repeat in itertools.product(
        (0, 2), (0, 1, 3), (0, 1, 2), (1, 3), (0, 1, 3)
    ):
        schedule = Schedule(skip_first=skip, wait=wait, warmup=warmup, active=active, repeat=repeat)
        windows = WindowSchedule(schedule)
        if wait >= 3:
            windows.add(
                2 * schedule.cycle + skip + 1,
                2 * schedule.cycle + skip + 1,
                2 * schedule.cycle + skip + 1,
            )
        for plan in (schedule, windows):
            for step in range(40):
                assert plan.next_cycle_start(step) == _old_next_cycle_start(plan, step), (
                    schedule,
                    step,
                )
                if plan.action(step) != NONE:
                    assert plan.recorded_span(step) == _old_recorded_span(plan, step), (
                        schedule,
                        step,
                    )
