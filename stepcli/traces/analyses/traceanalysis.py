"""Pure analysis of loaded traces: per-operator, per-kernel, per-step, per-rank and step-breakdown
summaries.

The CPU operator table follows torch's `key_averages()` so the two can be compared number for
number: user annotations (`ProfilerStep*`, `enumerate(DataLoader)#...`, `Optimizer.step#...`) are
rows like any operator, and every ProfilerStep#N is folded into `ProfilerStep*`. Python frames of
traces recorded with stacks (`python_function` events) are no operators: they are left out of the
tables and of the nesting, and memory addresses are stripped from the names used as keys (see
stepcli.traces.analyses.shares). Shares are defined in stepcli.traces.analyses.shares, processes and
the straggler in stepcli.traces.analyses.ranks.

A trace's incomplete step (`Trace.incomplete_step`, from a window stepcli cut short) holds only the
start of that step, so it is left out of step times, step statistics, per-rank statistics, the step
breakdown and the operator tables (its events are time outside the recorded steps). Events the
reader skipped for unusable times are counted in `skipped_events`.

When a trace has recorded steps, host events that overlap no complete ProfilerStep#N of their own
process are time outside every step: they are left out of the operator tables, whose shares are of
step time, and counted in `outside_events`/`outside_ns` instead (e.g. the `cudaDeviceSynchronize`
the profiler itself calls after the last step). An event that overlaps a step even in part is kept
whole. Device kernels are all kept: a kernel launched inside a step belongs to it even when it runs
after the step's CPU side ended. A trace without recorded steps keeps every event, as key_averages()
does.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from stepcli.traces.analyses.culprit import rank_arrivals
from stepcli.traces.analyses.device import (
    Within,
    is_collective_kernel,
    measure,
    union_by_class,
    within_arrays,
)
from stepcli.traces.analyses.devicefigures import device_busy_arrays, device_launches, flops_of
from stepcli.traces.analyses.pystacks import has_stacks
from stepcli.traces.analyses.ranks import is_communication
from stepcli.traces.analyses.results import (
    PHASES,
    FilePart,
    TraceFacts,
)
from stepcli.traces.analyses.shares import STEP_KEY, stable_name
from stepcli.traces.analyses.steps import (
    BACKWARD,
    CLOSURE,
    COMM,
    DATALOADER,
    OPTIMIZER,
    OTHER_INSIDE,
    Accumulator,
    StepSpans,
    TraceResult,
    Window,
    clip,
    device_busy,
    is_closure,
    length,
    measured_spans,
    phase_of,
    step_phases,
    step_spans_of,
    union,
    within_lists,
    wraps_backward,
)
from stepcli.traces.read.names import STEP_PREFIX, step_of

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.read.tracereader import Trace
    from stepcli.traces.read.typedcolumns import Columns


def _recorded_device_work(
    columns: Columns,
    start: np.ndarray,
    dur: np.ndarray,
    dev: np.ndarray,
    incomplete_step: int | None,
) -> np.ndarray:
    """`dev` less the device events launched inside the incomplete step (as the reference's
    launched_in_cut_step)."""
    import numpy as np

    if incomplete_step is None or not dev.size:
        return dev
    from stepcli.traces.read import typedcolumns

    target = f"{STEP_PREFIX}{incomplete_step}"
    codes = [code for code, name in enumerate(columns.names) if name == target]
    cut_steps = np.nonzero(
        np.isin(columns.name, codes) & (columns.kind == typedcolumns.USER_ANNOTATION)
    )[0]
    host = np.nonzero((columns.kind < typedcolumns.DEVICE) & (columns.corr >= 0))[0]
    inside = np.zeros(len(host), bool)
    for at in cut_steps.tolist():
        lo, hi = start[at], start[at] + dur[at]
        inside |= (columns.pid[host] == columns.pid[at]) & (start[host] >= lo) & (start[host] < hi)
    launched = columns.corr[host[inside]]
    kept: np.ndarray = dev[~(np.isin(columns.corr[dev], launched) & (columns.corr[dev] >= 0))]
    return kept


def _analyze_columns(
    columns: Columns, by_shape: bool, incomplete_step: int | None = None
) -> tuple[dict[Any, list[int]], dict[Any, list[int]], TraceResult]:
    """`_analyze` over typed arrays (stepcli.traces.analyses.arrays): CPU rows, device rows and the
    trace result, equal to the reference's. Raises columnar.TooLarge for times past 64-bit
    nanoseconds."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    ns = col.nanoseconds(columns)
    names = columns.names
    shapes = columns.shapes
    n_shapes = len(shapes)
    kind = columns.kind
    keys: dict[str, int] = {}
    name_key = np.array(
        [keys.setdefault(stable_name(n), len(keys)) for n in names] or [0], np.int64
    )
    step_key = keys.setdefault(STEP_KEY, len(keys))
    key_list = list(keys)
    communication = np.array([is_communication(n) for n in names] or [False], bool)

    def key_of(value: int) -> Any:
        return (
            (key_list[value // n_shapes], shapes[value % n_shapes]) if by_shape else key_list[value]
        )

    def keyed(key_ids: np.ndarray, events: np.ndarray) -> np.ndarray:
        return key_ids * n_shapes + columns.shape[events] if by_shape else key_ids

    # Device work: one row per kernel name, its busy time, and collective kernels as communication.
    device_rows: dict[Any, list[int]] = {}
    comm_spans: dict[int | str, list[tuple[int, int]]] = {}
    dev = np.nonzero(kind >= typedcolumns.DEVICE)[0]
    dev = _recorded_device_work(columns, ns.start, ns.dur, dev, incomplete_step)
    d_start, d_dur = ns.start[dev], ns.dur[dev]
    d_end = d_start + d_dur
    device_arrays = col.union_arrays(d_start, d_end)
    collective = np.array([is_collective_kernel(n) for n in names] or [False], np.int8)
    d_class = np.where(kind[dev] == typedcolumns.MEMORY, 2, collective[columns.name[dev]])
    device_classes = union_by_class(d_start, d_end, d_class)
    device_union = list(zip(device_arrays[0].tolist(), device_arrays[1].tolist()))
    if dev.size:
        device_rows = col.rows_from(keyed(name_key[columns.name[dev]], dev), key_of, d_dur, d_dur)
        is_comm = communication[columns.name[dev]]
        if is_comm.any():
            comm_spans["device"] = list(zip(d_start[is_comm].tolist(), d_end[is_comm].tolist()))

    # CPU operators: nesting, folding, self time (stepcli.traces.analyses.arrays), then rows keyed
    # like the reference's.
    a = col.analysis_arrays(columns, ns)
    index, start, end, parent = a["index"], a["start"], a["end"], a["parent"]
    name = columns.name[index]
    step_name = np.array([n.startswith(STEP_PREFIX) for n in names] or [False], bool)
    is_step = step_name[name] & (kind[index] == typedcolumns.USER_ANNOTATION)
    row_key = np.where(is_step, step_key, name_key[name])
    kept = a["kept"]
    # Host events outside every step of their process: no rows (not even empty ones), only the
    # outside count.
    step_rows = np.nonzero(is_step)[0]
    step_spans = step_spans_of(
        zip(
            columns.pid[index[step_rows]].tolist(),
            [names[n] for n in name[step_rows].tolist()],
            start[step_rows].tolist(),
            end[step_rows].tolist(),
        ),
        incomplete_step,
    )
    # no complete step: every operator counts, but not the cut steps themselves
    if step_spans is None:
        inside = ~is_step if step_rows.size else None
        outside_events = outside_ns = 0
    else:
        inside = _in_steps_array(step_spans, columns.pid[index], start, end)
        left_out = kept & ~inside
        outside_events, outside_ns = int(left_out.sum()), int(a["self"][left_out].sum())
    # (a slice: views, no copies)
    mine: Any = slice(None) if inside is None or inside.all() else inside
    cpu_rows = col.rows_from(
        keyed(row_key[mine], index[mine]),
        key_of,
        a["self"][mine],
        a["dur"][mine],
        counted=kept[mine],
    )

    phase_of_name = np.array([phase_of(n) for n in names] or [0], np.int8)
    phase = phase_of_name[name]
    ids = columns.ids
    pid_code = columns.pid[index]
    windows: list[Window] = []
    by_row: dict[int, Window] = {}
    for row in step_rows.tolist():
        number = step_of(names[int(name[row])])
        if number is not None and number != incomplete_step:
            window = by_row[row] = Window(
                number, ids[int(pid_code[row])], int(start[row]), int(end[row]), []
            )
            windows.append(window)
    wrapper_name = np.array([wraps_backward(n) for n in names] or [False], bool)
    named = wrapper_name[name] & (kind[index] == typedcolumns.USER_ANNOTATION) & ~is_step
    closure_name = np.array([is_closure(n) for n in names] or [False], bool)
    closure = closure_name[name] & (kind[index] == typedcolumns.USER_ANNOTATION)
    forward, forward_row = _forward_candidates(parent, phase, list(by_row), named, closure)
    measured = _phase_totals_arrays(
        list(by_row), start, end, phase, closure, pid_code, forward, forward_row, parent
    )
    phase_totals, other_inside = _measured_parts(measured)

    # The phase spans and the steps' children feed the per-window reference (`step_phases`); with
    # the totals already measured on arrays, only communication spans are still needed.
    phase_spans = _phase_spans(
        phase, closure if phase_totals is None else None, start, end, pid_code, ids
    )
    if by_row and phase_totals is None:
        _fill_windows(by_row, forward, forward_row, parent, start, end)

    cpu_span = None
    if device_union and not windows and len(index):
        cpu_span = (int(start.min()), int(end.max()))
    for s, e, pid in phase_spans[COMM]:
        comm_spans.setdefault(pid, []).append((s, e))
    main_pid = None
    if len(index):
        # As the reference counts: per process, the runs of consecutive CPU events on one of its
        # threads (in file order); ties go to the process seen first.
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
    comm_union = {pid: union(spans) for pid, spans in comm_spans.items()}
    result = TraceResult(
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
        device_classes,
        ns,
        other_inside_ns=other_inside,
    )
    return cpu_rows, device_rows, result


def _measured_parts(
    measured: tuple[dict[str, int], int, int] | None,
) -> tuple[tuple[dict[str, int], int] | None, int | None]:
    """_phase_totals_arrays' answer as (phase totals and steps, other inside operators), both None
    unmeasured."""
    return (None, None) if measured is None else ((measured[0], measured[1]), measured[2])


def _fill_windows(
    by_row: dict[int, Window], forward: Any, forward_row: Any, parent: Any, start: Any, end: Any
) -> None:
    """The windows' forward candidates and top-level events, for the per-window `step_phases`."""
    import numpy as np

    for row, s, e in zip(forward_row.tolist(), start[forward].tolist(), end[forward].tolist()):
        by_row[row].children.append((s, e, 0))
    top = np.nonzero(parent >= 0)[0]
    for row, s, e in zip(parent[top].tolist(), start[top].tolist(), end[top].tolist()):
        if row in by_row:
            by_row[row].tops.append((s, e))


def _phase_spans(
    phase: Any, closure: Any, start: Any, end: Any, pid_code: Any, ids: list[int | str]
) -> dict[int, list[tuple[int, int, int | str]]]:
    """Per phase, its events' (start, end, pid): communication only when `closure` is None (the
    totals are measured on arrays), else every phase and the closure ranges (steps.CLOSURE), for the
    per-window `step_phases`."""
    import numpy as np

    spans: dict[int, list[tuple[int, int, int | str]]] = {
        DATALOADER: [],
        OPTIMIZER: [],
        BACKWARD: [],
        COMM: [],
        CLOSURE: [],
    }
    with_phase = np.nonzero(phase == COMM if closure is None else (phase > 0) & (phase <= COMM))[0]
    codes = phase[with_phase].tolist()
    if closure is not None:
        at = np.nonzero(closure)[0]
        with_phase = np.concatenate((with_phase, at))
        codes += [CLOSURE] * len(at)
    for p, s, e, pid in zip(
        codes, start[with_phase].tolist(), end[with_phase].tolist(), pid_code[with_phase].tolist()
    ):
        spans[p].append((s, e, ids[pid]))
    return spans


def _in_steps_array(spans: StepSpans, pid: Any, start: Any, end: Any) -> Any:
    """`in_steps` for arrays of events (pid codes, as `spans` is keyed): a boolean array."""
    import numpy as np

    inside = np.zeros(len(pid), bool)
    for code, (spans_of_pid, ends) in spans.items():
        mine = pid == code
        # mostly one process: no copies then
        rows: Any = slice(None) if mine.all() else np.nonzero(mine)[0]
        first = np.array([s for s, _ in spans_of_pid], np.int64)
        # first span ending later
        after = np.searchsorted(np.array(ends, np.int64), start[rows], side="right")
        reach = np.maximum(end[rows], start[rows] + 1)
        inside[rows] = (after < len(spans_of_pid)) & (
            first[np.minimum(after, len(spans_of_pid) - 1)] < reach
        )
    return inside


def _forward_candidates(
    parent: Any, phase: Any, rows: list[int], named: Any, closure: Any
) -> tuple[Any, Any]:
    """The steps' forward candidates (`step_phases`): the events, and the step event (at `rows`) of
    each.

    A step's top-level operator that is no phase is forward. A wrapper around a phase (a user's `##
    backward ##` around the autograd engine's events, Lightning's `[pl][profile]...backward`) is no
    operator of its own: its children stand in its place, so that naming a phase never moves the
    time between its events to forward. `named`: the user annotations named for backward
    (steps.wraps_backward), wrappers whatever is below them. `closure`: the agent's ranges around an
    optimizer's closure (steps.is_closure), wrappers too, and the only events inside an optimizer
    event whose children can be forward: the optimizer's other operators are its own."""
    import numpy as np

    n = len(parent)
    # holds a dataloader, optimizer or backward event somewhere below it (or wraps one)
    contains = named | closure
    below = np.nonzero(((phase >= DATALOADER) & (phase <= BACKWARD)) | named)[0]
    while below.size:
        up = parent[below]
        up = up[up >= 0]
        up = up[~contains[up]]
        contains[up] = True
        below = up
    owner = np.full(n, -1, np.int64)  # the step event an event is a candidate of, through wrappers
    owner[np.array(rows, np.int64)] = np.array(rows, np.int64)
    is_row = owner >= 0
    # Parents come before their children in this order: one pass over the wrappers (few) reaches
    # every depth. An optimizer event passes its step on only to what is an optimizer event or a
    # closure range below it.
    passing = (contains & (phase == 0)) | (phase == OPTIMIZER)
    for wrapper in np.nonzero(passing & ~is_row)[0].tolist():
        up = int(parent[wrapper])
        if (
            up >= 0
            and owner[up] >= 0
            and (phase[up] != OPTIMIZER or closure[wrapper] or phase[wrapper] == OPTIMIZER)
        ):
            owner[wrapper] = owner[up]
    candidate = np.nonzero((parent >= 0) & (phase == 0) & ~contains)[0]
    candidate = candidate[(owner[parent[candidate]] >= 0) & (phase[parent[candidate]] == 0)]
    return candidate, owner[parent[candidate]]


def _phase_totals_arrays(
    rows: list[int],
    start: Any,
    end: Any,
    phase: Any,
    closure: Any,
    pid_code: Any,
    forward: Any,
    forward_row: Any,
    parent: Any,
) -> tuple[dict[str, int], int, int] | None:
    """`step_phases` summed over the windows (the step events at `rows`; `forward` the forward
    candidates and `forward_row` the step of each, from _forward_candidates; `closure` the agent's
    closure ranges, which with the backward nested in an optimizer event are no optimizer time:
    steps.optimizer_own), with array operations per process
    (stepcli.traces.analyses.arrays.step_phases) instead of a Python step per span. None when two
    windows of one process overlap: the per-window reference measures those. The third figure is the
    part of "other" inside the steps' top-level operators (`parent`: each event's): what no phase
    claims of a wrapper or a closure range."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col

    totals = dict.fromkeys(PHASES, 0)
    inside = 0
    if not rows:
        return totals, 0, 0
    at = np.array(rows, np.int64)
    window_pid, window_start, window_end = pid_code[at], start[at], end[at]
    window_of = np.full(len(start), -1, np.int64)
    window_of[at] = np.arange(len(at))
    child, child_window = forward, window_of[forward_row]
    top = np.nonzero(parent >= 0)[0]
    top = top[window_of[parent[top]] >= 0]  # the steps' own top-level events, whatever their phase
    top_window = window_of[parent[top]]
    for pid in sorted(set(window_pid.tolist())):  # (np.unique would import numpy.ma: 10 ms)
        mine = np.nonzero(window_pid == pid)[0]
        by_start = mine[np.argsort(window_start[mine], kind="stable")]
        if np.any(window_start[by_start][1:] < window_end[by_start][:-1]):
            return None
        of_pid = pid_code == pid
        spans = [np.nonzero(of_pid & (phase == p))[0] for p in (DATALOADER, OPTIMIZER, BACKWARD)]
        phase_start, phase_end = [start[e] for e in spans], [end[e] for e in spans]
        if len(spans[1]):
            phase_start[1], phase_end[1] = col.optimizer_own(
                start, end, spans[1], spans[2], np.nonzero(of_pid & closure)[0]
            )
        of_window = window_pid[child_window] == pid
        forward_of, forward_events = child_window[of_window], child[of_window]
        of_top = window_pid[top_window] == pid
        top_of, top_events = top_window[of_top], top[of_top]
        # Forward as a fourth phase, then every top-level event: what that claims is "other" inside
        # an operator.
        parts = col.step_phases(
            window_start[mine],
            window_end[mine],
            [*phase_start, np.maximum(start[forward_events], window_start[forward_of])],
            [*phase_end, np.minimum(end[forward_events], window_end[forward_of])],
            np.maximum(start[top_events], window_start[top_of]),
            np.minimum(end[top_events], window_end[top_of]),
        )
        for label, values in zip(PHASES, [*parts[:4], parts[4] + parts[5]]):
            totals[label] += int(values.sum())
        inside += int(parts[4].sum())
    return totals, len(rows), inside


def summarize_file(trace: Trace, *, group_by_shape: bool = False) -> FilePart:
    """The part of one trace file; `merge_parts` of the parts of several files equals `summarize` of
    them."""
    from stepcli.traces.read.typedcolumns import columns_from_events

    return summarize_read(columns_from_events(trace.events), trace, group_by_shape=group_by_shape)


def summarize_read(
    columns: Columns, trace: TraceFacts, *, group_by_shape: bool = False, arrivals: bool = True
) -> FilePart:
    """The part of one trace file, from its columns and what the reader found out about it
    (`arrivals`: see summarize_columns)."""
    return summarize_columns(
        columns,
        path=trace.path,
        rank=trace.rank,
        event_count=trace.event_count,
        skipped_events=trace.skipped_events,
        incomplete_step=trace.incomplete_step,
        group_by_shape=group_by_shape,
        device_name=trace.device_name,
        clock=trace.clock,
        cpu_time=trace.cpu_time,
        arrivals=arrivals,
        world_size=trace.world_size,
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
    device_name: str | None = None,
    clock: str | None = None,
    cpu_time: dict[int, tuple[float, float]] | None = None,
    arrivals: bool = True,
    world_size: int | None = None,
) -> FilePart:
    """The part of one trace file read into columns (stepcli.traces.read.columns.load_columns).
    Without `arrivals`, its collectives' arrivals are left out: they only serve to compare ranks
    (the culprit), so a part that will be summarized alone needs none."""
    from stepcli.traces.analyses.arrays import TooLarge
    from stepcli.traces.analyses.stub import profiler_stub

    stub = profiler_stub(columns) if incomplete_step is None else None
    # no step: what is left out as a window's cut step is (stepcli.traces.analyses.steps)
    if stub is not None:
        incomplete_step = stub
    measure_busy = device_busy_arrays
    within: Within = within_arrays
    try:
        cpu_rows, device_rows, result = _analyze_columns(columns, group_by_shape, incomplete_step)
    except TooLarge:
        # times past 64-bit nanoseconds: the per-event reference, on Python integers (imported only
        # then)
        from stepcli.traces.analyses.reference import analyze_events

        measure_busy, within = device_busy, within_lists
        cpu, device = Accumulator(), Accumulator()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            result = analyze_events(
                columns.to_events(), cpu, device, group_by_shape, incomplete_step
            )
        finally:
            if was_enabled:
                gc.enable()
        cpu_rows, device_rows = cpu.rows, device.rows
    ordered = sorted(result.windows, key=lambda w: (w.step, w.start))
    comm_ns = []
    for w in ordered:
        comm = result.comm_union.get(w.pid, [])
        comm_ns.append(length(clip(comm, [e for _, e in comm], w.start, w.end)))
    other_inside = result.other_inside_ns
    if result.phase_totals is not None:
        phase_totals, phase_steps = result.phase_totals
    else:
        phase_totals = dict.fromkeys(PHASES, 0)
        phase_steps = other_inside = 0
        for _window, phases in step_phases(result):
            other_inside += phases.pop(OTHER_INSIDE)
            for label, ns in phases.items():
                phase_totals[label] += ns
            phase_steps += 1
    busy = measure_busy(result)
    times = None
    if busy is not None and result.device_classes is not None:
        spans = measured_spans(result)
        times = measure(busy, len(result.windows) or 1, result.device_classes, spans, within)
        times.launches, times.transfers, times.steps_ns = device_launches(
            columns, result, spans, times.steps, ordered
        )
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
        device_times=times,
        has_shapes=bool(len(columns) and columns.shape.any()),
        outside_events=result.outside_events,
        outside_ns=result.outside_ns,
        **flops_of(path, columns, result, ordered, device_name),
        arrivals=rank_arrivals(columns, rank, incomplete_step, clock, cpu_time)
        if arrivals
        else None,
        world_size=world_size,
        device_name=device_name,
        stub_step=stub,
        other_inside_ns=other_inside,
        has_stacks=has_stacks(columns),
        shapes_recorded=bool(len(columns) and columns.shape.any()) or bool(columns.gemm_ops),
    )
