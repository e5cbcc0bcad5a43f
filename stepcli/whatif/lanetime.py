"""A lane's time apart from its replay: how long each stretch takes under a change, the steps and
the profiler's transitions between them, the compute between a rank's collectives, and what
idealizing a rank makes of it. Pure; stepcli.whatif.lanereplay schedules with it, answer and
criticalpath measure steps with it.
"""

from __future__ import annotations

import bisect
from typing import Protocol

import numpy as np

from stepcli.traces.analyses.lanes import RankLane, covers
from stepcli.whatif.lanegraph import Graph, NodeRows, PackedJoints, WhatifChange


class ReplayedWindows(Protocol):
    """What step_ms reads of a replay (stepcli.whatif.lanereplay.LaneReplay): each lane's window
    as replayed."""

    start: list[float]
    end: list[float]


def speeds(lane: RankLane, change: WhatifChange | None) -> np.ndarray:
    """Per elementary interval of the lane: how long its time takes under the change (1:
    unchanged)."""
    factor = np.ones(max(len(lane.grid) - 1, 0))
    if change is None or not len(factor):
        return factor
    mid = (lane.grid[:-1] + lane.grid[1:]) / 2
    for scale in change.scales:
        if scale.rank is not None and scale.rank != lane.rank:
            continue
        if scale.phase is not None:
            factor[lane.phase == scale.phase] *= scale.factor
            continue
        codes = [i for i, name in enumerate(lane.names) if name in scale.names]
        if not codes:
            continue
        hit = np.isin(lane.op_name, np.array(codes, np.int32))
        factor[covers(lane.op_start[hit], lane.op_end[hit], mid)] *= scale.factor
    return factor


def next_arrivals(items: PackedJoints, joined: NodeRows | None = None) -> list[int]:
    """At every position: the row of the first arrival at or after it (-1: none), the interval a
    compute stretch there belongs to; in one pass from the end. On a GPU rank (`joined`: its NCCL
    kernels joined across ranks) an arrival is the launch of such a kernel."""
    out = items.arrive_rows()
    if joined is not None and len(joined.nodes):
        firsts = items.ints[2 :: items.WIDTH].tolist()
        lasts = items.ints[3 :: items.WIDTH].tolist()
        for pos, (first, last) in enumerate(zip(firsts, lasts)):
            if first < 0:
                continue
            k = bisect.bisect_left(joined.nodes, first)
            if k < len(joined.nodes) and joined.nodes[k] < last:
                out[pos] = joined.rows[k]
    row = -1
    for pos in range(len(out) - 1, -1, -1):
        if out[pos] >= 0:
            row = out[pos]
        out[pos] = row
    return out


def joined_nodes(graph: Graph, i: int) -> NodeRows | None:
    """Lane i's NCCL kernels joined across ranks (None: a host lane)."""
    return graph.node_row[i] if graph.node_row and graph.lanes[i].device is not None else None


def compute_between(graph: Graph, i: int, integral: np.ndarray) -> dict[int, float]:
    """Lane i's compute (µs, waits left out) per interval between its collectives: row -> the time
    leading to its arrival there, -1 -> the time after its last arrival. On the packed joints at
    once (a 1,024-rank GPU job's lanes hold ~100 joints each)."""
    lane = graph.lanes[i]
    items = graph.items[i]
    times = np.frombuffer(items.times, np.float64) if len(items) else np.zeros(0)
    ints = np.frombuffer(items.ints, np.int32) if len(items) else np.zeros(0, np.int32)
    ats, untils = times[0::2], times[1::2]
    arrive, first = ints[0 :: items.WIDTH], ints[2 :: items.WIDTH]
    # a wait or a sync call is not compute; an arrival or a launch is an instant
    waits = (arrive < 0) & (first < 0)
    after = np.where(waits, np.maximum(untils, ats), ats)
    lo = np.concatenate(([graph.start[i]], after))
    hi = np.concatenate((ats, [graph.end[i]]))
    compute = _lengths(lane, integral, lo, hi)
    for end, start in transitions(graph, i):
        compute -= _lengths(lane, integral, np.maximum(lo, end), np.minimum(hi, start))
    labels = np.where(arrive >= 0, arrive, np.array(next_arrivals(items, joined_nodes(graph, i))))
    out: dict[int, float] = {}
    for label, length in zip([*labels.tolist(), -1], compute.tolist()):
        out[label] = out.get(label, 0.0) + length
    return out


