"""The ranks' lanes joined at their collectives and replayed by list scheduling, unchanged or under a change. Pure.

Each rank starts its window where it measured it (clocks aligned by the collectives, stepcli.traces.analyses.
alignment) and runs its lane: compute at the change's speed (stepcli.traces.analyses.lanes), an arrival at each collective,
and at each wait the later of its own start and the collective's end, plus the measured tail after that end. A
collective ends at its last member's arrival plus its transfer time (its end minus the latest member's arrival on
aligned clocks), times `--comm`. Unchanged, the replay gives back the measured window when the graph explains the
waits; how far it misses is the check every answer passes first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stepcli.traces.analyses.alignment import Matched, align, match_collectives
from stepcli.traces.analyses.lanes import RankLane, covers

LATE_CLOSE_US = 300.0
RESUMED_SHARE = 0.1


@dataclass
class Scale:
    """One `--scale`: the time of what SELECTOR covers on the steps' thread runs FACTOR times as long."""

    rank: int | None  # `rank:R/`: that rank only
    phase: int | None  # `phase:NAME`: index into PHASE_NAMES
    names: frozenset[str]  # operator names matched (empty with a phase)
    factor: float


@dataclass
class WhatifChange:
    """What is changed, as typed (`text`), and its parts; several flags together merge into one Change."""

    text: str
    scales: list[Scale] = field(default_factory=list)
    comm: float = 1.0
    idealize: list[int] = field(default_factory=list)  # ranks whose compute becomes the others' median

    def merged(self, other: WhatifChange, text: str) -> WhatifChange:
        return WhatifChange(text, self.scales + other.scales, self.comm * other.comm, self.idealize + other.idealize)


@dataclass
class Item:
    """A joint of a lane: an arrival at a collective (row, member) at `at`, or a wait [at, until) on collectives
    whose departures (row, member, departure on this rank's clock) fall inside it."""

    at: float
    arrive: tuple[int, int] | None = None
    until: float = 0.0
    departs: list[tuple[int, int, float]] = field(default_factory=list)


@dataclass
class Graph:
    """The lanes of the ranks analysed and the collectives joining them, in the window of `steps`."""

    lanes: list[RankLane]
    steps: list[int]
    start: list[float]  # per lane: its window, its own clock
    end: list[float]
    offset: list[float]  # per lane: its clock minus the reference clock (µs)
    items: list[list[Item]]
    arrive: list[list[float]]  # [row][member] aligned µs
    depart: list[list[float]]
    members: list[list[int]]  # [row] -> lane indices
    names: list[str]  # [row] collective name
    transfer: list[float]  # [row] µs: the earliest departure minus the latest arrival (>= 0)
    unexplained: int = 0  # collectives whose departure the rank never waited for visibly (no wait span)


@dataclass
class Record:
    """What one stretch of a lane did in the replay: compute (lane-bound) or a wait (bound by `row` or not)."""

    lane_from: float  # measured, the lane's own clock
    lane_to: float
    start: float  # replayed, aligned
    end: float
    wait_row: int = -1  # a wait bound by this collective's end; -1: compute, or a wait that did not bind
    tail: float = 0.0  # of a bound wait: the part after the collective's end
    arrive_row: int = -1  # an arrival point (zero length)
    label: int = -1  # of a compute stretch: the collective (row) whose arrival it leads to; -1 after the last
    waited: float = 0.0  # of a bound wait: how long the rank waited for the collective's last member to arrive


@dataclass
class LaneReplay:
    start: list[float]  # per lane, aligned
    end: list[float]
    records: list[list[Record]]
    arrive: list[list[float]]  # [row][member] replayed, aligned
    depart: list[list[float]]
    transfer: list[float]  # [row] µs, as replayed
    blocked: list[float]  # per lane: µs spent waiting for other ranks to arrive at collectives, in the window


class ReplayError(Exception):
    """The graph cannot be replayed (a wait on a collective some member never reaches); the reason in words."""


