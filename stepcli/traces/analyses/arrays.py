"""The operator tree of a trace computed over typed arrays (numpy) instead of one Python step per
event.

A trace's kept events become columns (`Columns`): name, category kind, process, thread, start and
duration. The nesting torch's `_populate_cpu_children` builds with a stack per thread is, for events
sorted by (start, -duration), "the parent of an event is the latest earlier event of its thread that
contains it" (an event the stack popped was popped by a later event that also contains everything it
would have contained). That is a previous-greater search on end times, done here for every event at
once by binary lifting over range maxima. torch's `_remove_dup_nodes` (an only child with its
parent's name is folded into the parent) is then a few array passes.

`stepcli.traces.analyses.reference.analyze_events` is the readable per-event reference this must
equal; it is still used for traces whose times do not fit 64-bit nanoseconds (the reference uses
Python integers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepcli.traces.read.typedcolumns import OTHER_CPU, USER_ANNOTATION, Columns

# times and sums past this could overflow int64 or lose float64 exactness: use the reference
_LIMIT_NS = 2**62
_EXACT_FLOAT = 2**53


class TooLarge(Exception):
    """Times that do not fit the int64 arrays: the caller uses the per-event reference."""


@dataclass
class Nanoseconds:
    """Integer nanosecond starts and durations relative to the first kept event, as the reference
    computes them."""

    start: np.ndarray
    dur: np.ndarray


def nanoseconds(columns: Columns) -> Nanoseconds:
    if not len(columns):
        return Nanoseconds(np.zeros(0, np.int64), np.zeros(0, np.int64))
    base = int(columns.ts[0])
    # np.rint rounds halves to even, as Python's round() does; the float arithmetic is the
    # reference's.
    start = np.rint((columns.ts - base) * 1000)
    dur = np.rint(columns.dur * 1000)
    if (
        np.abs(start).max() >= _LIMIT_NS
        or dur.max() >= _LIMIT_NS
        or float(dur.sum()) >= _EXACT_FLOAT
    ):
        raise TooLarge
    return Nanoseconds(start.astype(np.int64), dur.astype(np.int64))


def parents(start: np.ndarray, end: np.ndarray, dur: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The parent index of each event (-1: none) for events sorted by thread, then (start,
    -duration).

    `first[i]` is the index of the first event of i's thread. The parent is the latest earlier event
    j of the thread with end[j] > start[i] and end[j] >= end[i] (strictly later end for a
    zero-length event). Times are integers (nanoseconds): the search below relies on it.

    Each event's candidate starts as the event just before it (most events are a first child, which
    it contains) and, while it does not contain the event, jumps to the candidate's own candidate,
    all at once (pointer doubling, a few rounds over the events still looking). The jump skips only
    events that fail: those between a candidate c and c's candidate end no later than c does (they
    fail c), and c ends before the event needs.
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64)
    need = end + (dur == 0)  # end[j] >= need[i] is containment, given start[j] <= start[i]
    candidate = np.arange(-1, n - 1, dtype=np.int64)
    candidate[candidate < first] = -1  # a thread's first event has no parent
    looking = np.nonzero(candidate >= 0)[0]
    looking = looking[end[candidate[looking]] < need[looking]]
    while looking.size:
        jumped = candidate[candidate[looking]]
        candidate[looking] = jumped
        some = jumped >= 0  # (-1: nothing before it in the thread contains the event)
        looking, jumped = looking[some], jumped[some]
        looking = looking[end[jumped] < need[looking]]
    return candidate


def union_arrays(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the sorted disjoint intervals covering the same time (touching intervals
    merge)."""
    if not len(start):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")  # among equal starts any order gives the same union
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    heads = np.nonzero(new)[0]
    tails = np.append(heads[1:] - 1, len(s) - 1)
    return s[heads], reach[tails]


