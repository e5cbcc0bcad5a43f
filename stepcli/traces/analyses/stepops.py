"""Per recorded step, the figures `stepcli compare` attributes a change to: each CPU operator's and
device kernel's self time and the step's phases, equal to summarizing each step's events alone
(stepcli.traces.analyses.mergeparts.summarize), but for every step of a trace in one pass of array
operations.

Summarizing 100,000 steps one at a time cost ~1 ms of Python each (minutes for two traces). Here
each step's events (a contiguous run of the trace's events sorted by start) are one segment: their
nanoseconds are measured from the segment's own first event, as a lone summary measures them, then
every segment is moved onto one timeline, apart from the others, so nesting, step spans and phase
unions never reach across segments, and one array pass gives every segment's figures. A segment
whose windows of one process overlap (which a lone summary measures with the per-window reference)
is left to the caller (`fallback`), and so is a trace the arrays cannot hold (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepcli.traces.analyses.results import NS_PER_MS, PHASES
from stepcli.traces.analyses.shares import STEP_KEY, stable_name
from stepcli.traces.analyses.stepphases import forward_candidates, in_steps_array
from stepcli.traces.analyses.steps import (
    BACKWARD,
    DATALOADER,
    OPTIMIZER,
    is_closure,
    phase_of,
    step_spans_of,
    wraps_backward,
)
from stepcli.traces.read.names import STEP_PREFIX, step_of

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.read.events import Event
    from stepcli.traces.read.typedcolumns import Columns

Key = tuple[str, str]  # ("cpu" | "device" | "phase", name)


@dataclass
class StepTimes:
    """Per key, its milliseconds in each segment (0.0 where absent); `fallback`: segments to
    summarize alone."""

    times: dict[Key, np.ndarray]
    fallback: set[int]


# as stepcli.traces.analyses.arrays: past this, the per-event reference (here: the caller)
_LIMIT_NS = 2**62
_EXACT_FLOAT = 2**53


def step_times(
    events: list[Event],
    segments: list[tuple[int, int]],
    source: tuple[Columns, np.ndarray] | None = None,
) -> StepTimes | None:
    """The figures of each segment [lo, hi) of `events` (sorted by start; segments in order,
    disjoint), as `summarize([Trace.from_events(events[lo:hi])])` gives them; None when segments
    overlap or times are too large. `source`: the columns of the trace's events
    (columns_from_events, file order) and the order that sorts them by start (a stable argsort:
    `events` is then not looked at): the segments' columns are taken from them, coded as from the
    events themselves, instead of a pass of Python over every event."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    count = len(segments)
    lo = np.array([s for s, _ in segments], np.int64)
    hi = np.array([e for _, e in segments], np.int64)
    if not count or np.any(hi[:-1] > lo[1:]) or np.any(hi <= lo):
        return None
    picked = (
        np.concatenate([np.arange(s, e) for s, e in segments]) if count < 64 else _ranges(lo, hi)
    )
    seg = np.repeat(np.arange(count, dtype=np.int64), hi - lo)
    # each segment's first row
    first = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
    columns = _chosen_columns(events, picked) if source is None else _taken_columns(*source, picked)
    # Nanoseconds as each lone summary computes them (stepcli.traces.analyses.arrays.nanoseconds):
    # from its first event.
    base = np.trunc(columns.ts[first])
    start = np.rint((columns.ts - base[seg]) * 1000)
    dur = np.rint(columns.dur * 1000)
    sums = np.bincount(seg, weights=dur, minlength=count)
    if np.abs(start).max() >= _LIMIT_NS or dur.max() >= _LIMIT_NS or sums.max() >= _EXACT_FLOAT:
        return None
    start_ns, dur_ns = start.astype(np.int64), dur.astype(np.int64)
    # One timeline: each segment after the previous one's last end, two nanoseconds apart.
    seg_min = np.minimum.reduceat(start_ns, first)
    seg_end = np.maximum.reduceat(start_ns + dur_ns, first)
    shift = np.zeros(count, np.int64)
    if count > 1:
        shift[1:] = np.cumsum(seg_end[:-1] - seg_min[1:] + 2)
    shift -= seg_min[0]
    if float(seg_end.max()) + float(np.abs(shift).max()) >= _LIMIT_NS:
        return None
    ns = col.Nanoseconds(start_ns + shift[seg], dur_ns)
    times: dict[Key, np.ndarray] = {}

    keys: dict[str, int] = {}
    name_key = np.array(
        [keys.setdefault(stable_name(n), len(keys)) for n in columns.names] or [0], np.int64
    )
    step_key = keys.setdefault(STEP_KEY, len(keys))
    key_list = list(keys)

    # CPU operators: self time of the events inside a complete step of their process (kept: not
    # folded).
    a = col.analysis_arrays(columns, ns)
    index, ev_start, ev_end, parent = a["index"], a["start"], a["end"], a["parent"]
    name = columns.name[index]
    step_name = np.array([n.startswith(STEP_PREFIX) for n in columns.names] or [False], bool)
    is_step = step_name[name] & (columns.kind[index] == typedcolumns.USER_ANNOTATION)
    pid_code = columns.pid[index]
    step_rows = np.nonzero(is_step)[0]
    spans = step_spans_of(
        zip(
            pid_code[step_rows].tolist(),
            [columns.names[k] for k in name[step_rows].tolist()],
            ev_start[step_rows].tolist(),
            ev_end[step_rows].tolist(),
        ),
        None,
    )
    ev_seg = seg[index]
    windows_all = step_rows[
        [step_of(columns.names[int(k)]) is not None for k in name[step_rows].tolist()]
    ]
    if spans is None:
        inside = ~is_step
    else:
        inside = in_steps_array(spans, pid_code, ev_start, ev_end)
        # a segment with no complete step of its own counts every operator but its cut steps (as a
        # lone summary)
        with_steps = np.zeros(count, bool)
        with_steps[ev_seg[windows_all]] = True
        alone = ~with_steps[ev_seg]
        inside = np.where(alone, ~is_step, inside)
    windows = windows_all
    fallback = _overlapping(windows, ev_seg, pid_code, ev_start, ev_end)
    skip = np.zeros(count, bool)  # the fallback segments: the caller summarizes them alone
    skip[np.array(sorted(fallback), np.int64)] = True

    # Device work: every kernel, copy and set of the segment, its duration.
    dev = np.nonzero((columns.kind >= typedcolumns.DEVICE) & ~skip[seg])[0]
    _add(times, "device", key_list, seg[dev], name_key[columns.name[dev]], dur_ns[dev], count)
    row_key = np.where(is_step, step_key, name_key[name])
    mine = inside & (row_key != step_key) & ~skip[ev_seg]
    kept = a["kept"][mine]
    _add(times, "cpu", key_list, ev_seg[mine], row_key[mine], a["self"][mine] * kept, count)

    # Phases: per window (a complete ProfilerStep#N), as
    # stepcli.traces.analyses.stepphases._phase_totals_arrays.
    phase = np.array([phase_of(n) for n in columns.names] or [0], np.int8)[name]
    wrapper = np.array([wraps_backward(n) for n in columns.names] or [False], bool)[name]
    annotation = columns.kind[index] == typedcolumns.USER_ANNOTATION
    named = wrapper & annotation & ~is_step
    closure = np.array([is_closure(n) for n in columns.names] or [False], bool)[name] & annotation
    forward, forward_row = forward_candidates(parent, phase, windows.tolist(), named, closure)
    window_of = np.full(len(index), -1, np.int64)
    window_of[windows] = np.arange(len(windows))
    forward_window = window_of[forward_row]
    values = np.zeros((len(PHASES), len(windows)), np.int64)
    w_pid, w_start, w_end = pid_code[windows], ev_start[windows], ev_end[windows]
    for pid in sorted(set(w_pid.tolist())):
        own = np.nonzero(w_pid == pid)[0]
        own = own[~skip[ev_seg[windows[own]]]]
        of_pid = pid_code == pid
        phase_spans = [
            np.nonzero(of_pid & (phase == p))[0] for p in (DATALOADER, OPTIMIZER, BACKWARD)
        ]
        phase_start, phase_end = (
            [ev_start[e] for e in phase_spans],
            [ev_end[e] for e in phase_spans],
        )
        if len(phase_spans[1]):  # the optimizer's own time, as the table's
            phase_start[1], phase_end[1] = col.optimizer_own(
                ev_start, ev_end, phase_spans[1], phase_spans[2], np.nonzero(of_pid & closure)[0]
            )
        position = np.full(len(windows), -1, np.int64)
        position[own] = np.arange(len(own))
        of_window = position[forward_window] >= 0
        fw, fe = forward_window[of_window], forward[of_window]
        parts = col.step_phases(
            w_start[own],
            w_end[own],
            phase_start,
            phase_end,
            np.maximum(ev_start[fe], w_start[fw]),
            np.minimum(ev_end[fe], w_end[fw]),
        )
        for which, part in enumerate(parts):
            values[which, own] = part
    window_seg = ev_seg[windows]
    steps_in = np.bincount(window_seg, minlength=count)
    has = (steps_in > 0) & ~skip
    for label, row in zip(PHASES, values):
        total = np.bincount(window_seg, weights=row, minlength=count).round().astype(np.int64)
        ms = np.zeros(count)
        ms[has] = total[has] / steps_in[has] / NS_PER_MS
        if has.any():
            times[("phase", label)] = ms
    return StepTimes(times, fallback)


