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
from dataclasses import dataclass
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
from stepcli.traces.analyses.stepphases import (
    HostEvents,
    host_events,
    in_steps_array,
    measure_step_phases,
)
from stepcli.traces.analyses.steps import (
    COMM,
    OTHER_INSIDE,
    Accumulator,
    TraceResult,
    Window,
    clip,
    device_busy,
    length,
    measured_spans,
    step_phases,
    step_spans_of,
    union,
    within_lists,
)
from stepcli.traces.read.names import STEP_PREFIX

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.analyses.arrays import Nanoseconds
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
    """`_analyze` over typed arrays (stepcli.traces.analyses.arrays): CPU rows, device rows and
    the trace result, equal to the reference's. Raises arrays.TooLarge for times past 64-bit
    nanoseconds."""
    from stepcli.traces.analyses import arrays as col

    ns = col.nanoseconds(columns)
    keys = _row_keys(columns, by_shape)
    device = _device_work(columns, ns, keys, incomplete_step)
    host = host_events(columns, ns)
    operators = _operator_rows(columns, host, keys, incomplete_step)
    steps = measure_step_phases(columns, host, incomplete_step)
    main_pid = _main_process(columns, host)
    result = TraceResult(
        steps.windows,
        steps.phase_spans,
        device.union,
        _cpu_span(host, device, steps.windows),
        _communication_by_process(device.communication, steps.phase_spans[COMM], main_pid),
        main_pid,
        operators.outside_events,
        operators.outside_ns,
        steps.phase_totals,
        device.union_arrays,
        device.classes,
        ns,
        other_inside_ns=steps.other_inside,
    )
    return operators.rows, device.rows, result


