"""One rank's device work in its recorded steps as part of the what-if graph, from its trace's
columns alone. Pure.

Each kernel, copy or set is a node on its stream's lane (streams run their work in launch order).
Its edges: the launch call that queued it (matched by correlation id; a `cudaGraphLaunch` queues
many), the work before it on its stream, and where the trace has the profiler's CUDA sync events
(`cuda_sync`: enable_cuda_sync_events), the work another stream recorded an event after
(`cudaEventRecord` -> `cudaStreamWaitEvent`). Each edge carries the delay measured on it (a launch's
latency, the gap between two kernels); an edge that did not bind keeps the typical delay of its
kind, so it binds sensibly when a change makes it the latest. A delay longer than UNEXPLAINED_US on
the edge that bound is something the graph does not know (a wait on another stream without sync
events, another process on the device): it is left out of the replay, so the replay's check against
the measured step fails honestly when it matters.

A host call that returned only after device work finished (a device, stream or event sync, a
blocking copy) is a sync: the steps' thread resumes at the later of reaching it and that work's end,
plus the measured time from the work's end to the call's return.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepcli.traces.analyses import arrays as col
from stepcli.traces.read import typedcolumns
from stepcli.traces.read.syncevents import StreamWait
from stepcli.traces.read.typedcolumns import Columns

UNEXPLAINED_US = 100.0  # a delay longer than this on a binding edge is not explained by the graph
SYNC_SLOP_US = 5.0  # a sync may return this long before its work's recorded end (clock rounding)
# Host calls that can block until device work is done: explicit syncs, and copies (blocking, or to
# pageable memory).
SYNC_NAME = re.compile(r"synchroni[sz]e|^cudaMemcpy|^cuMemcpy|^cudaFree$|^cuMemFree", re.IGNORECASE)
NCCL_NAME = re.compile(r"^nccl", re.IGNORECASE)
# which edge bound a node's start (its end: a collective's)
LAUNCH, STREAM, EVENT, COLLECTIVE = 0, 1, 2, 3
SYNC_NODE, SYNC_STREAM, SYNC_DEVICE = 0, 1, 2  # an event sync, a stream sync or copy, a device sync
_DEVICE_WIDE = re.compile(r"DeviceSynchronize|CtxSynchronize|^cudaFree$|^cuMemFree", re.IGNORECASE)
_ONE_NODE = re.compile(r"EventSynchronize", re.IGNORECASE)


@dataclass
class DeviceWork:
    """The device work launched in the steps, in launch order (then start), with its edges' measured
    delays."""

    streams: list[str]  # stream ids, as the trace names them
    stream: np.ndarray  # int32 per node: index into streams
    start: np.ndarray  # float64 µs, measured
    dur: np.ndarray
    name: np.ndarray  # int32 code into the lane's names
    # float64 µs: the launch call's start (the kernel's own start where no call is known)
    launch: np.ndarray
    launch_thread: np.ndarray  # int64 thread key of the launch call (-1: none)
    prev: np.ndarray  # int32: the node before it on its stream (-1: first)
    # int32: the node another stream recorded before this one's stream waited for it (-1)
    wait_for: np.ndarray
    delay: np.ndarray  # float64 (n, 3): the delay on the launch, stream and event edge
    bound: np.ndarray  # int8: which edge bound the measured start
    nccl: np.ndarray  # bool: an NCCL kernel
    sync_at: np.ndarray  # float64 per sync: the call's start and end on the steps' thread
    sync_until: np.ndarray
    sync_node: np.ndarray  # int32: the node whose end it waited for (the latest to end)
    # int8: what it waits for: SYNC_NODE that node, SYNC_STREAM its stream, SYNC_DEVICE all
    sync_scope: np.ndarray
    sync_name: list[str]
    unexplained_us: float  # the delays left out (longer than UNEXPLAINED_US on a binding edge)
    # the trace has the CUDA sync events (cross-stream waits are in the graph)
    cross_stream_known: bool
    # every host operator of the process in the window, for scaling an operator's device work with
    # it
    op_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    op_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    op_end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    op_thread: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.start)


def device_work(
    columns: Columns,
    thread: np.ndarray,
    main: int,
    lo: float,
    hi: float,
    stream_waits: list[StreamWait] | None = None,
) -> DeviceWork | None:
    """The device work launched in [lo, hi) (or running there without a known launch), or None
    without any."""
    kind = columns.kind
    device = np.nonzero(kind >= typedcolumns.DEVICE)[0]
    if not device.size:
        return None
    host = np.nonzero((kind < typedcolumns.DEVICE) & (columns.corr >= 0))[0]
    by_corr = host[np.argsort(columns.corr[host], kind="stable")]
    corr_sorted = columns.corr[by_corr]
    k = np.searchsorted(corr_sorted, columns.corr[device])
    k = np.minimum(k, max(len(by_corr) - 1, 0))
    found = (
        (columns.corr[device] >= 0) & (corr_sorted[k] == columns.corr[device])
        if len(by_corr)
        else np.zeros(len(device), bool)
    )
    call = np.where(found, by_corr[k] if len(by_corr) else 0, -1)
    start = columns.ts[device]
    launch = np.where(found, columns.ts[np.maximum(call, 0)], start)
    inside = (launch >= lo) & (launch < hi)
    device, call, launch, start = device[inside], call[inside], launch[inside], start[inside]
    if not device.size:
        return None
    # work whose launch the trace does not hold (queued before it began): fixed where it ran, from
    # the window's start
    launch = np.where(call >= 0, launch, lo)
    order = np.lexsort((start, launch))
    device, call, launch, start = device[order], call[order], launch[order], start[order]
    dur = columns.dur[device]
    end = start + dur
    stream_key = (
        columns.pid[device].astype(np.int64) * max(len(columns.ids), 1) + columns.tid[device]
    )
    keys, stream = np.unique(stream_key, return_inverse=True)
    streams = [str(columns.ids[int(key) % max(len(columns.ids), 1)]) for key in keys.tolist()]
    n = len(device)
    prev = np.full(n, -1, np.int32)
    by_stream = np.argsort(stream, kind="stable")
    same = stream[by_stream][1:] == stream[by_stream][:-1]
    prev[by_stream[1:][same]] = by_stream[:-1][same]
    wait_for = _cross_stream(columns, stream_waits, streams, stream, launch, call, n)
    names = columns.names
    is_nccl = np.array([bool(NCCL_NAME.search(s)) for s in names] or [False], bool)
    name = columns.name[device].astype(np.int32)
    delay, bound, unexplained = _delays(start, end, launch, prev, wait_for, call >= 0)
    launch_thread = np.where(call >= 0, thread[np.maximum(call, 0)], -1)
    sync_at, sync_until, sync_node, sync_scope, sync_name = _syncs(
        columns, thread, main, lo, hi, launch, end, call, stream
    )
    cpu = (kind == typedcolumns.OTHER_CPU) | (kind == typedcolumns.USER_ANNOTATION)
    ops = np.nonzero(cpu & (columns.ts < hi) & (columns.ts + columns.dur > lo))[0]
    return DeviceWork(
        streams,
        stream.astype(np.int32),
        start,
        dur,
        name,
        launch,
        launch_thread,
        prev,
        wait_for,
        delay,
        bound,
        is_nccl[name],
        sync_at,
        sync_until,
        sync_node,
        sync_scope,
        sync_name,
        unexplained,
        stream_waits is not None and len(stream_waits) > 0,
        columns.name[ops].astype(np.int32),
        columns.ts[ops],
        columns.ts[ops] + columns.dur[ops],
        thread[ops].astype(np.int64),
    )


def _cross_stream(
    columns: Columns,
    stream_waits: list[StreamWait] | None,
    streams: list[str],
    stream: np.ndarray,
    launch: np.ndarray,
    call: np.ndarray,
    n: int,
) -> np.ndarray:
    """Per node, the node it waits for on another stream (the first node its stream queued after a
    `cudaStreamWaitEvent` waits for the last node the recording stream queued before the
    `cudaEventRecord`)."""
    wait_for = np.full(n, -1, np.int32)
    if not stream_waits:
        return wait_for
    host = np.nonzero((columns.kind < typedcolumns.DEVICE) & (columns.corr >= 0))[0]
    host_of_corr = dict(zip(columns.corr[host].tolist(), host.tolist()))
    index_of_stream = {s: i for i, s in enumerate(streams)}
    for wait in stream_waits:
        waiting = index_of_stream.get(str(wait.stream))
        record_call, wait_call = (
            host_of_corr.get(wait.record_corr),
            host_of_corr.get(wait.wait_corr),
        )
        if waiting is None or record_call is None or wait_call is None:
            continue
        t_record, t_wait = float(columns.ts[record_call]), float(columns.ts[wait_call])
        # the recorded node: the last one queued before the record on the recording stream (where
        # the sync event does not say which, on any other stream than the waiting one)
        recording = index_of_stream.get(str(wait.record_stream), -1)
        other = stream == recording if recording >= 0 else stream != waiting
        before = np.nonzero((launch <= t_record) & other)[0]
        after = np.nonzero((launch >= t_wait) & (stream == waiting))[0]
        if not before.size or not after.size:
            continue
        wait_for[after[0]] = before[-1]
    return wait_for


def _delays(
    start: np.ndarray,
    end: np.ndarray,
    launch: np.ndarray,
    prev: np.ndarray,
    wait_for: np.ndarray,
    known: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per node, the delay on each edge and which edge bound its measured start; the delays left
    unexplained."""
    n = len(start)
    ready = np.full((n, 3), -np.inf)
    ready[:, LAUNCH] = launch
    has_prev, has_wait = prev >= 0, wait_for >= 0
    ready[has_prev, STREAM] = end[prev[has_prev]]
    ready[has_wait, EVENT] = end[wait_for[has_wait]]
    bound = np.argmax(ready, axis=1).astype(np.int8)
    gap = np.maximum(start[:, None] - ready, 0.0)
    rows = np.arange(n)
    binding = gap[rows, bound]
    typical = np.zeros(3)
    for edge in (LAUNCH, STREAM):
        seen = gap[bound == edge, edge]
        seen = seen[seen <= UNEXPLAINED_US]
        typical[edge] = float(np.median(seen)) if seen.size else 0.0
    delay = np.minimum(gap, typical[None, :])
    kept = np.where(known | (bound != LAUNCH), np.minimum(binding, UNEXPLAINED_US), binding)
    delay[rows, bound] = kept
    delay[~np.isfinite(ready)] = 0.0
    return delay, bound, float(np.sum(binding - kept))


