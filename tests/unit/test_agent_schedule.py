"""The schedule must agree with torch.profiler.schedule step for step."""

from __future__ import annotations

import warnings

import pytest
import torch.profiler

from stepcli.agent.schedule import NONE, RECORD, RECORD_AND_SAVE, WARMUP, Schedule

CASES = [
    dict(skip_first=0, wait=1, warmup=1, active=2, repeat=1),
    dict(skip_first=3, wait=0, warmup=0, active=1, repeat=0),
    dict(skip_first=1, wait=2, warmup=1, active=3, repeat=2),
    dict(skip_first=0, wait=0, warmup=2, active=1, repeat=3),
]


@pytest.mark.parametrize("kwargs", CASES)
def test_actions_match_torch(kwargs: dict[str, int]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = torch.profiler.schedule(**kwargs)
    ours = Schedule(**kwargs)
    assert [ours.action(step) for step in range(80)] == [
        reference(step).value for step in range(80)
    ]


@pytest.mark.parametrize("kwargs", CASES)
def test_next_profiled_step_is_the_first_non_none_step(kwargs: dict[str, int]) -> None:
    schedule = Schedule(**kwargs)
    for step in range(60):
        expected = next((s for s in range(step, 400) if schedule.action(s) != NONE), None)
        assert schedule.next_profiled_step(step) == expected


def test_cycle_starts_and_windows() -> None:
    schedule = Schedule(wait=1, warmup=1, active=2, repeat=2)
    assert [s for s in range(20) if schedule.starts_cycle(s)] == [1, 5]
    assert list(schedule.windows()) == [(1, 2, 3), (5, 6, 7)]
    assert [schedule.action(s) for s in range(5)] == [NONE, WARMUP, RECORD, RECORD_AND_SAVE, NONE]
    assert "2-3, 6-7" in schedule.describe()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(active=0), "--active must be >= 1"),
        (dict(wait=-1), "--wait must be >= 0"),
        (dict(repeat=-2), "--repeat"),
    ],
)
def test_invalid_values_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Schedule(**kwargs)


def test_one_recorded_step_is_said_in_the_singular() -> None:
    assert (
        Schedule(wait=1, warmup=1, active=1, repeat=1).describe().startswith("recording step 2 (")
    )
    assert (
        Schedule(wait=1, warmup=1, active=2, repeat=1)
        .describe()
        .startswith("recording steps 2-3 (")
    )
    assert (
        Schedule(wait=1, warmup=1, active=1, repeat=2)
        .describe()
        .startswith("recording steps 2, 5 (")
    )
    assert (
        Schedule(wait=1, warmup=1, active=1, repeat=0)
        .describe()
        .startswith("recording steps 2, 5, 8, ... until")
    )
