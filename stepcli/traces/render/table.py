"""Presentation of trace summaries: rich tables for terminals, and JSON, CSV and Markdown for machines and CI."""

from __future__ import annotations

import csv
import errno
import io
import os
import sys
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Callable

from stepcli.fmt import ms_cell as _ms
from stepcli.fmt import visible, visible_all
from stepcli.pipeconsole import pipe_console
from stepcli.traces.analyses.culpritwords import culprit_lines
from stepcli.traces.analyses.ranks import first_per_process

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from stepcli.traces.analyses.model import TraceSummary

SORT_KEYS = ("self", "total", "calls", "avg", "name")
FORMATS = ("rich", "json", "csv", "markdown")
NAME_WIDTH = 60  # wider names are shortened in the middle: a kernel's template arguments matter less than its ends
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
    """Operator rows (the dict form of to_dict()) ordered by one of SORT_KEYS, at most `limit` of them."""
    ordered = sorted(rows, key=_SORTERS[sort_by])
    return ordered if limit is None else ordered[:limit]


def shorten(name: str, width: int = NAME_WIDTH) -> str:
    """`name` cut to `width` characters with an ellipsis in the middle, keeping both ends readable."""
    if len(name) <= width:
        return name
    head = (width - 1) * 2 // 3
    tail = width - 1 - head
    return f"{name[:head]}…{name[-tail:]}" if tail > 0 else name[: width - 1] + "…"


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _skipped_note(count: int) -> str:
    return f"skipped {count:,} event{'s' if count != 1 else ''} with a missing, non-numeric, negative or out-of-range ts/dur (see README)"


def outside_note(outside: Mapping[str, Any] | None) -> str | None:
    """The line under an operator table when host events outside every recorded step were left out of it
    (stepcli.traces.analyses.analysis: their time is no step's, so it gets no share of step time); None when there were none."""
    if not outside or not outside.get("events"):
        return None
    count = outside["events"]
    events = f"{count:,} host event{'s' if count != 1 else ''}"
    return f"{events} ({_ms(outside['self_ms'])} ms) outside recorded steps left out"


