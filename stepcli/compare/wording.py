"""Numbers in words for `stepcli compare`'s verdict line and reports: ms, signed deltas,
percentages, intervals."""

from __future__ import annotations

from typing import TYPE_CHECKING

# re-exported: compare's ms numbers come from stepcli.fmt
from stepcli.fmt import ms_fixed as fmt_ms

if TYPE_CHECKING:
    from stepcli.compare.inference import Change

__all__ = ["fmt_ms"]


def signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def pct(delta: float | None, base: float | None) -> str:
    if delta is None or base is None:
        return "-"
    if base == 0:
        return "n/a"
    return f"{delta / base * 100:+.1f}%"


def fmt_pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def fmt_level(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def ci(change: Change) -> str:
    """`+5.1% .. +9.3%` (the ratio interval when there is one), or in ms when the baseline is 0."""
    relative = change.relative_interval()
    if relative is None:
        return f"{signed(change.low)} .. {signed(change.high)} ms"
    return f"{pct(relative[0], 1.0)} .. {pct(relative[1], 1.0)}"


def allowed(limit: float, tolerance: float, base: float, min_delta_ms: float) -> str:
    return (
        f"the allowed +{fmt_ms(limit)} ms (larger of tolerance {fmt_pct(tolerance)} of baseline "
        f"= {fmt_ms(tolerance * base)} ms and --min-delta-ms {fmt_ms(min_delta_ms)})"
    )
