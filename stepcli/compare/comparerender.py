"""Rendering a `stepcli compare` verdict: the terminal report (rich) and Markdown (--markdown,
GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stepcli.compare.attribution import PHASE_LABELS, OpChange
from stepcli.compare.comparison import ComparedOpRow, Comparison
from stepcli.compare.populations import PopulationRow
from stepcli.compare.wording import ci as _ci
from stepcli.compare.wording import fmt_level as _fmt_level
from stepcli.compare.wording import fmt_ms as _fmt_ms
from stepcli.compare.wording import pct as _pct
from stepcli.compare.wording import signed as _signed
from stepcli.stats import percentile
from stepcli.traces.render.terminal import NAME_WIDTH, shortened_apart

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

HISTOGRAM_BINS = 8
HISTOGRAM_WIDTH = 30
_EIGHTHS = " ▏▎▍▌▋▊▉"


def _count_cell(value: float | None) -> str:
    return "-" if value is None else str(int(value))


def _step_cells(row: PopulationRow) -> list[str]:
    # how many step times each side kept (the `steps:` lines say which): not a change
    if row.stat == "count":
        return [_count_cell(row.baseline), _count_cell(row.current), "", ""]
    delta = None if row.baseline is None or row.current is None else row.current - row.baseline
    return [_fmt_ms(row.baseline), _fmt_ms(row.current), _signed(delta), _pct(delta, row.baseline)]


def _op_cells(row: ComparedOpRow) -> list[str]:
    delta = (
        None
        if row.baseline_ms is None or row.current_ms is None
        else row.current_ms - row.baseline_ms
    )
    return [
        _fmt_ms(row.baseline_ms),
        _fmt_ms(row.current_ms),
        _signed(delta),
        _pct(delta, row.baseline_ms),
        row.status,
    ]


def _change_cells(change: OpChange) -> list[str]:
    return [
        change.kind,
        _fmt_ms(change.baseline_ms),
        _fmt_ms(change.current_ms),
        _signed(change.delta_ms),
        f"{_signed(change.low)} .. {_signed(change.high)}",
        "yes" if change.significant else "no",
    ]


def interval_line(c: Comparison) -> str | None:
    """`median +7.2% (95% CI +5.1% .. +9.3%)`: the change and its interval, or None without one."""
    if c.change is None:
        return None
    ch = c.change
    return (
        f"{c.metric} {_pct(ch.delta, ch.baseline)} ({_fmt_level(c.confidence)} CI {_ci(ch)}), "
        f"{_signed(ch.delta)} ms ({_signed(ch.low)} .. {_signed(ch.high)} ms)"
    )


def histogram(
    baseline: Sequence[float],
    current: Sequence[float],
    bins: int = HISTOGRAM_BINS,
    width: int = HISTOGRAM_WIDTH,
) -> list[str]:
    """Both sides' step times on shared bins (1st to 99th percentile; the ends collect the
    outliers).

    Bars are each side's share of its own steps, so sides with different step counts compare by
    shape.
    """
    if not baseline or not current:
        return []
    every = sorted([*baseline, *current])
    low, high = percentile(every, 1), percentile(every, 99)
    if high <= low:
        low, high = every[0], every[-1]
    if high <= low:
        high = low + max(abs(low) * 1e-3, 1e-3)
    size = (high - low) / bins

    def counts(values: Sequence[float]) -> list[int]:
        out = [0] * bins
        for value in values:
            out[min(bins - 1, max(0, int((value - low) / size)))] += 1
        return out

    sides = [
        ("baseline", counts(baseline), len(baseline)),
        ("current", counts(current), len(current)),
    ]
    top = max(n / total for _, cs, total in sides for n in cs) or 1.0
    lines = []
    for index in range(bins):
        start, end = low + index * size, low + (index + 1) * size
        # the end bins are open: they collect the steps below the 1st percentile and above the 99th
        low_edge = f"{'...':>9}" if index == 0 else f"{start:9.3f}"
        high_edge = f"{'...':>9}" if index == bins - 1 else f"{end:9.3f}"
        edge = f"{low_edge} - {high_edge} ms"
        for name, cs, total in sides:
            eighths = round(cs[index] / total / top * width * 8)
            bar = "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")
            label = edge if name == "baseline" else " " * len(edge)
            lines.append(f"{label} │ {name:<8} {bar:<{width}} {cs[index]:>6}")
    return lines


# Below this many characters for names, a table would squeeze them (`aten::con…kward` at 80
# columns): each row is printed as its name on a line of its own, then its numbers indented below.
STACK_BELOW = 40


def _name_width(console: Console, cells: Sequence[Sequence[str]], headers: Sequence[str]) -> int:
    """Room left for operator names in a table: shortened in the middle, as `table` and `run` do,
    never wrapped."""
    fixed = sum(max([len(h), *(len(str(row[i])) for row in cells)]) for i, h in enumerate(headers))
    return console.width - fixed - 3 * (len(headers) + 1) - 1


def _print_rows(
    console: Console,
    title: str,
    headers: Sequence[tuple[str, str]],
    rows: Sequence[tuple[str, Sequence[str], str]],
    caption: str | None = None,
    whole_names: bool = False,
) -> None:
    """A titled table of (name, cells, stacked line) rows: a table when names get enough room, else
    each name on a line of its own (the full width) with its numbers indented below. With
    `whole_names`, a name the table would shorten also means lines of their own (the totals-only
    table is narrow: it would otherwise cut names the stacked lines show whole)."""
    from rich.table import Table
    from rich.text import Text

    longest = max(len(name) for name, _, _ in rows)
    width = _name_width(console, [cells for _, cells, _ in rows], [h for h, _ in headers])
    if width >= min(longest, STACK_BELOW) and not (whole_names and width < longest):
        # Titles and captions as plain lines: rich pads them to the table's width, trailing spaces
        # on a pipe.
        _plain(console, title)
        table = Table()
        table.add_column("operator", justify="left", no_wrap=True)
        for name, justify in headers:
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        names = shortened_apart([name for name, _, _ in rows], min(NAME_WIDTH, width))
        for (_, cells, _), name in zip(rows, names):
            table.add_row(Text(name), *cells)
        console.print(table)
        if caption:
            _wrapped(console, caption, "  ")
        return
    _wrapped(console, title + (f" ({caption})" if caption else ""), "  ")
    names = shortened_apart([name for name, _, _ in rows], max(12, console.width - 2))
    for (_, _, line), name in zip(rows, names):
        for piece in name.split("\n"):
            _plain(console, "  " + piece)
        _plain(console, "      " + line)


def _plain(console: Console, line: str) -> None:
    # Plain lines never wrap (soft_wrap): CI logs are grepped for the verdict and paths.
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _wrapped(console: Console, line: str, indent: str) -> None:
    """A long plain line wrapped to the console's width between clauses, continuation lines
    indented."""
    from stepcli.fmt import wrap_clauses

    for part in wrap_clauses(line, max(40, console.width), indent):
        _plain(console, part)


def _change_line(change: OpChange) -> str:
    sig = ", significant" if change.significant else ""
    return (
        f"{_fmt_ms(change.baseline_ms)} -> {_fmt_ms(change.current_ms)} ms, "
        f"{_signed(change.delta_ms)} ({row_level(change)} CI {_signed(change.low)} .. "
        f"{_signed(change.high)}){sig}"
    )


def row_level(change: OpChange) -> str:
    """The level of one attribution row's own interval: `99%`, `99.96%` (Bonferroni over its
    family)."""
    return f"{change.row_confidence * 100:.4g}%"


def attribution_caption(changes: Sequence[OpChange], confidence: float, family: str) -> str:
    """How the rows are judged, in one line: each interval's level, the family it holds the
    confidence over, and the practical limit a significant row's whole interval lies beyond
    (stepcli.compare.attribution)."""
    first = changes[0]
    return (
        f"each interval at {row_level(first)}: {_fmt_level(confidence)} over all "
        f"{first.family_size} {family} (Bonferroni); significant: the whole interval beyond "
        f"±{_fmt_ms(first.limit_ms)} ms, the larger of "
        "the tolerance of the baseline's recorded step and --min-delta-ms"
    )


def _op_line(row: ComparedOpRow, *, judged: bool = True) -> str:
    baseline, current, delta, percent, status = _op_cells(row)
    change = f", {delta} ({percent})" if judged else ""
    return f"{baseline} -> {current} ms{change}" + (f", {status}" if status else "")


def _print_header(c: Comparison, console: Console) -> None:
    for name, side in (("baseline:", c.baseline), ("current: ", c.current)):
        whole = f"{name} {side.label} ({side.description})"
        if len(whole) <= console.width:
            _plain(console, whole)
        else:  # the path whole on its own line (to copy, to grep), what was read wrapped below it
            _plain(console, f"{name} {side.label}")
            _wrapped(console, f"{' ' * 10}({side.description})", " " * 10)
    line = interval_line(c)
    if line:
        _wrapped(console, f"change:   {line}", " " * 10)
    if c.method:
        _wrapped(console, f"method:   {c.method}", " " * 10)
    for used in c.steps_used:
        _wrapped(console, f"steps:    {used}", " " * 10)


def _steps_table(c: Comparison, marker: str) -> Table:
    from rich.table import Table

    steps = Table()
    for name, justify in (
        ("steps", "left"),
        ("stat", "left"),
        ("baseline", "right"),
        ("current", "right"),
        ("delta", "right"),
        ("delta %", "right"),
        ("", "left"),
    ):
        steps.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in c.step_rows:
        decides = _decides(c, row)
        steps.add_row(
            row.population,
            row.stat,
            *_step_cells(row),
            marker if decides else "",
            style="bold" if decides else None,
        )
    return steps


def _decides(c: Comparison, row: PopulationRow) -> bool:
    return c.decides(row)


def _print_steps(c: Comparison, console: Console) -> None:
    _plain(console, "Step time (ms)")
    steps = _steps_table(c, "<- decides")
    wanted = console.measure(steps, options=console.options.update_width(10_000)).maximum
    if wanted > console.width and any(
        _decides(c, row) for row in c.step_rows
    ):  # wide figures: the word would wrap onto a row of its own
        steps = _steps_table(c, "<-")
        console.print(steps)
        _plain(console, "<- the statistic that decides")
    else:
        console.print(steps)
    lines = histogram(c.baseline_samples, c.current_samples)
    if lines:
        _plain(console, "Step-time distribution (deciding steps, share of each side's steps)")
        for line in lines:
            _plain(console, line)


def _change_rows(changes: Sequence[OpChange]) -> list[tuple[str, Sequence[str], str]]:
    rows: list[tuple[str, Sequence[str], str]] = []
    for change in changes:
        name = PHASE_LABELS.get(change.name, change.name) if change.kind == "phase" else change.name
        if change.kind == "device":
            name += " [device]"
        rows.append(
            (
                name,
                [*_change_cells(change)[1:-1], "yes" if change.significant else "no"],
                _change_line(change),
            )
        )
    return rows


_CHANGE_HEADERS = (
    ("baseline", "right"),
    ("current", "right"),
    ("delta", "right"),
    ("interval", "right"),
    ("sig", "left"),
)


def _print_operators(c: Comparison, console: Console) -> None:
    phases = [change for change in c.op_changes if change.kind == "phase"]
    operators = [change for change in c.op_changes if change.kind != "phase"]
    if phases:
        title = "Step phases whose time per step changed most (ms per step)"
        caption = attribution_caption(phases, c.confidence, "phases")
        _print_rows(console, title, _CHANGE_HEADERS, _change_rows(phases), caption=caption)
    if operators:
        title = "Operators whose self time per step changed most (ms per step)"
        caption = attribution_caption(operators, c.confidence, "operators and kernels")
        _print_rows(console, title, _CHANGE_HEADERS, _change_rows(operators), caption=caption)
    # too few steps: totals only, no change that would read as a finding
    elif c.op_rows and not c.ops_judged:
        totals: tuple[tuple[str, str], ...] = (
            ("baseline", "right"),
            ("current", "right"),
            ("", "left"),
        )
        rows = [
            (op.name, _op_cells(op)[:2] + [op.status], _op_line(op, judged=False))
            for op in c.op_rows
        ]
        title = "Top operators by self time (ms)"
        caption = (
            "totals over each side's recorded steps; too few steps to judge a change, see the note"
        )
        _print_rows(console, title, totals, rows, caption=caption, whole_names=True)
    elif c.op_rows:
        headers = (
            ("baseline", "right"),
            ("current", "right"),
            ("delta", "right"),
            ("delta %", "right"),
            ("", "left"),
        )
        rows = [(op.name, _op_cells(op), _op_line(op)) for op in c.op_rows]
        title = "Top operators by self time (ms)"
        _print_rows(console, title, headers, rows, caption="totals over each side's recorded steps")


def render_console(comparison: Comparison, console: Console) -> None:
    """The human report: sides, interval and steps used, tables, distributions, notes, verdict line
    last."""
    from rich.text import Text

    from stepcli.fmt import wrap_clauses

    c = comparison
    _print_header(c, console)
    _print_steps(c, console)
    _print_operators(c, console)
    for note in c.notes:
        _wrapped(console, f"note: {note}", "  ")
    style = {
        "no_change": "bold green",
        "improvement": "bold green",
        "regression": "bold red",
        "inconclusive": "bold yellow",
        "nothing_measured": "bold yellow",
    }[c.verdict]
    # Wrapped to the width; its first line starts with the verdict word (CI logs grep for it), the
    # rest indented.
    for part in wrap_clauses(c.verdict_line, max(40, console.width), "  "):
        console.print(Text(part, style=style), soft_wrap=True)


def render_markdown(comparison: Comparison) -> str:
    """The same report as GitHub-flavoured Markdown (for --markdown and $GITHUB_STEP_SUMMARY),
    verdict first."""
    c = comparison
    lines = [
        f"### stepcli compare: {c.headline}",
        "",
        f"**{c.headline}**: {_md_escape(c.message)}",
        "",
        f"- baseline: `{_md_code(c.baseline.label)}` ({c.baseline.description})",
        f"- current: `{_md_code(c.current.label)}` ({c.current.description})",
    ]
    line = interval_line(c)
    if line:
        lines.append(f"- change: **{_md_escape(line)}**")
    if c.method:
        lines.append(f"- method: {_md_escape(c.method)}")
    lines += [f"- steps: {_md_escape(used)}" for used in c.steps_used]
    lines += [
        "",
        "**Step time (ms)**",
        "",
        "| steps | stat | baseline | current | delta | delta % | |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in c.step_rows:
        decides = _decides(c, row)
        cells = [
            row.population,
            f"**{row.stat}**" if decides else row.stat,
            *_step_cells(row),
            "decides" if decides else "",
        ]
        lines.append(_md_row(cells))
    bars = histogram(c.baseline_samples, c.current_samples)
    if bars:
        lines += [
            "",
            "**Step-time distribution** (deciding steps, share of each side's steps)",
            "",
            "```text",
            *bars,
            "```",
        ]
    for kind, title in (
        ("phase", "Step phases whose time per step changed most (ms per step)"),
        ("op", "Operators whose self time per step changed most (ms per step)"),
    ):
        changes = [ch for ch in c.op_changes if (ch.kind == "phase") == (kind == "phase")]
        if not changes:
            continue
        first = "phase" if kind == "phase" else "operator"
        family = "phases" if kind == "phase" else "operators and kernels"
        lines += [
            "",
            f"**{title}**",
            "",
            _md_escape(attribution_caption(changes, c.confidence, family)),
            "",
            f"| {first} | kind | baseline | current | delta | interval | significant |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for change in changes:
            name = (
                PHASE_LABELS.get(change.name, change.name)
                if change.kind == "phase"
                else change.name
            )
            lines.append(_md_row([f"`{_md_code(name, in_table=True)}`", *_change_cells(change)]))
    if not any(ch.kind != "phase" for ch in c.op_changes) and c.op_rows:
        lines += [
            "",
            "**Top operators by self time (ms, totals over each side's recorded steps)**",
            "",
            "| operator | baseline | current | delta | delta % | |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for op in c.op_rows:
            cells = _op_cells(op)
            if not c.ops_judged:  # too few steps to judge a change: totals only
                cells = [cells[0], cells[1], "-", "-", cells[4]]
            lines.append(_md_row([f"`{_md_code(op.name, in_table=True)}`", *cells]))
        if not c.ops_judged:
            lines += [
                "",
                "Too few recorded steps to judge an operator's change (see the note): totals only.",
            ]
    lines.append("")
    for note in c.notes:
        lines += [f"> note: {_md_escape(note)}", ""]
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    # Pipes would split table cells; the other characters would start emphasis or HTML.
    for char in ("\\", "|", "*", "_", "<", "`", "["):
        text = text.replace(char, "\\" + char)
    return text


def _md_code(text: str, *, in_table: bool = False) -> str:
    # Inside a code span backslashes are literal and a backtick would end the span; in a table
    # cell GFM still splits on a bare pipe, so there (only) it is escaped.
    text = text.replace("`", "'")
    return text.replace("|", "\\|") if in_table else text


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("\n", " ") if cell else " " for cell in cells) + " |"
