"""Pure analysis of loaded traces: per-operator, per-kernel, per-step, per-rank and step-breakdown summaries.

The CPU operator table follows torch's `key_averages()` so the two can be compared number for number: user
annotations (`ProfilerStep*`, `enumerate(DataLoader)#...`, `Optimizer.step#...`) are rows like any operator, and
every ProfilerStep#N is folded into `ProfilerStep*`. Python frames of traces recorded with stacks
(`python_function` events) are no operators: they are left out of the tables and of the nesting, and memory
addresses are stripped from the names used as keys (see stepcli.traces.shares). Shares are defined in stepcli.traces.shares,
processes and the straggler in stepcli.traces.ranks.

A trace's incomplete step (`Trace.incomplete_step`, from a window stepcli cut short) holds only the start of that
step, so it is left out of step times, step statistics, per-rank statistics and the step breakdown; its events
still count in the operator tables. Events the reader skipped for unusable times are counted in `skipped_events`.

When a trace has recorded steps, host events that overlap no ProfilerStep#N of their own process (the incomplete
step included) are time outside every step: they are left out of the operator tables, whose shares are of step
time, and counted in `outside_events`/`outside_ns` instead (e.g. the `cudaDeviceSynchronize` the profiler itself
calls after the last step). An event that overlaps a step even in part is kept whole. Device kernels are all kept:
a kernel launched inside a step belongs to it even when it runs after the step's CPU side ended. A trace without
recorded steps keeps every event, as key_averages() does.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stepcli.stats import Stats, describe
from stepcli.traces.ranks import ProcessRow, WindowFacts, find_straggler, group_processes, is_communication, process_key
from stepcli.traces.shares import STEP_KEY, STEP_PREFIX, share_basis, stable_name

if TYPE_CHECKING:
    from stepcli.traces.arrays import Columns
    from stepcli.traces.reader import Event, Trace

# Same categories as stepcli.traces.reader (not imported at run time so this module stays free of the decoder).
_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# Step phases, from the annotations torch writes. The order is the priority when phases overlap in time.
PHASES = ("dataloader", "optimizer", "backward", "forward", "other")
_DATALOADER, _OPTIMIZER, _BACKWARD = 1, 2, 3
_COMM = 4  # collective communication: never forward; in `other` unless inside another phase
_PHASE_PREFIXES = (
    ("enumerate(DataLoader)", _DATALOADER),
    ("Optimizer.step#", _OPTIMIZER),
    ("Optimizer.zero_grad#", _OPTIMIZER),
    ("autograd::engine::evaluate_function: ", _BACKWARD),
)

_NS_PER_MS = 1_000_000.0


@dataclass(frozen=True)
class OpRow:
    """One operator (or kernel) name, aggregated over every call in every trace, like a key_averages() row."""

    name: str
    calls: int
    self_ms: float
    total_ms: float
    avg_ms: float
    self_share: float
    shape: str | None = None

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": self.name,
            "calls": self.calls,
            "self_ms": self.self_ms,
            "total_ms": self.total_ms,
            "avg_ms": self.avg_ms,
            "self_share": self.self_share,
        }
        if self.shape is not None:
            row["shape"] = self.shape
        return row


@dataclass(frozen=True)
class StepRow:
    """The duration of one ProfilerStep#N annotation of one process (`process`: its rank or worker label)."""

    rank: int | None
    step: int
    dur_ms: float
    process: str = "-"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "process": self.process, "step": self.step, "dur_ms": self.dur_ms}


RankRow = ProcessRow  # one row per process (rank), its windows inside: see stepcli.traces.ranks


@dataclass(frozen=True)
class Breakdown:
    """Mean milliseconds per step spent in each phase; the five add up to the mean step time."""

    dataloader: float
    forward: float
    backward: float
    optimizer: float
    other: float

    def to_dict(self) -> dict[str, float]:
        return {
            "dataloader": self.dataloader,
            "forward": self.forward,
            "backward": self.backward,
            "optimizer": self.optimizer,
            "other": self.other,
        }


@dataclass(frozen=True)
class DeviceBusy:
    """Mean milliseconds per step when at least one kernel or copy ran, and that as a share of step time."""

    busy_ms: float
    busy_share: float

    def to_dict(self) -> dict[str, float]:
        return {"busy_ms": self.busy_ms, "busy_share": self.busy_share}