def optimizer_own(
    start: np.ndarray,
    end: np.ndarray,
    optimizer: np.ndarray,
    backward: np.ndarray,
    closure: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The optimizer's own spans (events at `optimizer`) without the backward passes and closure
    calls (events at `backward`, `closure`) nested in them: `optimizer.step(closure)` runs forward
    and backward inside it."""
    nested = [union_arrays(start[e], end[e]) for e in (backward, closure)]
    return without_nested(
        start[optimizer],
        end[optimizer],
        np.concatenate([s for s, _ in nested]),
        np.concatenate([e for _, e in nested]),
    )


def without_nested(
    outer_start: np.ndarray, outer_end: np.ndarray, inner_start: np.ndarray, inner_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The union of the outer spans less the inner spans that each lie inside one of its intervals,
    with the outer spans that lie inside those again: the optimizer's own time without the backward
    passes and closures nested in it, its zero_grad in a closure included
    (stepcli.traces.analyses.steps.optimizer_own, which this equals)."""
    starts, ends = union_arrays(outer_start, outer_end)
    inside = _inside(starts, ends, inner_start, inner_end)
    hole_start, hole_end = union_arrays(inner_start[inside], inner_end[inside])
    if not len(hole_start):
        return starts, ends
    # Each hole lies inside one interval and the holes are disjoint: the pieces left are the
    # interval's start to its first hole, between holes, and its last hole's end to its end; sorted,
    # the two lists pair up.
    piece_start = np.sort(np.concatenate((starts, hole_end)))
    piece_end = np.sort(np.concatenate((hole_start, ends)))
    keep = piece_start < piece_end
    again = _inside(hole_start, hole_end, outer_start, outer_end)
    return union_arrays(
        np.concatenate((piece_start[keep], outer_start[again])),
        np.concatenate((piece_end[keep], outer_end[again])),
    )


def _inside(starts: np.ndarray, ends: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which spans [start, end) each lie inside one interval of the sorted disjoint union (`starts`,
    `ends`)."""
    if not len(starts):
        return np.zeros(len(start), bool)
    # the first ending after start
    at = np.minimum(np.searchsorted(ends, start, side="right"), len(starts) - 1)
    found: np.ndarray = (starts[at] <= start) & (end <= ends[at]) & (start < ends[at])
    return found


def covered(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per span [lo[i], hi[i]): the time of a sorted disjoint union (`starts`, `ends`) inside it, as
    F(hi) - F(lo) where F(t) is the union's length before t (prefix sums and a binary search, no
    step per interval)."""
    if not len(starts):
        return np.zeros(len(lo), np.int64)
    before = np.concatenate(([0], np.cumsum(ends - starts)))  # union length before interval k

    def length_before(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
        prev = np.maximum(k - 1, 0)
        return np.where(k > 0, before[prev] + np.minimum(t, ends[prev]) - starts[prev], 0)

    return np.asarray(length_before(hi) - length_before(lo), np.int64)


def step_phases(
    window_start: np.ndarray,
    window_end: np.ndarray,
    phase_start: list[np.ndarray],
    phase_end: list[np.ndarray],
    forward_start: np.ndarray,
    forward_end: np.ndarray,
) -> list[np.ndarray]:
    """Per window of one process (windows pairwise disjoint): the time of each phase in priority
    order, each counting only time not claimed by the phases before it, then forward, then the rest
    (`summary._step_phases`).

    `phase_start/end[k]` are the spans of the k-th phase anywhere in the process; `forward_*` the
    top-level operators of the windows, already clipped to their window. Because the windows are
    disjoint, the time of "phases 0..k" inside a window is the process-wide union of those spans
    measured inside it."""
    out: list[np.ndarray] = []
    claimed_s: list[np.ndarray] = []
    claimed_e: list[np.ndarray] = []
    before = np.zeros(len(window_start), np.int64)
    for starts, ends in [*zip(phase_start, phase_end), (forward_start, forward_end)]:
        claimed_s.append(starts)
        claimed_e.append(ends)
        now = covered(
            *union_arrays(np.concatenate(claimed_s), np.concatenate(claimed_e)),
            window_start,
            window_end,
        )
        out.append(now - before)
        before = now
    out.append(window_end - window_start - before)
    return out


_DENSE_KEYS = 1 << 24  # keys below this are counted in a table indexed by key (no sort)


def unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D integer array, as np.unique(values) gives them: np.unique
    without return_index/return_inverse imports numpy.ma (10-30 ms of a `stepcli table` run) to
    check for a masked array."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    out: np.ndarray = ordered[keep]
    return out


def isin(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """np.isin(values, wanted) for integer arrays, by binary search (np.isin may call np.unique, see
    unique)."""
    table = unique(wanted)
    if not len(table):
        return np.zeros(len(values), bool)
    found: np.ndarray = table[np.minimum(np.searchsorted(table, values), len(table) - 1)] == values
    return found


def group_sums(keys: np.ndarray, values: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Unique keys and, per key, the count and the integer sum of each value array."""
    if len(keys) and 0 <= keys.min() and keys.max() < _DENSE_KEYS:
        counts = np.bincount(keys)
        unique = np.nonzero(counts)[0]
        sums = [
            np.bincount(keys, weights=v, minlength=len(counts))[unique].round().astype(np.int64)
            for v in values
        ]
        return unique, [counts[unique], *sums]
    unique, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(unique))
    sums = [
        np.bincount(inverse, weights=v, minlength=len(unique)).round().astype(np.int64)
        for v in values
    ]
    return unique, [counts, *sums]


def first_seen(codes: np.ndarray) -> np.ndarray:
    """Per small non-negative code value, the index of its first appearance (len(codes) where it
    never does)."""
    first = np.full(int(codes.max()) + 1 if len(codes) else 0, len(codes), np.int64)
    # with repeated indices, the last write (earliest) wins
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return first


def rows_from(
    keys: np.ndarray,
    key_of: Callable[[int], Any],
    self_ns: np.ndarray,
    total_ns: np.ndarray,
    counted: np.ndarray | None = None,
) -> dict[Any, list[int]]:
    """Row dict {row key: [calls, self ns, total ns]} from per-event key ids (`key_of` turns an id
    into the key).

    Events not `counted` (folded into their parent) add nothing but still make their key's row
    exist, as the reference's undo leaves a row of zeros behind (a folded child whose shape differs
    from its parent's)."""
    if counted is None:
        unique, (calls, self_sum, total_sum) = group_sums(keys, [self_ns, total_ns])
    else:
        unique, (_all, calls, self_sum, total_sum) = group_sums(
            keys, [counted, self_ns * counted, total_ns * counted]
        )
    return {
        key_of(k): [c, s, t]
        for k, c, s, t in zip(
            unique.tolist(), calls.tolist(), self_sum.tolist(), total_sum.tolist()
        )
    }


def first_index_order(codes: np.ndarray) -> np.ndarray:
    """Rank of each code by its first appearance (so grouped results keep the reference's order)."""
    if len(codes) and 0 <= codes.min() and codes.max() < _DENSE_KEYS:
        first = first_seen(codes)
        present = np.nonzero(first < len(codes))[0]
        rank = np.zeros(len(first), np.int64)
        rank[present[np.argsort(first[present], kind="stable")]] = np.arange(len(present))
        ranks: np.ndarray = rank[codes]
        return ranks
    unique, first_index = np.unique(codes, return_index=True)
    rank = np.empty(len(unique), np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(len(unique))
    lookup = np.searchsorted(unique, codes)
    return rank[lookup]


def thread_order(thread: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """The permutation sorting events by (thread, start, -duration, position), as np.lexsort would,
    but faster on a trace: its events come nearly sorted by start, which a stable sort (timsort)
    passes in linear time, equal starts are ordered among themselves only, and threads are few,
    which a stable sort of small integers (radix) orders in linear time."""
    order = np.argsort(start, kind="stable")
    s = start[order]
    equal = s[1:] == s[:-1]
    if equal.any():
        tied = np.zeros(len(s), dtype=bool)
        tied[1:] |= equal
        tied[:-1] |= equal
        at = np.nonzero(tied)[0]
        members = order[at]
        order[at] = members[np.lexsort((at, -dur[members], start[members]))]
    keys = thread[order]
    if len(keys) and keys.max() < np.iinfo(np.int16).max and keys.min() >= 0:
        keys = keys.astype(np.int16)
    return order[np.argsort(keys, kind="stable")]


def analysis_arrays(columns: Columns, ns: Nanoseconds) -> dict[str, np.ndarray]:
    """Per CPU event in (thread, start, -duration) order: index, parent, kept (not folded) and self
    time; and the CPU events in file order (`in_file`)."""
    cpu = np.nonzero((columns.kind == OTHER_CPU) | (columns.kind == USER_ANNOTATION))[0]
    n_ids = max(len(columns.ids), 1)
    thread = first_index_order(columns.pid[cpu].astype(np.int64) * n_ids + columns.tid[cpu])
    start = ns.start[cpu]
    dur = ns.dur[cpu]
    order = thread_order(thread, start, dur)
    index = cpu[order]
    thread = thread[order]
    start = start[order]
    dur = dur[order]
    end = start + dur
    n = len(index)
    first = np.zeros(n, np.int64)
    if n:
        boundary = np.ones(n, dtype=bool)
        boundary[1:] = thread[1:] != thread[:-1]
        heads = np.nonzero(boundary)[0]
        first = heads[np.cumsum(boundary) - 1]
    parent = parents(start, end, dur, first)
    has = parent >= 0
    child_count = np.bincount(parent[has], minlength=n)
    child_sum = np.bincount(parent[has], weights=dur[has], minlength=n).round().astype(np.int64)
    name = columns.name[index]
    folded = np.zeros(n, dtype=bool)
    folded[has] = (child_count[parent[has]] == 1) & (name[has] == name[parent[has]])
    only_child = np.full(n, -1, np.int64)
    only_child[parent[has]] = np.nonzero(has)[0]
    bottom = np.arange(n, dtype=np.int64)
    while True:
        nxt = only_child[bottom]
        step = (nxt >= 0) & folded[np.maximum(nxt, 0)]
        if not step.any():
            break
        bottom = np.where(step, nxt, bottom)
    self_ns = dur - child_sum[bottom]
    return {
        "index": index,
        "thread": thread,
        "start": start,
        "end": end,
        "dur": dur,
        "parent": parent,
        "kept": ~folded,
        "self": self_ns,
        "in_file": cpu,
    }
