"""The Python stacks on a terminal (`table --stacks`), and the lines that explain the breakdown's
"other" phase (under the breakdown of `table`, the run summary, the report): what it is made of, and
which code when the traces have stacks. The figures are stepcli.traces.analyses.pystacks's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stepcli.fmt import ms_cell as _ms
from stepcli.traces.analyses.pystacks import HOW_TO_RECORD, short_stack, top_outside

if TYPE_CHECKING:
    from rich.table import Table

OTHER_STACKS = 3  # stacks named under the breakdown's "other"


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def no_stacks_note() -> str:
    """`table --stacks` on traces without Python frames: how to get them, in one line."""
    return f"stepcli: note: --stacks: these traces have no Python stacks; {HOW_TO_RECORD}"


def stacks_missing(data: Mapping[str, Any]) -> str | None:
    """The one line `table --stacks` prints instead of stacks, or None when there are some."""
    document = data.get("python_stacks")
    if not document:
        return no_stacks_note()
    if not document["stacks"]:
        return (
            "stepcli: note: --stacks: no Python frame inside a complete ProfilerStep#N of these "
            "traces"
        )
    return None


def stacks_table(document: Mapping[str, Any], limit: int, width: int) -> Table:
    """The top `limit` stacks by self time: ms per step and share of step time, self and total; each
    stack on one line, innermost frame first, shortened to the room the numbers leave."""
    from rich.table import Table
    from rich.text import Text

    rows = document["stacks"][:limit]
    steps = document["steps"]
    headers = ("Self ms", "Self %", "Total ms", "Total %")
    numbers = [
        [_ms(r["self_ms"]), _pct(r["self_share"]), _ms(r["total_ms"]), _pct(r["total_share"])]
        for r in rows
    ]
    fixed = sum(max([len(h), *(len(n[i]) for n in numbers)]) for i, h in enumerate(headers))
    room = max(20, width - fixed - 3 * (len(headers) + 1) - 1)
    shown = (
        f"{len(rows)} of {len(document['stacks'])} stacks"
        if len(document["stacks"]) > len(rows)
        else None
    )
    caption = "; ".join(
        filter(
            None,
            (
                shown,
                f"ms per step over {steps} recorded step{'s' if steps != 1 else ''}; % of step "
                f"time",
            ),
        )
    )
    table = Table(
        title="Python stacks by self time (innermost frame first)",
        caption=caption,
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Stack", no_wrap=True)
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    for row, cells in zip(rows, numbers):
        # Text: names are data, never markup
        table.add_row(Text(short_stack(row["stack"], room, lines=2)), *cells)
    return table


def other_lines(data: Mapping[str, Any], width: int = 80) -> list[str]:
    """What the breakdown's "other" is made of: outside every operator (the program's Python, the
    profiler) and inside operators no phase claims; then the stacks with the most Python time
    outside operators, or how to see them. Empty when there is no split or no "other"."""
    split = data.get("other_ms")
    breakdown = data.get("breakdown_ms") or {}
    if not split or not breakdown.get("other"):
        return []
    lines = [
        f"other {_ms(breakdown['other'])} ms/step: {_ms(split['outside_operators'])} outside every "
        f"operator (Python, the profiler), {_ms(split['inside_operators'])} in operators of no "
        f"phase"
    ]
    stacks = top_outside(data.get("python_stacks"), OTHER_STACKS)
    if stacks:
        lines.append("  Python time outside operators, by stack (ms/step):")
        for row in stacks:
            figure = _ms(row["outside_operators_ms"])
            lines.append(f"  {figure:>7} {short_stack(row['stack'], width - 11)}")
    elif (data.get("recorded_with") or {}).get("stacks") and data.get("python_stacks") is None:
        lines.append("  by Python stack: stepcli table --stacks")
    return lines