@dataclass(frozen=True)
class TraceSummary:
    """Everything `stepcli table` reports; `to_dict()` is the JSON contract other commands read back."""

    files: list[str]
    step_ms: Stats | None
    steps: list[StepRow]
    ranks: list[ProcessRow]
    slowest_rank: int | None  # the straggler by compute (stepcli.traces.ranks), not the longest step time
    breakdown_ms: Breakdown | None
    device: DeviceBusy | None
    cpu_ops: list[OpRow]
    device_kernels: list[OpRow]
    events: int
    skipped_events: int = 0  # events left out because their ts/dur was infinite, NaN or absurdly large
    share_of: str = "recorded step time"  # what every self_share is a share of (stepcli.traces.shares)
    straggler: dict[str, Any] | None = None  # the evidence behind slowest_rank
    outside_events: int = 0  # host operator calls outside every recorded step, left out of cpu_ops (module docstring)
    outside_ms: float = 0.0  # their self time

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": list(self.files),
            "step_ms": self.step_ms,
            "steps": [s.to_dict() for s in self.steps],
            "ranks": [r.to_dict() for r in self.ranks],
            "slowest_rank": self.slowest_rank,
            "breakdown_ms": self.breakdown_ms.to_dict() if self.breakdown_ms else None,
            "device": self.device.to_dict() if self.device else None,
            "cpu_ops": [r.to_dict() for r in self.cpu_ops],
            "device_kernels": [r.to_dict() for r in self.device_kernels],
            "events": self.events,
            "skipped_events": self.skipped_events,
            "share_of": self.share_of,
            "straggler": self.straggler,
            "outside_steps": {"events": self.outside_events, "self_ms": self.outside_ms},
        }


# ---------------------------------------------------------------------------------------------------------------
# Per-trace analysis. Times are integer nanoseconds relative to the trace's first kept event: the Chrome format
# stores microseconds with three decimals, and at epoch-sized timestamps a float cannot tell two nanoseconds apart,
# while torch builds its operator tree from exact nanoseconds. Integers make "child ends where parent ends" exact.


@dataclass
class _Window:
    """One ProfilerStep#N and its top-level operators on its thread (forward unless they are another phase)."""

    step: int
    pid: int | str
    start: int
    end: int
    children: list[tuple[int, int, int]]


@dataclass
class _TraceResult:
    windows: list[_Window]
    phase_spans: dict[int, list[tuple[int, int, int | str]]]  # phase -> (start, end, pid)
    device_union: list[tuple[int, int]]
    cpu_span: tuple[int, int] | None
    comm_union: dict[int | str, list[tuple[int, int]]]  # pid -> union of communication spans (CPU and device)
    main_pid: int | str | None  # the process of the CPU events
    outside_events: int = 0  # host operator calls left out of the rows: outside every step of their process
    outside_ns: int = 0  # their self time
    # (phase totals, steps) over the windows when measured on arrays; else `_step_phases` measures them
    phase_totals: tuple[dict[str, int], int] | None = None
    device_arrays: Any = None  # the device union as (starts, ends) arrays, when measured on arrays


class _Accumulator:
    """Operator rows keyed by name (and shape), summed over threads and traces, in nanoseconds."""

    def __init__(self) -> None:
        self.rows: dict[Any, list[int]] = {}

    def self_ns_without_steps(self, by_shape: bool) -> int:
        return sum(v[1] for k, v in self.rows.items() if (k[0] if by_shape else k) != STEP_KEY)

    def rows_out(self, by_shape: bool, total_self: int) -> list[OpRow]:
        out: list[OpRow] = []
        for key, (calls, self_ns, total_ns) in self.rows.items():
            name, shape = key if by_shape else (key, None)
            out.append(
                OpRow(
                    name=name,
                    calls=calls,
                    self_ms=self_ns / _NS_PER_MS,
                    total_ms=total_ns / _NS_PER_MS,
                    avg_ms=total_ns / _NS_PER_MS / calls if calls else 0.0,
                    self_share=self_ns / total_self if total_self > 0 else 0.0,
                    shape=shape,
                )
            )
        out.sort(key=lambda r: (-r.self_ms, r.name, r.shape or ""))
        return out


def _phase_of(name: str) -> int:
    for prefix, phase in _PHASE_PREFIXES:
        if name.startswith(prefix):
            return phase
    return _COMM if is_communication(name) else 0


_StepSpans = dict[Any, tuple[list[tuple[int, int]], list[int]]]  # pid -> (union of its steps, the union's ends)


def _step_spans(steps: Iterable[tuple[int | str, str, int, int]], incomplete_step: int | None) -> _StepSpans | None:
    """Per process, the union of its ProfilerStep#N annotations (pid, name, start, end), the incomplete step
    included, and that union's ends (for bisect); None when no step is complete: nothing is then left out."""
    by_pid: dict[int | str, list[tuple[int, int]]] = {}
    complete = False
    for pid, name, start, end in steps:
        number = name[len(STEP_PREFIX) :]
        if number.isdecimal():
            by_pid.setdefault(pid, []).append((start, end))
            complete = complete or int(number) != incomplete_step
    if not complete:
        return None
    unions = {pid: _union(spans) for pid, spans in by_pid.items()}
    return {pid: (union, [e for _, e in union]) for pid, union in unions.items()}


