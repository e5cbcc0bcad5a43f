"""The ranks' lanes joined at their collectives: the graph `stepcli whatif` replays. Pure.

Each rank's lane (stepcli.traces.analyses.lanes) is cut to the chosen steps and placed on aligned
clocks (stepcli.traces.analyses.alignment); its joints are its arrivals at the collectives every
member holds, its waits on them, and, for a GPU rank, its device work tied to the NCCL kernels. A
collective's transfer time is its end minus the latest member's arrival; a wait keeps the measured
tail after the collective's end. The replay (stepcli.whatif.lanereplay) runs this graph by list
scheduling.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from stepcli.traces.analyses.alignment import Matched, align, match_collectives
from stepcli.traces.analyses.lanes import RankLane

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


@dataclass(slots=True)
class Item:
    """A joint of a lane: an arrival at a collective (row, member) at `at`, or a wait [at, until) on
    collectives whose departures (row, member, departure on this rank's clock) fall inside it."""

    at: float
    arrive: tuple[int, int] | None = None
    until: float = 0.0
    # (a tuple and a range, not lists: a 1,024-rank job's lanes hold ~100,000 joints)
    departs: tuple[tuple[int, int, float], ...] = ()
    # device nodes (stepcli.traces.analyses.devicework) queued by a call at `at`
    launches: range | None = None
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


class PackedJoints:
    """A lane's joints (Items, in order) as packed columns: as objects they were ~150 bytes each, a
    graph's largest part at 1,024 ranks; packed ~45. Read back one Item at a time, the same values.
    """

    __slots__ = ("times", "ints", "departs", "leaves")
    # per joint in `ints`: arrive row and member (-1: none), launches' first and end (-1: none),
    # sync, and its departs' first and end in `departs` (row, member) and `leaves`
    WIDTH = 7

    def __init__(self, joints: Sequence[Item]) -> None:
        self.times = array("d")  # per joint: at, until
        self.ints = array("i")  # (rows and nodes fit 32 bits; a larger one raises, never wraps)
        self.departs = array("i")
        self.leaves = array("d")
        for item in joints:
            self.times.extend((item.at, item.until))
            row, m = item.arrive if item.arrive is not None else (-1, -1)
            first, last = (
                (item.launches.start, item.launches.stop) if item.launches is not None else (-1, -1)
            )
            begin = len(self.leaves)
            for d_row, d_m, leave in item.departs:
                self.departs.extend((d_row, d_m))
                self.leaves.append(leave)
            self.ints.extend((row, m, first, last, item.sync, begin, len(self.leaves)))

    def __len__(self) -> int:
        return len(self.ints) // self.WIDTH

    def __getitem__(self, k: int) -> Item:
        # (the replay reads every joint once per replay: ~350,000 reads at 1,024 GPU ranks)
        width = self.WIDTH
        if k < 0 or k * width >= len(self.ints):
            raise IndexError(k)
        times, ints = self.times, self.ints
        row, m, first, last, sync, begin, end = ints[width * k : width * (k + 1)]
        if end > begin:
            pairs, leaves = self.departs, self.leaves
            departs: tuple[tuple[int, int, float], ...] = tuple(
                (pairs[2 * d], pairs[2 * d + 1], leaves[d]) for d in range(begin, end)
            )
        else:
            departs = ()
        return Item(
            times[2 * k],
            (row, m) if row >= 0 else None,
            times[2 * k + 1],
            departs,
            range(first, last) if first >= 0 else None,
            sync,
        )

    def __iter__(self) -> Iterator[Item]:
        return (self[k] for k in range(len(self)))

    def arrive_rows(self) -> list[int]:
        """Per joint: the row of the collective it arrives at (-1: no arrival)."""
        return self.ints[0 :: self.WIDTH].tolist()


class NodeRows:
    """One lane's device nodes that are NCCL collectives joined across ranks: node -> (row,
    member), packed as sorted columns (~12 bytes a node; as a dict of tuples ~90, ~3 MiB at 1,024
    ranks of scripts/make_job.py's job)."""

    __slots__ = ("members", "nodes", "rows")

    def __init__(self) -> None:
        self.nodes = array("i")
        self.rows = array("i")
        self.members = array("i")

    def add(self, node: int, row: int, member: int) -> None:
        self.nodes.append(node)
        self.rows.append(row)
        self.members.append(member)

    def seal(self) -> None:
        """Sorted by node, for get()."""
        order = sorted(range(len(self.nodes)), key=self.nodes.__getitem__)
        self.nodes = array("i", [self.nodes[k] for k in order])
        self.rows = array("i", [self.rows[k] for k in order])
        self.members = array("i", [self.members[k] for k in order])

    def get(self, node: int) -> tuple[int, int] | None:
        k = bisect.bisect_left(self.nodes, node)
        if k < len(self.nodes) and self.nodes[k] == node:
            return self.rows[k], self.members[k]
        return None


@dataclass
class Graph:
    """The lanes of the ranks analysed and the collectives joining them, in the window of
    `steps`."""

    lanes: list[RankLane]
    steps: list[int]
    start: list[float]  # per lane: its window, its own clock
    end: list[float]
    offset: list[float]  # per lane: its clock minus the reference clock (µs)
    items: list[PackedJoints]
    # [row][member] aligned µs; each row packed (at 1,024 members a list of floats is ~32 KB, packed
    # 8), as are the other per-row columns
    arrive: list[array[float]]
    depart: list[array[float]]
    members: list[array[int]]  # [row] -> lane indices
    names: list[str]  # [row] collective name
    transfer: list[float]  # [row] µs: the earliest departure minus the latest arrival (>= 0)
    # collectives whose departure the rank never waited for visibly (no wait span)
    unexplained: int = 0
    # NCCL collectives joined on the device: [row] -> per member its NCCL node on that member's lane
    # (empty: the row is joined on the host, or not at all); their transfer and each member's
    # residual, from the kernels
    device_rows: list[array[int]] = field(default_factory=list)
    device_transfer: list[float] = field(default_factory=list)
    device_residual: list[array[float]] = field(default_factory=list)
    # per lane: node -> (row, member)
    node_row: list[NodeRows] = field(default_factory=list)
    # per lane, sorted: where the replay reads its time (packed doubles: as a list of floats, three
    # times the size, ~6 KB a lane of a 1,024-rank job)
    joint_times: list[array[float]] = field(default_factory=list)


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
    rows: list[array[int]] = []
    arrive: list[array[float]] = []
    depart: list[array[float]] = []
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
        lanes, steps, start, end, offsets, [], arrive, depart, rows, names, transfer, unexplained
    )
    _join_on_device(graph, device_rows)
    graph.joint_times = [
        array("d", sorted({start[li], end[li], *(j.at for j in ts), *(j.until for j in ts)}))
        for li, ts in enumerate(items)
    ]
    graph.items = [PackedJoints(joints) for joints in items]
    return graph


