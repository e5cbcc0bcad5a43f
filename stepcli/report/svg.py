"""Inline SVG charts for the HTML report, generated as text: nothing to load, nothing to fetch when
the page opens.

Each function returns one `<svg>` element. Colours come from CSS classes defined in the page
template, so the charts follow the page's light or dark scheme. Long curves are reduced to a min/max
envelope per pixel column, which keeps every spike visible while bounding the document size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stepcli import fmt
from stepcli.safetext import html_escape as escape

WIDTH = 960
MAX_POINTS = 1200  # per curve; more than the chart has pixel columns

# Step phases as the step log writes them (stepcli.agent.schedule and tracker), and how the charts
# name them.
PHASE_NAMES = {
    "0": "untouched",
    "1": "warmup",
    "2": "recorded",
    "3": "recorded",
    "4": "program's own profiler",
    "5": "after a window",  # the first step after a window: pays for its stop and save, set aside
    # not a step-log code: the report marks untouched steps in which torch compiled
    "c": "torch.compile",
}
BREAKDOWN_ORDER = ("dataloader", "forward", "backward", "optimizer", "other")


@dataclass(frozen=True)
class Curve:
    """One process's step times: step numbers, milliseconds, and one phase code per step."""

    label: str
    steps: Sequence[int]
    values: Sequence[float]
    phases: str
    highlight: bool = False


def phase_class(code: str) -> str:
    """CSS class for a phase code; codes this version does not know (e.g. compile steps) get their
    own colour."""
    return {
        "0": "ph-untouched",
        "1": "ph-warmup",
        "2": "ph-recorded",
        "3": "ph-recorded",
        "4": "ph-foreign",
        "5": "ph-after",
        "c": "ph-compile",
    }.get(code, "ph-other")


def nice_max(value: float) -> float:
    """A round axis maximum at or above `value` (1, 2, 2.5 or 5 times a power of ten)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * power * 1.0000001:
            return factor * power
    return 10 * power


def envelope(
    xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most about `max_points` points that keep each bucket's minimum and maximum, in x order."""
    n = len(xs)
    if n <= max_points:
        return list(zip(xs, ys))
    buckets = max(1, max_points // 2)
    size = n / buckets
    out: list[tuple[float, float]] = []
    for b in range(buckets):
        lo, hi = int(b * size), min(n, int((b + 1) * size))
        if lo >= hi:
            continue
        chunk = ys[lo:hi]
        i_min = lo + min(range(len(chunk)), key=chunk.__getitem__)
        i_max = lo + max(range(len(chunk)), key=chunk.__getitem__)
        for i in sorted({i_min, i_max}):
            out.append((xs[i], ys[i]))
    return out


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _path(points: Sequence[tuple[float, float]]) -> str:
    return "M" + "L".join(f"{_num(x)} {_num(y)}" for x, y in points)


def _ticks(top: float, count: int = 4) -> list[float]:
    return [top * i / count for i in range(count + 1)]


def _step_ticks(first: int, last: int, count: int = 8) -> list[int]:
    span = max(1, last - first)
    raw = span / count
    step = max(1, int(nice_max(raw)))
    start = (first + step - 1) // step * step
    return list(range(start, last + 1, step)) or [first]


def phase_runs(steps: Sequence[int], phases: str) -> list[tuple[int, int, str]]:
    """(first step, last step, phase) of each run of consecutive steps in one non-untouched
    phase."""
    runs: list[tuple[int, int, str]] = []
    n = min(len(steps), len(phases))
    i = 0
    while i < n:
        kind = phase_class(phases[i])
        j = i
        while j + 1 < n and phase_class(phases[j + 1]) == kind and steps[j + 1] == steps[j] + 1:
            j += 1
        if phases[i] != "0":
            runs.append((steps[i], steps[j], phases[i]))
        i = j + 1
    return runs


def _frame(title: str, height: int, body: list[str]) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>' + "".join(body) + "</svg>"
    )


