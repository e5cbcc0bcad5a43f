"""The what-if answer on the terminal: the replay's check first, then the critical path, the slack
and the predictions; 80 columns, plain text (a pipe gets the same)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepcli.fmt import ms
from stepcli.safetext import visible
from stepcli.traces.analyses.ranks import steps_label

if TYPE_CHECKING:
    from stepcli.runfolder.summaryfile import WhatWouldHelp

WIDTH = 80


def _who(rank: int | None) -> str:
    return f"rank {rank}" if rank is not None else "process"


def _wrapped(text: str) -> list[str]:
    """A sentence on lines of at most WIDTH columns, the later ones indented (a path longer than
    that stays whole)."""
    import textwrap

    return textwrap.wrap(
        text, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def note_lines(notes: Sequence[str]) -> list[str]:
    """Each note on lines of 80 columns, its control characters shown (names from traces)."""
    return [line for note in notes for line in _wrapped(f"note: {visible(note)}")]


def answer_lines(doc: dict[str, Any], notes: Sequence[str] = ()) -> list[str]:
    ranks = doc["ranks"]
    where = (
        f"{len(ranks)} ranks" if len(ranks) > 1 else (_who(ranks[0]) if ranks else "one process")
    )
    lines = [f"whatif: {where}, {steps_label(doc['steps'])}"]
    lines += note_lines(notes)
    if doc["measured_ms"] is not None:
        lines.append(
            f"replay: measured {ms(doc['measured_ms'])}/step, replayed {ms(doc['replayed_ms'])} "
            f"({doc['replay_error']:+.1%})"
        )
    if doc["verdict"] != "ok":
        lines += _wrapped(f"INCONCLUSIVE: {doc['reason']}")
        return lines
    lines.append("the graph explains the step (within 5%): predictions at the profiler's pace")
    if doc["untouched_ms"] is not None:
        lines.append(
            f"untouched steps: median {ms(doc['untouched_ms'])} (the program's pace, in brackets "
            f"below)"
        )
    path = doc["critical_path"]
    lines.append("")
    lines.append(f"critical path {ms(path['ms'])}/step")
    for seg in path["segments"][:12]:
        who = _who(seg["rank"]) if seg["rank"] is not None else ""
        lines.append(
            f"  {who:<8} {seg['kind']:<10} {_cut(visible(seg['name']), 36):<36} "
            f"{ms(seg['ms']):>10} {seg['share']:>5.0%}"
        )
    if len(path["segments"]) > 12:
        lines.append(f"  ... {len(path['segments']) - 12} more segments (--json has them all)")
    nearly = doc["nearly_critical_ranks"]
    if len(nearly) > 1:
        lines.append(
            f"{len(nearly)} ranks are nearly critical (each waits under 1% of the step): making "
            f"one faster buys "
            "little until the others are too"
        )
    if doc["slack"] and len(ranks) > 1:
        lines.append("")
        lines.append("slack: how much longer each top operator could run before the step does")
        for entry in doc["slack"]:
            ranks_text = ", ".join(f"{r}: {ms(v)}" for r, v in list(entry["by_rank"].items())[:4])
            lines.append(f"  {_cut(visible(entry['name']), 44):<44} rank {_cut(ranks_text, 30)}")
    entries = doc["changes"] or doc["opportunities"]
    if entries:
        lines.append("")
        lines.append(
            "what would help (per step)" if doc["opportunities"] else "predicted (per step)"
        )
        for entry in entries[:12]:
            lines.append(_prediction(entry, doc))
        if len(entries) > 12:
            lines.append(f"  ... {len(entries) - 12} more (--json has them all)")
    return lines


def _prediction(entry: dict[str, Any], doc: dict[str, Any]) -> str:
    line = (
        f"  {_cut(visible(entry['change']), 34):<34} {ms(doc['measured_ms'])} -> "
        f"{ms(entry['predicted_ms'])} ({-entry['saved_share']:+.0%})"
    )
    if entry["predicted_untouched_ms"] is not None:
        line += f" [{ms(entry['predicted_untouched_ms'])}]"
    return line


def top_line(helps: WhatWouldHelp) -> str | None:
    """The run summary's one line: the best opportunity, or None when the answer has none worth
    saying."""
    if helps.verdict != "ok" or not helps.opportunities:
        return None
    best = helps.opportunities[0]
    if best.saved_share < 0.01:
        return None
    return (
        f"what would help: {visible(best.change)}: step {ms(helps.measured_ms)} -> "
        f"{ms(best.predicted_ms)} ({-best.saved_share:+.0%})"
    )


def print_answer(doc: dict[str, Any], notes: Sequence[str] = ()) -> None:
    text = "\n".join(answer_lines(doc, notes)) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
