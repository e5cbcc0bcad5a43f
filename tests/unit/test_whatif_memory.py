"""What keeps `stepcli whatif`'s memory bounded at 1,024 ranks, checked against the arithmetic it
replaces: the integrals read at the joints only, predictions without records, lanes without the
culprit's figures and, once joined, without their collectives. Pure."""

from __future__ import annotations

import numpy as np
import pytest

from stepcli.traces.analyses.lanes import lane_of
from stepcli.traces.read.columns import ColumnTrace
from stepcli.traces.read.events import Event
from stepcli.traces.read.typedcolumns import columns_from_events
from stepcli.whatif.answer import WhatifRequest, parse_change, solve
from stepcli.whatif.lanegraph import build_graph
from stepcli.whatif.lanereplay import _interpolated, _sampled, replay
from stepcli.whatif.whatifmain import slimmed

MAIN, WORKER = 1, 2


def _rank(rank: int, forward_end: float) -> ColumnTrace:
    """One step [0, 100] of a two-rank gloo job: forward, an all-reduce (arrival at F, gloo's worker
    ends it at 90), a wait, the optimizer."""
    f = forward_end
    events = [
        ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
        ("forward_op", "cpu_op", MAIN, 0, f),
        ("c10d::allreduce_", "cpu_op", MAIN, f, f + 2),
        ("gloo:all_reduce", "cpu_op", WORKER, f + 1, 90),
        ("Optimizer.step#SGD.step", "cpu_op", MAIN, 95, 100),
    ]
    decoded = [Event(name=n, cat=c, pid=7, tid=t, ts=s, dur=e - s) for n, c, t, s, e in events]
    return ColumnTrace(
        f"rank{rank}.json", rank, columns_from_events(decoded), len(decoded), "host:boot", 2
    )


def test_the_integrals_read_at_the_joints_are_the_interpolated_ones_to_the_last_bit() -> None:
    rng = np.random.default_rng(7)
    grid = np.unique(np.concatenate(([0.0, 1.0], rng.uniform(0, 1e6, 500)))).astype(np.float64)
    grid = np.concatenate((grid[:10], grid[9:10], grid[10:]))  # an interval of length 0
    integral = np.concatenate(([0.0], np.cumsum(rng.uniform(0, 3, len(grid) - 1) * np.diff(grid))))
    times = sorted(
        {*rng.uniform(-10, 1.1e6, 300).tolist(), *grid[::7].tolist(), -1.0, float(grid[-1]) + 5}
    )
    sampled = _sampled(grid, integral, times)
    assert [float(v) for v in sampled] == [_interpolated(grid, integral, t) for t in times]
    assert [float(v) for v in _sampled(np.array([5.0]), np.zeros(1), [1.0, 5.0, 9.0])] == [
        0.0,
        0.0,
        0.0,
    ]


def test_a_prediction_replays_the_same_without_keeping_its_records() -> None:
    lanes = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    graph = build_graph(lanes, [1])
    change = parse_change("scale", "rank:1/forward_op=0.5", lanes)
    kept, lean = replay(graph, change), replay(graph, change, records=False)
    assert lean.end == kept.end == [70.0, 70.0] and lean.blocked == kept.blocked
    assert [len(r) for r in lean.records] == [0, 0] and all(len(r) for r in kept.records)


def test_a_lane_read_for_whatif_has_no_culprit_figures_and_matches_as_before() -> None:
    lanes = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    before = replay(build_graph(lanes, [1]))
    assert any(lanes[1].arrivals.gaps[0].values())  # type: ignore[union-attr]
    lean = [slimmed(lane) for lane in lanes]
    arrivals = lean[1].arrivals
    assert arrivals is not None and len(arrivals.gaps) == len(arrivals.keys) == 1
    assert arrivals.gaps == arrivals.details == [{}]
    after = replay(build_graph(lean, [1]))
    assert after.end == before.end and after.arrive == before.arrive == [[20.0, 60.0]]
    assert pytest.approx(after.transfer) == before.transfer


def test_lanes_given_up_lose_their_collectives_once_joined_and_the_answer_is_the_same() -> None:
    request = WhatifRequest([("idealize", "1"), ("comm", "0.5")])
    kept = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    given = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    assert solve(given, request, None, release=True).doc == solve(kept, request, None).doc
    assert [lane.arrivals for lane in given] == [None, None]
    assert all(lane.arrivals is not None for lane in kept)  # a caller's lanes are left as they were
