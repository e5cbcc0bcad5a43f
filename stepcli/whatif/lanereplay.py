"""The ranks' lanes replayed by list scheduling, unchanged or under a change. Pure.

Each rank starts its window where it measured it and runs its lane (stepcli.whatif.lanegraph):
compute at the change's speed (stepcli.traces.analyses.lanes), an arrival at each collective, and at
each wait the later of its own start and the collective's end, plus the measured tail after that
end. A collective ends at its last member's arrival plus its transfer time, times `--comm`.
Unchanged, the replay gives back the measured window when the graph explains the waits; how far it
misses is the check every answer passes first.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepcli.traces.analyses.devicework import (
    COLLECTIVE,
    EVENT,
    LAUNCH,
    STREAM,
    SYNC_DEVICE,
    SYNC_STREAM,
    node_factors,
)
from stepcli.whatif.lanegraph import Graph, Item, WhatifChange
from stepcli.whatif.lanetime import (
    idealized_multipliers,
    joined_nodes,
    next_arrivals,
    speeds,
    transition_length,
    transitions,
)


@dataclass(slots=True)
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
    # of a bound wait, or a sync on an NCCL kernel: how long the rank waited for the collective's
    # last member to arrive
    waited: float = 0.0
    # a sync on the device: the node it waited for (bound when it ended after `start`)
    sync_node: int = -1


# Record's fields in order: the floats, then the ints
_FLOATS = ("lane_from", "lane_to", "start", "end", "tail", "waited")
_INTS = ("wait_row", "arrive_row", "label", "sync_node")


class PackedRecords:
    """A lane's records as packed columns (a record as objects is ~200 bytes, packed 64: at 1,024
    ranks the unchanged replay's records were the peak of `whatif`'s memory); read back one Record
    at a time, the same floats."""

    __slots__ = ("floats", "ints")

    def __init__(self) -> None:
        self.floats = array("d")
        self.ints = array("i")  # (rows and nodes fit 32 bits; a larger one raises, never wraps)

    def append(self, record: Record) -> None:
        self.floats.extend([getattr(record, name) for name in _FLOATS])
        self.ints.extend([getattr(record, name) for name in _INTS])

    def __len__(self) -> int:
        return len(self.ints) // len(_INTS)

    def __getitem__(self, k: int) -> Record:
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        f, n = len(_FLOATS) * k, len(_INTS) * k
        lane_from, lane_to, start, end, tail, waited = self.floats[f : f + len(_FLOATS)]
        wait_row, arrive_row, label, sync_node = self.ints[n : n + len(_INTS)]
        return Record(
            lane_from, lane_to, start, end, wait_row, tail, arrive_row, label, waited, sync_node
        )

    def __iter__(self) -> Iterator[Record]:
        return (self[k] for k in range(len(self)))

    def bound_waits(self) -> list[tuple[float, float]]:
        """(lane_from, waited) of each wait bound by a collective, and of each sync that waited for
        an NCCL collective's last member, straight from the columns (the slack reads them once per
        top operator and lane)."""
        width = len(_FLOATS)
        lane_from, waited = self.floats[0::width], self.floats[_FLOATS.index("waited") :: width]
        rows = self.ints[_INTS.index("wait_row") :: len(_INTS)]
        syncs = self.ints[_INTS.index("sync_node") :: len(_INTS)]
        return [
            (f, w)
            for f, w, row, s in zip(lane_from, waited, rows, syncs)
            if row >= 0 or (s >= 0 and w > 0)
        ]


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
    records: list[PackedRecords]
    arrive: list[list[float]]  # [row][member] replayed, aligned
    depart: list[list[float]]
    transfer: list[float]  # [row] µs, as replayed
    # per lane: µs spent waiting for other ranks to arrive at collectives, in the window
    blocked: list[float]
    device: list[ReplayDeviceTimes | None] = field(default_factory=list)


class ReplayError(Exception):
    """The graph cannot be replayed (a wait on a collective some member never reaches); the reason
    in words."""


def replay(graph: Graph, change: WhatifChange | None = None, records: bool = True) -> LaneReplay:
    """List scheduling of every lane, rank by rank as far as each can go, until all reach their
    window's end. `records=False`: the stretches are not kept (LaneReplay.records stays empty): a
    prediction needs only the lanes' ends, and at 1,024 ranks the records are most of a replay's
    memory."""
    return _Scheduler(graph, change, records).run()


class _Scheduler:
    """The replay's state: each lane's position, its replayed clock, and the collectives' replayed
    times."""

    def __init__(self, graph: Graph, change: WhatifChange | None, records: bool = True) -> None:
        self.graph = graph
        lanes = graph.lanes
        n = len(lanes)
        self.integrals = []
        for lane in graph.lanes:
            f = speeds(lane, change)
            self.integrals.append(
                np.concatenate(([0.0], np.cumsum(f * np.diff(lane.grid))))
                if len(f)
                else np.zeros(1)
            )
        self.multipliers = idealized_multipliers(graph, self.integrals, change)
        # an idealized lane's step transitions, kept as they were (worked out once a lane)
        self.transitions = [
            transitions(graph, i) if m else [] for i, m in enumerate(self.multipliers)
        ]
        # the integrals at the joints, where the replay reads them (the whole grid as lists was most
        # of a replay's memory at 1,024 ranks); the same arithmetic as _interpolated, so the same
        # floats
        self.at_joints = [
            _sampled(lane.grid, integral, times)
            for lane, integral, times in zip(graph.lanes, self.integrals, graph.joint_times)
        ]
        comm = change.comm if change is not None else 1.0
        self.transfer = [t * comm for t in graph.transfer]
        self.arrive: list[list[float | None]] = [[None] * len(r) for r in graph.members]
        self.depart: list[list[float]] = [[0.0] * len(r) for r in graph.members]
        self.known = [False] * len(graph.members)
        self.cur = [graph.start[i] - graph.offset[i] for i in range(n)]
        self.prev = list(graph.start)
        self.pos = [0] * n
        self.records = [PackedRecords() for _ in range(n)]
        self.keep_records = records
        # per lane: the records made so far, kept or not (a launch names its record)
        self.recorded = [0] * n
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
        # per row: members not arrived yet, and the last arrival once all have
        self.device_missing = [len(nodes) for nodes in graph.device_rows]
        self.device_last: list[float | None] = [None] * len(graph.device_rows)
        # per lane: its sync calls' times and scopes, and per device node its stream, packed (read
        # an item at a time: a numpy scalar costs ~10 times as much; a list ~4 times the memory)
        self.sync_at = [
            _packed("d", lane.device.sync_at if lane.device else None) for lane in lanes
        ]
        self.sync_scope = [
            _packed("b", lane.device.sync_scope if lane.device else None) for lane in lanes
        ]
        self.node_stream = [
            _packed("i", lane.device.stream if lane.device else None) for lane in lanes
        ]
        # per lane: stream -> last node queued
        self.stream_last: list[dict[int, int]] = [{} for _ in graph.lanes]
        # per lane, per joint: the next arrival's row
        self.next_row = [
            next_arrivals(items, joined_nodes(graph, li)) for li, items in enumerate(graph.items)
        ]
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
                # read a node's row at a time (as lists of lists: ~10 KB a lane, each replay)
                lane.device.delay,
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
            self._record(i, Record(item.at, item.at, self.cur[i], self.cur[i], arrive_row=row))
        else:
            if not all(self._resolve(row) for row, _, _ in item.departs):
                return False
            self._advance(i, item.at, self.next_row[i][self.pos[i]])
            self._wait(i, item)
        self.pos[i] += 1
        return True

    def _launch(self, i: int, nodes: range) -> None:
        """Device nodes queued now (on the host's replayed clock); each is resolved as soon as what
        it waits for is."""
        times = self.device[i]
        assert times is not None
        stream = self.node_lists[i][4]  # type: ignore[index]
        record, now, last, launched = (
            self.recorded[i] - 1,
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
                d = delay[k].tolist()
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
                if self.device_arrive[row][m] is None:
                    self.device_missing[row] -= 1
                self.device_arrive[row][m] = ready
                if self.device_missing[row] > 0:
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
        self.device_last[row] = last
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
        times = self.device[i]
        assert times is not None
        node = item.sync
        scope = self.sync_scope[i][bisect.bisect_left(self.sync_at[i], item.at)]
        last = self.stream_last[i]
        stream = self.node_stream[i][node]
        if scope == SYNC_DEVICE and last:
            if max(last.values()) >= self.d_pos[i]:
                return False
            node = max(last.values(), key=lambda k: times.end[k])
        elif scope == SYNC_STREAM and stream in last:
            node = last[stream]
        if node >= self.d_pos[i]:
            return False
        work = self.graph.lanes[i].device
        assert work is not None
        tail = max(0.0, item.until - float(work.start[item.sync] + work.dur[item.sync]))
        ready = max(self.cur[i], times.end[node]) + tail
        waited = self._waited_for_others(i, node, ready - tail)
        self.blocked[i] += waited
        self._record(
            i, Record(item.at, item.until, self.cur[i], ready, sync_node=node, waited=waited)
        )
        self.cur[i], self.prev[i] = ready, item.until
        return True

    def _waited_for_others(self, i: int, node: int, resumed: float) -> float:
        """Of a sync on an NCCL kernel joined across ranks: how long lane i's host waited there
        for the collective's last member to arrive on its device (what `blocked` and the slack
        count); 0 for any other node."""
        joined = self.graph.node_row[i].get(node) if self.graph.node_row else None
        if joined is None:
            return 0.0
        row, m = joined
        mine, last = self.device_arrive[row][m], self.device_last[row]
        if mine is None or last is None:
            return 0.0
        return max(0.0, min(last - mine, resumed - self.cur[i]))

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
        self._record(i, record)
        self.cur[i], self.prev[i] = ready, item.until

    def _record(self, i: int, record: Record) -> None:
        self.recorded[i] += 1
        if self.keep_records:
            self.records[i].append(record)

    def _integral_at(self, i: int, t: float) -> float:
        """np.interp(t, grid, integral) of lane i, for one time: looked up among the joints' (the
        replay asks once per joint: a bisection on a list is several times faster than numpy's call
        overhead there)."""
        times = self.graph.joint_times[i]
        k = bisect.bisect_left(times, t)
        if k < len(times) and times[k] == t:
            return float(self.at_joints[i][k])
        return _interpolated(self.graph.lanes[i].grid, self.integrals[i], t)

    def _advance(self, i: int, to: float, label: int) -> None:
        """Lane i's compute from where it is to `to` (its own clock), at the change's speed."""
        prev = self.prev[i]
        if to <= prev:
            return
        length = self._integral_at(i, to) - self._integral_at(i, prev)
        multiplier = self.multipliers[i].get(label, 1.0)
        if multiplier != 1.0:
            # the profiler's transition between two steps is not the rank's compute: it keeps its
            # time
            lane = self.graph.lanes[i]
            kept = transition_length(lane, self.transitions[i], self.integrals[i], prev, to)
            length = kept + (length - kept) * multiplier
        self._record(i, Record(prev, to, self.cur[i], self.cur[i] + length, label=label))
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


def _interpolated(grid: np.ndarray, integral: np.ndarray, t: float) -> float:
    """The lane's integral at time t, linear between its grid's boundaries, constant outside."""
    k = int(np.searchsorted(grid, t, side="right")) - 1
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


def _sampled(grid: np.ndarray, integral: np.ndarray, times: Sequence[float]) -> np.ndarray:
    """_interpolated at each of `times`, at once (element by element the same operations, so the
    same floats)."""
    t = np.asarray(times, dtype=np.float64)
    k = np.searchsorted(grid, t, side="right") - 1
    out = np.empty(len(t))
    below, above = k < 0, k >= len(grid) - 1
    inside = ~below & ~above
    km = k[inside]
    lo, hi = integral[km], integral[km + 1]
    span = grid[km + 1] - grid[km]
    with np.errstate(divide="ignore", invalid="ignore"):
        value = lo + (t[inside] - grid[km]) * (hi - lo) / span
    out[inside] = np.where(span > 0, value, lo)
    out[below] = integral[0]
    out[above] = integral[-1]
    return out


def _packed(code: str, values: np.ndarray | None) -> array[Any]:
    return array(code, values.tolist() if values is not None else [])
