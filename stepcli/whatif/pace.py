"""A prediction at the program's own pace: the profiler's cost per step is taken off, as much of it
as the change keeps. Pure.

The profiler costs a fixed few microseconds per recorded operator, not a share of the step: the
recorded steps are slower than the untouched ones by that cost (measured minus untouched), and a
change keeps it all unless it removes operators. Scaling the prediction by the ratio of untouched
to measured time instead would shrink that cost with whatever the change removes: removing a sleep
of 4 ms from a 5 ms step would take four fifths of the profiler's cost away with it, and the
program's-pace figure would come out too slow (issue 48's data-loader case: +163% against a run
made without the sleep).
"""

from __future__ import annotations

import numpy as np

from stepcli.whatif.lanegraph import Graph, WhatifChange
from stepcli.whatif.lanereplay import speeds

# an operator whose span the change shrinks below this share of its length is removed with it
REMOVED_SHARE = 1e-9


def at_program_pace(
    graph: Graph,
    change: WhatifChange,
    predicted_ms: float,
    measured_ms: float,
    untouched_ms: float,
) -> float:
    """`predicted_ms` (the profiler's pace) less the profiler's cost per step that the change
    keeps: the cost (measured - untouched) times the share of recorded operators the change does
    not remove, at most the operators' own time left under the change (the cost is spent inside
    them). An untouched pace slower than the recorded one (no visible cost) adds the difference."""
    cost = measured_ms - untouched_ms
    kept_share, busy_ms = _kept(graph, change)
    kept_cost = min(cost * kept_share, busy_ms) if cost > 0 else cost
    return max(predicted_ms - kept_cost, 0.0)


def _kept(graph: Graph, change: WhatifChange) -> tuple[float, float]:
    """The share of the windows' recorded operators (every depth, every lane) the change keeps, and
    the lanes' mean time inside outermost operators per step under it (ms)."""
    operators = kept = 0
    busy_us: list[float] = []
    for li, lane in enumerate(graph.lanes):
        lo, hi = graph.start[li], graph.end[li]
        if len(lane.grid) < 2:
            busy_us.append(0.0)
            continue
        speed = speeds(lane, change)
        scaled = np.diff(lane.grid) * speed
        integral = np.concatenate(([0.0], np.cumsum(scaled)))
        inside = (lane.op_start >= lo) & (lane.op_end <= hi)
        starts, ends = lane.op_start[inside], lane.op_end[inside]
        own = ends - starts
        left = np.interp(ends, lane.grid, integral) - np.interp(starts, lane.grid, integral)
        # an instant's operator goes with the interval it starts in
        where = np.clip(np.searchsorted(lane.grid, starts, "right") - 1, 0, len(speed) - 1)
        removed = np.where(own > 0, left <= own * REMOVED_SHARE, speed[where] == 0)
        operators += len(starts)
        kept += len(starts) - int(np.count_nonzero(removed))
        window = (lane.grid[:-1] >= lo) & (lane.grid[1:] <= hi) & lane.busy
        busy_us.append(float(scaled[window].sum()))
    share = kept / operators if operators else 1.0
    per_step = float(np.mean(busy_us)) / len(graph.steps) / 1000.0 if busy_us else 0.0
    return share, per_step
