"""`--capture-on-slow` inside one process: which slow step places a window, where, and how often; on
a fake clock, without torch. tests/e2e/test_slow_capture.py runs it end to end on real programs and
ranks."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.agent import output
from stepcli.agent.schedule import NONE, RECORD
from stepcli.agent.slowtrigger import COOLDOWN_STEPS, SlowTrigger
from stepcli.agent.tracker import StepTracker


class Clock:
    """Read as often as the tracker likes; moves only when the test makes a step take time."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


class FakeOnDemand:
    """The part of stepcli.agent.ondemand.OnDemand a trigger places its window through."""

    active = False
    folder_fd = -1
    run_id = "run-1"

    def __init__(self) -> None:
        self.pending: dict[str, Any] = {}
        self.triggers: dict[str, dict[str, Any]] = {}
        self.trigger_steps: dict[str, tuple[int, int]] = {}
        self.own: set[str] = set()
        self.responses: dict[str, dict[str, Any]] = {}
        self.placed: list[tuple[int, int]] = []  # (first, last) of each window accepted

    def _consider(self, rid: str, open_at: int, first: int, last: int, step: int) -> None:
        self.placed.append((first, last))
        self.pending[rid] = (first, last)
        self.responses[rid] = {"status": "accepted"}


class Recorder:
    prof = None


class Config:
    quiet = True


class Agent:
    def __init__(self, clock: Clock) -> None:
        self.tracker = StepTracker(clock=clock)
        self.tracker.register("opt", "SGD#0")
        self.recorder = Recorder()
        self.config = Config()
        self.pid = 42
        self.compiles = None


class Run:
    """A process that steps under a SlowTrigger: `step(ms)` makes one step that took `ms`
    milliseconds."""

    def __init__(self, rule: str = "3x", steps: int = 2, max_captures: int = 8) -> None:
        self.clock = Clock()
        self.agent = Agent(self.clock)
        self.ondemand = FakeOnDemand()
        kind, value = {"3x": ("x", 3.0), "z4": ("z", 4.0)}[rule]
        spec = {"kind": kind, "value": value, "text": rule, "steps": steps, "max": max_captures}
        self.trigger = SlowTrigger(self.agent, self.ondemand, spec)  # type: ignore[arg-type]

    def step(self, ms: float, phase: int = NONE) -> None:
        self.agent.tracker.set_phase(phase)
        self.clock.ns += int(ms * 1e6)
        self.agent.tracker.step("opt")

    def steps(self, count: int, ms: float = 10.0) -> None:
        for _ in range(count):
            self.step(ms)

    def window_done(self) -> None:
        self.ondemand.pending.clear()


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(output, "current_rank", lambda: None)


def test_a_slow_step_places_a_window_on_the_next_steps_with_why() -> None:
    run = Run()
    run.steps(20)  # steps 0-19, 10 ms each
    run.step(25)  # step 20: slower, but not 3x
    assert run.ondemand.placed == []
    run.step(50)  # step 21: 5x the median
    assert run.ondemand.placed == [(22, 23)]  # alone, the window starts at the very next step
    ((rid, trigger),) = run.ondemand.triggers.items()
    assert (
        rid == "slow-42-1"
        and rid in run.ondemand.own
        and run.ondemand.trigger_steps[rid] == (22, 23)
    )
    assert trigger == {
        "rank": None,
        "step": 21,
        "ms": 50.0,
        "baseline_ms": 10.0,
        "threshold_ms": 30.0,
        "rule": "3x",
    }


def test_no_trigger_before_the_baseline_holds_enough_ordinary_steps() -> None:
    run = Run()
    run.steps(5)
    run.step(500)
    assert run.ondemand.placed == []


def test_a_step_a_window_recorded_is_the_profilers_cost_not_a_slow_step() -> None:
    run = Run()
    run.steps(20)
    run.step(80, phase=RECORD)
    assert run.ondemand.placed == []
    run.step(80)
    assert run.ondemand.placed == [(22, 23)]


def test_one_window_at_a_time_a_cool_down_after_it_and_at_most_max_captures() -> None:
    run = Run(steps=20, max_captures=2)
    run.steps(20)
    run.step(50)  # step 20: window 21-40
    run.step(50)  # step 21: that window still waits
    run.window_done()
    run.steps(27)
    run.step(50)  # step 49: within the cool-down after step 40
    assert run.ondemand.placed == [(21, 40)]
    assert 40 + COOLDOWN_STEPS == 50
    run.step(50)  # step 50: past it
    run.window_done()
    run.steps(30)
    run.step(50)  # max captures reached
    assert run.ondemand.placed == [(21, 40), (51, 70)]


def test_a_periodic_slow_step_is_caught_where_it_is_predicted_next() -> None:
    run = Run(steps=3)
    run.steps(20)
    for _ in (20, 40):  # the slow steps
        run.step(50)
        run.window_done()
        run.steps(19)
    # the second slow step (40), 20 after the first: the window waits for step 60, from the step
    # before it
    assert run.ondemand.placed == [(21, 23), (59, 61)]
    trigger = run.ondemand.triggers["slow-42-2"]
    assert (trigger["step"], trigger["predicted_step"], trigger["period"]) == (40, 60, 20)


def test_an_error_of_its_own_disables_the_trigger_never_the_program(
    capfd: pytest.CaptureFixture[str],
) -> None:
    run = Run()

    def broken(*args: Any) -> None:
        raise KeyError("oops")

    run.ondemand._consider = broken  # type: ignore[method-assign]
    run.steps(20)
    run.step(50)  # no exception reaches the program's step
    run.ondemand._consider = FakeOnDemand._consider.__get__(run.ondemand)  # type: ignore[method-assign]
    run.steps(20)
    run.step(50)
    assert run.ondemand.placed == []
    assert "--capture-on-slow disabled in this process: KeyError: 'oops'" in capfd.readouterr().err