def build_graph(lanes: Sequence[RankLane], steps: list[int]) -> Graph:
    """Each lane cut to `steps` (consecutive, every lane has them), joined at the collectives all members hold."""
    lanes = list(lanes)
    start, end = [], []
    for lane in lanes:
        first, last = lane.steps.index(steps[0]), lane.steps.index(steps[-1])
        start.append(lane.step_start[first])
        end.append(lane.step_end[last])
    offsets = [0.0] * len(lanes)
    rows: list[list[int]] = []
    arrive: list[list[float]] = []
    depart: list[list[float]] = []
    names: list[str] = []
    items: list[list[Item]] = [[] for _ in lanes]
    parts = [lane.arrivals for lane in lanes if lane.arrivals is not None]
    matched = match_collectives(parts) if len(lanes) > 1 and len(parts) == len(lanes) else None
    if matched is not None:
        offsets, rows, arrive, depart, names = _joined(lanes, matched, steps)
    memberships: list[list[tuple[int, int]]] = [[] for _ in lanes]  # per lane: (row, its place among the members)
    for row, member_lanes in enumerate(rows):
        for m, li in enumerate(member_lanes):
            memberships[li].append((row, m))
    unexplained = 0
    for li, lane in enumerate(lanes):
        items[li], missed = _items(lane, memberships[li], arrive, depart, offsets[li], start[li], end[li])
        unexplained += missed
    transfer = [max(0.0, min(d) - max(a)) for a, d in zip(arrive, depart)]
    return Graph(lanes, steps, start, end, offsets, items, arrive, depart, rows, names, transfer, unexplained)


def _joined(
    lanes: list[RankLane], matched: Matched, steps: list[int]
) -> tuple[list[float], list[list[int]], list[list[float]], list[list[float]], list[str]]:
    """Clock offsets per lane and the matched collectives of the window as rows of lane indices and aligned times."""
    lane_of_rank = {lane.rank: i for i, lane in enumerate(lanes)}
    offsets_by_column, _errors = align(matched.arrive, matched.depart, matched.members, matched.clocks)
    offsets = [0.0] * len(lanes)
    for column, rank in enumerate(matched.ranks):
        if rank in lane_of_rank and column < len(offsets_by_column):
            offsets[lane_of_rank[rank]] = offsets_by_column[column]
    wanted = set(steps)
    rows, arrive, depart, names = [], [], [], []
    for key, cols, a_row, d_row in zip(matched.keys, matched.members, matched.arrive, matched.depart):
        if key[1][0] not in wanted:
            continue
        member_lanes = [lane_of_rank.get(matched.ranks[c], -1) for c in cols]
        if min(member_lanes) < 0:
            continue
        aligned = [a - offsets[li] for a, li in zip(a_row, member_lanes)]
        last = max(aligned)
        # Where each member's thread resumed: the end of its first wait after arriving that outlasts the last
        # arrival. gloo's worker closes its event milliseconds after the waiting thread resumed, so its end is
        # no departure; a host call that blocked (a synchronous collective) is such a wait, and so is a gap.
        leave = [
            _resumed(lanes[li], a, last + offsets[li], d) - offsets[li] for a, d, li in zip(a_row, d_row, member_lanes)
        ]
        rows.append(member_lanes)
        arrive.append(aligned)
        depart.append(leave)
        names.append(key[1][1])
    return offsets, rows, arrive, depart, names


def _resumed(lane: RankLane, arrive: float, last: float, recorded: float) -> float:
    """When the lane's thread resumed after the collective it joined at `arrive`: the end of its first wait (a gap,
    or a host call that blocked) after arriving that ends clearly after `last`, the last member's arrival on this
    lane's clock ("clearly": by a tenth of the span to the recorded departure, so a short enqueue call that
    returns at once is no wait). The recorded departure where the lane never waited so."""
    waits = lane.waits
    if not len(waits):
        return recorded
    k = max(0, int(np.searchsorted(waits[:, 0], arrive, side="right")) - 1)
    if waits[k, 1] <= arrive:
        k += 1
    after = last + RESUMED_SHARE * max(0.0, recorded - last)
    later = np.nonzero(waits[k:, 1] > after)[0]
    return float(waits[k + later[0], 1]) if len(later) else recorded