def _syncs(
    columns: Columns,
    thread: np.ndarray,
    main: int,
    lo: float,
    hi: float,
    launch: np.ndarray,
    end: np.ndarray,
    call: np.ndarray,
    stream: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The host calls on the steps' thread that returned only after device work ended: each call
    [at, until) and the node it waited for (the latest-ending node queued by then that ended inside
    the call)."""
    names = columns.names
    is_sync = np.array([bool(SYNC_NAME.search(s)) for s in names] or [False], bool)
    calls = np.nonzero(
        is_sync[columns.name]
        & (columns.kind < typedcolumns.DEVICE)
        & (thread == main)
        & (columns.ts >= lo)
        & (columns.ts < hi)
    )[0]
    calls = calls[np.argsort(columns.ts[calls], kind="stable")]
    at_list: list[float] = []
    until_list: list[float] = []
    node_list: list[int] = []
    scope_list: list[int] = []
    name_list: list[str] = []
    # a running maximum of the ends in launch order would lose nodes ending after the call; the
    # calls are few
    for c in calls.tolist():
        a, b = float(columns.ts[c]), float(columns.ts[c] + columns.dur[c])
        queued = int(np.searchsorted(launch, a, side="right"))
        own = np.nonzero(call == c)[0]
        candidates = np.concatenate((np.arange(queued), own[own >= queued]))
        if not candidates.size:
            continue
        ends = end[candidates]
        inside = (ends > a) & (ends <= b + SYNC_SLOP_US)
        if not inside.any():
            continue
        node = int(candidates[inside][np.argmax(ends[inside])])
        # a stream sync or copy returns once its stream's queued work is done: when work queued on
        # that stream by then ended after the call returned, the call only overlapped a kernel's end
        # (an asynchronous copy)
        name = names[int(columns.name[c])]
        if not _DEVICE_WIDE.search(name) and not _ONE_NODE.search(name):
            on_stream = candidates[stream[candidates] == stream[node]]
            if float(end[on_stream].max()) > b + SYNC_SLOP_US:
                continue
        if at_list and a < until_list[-1]:
            continue  # nested in the sync before it (a copy's own sync): that one stands
        at_list.append(a)
        until_list.append(b)
        node_list.append(node)
        scope_list.append(
            SYNC_DEVICE
            if _DEVICE_WIDE.search(name)
            else SYNC_NODE
            if _ONE_NODE.search(name)
            else SYNC_STREAM
        )
        name_list.append(name)
    return (
        np.array(at_list, np.float64),
        np.array(until_list, np.float64),
        np.array(node_list, np.int32),
        np.array(scope_list, np.int8),
        name_list,
    )


def node_factors(
    work: DeviceWork, lane_names: list[str], grid: np.ndarray, phase: np.ndarray, scales: list[Any]
) -> np.ndarray:
    """Per node, how long it takes under the scales (1: unchanged): a kernel named, a kernel
    launched inside an operator named (on the thread that launched it), or launched in a phase, runs
    FACTOR times as long."""
    factor = np.ones(len(work))
    if not len(factor):
        return factor
    codes_by_name: dict[str, list[int]] = {}
    for code, n in enumerate(lane_names):
        codes_by_name.setdefault(n, []).append(code)
    if len(grid) > 1:
        at = np.clip(np.searchsorted(grid, work.launch, side="right") - 1, 0, len(phase) - 1)
        node_phase = phase[at]
    else:
        node_phase = np.zeros(len(work), np.int8)
    for scale in scales:
        if scale.phase is not None:
            factor[node_phase == scale.phase] *= scale.factor
            continue
        codes = np.array([c for n in scale.names for c in codes_by_name.get(n, [])], np.int32)
        if not codes.size:
            continue
        # named, or launched inside an operator named: once (a kernel `re:` names that its
        # operator's name matches too ran FACTOR squared times as long)
        covered = np.isin(work.name, codes)
        hit = np.isin(work.op_name, codes)
        for key in np.unique(work.op_thread[hit]).tolist():
            mine = hit & (work.op_thread == key)
            nodes = work.launch_thread == key
            covered[nodes] |= _covers(work.op_start[mine], work.op_end[mine], work.launch[nodes])
        factor[covered] *= scale.factor
    return factor


def _covers(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each time in `at` lies inside one of the spans (as
    stepcli.traces.analyses.lanes.covers)."""
    if not len(starts):
        return np.zeros(len(at), bool)
    u_start, u_end = col.union_arrays(starts, ends)
    k = np.searchsorted(u_start, at, side="right") - 1
    return (k >= 0) & (at < u_end[np.maximum(k, 0)])
