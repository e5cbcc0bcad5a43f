"""The critical path of a replayed step: walked back from the latest end along each stretch's
binding predecessor, merged into segments per rank, kind and phase; and how far each rank and the
top operators are from it (nearly critical ranks, slack). Pure.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepcli.traces.analyses.lanes import PHASE_NAMES
from stepcli.whatif.lanegraph import Graph
from stepcli.whatif.lanereplay import LaneReplay, Record
from stepcli.whatif.lanetime import between_steps

# the critical path's time between two steps (the profiler's step transition): walked through, not
# counted, as the steps' measured time does not count it
BETWEEN_STEPS = "between steps"
# a rank waiting less than this share of the step is (nearly) on the critical path
NEARLY_CRITICAL = 0.01


def nearly_critical(graph: Graph, base: LaneReplay, measured_ms: float) -> list[int]:
    """Ranks that wait less than 1% of the step: each is on a (nearly) critical path; with several,
    making one faster buys little until the others are too."""
    if len(graph.lanes) < 2:
        return []
    per_step = [b / len(graph.steps) / 1000.0 for b in base.blocked]
    return [
        lane.rank
        for lane, waited in zip(graph.lanes, per_step)
        if lane.rank is not None and waited < NEARLY_CRITICAL * measured_ms
    ]


@dataclass
class PathPiece:
    """One stretch of the critical path: on lane `lane`, from `start` to `end` (replayed, aligned
    µs); a collective's piece also names the lane that waited for it (`waiter`, -1 otherwise)."""

    lane: int
    kind: str  # cpu, collective, wait, sync, launch or gpu
    name: str
    start: float
    end: float
    waiter: int = -1
    node: int = -1  # of a gpu or launch piece: the device node (stepcli.traces.analyses.devicework)

    @property
    def us(self) -> float:
        return self.end - self.start


def walk_critical_path(graph: Graph, rep: LaneReplay) -> list[PathPiece]:
    """Walk back from the latest end along each stretch's binding predecessor: the lane before it,
    or for a wait bound by a collective, that collective's transfer and then its last arriver's
    lane. In time order."""
    i = int(np.argmax(rep.end))
    k = len(rep.records[i]) - 1
    walked: list[PathPiece] = []
    guard = sum(len(r) for r in rep.records) + 1
    while k >= 0 and guard > 0:
        guard -= 1
        record = rep.records[i][k]
        if record.arrive_row >= 0 or record.end <= record.start:
            k -= 1
            continue
        if record.wait_row >= 0:
            row = record.wait_row
            name = graph.names[row]
            if record.tail > 0:
                walked.append(
                    PathPiece(i, "wait", f"after {name}", record.end - record.tail, record.end)
                )
            m = int(np.argmax(rep.arrive[row]))
            j = graph.members[row][m]
            arrived = rep.arrive[row][m]
            walked.append(
                PathPiece(j, "collective", name, arrived, arrived + rep.transfer[row], waiter=i)
            )
            found = [x for x, r in enumerate(rep.records[j]) if r.arrive_row == row]
            if not found:
                break
            i, k = j, found[0] - 1
            continue
        if record.sync_node >= 0 and rep.device and rep.device[i] is not None:
            times = rep.device[i]
            assert times is not None
            node = record.sync_node
            if times.end[node] >= record.start:
                work = graph.lanes[i].device
                assert work is not None
                sync_name = work.sync_name[int(np.searchsorted(work.sync_at, record.lane_from))]
                walked.append(PathPiece(i, "sync", sync_name, times.end[node], record.end))
                i, k = _walk_device(graph, rep, i, node, walked)
                continue
        at = record.end
        for phase, us in reversed(_phase_split(graph, i, record)):
            walked.append(PathPiece(i, "cpu", phase, at - us, at))
            at -= us
        k -= 1
    walked.reverse()
    return walked


def _walk_device(
    graph: Graph, rep: LaneReplay, i: int, node: int, walked: list[PathPiece]
) -> tuple[int, int]:
    """Walk back along the device nodes from lane i's `node`, through the edges that bound them (the
    stream, another stream's node, a launch: a piece of its own; an NCCL collective: its transfer,
    then the last member to arrive, on its lane), to a launch call on a host: (that lane, the index
    of its record that ends there; -1: none, the walk ends)."""
    from stepcli.traces.analyses.devicework import COLLECTIVE, EVENT, LAUNCH

    guard = sum(len(lane.device) for lane in graph.lanes if lane.device is not None) + 1
    while guard > 0:
        guard -= 1
        work, times = graph.lanes[i].device, rep.device[i]
        assert work is not None and times is not None
        stream = f"stream {work.streams[int(work.stream[node])]}"
        bound = times.bound[node]
        end = times.end[node]
        joined = graph.node_row[i].get(node) if graph.node_row else None
        if joined is not None:
            row = joined[0]
            nodes = graph.device_rows[row]
            arrivals = [rep.device[graph.members[row][m]].start[n] for m, n in enumerate(nodes)]  # type: ignore[union-attr]
            m = int(np.argmax(arrivals))
            j, last_node = graph.members[row][m], nodes[m]
            walked.append(
                PathPiece(
                    j, "collective", graph.names[row], arrivals[m], end, waiter=i, node=last_node
                )
            )
            i, node, end = j, last_node, arrivals[m]
            work, times = graph.lanes[i].device, rep.device[i]
            assert work is not None and times is not None
            stream = f"stream {work.streams[int(work.stream[node])]}"
            bound = times.bound[node]
            if bound == COLLECTIVE:
                bound = LAUNCH
        if bound == LAUNCH:
            record = int(times.launch_record[node])
            launched = _record_end(times, node, work)
            walked.append(PathPiece(i, "gpu", stream, times.start[node], end, node=node))
            walked.append(
                PathPiece(i, "launch", "launch latency", launched, times.start[node], node=node)
            )
            return i, record
        before = int(work.prev[node]) if bound != EVENT else int(work.wait_for[node])
        walked.append(PathPiece(i, "gpu", stream, times.end[before], end, node=node))
        node = before
    return i, -1


