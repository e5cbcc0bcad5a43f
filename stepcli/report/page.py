"""The report page: one HTML document with inline CSS, SVG and a few lines of JavaScript, nothing
fetched.

It must open from disk, a CI artifact or an e-mail attachment with no network, so it holds no URL at
all: styles and the table-sorting script are inline, charts are inline SVG, file links are relative
to the page.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from stepcli import __version__, fmt
from stepcli.report import GENERATOR, lateness, svg, whatifsection
from stepcli.report.data import ReportData
from stepcli.report.flamegraph import other_section, stacks_section
from stepcli.report.gpu import gpu_section
from stepcli.report.hang import hang_section
from stepcli.report.links import page_href
from stepcli.report.memorysnapshots import snapshot_section
from stepcli.report.wholerun import step_record_section
from stepcli.safetext import html_escape as escape
from stepcli.traces.render.terminal import shorten

# longer operator and kernel names are cut in the middle; the full name is the cell's tooltip
NAME_CHARS = 110

_CSS = """
:root{--fg:#1d2330;--muted:#667085;--bg:#fff;--card:#f6f7f9;--line:#d0d5dd;--accent:#3b5bdb}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg);margin:0}
main{max-width:1040px;margin:0 auto;padding:20px 24px 60px}
h1{font-size:20px;margin:0 0 4px;word-break:break-all}
h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
.sub{color:var(--muted);margin:0 0 12px}
.muted{color:var(--muted);fill:var(--muted)}
.card{background:var(--card);border-radius:8px;padding:10px 14px;margin:8px 0}
.advice{border-left:4px solid #e8590c}
.advice b{display:block}
.ok{border-left:4px solid #2f9e44}
.kpis{display:flex;flex-wrap:wrap;gap:8px}
.kpi{background:var(--card);border-radius:8px;padding:8px 12px;min-width:150px}
.kpi span{display:block;color:var(--muted);font-size:12px}
.kpi b{font-size:17px}
.legend{display:flex;flex-wrap:wrap;gap:14px;font-size:12px;color:var(--muted);margin:4px 0}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-2px}
svg.chart{display:block;max-width:100%;height:auto;font-size:11px}
.axis{fill:var(--muted)} .axis.strong{fill:#c92a2a;font-weight:600}
.grid{stroke:#eaecf0} .tick,.axisline{stroke:#98a2b3}
.line{fill:none;stroke-width:1.3;stroke-linejoin:round} .line.highlight{stroke-width:2.6}
.s0{stroke:#3b5bdb}.s1{stroke:#2f9e44}.s2{stroke:#e8590c}.s3{stroke:#ae3ec9}
.s4{stroke:#1098ad}.s5{stroke:#c92a2a}.s6{stroke:#5c940d}.s7{stroke:#862e9c}
.band.ph-recorded{fill:#d6336c;opacity:.13} .band.ph-warmup{fill:#f59f00;opacity:.16}
.band.ph-foreign{fill:#1c7ed6;opacity:.13} .band.ph-compile{fill:#e8590c;opacity:.13} .band.ph-other{fill:#7048e8;opacity:.13}
.band.ph-after{fill:#868e96;opacity:.16} .dot.ph-after{fill:#868e96} .bandlabel.ph-after{fill:#495057}
.dot{stroke:#fff;stroke-width:.8} .dot.ph-recorded{fill:#d6336c} .dot.ph-warmup{fill:#f59f00}
.dot.ph-foreign{fill:#1c7ed6} .dot.ph-compile{fill:#e8590c} .dot.ph-other{fill:#7048e8} .dot.ph-startup{fill:#495057}
.clip{fill:#495057;font-size:11px}
.clip,.marker-median-label,.marker-p90-label{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.bandlabel{font-size:11px;font-weight:600;opacity:.8} .bandlabel.ph-recorded{fill:#a61e4d}
.bandlabel.ph-warmup{fill:#d9480f} .bandlabel.ph-foreign{fill:#1864ab} .bandlabel.ph-compile{fill:#d9480f} .bandlabel.ph-other{fill:#5f3dc4}
.bar{fill:#748ffc}
.marker-median{stroke:#2f9e44;stroke-width:2} .marker-p90{stroke:#e8590c;stroke-width:2;stroke-dasharray:5 3}
.marker-median-label{fill:#2f9e44;font-weight:600} .marker-p90-label{fill:#e8590c;font-weight:600}
.bd-dataloader{fill:#f59f00}.bd-forward{fill:#4c6ef5}.bd-backward{fill:#7950f2}.bd-optimizer{fill:#12b886}.bd-other{fill:#adb5bd}
.dev-busy{fill:#37b24d}.dev-idle{fill:#ffc9c9}.mem-rss{fill:#74c0fc}.mem-cuda{fill:#b197fc}
.seglabel{fill:#fff;font-size:11px;font-weight:600}
.outline{fill:none;stroke:#c92a2a;stroke-width:2;rx:3}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
th,td{padding:4px 8px;border-bottom:1px solid #eaecf0;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left;white-space:normal;word-break:break-all}
th{background:var(--card);position:sticky;top:0}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th:after{content:" \\2195";color:#98a2b3}
table.sortable th[aria-sort=ascending]:after{content:" \\2191";color:var(--fg)}
table.sortable th[aria-sort=descending]:after{content:" \\2193";color:var(--fg)}
table.hang th,table.hang td{text-align:left;white-space:normal;word-break:normal} table.hang td.where{word-break:break-all}
table.hang th:first-child,table.hang td:first-child{white-space:nowrap}
td.share{min-width:110px} th.shape,td.shape{text-align:left;white-space:normal}
td.share span{display:inline-block;height:8px;background:#748ffc;border-radius:2px;margin-right:6px;vertical-align:0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
dl.facts dt{color:var(--muted)} dl.facts dd{margin:0;word-break:break-all;font-family:ui-monospace,monospace;font-size:12.5px}
code{font-family:ui-monospace,monospace;font-size:12.5px}
footer{color:var(--muted);font-size:12px;margin-top:30px}
"""  # noqa: E501

_JS = """
(function(){
  function key(cell){var v=cell.getAttribute('data-v');return v===null?cell.textContent.trim().toLowerCase():parseFloat(v);}
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th,col){
      th.addEventListener('click',function(){
        var asc=th.getAttribute('aria-sort')!=='ascending';
        table.querySelectorAll('th').forEach(function(o){o.removeAttribute('aria-sort');});
        th.setAttribute('aria-sort',asc?'ascending':'descending');
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){var x=key(a.cells[col]),y=key(b.cells[col]);return (x<y?-1:x>y?1:0)*(asc?1:-1);});
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
  document.querySelectorAll('select[data-shows]').forEach(function(pick){
    function show(){document.querySelectorAll(pick.getAttribute('data-shows')).forEach(function(el){
      el.style.display=el.getAttribute('data-choice')===pick.value?'':'none';});}
    pick.addEventListener('change',show);show();
  });
})();
"""  # noqa: E501

_PHASE_LEGEND = (  # (label, colour, phase codes that show it)
    ("warmup", "#f59f00", "1"),
    ("recorded", "#d6336c", "23"),
    ("program's own profiler", "#1c7ed6", "4"),
    ("after a window (set aside)", "#868e96", "5"),
    ("torch.compile", "#e8590c", "c"),
)
_BREAKDOWN_COLORS = {
    "dataloader": "#f59f00",
    "forward": "#4c6ef5",
    "backward": "#7950f2",
    "optimizer": "#12b886",
    "other": "#adb5bd",
}
_SERIES_COLORS = (
    "#3b5bdb",
    "#2f9e44",
    "#e8590c",
    "#ae3ec9",
    "#1098ad",
    "#c92a2a",
    "#5c940d",
    "#862e9c",
)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<div class="legend">'
        + "".join(f'<span><i style="background:{c}"></i>{escape(t)}</span>' for t, c in items)
        + "</div>"
    )


def _full_name(name: str) -> str:
    """A title attribute with the whole name when the cell shows it shortened (kernel names run to
    500 chars)."""
    return f' title="{escape(name)}"' if len(name) > NAME_CHARS else ""


def _ops_table(rows: Sequence[dict[str, Any]], table_id: str, with_shape: bool = False) -> str:
    if not rows:
        return '<p class="muted">none in the trace</p>'
    top_share = max((r.get("self_share") or 0.0) for r in rows) or 1.0
    head = (
        "<tr><th>Name</th>"
        + ('<th class="shape">Input shapes</th>' if with_shape else "")
        + ("<th>Calls</th><th>Self ms</th><th>Self share</th><th>Total ms</th><th>Avg ms</th></tr>")
    )
    body = []
    for r in rows:
        share = float(r.get("self_share") or 0.0)
        bar = f'<span style="width:{max(1, int(share / top_share * 60))}px"></span>'
        shape = f'<td class="shape">{escape(str(r.get("shape") or ""))}</td>' if with_shape else ""
        body.append(
            f"<tr><td{_full_name(str(r['name']))}>{escape(shorten(str(r['name']), NAME_CHARS))}"
            f"</td>{shape}"
            f'<td data-v="{int(r["calls"])}">{int(r["calls"]):,}</td>'
            f'<td data-v="{r["self_ms"]:.6f}">{r["self_ms"]:,.3f}</td>'
            f'<td class="share" data-v="{share:.6f}">{bar}{share * 100:.1f}%</td>'
            f'<td data-v="{r["total_ms"]:.6f}">{r["total_ms"]:,.3f}</td>'
            f'<td data-v="{r["avg_ms"]:.6f}">{r["avg_ms"]:,.4f}</td></tr>'
        )
    return (
        f'<table class="sortable" '
        f'id="{table_id}"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    )


def _kpis(data: ReportData) -> str:
    items: list[tuple[str, str]] = []
    for label, stats in data.stats:
        items.append((f"{label}: median", fmt.ms(stats["median"])))
        items.append((f"{label}: p90", fmt.ms(stats["p90"])))
    # the terminal's and --json's `after a window` count, over the same processes
    if data.after_window:
        items.append(("set aside after a window", fmt.plural(data.after_window, "step")))
    steps = max((len(p.steps) for p in data.processes), default=0)
    if steps:
        items.append(
            (
                "steps measured",
                f"{steps:,}"
                + (f" × {len(data.processes)} processes" if len(data.processes) > 1 else ""),
            )
        )
    if data.breakdowns:
        parts = {k: sum(b.get(k, 0.0) for _, b in data.breakdowns) for k in svg.BREAKDOWN_ORDER}
        total = sum(parts.values())
        if total:
            top = max(parts, key=lambda k: parts[k])
            items.append(("largest phase", f"{top} {parts[top] / total:.0%}"))
    if data.device:
        items.append(("device busy", f"{data.device['busy_share']:.0%}"))
    return (
        '<div class="kpis">'
        + "".join(
            f'<div class="kpi"><span>{escape(a)}</span><b>{escape(b)}</b></div>' for a, b in items
        )
        + "</div>"
    )


def render(data: ReportData, report_path: str) -> str:
    """The whole page as one string."""
    base = os.path.dirname(os.path.abspath(report_path))
    sections = (
        _header(data),
        # stepcli/report/hang.py: '' without a hang
        [hang_section(data.hang, base, data.exit_status)],
        _advice(data),
        _step_times(data),
        _distribution(data),
        [step_record_section(data.step_record, data.triggered)],  # stepcli/report/wholerun.py
        _breakdown(data),
        [
            whatifsection.section(data.what_would_help, _BREAKDOWN_COLORS)
        ],  # stepcli/report/whatifsection.py: '' without it
        # stepcli/report/lateness.py: '' without collectives on 2+ ranks
        [lateness.section(data.culprit)],
        _operators(data),
        _memory(data),
        _facts(data, base),
        _notes(data),
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        + GENERATOR
        + f"<title>{escape(data.title)}</title><style>{_CSS}</style></head><body><main>"
        + "\n".join(part for section in sections for part in section)
        + "\n<footer>Generated by stepcli report.</footer>"
        + f"</main><script>{_JS}</script></body></html>\n"
    )


def _header(data: ReportData) -> list[str]:
    return [
        f"<h1>{escape(data.title)}</h1>",
        f'<p class="sub">stepcli {escape(__version__)} · self-contained page: no network, nothing '
        f"to install</p>",
        _kpis(data),
    ]


def _advice(data: ReportData) -> list[str]:
    """The advice the run summary carries, one card per rule that fired."""
    parts = ['<h2 id="advice">Advice</h2>']
    for item in data.advice:
        parts.append(
            f'<div class="card advice" '
            f'data-rule="{escape(item.rule)}"><b>{escape(item.title)}</b>{escape(item.evidence)} '
            f'<span class="muted">(threshold {escape(item.threshold)})</span><br>'
            f"{escape(item.suggestion)}</div>"
        )
    if not data.advice:
        parts.append(
            '<div class="card ok">No rule fired: nothing in these numbers crosses an advice '
            "threshold.</div>"
        )
    return parts


def _step_times(data: ReportData) -> list[str]:
    """Every process's step time over the run, with its legend and a note on what is shaded or
    clipped."""
    parts = ['<h2 id="steps">Step time over the run</h2>']
    if not data.processes:
        return [*parts, '<p class="muted">No step times: the inputs hold no steps.</p>']
    several = len(data.processes) > 1
    curves = [
        svg.Curve(
            p.label, p.steps, p.values_ms, p.phases, highlight=p.label == data.slowest and several
        )
        for p in data.processes
    ]
    parts.append(svg.timeline_chart(curves))
    legend = (
        [(p.label, _SERIES_COLORS[i % 8]) for i, p in enumerate(data.processes)] if several else []
    )
    present = {code for p in data.processes for code in set(p.phases)}
    phases = [(label, colour) for label, colour, codes in _PHASE_LEGEND if present & set(codes)]
    if present - set("01234c"):
        phases.append(("other phases", "#7048e8"))
    if any(p.steps and p.steps[0] == 0 for p in data.processes):
        phases.insert(0, ("start-up step", "#495057"))
    parts.append(_legend(legend + phases))
    note = "Shaded: the profiler's warmup and recorded steps" + (
        ", and steps in which torch compiled." if "c" in present else "."
    )
    top = svg.timeline_axis_max(curves)
    clipped = sum(
        1 for p in data.processes for s, v in zip(p.steps, p.values_ms) if v > top and s != 0
    )
    if clipped:
        note += f" {clipped:,} step(s) above {fmt.ms(top)} are clipped at the top edge."
    longest = max(len(p.steps) for p in data.processes)
    if longest > svg.MAX_POINTS:
        note += (
            f" {longest:,} steps per process drawn as a min/max envelope of {svg.MAX_POINTS // 2} "
            f"buckets (every spike kept)."
        )
    return [*parts, f'<p class="muted">{escape(note)}</p>']


def _distribution(data: ReportData) -> list[str]:
    parts = ['<h2 id="distribution">Step-time distribution</h2>']
    if not data.distribution:
        return [*parts, '<p class="muted">No steps to plot.</p>']
    stats = next(
        s for label, s in data.stats if data.distribution_label.startswith(label.split()[0])
    )
    return [
        *parts,
        svg.histogram_chart(data.distribution, stats["median"], stats["p90"]),
        f'<p class="muted">{escape(data.distribution_label)}: n={stats["count"]:,}, median '
        f"{escape(fmt.ms(stats['median']))}, p90 {escape(fmt.ms(stats['p90']))}, min "
        f"{escape(fmt.ms(stats['min']))}, max {escape(fmt.ms(stats['max']))}. Bins run to the 99th "
        "percentile; slower steps count in the last bin.</p>",
    ]


def _breakdown(data: ReportData) -> list[str]:
    parts = ['<h2 id="breakdown">Step breakdown (recorded steps, mean per step)</h2>']
    if data.slowest_evidence:  # the terminal's `slowest rank:` line, word for word
        parts.append(
            f'<p id="slowest-rank"><b>Slowest rank:</b> {escape(data.slowest_evidence)}</p>'
        )
    if not data.breakdowns:
        return [*parts, '<p class="muted">No recorded steps with ProfilerStep annotations.</p>']
    device = data.device
    busy = (
        (device["busy_ms"], device["busy_ms"] / device["busy_share"])
        if device and device.get("busy_share")
        else None
    )
    # Outline the straggler (stepcli.traces.analyses.ranks), the rank the terminal and --json name,
    # or none.
    slowest_bar = data.slowest if len(data.breakdowns) > 1 else None
    return [
        *parts,
        svg.breakdown_chart(data.breakdowns, highlight=slowest_bar, device_busy=busy),
        _legend([(k, _BREAKDOWN_COLORS[k]) for k in svg.BREAKDOWN_ORDER]),
        *other_section(data.other_lines),
        *(stacks_section(data.python_stacks, data.stacks_recorded) if data.stacks_known else []),
    ]


def _operators(data: ReportData) -> list[str]:
    parts = [
        '<h2 id="operators">Top CPU operators (recorded steps)</h2>',
        '<p class="muted">Click a column to sort.</p>',
        _ops_table(data.cpu_ops, "cpu-ops"),
    ]
    if data.outside_note:
        parts.append(f'<p class="muted" id="outside-steps">{escape(data.outside_note)}</p>')
    if data.overlap_note:
        parts.append(f'<p class="muted" id="self-share-overlap">{escape(data.overlap_note)}.</p>')
    if data.kernels:
        parts += ['<h2 id="kernels">Top device kernels</h2>', _ops_table(data.kernels, "kernels")]
    parts.append(gpu_section(data.device, data.device_ranks))
    if data.shape_ops:
        parts += [
            '<h2 id="shapes">CPU operators by input shape</h2>',
            _ops_table(data.shape_ops, "shape-ops", True),
        ]
    return parts


def _memory(data: ReportData) -> list[str]:
    parts = ['<h2 id="memory">Memory</h2>']
    peaks = any(rss or cuda for _, rss, cuda in data.memory_peaks)
    if peaks:
        parts.append(svg.memory_peaks_chart(data.memory_peaks))
    if data.memory_curves:
        parts += [
            svg.memory_curve_chart(
                data.memory_curves, title="Allocated memory over the recorded window"
            ),
            _legend(
                [(label, _SERIES_COLORS[i % 8]) for i, (label, _) in enumerate(data.memory_curves)]
            ),
            '<p class="muted">Allocated tensor memory during the recorded window '
            "(--profile-memory).</p>",
        ]
    elif not peaks:
        parts.append(
            '<p class="muted">No memory measured (run with stepcli run; add --profile-memory for a '
            "curve).</p>"
        )
    parts.append(
        snapshot_section(data.out_dir, data.memory_snapshots)
    )  # stepcli/report/memorysnapshots.py: "" without oom-*.pickle
    return parts


def _facts(data: ReportData, base: str) -> list[str]:
    """The run's facts, and its trace files as links relative to the page."""
    parts = ['<h2 id="facts">Run</h2><dl class="facts">']
    for label, value in data.facts:
        parts.append(f"<dt>{escape(label)}</dt><dd>{escape(value)}</dd>")
    for label, path in data.files:
        parts.append(
            f'<dt>{escape(label)}</dt><dd><a href="{page_href(path, base)}">{escape(path)}</a></dd>'
        )
    parts.append("</dl>")
    if data.files:
        parts.append(
            '<p class="muted">Open a trace in Perfetto (ui.perfetto.dev) or '
            "<code>chrome://tracing</code> as it is, "
            "or summarize it with <code>stepcli table</code>.</p>"
        )
    return parts


def _notes(data: ReportData) -> list[str]:
    if not data.notes:
        return []
    return [
        '<h2 id="notes">Notes</h2>',
        *(f'<div class="card">{escape(note)}</div>' for note in data.notes),
    ]
