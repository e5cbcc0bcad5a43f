"""`stepcli table` on a terminal: the operator, step, rank and breakdown tables (rich), shortened
names, and the notes under them; the other formats and the choice among them are
stepcli.traces.render.formats's."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stepcli.fmt import ms_cell as _ms
from stepcli.fmt import print_wrapped
from stepcli.traces.analyses.culpritwords import culprit_lines

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text


SORT_KEYS = ("self", "total", "calls", "avg", "name")
FORMATS = ("rich", "json", "csv", "markdown")
# wider names are shortened in the middle: a kernel's template arguments matter less than its ends
NAME_WIDTH = 60
PHASE_ORDER = ("dataloader", "forward", "backward", "optimizer", "other")

_SORTERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "self": lambda r: (-r["self_ms"], r["name"]),
    "total": lambda r: (-r["total_ms"], r["name"]),
    "calls": lambda r: (-r["calls"], r["name"]),
    "avg": lambda r: (-r["avg_ms"], r["name"]),
    "name": lambda r: (r["name"], -r["self_ms"]),
}


def sort_rows(
    rows: Sequence[Mapping[str, Any]], sort_by: str = "self", limit: int | None = None
) -> list[Mapping[str, Any]]:
    """Operator rows (the dict form of to_dict()) ordered by one of SORT_KEYS, at most `limit` of
    them."""
    ordered = sorted(rows, key=_SORTERS[sort_by])
    return ordered if limit is None else ordered[:limit]


def shorten(name: str, width: int = NAME_WIDTH) -> str:
    """`name` cut to `width` characters with an ellipsis in the middle, keeping both ends
    readable."""
    if len(name) <= width:
        return name
    head = (width - 1) * 2 // 3
    tail = width - 1 - head
    return f"{name[:head]}…{name[-tail:]}" if tail > 0 else name[: width - 1] + "…"


def shortened_apart(names: Sequence[str], width: int) -> list[str]:
    """Each name shortened to `width` (shorten), except names that would shorten to the same text as
    another: those whole, cut into lines of `width` (two rows must never read alike: `…2ul>` and
    `…5ul>` kernels)."""
    short = [shorten(name, width) for name in names]
    seen = Counter(short)
    return [
        text if seen[text] == 1 else "\n".join(_pieces(name, width))
        for name, text in zip(names, short)
    ]


def pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def skipped_note(count: int) -> str:
    return (
        f"skipped {count:,} event{'s' if count != 1 else ''} with a missing, non-numeric, negative "
        f"or out-of-range ts/dur (left out of every figure)"
    )


def outside_note(outside: Mapping[str, Any] | None) -> str | None:
    """The line under an operator table when host events outside every recorded step were left out
    of it (stepcli.traces.analyses.traceanalysis: their time is no step's, so it gets no share of
    step time); None when there were none."""
    if not outside or not outside.get("events"):
        return None
    count = outside["events"]
    events = f"{count:,} host event{'s' if count != 1 else ''}"
    return f"{events} ({_ms(outside['self_ms'])} ms) outside recorded steps left out"


def left_out_notes(data: Mapping[str, Any]) -> list[str]:
    """The line saying which steps were left out of every figure because they are no steps of the
    program's (the profiler's closing stub, stepcli.traces.analyses.traceanalysis.profiler_stub):
    never dropped silently, and one line however many traces have one (the first few named, every
    one in --json)."""
    entries = list(data.get("left_out_steps") or ())
    if not entries:
        return []
    why = entries[0]["why"]
    if len(entries) == 1 and len(data.get("files") or ()) <= 1:
        return [f"left out ProfilerStep#{entries[0]['step']}: {why}"]
    named = ", ".join(
        f"ProfilerStep#{e['step']} of {os.path.basename(e['file'])}" for e in entries[:_NAMED]
    )
    more = (
        f" and {len(entries) - _NAMED} more (--json: left_out_steps)"
        if len(entries) > _NAMED
        else ""
    )
    return [f"left out {named}{more}: {why}"]


_NAMED = 3


def shapes_hint(data: Mapping[str, Any]) -> str | None:
    """The pointer to --group-by-shape under an operator table of traces that hold input shapes, its
    rows not yet split by them; None otherwise."""
    if not (data.get("recorded_with") or {}).get("shapes") or any(
        "shape" in r for r in data.get("cpu_ops") or ()
    ):
        return None
    return "input shapes recorded: --group-by-shape gives one row per shape"


def repeated_note(repeated: Mapping[str, int] | None) -> str | None:
    """The line saying why no slowest rank or culprit is named when ranks appear in several
    processes."""
    if not repeated:
        return None
    ranks = ", ".join(f"rank {rank} in {count}" for rank, count in repeated.items())
    return (
        f"ranks in several processes ({ranks}): several runs in one folder, or a restarted job; no "
        f"slowest rank "
        "and no culprit is named across them (summarize one run's traces for those)"
    )


# ------------------------------------------------------------------------------------------------
# rich tables
def ops_table(
    rows: Sequence[Mapping[str, Any]],
    title: str,
    limit: int,
    *,
    sort_by: str = "self",
    width: int | None = None,
    share_of: str | None = None,
) -> Table:
    """Operator (or kernel) table like key_averages().table(): the top `limit` rows by `sort_by`.

    `width` is the space the table may take (the console width): names are shortened in the middle
    to fit. `share_of` (stepcli.traces.analyses.shares) goes into the caption: what the Self %
    column is a share of.
    """
    from rich.table import Table
    from rich.text import Text

    from stepcli.traces.analyses.shares import overlap_note, share_caption

    shown = sort_rows(rows, sort_by, limit)
    with_shape = any("shape" in r for r in shown)
    caption = (
        f"{len(shown)} of {len(rows)} rows, sorted by {sort_by}" if len(rows) > len(shown) else None
    )
    if share_of is not None:
        caption = "; ".join(filter(None, (caption, share_caption(share_of), overlap_note(rows))))
    headers = ("Calls", "Self ms", "Self %", "Total ms", "Avg ms")
    numbers = [
        [
            f"{r['calls']:,}",
            _ms(r["self_ms"]),
            pct(r["self_share"]),
            _ms(r["total_ms"]),
            _ms(r["avg_ms"]),
        ]
        for r in shown
    ]
    shapes = [str(r.get("shape") or "") for r in shown] if with_shape else []
    fixed = sum(max([len(h), *(len(n[i]) for n in numbers)]) for i, h in enumerate(headers))
    columns = len(headers) + 1 + (1 if with_shape else 0)
    room = (width or 120) - fixed - 3 * columns - 1
    shape_width = (
        max(len("Input shapes"), min(30, max(map(len, shapes), default=0), room // 3))
        if with_shape
        else 0
    )
    name_width = max(12, min(NAME_WIDTH, room - shape_width))
    # Too narrow for names and shapes side by side (80 columns): each shape goes under its name,
    # both getting the whole room, so rows that differ only in their shapes can still be told apart.
    stacked = with_shape and (
        max((len(r["name"]) for r in shown), default=0) > name_width
        or max(map(len, shapes), default=0) > shape_width
    )
    if stacked:
        room += 3  # one column fewer
        name_width = max(12, min(NAME_WIDTH, room))
        shape_width = max(12, room - 2)

    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("Name / input shapes" if stacked else "Name", no_wrap=True)
    if with_shape and not stacked:
        table.add_column("Input shapes", no_wrap=True)
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    short = [shorten(str(row["name"]), name_width) for row in shown]
    seen = Counter(zip(short, shapes if with_shape and not stacked else [""] * len(shown)))
    for index, row in enumerate(shown):
        # Text, not str: names and shapes are data, and "[...]" in them must not be read as rich
        # markup.
        name = short[index]
        # two names shorten alike
        if seen[(name, shapes[index] if with_shape and not stacked else "")] > 1:
            # (`…zero_grad#Adam` / `#SGD`): whole
            name = "\n".join(_pieces(str(row["name"]), name_width))
        # whole, over as many lines as it takes: two rows must never shorten to the same text
        if stacked:
            shape = shapes[index]
            lines = _pieces(str(row["name"]), name_width) + [
                f"  {piece}" for piece in _pieces(shape, shape_width - 2)
            ]
            cells: list[Text | str] = [Text("\n".join(lines))]
        else:
            cells = [Text(name)]
            if with_shape:
                cells.append(Text(shorten(shapes[index], shape_width)))
        table.add_row(*cells, *numbers[index])
    return table


def _pieces(text: str, width: int) -> list[str]:
    """`text` cut into lines of at most `width` characters (none for an empty text)."""
    width = max(1, width)
    return [text[at : at + width] for at in range(0, len(text), width)]


def process_label(row: Mapping[str, Any]) -> str:
    """A step's or a rank row's process: `rank 1`, `host_123`; older documents only carry the
    rank."""
    if row.get("process"):
        return str(row["process"])
    return "-" if row.get("rank") is None else f"rank {row['rank']}"


def steps_table(
    steps: Sequence[Mapping[str, Any]],
    limit: int | None = None,
    *,
    title: str = "Steps",
    width: int | None = None,
) -> Table:
    """ProfilerStep durations: one column per process (rank) when there are several, so a slow one
    stands out per step, and steps of different processes that share numbers are never merged. When
    the columns would not fit in `width`, or when a process repeats a step number (one cell could
    not show both), one row per process and step instead."""
    from rich.table import Table

    processes = list(dict.fromkeys(process_label(s) for s in steps))
    cell = {(process_label(s), s["step"]): s["dur_ms"] for s in steps}
    if len(cell) < len(steps) or (
        len(processes) > 1 and 9 + sum(len(p) + 6 for p in processes) > (width or 80)
    ):
        return _steps_long_table(steps, processes, limit, title)
    numbers = sorted({s["step"] for s in steps})
    shown = numbers if limit is None else numbers[:limit]
    caption = f"first {len(shown)} of {len(numbers)} steps" if len(shown) < len(numbers) else None
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("Step", justify="right")
    multi = len(processes) > 1
    for process in processes:
        table.add_column(f"{process} ms" if multi else "ms", justify="right")
    for number in shown:
        values = [cell.get((process, number)) for process in processes]
        present = [v for v in values if v is not None]
        top = max(present) if multi and len(present) > 1 else None
        cells = [str(number)]
        for value in values:
            text = _ms(value)
            cells.append(f"[bold]{text}[/bold]" if top is not None and value == top else text)
        table.add_row(*cells)
    return table


def _steps_long_table(
    steps: Sequence[Mapping[str, Any]], processes: list[str], limit: int | None, title: str
) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    table.add_column("Process", no_wrap=True)
    table.add_column("Step", justify="right")
    table.add_column("ms", justify="right")
    cut = False
    for process in processes:
        mine = sorted((s for s in steps if process_label(s) == process), key=lambda s: s["step"])
        cut = cut or (limit is not None and len(mine) > limit)
        for step in mine if limit is None else mine[:limit]:
            table.add_row(Text(process), str(step["step"]), _ms(step["dur_ms"]))
    if cut:
        table.caption = f"first {limit} steps of each process"
        table.caption_justify = "left"
    return table


def ranks_table(
    ranks: Sequence[Mapping[str, Any]],
    slowest_rank: int | None,
    *,
    title: str = "Ranks",
    width: int | None = None,
) -> Table:
    """Step-time statistics per process (rank), split into compute and communication wait; its
    windows (one per trace file) below it, labelled by their steps. The straggler is marked in
    words, not only in colour.

    File paths are not in the table (a cut path cannot be copied): the reports list them on their
    own lines. It fits 80 columns as it is; where `width` is narrower than the boxed table, the
    box's inner lines go, so the label keeps room to wrap at its spaces instead of folding letter by
    letter.
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    rows: list[tuple[Text, list[str], str | None]] = []
    for row in ranks:
        stats = row.get("step_ms") or {}
        slow = slowest_rank is not None and row.get("rank") == slowest_rank
        figures = [
            str(stats.get("count", 0)),
            _ms(stats.get("mean")),
            _ms(stats.get("p90")),
            _ms(stats.get("max")),
        ]
        figures += [_ms(row.get("compute_ms")), _ms(row.get("comm_ms"))]
        rows.append(
            (
                Text(process_label(row) + (" (slowest)" if slow else "")),
                figures,
                "bold red" if slow else None,
            )
        )
        windows = row.get("windows") or []
        if len(windows) > 1:
            for window in windows:
                w_stats = window.get("step_ms") or {}
                figures = [
                    str(w_stats.get("count", 0)),
                    _ms(w_stats.get("mean")),
                    _ms(w_stats.get("p90")),
                ]
                rows.append(
                    (
                        Text(f"  {window['steps']}"),
                        [*figures, _ms(w_stats.get("max")), "", ""],
                        "dim",
                    )
                )
    names = ("Steps", "Mean ms", "P90 ms", "Max ms", "Compute", "Wait")
    # no ProfilerStep: one span
    whole = not any((row.get("step_ms") or {}).get("count") for row in ranks)
    unit = "ms over the whole trace (no recorded step)" if whole else "ms/step"
    caption = (
        f"Compute = {'time' if whole else 'step time'} outside collectives; Wait = in collectives "
        f"(c10d, gloo, NCCL), {unit}"
    )
    figure_widths = [
        max((len(figures[at]) for _, figures, _ in rows), default=0) for at in range(len(names))
    ]
    label = max([len("Process"), *(len(text.plain) for text, _, _ in rows)])
    # "┃ x ", "┃"
    boxed = label + sum(map(max, zip(map(len, names), figure_widths))) + 3 * (len(names) + 1) + 1
    narrow = width is not None and width < boxed
    if narrow:  # no inner lines, one space between columns, the units in the caption
        names = ("Steps", "Mean", "P90", "Max", "Compute", "Wait")
        caption = (
            "ms over the whole trace; " if whole else "ms per step; "
        ) + caption.removesuffix(f", {unit}")
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD
    )
    if narrow:
        table.show_edge, table.padding = False, (0, 0)  # (the box puts a space between columns)
    # a narrow terminal wraps the label, never cuts a figure
    table.add_column("Process", overflow="fold")
    for name, widest in zip(names, figure_widths):
        table.add_column(name, justify="right", no_wrap=True, min_width=max(len(name), widest))
    for text, figures, style in rows:
        table.add_row(text, *figures, style=style)
    table.caption = caption
    table.caption_justify = "left"
    return table