def _nccl_nodes(
    lanes: list[RankLane],
    rows: list[array[int]],
    arrive: list[array[float]],
    offsets: list[float],
    memberships: list[list[tuple[int, int]]],
) -> list[array[int]]:
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
    out: list[array[int]] = []
    for row, member_lanes in enumerate(rows):
        nodes = [node_of.get((row, m), -1) for m in range(len(member_lanes))]
        out.append(array("i", nodes) if min(nodes, default=-1) >= 0 else array("i"))
    return out


def _join_on_device(graph: Graph, device_rows: list[array[int]]) -> None:
    """The device-joined collectives' transfer (the earliest member's end less the latest member's
    start, on aligned clocks) and each member's residual after it."""
    graph.device_rows = device_rows
    graph.node_row = [NodeRows() for _ in graph.lanes]
    graph.device_transfer = [0.0] * len(device_rows)
    graph.device_residual = [array("d") for _ in device_rows]
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
            graph.node_row[li].add(node, row, m)
        transfer = max(0.0, min(ends) - max(starts))
        graph.device_transfer[row] = transfer
        graph.device_residual[row] = array(
            "d", [max(0.0, e - (max(starts) + transfer)) for e in ends]
        )
    for joined in graph.node_row:
        joined.seal()


def _joined(
    lanes: list[RankLane], matched: Matched, steps: list[int]
) -> tuple[list[float], list[array[int]], list[array[float]], list[array[float]], list[str]]:
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
        rows.append(array("i", member_lanes))
        arrive.append(array("d", aligned))
        depart.append(array("d", leave))
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
    arrive: list[array[float]],
    depart: list[array[float]],
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
            item.departs += ((row, m, leave),)
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
            Item(float(launch[a]), launches=range(a, b)) for a, b in zip(firsts, lasts)
        ]
    for at, until, node in zip(
        work.sync_at.tolist(), work.sync_until.tolist(), work.sync_node.tolist()
    ):
        if lo <= at < hi:
            joints.append(Item(at, until=until, sync=node))
    joints.sort(key=lambda item: (item.at, item.order))
    return joints