def _items(
    lane: RankLane,
    memberships: list[tuple[int, int]],
    arrive: list[list[float]],
    depart: list[list[float]],
    offset: float,
    lo: float,
    hi: float,
) -> tuple[list[Item], int]:
    """The lane's joints in time order, and how many of its departures fell in no wait (never waited for)."""
    waits = lane.waits
    w_start, w_end = (waits[:, 0], waits[:, 1]) if len(waits) else (np.zeros(0), np.zeros(0))
    arrivals: list[Item] = []
    by_wait: dict[int, Item] = {}
    missed = 0
    for row, m in memberships:
        at = arrive[row][m] + offset
        if not lo <= at <= hi:
            continue
        k = int(np.searchsorted(w_start, at, side="right")) - 1
        if k >= 0 and at < w_end[k]:
            at = float(w_start[k])  # an arrival inside a wait: the wait starts after it
        arrivals.append(Item(at, arrive=(row, m)))
        leave = depart[row][m] + offset
        k = int(np.searchsorted(w_start, leave, side="right")) - 1
        # gloo closes its worker's event a little after the waiting thread resumed: a departure just past a
        # wait's end is that wait's
        if k >= 0 and leave <= w_end[k] + LATE_CLOSE_US and w_start[k] >= at:
            item = by_wait.setdefault(k, Item(float(w_start[k]), until=float(w_end[k])))
            item.departs.append((row, m, leave))
        else:
            missed += 1
    joints = arrivals + list(by_wait.values())
    joints.sort(key=lambda item: (item.at, item.arrive is None))
    return joints, missed


def speeds(lane: RankLane, change: WhatifChange | None) -> np.ndarray:
    """Per elementary interval of the lane: how long its time takes under the change (1: unchanged)."""
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


def replay(graph: Graph, change: WhatifChange | None = None) -> LaneReplay:
    """List scheduling of every lane, rank by rank as far as each can go, until all reach their window's end."""
    return _Scheduler(graph, change).run()