def _lengths(lane: RankLane, integral: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """_length of each [lo, hi): 0 where hi <= lo."""
    span = np.interp(hi, lane.grid, integral) - np.interp(lo, lane.grid, integral)
    return np.where(hi > lo, span, 0.0)


def transitions(graph: Graph, i: int) -> list[tuple[float, float]]:
    """Lane i's spans between two of its steps in the window (its own clock): the profiler's step
    transitions."""
    lane = graph.lanes[i]
    lo, hi = graph.start[i], graph.end[i]
    return [
        (end, start)
        for end, start in zip(lane.step_end, lane.step_start[1:])
        if start > end and end >= lo and start <= hi
    ]


def transition_length(
    lane: RankLane, spans: list[tuple[float, float]], integral: np.ndarray, lo: float, hi: float
) -> float:
    """Lane's replayed time in [lo, hi) (its own clock) inside the transition `spans`."""
    total = 0.0
    for end, start in spans:
        a, b = max(lo, end), min(hi, start)
        if b > a:
            total += _length(lane, integral, a, b)
    return total


def idealized_multipliers(
    graph: Graph, integrals: list[np.ndarray], change: WhatifChange | None
) -> list[dict[int, float]]:
    """Per lane, interval -> multiplier: an idealized rank's compute between its collectives
    (operators and the gaps between them, not its waits) becomes the other ranks' median for the
    same interval."""
    out: list[dict[int, float]] = [{} for _ in graph.lanes]
    if change is None or not change.idealize:
        return out
    between = [compute_between(graph, i, integrals[i]) for i in range(len(graph.lanes))]
    for i, lane in enumerate(graph.lanes):
        if lane.rank not in change.idealize:
            continue
        for label, mine in between[i].items():
            others = [b[label] for j, b in enumerate(between) if j != i and label in b]
            if mine > 0 and others:
                out[i][label] = float(np.median(others)) / mine
    return out


def _length(lane: RankLane, integral: np.ndarray, lo: float, hi: float) -> float:
    if hi <= lo:
        return 0.0
    return float(np.interp(hi, lane.grid, integral) - np.interp(lo, lane.grid, integral))


def step_ms(
    graph: Graph, times: ReplayedWindows | None = None, change: WhatifChange | None = None
) -> float:
    """The mean step time over the lanes (ms): each lane's window over its steps, less the time
    between its steps, measured or replayed (under `change`): the mean of the steps' own times, as
    `table` gives them. (Between two ProfilerStep spans is the profiler's step transition, outside
    every step.)"""
    count = len(graph.steps)
    spans = []
    for li, lane in enumerate(graph.lanes):
        lo, hi = graph.start[li], graph.end[li]
        span = hi - lo if times is None else times.end[li] - times.start[li]
        between = between_steps(lane, lo, hi)
        if between.any():
            lengths = np.diff(lane.grid)[between]
            if times is not None and change is not None:
                lengths = lengths * speeds(lane, change)[between]
            span -= float(lengths.sum())
        spans.append(span)
    return float(np.mean(spans)) / count / 1000.0 if spans else 0.0


def between_steps(lane: RankLane, lo: float, hi: float, at: np.ndarray | None = None) -> np.ndarray:
    """Whether each of the lane's intervals (or each time in `at`) lies between two of its steps in
    the window [lo, hi): after one step's end, before the next one's start."""
    if at is None:
        at = (lane.grid[:-1] + lane.grid[1:]) / 2
    starts, ends = np.asarray(lane.step_start), np.asarray(lane.step_end)
    inside = (starts >= lo) & (ends <= hi)
    starts, ends = starts[inside], ends[inside]
    if len(starts) < 2:
        return np.zeros(len(at), bool)
    return covers(ends[:-1], starts[1:], at)
