"""The report's "What would help" section: the run summary's `what_would_help`
(stepcli.run.summary.whatifline) as a ranked table of opportunities and the critical path drawn
across the ranks, one row per rank, its segments in order along the step. Computes nothing: an
inconclusive answer shows its reason, never a number."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from stepcli.fmt import ms as fmt_ms
from stepcli.report.svg import WIDTH
from stepcli.safetext import html_escape as escape

if TYPE_CHECKING:
    from stepcli.runfolder.summaryfile import PathSegment, WhatWouldHelp

# a cpu segment takes its phase's colour (the breakdown's)
COLORS = {"collective": "#e8590c", "wait": "#ced4da"}


def section(helps: WhatWouldHelp | None, phase_colors: Mapping[str, str]) -> str:
    if not helps:
        return ""
    parts = ['<h2 id="whatif">What would help</h2>']
    if helps.verdict != "ok":
        parts.append(f'<div class="card">Inconclusive: {escape(str(helps.reason or ""))}</div>')
        return "\n".join(parts)
    measured = helps.measured_ms or 0.0
    parts.append(
        f'<p class="muted">The recorded steps replayed from the traces '
        f"({helps.replay_error or 0:+.1%} off "
        f"the measured {escape(fmt_ms(measured))} a step), then replayed under each change. "
        "<code>stepcli whatif</code> on the output folder gives every figure and takes changes of "
        "your own.</p>"
    )
    rows = []
    for entry in helps.opportunities:
        untouched = entry.predicted_untouched_ms
        rows.append(
            f"<tr><td><code>{escape(entry.change)}"
            f"</code></td><td>{escape(fmt_ms(entry.predicted_ms))}"
            f"</td><td>{escape(fmt_ms(untouched)) if untouched is not None else '-'}"
            f"</td><td>{-entry.saved_share:+.0%}</td></tr>"
        )
    if rows:
        parts.append(
            '<table id="whatif-table"><thead><tr><th>change</th><th>step (profiled)</th>'
            "<th>step (program's pace)</th><th>vs measured</th></tr></thead><tbody>"
            + "".join(rows)
            + "</tbody></table>"
        )
    path = helps.critical_path
    if path and path.segments:
        parts.append(f"<h3>Critical path, {escape(fmt_ms(path.ms))} a step</h3>")
        parts.append(_path_chart(path.segments, path.ms, phase_colors))
    return "\n".join(parts)


def _path_chart(segments: list[PathSegment], total: float, phase_colors: Mapping[str, str]) -> str:
    """One row per rank; each segment a bar at its place along the path, coloured by its phase (a
    collective and a wait by their kind), its name in its title."""
    ranks = sorted(
        {str(s.rank) if s.rank is not None else "process" for s in segments}, key=_rank_key
    )
    row_h, left, right, top = 26, 72, 12, 6
    height = top + row_h * len(ranks) + 22
    inner = WIDTH - left - right
    out = [f'<svg class="chart" id="whatif-path" viewBox="0 0 {WIDTH} {height}" role="img">']
    for k, rank in enumerate(ranks):
        y = top + k * row_h
        label = f"rank {rank}" if rank != "process" else rank
        out.append(f'<text x="{left - 6}" y="{y + 17}" text-anchor="end">{escape(label)}</text>')
        out.append(
            f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{y + 12}" y2="{y + 12}"/>'
        )
    at = 0.0
    for seg in segments:
        rank = str(seg.rank) if seg.rank is not None else "process"
        y = top + ranks.index(rank) * row_h + 3
        x, w = left + inner * at / total if total else left, inner * seg.ms / total if total else 0
        color = (
            phase_colors.get(seg.name, "#868e96")
            if seg.kind == "cpu"
            else COLORS.get(seg.kind, "#868e96")
        )
        title = f"{seg.kind}: {seg.name}, {fmt_ms(seg.ms)} ({seg.share:.0%})"
        out.append(
            f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="18" fill="{color}">'
            f"<title>{escape(title)}</title></rect>"
        )
        if w > 60:
            out.append(
                f'<text x="{x + 4:.1f}" y="{y + 13}" '
                f'fill="{_ink(color)}">{escape(seg.name[: int(w / 7)])}</text>'
            )
        at += seg.ms
    out.append(f'<text x="{left}" y="{height - 4}" class="muted">0</text>')
    out.append(
        f'<text x="{WIDTH - right}" y="{height - 4}" '
        f'text-anchor="end">{escape(fmt_ms(total))}</text>'
    )
    out.append("</svg>")
    shown = [(name, color) for name, color in phase_colors.items() if any(
        seg.kind == "cpu" and seg.name == name for seg in segments)]  # fmt: skip
    shown += [
        (kind, color) for kind, color in COLORS.items() if any(seg.kind == kind for seg in segments)
    ]
    legend = " ".join(f'<span><i style="background:{c}"></i>{escape(k)}</span>' for k, c in shown)
    return "\n".join(out) + f'<div class="legend">{legend}</div>'


def _rank_key(rank: str) -> tuple[int, int]:
    return (0, int(rank)) if rank.isdecimal() else (1, 0)


def _ink(fill: str) -> str:
    """Text that reads on `fill`: dark on a light fill, white on a dark one."""
    red, green, blue = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#212529" if 0.299 * red + 0.587 * green + 0.114 * blue > 150 else "#fff"
