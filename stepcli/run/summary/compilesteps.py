"""torch.compile in the run summary: which steps compiled or recompiled, why, and how long it took.

Pure functions over the step logs' `compile` sections (written by stepcli/agent/compiles.py). Steps
that compiled are kept apart from the step-time statistics, like the start-up step: a recompilation
costs seconds and would otherwise show up as an unexplained outlier.
"""

from __future__ import annotations

from typing import Any

from stepcli.fmt import seconds as _seconds
from stepcli.runfolder.summaryfile import CompileSection, CompileStep, PopulationStats
from stepcli.stats import describe

MAX_LISTED_STEPS = 5


def compiled_steps(log: dict[str, Any]) -> set[int]:
    """The global steps of one process during which torch compiled something."""
    section = log.get("compile") or {}
    return {int(event["step"]) for event in section.get("events", []) if "step" in event}


def _by_step(log: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    steps: dict[int, list[dict[str, Any]]] = {}
    for event in (log.get("compile") or {}).get("events", []):
        steps.setdefault(int(event["step"]), []).append(event)
    return steps


def describe_step(step: int, events: list[dict[str, Any]]) -> str:
    """One line for humans, e.g. "step 6: recompiled forward (reason: tensor 'x' size mismatch ...),
    1.4 s"."""
    parts = []
    frames = [e for e in events if e.get("kind") in ("compiled", "recompiled")]
    for event in frames[:2]:
        text = f"{event['kind']} {event.get('frame') or 'a frame'}"
        if event.get("reason"):
            text += f" (reason: {event['reason']})"
        parts.append(text)
    if len(frames) > 2:
        parts.append(f"+{len(frames) - 2} more frame(s)")
    backward = sum(1 for e in events if e.get("kind") == "backward")
    if backward:
        parts.append(f"{backward} backward graph(s)")
    others = sorted({str(e.get("kind")) for e in events} - {"compiled", "recompiled", "backward"})
    parts.extend(others)
    breaks = sum(int(e.get("graph_breaks") or 0) for e in events)
    if breaks:
        parts.append(f"{breaks} graph break(s)")
    seconds = sum(float(e.get("seconds") or 0.0) for e in events)
    return f"step {step}: {', '.join(parts)}, {_seconds(seconds)}"


def compile_summary(logs: list[dict[str, Any]]) -> CompileSection | None:
    """The run summary's `compile` section, or None when no process compiled anything."""
    steps: list[CompileStep] = []
    events_all: list[dict[str, Any]] = []
    step_ms: list[float] = []
    dropped = 0
    for log in logs:
        dropped += int((log.get("compile") or {}).get("dropped") or 0)
        durations = log.get("durations_us", [])
        for step, events in sorted(_by_step(log).items()):
            events_all.extend(events)
            in_range = 0 <= step < len(durations)
            steps.append(
                CompileStep(
                    worker=log.get("worker"),
                    step=step,
                    seconds=round(sum(float(e.get("seconds") or 0.0) for e in events), 6),
                    frames=sum(1 for e in events if e.get("kind") in ("compiled", "recompiled")),
                    recompiles=sum(1 for e in events if e.get("kind") == "recompiled"),
                    graph_breaks=sum(int(e.get("graph_breaks") or 0) for e in events),
                    reasons=[e["reason"] for e in events if e.get("reason")],
                    step_ms=round(durations[step] / 1000.0, 3) if in_range else None,
                    text=describe_step(step, events),
                )
            )
            if 0 < step < len(durations):  # step 0 is the start-up step, reported apart already
                step_ms.append(durations[step] / 1000.0)
    if not events_all:
        return None
    stats = describe(step_ms)
    return CompileSection(
        steps=len(steps),
        seconds=round(sum(s.seconds for s in steps), 6),
        frames=sum(s.frames for s in steps),
        recompiles=sum(s.recompiles for s in steps),
        graph_breaks=sum(s.graph_breaks for s in steps),
        dropped_events=dropped,
        step_time_ms=PopulationStats(**stats) if stats else None,
        by_step=steps,
    )


def compile_lines(section: CompileSection | None, workers: int = 1) -> list[str]:
    """The summary's compile rows: a total, then the first few steps that compiled."""
    if not section:
        return []
    head = (
        f"{section.steps} step(s) compiled, {_seconds(section.seconds)} in all: "
        f"{section.frames} frame(s), {section.recompiles} recompilation(s), "
        f"{section.graph_breaks} graph break(s); kept out of the step-time statistics"
    )
    lines = [head]
    for entry in section.by_step[:MAX_LISTED_STEPS]:
        lines.append((f"{entry.worker} " if workers > 1 else "") + entry.text)
    if len(section.by_step) > MAX_LISTED_STEPS:
        lines.append(f"+{len(section.by_step) - MAX_LISTED_STEPS} more (see --json)")
    return lines
