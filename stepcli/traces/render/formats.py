"""`stepcli table`'s report in the format asked for (print_table_report): the terminal's rich tables
(stepcli.traces.render.terminal), or for machines and CI JSON, CSV of every row, and a Markdown
report (for a pull request or $GITHUB_STEP_SUMMARY).
"""

from __future__ import annotations

import csv
import io
import re
import sys
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from stepcli.fmt import ms_cell as _ms
from stepcli.fmt import plural
from stepcli.pipeconsole import discard_stdout, json_for, pipe_console
from stepcli.safetext import visible, visible_all
from stepcli.traces.analyses.culpritwords import culprit_lines
from stepcli.traces.analyses.ranks import first_per_process
from stepcli.traces.render.terminal import (
    DEFAULT_LIMIT,
    FORMATS,
    PHASE_ORDER,
    left_out_notes,
    outside_note,
    pct,
    print_rich_report,
    process_label,
    repeated_note,
    skipped_note,
    sort_rows,
)

if TYPE_CHECKING:
    from stepcli.traces.analyses.results import TraceSummary


def json_text(data: Any) -> str:
    """`data` as indented JSON text, a newline at the end. msgspec (the trace reader's, already
    imported) writes it: orjson's import would cost `table --json` ~10 ms (it imports zoneinfo); the
    text is the same."""
    import msgspec

    return msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n"


_CSV_FIELDS = ("kind", "name", "calls", "self_ms", "total_ms", "avg_ms", "self_share")


def csv_report(data: Mapping[str, Any], *, sort_by: str = "self", limit: int | None = None) -> str:
    """One CSV table of operator rows, CPU then device, with a `kind` column; names are never
    shortened."""
    buffer = io.StringIO()
    with_shape = any("shape" in r for r in [*data["cpu_ops"], *data["device_kernels"]])
    fields = (*_CSV_FIELDS, "shape") if with_shape else _CSV_FIELDS
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for kind, rows in (("cpu", data["cpu_ops"]), ("device", data["device_kernels"])):
        for row in sort_rows(rows, sort_by, limit):
            writer.writerow({"kind": kind, **_csv_rounded(row), "name": _csv_text(row["name"])})
    # --stacks: a `python_stack` row per stack, its frames outermost first joined by `;` (the
    # folded-stack lines flame graph tools read), ms per step; no calls
    for row in ((data.get("python_stacks") or {}).get("stacks") or [])[:limit]:
        figures = {k: row[k] for k in ("self_ms", "total_ms", "self_share")}
        writer.writerow(
            {
                "kind": "python_stack",
                **_csv_rounded(figures),
                "name": _csv_text(";".join(row["stack"])),
            }
        )
    return buffer.getvalue()


def _csv_rounded(row: Mapping[str, Any]) -> dict[str, Any]:
    """Times to the microsecond (`3.188`, not the float sum `3.1879690000000003`), shares to
    0.0001%: what the trace's clock resolves, no float noise."""
    out = dict(row)
    for key, value in row.items():
        if isinstance(value, float):
            out[key] = (
                round(value, 3)
                if key.endswith("_ms")
                else round(value, 6)
                if key.endswith("share")
                else value
            )
    return out


def _csv_text(name: str) -> str:
    """A name as a spreadsheet shows it, never runs it: one starting with = + - @ or a tab or
    carriage return (a formula to Excel or LibreOffice: `=HYPERLINK(...)` from a hostile trace) gets
    a leading apostrophe."""
    return "'" + name if name[:1] in _FORMULA_STARTS else name


_FORMULA_STARTS = frozenset("=+-@\t\r")


