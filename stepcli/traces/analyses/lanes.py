"""One rank's recorded steps as a lane of the what-if graph, from its trace's columns alone. Pure.

The steps' thread is cut into elementary intervals at every operator boundary (`grid`). Each
interval has the phase `stepcli table`'s breakdown gives it (dataloader, optimizer, backward,
forward, other, in that priority) and is covered or not by any operator, so a change (an operator, a
phase, a rank made faster) is a speed per interval and the lane's replayed time is that speed's
integral (stepcli.whatif.lanetime, stepcli.whatif.lanereplay). The rank's collectives
(stepcli.traces.analyses.arrivals) are the lane's joints: an arrival is a point on the lane; a
departure that falls in a wait (host time in no operator, or an operator named for waiting) makes
that wait end no earlier than the collective, plus the measured tail after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from stepcli.traces.analyses import arrays as col
from stepcli.traces.analyses.arrivals import RankArrivals, rank_arrivals
from stepcli.traces.analyses.devicework import DeviceWork, device_work
from stepcli.traces.analyses.steps import BACKWARD, DATALOADER, OPTIMIZER, is_closure, phase_of
from stepcli.traces.read import typedcolumns
from stepcli.traces.read.columns import ColumnTrace
from stepcli.traces.read.names import STEP_PREFIX, step_of
from stepcli.traces.read.syncevents import StreamWait

# The phases of a lane's time, as the breakdown names them; the codes index PHASE_NAMES.
PHASE_NAMES = ("other", "dataloader", "optimizer", "backward", "forward")
OTHER, FORWARD = 0, 4
# Host operators that block on something else (a collective, the device, another thread): their time
# is waiting. A collective's own host call is one: gloo blocks in it when it runs the collective
# synchronously.
WAIT_NAME = re.compile(r"wait|synchroni[sz]e|barrier|^c10d::|^gloo:|^nccl:", re.IGNORECASE)


@dataclass
class RankLane:
    """One rank's steps' thread in its recorded steps; small and picklable (built in a worker per
    file)."""

    path: str
    rank: int | None
    clock: str | None
    world_size: int | None
    steps: list[int]  # complete step numbers, by start
    step_start: list[float]  # µs, the trace's own clock
    step_end: list[float]
    # float64 µs: the elementary intervals' boundaries, from the first step's start to the last's
    # end
    grid: np.ndarray
    phase: np.ndarray  # int8 per interval: index into PHASE_NAMES
    busy: np.ndarray  # bool per interval: inside an operator of the steps' thread
    names: list[str]  # operator names (codes index it)
    op_name: np.ndarray  # int32 per operator of the steps' thread inside the steps (every depth)
    op_start: np.ndarray  # float64 µs
    op_end: np.ndarray
    op_top: np.ndarray  # bool: outermost (a child of the step)
    waits: np.ndarray  # float64 (n, 2): the wait spans, sorted and disjoint
    device_events: int  # kernels, copies and sets in the steps
    arrivals: RankArrivals | None = None
    device: DeviceWork | None = None  # the device work launched in the steps, its streams and syncs
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "the process"


def lane_of(trace: ColumnTrace, stream_waits: list[StreamWait] | None = None) -> RankLane:
    """The lane of one trace file (raises nothing on a trace without steps: `steps` is then empty);
    `stream_waits`: the trace's CUDA sync events' cross-stream waits
    (stepcli.traces.read.syncevents)."""
    columns = trace.columns
    names = columns.names
    cpu = (columns.kind == typedcolumns.OTHER_CPU) | (columns.kind == typedcolumns.USER_ANNOTATION)
    is_step_name = np.array([n.startswith(STEP_PREFIX) for n in names] or [False], bool)
    step_events = (
        np.nonzero(cpu & is_step_name[columns.name])[0] if len(columns) else np.zeros(0, np.int64)
    )
    empty = _empty_lane(trace)
    if not step_events.size:
        return empty
    thread = columns.pid.astype(np.int64) * max(len(columns.ids), 1) + columns.tid
    main = np.bincount(thread[step_events]).argmax()
    step_events = step_events[thread[step_events] == main]
    step_events = step_events[np.argsort(columns.ts[step_events], kind="stable")]
    numbers: list[int] = []
    starts: list[float] = []
    ends: list[float] = []
    for index in step_events.tolist():
        number = step_of(names[int(columns.name[index])])
        if number is None or number == trace.incomplete_step:
            continue
        if starts and columns.ts[index] < ends[-1]:
            continue  # overlapping step annotations: the first one stands
        numbers.append(number)
        starts.append(float(columns.ts[index]))
        ends.append(float(columns.ts[index] + columns.dur[index]))
    if not numbers:
        return empty
    lo, hi = starts[0], ends[-1]
    ops = np.nonzero(cpu & (thread == main) & ~is_step_name[columns.name])[0]
    o_start = columns.ts[ops]
    o_end = o_start + columns.dur[ops]
    inside = (o_end > lo) & (o_start < hi)
    ops = ops[inside]
    o_start, o_end = np.maximum(o_start[inside], lo), np.minimum(o_end[inside], hi)
    device = columns.kind >= typedcolumns.DEVICE
    if device.any():
        ops, o_start, o_end = _with_handoffs(
            columns,
            cpu & ~is_step_name[columns.name],
            thread,
            int(main),
            ops,
            o_start,
            o_end,
            lo,
            hi,
        )
    order = col.thread_order(np.zeros(len(ops), np.int64), o_start, o_end - o_start)
    ops, o_start, o_end = ops[order], o_start[order], o_end[order]
    reach = np.maximum.accumulate(o_end) if len(o_end) else o_end
    top = np.ones(len(ops), bool)
    top[1:] = o_start[1:] >= reach[:-1]
    op_name = columns.name[ops].astype(np.int32)
    grid = np.unique(np.concatenate(([lo, hi], o_start, o_end, starts, ends)))
    mid = (grid[:-1] + grid[1:]) / 2
    busy = covers(o_start[top], o_end[top], mid)
    phase = _phases(names, op_name, o_start, o_end, top, mid)
    waits = _waits(names, op_name, o_start, o_end, grid, busy)
    device_events = int(
        np.count_nonzero(device & (columns.ts < hi) & (columns.ts + columns.dur > lo))
    )
    # (the culprit's gap figures are not the replay's: left out)
    arrivals = rank_arrivals(
        columns, trace.rank, trace.incomplete_step, trace.clock, with_gaps=False
    )
    work = device_work(columns, thread, int(main), lo, hi, stream_waits) if device_events else None
    return RankLane(
        trace.path,
        trace.rank,
        trace.clock,
        trace.world_size,
        numbers,
        starts,
        ends,
        grid,
        phase,
        busy,
        list(names),
        op_name,
        o_start,
        o_end,
        top,
        waits,
        device_events,
        arrivals,
        work,
    )


def _with_handoffs(
    columns: typedcolumns.Columns,
    cpu: np.ndarray,
    thread: np.ndarray,
    main: int,
    ops: np.ndarray,
    o_start: np.ndarray,
    o_end: np.ndarray,
    lo: float,
    hi: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps' thread's operators and the operators of the process's other threads that run
    wholly inside its gaps: on a GPU, autograd runs the backward pass on a thread of its own while
    the steps' thread waits in `backward()`, so that thread's work is the step's time there (its
    phase, its launches)."""
    pid = columns.pid
    main_pid = pid[ops[0]] if len(ops) else -1
    other = np.nonzero(cpu & (thread != main) & (pid == main_pid) & (columns.ts >= lo))[0]
    s, e = columns.ts[other], columns.ts[other] + columns.dur[other]
    keep = e <= hi
    other, s, e = other[keep], s[keep], e[keep]
    if not other.size:
        return ops, o_start, o_end
    u_start, u_end = col.union_arrays(o_start, o_end)
    k = np.searchsorted(u_start, s, side="right") - 1
    # inside a gap: not inside the busy span before it, and ending before the next one starts
    after_prev = (k < 0) | (s >= u_end[np.maximum(k, 0)])
    nxt = np.minimum(k + 1, len(u_start) - 1)
    before_next = (k + 1 >= len(u_start)) | (e <= u_start[nxt])
    keep = after_prev & before_next if len(u_start) else np.ones(len(other), bool)
    return (
        np.concatenate((ops, other[keep])),
        np.concatenate((o_start, s[keep])),
        np.concatenate((o_end, e[keep])),
    )