def _chosen_columns(events: list[Event], picked: np.ndarray) -> Columns:
    """The columns of events[picked], names and ids coded in order of first appearance."""
    import numpy as np

    from stepcli.traces.read import typedcolumns

    chosen = [events[i] for i in picked.tolist()]
    names: dict[str, int] = {}
    ids: dict[int | str, int] = {}
    n = len(chosen)
    return typedcolumns.Columns(
        name=np.fromiter((names.setdefault(e.name, len(names)) for e in chosen), np.int32, n),
        kind=np.fromiter((typedcolumns.kind_of(e.cat) for e in chosen), np.int8, n),
        pid=np.fromiter((ids.setdefault(e.pid, len(ids)) for e in chosen), np.int32, n),
        tid=np.fromiter((ids.setdefault(e.tid, len(ids)) for e in chosen), np.int32, n),
        ts=np.fromiter((e.ts for e in chosen), np.float64, n),
        dur=np.fromiter((e.dur for e in chosen), np.float64, n),
        shape=np.zeros(n, np.int32),
        corr=np.full(n, -1, np.int64),
        names=list(names),
        ids=list(ids),
    )


def _taken_columns(columns: Columns, order: np.ndarray, picked: np.ndarray) -> Columns:
    """_chosen_columns of the events sorted by `order`, from their columns: the same arrays, the
    same codes."""
    import numpy as np

    from stepcli.traces.read import typedcolumns

    rows = order[picked]
    n = len(rows)
    name, name_codes = _first_seen(columns.name[rows])
    # one table, pids first
    ids, id_codes = _first_seen(np.concatenate([columns.pid[rows], columns.tid[rows]]))
    return typedcolumns.Columns(
        name=name.astype(np.int32),
        kind=columns.kind[rows],
        pid=ids[:n].astype(np.int32),
        tid=ids[n:].astype(np.int32),
        ts=columns.ts[rows],
        dur=columns.dur[rows],
        shape=np.zeros(n, np.int32),
        corr=np.full(n, -1, np.int64),
        names=[columns.names[k] for k in name_codes.tolist()],
        ids=[columns.ids[k] for k in id_codes.tolist()],
    )


