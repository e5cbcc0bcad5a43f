"""The run summary's `what_would_help`: `stepcli whatif` on the run's traces with no change given,
kept short (the verdict, the top opportunities, the critical path's segments), for the terminal's
one line and report.html's section. The lanes come from the run end's one read of the traces
(RunTraces with `lanes`); without it, the traces are read here, up to a size: larger ones are left
to `stepcli whatif DIR` (said in a note).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from stepcli.errors import StepcliError

if TYPE_CHECKING:
    from stepcli.traces.analyses.lanes import RankLane
    from stepcli.traces.runtraces import RunTraces

MAX_TRACE_BYTES = 256 << 20  # beyond this the run's end does not read the traces a second time
TOP = 5


def what_would_help(
    trace_paths: list[str],
    untouched_ms: float | None,
    notes: list[str],
    traces: RunTraces | None = None,
) -> dict[str, Any] | None:
    if not trace_paths:
        return None
    from stepcli.whatif.answer import WhatifRequest, solve
    from stepcli.whatif.whatifmain import pick_lanes

    try:
        read = _lanes(trace_paths, traces, notes)
        if read is None:
            return None
        lanes, _ = pick_lanes(read, None)
        doc = solve(lanes, WhatifRequest([]), untouched_ms).doc
    except StepcliError as exc:
        notes.append(f"what would help: {exc.message}")
        return None
    except Exception as exc:  # a bug in the what-if must not cost the run its summary
        notes.append(f"what would help: could not replay the steps: {type(exc).__name__}: {exc}")
        return None
    path = doc["critical_path"]
    return {
        "verdict": doc["verdict"],
        "reason": doc["reason"],
        "steps": doc["steps"],
        "measured_ms": doc["measured_ms"],
        "replay_error": doc["replay_error"],
        "untouched_ms": doc["untouched_ms"],
        "opportunities": doc["opportunities"][:TOP],
        "critical_path": {"ms": path["ms"], "segments": path["segments"][:12]} if path else None,
    }


def _lanes(
    trace_paths: list[str], traces: RunTraces | None, notes: list[str]
) -> list[RankLane] | None:
    """The traces' lanes: from the run end's read when it kept them, else read here (up to
    MAX_TRACE_BYTES)."""
    if traces is not None and traces.lanes:
        kept = [part[0].lane for part in traces.parts(trace_paths)]
        if all(lane is not None for lane in kept):
            return kept
    try:
        size = sum(os.path.getsize(p) for p in trace_paths)
    except OSError:
        return None
    if size > MAX_TRACE_BYTES:
        notes.append(
            "what would help: the traces are large; `stepcli whatif` on the output folder answers "
            "it"
        )
        return None
    from stepcli.traces.engine import map_files
    from stepcli.whatif.whatifmain import read_lane

    return map_files(read_lane, trace_paths)
