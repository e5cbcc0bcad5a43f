"""The report's "Arrival at collectives" section: per recorded step, how late each rank arrived at
the collectives it was last at (stepcli.traces.analyses.culprit), the culprit named with its cause
and evidence, and each rank's figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stepcli.fmt import ms as fmt_ms
from stepcli.report.svg import WIDTH, nice_max
from stepcli.safetext import html_escape as escape
from stepcli.traces.analyses.culpritwords import CAUSE_WORDS, no_culprit_reason

COLORS = ("#3b5bdb", "#e8590c", "#2f9e44", "#ae3ec9", "#1098ad", "#c92a2a", "#5c940d", "#862e9c")
_MAX_STEPS = 200  # bars drawn; later steps are left out (said under the chart)


def lateness_chart(per_step: Sequence[Mapping[str, Any]], ranks: Sequence[str], title: str) -> str:
    """Grouped bars: per step, one bar per rank, its lateness (ms) at the collectives it arrived
    last at."""
    height, left, right, top, bottom = 240, 64, 16, 14, 34
    steps = list(per_step)[:_MAX_STEPS]
    peak = nice_max(max((v for s in steps for v in s["lateness_ms"].values()), default=0.0) or 1.0)
    inner_w, inner_h = WIDTH - left - right, height - top - bottom
    slot = inner_w / max(len(steps), 1)
    bar = max(1.0, slot * 0.8 / max(len(ranks), 1))
    out = []
    for tick in range(5):
        value = peak * tick / 4
        y = top + inner_h - inner_h * tick / 4
        out.append(
            f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(
            f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" '
            f'text-anchor="end">{escape(fmt_ms(value))}</text>'
        )
    for i, step in enumerate(steps):
        x0 = left + i * slot + slot * 0.1
        for j, rank in enumerate(ranks):
            ms = float(step["lateness_ms"].get(rank, 0.0))
            h = inner_h * min(ms, peak) / peak
            out.append(
                f'<rect class="late" data-rank="{escape(rank)}" data-step="{step["step"]}" '
                f'x="{x0 + j * bar:.1f}" y="{top + inner_h - h:.1f}" width="{bar:.1f}" '
                f'height="{max(h, 0.0):.1f}" fill="{COLORS[j % len(COLORS)]}"><title>step '
                f"{step['step']}, rank {escape(rank)}: "
                f"{escape(fmt_ms(ms))} late</title></rect>"
            )
        if len(steps) <= 40 or i % max(1, len(steps) // 20) == 0:
            out.append(
                f'<text class="axis" x="{x0 + slot * 0.4:.1f}" y="{height - bottom + 16}" '
                f'text-anchor="middle">'
                f"{step['step']}</text>"
            )
    out.append(
        f'<text class="axis" x="{WIDTH / 2:.0f}" y="{height - 4}" text-anchor="middle">step</text>'
    )
    return (
        f'<svg class="chart" id="lateness-chart" viewBox="0 0 {WIDTH} {height}" width="100%" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(out)
        + "</svg>"
    )


def _rank_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "<tr><th>rank</th><th>last at</th><th>lateness ms/step</th><th>wait caused "
        "ms/step</th><th>waited ms/step</th></tr>"
    )
    body = "".join(
        f"<tr><td>{row['rank']}</td><td>{row['times_last']} ({row['last_share']:.0%})</td>"
        f"<td>{row['lateness_ms_per_step']:.2f}</td><td>{row['wait_caused_ms_per_step']:.2f}</td>"
        f"<td>{row['waited_ms_per_step']:.2f}</td></tr>"
        for row in rows
    )
    return f'<table id="culprit-ranks"><thead>{head}</thead><tbody>{body}</tbody></table>'


def section(culprit: Mapping[str, Any] | None) -> str:
    """The whole section, or '' when the inputs hold no collectives on two or more ranks."""
    if not culprit or not culprit.get("collectives") or not culprit.get("per_step"):
        return ""
    ranks = [str(row["rank"]) for row in culprit.get("ranks", [])]
    error = culprit["alignment"]["error_ms"]
    parts = ['<h2 id="culprit">Arrival at collectives</h2>']
    found = culprit.get("culprit")
    if found:
        parts.append(
            f'<div class="card advice" id="culprit-finding"><b>Rank {found["rank"]} holds the '
            f"others back: "
            f"{escape(CAUSE_WORDS[found['cause']])}</b> {escape(found['evidence'])}</div>"
        )
    else:
        parts.append(
            f'<div class="card ok" id="culprit-finding">No culprit: '
            f"{escape(no_culprit_reason(culprit))}.</div>"
        )
    parts.append(lateness_chart(culprit["per_step"], ranks, "Lateness at collectives per step"))
    legend = "".join(
        f'<span><i style="background:{COLORS[j % len(COLORS)]}"></i>rank {escape(r)}</span>'
        for j, r in enumerate(ranks)
    )
    parts.append(f'<div class="legend">{legend}</div>')
    note = (
        f"Per step, each rank's lateness summed over the collectives it arrived last at (the table "
        f"below says at how many, of {culprit['collectives']} matched across the ranks): its "
        f"arrival minus the next-latest rank's, "
        + (
            "on the one clock of their machine."
            if culprit["alignment"].get("one_clock")
            else f"on clocks aligned by the collectives (alignment error {error:.2f} ms)."
        )
    )
    if len(culprit["per_step"]) > _MAX_STEPS:
        note += f" The first {_MAX_STEPS} steps are drawn."
    parts.append(f'<p class="muted">{escape(note)}</p>')
    parts.append(_rank_table(culprit.get("ranks", [])))
    return "\n".join(parts)