def _first_seen(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`codes` coded again in order of first appearance (as a dict's setdefault codes them), and the
    old code of each new one."""
    import numpy as np

    unique, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    new = np.empty(len(unique), np.int64)
    new[by_first] = np.arange(len(unique))
    return new[inverse.reshape(-1)], unique[by_first]


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of arange(lo[i], hi[i])."""
    import numpy as np

    lengths = hi - lo
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    out: np.ndarray = np.arange(int(lengths.sum()), dtype=np.int64) + starts
    return out


def _add(
    times: dict[Key, np.ndarray],
    kind: str,
    key_list: list[str],
    seg: np.ndarray,
    key: np.ndarray,
    ns: np.ndarray,
    count: int,
) -> None:
    """Sum `ns` by (segment, key) into times[(kind, name)], milliseconds per segment (a key present
    in a segment with no time still makes its row, as a lone summary's rows do: 0.0 there, like a
    segment without it)."""
    import numpy as np

    if not len(key):
        return
    width = len(key_list)
    pairs, inverse = np.unique(seg * width + key, return_inverse=True)
    total = (
        np.bincount(inverse.reshape(-1), weights=ns, minlength=len(pairs)).round().astype(np.int64)
    )
    pair_seg, pair_key = pairs // width, pairs % width
    order = np.argsort(pair_key, kind="stable")
    bounds = np.flatnonzero(np.diff(pair_key[order])) + 1
    for run in np.split(order, bounds):
        ms = np.zeros(count)
        ms[pair_seg[run]] = total[run] / NS_PER_MS
        times[(kind, key_list[int(pair_key[run[0]])])] = ms


def _overlapping(
    windows: np.ndarray, seg: np.ndarray, pid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> set[int]:
    """Segments where two windows of one process overlap: a lone summary measures their phases per
    window."""
    import numpy as np

    if len(windows) < 2:
        return set()
    order = np.lexsort((start[windows], pid[windows], seg[windows]))
    w = windows[order]
    same = (seg[w][1:] == seg[w][:-1]) & (pid[w][1:] == pid[w][:-1])
    clash = same & (start[w][1:] < end[w][:-1])
    return set(seg[w][1:][clash].tolist())
