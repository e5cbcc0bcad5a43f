"""The ranks' lanes joined at their collectives and replayed by list scheduling, unchanged or under
a change. Pure.

Each rank starts its window where it measured it (clocks aligned by the collectives,
stepcli.traces.analyses. alignment) and runs its lane: compute at the change's speed
(stepcli.traces.analyses.lanes), an arrival at each collective, and at each wait the later of its
own start and the collective's end, plus the measured tail after that end. A collective ends at its
last member's arrival plus its transfer time (its end minus the latest member's arrival on aligned
clocks), times `--comm`. Unchanged, the replay gives back the measured window when the graph
explains the waits; how far it misses is the check every answer passes first.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stepcli.traces.analyses.alignment import Matched, align, match_collectives
from stepcli.traces.analyses.devicework import (
    COLLECTIVE,
    EVENT,
    LAUNCH,
    STREAM,
    SYNC_DEVICE,
    SYNC_STREAM,
    node_factors,
)
from stepcli.traces.analyses.lanes import RankLane, covers

LATE_CLOSE_US = 300.0
RESUMED_SHARE = 0.1


@dataclass
class Scale:
    """One `--scale`: the time of what SELECTOR covers on the steps' thread runs FACTOR times as
    long."""

    rank: int | None  # `rank:R/`: that rank only
    phase: int | None  # `phase:NAME`: index into PHASE_NAMES
    names: frozenset[str]  # operator names matched (empty with a phase)
    factor: float


@dataclass
class WhatifChange:
    """What is changed, as typed (`text`), and its parts; several flags together merge into one
    Change."""

    text: str
    scales: list[Scale] = field(default_factory=list)
    comm: float = 1.0
    # ranks whose compute becomes the others' median
    idealize: list[int] = field(default_factory=list)

    def merged(self, other: WhatifChange, text: str) -> WhatifChange:
        return WhatifChange(
            text, self.scales + other.scales, self.comm * other.comm, self.idealize + other.idealize
        )


@dataclass
class Item:
    """A joint of a lane: an arrival at a collective (row, member) at `at`, or a wait [at, until) on
    collectives whose departures (row, member, departure on this rank's clock) fall inside it."""

    at: float
    arrive: tuple[int, int] | None = None
    until: float = 0.0
    departs: list[tuple[int, int, float]] = field(default_factory=list)
    # device nodes (stepcli.traces.analyses.devicework) queued by a call at `at`
    launches: list[int] | None = None
    sync: int = -1  # a host call [at, until) that returned only after this device node ended

    @property
    def order(self) -> int:
        """Among joints at one time: launches first (a copy's own sync waits for it), then arrivals,
        then waits."""
        if self.launches is not None:
            return 0
        if self.arrive is not None:
            return 1
        return 2 if self.sync < 0 else 3


@dataclass
class Graph:
    """The lanes of the ranks analysed and the collectives joining them, in the window of
    `steps`."""

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
    # collectives whose departure the rank never waited for visibly (no wait span)
    unexplained: int = 0
    # NCCL collectives joined on the device: [row] -> per member its NCCL node on that member's lane
    # (empty: the row is joined on the host, or not at all); their transfer and each member's
    # residual, from the kernels
    device_rows: list[list[int]] = field(default_factory=list)
    device_transfer: list[float] = field(default_factory=list)
    device_residual: list[list[float]] = field(default_factory=list)
    # per lane: node -> (row, member)
    node_row: list[dict[int, tuple[int, int]]] = field(default_factory=list)


@dataclass
class Record:
    """What one stretch of a lane did in the replay: compute (lane-bound) or a wait (bound by `row`
    or not)."""

    lane_from: float  # measured, the lane's own clock
    lane_to: float
    start: float  # replayed, aligned
    end: float
    # a wait bound by this collective's end; -1: compute, or a wait that did not bind
    wait_row: int = -1
    tail: float = 0.0  # of a bound wait: the part after the collective's end
    arrive_row: int = -1  # an arrival point (zero length)
    # of a compute stretch: the collective (row) whose arrival it leads to; -1 after the last
    label: int = -1
    # of a bound wait: how long the rank waited for the collective's last member to arrive
    waited: float = 0.0
    # a sync on the device: the node it waited for (bound when it ended after `start`)
    sync_node: int = -1


@dataclass
class ReplayDeviceTimes:
    """A lane's device nodes as replayed: start and end (aligned µs), the edge that bound each
    start, and the index of the lane's record that ends at its launch (-1: none)."""

    start: list[float]
    end: list[float]
    bound: list[int]
    launch_record: list[int]


@dataclass
class LaneReplay:
    start: list[float]  # per lane, aligned
    end: list[float]
    records: list[list[Record]]
    arrive: list[list[float]]  # [row][member] replayed, aligned
    depart: list[list[float]]
    transfer: list[float]  # [row] µs, as replayed
    # per lane: µs spent waiting for other ranks to arrive at collectives, in the window
    blocked: list[float]
    device: list[ReplayDeviceTimes | None] = field(default_factory=list)


class ReplayError(Exception):
    """The graph cannot be replayed (a wait on a collective some member never reaches); the reason
    in words."""


def build_graph(lanes: Sequence[RankLane], steps: list[int]) -> Graph:
    """Each lane cut to `steps` (consecutive, every lane has them), joined at the collectives all
    members hold."""
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
    # per lane: (row, its place among the members)
    memberships: list[list[tuple[int, int]]] = [[] for _ in lanes]
    for row, member_lanes in enumerate(rows):
        for m, li in enumerate(member_lanes):
            memberships[li].append((row, m))
    device_rows = _nccl_nodes(lanes, rows, arrive, offsets, memberships)
    unexplained = 0
    for li, lane in enumerate(lanes):
        # a GPU rank joins on its NCCL kernels
        host_joints = memberships[li] if lane.device is None else []
        items[li], missed = _items(
            lane, host_joints, arrive, depart, offsets[li], start[li], end[li]
        )
        unexplained += missed
        if lane.device is not None:
            items[li] = _device_items(lane, items[li], start[li], end[li])
    transfer = [max(0.0, min(d) - max(a)) for a, d in zip(arrive, depart)]
    graph = Graph(
        lanes, steps, start, end, offsets, items, arrive, depart, rows, names, transfer, unexplained
    )
    _join_on_device(graph, device_rows)
    return graph


def _nccl_nodes(
    lanes: list[RankLane],
    rows: list[list[int]],
    arrive: list[list[float]],
    offsets: list[float],
    memberships: list[list[tuple[int, int]]],
) -> list[list[int]]:
    """Per collective row, each member's NCCL node (the first NCCL kernel its host call launched:
    the first one queued at or after the call's start), or [] when a member has no device work or no
    such kernel."""
    node_of: dict[tuple[int, int], int] = {}
    for li, lane in enumerate(lanes):
        work = lane.device
        if work is None:
            continue
        nccl = np.nonzero(work.nccl)[0]
        used: set[int] = set()
        for row, m in sorted(memberships[li], key=lambda rm: arrive[rm[0]][rm[1]]):
            at = arrive[row][m] + offsets[li]
            k = int(np.searchsorted(work.launch[nccl], at - 1e-3, side="left"))
            while k < len(nccl) and int(nccl[k]) in used:
                k += 1
            if k < len(nccl):
                node_of[(row, m)] = int(nccl[k])
                used.add(int(nccl[k]))
    out: list[list[int]] = []
    for row, member_lanes in enumerate(rows):
        nodes = [node_of.get((row, m), -1) for m in range(len(member_lanes))]
        out.append(nodes if min(nodes, default=-1) >= 0 else [])
    return out


def _join_on_device(graph: Graph, device_rows: list[list[int]]) -> None:
    """The device-joined collectives' transfer (the earliest member's end less the latest member's
    start, on aligned clocks) and each member's residual after it."""
    graph.device_rows = device_rows
    graph.node_row = [{} for _ in graph.lanes]
    graph.device_transfer = [0.0] * len(device_rows)
    graph.device_residual = [[] for _ in device_rows]
    for row, nodes in enumerate(device_rows):
        if not nodes:
            continue
        starts, ends = [], []
        for m, node in enumerate(nodes):
            li = graph.members[row][m]
            work = graph.lanes[li].device
            assert work is not None
            starts.append(float(work.start[node]) - graph.offset[li])
            ends.append(float(work.start[node] + work.dur[node]) - graph.offset[li])
            graph.node_row[li][node] = (row, m)
        transfer = max(0.0, min(ends) - max(starts))
        graph.device_transfer[row] = transfer
        graph.device_residual[row] = [max(0.0, e - (max(starts) + transfer)) for e in ends]


def _joined(
    lanes: list[RankLane], matched: Matched, steps: list[int]
) -> tuple[list[float], list[list[int]], list[list[float]], list[list[float]], list[str]]:
    """Clock offsets per lane and the matched collectives of the window as rows of lane indices and
    aligned times."""
    lane_of_rank = {lane.rank: i for i, lane in enumerate(lanes)}
    offsets_by_column, _errors = align(
        matched.arrive, matched.depart, matched.members, matched.clocks
    )
    offsets = [0.0] * len(lanes)
    for column, rank in enumerate(matched.ranks):
        if rank in lane_of_rank and column < len(offsets_by_column):
            offsets[lane_of_rank[rank]] = offsets_by_column[column]
    wanted = set(steps)
    rows, arrive, depart, names = [], [], [], []
    for key, cols, a_row, d_row in zip(
        matched.keys, matched.members, matched.arrive, matched.depart
    ):
        if key[1][0] not in wanted:
            continue
        member_lanes = [lane_of_rank.get(matched.ranks[c], -1) for c in cols]
        if min(member_lanes) < 0:
            continue
        aligned = [a - offsets[li] for a, li in zip(a_row, member_lanes)]
        last = max(aligned)
        # Where each member's thread resumed: the end of its first wait after arriving that outlasts
        # the last arrival. gloo's worker closes its event milliseconds after the waiting thread
        # resumed, so its end is no departure; a host call that blocked (a synchronous collective)
        # is such a wait, and so is a gap.
        leave = [
            _resumed(lanes[li], a, last + offsets[li], d) - offsets[li]
            for a, d, li in zip(a_row, d_row, member_lanes)
        ]
        rows.append(member_lanes)
        arrive.append(aligned)
        depart.append(leave)
        names.append(key[1][1])
    return offsets, rows, arrive, depart, names


def _resumed(lane: RankLane, arrive: float, last: float, recorded: float) -> float:
    """When the lane's thread resumed after the collective it joined at `arrive`: the end of its
    first wait (a gap, or a host call that blocked) after arriving that ends clearly after `last`,
    the last member's arrival on this lane's clock ("clearly": by a tenth of the span to the
    recorded departure, so a short enqueue call that returns at once is no wait). The recorded
    departure where the lane never waited so."""
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
    """The lane's joints in time order, and how many of its departures fell in no wait (never waited
    for)."""
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
        # gloo closes its worker's event a little after the waiting thread resumed: a departure just
        # past a wait's end is that wait's
        if k >= 0 and leave <= w_end[k] + LATE_CLOSE_US and w_start[k] >= at:
            item = by_wait.setdefault(k, Item(float(w_start[k]), until=float(w_end[k])))
            item.departs.append((row, m, leave))
        else:
            missed += 1
    joints = arrivals + list(by_wait.values())
    joints.sort(key=lambda item: (item.at, item.order))
    return joints, missed


def _device_items(lane: RankLane, joints: list[Item], lo: float, hi: float) -> list[Item]:
    """The lane's joints with its launches (one per launch time, its nodes in order) and device
    syncs added."""
    work = lane.device
    assert work is not None
    # work queued before the window (an earlier step's) is queued at its start and runs where it ran
    count = int(np.searchsorted(work.launch, hi, side="left"))
    launch = np.maximum(work.launch[:count], lo)
    if len(launch):
        cuts = np.nonzero(np.diff(launch) > 0)[0] + 1
        firsts = np.concatenate(([0], cuts)).tolist()
        lasts = np.concatenate((cuts, [len(launch)])).tolist()
        joints = joints + [
            Item(float(launch[a]), launches=list(range(a, b))) for a, b in zip(firsts, lasts)
        ]
    for at, until, node in zip(
        work.sync_at.tolist(), work.sync_until.tolist(), work.sync_node.tolist()
    ):
        if lo <= at < hi:
            joints.append(Item(at, until=until, sync=node))
    joints.sort(key=lambda item: (item.at, item.order))
    return joints


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


def replay(graph: Graph, change: WhatifChange | None = None) -> LaneReplay:
    """List scheduling of every lane, rank by rank as far as each can go, until all reach their
    window's end."""
    return _Scheduler(graph, change).run()


class _Scheduler:
    """The replay's state: each lane's position, its replayed clock, and the collectives' replayed
    times."""

    def __init__(self, graph: Graph, change: WhatifChange | None) -> None:
        self.graph = graph
        n = len(graph.lanes)
        self.integrals = []
        for lane in graph.lanes:
            f = speeds(lane, change)
            self.integrals.append(
                np.concatenate(([0.0], np.cumsum(f * np.diff(lane.grid))))
                if len(f)
                else np.zeros(1)
            )
        self.multipliers = _idealized(graph, self.integrals, change)
        self.grid_lists: list[list[float]] = [lane.grid.tolist() for lane in graph.lanes]
        self.integral_lists: list[list[float]] = [integral.tolist() for integral in self.integrals]
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
        self.device: list[ReplayDeviceTimes | None] = []
        self.node_factor: list[list[float]] = []
        self.comm = comm
        self.d_pos = [0] * n  # per lane: the next device node to resolve
        # per lane, per node: its launch, replayed
        self.launched: list[list[float | None]] = [[] for _ in range(n)]
        self.device_arrive: list[list[float | None]] = [
            [None] * len(nodes) for nodes in graph.device_rows
        ]
        # per lane: stream -> last node queued
        self.stream_last: list[dict[int, int]] = [{} for _ in graph.lanes]
        # per lane, per joint: _next_arrival
        self.next_row = [_next_arrivals(items) for items in graph.items]
        for li, lane in enumerate(graph.lanes):
            work = lane.device
            if work is None:
                self.device.append(None)
                self.node_factor.append([])
                continue
            count = len(work)
            self.device.append(
                ReplayDeviceTimes([0.0] * count, [0.0] * count, [LAUNCH] * count, [-1] * count)
            )
            self.launched[li] = [None] * count
            scales = change.scales if change is not None else []
            mine = [s for s in scales if s.rank is None or s.rank == lane.rank]
            self.node_factor.append(
                node_factors(work, lane.names, lane.grid, lane.phase, mine).tolist()
            )
        self.node_lists = [
            (
                lane.device.prev.tolist(),
                lane.device.wait_for.tolist(),
                lane.device.delay.tolist(),
                lane.device.dur.tolist(),
                lane.device.stream.tolist(),
            )
            if lane.device is not None
            else None
            for lane in graph.lanes
        ]

    def run(self) -> LaneReplay:
        graph = self.graph
        while not all(self.done):
            progressed = False
            for i in range(len(graph.lanes)):
                while not self.done[i] and self._step(i):
                    progressed = True
            if not progressed:
                stuck = [graph.lanes[i].label for i in range(len(graph.lanes)) if not self.done[i]]
                raise ReplayError(
                    f"{', '.join(stuck)} wait(s) at a collective that another rank never reaches"
                )
        return LaneReplay(
            [graph.start[i] - graph.offset[i] for i in range(len(graph.lanes))],
            self.cur,
            self.records,
            [[a if a is not None else 0.0 for a in r] for r in self.arrive],
            self.depart,
            self.transfer,
            self.blocked,
            self.device,
        )

    def _step(self, i: int) -> bool:
        """Lane i past its next joint; False when it must wait for a collective not yet resolved."""
        items = self.graph.items[i]
        if self.pos[i] == len(items):
            self._advance(i, self.graph.end[i], -1)
            self.done[i] = True
            return True
        item = items[self.pos[i]]
        if item.launches is not None:
            self._advance(i, item.at, self.next_row[i][self.pos[i]])
            self._launch(i, item.launches)
        elif item.sync >= 0:
            self._advance(i, item.at, self.next_row[i][self.pos[i]])
            if not self._sync(i, item):
                return False
        elif item.arrive is not None:
            self._advance(i, item.at, item.arrive[0])
            row, m = item.arrive
            self.arrive[row][m] = self.cur[i]
            self.records[i].append(
                Record(item.at, item.at, self.cur[i], self.cur[i], arrive_row=row)
            )
        else:
            if not all(self._resolve(row) for row, _, _ in item.departs):
                return False
            self._advance(i, item.at, self.next_row[i][self.pos[i]])
            self._wait(i, item)
        self.pos[i] += 1
        return True

    def _launch(self, i: int, nodes: list[int]) -> None:
        """Device nodes queued now (on the host's replayed clock); each is resolved as soon as what
        it waits for is."""
        times = self.device[i]
        assert times is not None
        stream = self.node_lists[i][4]  # type: ignore[index]
        record, now, last, launched = (
            len(self.records[i]) - 1,
            self.cur[i],
            self.stream_last[i],
            self.launched[i],
        )
        for k in nodes:
            launched[k] = now
            times.launch_record[k] = record
            last[stream[k]] = k
        self._drain(i)

    def _drain(self, first: int) -> None:
        """Resolve device nodes in launch order, lane by lane, as far as each can go: a node starts
        at the latest of its launch, the node before it on its stream and the node its stream waits
        for, each plus its edge's delay; an NCCL node that joins a collective ends when its last
        member has arrived, plus the transfer."""
        work_list = [first]
        while work_list:
            i = work_list.pop()
            times, lists, work = self.device[i], self.node_lists[i], self.graph.lanes[i].device
            assert times is not None and lists is not None and work is not None
            prev, wait_for, delay, dur, _ = lists
            factor, launched, node_row = (
                self.node_factor[i],
                self.launched[i],
                self.graph.node_row[i],
            )
            window_start = self.graph.start[i]
            while self.d_pos[i] < len(launched):
                k = self.d_pos[i]
                now = launched[k]
                if now is None:
                    break
                d = delay[k]
                # queued before the window: it starts where it started
                if work.launch[k] < window_start:
                    ready, bound = float(work.start[k]) - self.graph.offset[i], LAUNCH
                else:
                    ready, bound = now + d[LAUNCH], LAUNCH
                p = prev[k]
                if p >= 0 and times.end[p] + d[STREAM] > ready:
                    ready, bound = times.end[p] + d[STREAM], STREAM
                w = wait_for[k]
                if w >= 0 and times.end[w] + d[EVENT] > ready:
                    ready, bound = times.end[w] + d[EVENT], EVENT
                times.start[k] = ready
                times.bound[k] = bound
                joined = node_row.get(k)
                if joined is None:
                    times.end[k] = ready + dur[k] * factor[k]
                    self.d_pos[i] += 1
                    continue
                row, m = joined
                self.device_arrive[row][m] = ready
                if any(a is None for a in self.device_arrive[row]):
                    break  # the others have not arrived yet: this lane's device waits here
                work_list.extend(self._finish_collective(row))
                if self.d_pos[i] == k:
                    break

    def _finish_collective(self, row: int) -> list[int]:
        """Every member's NCCL node ends at the last arrival plus the transfer (times `--comm`) plus
        its residual; the member lanes go on resolving."""
        graph = self.graph
        arrivals = [a for a in self.device_arrive[row] if a is not None]
        last = max(arrivals)
        lanes = []
        for m, node in enumerate(graph.device_rows[row]):
            li = graph.members[row][m]
            times = self.device[li]
            assert times is not None
            times.end[node] = (
                last + graph.device_transfer[row] * self.comm + graph.device_residual[row][m]
            )
            times.bound[node] = (
                COLLECTIVE if (self.device_arrive[row][m] or 0.0) < last else times.bound[node]
            )
            self.d_pos[li] += 1
            lanes.append(li)
        return lanes

    def _sync(self, i: int, item: Item) -> bool:
        """A host call that returned after a device node ended: it returns at the later of reaching
        it and the node's end, plus the measured time from the node's end to the return; False while
        that end is unknown."""
        times, work = self.device[i], self.graph.lanes[i].device
        assert times is not None and work is not None
        node = item.sync
        tail = max(0.0, item.until - float(work.start[node] + work.dur[node]))
        scope = int(work.sync_scope[int(np.searchsorted(work.sync_at, item.at))])
        last = self.stream_last[i]
        if scope == SYNC_DEVICE and last:
            if max(last.values()) >= self.d_pos[i]:
                return False
            node = max(last.values(), key=lambda k: times.end[k])
        elif scope == SYNC_STREAM and int(work.stream[node]) in last:
            node = last[int(work.stream[node])]
        if node >= self.d_pos[i]:
            return False
        ready = max(self.cur[i], times.end[node]) + tail
        self.records[i].append(Record(item.at, item.until, self.cur[i], ready, sync_node=node))
        self.cur[i], self.prev[i] = ready, item.until
        return True

    def _wait(self, i: int, item: Item) -> None:
        """A wait ends at the later of its start and each collective's end plus the measured tail
        after it."""
        ready, bound, tail, waited = self.cur[i], -1, 0.0, 0.0
        for row, m, leave in item.departs:
            t = self.depart[row][m] + (item.until - leave)
            if t > ready:
                ready, bound, tail = t, row, item.until - leave
                arrivals = [a for a in self.arrive[row] if a is not None]
                own = self.arrive[row][m]
                waited = max(0.0, max(arrivals) - (own if own is not None else max(arrivals)))
        self.blocked[i] += waited
        record = Record(
            item.at, item.until, self.cur[i], ready, wait_row=bound, tail=tail, waited=waited
        )
        self.records[i].append(record)
        self.cur[i], self.prev[i] = ready, item.until

    def _integral_at(self, i: int, t: float) -> float:
        """np.interp(t, grid, integral) of lane i, for one time (the replay asks once per joint: a
        bisection on lists is several times faster than numpy's call overhead there)."""
        grid, integral = self.grid_lists[i], self.integral_lists[i]
        k = bisect.bisect_right(grid, t) - 1
        if k < 0:
            return float(integral[0])
        if k >= len(grid) - 1:
            return float(integral[-1])
        span = grid[k + 1] - grid[k]
        return float(
            integral[k] + (t - grid[k]) * (integral[k + 1] - integral[k]) / span
            if span > 0
            else integral[k]
        )

    def _advance(self, i: int, to: float, label: int) -> None:
        """Lane i's compute from where it is to `to` (its own clock), at the change's speed."""
        prev = self.prev[i]
        if to <= prev:
            return
        length = self._integral_at(i, to) - self._integral_at(i, prev)
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


def _next_arrivals(items: list[Item]) -> list[int]:
    """_next_arrival at every position, in one pass from the end."""
    out = [-1] * len(items)
    row = -1
    for pos in range(len(items) - 1, -1, -1):
        if items[pos].arrive is not None:
            row = items[pos].arrive[0]  # type: ignore[index]
        out[pos] = row
    return out


def _next_arrival(items: list[Item], pos: int) -> int:
    """The row of the first arrival at or after `pos` (-1: none): the interval a compute stretch
    belongs to."""
    for item in items[pos:]:
        if item.arrive is not None:
            return item.arrive[0]
    return -1


def compute_between(graph: Graph, i: int, integral: np.ndarray) -> dict[int, float]:
    """Lane i's compute (µs, waits left out) per interval between its collectives: row -> the time
    leading to its arrival there, -1 -> the time after its last arrival."""
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


def _idealized(
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


def step_ms(graph: Graph, times: LaneReplay | None = None) -> float:
    """The mean step time over the lanes (ms): each lane's window over its steps, measured or
    replayed."""
    count = len(graph.steps)
    if times is None:
        spans = [e - s for s, e in zip(graph.start, graph.end)]
    else:
        spans = [e - s for s, e in zip(times.start, times.end)]
    return float(np.mean(spans)) / count / 1000.0 if spans else 0.0
