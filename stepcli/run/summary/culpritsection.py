"""The run summary's `culprit` section: the traces' culprit analysis
(stepcli.traces.analyses.culprit) plus each process's Python garbage collections over the whole run
(from its step log, stepcli.agent.gcpauses), and its terminal lines (its advice rule is
stepcli.advice.culpritadvice's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stepcli.traces.analyses.culpritwords import summary_line


def _gc_counts(log: Mapping[str, Any]) -> dict[str, Any] | None:
    """A step log's `gc` entry, checked: per generation collections, pause ms, longest pause ms,
    objects collected."""
    entry = log.get("gc")
    keys = ("collections", "pause_ms", "max_pause_ms", "collected")
    if not isinstance(entry, dict):
        return None
    out: dict[str, Any] = {}
    for key in keys:
        values = entry.get(key)
        if not (isinstance(values, list) and len(values) == 3):
            return None
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e18
            for v in values
        ):
            return None
        out[key] = values
    return out


def culprit_section(
    analysis: Mapping[str, Any] | None, logs: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The traces' culprit analysis with `gc`: one row per process that recorded its collections."""
    gc_rows = []
    for log in logs:
        counts = _gc_counts(log)
        if counts is not None:
            gc_rows.append({"worker": log.get("worker"), "rank": log.get("rank"), **counts})
    if analysis is None and not gc_rows:
        return None
    section: dict[str, Any] = dict(analysis) if analysis else {"collectives": 0, "culprit": None}
    section["gc"] = gc_rows
    return section


def culprit_lines(section: Mapping[str, Any] | None) -> list[str]:
    """The run summary's lines: the culprit (or why none) and the garbage collections of each
    rank."""
    if not section:
        return []
    lines = []
    if section.get("collectives"):
        line = summary_line(dict(section))
        if line:
            lines.append(line)
    ranked = [row for row in section.get("gc", []) if row.get("rank") is not None]
    if len(ranked) > 1 or (ranked and section.get("collectives")):
        parts = []
        for row in ranked:
            pause = sum(row["pause_ms"])
            parts.append(
                f"rank {row['rank']} {sum(row['collections'])} ({pause:.1f} ms, gen 2: "
                f"{row['collections'][2]})"
            )
        # Counted by a gc callback from the interpreter's start: torch's import and the set-up are
        # in it too.
        lines.append(
            "python gc over each whole process (start-up and imports included): " + ", ".join(parts)
        )
    return lines


def print_culprit(
    console: Any, section: Mapping[str, Any] | None, out_dir: str | None = None
) -> None:
    """The culprit lines on the run summary's console (rich), as they are: no markup in names from
    traces; and, with collectives, the command that shows every rank on one timeline."""
    from stepcli.fmt import print_wrapped

    for line in culprit_lines(section):
        print_wrapped(console, line)
    if section and section.get("collectives") and out_dir:
        import shlex

        # The command on a line of its own, whole: it can be copied as it is.
        console.print("every rank on one timeline, culprits marked:", markup=False, highlight=False)
        console.print(
            f"  stepcli merge {shlex.quote(out_dir)} -o all-ranks.json",
            markup=False,
            soft_wrap=True,
        )