def timeline_axis_max(curves: Sequence[Curve]) -> float:
    """The top of the step-time axis timeline_chart uses (steps above it are clipped)."""
    body = sorted(
        v for c in curves for s, v in zip(c.steps, c.values) if s != 0 or len(c.steps) == 1
    )
    if not body:
        body = sorted(v for c in curves for v in c.values)
    if not body:
        return 1.0
    # Rare stalls far above the rest would flatten every other step: clip at 4x the 99th percentile.
    return nice_max(min(body[-1], 4 * body[min(len(body) - 1, int(len(body) * 0.99))]))


def timeline_chart(curves: Sequence[Curve], title: str = "Step time over the run") -> str:
    """Every step of every process; recorded windows shaded, warmup and special steps coloured,
    start-up clipped."""
    height, left, right, top, bottom = 300, 64, 16, 14, 34
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    all_steps = [s for c in curves for s in c.steps]
    if not all_steps:
        return _frame(title, 60, ['<text x="10" y="30" class="muted">no steps measured</text>'])
    first, last = min(all_steps), max(all_steps)
    # The start-up step (step 0, import and first iteration) is often 100x a normal step: keep it
    # out of the scale.
    y_max = timeline_axis_max(curves)

    def x_of(step: float) -> float:
        return left + (step - first) / max(1, last - first) * plot_w

    def y_of(value: float) -> float:
        return top + plot_h - min(value, y_max) / y_max * plot_h

    out: list[str] = []
    # Shaded bands: contiguous runs of non-untouched phases of the first curve (the schedule is the
    # same everywhere).
    half = plot_w / max(1, last - first) / 2
    runs = phase_runs(curves[0].steps, curves[0].phases)
    for s0, s1, code in runs:
        x0, x1 = max(left, x_of(s0) - half), min(WIDTH - right, x_of(s1) + half)
        label = PHASE_NAMES.get(code, f"phase {code}")
        span = f"step {s0}" if s0 == s1 else f"steps {s0}-{s1}"
        out.append(
            f'<rect class="band {phase_class(code)}" x="{_num(x0)}" y="{top}" '
            f'width="{_num(max(1.5, x1 - x0))}" height="{plot_h}"><title>{escape(label)}: '
            f"{span}</title></rect>"
        )
        if len(runs) <= 12 and x1 - x0 > 8 * len(label):  # name the band when there is room for it
            out.append(
                f'<text class="bandlabel {phase_class(code)}" x="{_num((x0 + x1) / 2)}" '
                f'y="{top + 26}" text-anchor="middle">{escape(label)}</text>'
            )
    for tick in _ticks(y_max):
        y = y_of(tick)
        out.append(
            f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{_num(y)}" y2="{_num(y)}"/>'
        )
        out.append(
            f'<text class="axis" x="{left - 6}" y="{_num(y + 4)}" '
            f'text-anchor="end">{escape(fmt.ms(tick))}</text>'
        )
    for step in _step_ticks(first, last):
        x = x_of(step)
        out.append(
            f'<line class="tick" x1="{_num(x)}" x2="{_num(x)}" y1="{top + plot_h}" '
            f'y2="{top + plot_h + 4}"/>'
        )
        out.append(
            f'<text class="axis" x="{_num(x)}" y="{top + plot_h + 17}" '
            f'text-anchor="middle">{step}</text>'
        )
    out.append(
        f'<text class="axis" x="{WIDTH - right}" y="{height - 3}" text-anchor="end">step</text>'
    )
    on_top: list[str] = []
    for index, curve in enumerate(curves):
        points = [(x_of(s), y_of(v)) for s, v in envelope(curve.steps, curve.values)]
        if not points:
            continue
        cls = f"line s{index % 8}" + (" highlight" if curve.highlight else "")
        out.append(
            f'<path class="{cls}" d="{_path(points)}"><title>{escape(curve.label)}</title></path>'
        )
        specials = [
            (s, v, p)
            for s, v, p in zip(curve.steps, curve.values, curve.phases)
            if p != "0" or s == 0
        ]
        if len(specials) <= 600:
            for step, value, code in specials:
                kind = "ph-startup" if step == 0 and code == "0" else phase_class(code)
                name = (
                    "start-up"
                    if step == 0 and code == "0"
                    else PHASE_NAMES.get(code, f"phase {code}")
                )
                out.append(
                    f'<circle class="dot {kind}" cx="{_num(x_of(step))}" cy="{_num(y_of(value))}" '
                    f'r="3.2">'
                    f"<title>{escape(curve.label)} step {step} ({escape(name)}): "
                    f"{escape(fmt.ms(value))}</title></circle>"
                )
        for step, value in zip(curve.steps, curve.values):
            if value > y_max and index == 0:
                x = x_of(step)
                on_top.append(  # drawn after every curve, so none runs through it
                    f'<text class="clip" x="{_num(x + 6)}" '
                    f'y="{top + 11}">{"start-up " if step == 0 else ""}step {step}: '
                    f"{escape(fmt.ms(value))} ↑</text>"
                )
                break
    out += on_top
    out.append(
        f'<line class="axisline" x1="{left}" x2="{WIDTH - right}" y1="{top + plot_h}" '
        f'y2="{top + plot_h}"/>'
    )
    return _frame(title, height, out)


