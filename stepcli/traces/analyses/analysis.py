"""Pure analysis of loaded traces: per-operator, per-kernel, per-step, per-rank and step-breakdown summaries.

The CPU operator table follows torch's `key_averages()` so the two can be compared number for number: user
annotations (`ProfilerStep*`, `enumerate(DataLoader)#...`, `Optimizer.step#...`) are rows like any operator, and
every ProfilerStep#N is folded into `ProfilerStep*`. Python frames of traces recorded with stacks
(`python_function` events) are no operators: they are left out of the tables and of the nesting, and memory
addresses are stripped from the names used as keys (see stepcli.traces.analyses.shares). Shares are defined in stepcli.traces.analyses.shares,
processes and the straggler in stepcli.traces.analyses.ranks.

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

import gc
from typing import TYPE_CHECKING, Any

from stepcli.stats import describe
from stepcli.traces.analyses.collectives import Transfers, measure_transfers
from stepcli.traces.analyses.culprit import from_parts, rank_arrivals
from stepcli.traces.analyses.device import (
    DeviceTimes,
    Within,
    is_collective_kernel,
    measure,
    measure_steps,
    union_by_class,
    within_arrays,
)
from stepcli.traces.analyses.flops import flops_figures, read_flops
from stepcli.traces.analyses.launches import LaunchTimes, in_spans, measure_launches
from stepcli.traces.analyses.model import (
    NS_PER_MS,
    PHASES,
    Breakdown,
    FilePart,
    StepRow,
    TraceFacts,
    TraceSummary,
)
from stepcli.traces.analyses.ranks import WindowFacts, find_straggler, group_processes, is_communication, process_keys
from stepcli.traces.analyses.shares import STEP_KEY, share_basis, stable_name
from stepcli.traces.analyses.steps import (
    BACKWARD,
    COMM,
    DATALOADER,
    OPTIMIZER,
    Accumulator,
    StepSpans,
    TraceResult,
    Window,
    clip,
    device_busy,
    length,
    measured_spans,
    phase_of,
    step_phases,
    step_spans_of,
    union,
    within_lists,
)
from stepcli.traces.read.names import DTYPES, STEP_PREFIX, gemm_dtype

if TYPE_CHECKING:
    from stepcli.traces.read.reader import Trace
    from stepcli.traces.read.typedcolumns import Columns


def _analyze_columns(
    columns: Columns, by_shape: bool, incomplete_step: int | None = None
) -> tuple[dict[Any, list[int]], dict[Any, list[int]], TraceResult]:
    """`_analyze` over typed arrays (stepcli.traces.analyses.arrays): CPU rows, device rows and the trace result, equal to the
    reference's. Raises columnar.TooLarge for times past 64-bit nanoseconds."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

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
    dev = np.nonzero(kind >= typedcolumns.DEVICE)[0]
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

    # CPU operators: nesting, folding, self time (stepcli.traces.analyses.arrays), then rows keyed like the reference's.
    a = col.analysis_arrays(columns, ns)
    index, start, end, parent = a["index"], a["start"], a["end"], a["parent"]
    name = columns.name[index]
    step_name = np.array([n.startswith(STEP_PREFIX) for n in names] or [False], bool)
    is_step = step_name[name] & (kind[index] == typedcolumns.USER_ANNOTATION)
    row_key = np.where(is_step, step_key, name_key[name])
    kept = a["kept"]
    # Host events outside every step of their process: no rows (not even empty ones), only the outside count.
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

    phase_of_name = np.array([phase_of(n) for n in names] or [0], np.int8)
    phase = phase_of_name[name]
    ids = columns.ids
    pid_code = columns.pid[index]
    windows: list[Window] = []
    by_row: dict[int, Window] = {}
    for row in step_rows.tolist():
        number = names[int(name[row])][len(STEP_PREFIX) :]
        if number.isdecimal() and int(number) != incomplete_step:
            window = by_row[row] = Window(int(number), ids[int(pid_code[row])], int(start[row]), int(end[row]), [])
            windows.append(window)
    phase_totals = _phase_totals_arrays(list(by_row), start, end, phase, pid_code, parent)

    phase_spans: dict[int, list[tuple[int, int, int | str]]] = {
        DATALOADER: [],
        OPTIMIZER: [],
        BACKWARD: [],
        COMM: [],
    }
    # The phase spans and the steps' children feed the per-window reference (`step_phases`); with the totals
    # already measured on arrays, only communication spans are still needed.
    with_phase = np.nonzero(phase == COMM if phase_totals is not None else (phase > 0) & (phase <= COMM))[0]
    for p, s, e, pid in zip(
        phase[with_phase].tolist(), start[with_phase].tolist(), end[with_phase].tolist(), pid_code[with_phase].tolist()
    ):
        phase_spans[p].append((s, e, ids[pid]))
    if by_row and phase_totals is None:
        under = np.nonzero(col.isin(parent, np.fromiter(by_row, np.int64, len(by_row))))[0]
        for p, s, e, ph in zip(
            parent[under].tolist(), start[under].tolist(), end[under].tolist(), phase[under].tolist()
        ):
            by_row[p].children.append((s, e, ph))

    cpu_span = None
    if device_union and not windows and len(index):
        cpu_span = (int(start.min()), int(end.max()))
    for s, e, pid in phase_spans[COMM]:
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
    )
    return cpu_rows, device_rows, result