def breakdown_table(
    breakdown_ms: Mapping[str, float] | None,
    device: Mapping[str, float] | None = None,
    *,
    title: str = "Step breakdown (mean per step)",
    whole: bool = False,
) -> Table:
    """Where a step's time goes: dataloader, forward, backward, optimizer, other; device busy share
    if known. `whole`: a trace without steps, its figures for the whole trace (never called "per
    step")."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("Phase")
    table.add_column("ms" if whole else "ms / step", justify="right")
    table.add_column("Share", justify="right")
    total = sum((breakdown_ms or {}).values())
    for phase in PHASE_ORDER:
        if breakdown_ms is None:
            break
        value = breakdown_ms.get(phase, 0.0)
        table.add_row(phase, _ms(value), pct(value / total) if total else "-")
    if device is not None:
        table.add_row(
            "device busy", _ms(device["busy_ms"]), pct(device["busy_share"]), style="italic"
        )
    return table


# ------------------------------------------------------------------------------------------------
# reports
DEFAULT_LIMIT = 20  # operator rows on the terminal and in --markdown without --limit


def print_table(console: Console, table: Table) -> None:
    """`table`, its caption under it as a line of the console's width: rich wraps a caption to the
    table's own width, so a narrow table folded a short one ("first 3 of 4" / "steps") with 80
    columns to spare."""
    caption = table.caption
    if not isinstance(caption, str):
        console.print(table)
        return
    table.caption = None
    try:
        console.print(table)
    finally:
        table.caption = caption
    print_wrapped(console, caption)


def _print_ranks(data: Mapping[str, Any], console: Console) -> None:
    """The ranks table, the slowest rank, the culprit, and why none is named (ranks repeated,
    several jobs)."""
    print_table(console, ranks_table(data["ranks"], data.get("slowest_rank"), width=console.width))
    straggler = data.get("straggler")
    if straggler:
        console.print(f"slowest rank: {straggler['evidence']}", highlight=False, markup=False)
    elif data.get("slowest_rank") is not None:
        console.print(f"slowest rank: {data['slowest_rank']}", highlight=False)
    for line in culprit_lines(data.get("culprit")):
        console.print(line, highlight=False, markup=False)
    for note in (repeated_note(data.get("repeated_ranks")), data.get("mixed_jobs")):
        if note:
            print_wrapped(console, note)


def print_rich_report(
    data: Mapping[str, Any],
    console: Console,
    *,
    sort_by: str = "self",
    limit: int = 20,
    stacks: int | None = None,
) -> None:
    """The terminal report: what was read, step times, ranks, breakdown, CPU operators, device
    kernels."""
    files = data["files"]
    stats = data.get("step_ms")
    head = f"{len(files)} trace file{'s' if len(files) != 1 else ''}, {data['events']:,} events"
    if len(files) == 1 and len(head) + 2 + len(files[0]) <= console.width:
        head += f": {files[0]}"
    # the path whole on its own line, not wrapped in the middle nor past the width
    elif len(files) == 1:
        head += f":\n{files[0]}"
    console.print(head, highlight=False, soft_wrap=True, markup=False)
    if data.get("skipped_events"):
        console.print(
            skipped_note(data["skipped_events"]), highlight=False, soft_wrap=True, markup=False
        )
    if stats:
        print_wrapped(  # never between a figure and its unit
            console,
            f"step time over {stats['count']} step{'s' if stats['count'] != 1 else ''}: mean "
            f"{_ms(stats['mean'])} ms, median {_ms(stats['median'])} ms, p90 {_ms(stats['p90'])} "
            f"ms, min {_ms(stats['min'])} ms, max {_ms(stats['max'])} ms",
        )
    else:
        print_wrapped(
            console,
            "no complete ProfilerStep#N annotation: step tables skipped, and the figures below are "
            "for the whole trace, not per step",
        )
    for note in left_out_notes(data):
        print_wrapped(console, note)
    if len(data["ranks"]) > 1:
        _print_ranks(data, console)
    if data["steps"]:
        print_table(console, steps_table(data["steps"], limit, width=console.width))
    if data.get("breakdown_ms"):
        print_table(console, breakdown_table(data["breakdown_ms"], data.get("device")))
        from stepcli.traces.render.stacksection import other_lines

        for line in other_lines(data, console.width):  # (the stack lines fit the width already)
            print_wrapped(console, line, indent="    ")
    elif data.get("device"):
        title = "Device activity" + ("" if stats else " (whole trace)")
        print_table(console, breakdown_table(None, data["device"], title=title, whole=not stats))
    from stepcli.traces.render.gpusection import print_device_section

    print_device_section(data, console, whole=not stats)
    share_of = data.get("share_of")
    cpu_table = ops_table(
        data["cpu_ops"],
        "CPU operators",
        limit,
        sort_by=sort_by,
        width=console.width,
        share_of=share_of,
    )
    hint = shapes_hint(data)
    if hint:
        cpu_table.caption = "; ".join(filter(None, (cpu_table.caption, hint)))  # type: ignore[arg-type]
    print_table(console, cpu_table)
    outside = outside_note(data.get("outside_steps"))
    if outside:
        console.print(outside, highlight=False, soft_wrap=True, markup=False)
    if data["device_kernels"]:
        print_table(
            console,
            ops_table(
                data["device_kernels"],
                "Device kernels",
                limit,
                sort_by=sort_by,
                width=console.width,
                share_of=share_of,
            ),
        )
    if stacks:
        _print_stacks(data, console, stacks)


def _print_stacks(data: Mapping[str, Any], console: Console, stacks: int) -> None:
    """--stacks N: the table, or the line saying how to record stacks (on stderr)."""
    import sys

    from stepcli.traces.render.stacksection import stacks_missing, stacks_table

    note = stacks_missing(data)
    if note:
        print(note, file=sys.stderr)
    else:
        print_table(console, stacks_table(data["python_stacks"], stacks, console.width))