def histogram_chart(
    values: Sequence[float], median: float, p90: float, title: str = "Step-time distribution"
) -> str:
    """Step times in 40 bins up to the 99th percentile (slower steps counted in the last bin),
    median and p90 lines."""
    height, left, right, top, bottom = 230, 64, 16, 22, 34
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    if not values:
        return _frame(title, 60, ['<text x="10" y="30" class="muted">no steps measured</text>'])
    ordered = sorted(values)
    low = ordered[0]
    high = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    if high <= low:
        high = low + max(abs(low) * 0.1, 0.001)
    bins = 40
    counts = [0] * bins
    for v in ordered:
        counts[min(bins - 1, max(0, int((v - low) / (high - low) * bins)))] += 1
    top_count = max(counts)

    def x_of(value: float) -> float:
        return left + (min(max(value, low), high) - low) / (high - low) * plot_w

    out: list[str] = []
    for tick in sorted({round(t) for t in _ticks(float(top_count), 2)}):
        y = top + plot_h - tick / top_count * plot_h
        out.append(
            f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{_num(y)}" y2="{_num(y)}"/>'
        )
        out.append(
            f'<text class="axis" x="{left - 6}" y="{_num(y + 4)}" '
            f'text-anchor="end">{tick:.0f}</text>'
        )
    bar_w = plot_w / bins
    for i, count in enumerate(counts):
        if not count:
            continue
        h = count / top_count * plot_h
        lo_edge = low + (high - low) * i / bins
        hi_edge = low + (high - low) * (i + 1) / bins
        more = " or more" if i == bins - 1 and ordered[-1] > hi_edge else ""
        out.append(
            f'<rect class="bar" x="{_num(left + i * bar_w + 0.5)}" y="{_num(top + plot_h - h)}" '
            f'width="{_num(max(1.0, bar_w - 1))}" height="{_num(h)}"><title>{count} steps, '
            f"{escape(fmt.ms(lo_edge))} to {escape(fmt.ms(hi_edge))}{more}</title></rect>"
        )
    for i in range(0, 5):
        value = low + (high - low) * i / 4
        x = x_of(value)
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(
            f'<text class="axis" x="{_num(x)}" y="{top + plot_h + 17}" '
            f'text-anchor="{anchor}">{escape(fmt.ms(value))}</text>'
        )
    for row, (label, value, cls) in enumerate(
        (("median", median, "marker-median"), ("p90", p90, "marker-p90"))
    ):
        x = x_of(value)
        out.append(
            f'<line class="{cls}" x1="{_num(x)}" x2="{_num(x)}" y1="{top - 4}" '
            f'y2="{top + plot_h}"/>'
        )
        # Labels sit beside their line, on the side with room, one row each so close lines stay
        # readable.
        anchor, dx = ("end", -4) if x > WIDTH - right - 140 else ("start", 4)
        out.append(
            f'<text class="{cls}-label" x="{_num(x + dx)}" y="{top + 6 + row * 14}" '
            f'text-anchor="{anchor}">{label} '
            f"{escape(fmt.ms(value))}</text>"
        )
    out.append(
        f'<line class="axisline" x1="{left}" x2="{WIDTH - right}" y1="{top + plot_h}" '
        f'y2="{top + plot_h}"/>'
    )
    return _frame(title, height, out)