def _in_steps(spans: _StepSpans, pid: int | str, start: int, end: int) -> bool:
    """Whether [start, end) overlaps a step of its process (a zero-length event: whether it lies in one)."""
    union, ends = spans.get(pid, ((), ()))
    i = bisect.bisect_right(ends, start)  # the first step span ending after `start`
    return i < len(union) and union[i][0] < max(end, start + 1)


def _analyze(
    events: list[Event], cpu: _Accumulator, device: _Accumulator, by_shape: bool, incomplete_step: int | None = None
) -> _TraceResult:
    """Nest CPU events per (pid, tid) exactly as torch's _populate_cpu_children/_remove_dup_nodes do, and
    collect what the step breakdown and device-busy figures need.

    ProfilerStep#`incomplete_step` still counts as an operator row but opens no step window. Host events
    outside every step of their process are counted in the result's `outside_*`, not in `cpu` (module docstring).
    """
    base = int(events[0].ts) if events else 0
    threads: dict[tuple[int | str, int | str], list[tuple[int, int, int, Event]]] = {}
    device_spans: list[tuple[int, int]] = []
    comm_spans: dict[int | str, list[tuple[int, int]]] = {}
    pids: dict[int | str, int] = {}
    device_names: dict[str, tuple[str, bool]] = {}  # kernel name -> (row name, is communication), once per name
    dev_rows = device.rows
    rnd = round
    last_pid: int | str | None = None
    last_tid: int | str | None = None
    bucket: list[tuple[int, int, int, Event]] = []
    step_events: list[Event] = []
    for index, event in enumerate(events):
        if event.cat in _DEVICE_CATEGORIES:
            start = rnd((event.ts - base) * 1000)
            dur = rnd(event.dur * 1000)
            device_spans.append((start, start + dur))
            known = device_names.get(event.name)
            if known is None:
                known = device_names[event.name] = (stable_name(event.name), is_communication(event.name))
            name = known[0]
            if known[1]:
                comm_spans.setdefault("device", []).append((start, start + dur))
            key: Any = (name, event.shape) if by_shape else name
            row = dev_rows.get(key)
            if row is None:
                dev_rows[key] = [1, dur, dur]
            else:
                row[0] += 1
                row[1] += dur
                row[2] += dur
            continue
        if event.cat == "python_function":
            continue  # a Python frame: a stack view's business, not an operator (see the module docstring)
        if event.cat == "user_annotation" and event.name.startswith(STEP_PREFIX):
            step_events.append(event)
        # Consecutive events are mostly on the same thread: skip the dict lookup then.
        if event.tid is not last_tid or event.pid is not last_pid:
            last_pid, last_tid = event.pid, event.tid
            bucket = threads.setdefault((last_pid, last_tid), [])
            pids[last_pid] = pids.get(last_pid, 0) + 1
        # (start, -duration) is torch's order: a parent sorts before a child that starts at the same time.
        bucket.append((rnd((event.ts - base) * 1000), -rnd(event.dur * 1000), index, event))

    windows: list[_Window] = []
    phase_spans: dict[int, list[tuple[int, int, int | str]]] = {
        _DATALOADER: [],
        _OPTIMIZER: [],
        _BACKWARD: [],
        _COMM: [],
    }
    # name -> (row key unless it is a step, phase, could be a ProfilerStep#N): computed once per distinct name
    name_info: dict[str, tuple[str, int, bool]] = {}
    rows = cpu.rows
    starts = [rnd((e.ts - base) * 1000) for e in step_events]
    step_spans = _step_spans(
        ((e.pid, e.name, s, s + rnd(e.dur * 1000)) for e, s in zip(step_events, starts)), incomplete_step
    )
    outside = [0, 0]  # calls, self ns of the host events outside every step

    def finish(frame: list[Any]) -> None:
        # torch's _remove_dup_nodes: an only child with its parent's name is folded into the parent.
        while frame[4] == 1 and frame[5][6] == frame[6]:
            child = frame[5]
            undo = rows[child[1]] if child[8] else outside
            undo[0] -= 1
            undo[1] -= child[2] - child[3]
            if child[8]:
                undo[2] -= child[2]
            frame[3], frame[4], frame[5] = child[3], child[4], child[5]
        if not frame[8]:
            outside[0] += 1
            outside[1] += frame[2] - frame[3]
            return
        row = rows.get(frame[1])
        if row is None:
            rows[frame[1]] = [1, frame[2] - frame[3], frame[2]]
        else:
            row[0] += 1
            row[1] += frame[2] - frame[3]
            row[2] += frame[2]

    for (pid, _tid), items in threads.items():
        items.sort()
        # frame: [end, row key, dur, children's dur, number of children, last child, name, step window or None,
        #         counted: inside a step of the process, or the trace has no steps]
        stack: list[list[Any]] = []
        push = stack.append
        for start, neg_dur, _index, event in items:
            dur = -neg_dur
            end = start + dur
            while stack:
                top_end = stack[-1][0]
                if start >= top_end or end > top_end:
                    finish(stack.pop())
                else:
                    break
            name = event.name
            info = name_info.get(name)
            if info is None:
                info = name_info[name] = (stable_name(name), _phase_of(name), name.startswith(STEP_PREFIX))
            row_key: Any = info[0]
            window = None
            if info[2] and event.cat == "user_annotation":
                row_key = STEP_KEY
                number = name[len(STEP_PREFIX) :]
                if number.isdecimal() and int(number) != incomplete_step:
                    window = _Window(int(number), pid, start, end, [])
                    windows.append(window)
            if by_shape:
                row_key = (row_key, event.shape)
            phase = info[1]
            if phase:
                phase_spans[phase].append((start, end, pid))
            counted = step_spans is None or _in_steps(step_spans, pid, start, end)
            frame = [end, row_key, dur, 0, 0, None, name, window, counted]
            if stack:
                parent = stack[-1]
                parent[3] += dur
                parent[4] += 1
                parent[5] = frame
                if parent[7] is not None:
                    parent[7].children.append((start, end, phase))
            push(frame)
        while stack:
            finish(stack.pop())

    cpu_span = None
    if device_spans and not windows and threads:
        # Only needed to place device time when there are no steps: the extent of CPU activity.
        cpu_span = (
            min(items[0][0] for items in threads.values()),
            max(start - neg_dur for items in threads.values() for start, neg_dur, _, _ in items),
        )
    for s, e, pid in phase_spans[_COMM]:
        comm_spans.setdefault(pid, []).append((s, e))
    main_pid = max(pids, key=lambda p: pids[p]) if pids else None
    if main_pid is not None and "device" in comm_spans:  # NCCL kernels: the process's device waits for the others
        comm_spans.setdefault(main_pid, []).extend(comm_spans.pop("device"))
    comm_union = {pid: _union(spans) for pid, spans in comm_spans.items()}
    return _TraceResult(
        windows, phase_spans, _union(device_spans), cpu_span, comm_union, main_pid, outside[0], outside[1]
    )


