"""Which process a trace belongs to: ranks seen with several pids, and rankless processes whose
steps repeat (runs of one reused pid, one after the other) told apart by time."""

from __future__ import annotations

from stepcli.traces.analyses.ranks import process_keys


def _trace(clock: int, steps: range) -> tuple[None, str, int, list[int]]:
    return (None, f"/out/box_1.{clock}.pt.trace.json", 1, list(steps))


def test_a_later_run_keeps_its_own_later_window() -> None:
    # GIVEN run A's window 2-4, then run B's windows 2-4 and 7-9, all from "pid 1" on host box_1
    # (containers)
    items = [_trace(100, range(2, 5)), _trace(200, range(2, 5)), _trace(300, range(7, 10))]
    # WHEN they are grouped into processes
    labels = [label for _key, label in process_keys(items)]
    # THEN B's second window joins B (the run it continues), not A (the first run it would fit
    # after)
    assert labels == ["box_1 #1", "box_1 #2", "box_1 #2"]


def test_windows_without_repeats_are_one_process() -> None:
    items = [_trace(100, range(2, 5)), _trace(200, range(7, 10))]
    assert [label for _key, label in process_keys(items)] == ["box_1", "box_1"]


def test_a_run_that_restarts_is_a_new_run_and_windows_follow_their_run() -> None:
    # A: 0-1, 5-6; B: 0-1, 5-6; C: 0-1 -- in that time order
    clocks = [
        (1, range(0, 2)),
        (2, range(5, 7)),
        (3, range(0, 2)),
        (4, range(5, 7)),
        (5, range(0, 2)),
    ]
    labels = [label for _key, label in process_keys([_trace(c, r) for c, r in clocks])]
    assert labels == ["box_1 #1", "box_1 #1", "box_1 #2", "box_1 #2", "box_1 #3"]


def test_a_rank_with_two_pids_is_two_processes() -> None:
    items = [
        (0, "/out/a.json", 10, [1, 2]),
        (0, "/out/b.json", 11, [1, 2]),
        (1, "/out/c.json", 12, [1, 2]),
    ]
    assert [label for _key, label in process_keys(items)] == [
        "rank 0 (pid 10)",
        "rank 0 (pid 11)",
        "rank 1",
    ]
