"""What an operator's "Self %" is a share of: one definition for `table`, the run summary and
`compare`.

A share is the operator's self time over the **recorded step time** (the sum of every complete
ProfilerStep#N of every trace), so the rows of a table and the step breakdown speak about the same
whole. `ProfilerStep*`, the step annotation itself, is step time outside any operator: it is no
operator's work and is left out of the operator tables of the run summary and `compare`. A trace
without step annotations has no step time; its shares are then of the total self time of its
operators. Host events outside every step of their process are no step's time: they are in no table
(stepcli.traces.analyses.traceanalysis counts them apart). Operators on other threads (autograd,
data loading) run alongside the step, so the shares of a table can add up to more than 100%.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

STEP_KEY = "ProfilerStep*"  # key_averages() folds every ProfilerStep#N into this one row

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def share_basis(step_ns: int, steps: int, self_ns_without_steps: int) -> tuple[int, str]:
    """(denominator in ns, what it is in words) for the shares of one summary."""
    if steps and step_ns > 0:
        return step_ns, f"recorded step time ({steps} step{'s' if steps != 1 else ''})"
    return self_ns_without_steps, "total operator self time (no complete step)"


def share_caption(share_of: str | None) -> str:
    """The caption line an operator table carries, so its Self % column says what it is a share
    of."""
    return f"Self % = share of {share_of or 'recorded step time'}"


def overlap_note(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The note under an operator table whose Self % adds up to more than 100% (all its rows, shown
    or not), or None: without it a column summing to 124% reads as a bug."""
    total = sum(float(r.get("self_share") or 0.0) for r in rows)
    if total <= 1.0 + 1e-9:
        return None
    return (
        f"Self % adds up to {total * 100:.0f}% over all rows: operators on other threads "
        f"(autograd, gloo or NCCL "
        "communication, DataLoader workers) run at the same time as the step's main thread, so "
        "their shares overlap"
    )


def stable_name(name: str) -> str:
    """An event name without memory addresses (`<built-in method mul_ of Parameter object at
    0x7fd0...>`): addresses change every run, and names are the keys `compare` matches on."""
    return _ADDRESS.sub("", name) if " at 0x" in name else name