# an upper bound on a character's width at .seglabel's 11px bold (digits, lowercase, %)
SEGLABEL_CHAR_PX = 7.0


def segment_label(full: str, short: str, width: float) -> str:
    """The text that fits inside a bar segment `width` px wide: `full` ("optimizer 10%"), else
    `short` ("10%"), else nothing (a label wider than its segment spilled into the next one and was
    cut at the bar's end)."""
    for text in (full, short):
        if len(text) * SEGLABEL_CHAR_PX + 6 <= width:
            return text
    return ""


def breakdown_chart(
    rows: Sequence[tuple[str, dict[str, float]]],
    highlight: str | None = None,
    device_busy: tuple[float, float] | None = None,
    title: str = "Step breakdown",
) -> str:
    """One stacked bar per rank (ms per step by phase); the slowest rank outlined; device busy/idle
    as its own bar."""
    row_h, gap, left, right, top = 26, 10, 120, 110, 8
    bars = list(rows)
    extra = 1 if device_busy else 0
    height = top + (len(bars) + extra) * (row_h + gap) + 8
    if not bars:
        return _frame(
            title,
            60,
            ['<text x="10" y="30" class="muted">no recorded steps with a breakdown</text>'],
        )
    longest = max(sum(parts.values()) for _, parts in bars) or 1.0
    if device_busy:
        longest = max(longest, device_busy[1])
    scale = (WIDTH - left - right) / longest
    out: list[str] = []
    y = top
    for label, parts in bars:
        x = float(left)
        strong = label == highlight
        out.append(
            f'<text class="axis{" strong" if strong else ""}" x="{left - 8}" '
            f'y="{y + row_h / 2 + 4}" '
            f'text-anchor="end">{escape(label)}{" (slowest)" if strong else ""}</text>'
        )
        total = sum(parts.values())
        for phase in BREAKDOWN_ORDER:
            ms = parts.get(phase, 0.0)
            if ms <= 0:
                continue
            w = ms * scale
            share = ms / total if total else 0.0
            out.append(
                f'<rect class="seg bd-{phase}" x="{_num(x)}" y="{y}" width="{_num(max(0.5, w))}" '
                f'height="{row_h}">'
                f"<title>{escape(label)} {phase}: {escape(fmt.ms(ms))} per step "
                f"({share:.0%})</title></rect>"
            )
            text = segment_label(f"{phase} {share:.0%}", f"{share:.0%}", w)
            if text:
                out.append(
                    f'<text class="seglabel" x="{_num(x + w / 2)}" y="{y + row_h / 2 + 4}" '
                    f'text-anchor="middle">'
                    f"{text}</text>"
                )
            x += w
        if strong:
            out.append(
                f'<rect class="outline" x="{left - 2}" y="{y - 2}" '
                f'width="{_num(total * scale + 4)}" height="{row_h + 4}"/>'
            )
        out.append(
            f'<text class="axis" x="{_num(x + 6)}" '
            f'y="{y + row_h / 2 + 4}">{escape(fmt.ms(total))}</text>'
        )
        y += row_h + gap
    if device_busy:
        busy, span = device_busy
        out.append(
            f'<text class="axis" x="{left - 8}" y="{y + row_h / 2 + 4}" '
            f'text-anchor="end">device</text>'
        )
        out.append(
            f'<rect class="seg dev-busy" x="{left}" y="{y}" width="{_num(max(0.5, busy * scale))}" '
            f'height="{row_h}">'
            f"<title>device busy {escape(fmt.ms(busy))} per step "
            f"({busy / span if span else 0:.0%})</title></rect>"
        )
        out.append(
            f'<rect class="seg dev-idle" x="{_num(left + busy * scale)}" y="{y}" '
            f'width="{_num(max(0.0, (span - busy) * scale))}" height="{row_h}"><title>device idle '
            f"{escape(fmt.ms(max(0.0, span - busy)))} per step</title></rect>"
        )
        out.append(
            f'<text class="axis" x="{_num(left + span * scale + 6)}" y="{y + row_h / 2 + 4}">busy '
            f"{busy / span if span else 0:.0%}</text>"
        )
    return _frame(title, height, out)