@dataclass(frozen=True)
class _RowKeys:
    """How events become table rows, as the reference keys them: by their name's stable key
    (addresses stripped, every ProfilerStep#N under one key), and with --group-by-shape by
    (key, input shape)."""

    name_key: np.ndarray  # per name code, its key's id
    step_key: int
    key_list: list[str]
    shapes: list[Any]
    shape: np.ndarray  # per event, its shape code
    by_shape: bool

    def key_of(self, value: int) -> Any:
        """The row key of a row id (from `keyed`)."""
        n_shapes = len(self.shapes)
        if self.by_shape:
            return (self.key_list[value // n_shapes], self.shapes[value % n_shapes])
        return self.key_list[value]

    def keyed(self, key_ids: np.ndarray, events: np.ndarray) -> np.ndarray:
        """One row id per event: its key's, combined with its shape's with --group-by-shape."""
        return key_ids * len(self.shapes) + self.shape[events] if self.by_shape else key_ids


def _row_keys(columns: Columns, by_shape: bool) -> _RowKeys:
    import numpy as np

    keys: dict[str, int] = {}
    key_ids = [keys.setdefault(stable_name(n), len(keys)) for n in columns.names]
    name_key = np.array(key_ids or [0], np.int64)
    step_key = keys.setdefault(STEP_KEY, len(keys))
    return _RowKeys(name_key, step_key, list(keys), columns.shapes, columns.shape, by_shape)


@dataclass(frozen=True)
class _DeviceWork:
    """The recorded device work: its rows, its busy union (as arrays, as spans and per kernel
    class) and the spans of its collective kernels (communication of no process yet: they are
    the main process's, once that is known)."""

    rows: dict[Any, list[int]]
    union_arrays: tuple[np.ndarray, np.ndarray]
    union: list[tuple[int, int]]
    classes: dict[str, Any]
    communication: list[tuple[int, int]]


def _device_work(
    columns: Columns,
    ns: Nanoseconds,
    keys: _RowKeys,
    incomplete_step: int | None,
) -> _DeviceWork:
    """One row per kernel name, the device's busy time, and collective kernels as communication."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    names, kind = columns.names, columns.kind
    on_device = np.nonzero(kind >= typedcolumns.DEVICE)[0]
    dev = _recorded_device_work(columns, ns.start, ns.dur, on_device, incomplete_step)
    d_start, d_dur = ns.start[dev], ns.dur[dev]
    d_end = d_start + d_dur
    union_arrays = col.union_arrays(d_start, d_end)
    collective = np.array([is_collective_kernel(n) for n in names] or [False], np.int8)
    d_class = np.where(kind[dev] == typedcolumns.MEMORY, 2, collective[columns.name[dev]])
    classes = union_by_class(d_start, d_end, d_class)
    rows: dict[Any, list[int]] = {}
    communication: list[tuple[int, int]] = []
    if dev.size:
        row_ids = keys.keyed(keys.name_key[columns.name[dev]], dev)
        rows = col.rows_from(row_ids, keys.key_of, d_dur, d_dur)
        communicates = np.array([is_communication(n) for n in names] or [False], bool)
        is_comm = communicates[columns.name[dev]]
        communication = list(zip(d_start[is_comm].tolist(), d_end[is_comm].tolist()))
    union_spans = list(zip(union_arrays[0].tolist(), union_arrays[1].tolist()))
    return _DeviceWork(rows, union_arrays, union_spans, classes, communication)


@dataclass(frozen=True)
class _OperatorRows:
    """The CPU operator table's rows, and the host events left out of it: outside every step."""

    rows: dict[Any, list[int]]
    outside_events: int
    outside_ns: int  # their self time


def _operator_rows(
    columns: Columns,
    host: HostEvents,
    keys: _RowKeys,
    incomplete_step: int | None,
) -> _OperatorRows:
    """Rows keyed like the reference's, of the events inside a complete step of their process:
    shares are of step time, so an event outside every step has no row (not even an empty one),
    it is only counted."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col

    kept, self_ns = host.arrays["kept"], host.arrays["self"]
    steps = host.step_rows
    step_spans = step_spans_of(
        zip(
            host.pid_code[steps].tolist(),
            [columns.names[n] for n in host.name[steps].tolist()],
            host.start[steps].tolist(),
            host.end[steps].tolist(),
        ),
        incomplete_step,
    )
    if step_spans is None:  # no complete step: every operator counts, but not the cut steps
        inside = ~host.is_step if steps.size else None
        outside_events = outside_ns = 0
    else:
        inside = in_steps_array(step_spans, host.pid_code, host.start, host.end)
        left_out = kept & ~inside
        outside_events, outside_ns = int(left_out.sum()), int(self_ns[left_out].sum())
    # (a slice: views, no copies)
    mine: Any = slice(None) if inside is None or inside.all() else inside
    row_key = np.where(host.is_step, keys.step_key, keys.name_key[host.name])
    rows = col.rows_from(
        keys.keyed(row_key[mine], host.index[mine]),
        keys.key_of,
        self_ns[mine],
        host.arrays["dur"][mine],
        counted=kept[mine],
    )
    return _OperatorRows(rows, outside_events, outside_ns)


def _main_process(columns: Columns, host: HostEvents) -> int | str | None:
    """The process of the CPU events, as the reference counts: per process, the runs of
    consecutive CPU events on one of its threads (in file order); ties go to the process seen
    first."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col

    if not len(host.index):
        return None
    in_file = host.arrays["in_file"]
    cpu_pids = columns.pid[in_file]
    cpu_tids = columns.tid[in_file]
    run = np.ones(len(in_file), dtype=bool)
    run[1:] = (cpu_pids[1:] != cpu_pids[:-1]) | (cpu_tids[1:] != cpu_tids[:-1])
    counts = np.bincount(cpu_pids[run], minlength=int(cpu_pids.max()) + 1)
    seen = col.first_seen(cpu_pids)
    best = np.nonzero(counts == counts.max())[0]
    main: int | str = columns.ids[int(best[np.argmin(seen[best])])]
    return main


def _cpu_span(
    host: HostEvents,
    device: _DeviceWork,
    windows: list[Window],
) -> tuple[int, int] | None:
    """The extent of the CPU events: with device events but no steps, device figures are
    measured over it and the device's (steps.measured_spans)."""
    if device.union and not windows and len(host.index):
        return (int(host.start.min()), int(host.end.max()))
    return None


def _communication_by_process(
    device_spans: list[tuple[int, int]],
    host_spans: list[tuple[int, int, int | str]],
    main_pid: int | str | None,
) -> dict[int | str, list[tuple[int, int]]]:
    """Per process, the union of its communication: its host collectives, and the collective
    kernels, which are the main process's (kept apart under "device" when there is none)."""
    spans: dict[int | str, list[tuple[int, int]]] = {}
    if device_spans:
        spans["device"] = device_spans
    for s, e, pid in host_spans:
        spans.setdefault(pid, []).append((s, e))
    if main_pid is not None and "device" in spans:
        spans.setdefault(main_pid, []).extend(spans.pop("device"))
    return {pid: union(pid_spans) for pid, pid_spans in spans.items()}


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
