"""`stepcli memory`'s output: plain text for people, one JSON document for machines."""

from __future__ import annotations

import json
import os
from typing import Any

from stepcli.advice.memoryadvice import size
from stepcli.snapshots.categories import CATEGORIES, LABELS, PHASES

SCHEMA = "stepcli.memory"
SCHEMA_VERSION = 1
_STEP_ROWS = 12  # the last steps shown in the text output (--json has them all)


def to_json(reports: list[dict[str, Any]]) -> str:
    return json.dumps(
        {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "snapshots": reports}, indent=2
    )


def _place(frame: dict[str, Any] | None) -> str:
    if frame is None:
        return "<no Python stack>"
    path = frame["file"]
    try:
        relative = os.path.relpath(path)
        if not relative.startswith(".."):
            path = relative
    except ValueError:
        pass
    return f"{path}:{frame['line']} {frame['function']}"


def to_text(report: dict[str, Any]) -> str:
    lines = [
        f"{report['file']}: device {report['device']}, {report['history_entries']} history events"
    ]
    lines += _moment_lines(report)
    lines.append("split:")
    allocated = max(report["moment"]["allocated_bytes"], 1)
    for name in CATEGORIES:
        value = report["split"][name]
        lines.append(f"  {LABELS[name]:<16} {size(value):>12}  {value / allocated:4.0%}")
    lines.append(_fragmentation_line(report))
    if report["top_sites"]:
        lines.append("top allocation sites (bytes alive then):")
        for row in report["top_sites"]:
            via = f"  (via {_place(row['via'])})" if row["via"] else ""
            lines.append(
                f"  {size(row['bytes']):>12} {row['share']:4.0%} {row['blocks']:>6} "
                f"block{'s' if row['blocks'] != 1 else ' '}  {_place(row['site'])}  "
                f"[{LABELS[row['category']]}]{via}"
            )
    lines += _step_lines(report["steps"])
    for item in report["advice"]:
        lines.append(f"advice: {item['text']}")
        lines.append(f"  evidence: {item['evidence']}")
    return "\n".join(lines)


def _moment_lines(report: dict[str, Any]) -> list[str]:
    moment, request = report["moment"], report["oom"]
    lines = []
    step = f"at step {moment['step']}" if moment["step"] is not None else "at an unknown step"
    when = (
        f"{step}, in {moment['phase']}"
        if moment["phase"] in PHASES
        else f"{step} ({moment['phase']})"
    )
    if moment["kind"] == "oom":
        lines.append(f"out of memory {when}")
        if request:
            free = request.get("device_free_bytes")
            total = request.get("device_total_bytes")
            of = f" of {size(total)}" if total else ""
            # torch reports the cap there, the device's free memory
            if total and free is not None and free > total:
                of = f", of which this process may use {size(total)} (a memory fraction is set)"
            lines.append(
                f"failed request: {size(request['requested_bytes'])}, with {size(free)} free on "
                f"the device{of}"
            )
    else:
        lines.append(f"peak memory {when}")
    lines.append(
        f"then: {size(moment['allocated_bytes'])} allocated, {size(moment['reserved_bytes'])} "
        f"reserved"
    )
    return lines


def _fragmentation_line(report: dict[str, Any]) -> str:
    frag, request = report["fragmentation"], report["oom"]
    text = (
        f"fragmentation: {size(frag['free_in_reserved_bytes'])} reserved but not allocated; "
        f"largest free block {size(frag['largest_free_block_bytes'])}"
    )
    if request and frag["request_fits_largest_block"] is not None:
        verb = ">=" if frag["request_fits_largest_block"] else "<"
        text += f" {verb} the failed request of {size(request['requested_bytes'])}"
    if frag["expandable_segments"]:
        text += " (expandable_segments on)"
    return text


def _step_lines(steps: list[dict[str, Any]]) -> list[str]:
    if not steps:
        return ["steps: unknown (allocations carry no step: not written by `stepcli run --memory`)"]
    shown = steps[-_STEP_ROWS:]
    lines = [
        f"steps (allocated at start -> "
        f"peak{', last ' + str(len(shown)) if len(shown) < len(steps) else ''}):"
    ]
    for row in shown:
        partial = "" if row["complete"] else "  (its start predates the history)"
        lines.append(
            f"  step {row['step']:>6}: {size(row['start_allocated_bytes']):>12} -> "
            f"{size(row['peak_allocated_bytes']):>12}{partial}"
        )
    return lines