def memory_peaks_chart(
    rows: Sequence[tuple[str, int | None, int | None]], title: str = "Peak memory per process"
) -> str:
    """Horizontal bars: peak RSS and, where measured, peak CUDA memory of each process."""
    row_h, left, right, top = 16, 120, 110, 8
    bars: list[tuple[str, str, int]] = []
    for label, rss, cuda in rows:
        if rss:
            bars.append((label, "RSS", rss))
        if cuda:
            bars.append((label, "CUDA", cuda))
    if not bars:
        return _frame(title, 60, ['<text x="10" y="30" class="muted">no memory measured</text>'])
    longest = max(value for _, _, value in bars)
    scale = (WIDTH - left - right) / longest
    height = top + len(bars) * (row_h + 6) + 8
    out: list[str] = []
    y = top
    for label, kind, value in bars:
        out.append(
            f'<text class="axis" x="{left - 8}" y="{y + row_h - 3}" '
            f'text-anchor="end">{escape(label)} {kind}</text>'
        )
        out.append(
            f'<rect class="seg mem-{kind.lower()}" x="{left}" y="{y}" '
            f'width="{_num(max(0.5, value * scale))}" height="{row_h}"><title>{escape(label)} peak '
            f"{kind} {escape(fmt.size(value))}</title></rect>"
        )
        out.append(
            f'<text class="axis" x="{_num(left + value * scale + 6)}" '
            f'y="{y + row_h - 3}">{escape(fmt.size(value))}</text>'
        )
        y += row_h + 6
    return _frame(title, height, out)


def memory_curve_chart(
    curves: Sequence[tuple[str, Sequence[tuple[float, float]]]], title: str = "Allocated memory"
) -> str:
    """Allocated bytes over the recorded window (ms since its first event), one line per trace and
    device."""
    height, left, right, top, bottom = 240, 74, 16, 14, 34
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    points = [p for _, pts in curves for p in pts]
    if not points:
        return _frame(title, 60, ['<text x="10" y="30" class="muted">no memory events</text>'])
    t_max = max(t for t, _ in points) or 1.0
    y_max = nice_max(max(b for _, b in points))

    def x_of(t: float) -> float:
        return left + t / t_max * plot_w

    def y_of(b: float) -> float:
        return top + plot_h - b / y_max * plot_h

    out: list[str] = []
    for tick in _ticks(y_max):
        y = y_of(tick)
        out.append(
            f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{_num(y)}" y2="{_num(y)}"/>'
        )
        out.append(
            f'<text class="axis" x="{left - 6}" y="{_num(y + 4)}" '
            f'text-anchor="end">{escape(fmt.size(tick))}</text>'
        )
    for tick in _ticks(t_max, 6):
        out.append(
            f'<text class="axis" x="{_num(x_of(tick))}" y="{top + plot_h + 17}" '
            f'text-anchor="middle">{escape(fmt.ms(tick))}</text>'
        )
    for index, (label, pts) in enumerate(curves):
        if not pts:
            continue
        # A step line: allocated memory holds its value until the next event.
        xs = [t for t, _ in pts]
        ys = [b for _, b in pts]
        reduced = envelope(xs, ys)
        stepped: list[tuple[float, float]] = []
        for i, (t, b) in enumerate(reduced):
            if i:
                stepped.append((x_of(t), stepped[-1][1]))
            stepped.append((x_of(t), y_of(b)))
        out.append(
            f'<path class="line s{index % 8}" '
            f'd="{_path(stepped)}"><title>{escape(label)}</title></path>'
        )
    out.append(
        f'<line class="axisline" x1="{left}" x2="{WIDTH - right}" y1="{top + plot_h}" '
        f'y2="{top + plot_h}"/>'
    )
    return _frame(title, height, out)
