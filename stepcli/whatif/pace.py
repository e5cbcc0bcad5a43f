"""A prediction at the program's own pace: the profiler's cost per step is taken off, as much of it
as the change leaves. Pure.

The profiler costs a fixed few microseconds per recorded operator, not a share of the step: the
recorded steps are slower than the untouched ones by that cost (measured minus untouched), spent
where the operators are. A change that scales an operator's span scales the cost recorded in it
too, so what is left of the cost is its share per operator times how much of each operator's span
the change leaves. Scaling the prediction by the ratio of untouched to measured time instead would
shrink that cost with whatever the change removes: removing a sleep of 4 ms from a 5 ms step would
take four fifths of the profiler's cost away with it, and the program's-pace figure would come out
too slow (issue 48's data-loader case: +163% against a run made without the sleep).
"""

from __future__ import annotations

import numpy as np

from stepcli.whatif.lanegraph import Graph, WhatifChange
from stepcli.whatif.lanereplay import speeds


def at_program_pace(
    graph: Graph,
    change: WhatifChange,
    predicted_ms: float,
    measured_ms: float,
    untouched_ms: float,
) -> float:
    """`predicted_ms` (the profiler's pace) less the profiler's cost per step (measured -
    untouched) that the change leaves: the cost times the mean share of each recorded operator's
    span the change leaves. An untouched pace slower than the recorded one (no visible cost) adds
    the difference in the same share. Never below zero."""
    return max(predicted_ms - (measured_ms - untouched_ms) * left_share(graph, change), 0.0)


def left_share(graph: Graph, change: WhatifChange) -> float:
    """The mean, over the windows' recorded operators (every depth, every lane), of the share of
    each one's span the change leaves (an instant's operator: the speed where it is); 1 without
    operators."""
    operators = 0
    left_total = 0.0
    for li, lane in enumerate(graph.lanes):
        if len(lane.grid) < 2:
            continue
        lo, hi = graph.start[li], graph.end[li]
        speed = speeds(lane, change)
        integral = np.concatenate(([0.0], np.cumsum(np.diff(lane.grid) * speed)))
        inside = (lane.op_start >= lo) & (lane.op_end <= hi)
        starts, ends = lane.op_start[inside], lane.op_end[inside]
        own = ends - starts
        left = np.interp(ends, lane.grid, integral) - np.interp(starts, lane.grid, integral)
        where = np.clip(np.searchsorted(lane.grid, starts, "right") - 1, 0, len(speed) - 1)
        # a speed above 1 (a change that slows) leaves more than the whole span
        share = np.where(own > 0, left / np.where(own > 0, own, 1.0), speed[where])
        operators += len(starts)
        left_total += float(share.sum())
    return left_total / operators if operators else 1.0