def _analyze_columns(
    columns: Columns, by_shape: bool, incomplete_step: int | None = None
) -> tuple[dict[Any, list[int]], dict[Any, list[int]], _TraceResult]:
    """`_analyze` over typed arrays (stepcli.traces.arrays): CPU rows, device rows and the trace result, equal to the
    reference's. Raises columnar.TooLarge for times past 64-bit nanoseconds."""
    import numpy as np

    from stepcli.traces import arrays as col

    ns = col.nanoseconds(columns)
    names = columns.names
    shapes = columns.shapes
    n_shapes = len(shapes)
    kind = columns.kind
    keys: dict[str, int] = {}
    name_key = np.array([keys.setdefault(stable_name(n), len(keys)) for n in names] or [0], np.int64)
    step_key = keys.setdefault(STEP_KEY, len(keys))
    key_list = list(keys)
    communication = np.array([is_communication(n) for n in names] or [False], bool)

    def key_of(value: int) -> Any:
        return (key_list[value // n_shapes], shapes[value % n_shapes]) if by_shape else key_list[value]

    def keyed(key_ids: np.ndarray, events: np.ndarray) -> np.ndarray:
        return key_ids * n_shapes + columns.shape[events] if by_shape else key_ids

    # Device work: one row per kernel name, its busy time, and collective kernels as communication.
    device_rows: dict[Any, list[int]] = {}
    comm_spans: dict[int | str, list[tuple[int, int]]] = {}
    dev = np.nonzero(kind == col.DEVICE)[0]
    d_start, d_dur = ns.start[dev], ns.dur[dev]
    d_end = d_start + d_dur
    device_arrays = col.union_arrays(d_start, d_end)
    device_union = list(zip(device_arrays[0].tolist(), device_arrays[1].tolist()))
    if dev.size:
        device_rows = col.rows_from(keyed(name_key[columns.name[dev]], dev), key_of, d_dur, d_dur)
        is_comm = communication[columns.name[dev]]
        if is_comm.any():
            comm_spans["device"] = list(zip(d_start[is_comm].tolist(), d_end[is_comm].tolist()))

    # CPU operators: nesting, folding, self time (stepcli.traces.arrays), then rows keyed like the reference's.
    a = col.analysis_arrays(columns, ns)
    index, start, end, parent = a["index"], a["start"], a["end"], a["parent"]
    name = columns.name[index]
    step_name = np.array([n.startswith(STEP_PREFIX) for n in names] or [False], bool)
    is_step = step_name[name] & (kind[index] == col.USER_ANNOTATION)
    row_key = np.where(is_step, step_key, name_key[name])
    kept = a["kept"]
    # Host events outside every step of their process: no rows (not even empty ones), only the outside count.
    step_rows = np.nonzero(is_step)[0]
    step_spans = _step_spans(
        zip(
            columns.pid[index[step_rows]].tolist(),
            [names[n] for n in name[step_rows].tolist()],
            start[step_rows].tolist(),
            end[step_rows].tolist(),
        ),
        incomplete_step,
    )
    outside_events = outside_ns = 0
    inside = None if step_spans is None else _in_steps_array(step_spans, columns.pid[index], start, end)
    if inside is None or inside.all():
        cpu_rows = col.rows_from(keyed(row_key, index), key_of, a["self"], a["dur"], counted=kept)
    else:
        cpu_rows = col.rows_from(
            keyed(row_key[inside], index[inside]), key_of, a["self"][inside], a["dur"][inside], counted=kept[inside]
        )
        left_out = kept & ~inside
        outside_events, outside_ns = int(left_out.sum()), int(a["self"][left_out].sum())

    phase_of_name = np.array([_phase_of(n) for n in names] or [0], np.int8)
    phase = phase_of_name[name]
    ids = columns.ids
    pid_code = columns.pid[index]
    windows: list[_Window] = []
    by_row: dict[int, _Window] = {}
    for row in step_rows.tolist():
        number = names[int(name[row])][len(STEP_PREFIX) :]
        if number.isdecimal() and int(number) != incomplete_step:
            window = by_row[row] = _Window(int(number), ids[int(pid_code[row])], int(start[row]), int(end[row]), [])
            windows.append(window)
    phase_totals = _phase_totals_arrays(list(by_row), start, end, phase, pid_code, parent)

    phase_spans: dict[int, list[tuple[int, int, int | str]]] = {
        _DATALOADER: [],
        _OPTIMIZER: [],
        _BACKWARD: [],
        _COMM: [],
    }
    # The phase spans and the steps' children feed the per-window reference (`_step_phases`); with the totals
    # already measured on arrays, only communication spans are still needed.
    with_phase = np.nonzero(phase == _COMM if phase_totals is not None else phase)[0]
    for p, s, e, pid in zip(
        phase[with_phase].tolist(), start[with_phase].tolist(), end[with_phase].tolist(), pid_code[with_phase].tolist()
    ):
        phase_spans[p].append((s, e, ids[pid]))
    if by_row and phase_totals is None:
        under = np.nonzero(np.isin(parent, np.fromiter(by_row, np.int64, len(by_row))))[0]
        for p, s, e, ph in zip(
            parent[under].tolist(), start[under].tolist(), end[under].tolist(), phase[under].tolist()
        ):
            by_row[p].children.append((s, e, ph))

    cpu_span = None
    if device_union and not windows and len(index):
        cpu_span = (int(start.min()), int(end.max()))
    for s, e, pid in phase_spans[_COMM]:
        comm_spans.setdefault(pid, []).append((s, e))
    main_pid = None
    if len(index):
        # As the reference counts: per process, the runs of consecutive CPU events on one of its threads (in file
        # order); ties go to the process seen first.
        in_file = a["in_file"]
        cpu_pids = columns.pid[in_file]
        cpu_tids = columns.tid[in_file]
        run = np.ones(len(in_file), dtype=bool)
        run[1:] = (cpu_pids[1:] != cpu_pids[:-1]) | (cpu_tids[1:] != cpu_tids[:-1])
        counts = np.bincount(cpu_pids[run], minlength=int(cpu_pids.max()) + 1)
        seen = col.first_seen(cpu_pids)
        best = np.nonzero(counts == counts.max())[0]
        main_pid = ids[int(best[np.argmin(seen[best])])]
    if main_pid is not None and "device" in comm_spans:
        comm_spans.setdefault(main_pid, []).extend(comm_spans.pop("device"))
    comm_union = {pid: _union(spans) for pid, spans in comm_spans.items()}
    result = _TraceResult(
        windows,
        phase_spans,
        device_union,
        cpu_span,
        comm_union,
        main_pid,
        outside_events,
        outside_ns,
        phase_totals,
        device_arrays,
    )
    return cpu_rows, device_rows, result


def _in_steps_array(spans: _StepSpans, pid: Any, start: Any, end: Any) -> Any:
    """`_in_steps` for arrays of events (pid codes, as `spans` is keyed): a boolean array."""
    import numpy as np

    inside = np.zeros(len(pid), bool)
    for code, (union, ends) in spans.items():
        mine = pid == code
        rows: Any = slice(None) if mine.all() else np.nonzero(mine)[0]  # mostly one process: no copies then
        first = np.array([s for s, _ in union], np.int64)
        after = np.searchsorted(np.array(ends, np.int64), start[rows], side="right")  # first span ending later
        reach = np.maximum(end[rows], start[rows] + 1)
        inside[rows] = (after < len(union)) & (first[np.minimum(after, len(union) - 1)] < reach)
    return inside


def _phase_totals_arrays(
    rows: list[int], start: Any, end: Any, phase: Any, pid_code: Any, parent: Any
) -> tuple[dict[str, int], int] | None:
    """`_step_phases` summed over the windows (the step events at `rows`), with array operations per process
    (stepcli.traces.arrays.step_phases) instead of a Python step per span. None when two windows of one process
    overlap: the per-window reference measures those."""
    import numpy as np

    from stepcli.traces import arrays as col

    totals = dict.fromkeys(PHASES, 0)
    if not rows:
        return totals, 0
    at = np.array(rows, np.int64)
    window_pid, window_start, window_end = pid_code[at], start[at], end[at]
    window_of = np.full(len(start), -1, np.int64)
    window_of[at] = np.arange(len(at))
    # Forward candidates: the steps' own top-level operators that are no other phase, clipped to their step.
    child = np.nonzero((parent >= 0) & (phase == 0))[0]
    child = child[window_of[parent[child]] >= 0]
    child_window = window_of[parent[child]]
    for pid in sorted(set(window_pid.tolist())):  # (np.unique would import numpy.ma: 10 ms)
        mine = np.nonzero(window_pid == pid)[0]
        by_start = mine[np.argsort(window_start[mine], kind="stable")]
        if np.any(window_start[by_start][1:] < window_end[by_start][:-1]):
            return None
        of_pid = pid_code == pid
        spans = [np.nonzero(of_pid & (phase == p))[0] for p in (_DATALOADER, _OPTIMIZER, _BACKWARD)]
        of_window = window_pid[child_window] == pid
        forward, forward_events = child_window[of_window], child[of_window]
        parts = col.step_phases(
            window_start[mine],
            window_end[mine],
            [start[e] for e in spans],
            [end[e] for e in spans],
            np.maximum(start[forward_events], window_start[forward]),
            np.minimum(end[forward_events], window_end[forward]),
        )
        for label, values in zip(PHASES, parts):
            totals[label] += int(values.sum())
    return totals, len(rows)


def _union(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint intervals covering the same time as `spans`."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _clip(union: list[tuple[int, int]], ends: list[int], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of a disjoint sorted union that fall inside [start, end)."""
    out: list[tuple[int, int]] = []
    i = bisect.bisect_right(ends, start)
    while i < len(union) and union[i][0] < end:
        s, e = union[i]
        out.append((max(s, start), min(e, end)))
        i += 1
    return out


def _length(spans: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in _union(spans))


def _step_phases(result: _TraceResult) -> list[tuple[_Window, dict[str, int]]]:
    """Split each step into phases: union time of dataloader, then optimizer, backward and forward spans, each
    counting only time not already claimed by the phases before it; the rest of the step is `other`.

    Forward is every top-level operator of the step's thread that is no other phase, wherever it falls in the
    step: gradient accumulation and GANs run several forward passes between backward passes. Backward spans
    come from every thread of the process (the autograd engine's threads included)."""
    unions: dict[tuple[int, int | str], list[tuple[int, int]]] = {}
    for phase, spans in result.phase_spans.items():
        by_pid: dict[int | str, list[tuple[int, int]]] = {}
        for s, e, pid in spans:
            by_pid.setdefault(pid, []).append((s, e))
        for pid, pid_spans in by_pid.items():
            unions[(phase, pid)] = _union(pid_spans)
    ends = {key: [e for _, e in union] for key, union in unions.items()}

    out: list[tuple[_Window, dict[str, int]]] = []
    for window in result.windows:
        claimed: list[tuple[int, int]] = []
        ms: dict[str, int] = {}
        covered = 0
        for phase, label in ((_DATALOADER, "dataloader"), (_OPTIMIZER, "optimizer"), (_BACKWARD, "backward")):
            key = (phase, window.pid)
            parts = _clip(unions[key], ends[key], window.start, window.end) if key in unions else []
            claimed.extend(parts)
            now = _length(claimed)
            ms[label] = now - covered
            covered = now
        # Forward: the step's own top-level ops that are no other phase (and no communication).
        claimed.extend((max(s, window.start), min(e, window.end)) for s, e, phase in window.children if not phase)
        now = _length(claimed)
        ms["forward"] = now - covered
        ms["other"] = (window.end - window.start) - now
        out.append((window, ms))
    return out


def _device_busy(result: _TraceResult) -> tuple[int, int] | None:
    """(busy ns, span ns) of the device over the steps, or over the CPU activity when there are no steps."""
    if not result.device_union:
        return None
    ends = [e for _, e in result.device_union]
    spans = [(w.start, w.end) for w in result.windows]
    if not spans:
        first = min(result.device_union[0][0], result.cpu_span[0] if result.cpu_span else result.device_union[0][0])
        last = max(result.device_union[-1][1], result.cpu_span[1] if result.cpu_span else result.device_union[-1][1])
        spans = [(first, last)]
    busy = sum(_length(_clip(result.device_union, ends, s, e)) for s, e in _union(spans))
    return busy, sum(e - s for s, e in _union(spans))


@dataclass
class FilePart:
    """What one trace file contributes to a summary: small (per-name sums, per-step figures), picklable, and merged
    exactly (integer nanoseconds), so files can be summarized in worker processes and only these travel back."""

    path: str
    rank: int | None
    event_count: int
    skipped_events: int
    cpu_rows: dict[Any, list[int]]
    device_rows: dict[Any, list[int]]
    main_pid: int | str | None
    steps: list[int]  # complete steps, ordered
    step_ns: list[int]
    comm_ns: list[int]
    phase_totals: dict[str, int]
    phase_steps: int
    busy: tuple[int, int] | None
    busy_steps: int
    has_shapes: bool = False
    outside_events: int = 0  # host operator calls outside every step of their process, in no row
    outside_ns: int = 0


class TraceFacts(Protocol):
    """What a read trace says of itself besides its events (stepcli.traces.reader.Trace, columnkeeper.ColumnTrace)."""

    @property
    def path(self) -> str: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def event_count(self) -> int: ...
    @property
    def skipped_events(self) -> int: ...
    @property
    def incomplete_step(self) -> int | None: ...


def summarize_file(trace: Trace, *, group_by_shape: bool = False) -> FilePart:
    """The part of one trace file; `merge_parts` of the parts of several files equals `summarize` of them."""
    from stepcli.traces.arrays import columns_from_events

    return summarize_read(columns_from_events(trace.events), trace, group_by_shape=group_by_shape)


def summarize_read(columns: Columns, trace: TraceFacts, *, group_by_shape: bool = False) -> FilePart:
    """The part of one trace file, from its columns and what the reader found out about it."""
    return summarize_columns(
        columns,
        path=trace.path,
        rank=trace.rank,
        event_count=trace.event_count,
        skipped_events=trace.skipped_events,
        incomplete_step=trace.incomplete_step,
        group_by_shape=group_by_shape,
    )


def summarize_columns(
    columns: Columns,
    *,
    path: str,
    rank: int | None,
    event_count: int,
    skipped_events: int = 0,
    incomplete_step: int | None = None,
    group_by_shape: bool = False,
) -> FilePart:
    """The part of one trace file read into columns (stepcli.traces.columns.load_columns)."""
    from stepcli.traces.arrays import TooLarge

    device_busy = _device_busy_arrays
    try:
        cpu_rows, device_rows, result = _analyze_columns(columns, group_by_shape, incomplete_step)
    except TooLarge:
        device_busy = _device_busy  # times past 64-bit nanoseconds: the per-event reference, on Python integers
        cpu, device = _Accumulator(), _Accumulator()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            result = _analyze(columns.to_events(), cpu, device, group_by_shape, incomplete_step)
        finally:
            if was_enabled:
                gc.enable()
        cpu_rows, device_rows = cpu.rows, device.rows
    ordered = sorted(result.windows, key=lambda w: (w.step, w.start))
    comm_ns = []
    for w in ordered:
        union = result.comm_union.get(w.pid, [])
        comm_ns.append(_length(_clip(union, [e for _, e in union], w.start, w.end)))
    if result.phase_totals is not None:
        phase_totals, phase_steps = result.phase_totals
    else:
        phase_totals = dict.fromkeys(PHASES, 0)
        phase_steps = 0
        for _window, phases in _step_phases(result):
            for label, ns in phases.items():
                phase_totals[label] += ns
            phase_steps += 1
    busy = device_busy(result)
    return FilePart(
        path=path,
        rank=rank,
        event_count=event_count,
        skipped_events=skipped_events,
        cpu_rows=cpu_rows,
        device_rows=device_rows,
        main_pid=result.main_pid,
        steps=[w.step for w in ordered],
        step_ns=[w.end - w.start for w in ordered],
        comm_ns=comm_ns,
        phase_totals=phase_totals,
        phase_steps=phase_steps,
        busy=busy,
        busy_steps=(len(result.windows) or 1) if busy is not None else 0,
        has_shapes=bool(len(columns) and columns.shape.any()),
        outside_events=result.outside_events,
        outside_ns=result.outside_ns,
    )


def _device_busy_arrays(result: _TraceResult) -> tuple[int, int] | None:
    """`_device_busy` with array operations: the device time inside each span is F(end) - F(start), where F(t)
    is the device union's length before t (prefix sums and a binary search), instead of a Python step per
    kernel interval."""
    if not result.device_union:
        return None
    import numpy as np

    spans = [(w.start, w.end) for w in result.windows]
    if not spans:
        first = min(result.device_union[0][0], result.cpu_span[0] if result.cpu_span else result.device_union[0][0])
        last = max(result.device_union[-1][1], result.cpu_span[1] if result.cpu_span else result.device_union[-1][1])
        spans = [(first, last)]
    from stepcli.traces.arrays import covered

    merged = _union(spans)
    if result.device_arrays is not None:
        starts, ends = result.device_arrays
    else:
        union = np.array(result.device_union, dtype=np.int64)
        starts, ends = union[:, 0], union[:, 1]
    a = np.array([s for s, _ in merged], dtype=np.int64)
    b = np.array([e for _, e in merged], dtype=np.int64)
    return int(covered(starts, ends, a, b).sum()), int((b - a).sum())


def summarize(traces: list[Trace], *, group_by_shape: bool = False) -> TraceSummary:
    """Summarize one or more traces (e.g. all ranks of a run) into the tables `stepcli table` prints."""
    return merge_parts(
        [summarize_file(t, group_by_shape=group_by_shape) for t in traces], group_by_shape=group_by_shape
    )


def _add_rows(into: dict[Any, list[int]], rows: dict[Any, list[int]]) -> None:
    for key, (calls, self_ns, total_ns) in rows.items():
        row = into.get(key)
        if row is None:
            into[key] = [calls, self_ns, total_ns]
        else:
            row[0] += calls
            row[1] += self_ns
            row[2] += total_ns


def merge_parts(parts: list[FilePart], *, group_by_shape: bool = False) -> TraceSummary:
    """The summary of several files from their parts (in file order), equal to summarizing them together."""
    cpu = _Accumulator()
    device = _Accumulator()
    steps: list[StepRow] = []
    windows: list[tuple[int | None, str, int | str | None, WindowFacts]] = []
    phase_totals = dict.fromkeys(PHASES, 0)
    phase_steps = 0
    busy_total = span_total = 0
    busy_steps = 0
    any_device = False
    for part in parts:
        _add_rows(cpu.rows, part.cpu_rows)
        _add_rows(device.rows, part.device_rows)
        _key, process = process_key(part.rank, part.path, part.main_pid)
        trace_steps = [
            StepRow(rank=part.rank, step=step, dur_ms=ns / _NS_PER_MS, process=process)
            for step, ns in zip(part.steps, part.step_ns)
        ]
        steps.extend(trace_steps)
        comm_ms = [ns / _NS_PER_MS for ns in part.comm_ns]
        facts = WindowFacts(part.path, list(part.steps), [s.dur_ms for s in trace_steps], comm_ms)
        windows.append((part.rank, part.path, part.main_pid, facts))
        for label, ns in part.phase_totals.items():
            phase_totals[label] += ns
        phase_steps += part.phase_steps
        if part.busy is not None:
            any_device = True
            busy_total += part.busy[0]
            span_total += part.busy[1]
            busy_steps += part.busy_steps

    processes = group_processes(windows)
    order = {row.process: index for index, row in enumerate(processes)}
    steps.sort(key=lambda s: (order.get(s.process, 0), s.step))
    breakdown = None
    if phase_steps:
        mean = {label: ns / phase_steps / _NS_PER_MS for label, ns in phase_totals.items()}
        breakdown = Breakdown(**mean)
    device_busy = None
    if any_device:
        device_busy = DeviceBusy(
            busy_ms=busy_total / busy_steps / _NS_PER_MS,
            busy_share=busy_total / span_total if span_total else 0.0,
        )
    step_ns = round(sum(s.dur_ms for s in steps) * _NS_PER_MS)
    basis_ns, share_of = share_basis(step_ns, len(steps), cpu.self_ns_without_steps(group_by_shape))
    straggler = find_straggler(processes)
    return TraceSummary(
        files=[p.path for p in parts],
        step_ms=describe(s.dur_ms for s in steps),
        steps=steps,
        ranks=processes,
        slowest_rank=straggler.rank if straggler else None,
        breakdown_ms=breakdown,
        device=device_busy,
        cpu_ops=cpu.rows_out(group_by_shape, basis_ns),
        device_kernels=device.rows_out(group_by_shape, basis_ns),
        events=sum(p.event_count for p in parts),
        skipped_events=sum(p.skipped_events for p in parts),
        share_of=share_of,
        straggler=straggler.to_dict() if straggler else None,
        outside_events=sum(p.outside_events for p in parts),
        outside_ms=sum(p.outside_ns for p in parts) / _NS_PER_MS,
    )