def _record_end(times: Any, node: int, work: Any) -> float:
    """When the node's launch was replayed: its start less its launch edge's delay."""
    from stepcli.traces.analyses.devicework import LAUNCH

    return float(times.start[node] - work.delay[node, LAUNCH])


def critical_path(graph: Graph, path: list[PathPiece]) -> dict[str, Any]:
    """The critical path's segments (walk_critical_path's pieces, less the time between steps)
    merged by (rank, kind, name) in order of first appearance, in ms per step; their ms add up to
    the path's."""
    n_steps = len(graph.steps)
    merged: dict[tuple[int, str, str], float] = {}
    for piece in path:
        if piece.name == BETWEEN_STEPS and piece.kind == "cpu":
            continue  # outside the steps, as their measured time is
        key = (piece.lane, piece.kind, piece.name)
        merged[key] = merged.get(key, 0.0) + piece.us
    total = sum(merged.values())
    segments = [
        {
            "rank": graph.lanes[lane].rank,
            "kind": kind,
            "name": name,
            "ms": us / n_steps / 1000.0,
            "share": us / total if total > 0 else 0.0,
        }
        for (lane, kind, name), us in merged.items()
        if us > 0
    ]
    return {"ms": total / n_steps / 1000.0, "segments": segments}


def _phase_split(graph: Graph, i: int, record: Record) -> list[tuple[str, float]]:
    """A compute stretch's replayed time by phase (its measured time by phase, scaled to its
    replayed length), in the order the phases first appear in it."""
    lane = graph.lanes[i]
    lo, hi = record.lane_from, record.lane_to
    a = max(int(np.searchsorted(lane.grid, lo, side="right")) - 1, 0)
    b = int(np.searchsorted(lane.grid, hi, side="left")) + 1
    edges = np.clip(lane.grid[a:b], lo, hi)
    lengths = np.diff(edges)
    phase = lane.phase[a : a + len(lengths)].astype(np.int64)
    total = float(lengths.sum())
    if total <= 0:
        return []
    between = between_steps(lane, graph.start[i], graph.end[i], (edges[:-1] + edges[1:]) / 2)
    phase[between] = len(PHASE_NAMES)
    scale = (record.end - record.start) / total
    sums = np.bincount(phase, weights=lengths, minlength=len(PHASE_NAMES) + 1)
    first: dict[int, int] = {}
    for p in phase[lengths > 0].tolist():
        first.setdefault(p, len(first))
    names = [*PHASE_NAMES, BETWEEN_STEPS]
    return [(names[p], float(sums[p]) * scale) for p in sorted(first, key=first.__getitem__)]


def slack(graph: Graph, rep: LaneReplay, names: Sequence[str]) -> list[dict[str, Any]]:
    """The slack of the operators `names`: how much longer each could run before the step does
    (ms, the least over its occurrences on a rank): the waits for other ranks after it on its rank
    absorb that much. Per rank, and the least over ranks."""
    out = []
    # per lane: its bound waits' starts, sorted, and the sum of the waits from each one on
    after: dict[int, tuple[list[float], list[float]]] = {}
    for name in names:
        by_rank: dict[str, float] = {}
        for i, lane in enumerate(graph.lanes):
            codes = [c for c, n in enumerate(lane.names) if n == name]
            at = lane.op_start[lane.op_top & np.isin(lane.op_name, codes)] if codes else np.zeros(0)
            if not len(at):
                continue
            if i not in after:
                waits = sorted(rep.records[i].bound_waits())
                sums = list(itertools.accumulate(w for _, w in reversed(waits)))[::-1]
                after[i] = ([start for start, _ in waits], [*sums, 0.0])
            starts, sums = after[i]
            least = min(sums[bisect.bisect_left(starts, t)] for t in at.tolist())
            by_rank[str(lane.rank) if lane.rank is not None else "-"] = least / 1000.0
        if by_rank:
            out.append({"name": name, "slack_ms": min(by_rank.values()), "by_rank": by_rank})
    return out
