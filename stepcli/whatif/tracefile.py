"""`stepcli whatif --trace FILE`: the replayed window of every rank as one Chrome trace (Perfetto,
chrome://tracing), with the critical path marked: per rank, its steps and top-level operators on one
track and the critical path's pieces on another, and a flow arrow from each collective's last
arriver to the rank that waited for it. Times are on the first rank's clock (aligned as the replay
aligns them), in µs.
"""

from __future__ import annotations

import re
from typing import Any

from stepcli import safefile
from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.traces.read.files import gzip_aware
from stepcli.whatif.criticalpath import PathPiece
from stepcli.whatif.lanegraph import Graph

# the document's first key: a file with it is an earlier --trace, safe to replace
MARKER = "stepcli_whatif_trace"
OPERATORS, CRITICAL = 1, 2  # thread ids of each rank's two tracks


def trace_document(graph: Graph, path: list[PathPiece]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for i, lane in enumerate(graph.lanes):
        pid = lane.rank if lane.rank is not None else 0
        offset = graph.offset[i]
        events += [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": lane.label}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": OPERATORS,
                "args": {"name": "steps' thread"},
            },
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": CRITICAL,
                "args": {"name": "critical path"},
            },
        ]
        lo, hi = graph.start[i], graph.end[i]
        for number, start, end in zip(lane.steps, lane.step_start, lane.step_end):
            if lo <= start and end <= hi:
                events.append(
                    _slice(pid, OPERATORS, f"ProfilerStep#{number}", start - offset, end - start)
                )
        top = lane.op_top
        for code, start, end in zip(
            lane.op_name[top].tolist(), lane.op_start[top].tolist(), lane.op_end[top].tolist()
        ):
            events.append(_slice(pid, OPERATORS, lane.names[code], start - offset, end - start))
    flow = 0
    for piece in path:
        lane = graph.lanes[piece.lane]
        pid = lane.rank if lane.rank is not None else 0
        name = f"{piece.kind}: {piece.name}"
        events.append(
            _slice(pid, CRITICAL, name, piece.start, piece.us, cat="stepcli_critical_path")
        )
        if piece.waiter >= 0:
            waiter = graph.lanes[piece.waiter]
            to = waiter.rank if waiter.rank is not None else 0
            flow += 1
            common = {"name": "waits for", "cat": "stepcli_critical_path", "id": flow}
            events.append({**common, "ph": "s", "pid": pid, "tid": CRITICAL, "ts": piece.start})
            events.append(
                {**common, "ph": "f", "bp": "e", "pid": to, "tid": CRITICAL, "ts": piece.end}
            )
    return {MARKER: {"steps": graph.steps}, "displayTimeUnit": "ms", "traceEvents": events}


def _slice(
    pid: int, tid: int, name: str, ts: float, dur: float, cat: str = "stepcli_replay"
) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": max(dur, 0.0),
    }


# an earlier --trace's first bytes, plain or gzipped (NAME.json.gz)
is_ours = gzip_aware(re.compile(rb'\s*\{\s*"' + MARKER.encode() + rb'"\s*:').match)


def write_trace(out: str, graph: Graph, path: list[PathPiece]) -> None:
    """The trace at `out`, replacing only an earlier one of `--trace` (never a user's file or an
    input trace)."""
    import orjson

    problem = safefile.why_not_replace(out, is_ours)
    if problem is not None:
        raise StepcliError(f"--trace {out}: {problem}; not replaced", EXIT_USAGE)
    try:
        data = orjson.dumps(trace_document(graph, path))
        if out.lower().endswith(".gz"):  # as its name says (Perfetto opens it either way)
            import gzip

            data = gzip.compress(data, compresslevel=6, mtime=0)
        safefile.write_bytes(out, data)
    except OSError as exc:
        raise StepcliError(
            f"--trace {out}: cannot write ({exc.strerror or exc})", EXIT_USAGE
        ) from None