# ------------------------------------------------------------------------------------------------ rich tables
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

    `width` is the space the table may take (the console width): names are shortened in the middle to fit.
    `share_of` (stepcli.traces.analyses.shares) goes into the caption: what the Self % column is a share of.
    """
    from rich.table import Table
    from rich.text import Text

    from stepcli.traces.analyses.shares import overlap_note, share_caption

    shown = sort_rows(rows, sort_by, limit)
    with_shape = any("shape" in r for r in shown)
    caption = f"{len(shown)} of {len(rows)} rows, sorted by {sort_by}" if len(rows) > len(shown) else None
    if share_of is not None:
        caption = "; ".join(filter(None, (caption, share_caption(share_of), overlap_note(rows))))
    headers = ("Calls", "Self ms", "Self %", "Total ms", "Avg ms")
    numbers = [
        [f"{r['calls']:,}", _ms(r["self_ms"]), _pct(r["self_share"]), _ms(r["total_ms"]), _ms(r["avg_ms"])]
        for r in shown
    ]
    shapes = [str(r.get("shape") or "") for r in shown] if with_shape else []
    fixed = sum(max([len(h), *(len(n[i]) for n in numbers)]) for i, h in enumerate(headers))
    columns = len(headers) + 1 + (1 if with_shape else 0)
    room = (width or 120) - fixed - 3 * columns - 1
    shape_width = max(len("Input shapes"), min(30, max(map(len, shapes), default=0), room // 3)) if with_shape else 0
    name_width = max(12, min(NAME_WIDTH, room - shape_width))
    # Too narrow for names and shapes side by side (80 columns): each shape goes under its name, both getting the
    # whole room, so rows that differ only in their shapes can still be told apart.
    stacked = with_shape and (
        max((len(r["name"]) for r in shown), default=0) > name_width or max(map(len, shapes), default=0) > shape_width
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
    for index, row in enumerate(shown):
        # Text, not str: names and shapes are data, and "[...]" in them must not be read as rich markup.
        name = shorten(row["name"], name_width)
        if stacked:  # whole, over as many lines as it takes: two rows must never shorten to the same text
            shape = shapes[index]
            lines = _pieces(str(row["name"]), name_width) + [f"  {piece}" for piece in _pieces(shape, shape_width - 2)]
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


def _process_label(row: Mapping[str, Any]) -> str:
    """A step's or a rank row's process: `rank 1`, `host_123`; older documents only carry the rank."""
    if row.get("process"):
        return str(row["process"])
    return "-" if row.get("rank") is None else f"rank {row['rank']}"


def steps_table(
    steps: Sequence[Mapping[str, Any]], limit: int | None = None, *, title: str = "Steps", width: int | None = None
) -> Table:
    """ProfilerStep durations: one column per process (rank) when there are several, so a slow one stands out per
    step, and steps of different processes that share numbers are never merged. When the columns would not fit in
    `width`, one row per process and step instead."""
    from rich.table import Table

    processes = list(dict.fromkeys(_process_label(s) for s in steps))
    if len(processes) > 1 and 9 + sum(len(p) + 6 for p in processes) > (width or 80):
        return _steps_long_table(steps, processes, limit, title)
    numbers = sorted({s["step"] for s in steps})
    shown = numbers if limit is None else numbers[:limit]
    cell = {(_process_label(s), s["step"]): s["dur_ms"] for s in steps}
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


def _steps_long_table(steps: Sequence[Mapping[str, Any]], processes: list[str], limit: int | None, title: str) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    table.add_column("Process", no_wrap=True)
    table.add_column("Step", justify="right")
    table.add_column("ms", justify="right")
    cut = False
    for process in processes:
        mine = sorted((s for s in steps if _process_label(s) == process), key=lambda s: s["step"])
        cut = cut or (limit is not None and len(mine) > limit)
        for step in mine if limit is None else mine[:limit]:
            table.add_row(Text(process), str(step["step"]), _ms(step["dur_ms"]))
    if cut:
        table.caption = f"first {limit} steps of each process"
        table.caption_justify = "left"
    return table


def ranks_table(
    ranks: Sequence[Mapping[str, Any]], slowest_rank: int | None, *, title: str = "Ranks", width: int | None = None
) -> Table:
    """Step-time statistics per process (rank), split into compute and communication wait; its windows (one per
    trace file) below it, labelled by their steps. The straggler is marked in words, not only in colour.

    File paths are not in the table (a cut path cannot be copied): the reports list them on their own lines.
    `width` is accepted for the callers' sake: the table holds no free text and fits 80 columns as it is.
    """
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    table.add_column("Process", no_wrap=True)
    for name in ("Steps", "Mean ms", "P90 ms", "Max ms", "Compute", "Wait"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in ranks:
        stats = row.get("step_ms") or {}
        slow = slowest_rank is not None and row.get("rank") == slowest_rank
        table.add_row(
            Text(_process_label(row) + (" (slowest)" if slow else "")),
            str(stats.get("count", 0)),
            _ms(stats.get("mean")),
            _ms(stats.get("p90")),
            _ms(stats.get("max")),
            _ms(row.get("compute_ms")),
            _ms(row.get("comm_ms")),
            style="bold red" if slow else None,
        )
        windows = row.get("windows") or []
        if len(windows) > 1:
            for window in windows:
                w_stats = window.get("step_ms") or {}
                table.add_row(
                    Text(f"  {window['steps']}"),
                    str(w_stats.get("count", 0)),
                    _ms(w_stats.get("mean")),
                    _ms(w_stats.get("p90")),
                    _ms(w_stats.get("max")),
                    "",
                    "",
                    style="dim",
                )
    table.caption = "Compute = step time outside collectives; Wait = in collectives (c10d, gloo, NCCL), ms/step"
    table.caption_justify = "left"
    return table


def breakdown_table(
    breakdown_ms: Mapping[str, float] | None,
    device: Mapping[str, float] | None = None,
    *,
    title: str = "Step breakdown (mean per step)",
) -> Table:
    """Where a step's time goes: dataloader, forward, backward, optimizer, other; device busy share if known."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("Phase")
    table.add_column("ms / step", justify="right")
    table.add_column("Share", justify="right")
    total = sum((breakdown_ms or {}).values())
    for phase in PHASE_ORDER:
        if breakdown_ms is None:
            break
        value = breakdown_ms.get(phase, 0.0)
        table.add_row(phase, _ms(value), _pct(value / total) if total else "-")
    if device is not None:
        table.add_row("device busy", _ms(device["busy_ms"]), _pct(device["busy_share"]), style="italic")
    return table