class _Scheduler:
    """The replay's state: each lane's position, its replayed clock, and the collectives' replayed times."""

    def __init__(self, graph: Graph, change: WhatifChange | None) -> None:
        self.graph = graph
        n = len(graph.lanes)
        self.integrals = []
        for lane in graph.lanes:
            f = speeds(lane, change)
            self.integrals.append(np.concatenate(([0.0], np.cumsum(f * np.diff(lane.grid)))) if len(f) else np.zeros(1))
        self.multipliers = _idealized(graph, self.integrals, change)
        comm = change.comm if change is not None else 1.0
        self.transfer = [t * comm for t in graph.transfer]
        self.arrive: list[list[float | None]] = [[None] * len(r) for r in graph.members]
        self.depart: list[list[float]] = [[0.0] * len(r) for r in graph.members]
        self.known = [False] * len(graph.members)
        self.cur = [graph.start[i] - graph.offset[i] for i in range(n)]
        self.prev = list(graph.start)
        self.pos = [0] * n
        self.records: list[list[Record]] = [[] for _ in range(n)]
        self.blocked = [0.0] * n
        self.done = [False] * n

    def run(self) -> LaneReplay:
        graph = self.graph
        while not all(self.done):
            progressed = False
            for i in range(len(graph.lanes)):
                while not self.done[i] and self._step(i):
                    progressed = True
            if not progressed:
                stuck = [graph.lanes[i].label for i in range(len(graph.lanes)) if not self.done[i]]
                raise ReplayError(f"{', '.join(stuck)} wait(s) at a collective that another rank never reaches")
        return LaneReplay(
            [graph.start[i] - graph.offset[i] for i in range(len(graph.lanes))],
            self.cur,
            self.records,
            [[a if a is not None else 0.0 for a in r] for r in self.arrive],
            self.depart,
            self.transfer,
            self.blocked,
        )

    def _step(self, i: int) -> bool:
        """Lane i past its next joint; False when it must wait for a collective not yet resolved."""
        items = self.graph.items[i]
        if self.pos[i] == len(items):
            self._advance(i, self.graph.end[i], -1)
            self.done[i] = True
            return True
        item = items[self.pos[i]]
        if item.arrive is not None:
            self._advance(i, item.at, item.arrive[0])
            row, m = item.arrive
            self.arrive[row][m] = self.cur[i]
            self.records[i].append(Record(item.at, item.at, self.cur[i], self.cur[i], arrive_row=row))
        else:
            if not all(self._resolve(row) for row, _, _ in item.departs):
                return False
            self._advance(i, item.at, _next_arrival(items, self.pos[i]))
            self._wait(i, item)
        self.pos[i] += 1
        return True

    def _wait(self, i: int, item: Item) -> None:
        """A wait ends at the later of its start and each collective's end plus the measured tail after it."""
        ready, bound, tail, waited = self.cur[i], -1, 0.0, 0.0
        for row, m, leave in item.departs:
            t = self.depart[row][m] + (item.until - leave)
            if t > ready:
                ready, bound, tail = t, row, item.until - leave
                arrivals = [a for a in self.arrive[row] if a is not None]
                own = self.arrive[row][m]
                waited = max(0.0, max(arrivals) - (own if own is not None else max(arrivals)))
        self.blocked[i] += waited
        record = Record(item.at, item.until, self.cur[i], ready, wait_row=bound, tail=tail, waited=waited)
        self.records[i].append(record)
        self.cur[i], self.prev[i] = ready, item.until

    def _advance(self, i: int, to: float, label: int) -> None:
        """Lane i's compute from where it is to `to` (its own clock), at the change's speed."""
        lane, prev = self.graph.lanes[i], self.prev[i]
        if to <= prev:
            return
        integral = self.integrals[i]
        length = float(np.interp(to, lane.grid, integral) - np.interp(prev, lane.grid, integral))
        length *= self.multipliers[i].get(label, 1.0)
        self.records[i].append(Record(prev, to, self.cur[i], self.cur[i] + length, label=label))
        self.cur[i] += length
        self.prev[i] = to

    def _resolve(self, row: int) -> bool:
        """The collective's end on each member, once every member has arrived; False before."""
        if self.known[row]:
            return True
        arrivals = self.arrive[row]
        if any(a is None for a in arrivals):
            return False
        last = max(a for a in arrivals if a is not None)
        base_last = max(self.graph.arrive[row])
        for m in range(len(arrivals)):
            residual = max(0.0, self.graph.depart[row][m] - (base_last + self.graph.transfer[row]))
            self.depart[row][m] = last + self.transfer[row] + residual
        self.known[row] = True
        return True


def _next_arrival(items: list[Item], pos: int) -> int:
    """The row of the first arrival at or after `pos` (-1: none): the interval a compute stretch belongs to."""
    for item in items[pos:]:
        if item.arrive is not None:
            return item.arrive[0]
    return -1


def compute_between(graph: Graph, i: int, integral: np.ndarray) -> dict[int, float]:
    """Lane i's compute (µs, waits left out) per interval between its collectives: row -> the time leading to its
    arrival there, -1 -> the time after its last arrival."""
    lane = graph.lanes[i]
    out: dict[int, float] = {}
    at = graph.start[i]
    items = graph.items[i]
    for pos, item in enumerate(items):
        label = item.arrive[0] if item.arrive is not None else _next_arrival(items, pos)
        out[label] = out.get(label, 0.0) + _length(lane, integral, at, item.at)
        at = item.until if item.arrive is None else item.at
    out[-1] = out.get(-1, 0.0) + _length(lane, integral, at, graph.end[i])
    return out


def _idealized(graph: Graph, integrals: list[np.ndarray], change: WhatifChange | None) -> list[dict[int, float]]:
    """Per lane, interval -> multiplier: an idealized rank's compute between its collectives (operators and the
    gaps between them, not its waits) becomes the other ranks' median for the same interval."""
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


def step_ms(graph: Graph, times: LaneReplay | None = None) -> float:
    """The mean step time over the lanes (ms): each lane's window over its steps, measured or replayed."""
    count = len(graph.steps)
    if times is None:
        spans = [e - s for s, e in zip(graph.start, graph.end)]
    else:
        spans = [e - s for s, e in zip(times.start, times.end)]
    return float(np.mean(spans)) / count / 1000.0 if spans else 0.0
