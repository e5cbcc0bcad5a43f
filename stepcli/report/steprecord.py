"""report.html's "Whole run" section: each process's step-time distribution and its slow steps over the whole run,
and the windows --capture-on-slow recorded, from the compact records every process leaves (agent/steprecord.py)."""

from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path
from typing import Any

from stepcli.agent.config import STEP_LOG_SUFFIX
from stepcli.run.steprecord import load, slowest_first

_W, _H = 360, 60
_ROWS = 16  # processes drawn; with more, the slowest at p99


def step_record_section(out_dir: str | None) -> str:
    """The section's HTML, or "" when the newest run in the folder left no record."""
    run_dir = _newest_run(out_dir)
    if run_dir is None:
        return ""
    records = load(str(run_dir))
    if not records:
        return ""
    parts = ['<h2 id="whole-run">Whole run: every step, every rank</h2>']
    parts.append(
        '<p class="muted">From each process\'s compact record: percentiles from a log histogram (within about 5%), '
        "the slowest step and the mean of each stretch of steps over time.</p>"
    )
    parts.append("<table><tr><th>process</th><th>steps</th><th>p50</th><th>p90</th><th>p99</th><th>max</th>")
    parts.append("<th>over the run (slowest per stretch, mean dashed)</th><th>slowest steps</th></tr>")
    shown = slowest_first([r for r in records if r["ms"].get("count")], _ROWS)
    for record in shown:
        ms = record["ms"]
        cells = [
            f'<span style="white-space:nowrap">{escape(str(record["worker"]))}</span>',
            f"{int(record['steps']):,}",
        ]
        cells += [f"{ms[k]:.1f} ms" if k in ms else "-" for k in ("p50", "p90", "p99", "max")]
        cells.append(_sparkline(record))
        slow = sorted(record["slowest"], key=lambda s: -s[1])[:3]
        cells.append("<br>".join(escape(f"{step} ({us / 1000:.1f} ms)") for step, us in slow))
        parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    if len(records) > len(shown):
        parts.append(f'<p class="muted">{len(records) - len(shown)} more processes (faster at p99) not drawn.</p>')
    triggered = _triggered(run_dir)
    if triggered:
        parts.append("<h3>Captures triggered by slow steps (--capture-on-slow)</h3><ul>")
        for worker, window in triggered:
            t = window["trigger"]
            parts.append(
                f"<li>{escape(worker)}: steps {window['first_step']}-{window['last_step']} recorded after "
                f"{escape(_who(t))}step {escape(str(t.get('step')))} took {escape(_ms(t.get('ms')))} "
                f"(baseline {escape(_ms(t.get('baseline_ms')))}, rule {escape(str(t.get('rule')))})</li>"
            )
        parts.append("</ul>")
    return "\n".join(parts)


def _ms(value: Any) -> str:
    return f"{value:.1f} ms" if isinstance(value, (int, float)) else "?"


def _who(trigger: dict[str, Any]) -> str:
    return f"rank {trigger['rank']} " if isinstance(trigger.get("rank"), int) else ""


def _sparkline(record: dict[str, Any]) -> str:
    blocks = [b for b in record["blocks"] if isinstance(b, list) and len(b) == 3][1:] or record["blocks"]
    if not blocks:
        return ""
    top = max(max(b[1] for b in blocks), 1)
    last = max(blocks[-1][0], 1)

    def points(index: int) -> str:
        return " ".join(f"{b[0] / last * _W:.1f},{_H - b[index] / top * (_H - 4):.1f}" for b in blocks)

    return (
        f'<svg class="whole-run" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">'
        f'<polyline fill="none" stroke="#e03131" stroke-width="1.2" points="{points(1)}"/>'
        f'<polyline fill="none" stroke="#1c7ed6" stroke-dasharray="3 2" points="{points(2)}"/>'
        f"<title>max {top / 1000:.1f} ms</title></svg>"
    )


def _newest_run(out_dir: str | None) -> Path | None:
    if not out_dir or not os.path.isdir(out_dir):
        return None
    runs = [p for p in Path(out_dir, ".stepcli").glob("*/") if p.is_dir()]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def _triggered(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(run_dir.glob(f"*{STEP_LOG_SUFFIX}")):
        try:
            log = json.loads(path.read_text())
            for window in log.get("windows") or []:
                if isinstance(window, dict) and isinstance(window.get("trigger"), dict):
                    found.append((str(log.get("worker")), window))
        except (OSError, ValueError, AttributeError):
            continue
    return sorted(found, key=lambda item: (item[1].get("first_step", 0), item[0]))
