"""How stepcli writes numbers and messages for people: durations, sizes, shares, one-line messages
wrapped.

One home, so the terminal, the tables and report.html round alike. Sizes are binary (1 KiB = 1024
bytes) and labelled KiB/MiB/GiB, never KB/MB. JSON documents keep raw numbers (`*_bytes`, `*_ms`);
only rendering uses this. The agent (inside the profiled program, standard library only, importing
nothing of stepcli outside itself) keeps its own copy of `size` in stepcli/agent/output.py;
tests/unit/test_fmt.py checks that the two agree. Names from traces and programs are made safe to
show by stepcli/safetext.py.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from stepcli.safetext import visible

_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
# 11.6 days: a longer "duration" is a broken or hostile number, shown in scientific notation
_HUGE_MS = 1e9


def us(value: float) -> str:
    """A short duration given in microseconds, as the terminal, the page and the advice all write
    it: `878 µs`, `11.09 ms`."""
    # (999.6 would read "1000 µs")
    return f"{value:.0f} µs" if abs(value) < 999.5 else f"{value / 1000:.2f} ms"


def ms(value: float | None) -> str:
    """A duration given in milliseconds, with its unit and about 3-4 significant digits: `0.412 ms`,
    `12.3 ms`, `1.25 s`; `-` for none."""
    if value is None:
        return "-"
    if value == 0:
        return "0 ms"
    # a broken or hostile trace: keep the line readable (and inf/nan as such)
    if not abs(value) < _HUGE_MS:
        return f"{value / 1000:.3g} s"
    if abs(value) >= 1000:
        return f"{value / 1000:.2f} s"
    if abs(value) >= 100:
        return f"{value:.0f} ms"
    if abs(value) >= 10:
        return f"{value:.1f} ms"
    if abs(value) >= 1:
        return f"{value:.2f} ms"
    return f"{value:.3f} ms"


def ms_cell(value: float | None) -> str:
    """A millisecond number for a table column whose header names the unit: `1,234.5`, `12.35`,
    `0.412`."""
    if value is None:
        return "-"
    if not abs(value) < _HUGE_MS:
        return f"{value:.3g}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ms_fixed(value: float | None) -> str:
    """A millisecond number to the microsecond, for differences read side by side: `10.000`,
    `+0.412` comes from the caller's sign; `-` for none."""
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < _HUGE_MS else f"{value:.6g}"


def seconds(value: float) -> str:
    """A duration given in seconds: `1.42 s`, or `40.0 ms` below a tenth of a second."""
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"


def ms_exact(value: float) -> str:
    """A millisecond number as a user would type it back: 25.0 -> `25`, 31.25 -> `31.25` (budgets,
    limits)."""
    if not abs(value) < _HUGE_MS:
        return f"{value:.6g}"
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text if text not in ("0", "-0") or value == 0 else f"{value:.3g}"


def size(count: float) -> str:
    """A size in bytes, binary units: `512 B`, `1.5 KiB`, `349.2 MiB`, `2.0 GiB`."""
    value = float(count)
    for unit in _SIZE_UNITS:
        if abs(value) < 1024 or unit == _SIZE_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"  # unreachable: the last unit takes any value


def size_or_dash(count: float | None) -> str:
    """`size`, or `-` when nothing was measured (None or 0)."""
    return size(count) if count else "-"


def percent(share: float, digits: int = 0) -> str:
    """A share (0.25) as a percentage: `25%`, or `25.0%` with `digits=1`."""
    return f"{share * 100:.{digits}f}%"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 step`, `4 steps`, `1,024 steps`: a count and its noun, agreeing."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"


def say(message: str) -> None:
    """One `stepcli: ...` line on stderr (stdout belongs to the program, or to the command's
    output)."""
    try:
        # names from programs and files: no ESC, no bidi
        sys.stderr.write(f"stepcli: {visible(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: nothing more can be said


# holds a figure and its unit together while wrapping (never in the text: control characters are
# shown)
_GLUE = "\x1f"
_UNIT = re.compile(r"(?<=\d) (?=(?:ms|s|%|KiB|MiB|GiB|B|steps?|x)\b)")


def _clauses(line: str) -> list[str]:
    """`line` cut after each `, `, `; ` and `: ` outside brackets (a colon only after words: not
    `REGRESSION:`)."""
    parts: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(line):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth = max(0, depth - 1)
        elif depth == 0 and char in ",;:" and line[index + 1 : index + 2] == " ":
            if char == ":" and " " not in line[start:index]:
                continue
            parts.append(line[start : index + 1])
            start = index + 2
    parts.append(line[start:])
    return [part for part in parts if part]


def wrap_clauses(line: str, width: int, indent: str = "  ") -> list[str]:
    """`line` cut into lines of at most `width` characters (where its words allow): between clauses
    (after `, `, `; ` or `: ` outside brackets) where it can, else between words, never between a
    figure and its unit; continuation lines indented. A word longer than the width (a path, a
    command) stays whole."""
    import textwrap

    if len(line) <= width:
        return [line]
    glued = _UNIT.sub(_GLUE, line)
    out: list[str] = []
    current = ""
    for clause in _clauses(glued):
        joined = f"{current} {clause}" if current else clause
        if len(joined) <= width:
            current = joined
            continue
        if current.strip() and len(indent + clause) <= width:  # the clause fits a line of its own
            out.append(current)
            current = indent + clause
            continue
        pieces = textwrap.wrap(  # too long for any line: between words, from where the line stands
            joined,
            width=width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        if out or current.startswith(indent):  # textwrap drops the indent of a continuation line
            pieces[0] = indent + pieces[0] if not pieces[0].startswith(indent) else pieces[0]
        out += pieces[:-1]
        current = pieces[-1]
    if current:
        out.append(current)
    return [part.replace(_GLUE, " ") for part in out]


def print_wrapped(console: Any, line: str, indent: str = "  ") -> None:
    """A long line of plain text (no markup) on a rich Console, wrapped to its width by
    `wrap_clauses`."""
    for part in wrap_clauses(line, max(40, console.width), indent):
        console.print(part, markup=False, highlight=False, soft_wrap=True)
