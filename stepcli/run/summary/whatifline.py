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
from stepcli.runfolder.summaryfile import CriticalPath, HelpOpportunity, PathSegment, WhatWouldHelp

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
) -> WhatWouldHelp | None:
    """The section from the what-if answer (a document of its own, schema `stepcli.whatif`),
    kept short; None without traces or when they cannot be replayed (a note says why)."""
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
    return WhatWouldHelp(
        verdict=doc["verdict"],
        reason=doc["reason"],
        steps=doc["steps"],
        measured_ms=doc["measured_ms"],
        replay_error=doc["replay_error"],
        untouched_ms=doc["untouched_ms"],
        opportunities=[_opportunity(entry) for entry in doc["opportunities"][:TOP]],
        critical_path=_critical_path(doc["critical_path"]),
    )


def _opportunity(entry: dict[str, Any]) -> HelpOpportunity:
    return HelpOpportunity(
        change=entry["change"],
        predicted_ms=entry["predicted_ms"],
        predicted_untouched_ms=entry["predicted_untouched_ms"],
        saved_ms=entry["saved_ms"],
        saved_share=entry["saved_share"],
    )


def _critical_path(path: dict[str, Any] | None) -> CriticalPath | None:
    """The path's first 12 segments: enough for the page's chart (whatif has them all)."""
    if not path:
        return None
    segments = [
        PathSegment(rank=s["rank"], kind=s["kind"], name=s["name"], ms=s["ms"], share=s["share"])
        for s in path["segments"][:12]
    ]
    return CriticalPath(ms=path["ms"], segments=segments)


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