# ------------------------------------------------------------------------------------------------ reports
DEFAULT_LIMIT = 20  # operator rows on the terminal and in --markdown without --limit


def print_table_report(
    summary: TraceSummary, *, sort_by: str, limit: int | None, fmt: str, file: IO[str] | None = None
) -> None:
    """Write the report for `stepcli table` to stdout (or `file`) in one of FORMATS.

    A reader that stops early (`stepcli table T | head -1`) ends the report quietly, as it does for other Unix
    tools: the rest is discarded and the command still succeeds.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    out = file if file is not None else sys.stdout
    data = summary.to_dict()
    if fmt != "json":  # names from traces: control characters shown, never sent to the terminal (JSON escapes them)
        data = visible_all(data)
    try:
        if fmt == "json":
            out.write(json_text(data))
        elif fmt == "csv":  # a machine format: every row unless --limit, and a cut said on stderr
            out.write(csv_report(data, sort_by=sort_by, limit=limit))
            cut = csv_cut_note(data, limit)
            if cut:
                print(f"stepcli: note: {cut}", file=sys.stderr)
        elif fmt == "markdown":
            out.write(markdown_report(data, sort_by=sort_by, limit=limit or DEFAULT_LIMIT))
        else:
            print_rich_report(data, _pipe_console(file), sort_by=sort_by, limit=limit or DEFAULT_LIMIT)
        out.flush()  # inside the try: a closed pipe must surface here, not in the interpreter's final flush
    except BrokenPipeError:
        _discard_output(out)


def json_text(data: Any) -> str:
    """`data` as indented JSON text, a newline at the end. msgspec (the trace reader's, already imported) writes
    it: orjson's import would cost `table --json` ~10 ms (it imports zoneinfo); the text is the same."""
    import msgspec

    return msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n"


def _pipe_console(file: IO[str] | None) -> Console:
    """A rich Console that raises BrokenPipeError when its reader is gone.

    rich's own handling redirects stdout and calls `sys.exit(1)`, which would make `| head` look like a failure.
    """
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # drop whatever is still buffered; nothing can reach the reader now
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return pipe_console(_Console, file=file) if file is not None else pipe_console(_Console)


def _discard_output(out: IO[str]) -> None:
    """After a broken pipe on stdout, point its descriptor at /dev/null so that the interpreter's last flush of
    what is still buffered succeeds silently instead of printing "Exception ignored ... BrokenPipeError"."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):
        return
    try:
        stdout_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        stdout_fd = 1
    if fd != stdout_fd:
        return  # a stream the caller opened: closing it is theirs to handle
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def print_rich_report(data: Mapping[str, Any], console: Console, *, sort_by: str = "self", limit: int = 20) -> None:
    """The terminal report: what was read, step times, ranks, breakdown, CPU operators, device kernels."""
    files = data["files"]
    stats = data.get("step_ms")
    head = f"{len(files)} trace file{'s' if len(files) != 1 else ''}, {data['events']:,} events"
    if len(files) == 1:
        head += f": {files[0]}"
    console.print(head, highlight=False, soft_wrap=True, markup=False)
    if data.get("skipped_events"):
        console.print(_skipped_note(data["skipped_events"]), highlight=False, soft_wrap=True, markup=False)
    if stats:
        console.print(
            f"step time over {stats['count']} step{'s' if stats['count'] != 1 else ''}: mean {_ms(stats['mean'])} ms, "
            f"median {_ms(stats['median'])} ms, p90 {_ms(stats['p90'])} ms, min {_ms(stats['min'])} ms, "
            f"max {_ms(stats['max'])} ms",
            highlight=False,
        )
    else:
        console.print("no ProfilerStep#N annotations: step tables skipped", highlight=False)
    if len(data["ranks"]) > 1:
        console.print(ranks_table(data["ranks"], data.get("slowest_rank"), width=console.width))
        straggler = data.get("straggler")
        if straggler:
            console.print(f"slowest rank: {straggler['evidence']}", highlight=False, markup=False)
        elif data.get("slowest_rank") is not None:
            console.print(f"slowest rank: {data['slowest_rank']}", highlight=False)
        for line in culprit_lines(data.get("culprit")):
            console.print(line, highlight=False, markup=False)
    if data["steps"]:
        console.print(steps_table(data["steps"], limit, width=console.width))
    if data.get("breakdown_ms"):
        console.print(breakdown_table(data["breakdown_ms"], data.get("device")))
    elif data.get("device"):
        console.print(breakdown_table(None, data["device"], title="Device activity"))
    from stepcli.traces.render.device import print_device_section

    print_device_section(data, console)
    share_of = data.get("share_of")
    console.print(
        ops_table(data["cpu_ops"], "CPU operators", limit, sort_by=sort_by, width=console.width, share_of=share_of)
    )
    outside = outside_note(data.get("outside_steps"))
    if outside:
        console.print(outside, highlight=False, soft_wrap=True, markup=False)
    if data["device_kernels"]:
        console.print(
            ops_table(
                data["device_kernels"], "Device kernels", limit, sort_by=sort_by, width=console.width, share_of=share_of
            )
        )


_CSV_FIELDS = ("kind", "name", "calls", "self_ms", "total_ms", "avg_ms", "self_share")


def csv_report(data: Mapping[str, Any], *, sort_by: str = "self", limit: int | None = None) -> str:
    """One CSV table of operator rows, CPU then device, with a `kind` column; names are never shortened."""
    buffer = io.StringIO()
    with_shape = any("shape" in r for r in [*data["cpu_ops"], *data["device_kernels"]])
    fields = (*_CSV_FIELDS, "shape") if with_shape else _CSV_FIELDS
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for kind, rows in (("cpu", data["cpu_ops"]), ("device", data["device_kernels"])):
        for row in sort_rows(rows, sort_by, limit):
            writer.writerow({"kind": kind, **row})
    return buffer.getvalue()


def _md_text(value: Any) -> str:
    """Text from traces for Markdown: HTML special characters as entities (a name holding `<img ...>` is shown,
    not rendered), control characters as escapes (stepcli.fmt.visible)."""
    text = visible(str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def csv_cut_note(data: Mapping[str, Any], limit: int | None) -> str | None:
    """What `--limit` left out of the CSV, or None when it holds every row."""
    if limit is None:
        return None
    cut = [
        f"{min(limit, len(rows))} of {len(rows)} {what}"
        for what, rows in (("CPU operators", data["cpu_ops"]), ("device kernels", data["device_kernels"]))
        if len(rows) > limit
    ]
    return f"the CSV holds {' and '.join(cut)} (--limit {limit})" if cut else None


def _md_cell(value: Any) -> str:
    return _md_text(str(value).replace("\n", " ")).replace("\\", "\\\\").replace("|", "\\|")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines


def markdown_report(data: Mapping[str, Any], *, sort_by: str = "self", limit: int | None = 20) -> str:
    """GitHub-flavoured Markdown (e.g. for $GITHUB_STEP_SUMMARY): steps, ranks, breakdown and operator tables."""
    from stepcli.traces.analyses.shares import overlap_note, share_caption

    lines: list[str] = ["## stepcli table", ""]
    stats = data.get("step_ms")
    lines.append(f"{len(data['files'])} trace file(s), {data['events']:,} events.")
    if data.get("skipped_events"):
        lines[-1] += f" {_skipped_note(data['skipped_events']).capitalize()}."
    if stats:
        lines.append(
            f"Step time over {stats['count']} steps: mean {_ms(stats['mean'])} ms, median {_ms(stats['median'])} ms, "
            f"p90 {_ms(stats['p90'])} ms, max {_ms(stats['max'])} ms."
        )
    lines.append("")
    if data["steps"]:
        lines += ["### Steps", ""]
        steps = first_per_process(data["steps"], limit, _process_label)
        lines += _md_table(
            ("Process", "Step", "ms"),
            [(_process_label(s), s["step"], _ms(s["dur_ms"])) for s in steps],
            (False, True, True),
        )
        lines.append("")
        if len(steps) < len(data["steps"]):  # never cut silently
            lines += [f"First {limit} steps of each process shown ({len(steps)} of {len(data['steps'])}, --limit).", ""]
    if data["ranks"]:
        slowest = data.get("slowest_rank")
        lines += ["### Ranks", ""]
        rows: list[Sequence[Any]] = []
        for r in data["ranks"]:
            st = r.get("step_ms") or {}
            mark = " (slowest)" if slowest is not None and r["rank"] == slowest else ""
            files = ", ".join(r.get("files") or [r.get("file") or ""])
            rows.append(
                (
                    _process_label(r) + mark,
                    files,
                    st.get("count", 0),
                    _ms(st.get("mean")),
                    _ms(st.get("median")),
                    _ms(st.get("p90")),
                    _ms(st.get("max")),
                    _ms(r.get("compute_ms")),
                    _ms(r.get("comm_ms")),
                )
            )
        lines += _md_table(
            ("Process", "Files", "Steps", "Mean ms", "Median ms", "P90 ms", "Max ms", "Compute ms", "Wait ms"),
            rows,
            (False, False, True, True, True, True, True, True, True),
        )
        lines.append("")
        if data.get("straggler"):
            lines += [f"Slowest rank: {_md_text(data['straggler']['evidence'])}.", ""]
        culprit = culprit_lines(data.get("culprit"))
        lines += [_md_text(f"C{line[1:]}") for line in culprit] + [""] * bool(culprit)
    breakdown = data.get("breakdown_ms")
    if breakdown:
        total = sum(breakdown.values())
        lines += ["### Step breakdown (mean per step)", ""]
        rows = [(p, _ms(breakdown[p]), _pct(breakdown[p] / total) if total else "-") for p in PHASE_ORDER]
        if data.get("device"):
            rows.append(("device busy", _ms(data["device"]["busy_ms"]), _pct(data["device"]["busy_share"])))
        lines += _md_table(("Phase", "ms / step", "Share"), rows, (False, True, True))
        lines.append("")
    for title, rows_in in (("CPU operators", data["cpu_ops"]), ("Device kernels", data["device_kernels"])):
        if not rows_in and title == "Device kernels":
            continue
        lines += [f"### {title}", ""]
        rows = [
            (
                f"`{r['name']}`" if "`" not in r["name"] else r["name"],
                r["calls"],
                _ms(r["self_ms"]),
                _pct(r["self_share"]),
                _ms(r["total_ms"]),
                _ms(r["avg_ms"]),
            )
            for r in sort_rows(rows_in, sort_by, limit)
        ]
        lines += _md_table(
            ("Name", "Calls", "Self ms", "Self %", "Total ms", "Avg ms"), rows, (False, True, True, True, True, True)
        )
        shown = (
            f"{len(rows)} of {len(rows_in)} rows, sorted by {sort_by} (--limit). " if len(rows) < len(rows_in) else ""
        )
        lines += ["", f"{shown}{share_caption(data.get('share_of'))}.", ""]
        lines += [f"{note}.", ""] if (note := overlap_note(rows_in)) else []
        outside = outside_note(data.get("outside_steps")) if title == "CPU operators" else None
        if outside:
            lines += [f"{outside[0].upper()}{outside[1:]}.", ""]
    return "\n".join(lines)
