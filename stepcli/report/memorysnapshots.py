"""The report's CUDA memory snapshot section: for each `oom-*.pickle` of the run (`stepcli run
--memory`), the moment it ran out of memory, allocated and reserved memory per step, the split at
that moment, the top sites and the advice, from the same analysis as `stepcli memory`."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import Any

from stepcli.advice.memoryadvice import advise, size
from stepcli.errors import StepcliError
from stepcli.fmt import size as fmt_bytes
from stepcli.report.svg import WIDTH, nice_max
from stepcli.safetext import html_escape as escape
from stepcli.snapshots.categories import CATEGORIES, LABELS
from stepcli.snapshots.snapshotfigures import analyze
from stepcli.snapshots.snapshotreader import find_snapshots, load_snapshot

MAX_REPORT_SNAPSHOT_BYTES = 256 << 20  # larger snapshots are named, not read, at the end of a run
SPLIT_COLORS = {
    "parameters": "#3b5bdb",
    "gradients": "#0ca678",
    "optimizer_state": "#f08c00",
    "activations": "#e03131",
    "other": "#868e96",
}
LINES = (
    ("start_allocated_bytes", "allocated at step start", "#3b5bdb"),
    ("peak_allocated_bytes", "peak allocated", "#e03131"),
    ("peak_reserved_bytes", "peak reserved", "#868e96"),
)


def snapshot_section(out_dir: str | None, names: Sequence[str] | None = None) -> str:
    """The section's HTML, or "" when the run wrote no snapshot (the page then has no such section).
    `names`: the snapshot files the run summary lists (those this run's processes wrote); only a
    summary from before it listed them (None) has the folder's `oom-*`/`memory-*` files read
    instead. A link is never followed."""
    if not out_dir or not os.path.isdir(out_dir):
        return ""
    if names is not None:
        files = [
            os.path.join(out_dir, n)
            for n in names
            if os.path.basename(n) == n and not n.startswith(".")
        ]
    else:
        try:
            files = find_snapshots(out_dir)
        except StepcliError:
            return ""
    if not files:
        return ""
    parts = ['<h2 id="memory-snapshots">CUDA memory snapshots</h2>']
    for path in files:
        name = escape(os.path.basename(path))
        try:
            info = os.lstat(path)
        except OSError:  # gone since it was listed: the page goes on without it
            continue
        if not stat.S_ISREG(info.st_mode):  # a link (to a file only root may read, say) is not read
            continue
        bytes_on_disk = info.st_size
        if bytes_on_disk > MAX_REPORT_SNAPSHOT_BYTES:
            parts.append(
                f'<p class="muted">{name}: {size(bytes_on_disk)}, read it with <code>stepcli '
                f"memory</code>.</p>"
            )
            continue
        try:
            report = analyze(load_snapshot(path), top=5)
        except StepcliError as exc:
            parts.append(f'<p class="muted">{escape(exc.message)}</p>')
            continue
        parts.append(_one(name, report))
    return "\n".join(parts)


def _one(name: str, report: dict[str, Any]) -> str:
    moment, request = report["moment"], report["oom"]
    step = f"step {moment['step']}" if moment["step"] is not None else "an unknown step"
    what = "Out of memory" if moment["kind"] == "oom" else "Peak memory"
    head = f"{what} at {step}, in {moment['phase']}"
    if request:
        head += (
            f": asked for {size(request['requested_bytes'])}, "
            f"{size(request.get('device_free_bytes'))} free on the device"
        )
    out = [
        f'<div class="card memory-snapshot" data-file="{name}"><b>{escape(name)}: '
        f"{escape(head)}</b><br>"
    ]
    out.append(
        f"{escape(size(moment['allocated_bytes']))} allocated, "
        f"{escape(size(moment['reserved_bytes']))} reserved; largest free block "
        f"{escape(size(report['fragmentation']['largest_free_block_bytes']))}</div>"
    )
    out.append(split_bar(report["split"], moment["allocated_bytes"]))
    if report["steps"]:
        out.append(steps_chart(report["steps"]))
    out.append(_sites_table(report["top_sites"]))
    for item in advise(report):
        out.append(
            f'<div class="card advice" '
            f'data-rule="memory-{escape(item["rule"])}"><b>{escape(item["text"])}</b>'
            f"{escape(item['evidence'])}</div>"
        )
    return "\n".join(out)


def split_bar(split: dict[str, int], allocated: int) -> str:
    """One stacked bar: the split of the allocated memory at the moment, with its legend."""
    total = max(allocated, 1)
    x, rects, legend = 0.0, [], []
    for name in CATEGORIES:
        width = split[name] / total * WIDTH
        if width > 0:
            rects.append(
                f'<rect x="{x:.1f}" y="0" width="{width:.1f}" height="22" '
                f'fill="{SPLIT_COLORS[name]}">'
                f"<title>{escape(LABELS[name])}: {escape(size(split[name]))}</title></rect>"
            )
        x += width
        legend.append(
            f'<span class="split-{name}"><i '
            f'style="background:{SPLIT_COLORS[name]};display:inline-block;width:10px;'
            f'height:10px"></i> {escape(LABELS[name])} {escape(size(split[name]))} '
            f"({split[name] / total:.0%})</span>"
        )
    svg = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} 22" width="100%" role="img" aria-label="memory '
        f'split">{"".join(rects)}</svg>'
    )
    return svg + '<p class="muted">' + " &nbsp; ".join(legend) + "</p>"


def steps_chart(steps: Sequence[dict[str, Any]]) -> str:
    """Allocated at each step's start, its peak, and the reserved peak, one point per step."""
    height, left, right, top, bottom = 200, 74, 16, 12, 30
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    first, last = steps[0]["step"], steps[-1]["step"]
    y_max = nice_max(max(max(row[key] for key, _, _ in LINES) for row in steps) or 1)

    def x_of(step: int) -> float:
        return left + (step - first) / max(last - first, 1) * plot_w

    def y_of(value: float) -> float:
        return top + plot_h - value / y_max * plot_h

    body = []
    for tick in (0.0, y_max / 2, y_max):
        body.append(
            f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{y_of(tick):.1f}" '
            f'y2="{y_of(tick):.1f}"/>'
        )
        body.append(
            f'<text class="axis" x="{left - 6}" y="{y_of(tick) + 4:.1f}" '
            f'text-anchor="end">{escape(fmt_bytes(tick))}</text>'
        )
    for step in sorted({first, last}):
        body.append(
            f'<text class="axis" x="{x_of(step):.1f}" y="{height - 8}" text-anchor="middle">step '
            f"{step}</text>"
        )
    for key, label, colour in LINES:
        points = " ".join(f"{x_of(row['step']):.1f},{y_of(row[key]):.1f}" for row in steps)
        body.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
            f'points="{points}"><title>{escape(label)}</title></polyline>'
        )
    legend = " &nbsp; ".join(
        f'<span style="color:{colour}">&#9632;</span> {escape(label)}' for _, label, colour in LINES
    )
    return (
        f'<svg class="chart memory-steps" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'aria-label="memory per step">{"".join(body)}</svg><p class="muted">{legend}</p>'
    )


def _sites_table(rows: Sequence[dict[str, Any]]) -> str:
    body = []
    for row in rows:
        site = row["site"]
        where = f"{site['file']}:{site['line']} {site['function']}" if site else "<no Python stack>"
        body.append(
            f"<tr><td>{escape(where)}</td><td>{escape(LABELS[row['category']])}</td>"
            f"<td "
            f'data-v="{row["bytes"]}">{escape(size(row["bytes"]))}</td><td>{row["share"]:.0%}'
            f"</td></tr>"
        )
    head = "<tr><th>Allocation site</th><th>Category</th><th>Bytes alive</th><th>Share</th></tr>"
    return (
        f'<table class="sortable '
        f'memory-sites"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    )