def _empty_lane(trace: ColumnTrace) -> RankLane:
    nothing = np.zeros(0)
    return RankLane(
        trace.path,
        trace.rank,
        trace.clock,
        trace.world_size,
        [],
        [],
        [],
        nothing,
        np.zeros(0, np.int8),
        np.zeros(0, bool),
        list(trace.columns.names),
        np.zeros(0, np.int32),
        nothing,
        nothing,
        np.zeros(0, bool),
        np.zeros((0, 2)),
        0,
    )


def covers(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each time in `at` lies inside one of the spans (any order, overlapping allowed)."""
    if not len(starts):
        return np.zeros(len(at), bool)
    u_start, u_end = col.union_arrays(starts, ends)
    k = np.searchsorted(u_start, at, side="right") - 1
    return (k >= 0) & (at < u_end[np.maximum(k, 0)])


def _phases(
    names: list[str],
    op_name: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    top: np.ndarray,
    mid: np.ndarray,
) -> np.ndarray:
    """Each interval's phase as the breakdown gives it (stepcli.traces.analyses.steps): dataloader,
    the optimizer's own time (its spans less the backward passes and closure calls inside them:
    `optimizer.step(closure)`), backward, forward (the other outermost operators, and what runs in a
    closure call), other (no operator)."""
    phase_of_name = np.array([phase_of(n) for n in names] or [0], np.int8)
    closure_name = np.array([is_closure(n) for n in names] or [False], bool)
    named = phase_of_name[op_name] if len(op_name) else np.zeros(0, np.int8)
    closure = closure_name[op_name] if len(op_name) else np.zeros(0, bool)
    out = np.full(len(mid), OTHER, np.int8)
    claimed = np.zeros(len(mid), bool)

    own_start, own_end = col.optimizer_own(
        start,
        end,
        np.nonzero(named == OPTIMIZER)[0],
        np.nonzero(named == BACKWARD)[0],
        np.nonzero(closure)[0],
    )
    spans = (
        (1, start[named == DATALOADER], end[named == DATALOADER]),
        (2, own_start, own_end),
        (3, start[named == BACKWARD], end[named == BACKWARD]),
        (FORWARD, start[top | closure], end[top | closure]),
    )
    for code, lo, hi in spans:
        hit = covers(lo, hi, mid) & ~claimed
        out[hit] = code
        claimed |= hit
    return out


def _waits(
    names: list[str],
    op_name: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    grid: np.ndarray,
    busy: np.ndarray,
) -> np.ndarray:
    """The spans the thread spent waiting: its gaps (no operator) and its outermost operators named
    for waiting."""
    free = ~busy
    edges = np.diff(np.concatenate(([0], free.astype(np.int8), [0])))
    gaps = (
        np.stack((grid[:-1][edges[:-1] == 1], grid[1:][edges[1:] == -1]), axis=1)
        if free.any()
        else np.zeros((0, 2))
    )
    is_wait = np.array([bool(WAIT_NAME.search(n)) for n in names] or [False], bool)
    waiting = is_wait[op_name] if len(op_name) else np.zeros(0, bool)
    if waiting.any():
        w_start, w_end = col.union_arrays(start[waiting], end[waiting])
        spans = np.concatenate((gaps, np.stack((w_start, w_end), axis=1)))
        spans = spans[np.argsort(spans[:, 0], kind="stable")]
        merged_start, merged_end = col.union_arrays(spans[:, 0], spans[:, 1])
        return np.stack((merged_start, merged_end), axis=1)
    return gaps
