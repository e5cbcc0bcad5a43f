"""KinetoStepTracker semantics of the step tracker, without torch."""

from __future__ import annotations

import itertools

from stepcli.agent.schedule import NONE, RECORD, WARMUP
from stepcli.agent.tracker import FOREIGN, NEVER, StepTracker


def fake_clock(step_ns: int = 1000):
    counter = itertools.count(step_ns, step_ns)
    return lambda: next(counter)


def test_two_requesters_stepping_once_per_iteration_count_once() -> None:
    tracker = StepTracker(clock=fake_clock())
    tracker.register("gen", "Adam#0")
    tracker.register("disc", "Adam#1")
    for _ in range(10):
        tracker.step("gen")
        tracker.step("disc")
    assert tracker.global_step == 10
    assert tracker.counts() == {"Adam#0": 10, "Adam#1": 10}
    assert len(tracker.durations_ns) == 10


def test_lazy_registration_would_overcount_but_construction_time_registration_does_not() -> None:
    eager = StepTracker(clock=fake_clock())
    eager.register("a", "a")
    eager.register("b", "b")
    lazy = StepTracker(clock=fake_clock())
    for tracker in (eager, lazy):
        for _ in range(5):
            tracker.step("a", "a")
            tracker.step("b", "b")
    assert eager.global_step == 5
    assert lazy.global_step == 6  # the KinetoStepTracker pitfall DESIGN.md describes


def test_late_requester_starts_at_the_current_global_step() -> None:
    tracker = StepTracker(clock=fake_clock())
    tracker.register("opt", "SGD#0")
    for _ in range(3):
        tracker.step("opt")
    tracker.register("prof", "profiler#0")
    tracker.step("opt")
    tracker.step("prof")
    assert tracker.global_step == 4
    assert tracker.counts() == {"SGD#0": 4, "profiler#0": 1}


def test_busiest_requester_drives_the_global_step() -> None:
    tracker = StepTracker(clock=fake_clock())
    tracker.register("critic", "critic")
    tracker.register("gen", "gen")
    for _ in range(4):
        for _ in range(5):
            tracker.step("critic")
        tracker.step("gen")
    assert tracker.global_step == 20


def test_listener_is_called_only_when_asked_and_its_time_is_charged_to_no_step() -> None:
    calls: list[int] = []

    def listener(step: int) -> tuple[int, int]:
        calls.append(step)
        if step in (2, 3):
            return (WARMUP if step == 2 else RECORD), step + 1
        return NONE, (2 if step < 2 else NEVER)

    tracker = StepTracker(started_ns=0, clock=fake_clock(1000))
    tracker.set_listener(listener, wake_at=2)
    tracker.register("opt", "SGD#0")
    for _ in range(6):
        tracker.step("opt")
    assert calls == [2, 3, 4]
    assert bytes(tracker.phases) == bytes([NONE, NONE, WARMUP, RECORD, NONE, NONE])
    # the clock ticks once per read: a listener call costs a tick that no step is charged with
    assert list(tracker.durations_ns) == [1000] * 6


def test_a_window_at_step_0_keeps_step_0s_time_before_it() -> None:
    # GIVEN step 0 started when torch was imported (t=0), and a window that opens at step 0 when the
    # process arms (t=5000): opening it takes a tick that no step is charged with
    times = iter([5000, 6000, 9000, 10000])
    tracker = StepTracker(started_ns=0, clock=lambda: next(times))
    tracker.set_listener(lambda step: (RECORD, NEVER), wake_at=0)
    tracker.register("opt", "SGD#0")
    tracker.begin()  # reads 5000 and 6000 around the listener
    tracker.step("opt")  # 9000
    # THEN step 0 lasted 9000 - 1000 (the opening): its start-up time before the window stays in it
    # (it was 3000)
    assert list(tracker.durations_ns) == [8000]


def test_foreign_phase_sticks_until_the_listener_changes_it() -> None:
    tracker = StepTracker(clock=fake_clock())
    tracker.set_listener(lambda step: (FOREIGN, step + 1), wake_at=1)
    tracker.register("opt", "SGD#0")
    tracker.step("opt")
    tracker.set_phase(FOREIGN)
    tracker.step("opt")
    tracker.step("opt")
    assert list(tracker.phases) == [NONE, FOREIGN, FOREIGN]
