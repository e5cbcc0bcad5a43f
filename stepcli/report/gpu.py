"""The report's GPU section: where each rank's device time goes per recorded step (a stacked bar
that adds up to the step), idle time by cause, and launch statistics; then the same parts step by
step, for the job (the mean over ranks) or one rank picked from a list. It reads the `device`
figures of the trace summary or run summary (stepcli.traces.analyses.device, .launches;
docs/concepts/gpu.md) and computes nothing new."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from stepcli import fmt
from stepcli.safetext import html_escape as escape


def _tip(text: str) -> str:
    """A tooltip of several lines: each line escaped (control characters from traces shown), the
    line breaks kept."""
    return "\n".join(escape(line) for line in text.split("\n"))


# The parts of a step, in bar order; together they are the whole step (docs/concepts/gpu.md):
# compute alone, communication with compute beside it, communication alone (exposed), memory alone,
# and idle time by cause.
SEGMENTS = (
    ("compute only", "compute", "#4c6ef5"),
    ("overlapped comm", "overlap", "#15aabf"),
    ("exposed comm", "exposed", "#e8590c"),
    ("memory only", "memory", "#ae3ec9"),
    ("idle: host wait", "host", "#ffa8a8"),
    ("idle: kernel wait", "kernel", "#ffd8a8"),
    ("idle: other", "other", "#dee2e6"),
)
_CSS = "".join(f".gpu-{key}{{fill:{colour}}}" for _label, key, colour in SEGMENTS)
_BAR_W, _LABEL_W, _ROW_H = 760, 110, 26
# The per-step chart: plot size, and how many ranks get one (each is pre-drawn: a page must stay
# small).
_STEPS_W, _STEPS_H, _STEPS_LEFT, _STEPS_BOTTOM = 800, 170, 56, 22
MAX_STEP_CHARTS = 64


def step_parts(device: Mapping[str, Any]) -> dict[str, float]:
    """Milliseconds per step of each SEGMENTS part (they add up to the measured step time)."""
    overlap = device["comm_ms"] - device["exposed_comm_ms"]
    busy_compute_or_comm = device["compute_ms"] + device["comm_ms"] - overlap
    idle = device["idle_by_cause"]
    return {
        "compute": device["compute_ms"] - overlap,
        "overlap": overlap,
        "exposed": device["exposed_comm_ms"],
        "memory": max(device["busy_ms"] - busy_compute_or_comm, 0.0),
        "host": idle["host_wait_ms"],
        "kernel": idle["kernel_wait_ms"],
        "other": max(idle["other_ms"], 0.0),
    }


def _bars(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    height = _ROW_H * len(rows) + 8
    out = [
        f'<svg class="chart gpu-bars" viewBox="0 0 {_LABEL_W + _BAR_W + 10} {height}" '
        f'width="{_LABEL_W + _BAR_W + 10}" height="{height}" role="img" aria-label="device time '
        f'per step">'
    ]
    for index, (label, device) in enumerate(rows):
        parts = step_parts(device)
        total = sum(parts.values()) or 1.0
        y = 4 + index * _ROW_H
        out.append(f'<text class="axis" x="0" y="{y + 16}">{escape(label)}</text>')
        x = float(_LABEL_W)
        for name, key, _colour in SEGMENTS:
            width = parts[key] / total * _BAR_W
            if width <= 0:
                continue
            tip = f"{name}: {parts[key]:.3f} ms/step ({parts[key] / total:.1%})"
            out.append(
                f'<rect class="seg gpu-{key}" x="{x:.2f}" y="{y}" width="{width:.2f}" '
                f'height="{_ROW_H - 6}">'
                f"<title>{_tip(tip)}</title></rect>"
            )
            if width > 46:
                out.append(
                    f'<text class="seglabel" x="{x + 4:.2f}" '
                    f'y="{y + 14}">{parts[key] / total:.0%}</text>'
                )
            x += width
    out.append("</svg>")
    return "".join(out)


def _nice_ceiling(value: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, ... 8 times a power of ten) at or above `value`:
    the chart's top, so its bars fill most of the height."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * power >= value)


def _steps_chart(choice: str, steps: Sequence[Mapping[str, Any]], top: float, shown: bool) -> str:
    """One stacked column per recorded step (height: the step's milliseconds), parts in SEGMENTS
    order from the bottom; `top`: the y scale's maximum, the same for every chart so ranks compare
    at a glance."""
    width, height = _STEPS_LEFT + _STEPS_W + 8, _STEPS_H + _STEPS_BOTTOM + 8
    style = "" if shown else ' style="display:none"'
    out = [
        f'<svg class="chart gpu-steps" data-choice="{escape(choice)}"{style} viewBox="0 0 {width} '
        f'{height}" width="{width}" height="{height}" role="img" aria-label="device time per step: '
        f'{escape(choice)}">'
    ]
    scale = _STEPS_H / top
    for tick in (0.0, top / 2, top):
        y = 4 + _STEPS_H - tick * scale
        out.append(
            f'<line class="grid" x1="{_STEPS_LEFT}" x2="{_STEPS_LEFT + _STEPS_W}" y1="{y:.1f}" '
            f'y2="{y:.1f}"/>'
        )
        out.append(
            f'<text class="axis" x="{_STEPS_LEFT - 4}" y="{y + 4:.1f}" '
            f'text-anchor="end">{tick:,.4g} ms</text>'
        )
    slot = _STEPS_W / max(len(steps), 1)
    bar = max(min(slot * 0.8, 40.0), 1.0)
    label_every = max(1, math.ceil(34 / slot))
    for index, step in enumerate(steps):
        parts = step_parts(step)
        x = _STEPS_LEFT + index * slot + (slot - bar) / 2
        tip = f"step {step['step']}: {step['step_ms']:.3f} ms" + "".join(
            f"\n{name}: {parts[key]:.3f} ms" for name, key, _colour in SEGMENTS if parts[key] > 0
        )
        out.append(f'<g class="gpu-step" data-step="{step["step"]}"><title>{_tip(tip)}</title>')
        y = 4.0 + _STEPS_H
        for _name, key, _colour in SEGMENTS:
            h = parts[key] * scale
            if h <= 0:
                continue
            y -= h
            out.append(
                f'<rect class="seg gpu-{key}" x="{x:.2f}" y="{y:.2f}" width="{bar:.2f}" '
                f'height="{h:.2f}"/>'
            )
        out.append("</g>")
        if index % label_every == 0:
            out.append(
                f'<text class="axis" x="{x + bar / 2:.1f}" y="{4 + _STEPS_H + 15}" '
                f'text-anchor="middle">'
                f"{step['step']}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _per_step(device: Mapping[str, Any], ranks: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The per-step charts with their picker: the job (mean over ranks per step) and up to
    MAX_STEP_CHARTS ranks."""
    job = device.get("steps") or []
    if not job:
        return ""
    charts = [("job", job)] + [
        (label, d.get("steps") or []) for label, d in ranks[:MAX_STEP_CHARTS]
    ]
    charts = [(label, steps) for label, steps in charts if steps]
    top = _nice_ceiling(max(s["step_ms"] for _label, steps in charts for s in steps))
    out = ['<h3 id="gpu-steps">Step by step</h3>']
    if len(charts) > 1:
        options = "".join(
            f"<option "
            f'value="{escape(label)}">{escape(label)}{" (mean over ranks)" if i == 0 else ""}'
            f"</option>"
            for i, (label, _steps) in enumerate(charts)
        )
        out.append(
            '<p class="muted"><label>Show <select id="gpu-step-choice" data-shows="svg.gpu-steps">'
            f"{options}</select></label> Hover a column for its milliseconds.</p>"
        )
        if len(ranks) > MAX_STEP_CHARTS:
            out.append(
                f'<p class="muted">The first {MAX_STEP_CHARTS} of {len(ranks)} ranks have a chart '
                f"here; "
                "<code>stepcli table --json</code> has every rank's <code>device.steps</code>.</p>"
            )
    out += [_steps_chart(label, steps, top, i == 0) for i, (label, steps) in enumerate(charts)]
    return "".join(out)


def _legend() -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span><i style="background:{c}"></i>{escape(label)}</span>'
            for label, _k, c in SEGMENTS
        )
        + "</div>"
    )