def _in_steps_array(spans: StepSpans, pid: Any, start: Any, end: Any) -> Any:
    """`in_steps` for arrays of events (pid codes, as `spans` is keyed): a boolean array."""
    import numpy as np

    inside = np.zeros(len(pid), bool)
    for code, (spans_of_pid, ends) in spans.items():
        mine = pid == code
        rows: Any = slice(None) if mine.all() else np.nonzero(mine)[0]  # mostly one process: no copies then
        first = np.array([s for s, _ in spans_of_pid], np.int64)
        after = np.searchsorted(np.array(ends, np.int64), start[rows], side="right")  # first span ending later
        reach = np.maximum(end[rows], start[rows] + 1)
        inside[rows] = (after < len(spans_of_pid)) & (first[np.minimum(after, len(spans_of_pid) - 1)] < reach)
    return inside


def _phase_totals_arrays(
    rows: list[int], start: Any, end: Any, phase: Any, pid_code: Any, parent: Any
) -> tuple[dict[str, int], int] | None:
    """`step_phases` summed over the windows (the step events at `rows`), with array operations per process
    (stepcli.traces.analyses.arrays.step_phases) instead of a Python step per span. None when two windows of one process
    overlap: the per-window reference measures those."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col

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
        spans = [np.nonzero(of_pid & (phase == p))[0] for p in (DATALOADER, OPTIMIZER, BACKWARD)]
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


def summarize_file(trace: Trace, *, group_by_shape: bool = False) -> FilePart:
    """The part of one trace file; `merge_parts` of the parts of several files equals `summarize` of them."""
    from stepcli.traces.read.typedcolumns import columns_from_events

    return summarize_read(columns_from_events(trace.events), trace, group_by_shape=group_by_shape)


def summarize_read(
    columns: Columns, trace: TraceFacts, *, group_by_shape: bool = False, arrivals: bool = True
) -> FilePart:
    """The part of one trace file, from its columns and what the reader found out about it (`arrivals`: see
    summarize_columns)."""
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
) -> FilePart:
    """The part of one trace file read into columns (stepcli.traces.read.columns.load_columns). Without `arrivals`, its
    collectives' arrivals are left out: they only serve to compare ranks (the culprit), so a part that will be
    summarized alone needs none."""
    from stepcli.traces.analyses.arrays import TooLarge

    measure_busy = _device_busy_arrays
    within: Within = within_arrays
    try:
        cpu_rows, device_rows, result = _analyze_columns(columns, group_by_shape, incomplete_step)
    except TooLarge:
        # times past 64-bit nanoseconds: the per-event reference, on Python integers (imported only then)
        from stepcli.traces.analyses.reference import analyze_events

        measure_busy, within = device_busy, within_lists
        cpu, device = Accumulator(), Accumulator()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            result = analyze_events(columns.to_events(), cpu, device, group_by_shape, incomplete_step)
        finally:
            if was_enabled:
                gc.enable()
        cpu_rows, device_rows = cpu.rows, device.rows
    ordered = sorted(result.windows, key=lambda w: (w.step, w.start))
    comm_ns = []
    for w in ordered:
        comm = result.comm_union.get(w.pid, [])
        comm_ns.append(length(clip(comm, [e for _, e in comm], w.start, w.end)))
    if result.phase_totals is not None:
        phase_totals, phase_steps = result.phase_totals
    else:
        phase_totals = dict.fromkeys(PHASES, 0)
        phase_steps = 0
        for _window, phases in step_phases(result):
            for label, ns in phases.items():
                phase_totals[label] += ns
            phase_steps += 1
    busy = measure_busy(result)
    times = None
    if busy is not None and result.device_classes is not None:
        spans = measured_spans(result)
        times = measure(busy, len(result.windows) or 1, result.device_classes, spans, within)
        times.launches, times.transfers, times.steps_ns = _launches(columns, result, spans, times.steps, ordered)
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
        **_flops_of(path, columns, result, ordered, device_name),
        arrivals=rank_arrivals(columns, rank, incomplete_step, clock, cpu_time) if arrivals else None,
    )


def _flops_of(
    path: str, columns: Columns, result: TraceResult, windows: list[Window], device: str | None
) -> dict[str, Any]:
    """The FLOPs of a trace: from the `NAME.flops` file `stepcli run --with-flops` writes beside it, else the sum
    of the `flops` torch wrote into its operators' args, over the operators that start inside a complete recorded
    step of their process (all of them in a trace without steps)."""
    counted = read_flops(path)
    if counted:
        figures = {"flops": counted[0], "flops_device": counted[1] or device, "flops_source": "file"}
        return figures | _gemm_time(columns, result)
    if not columns.flops:
        return {}
    import numpy as np

    at = np.fromiter(columns.flops, np.int64, len(columns.flops))
    flops = np.fromiter(columns.flops.values(), np.int64, len(columns.flops))
    if windows:
        ns = result.nanoseconds
        # times past 64-bit ns (the reference path): microseconds, as floats, are precise enough to place an op
        start = ns.start[at] if ns is not None else columns.ts[at] * 1000.0
        pid = np.array(columns.ids, dtype=object)[columns.pid[at]] if columns.ids else np.zeros(len(at), object)
        inside = np.zeros(len(at), bool)
        for process in {w.pid for w in windows}:
            mine = [w for w in windows if w.pid == process]
            lo = np.array(sorted(w.start for w in mine), np.float64 if ns is None else np.int64)
            hi = np.array([w.end for w in sorted(mine, key=lambda w: w.start)], lo.dtype)
            inside |= (pid == process) & in_spans(start, lo, hi)
        flops = flops[inside]
    counted_flops = sum(flops.tolist())  # (no int64 overflow)
    return {"flops": counted_flops, "flops_device": device, "flops_source": "trace", **_gemm_time(columns, result)}


def _gemm_time(columns: Columns, result: TraceResult) -> dict[str, Any]:
    """`gemm_ns`: the time of the GEMM and convolution kernels that start inside the recorded steps (the measured
    spans), by the dtype their names say (stepcli.traces.analyses.flops.gemm_dtype, once per unique kernel name); empty
    without device work, with no kernel recognised, and for times past 64-bit nanoseconds."""
    if not result.device_union:
        return {}
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    ns = result.nanoseconds
    if ns is None:
        try:
            ns = col.nanoseconds(columns)
        except col.TooLarge:
            return {}
    kernels = np.nonzero(columns.kind == typedcolumns.DEVICE)[0]
    used = np.unique(columns.name[kernels])
    code = np.full(len(columns.names) or 1, len(DTYPES), np.int64)  # len(DTYPES): not a recognised GEMM
    for name in used.tolist():
        dtype = gemm_dtype(columns.names[name])
        if dtype is not None:
            code[name] = DTYPES.index(dtype)
    spans = measured_spans(result)
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    kernels = kernels[in_spans(ns.start[kernels], lo, hi)]
    codes = code[columns.name[kernels]]
    if columns.gemm_kernels and columns.gemm_ops:
        _operator_dtypes(columns, kernels, codes)
    times = np.bincount(codes, weights=ns.dur[kernels], minlength=len(DTYPES) + 1)
    gemm_ns = {dtype: int(times[i]) for i, dtype in enumerate(DTYPES) if times[i] > 0}
    return {"gemm_ns": gemm_ns} if gemm_ns else {}


def _operator_dtypes(columns: Columns, kernels: Any, codes: Any) -> None:
    """Give the GEMM kernels among `kernels` whose names say no dtype (cuBLAS 12.8+'s nvjet_*) the dtype of the
    operator that launched them, matched by `External id` (a kernel's is its innermost operator's), in `codes`;
    only these few kernels and operators are looked at."""
    import numpy as np

    rows = np.fromiter(columns.gemm_kernels, np.int64, len(columns.gemm_kernels))
    externals = np.fromiter(columns.gemm_kernels.values(), np.int64, len(rows))
    at = np.searchsorted(kernels, rows)
    mine = (at < len(kernels)) & (kernels[np.minimum(at, len(kernels) - 1)] == rows) if len(kernels) else at < 0
    if not mine.any():
        return
    dtype_of = {external: DTYPES.index(dtype) for external, dtype in columns.gemm_ops.values()}
    unknown = len(DTYPES)
    codes[at[mine]] = [dtype_of.get(external, unknown) for external in externals[mine].tolist()]


def _launches(
    columns: Columns, result: TraceResult, spans: list[tuple[int, int]], steps: int, windows: list[Window]
) -> tuple[LaunchTimes, Transfers, list[tuple[int, ...]]]:
    """Launch statistics and idle time by cause (stepcli.traces.analyses.launches), collectives and copies
    (stepcli.traces.analyses.collectives), on either path's result; and the device figures of each step window
    (stepcli.traces.analyses.device.measure_steps); none for times past 64-bit nanoseconds."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    ns = result.nanoseconds
    if ns is None:
        try:
            ns = col.nanoseconds(columns)
        except col.TooLarge:
            return LaunchTimes(steps=steps), Transfers(steps), []
    device = np.nonzero(columns.kind >= typedcolumns.DEVICE)[0]
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    inside = in_spans(ns.start[device], lo, hi)
    transfers = measure_transfers(columns, ns.start, ns.dur, device, inside, steps)
    w_lo = np.array([w.start for w in windows], np.int64)
    w_hi = np.array([w.end for w in windows], np.int64)
    launches, waits = measure_launches(columns, ns.start, ns.dur, device, spans, steps, (w_lo, w_hi))
    per_step: list[tuple[int, ...]] = []
    if windows and result.device_classes is not None:
        arrays = result.device_arrays is not None
        per_step = measure_steps(
            [w.step for w in windows],
            w_lo,
            w_hi,
            result.device_arrays if arrays else result.device_union,
            result.device_classes,
            waits,
            within_arrays if arrays else within_lists,
        )
    return launches, transfers, per_step


def _device_busy_arrays(result: TraceResult) -> tuple[int, int] | None:
    """`device_busy` with array operations: the device time inside each span is F(end) - F(start), where F(t)
    is the device union's length before t (prefix sums and a binary search), instead of a Python step per
    kernel interval."""
    if not result.device_union:
        return None
    import numpy as np

    merged = measured_spans(result)
    if result.device_arrays is not None:
        starts, ends = result.device_arrays
    else:
        pairs = np.array(result.device_union, dtype=np.int64)
        starts, ends = pairs[:, 0], pairs[:, 1]
    return within_arrays((starts, ends), merged), sum(e - s for s, e in merged)


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
    cpu = Accumulator()
    device = Accumulator()
    steps: list[StepRow] = []
    windows: list[tuple[int | None, str, int | str | None, WindowFacts]] = []
    phase_totals = dict.fromkeys(PHASES, 0)
    phase_steps = 0
    job_device: DeviceTimes | None = None
    flops = flops_steps = flops_ns = 0
    flops_devices: set[str] = set()
    flops_sources: set[str] = set()
    gemm_ns: dict[str, int] = {}
    rank_device: dict[str, DeviceTimes] = {}
    labels = process_keys([(part.rank, part.path, part.main_pid) for part in parts])
    for part, (_key, process) in zip(parts, labels):
        _add_rows(cpu.rows, part.cpu_rows)
        _add_rows(device.rows, part.device_rows)
        trace_steps = [
            StepRow(rank=part.rank, step=step, dur_ms=ns / NS_PER_MS, process=process)
            for step, ns in zip(part.steps, part.step_ns)
        ]
        steps.extend(trace_steps)
        comm_ms = [ns / NS_PER_MS for ns in part.comm_ns]
        facts = WindowFacts(part.path, list(part.steps), [s.dur_ms for s in trace_steps], comm_ms)
        windows.append((part.rank, part.path, part.main_pid, facts))
        for label, ns in part.phase_totals.items():
            phase_totals[label] += ns
        phase_steps += part.phase_steps
        if part.flops is not None:
            flops += part.flops
            flops_steps += len(part.step_ns)
            flops_ns += sum(part.step_ns)
            flops_devices.add(part.flops_device or "")
            flops_sources.add(part.flops_source or "file")
            for dtype, ns in part.gemm_ns.items():
                gemm_ns[dtype] = gemm_ns.get(dtype, 0) + ns
        if part.device_times is not None:
            job_device = part.device_times if job_device is None else job_device + part.device_times
            mine = rank_device.get(process)
            rank_device[process] = part.device_times if mine is None else mine + part.device_times

    processes = group_processes(windows)
    order = {row.process: index for index, row in enumerate(processes)}
    steps.sort(key=lambda s: (order.get(s.process, 0), s.step))
    breakdown = None
    if phase_steps:
        mean = {label: ns / phase_steps / NS_PER_MS for label, ns in phase_totals.items()}
        breakdown = Breakdown(**mean)
    step_ns = round(sum(s.dur_ms for s in steps) * NS_PER_MS)
    basis_ns, share_of = share_basis(step_ns, len(steps), cpu.self_ns_without_steps(group_by_shape))
    straggler = find_straggler(processes)
    return TraceSummary(
        files=[p.path for p in parts],
        step_ms=describe(s.dur_ms for s in steps),
        steps=steps,
        ranks=processes,
        slowest_rank=straggler.rank if straggler else None,
        breakdown_ms=breakdown,
        device=job_device,
        rank_devices=rank_device,
        flops=(
            flops_figures(flops, flops_steps, flops_ns, flops_devices, flops_sources, gemm_ns)
            if flops_devices
            else None
        ),
        cpu_ops=cpu.rows_out(group_by_shape, basis_ns),
        device_kernels=device.rows_out(group_by_shape, basis_ns),
        events=sum(p.event_count for p in parts),
        skipped_events=sum(p.skipped_events for p in parts),
        share_of=share_of,
        straggler=straggler.to_dict() if straggler else None,
        outside_events=sum(p.outside_events for p in parts),
        outside_ms=sum(p.outside_ns for p in parts) / NS_PER_MS,
        culprit=from_parts(parts, steps),
    )