def _md_text(value: Any) -> str:
    """Text from traces for Markdown: HTML special characters as entities (a name holding `<img
    ...>` is shown, not rendered), control characters as escapes (stepcli.safetext.visible)."""
    text = visible(str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def csv_cut_note(data: Mapping[str, Any], limit: int | None) -> str | None:
    """What `--limit` left out of the CSV, or None when it holds every row."""
    if limit is None:
        return None
    cut = [
        f"{min(limit, len(rows))} of {len(rows)} {what}"
        for what, rows in (
            ("CPU operators", data["cpu_ops"]),
            ("device kernels", data["device_kernels"]),
        )
        if len(rows) > limit
    ]
    return f"the CSV holds {' and '.join(cut)} (--limit {limit})" if cut else None


def _code_span(name: str) -> str:
    """A name as a Markdown code span, fenced by more backticks than it holds in a row (CommonMark),
    so a name with backticks is still shown as written: never a link, an image or emphasis
    (`[x](http://...)` from a hostile trace)."""
    longest = max((len(run) for run in re.findall("`+", name)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {name} {fence}" if longest else f"`{name}`"


def _md_cell(value: Any) -> str:
    return _md_text(str(value).replace("\n", " ")).replace("\\", "\\\\").replace("|", "\\|")


def _md_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool]
) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines


def markdown_report(
    data: Mapping[str, Any],
    *,
    sort_by: str = "self",
    limit: int | None = 20,
    stacks: int | None = None,
) -> str:
    """GitHub-flavoured Markdown (e.g. for $GITHUB_STEP_SUMMARY): steps, ranks, breakdown and
    operator tables."""
    lines: list[str] = ["## stepcli table", ""]
    lines += _md_overview(data)
    if data["steps"]:
        lines += _md_steps(data["steps"], limit)
    if data["ranks"]:
        lines += _md_ranks(data)
    if data.get("breakdown_ms"):
        lines += _md_breakdown(data["breakdown_ms"], data.get("device"))
        lines += _md_other(data)
    lines += _md_operators(data, sort_by, limit)
    lines += _md_stacks(data.get("python_stacks"), stacks)
    return "\n".join(lines)


def _md_overview(data: Mapping[str, Any]) -> list[str]:
    """Files and events, the step time's statistics, what was left out."""
    lines = [f"{len(data['files'])} trace file(s), {data['events']:,} events."]
    if data.get("skipped_events"):
        lines[-1] += f" {skipped_note(data['skipped_events']).capitalize()}."
    stats = data.get("step_ms")
    if stats:
        lines.append(
            f"Step time over {plural(stats['count'], 'step')}: mean {_ms(stats['mean'])} ms, "
            f"median {_ms(stats['median'])} ms, p90 {_ms(stats['p90'])} ms, max "
            f"{_ms(stats['max'])} ms."
        )
    lines += [note[0].upper() + note[1:] + "." for note in left_out_notes(data)]
    return [*lines, ""]


def _md_steps(all_steps: Sequence[Mapping[str, Any]], limit: int | None) -> list[str]:
    lines = ["### Steps", ""]
    steps = first_per_process(all_steps, limit, process_label)
    lines += _md_table(
        ("Process", "Step", "ms"),
        [(process_label(s), s["step"], _ms(s["dur_ms"])) for s in steps],
        (False, True, True),
    )
    lines.append("")
    if len(steps) < len(all_steps):  # never cut silently
        lines += [
            f"First {limit} steps of each process shown ({len(steps)} of {len(all_steps)}, "
            f"--limit).",
            "",
        ]
    return lines


def _md_ranks(data: Mapping[str, Any]) -> list[str]:
    """The ranks' table, then the slowest rank, the culprit and the notes on repeated ranks and
    mixed jobs."""
    slowest = data.get("slowest_rank")
    lines = ["### Ranks", ""]
    rows: list[Sequence[Any]] = []
    for r in data["ranks"]:
        st = r.get("step_ms") or {}
        mark = " (slowest)" if slowest is not None and r["rank"] == slowest else ""
        files = ", ".join(r.get("files") or [r.get("file") or ""])
        rows.append(
            (
                process_label(r) + mark,
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
        (
            "Process",
            "Files",
            "Steps",
            "Mean ms",
            "Median ms",
            "P90 ms",
            "Max ms",
            "Compute ms",
            "Wait ms",
        ),
        rows,
        (False, False, True, True, True, True, True, True, True),
    )
    lines.append("")
    if data.get("straggler"):
        lines += [f"Slowest rank: {_md_text(data['straggler']['evidence'])}.", ""]
    culprit = culprit_lines(data.get("culprit"))
    lines += [_md_text(f"C{line[1:]}") for line in culprit] + [""] * bool(culprit)
    for note in (repeated_note(data.get("repeated_ranks")), data.get("mixed_jobs")):
        if note:
            lines += [_md_text(f"{note[0].upper()}{note[1:]}."), ""]
    return lines


def _md_breakdown(breakdown: Mapping[str, float], device: Mapping[str, Any] | None) -> list[str]:
    total = sum(breakdown.values())
    lines = ["### Step breakdown (mean per step)", ""]
    rows: list[Sequence[Any]] = [
        (p, _ms(breakdown[p]), pct(breakdown[p] / total) if total else "-") for p in PHASE_ORDER
    ]
    if device:
        rows.append(("device busy", _ms(device["busy_ms"]), pct(device["busy_share"])))
    lines += _md_table(("Phase", "ms / step", "Share"), rows, (False, True, True))
    return [*lines, ""]


def _md_operators(data: Mapping[str, Any], sort_by: str, limit: int | None) -> list[str]:
    """The CPU operators' table and, when there are any, the device kernels', each with its
    caption."""
    from stepcli.traces.analyses.shares import overlap_note, share_caption

    lines: list[str] = []
    for title, rows_in in (
        ("CPU operators", data["cpu_ops"]),
        ("Device kernels", data["device_kernels"]),
    ):
        if not rows_in and title == "Device kernels":
            continue
        lines += [f"### {title}", ""]
        rows = [
            (
                _code_span(r["name"]),
                r["calls"],
                _ms(r["self_ms"]),
                pct(r["self_share"]),
                _ms(r["total_ms"]),
                _ms(r["avg_ms"]),
            )
            for r in sort_rows(rows_in, sort_by, limit)
        ]
        lines += _md_table(
            ("Name", "Calls", "Self ms", "Self %", "Total ms", "Avg ms"),
            rows,
            (False, True, True, True, True, True),
        )
        shown = (
            f"{len(rows)} of {len(rows_in)} rows, sorted by {sort_by} (--limit). "
            if len(rows) < len(rows_in)
            else ""
        )
        lines += ["", f"{shown}{share_caption(data.get('share_of'))}.", ""]
        lines += [f"{note}.", ""] if (note := overlap_note(rows_in)) else []
        outside = outside_note(data.get("outside_steps")) if title == "CPU operators" else None
        if outside:
            lines += [f"{outside[0].upper()}{outside[1:]}.", ""]
    return lines


def _md_other(data: Mapping[str, Any]) -> list[str]:
    """The line under the breakdown saying what its "other" is made of."""
    from stepcli.traces.render.stacksection import other_lines

    other = other_lines(data)
    return [_md_text(other[0]) + ".", ""] if other else []


def _md_stacks(document: Mapping[str, Any] | None, stacks: int | None) -> list[str]:
    """`--stacks N` in Markdown: the top N Python stacks, innermost frame first."""
    if not (stacks and document and document["stacks"]):
        return []
    from stepcli.traces.analyses.pystacks import short_frame

    rows = [
        (
            _code_span(" < ".join(short_frame(f) for f in reversed(r["stack"]))),
            _ms(r["self_ms"]),
            pct(r["self_share"]),
            _ms(r["total_ms"]),
            pct(r["total_share"]),
        )
        for r in document["stacks"][:stacks]
    ]
    headers = ("Stack (innermost first)", "Self ms", "Self %", "Total ms", "Total %")
    lines = [
        "### Python stacks by self time",
        "",
        *_md_table(headers, rows, (False, True, True, True, True)),
    ]
    return [*lines, "", f"ms per step over {plural(document['steps'], 'recorded step')}.", ""]


def print_table_report(
    summary: TraceSummary,
    *,
    sort_by: str,
    limit: int | None,
    fmt: str,
    file: IO[str] | None = None,
    stacks: int | None = None,
) -> None:
    """Write the report for `stepcli table` to stdout (or `file`) in one of FORMATS; `stacks`: the
    top Python stacks too (--stacks N; --json and --csv hold every one).

    A reader that stops early (`stepcli table T | head -1`) ends the report quietly, as it does for
    other Unix tools: the rest is discarded and the command still succeeds.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    out = file if file is not None else sys.stdout
    data = summary.to_dict()
    # names from traces: control characters shown, never sent to the terminal (JSON escapes them)
    if fmt != "json":
        data = visible_all(data)
    try:
        if fmt == "json":
            # (a stdout that is not UTF-8: escapes, never look-alikes)
            out.write(json_for(out, json_text(data)))
        elif fmt == "csv":  # a machine format: every row unless --limit, and a cut said on stderr
            out.write(csv_report(data, sort_by=sort_by, limit=limit))
            cut = csv_cut_note(data, limit)
            if cut:
                print(f"stepcli: note: {cut}", file=sys.stderr)
        elif fmt == "markdown":
            out.write(
                markdown_report(data, sort_by=sort_by, limit=limit or DEFAULT_LIMIT, stacks=stacks)
            )
        else:
            print_rich_report(
                data,
                pipe_console(file=file) if file is not None else pipe_console(),
                sort_by=sort_by,
                limit=limit or DEFAULT_LIMIT,
                stacks=stacks,
            )
        if stacks and fmt in ("json", "csv", "markdown"):
            from stepcli.traces.render.stacksection import stacks_missing

            note = stacks_missing(data)
            if note:
                print(note, file=sys.stderr)
        # inside the try: a closed pipe must surface here, not in the interpreter's final flush
        out.flush()
    except BrokenPipeError:
        discard_stdout(out)