def _launch_table(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    head = (
        "<tr><th>process</th><th>kernels / step</th><th>launch delay "
        "p50</th><th>p90</th><th>p99</th><th>CPU µs / kernel</th><th>shorter than "
        "launch</th><th>graph replays / step</th></tr>"
    )
    body = []
    for label, device in rows:
        launch = device.get("launch")
        if not launch:
            continue
        delay = launch["delay_us"]
        body.append(
            f"<tr><td>{escape(label)}</td><td>{launch['kernels_per_step']:,.1f}</td>"
            + "".join(f"<td>{escape(fmt.us(delay[q]))}</td>" for q in ("p50", "p90", "p99"))
            + f"<td>{launch['cpu_launch_us_per_kernel']:.1f}"
            f"</td><td>{launch['short_kernel_share']:.1%}"
            f"</td><td>{launch['graph_replays_per_step']:g}</td></tr>"
        )
    if not body:
        return (
            '<p class="muted">No launch call in the traces links to its device work (no '
            "correlation ids).</p>"
        )
    return f'<table id="gpu-launches"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _num(value: float | None, fmt: str = "{:,.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _transfer_tables(device: Mapping[str, Any]) -> str:
    """The job's collectives (per type and size) and host-device copies (per direction and host
    memory)."""
    out = ['<h3 id="gpu-collectives">Collectives and copies</h3>']
    rows = [
        f"<tr><td>{escape(c['collective'])}</td><td>{escape(c['algorithm'] or '-')}</td>"
        f"<td>{escape(c['protocol'] or '-')}</td><td>{escape(c['dtype'] or '-')}</td>"
        f"<td>{_num(c['bytes'], '{:,.0f}')}</td><td>{_num(c['ranks'], '{:.0f}')}</td>"
        f"<td>{c['calls_per_step']:,.1f}</td><td>{c['ms_per_step']:,.3f}</td>"
        f"<td>{_num(c['algbw_gbps'])}</td><td>{_num(c['busbw_gbps'])}</td></tr>"
        for c in device.get("collectives") or []
    ]
    if rows:
        out.append(
            "<table "
            'id="gpu-collective-table"><thead><tr><th>collective</th><th>algorithm</th><th>protocol</th>'
            "<th>dtype</th><th>bytes</th><th>ranks</th><th>calls / step</th><th>ms / "
            "step</th><th>algbw GB/s</th>"
            f"<th>busbw GB/s</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    copies = [
        f"<tr><td>{escape(c['copy'])}</td><td>{escape(c['host_memory'] or '-')}</td>"
        f"<td>{c['calls_per_step']:,.1f}</td><td>{c['ms_per_step']:,.3f}</td>"
        f"<td>{_num(c['bytes_per_step'], '{:,.0f}')}</td><td>{_num(c['gbps'])}</td></tr>"
        for c in device.get("copies") or []
    ]
    if copies:
        out.append(
            '<table id="gpu-copy-table"><thead><tr><th>copy</th><th>host memory</th><th>calls / '
            "step</th>"
            f"<th>ms / step</th><th>bytes / "
            f"step</th><th>GB/s</th></tr></thead><tbody>{''.join(copies)}</tbody></table>"
        )
    if len(out) == 1:
        out.append('<p class="muted">No collective kernels or copies in the recorded steps.</p>')
    return "".join(out)


def gpu_section(device: Mapping[str, Any] | None, ranks: Sequence[Mapping[str, Any]] = ()) -> str:
    """The section's HTML ('' without device figures)."""
    if not device or "compute_ms" not in device:
        return ""
    rows: list[tuple[str, Mapping[str, Any]]] = [("job", device)]
    per_rank = [(str(r["process"]), r["device"]) for r in ranks if r.get("device")]
    if len(per_rank) > 1:
        rows += per_rank
    overlap = device.get("comm_overlap_share")
    facts = (
        f"compute {device['compute_share']:.1%} of step time, communication "
        f"{device['comm_share']:.1%}"
        + (
            f" ({overlap:.1%} of it beside computation, {device['exposed_comm_ms']:.2f} ms/step "
            f"exposed), "
            if overlap is not None
            else ", "
        )
        + f"memory {device['memory_share']:.1%}, idle {device['idle_share']:.1%}."
    )
    if device.get("flops_per_step") is not None:
        from stepcli.traces.render.gpusection import pace_text

        facts += (
            f" {device['flops_per_step']:.3g} FLOPs per step, "
            f"{device['achieved_flops_per_s'] / 1e12:.3g} TFLOP/s"
        )
        if device.get("mfu") is not None:
            dtype = str(device.get("mfu_dtype") or "bf16").upper()
            facts += f", MFU {device['mfu']:.1%} of the dense {dtype} peak"
            facts += (
                " (dtype assumed)"
                if device.get("mfu_dtype_assumed")
                else " (dtype of its GEMM kernels)"
            )
        facts += pace_text(device) + "."
    return "".join(
        [
            f"<style>{_CSS}</style>",
            '<h2 id="gpu">Device time (recorded steps, mean per step)</h2>',
            f'<p class="muted">{escape(facts)} Hover a segment for its milliseconds.</p>',
            _bars(rows),
            _legend(),
            _per_step(device, rows[1:]),
            '<h3 id="gpu-launch-stats">Kernel launches</h3>',
            _launch_table(rows),
            _transfer_tables(device),
        ]
    )
