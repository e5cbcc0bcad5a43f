"""What keeps `stepcli whatif`'s memory bounded at 1,024 ranks, checked against the arithmetic it
replaces: the integrals read at the joints only, predictions without records, lanes without the
culprit's figures and, once joined, without their collectives, joints and records packed in
columns, the unchanged replay's records dropped once the critical path is walked. Pure."""

from __future__ import annotations

import numpy as np
import pytest

from stepcli.traces.analyses.arrivals import rank_arrivals
from stepcli.traces.analyses.lanes import lane_of
from stepcli.traces.read.columns import ColumnTrace
from stepcli.traces.read.events import Event
from stepcli.traces.read.typedcolumns import columns_from_events
from stepcli.whatif.answer import WhatifRequest, parse_change, solve
from stepcli.whatif.criticalpath import walk_critical_path
from stepcli.whatif.lanegraph import Item, PackedJoints, build_graph
from stepcli.whatif.lanereplay import PackedRecords, Record, _interpolated, _sampled, replay

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


def test_a_lane_has_no_culprit_figures_and_matches_as_with_them() -> None:
    traces = [_rank(0, 20), _rank(1, 60)]
    lanes = [lane_of(trace) for trace in traces]
    arrivals = lanes[1].arrivals
    assert arrivals is not None and len(arrivals.gaps) == len(arrivals.keys) == 1
    assert arrivals.gaps == arrivals.details == [{}]
    full = rank_arrivals(traces[1].columns, 1, None, traces[1].clock)
    assert full is not None and any(full.gaps[0].values())  # what the culprit reads is there
    assert (full.keys, full.arrive_us, full.depart_us) == (
        arrivals.keys,
        arrivals.arrive_us,
        arrivals.depart_us,
    )
    assert replay(build_graph(lanes, [1])).arrive == [[20.0, 60.0]]


def test_lanes_given_up_lose_their_collectives_once_joined_and_the_answer_is_the_same() -> None:
    request = WhatifRequest([("idealize", "1"), ("comm", "0.5")])
    kept = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    given = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    assert solve(given, request, None, release=True).doc == solve(kept, request, None).doc
    assert [lane.arrivals for lane in given] == [None, None]
    assert all(lane.arrivals is not None for lane in kept)  # a caller's lanes are left as they were


def test_packed_joints_read_back_the_items_they_were_built_from() -> None:
    items = [
        Item(0.1 + 0.2, launches=range(3, 7)),
        Item(1 / 3, arrive=(5, 1023)),
        Item(2.5, until=9.75, departs=((5, 1023, 9.5), (6, 0, 9.625))),
        Item(10.0, until=11.0, sync=12),
        Item(12.0, until=12.5),
    ]
    packed = PackedJoints(items)
    assert len(packed) == 5 and list(packed) == items
    assert packed[2].departs == items[2].departs and packed[0].launches == range(3, 7)
    assert packed.arrive_rows() == [-1, 5, -1, -1, -1]
    with pytest.raises(IndexError):
        packed[5]


def test_packed_records_read_back_the_same_floats_and_their_bound_waits() -> None:
    records = [
        Record(0.1, 0.1 + 0.2, 1 / 3, 2 / 3, label=4),
        Record(5.0, 5.0, 7.25, 7.25, arrive_row=4),
        Record(5.0, 9.0, 7.25, 11.0, wait_row=4, tail=0.5, waited=1 / 7),
        Record(9.0, 9.5, 11.0, 11.5, sync_node=17),
        Record(9.5, 9.75, 11.5, 11.75, waited=2.0),  # a wait that did not bind
    ]
    packed = PackedRecords()
    for record in records:
        packed.append(record)
    assert len(packed) == 5 and list(packed) == records and packed[-1] == records[-1]
    assert packed.bound_waits() == [(r.lane_from, r.waited) for r in records if r.wait_row >= 0]


def test_the_answer_keeps_its_critical_path_and_drops_the_replays_records() -> None:
    lanes = [lane_of(_rank(0, 20)), lane_of(_rank(1, 60))]
    solved = solve(lanes, WhatifRequest([("idealize", "1")]), None)
    assert solved.graph is not None and solved.base is not None
    walked = walk_critical_path(solved.graph, replay(solved.graph))
    assert solved.path == walked and len(walked) > 1
    assert [len(r) for r in solved.base.records] == [0, 0] and solved.base.device == []
    assert solved.base.blocked == replay(solved.graph).blocked  # what the opportunities rank by
