"""report.html's "Whole run" section: each process's step-time distribution and its slow steps over
the whole run, and the windows --capture-on-slow recorded, from the run summary's `step_record` and
`triggered` (built by stepcli/runfolder/steprecordreader.py from the compact records every process
leaves)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepcli import fmt
from stepcli.safetext import html_escape as escape
from stepcli.steptimes import slowest_first

if TYPE_CHECKING:
    from stepcli.runfolder.summaryfile import StepRecord

_W, _H = 360, 60
_ROWS = 16  # processes drawn; with more, the slowest at p99


def step_record_section(records: list[StepRecord], triggered: list[dict[str, Any]]) -> str:
    """The section's HTML, or "" when the run left no record."""
    records = [r for r in records if r.ms.get("count")]
    if not records:
        return ""
    parts = ['<h2 id="whole-run">Whole run: every step, every rank</h2>']
    parts.append(
        '<p class="muted">From each process\'s compact record: percentiles from a log histogram '
        "(within about 5%), "
        "the slowest step and the mean of each stretch of steps over time. The percentiles are of "
        "every step but the first (start-up), profiled steps included, unlike the untouched steps' "
        "median above.</p>"
    )
    parts.append(
        "<table><tr><th>process</th><th>steps</th><th>p50</th><th>p90</th><th>p99</th><th>max</th>"
    )
    parts.append(
        "<th>over the run (longest per stretch, mean dashed)</th><th>longest steps</th></tr>"
    )
    shown = slowest_first(records, _ROWS)
    for record in shown:
        ms = record.ms
        cells = [f'<span style="white-space:nowrap">{escape(str(record.worker))}</span>']
        cells.append(f"{record.steps:,}")
        cells += [_ms(ms.get(k)) for k in ("p50", "p90", "p99", "max")]
        cells.append(_sparkline(record.blocks))
        slow = sorted(record.slowest, key=lambda s: -s[1])[:3]
        cells.append("<br>".join(escape(f"{step} ({fmt.ms(us / 1000)})") for step, us in slow))
        parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    if len(records) > len(shown):
        parts.append(
            f'<p class="muted">{len(records) - len(shown)} more processes (faster at p99) not '
            f"drawn.</p>"
        )
    if triggered:
        parts.append("<h3>Captures triggered by slow steps (--capture-on-slow)</h3><ul>")
        for t in triggered:
            who = f"rank {t['rank']} " if isinstance(t.get("rank"), int) else ""
            done = (
                "recorded"
                if t.get("recorded") is not False
                else f"NOT recorded ({t.get('reason')}), placed"
            )
            parts.append(
                f"<li>{escape(str(t.get('worker')))}: steps "
                f"{escape(str(t.get('first_step')))}-{escape(str(t.get('last_step')))} "
                f"{escape(done)} after {escape(who)}step {escape(str(t.get('step')))} took "
                f"{escape(_ms(t.get('ms')))} (baseline {escape(_ms(t.get('baseline_ms')))}, rule "
                f"{escape(str(t.get('rule')))})</li>"
            )
        parts.append("</ul>")
    return "\n".join(parts)


def _ms(value: Any) -> str:
    """A duration in the units the rest of the page uses (fmt.ms: `12.3 ms`, `16.07 s`)."""
    return fmt.ms(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _sparkline(raw: list[tuple[Any, Any, Any]]) -> str:
    """The blocks' max and mean over the run (a block of items not numbers is left out)."""
    blocks = [b for b in raw if all(isinstance(x, (int, float)) for x in b)]
    blocks = blocks[1:] or blocks  # the first stretch holds start-up
    if not blocks:
        return ""
    top = max(max(b[1] for b in blocks), 1)
    last = max(blocks[-1][0], 1)

    def points(index: int) -> str:
        return " ".join(
            f"{b[0] / last * _W:.1f},{_H - b[index] / top * (_H - 4):.1f}" for b in blocks
        )

    return (
        f'<svg class="whole-run" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">'
        f'<polyline fill="none" stroke="#e03131" stroke-width="1.2" points="{points(1)}"/>'
        f'<polyline fill="none" stroke="#1c7ed6" stroke-dasharray="3 2" points="{points(2)}"/>'
        f"<title>max {top / 1000:.1f} ms</title></svg>"
    )
