"""stepcli's device graph on Holistic Trace Analysis's own critical-path fixtures
(../shared/traces/hta_critical_path, its README says what HTA's tests establish), edge by edge where
the two models mean the same dependency.

The same: a launch edge from the launch call's start to the kernel's start weighs the launch delay
(HTA: 27 µs for an FFT kernel of simple_add); consecutive kernels on a stream are joined by the gap
between them (HTA: 7 µs); cudaEventRecord -> cudaStreamWaitEvent joins the recorded stream's kernel
to the waiting stream's next one (alexnet); an event sync makes the host call wait for the recorded
kernel (cuda_event_sync). Different on purpose: HTA gives sync edges zero weight and ends the host
call when the kernel ends; stepcli keeps the measured time from the kernel's end to the call's
return as the sync's tail, so the replay gives back the measured step. HTA's nested-operator edges
(start to start, end to end) are one host timeline in stepcli (the steps' thread cut at every
operator boundary), so they have no edges of their own to compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepcli.inputs import read_input
from stepcli.traces.analyses.devicework import EVENT, LAUNCH, STREAM, DeviceWork, device_work
from stepcli.traces.read.columns import load_columns
from stepcli.traces.read.syncevents import stream_waits

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "hta_critical_path"


def _work(folder: str) -> tuple[DeviceWork, list[str]]:
    files = sorted((FIXTURES / folder).glob("*.json.gz"))
    if not files:
        pytest.skip(f"{FIXTURES / folder} not found (../shared/traces beside the checkout)")
    path = str(files[0])
    columns = load_columns(path).columns
    thread = columns.pid.astype(np.int64) * len(columns.ids) + columns.tid
    # the thread that launches (device rows: few)
    main = int(np.bincount(thread[columns.corr >= 0]).argmax())
    work = device_work(columns, thread, main, -1e18, 1e18, stream_waits(read_input(path)))
    assert work is not None
    return work, [columns.names[code] for code in work.name.tolist()]


def test_launch_delays_and_kernel_to_kernel_gaps_are_htas_edge_weights():
    work, names = _work("simple_add")
    launch_bound = work.bound == LAUNCH
    fft_delays = {
        float(work.delay[k, LAUNCH])
        for k in np.nonzero(launch_bound)[0]
        if "fft" in names[k].lower()
    }
    assert 27.0 in fft_delays  # HTA: the FFT kernel's 27 µs launch-delay edge
    stream_bound = np.nonzero(work.bound == STREAM)[0]
    gaps = {
        float(work.start[k] - (work.start[p] + work.dur[p]))
        for k, p in zip(stream_bound, work.prev[stream_bound])
    }
    assert 7.0 in gaps  # HTA: a 7 µs kernel-kernel edge on one stream
    assert {float(work.delay[k, STREAM]) for k in stream_bound} >= {7.0}


def test_event_record_and_stream_wait_join_two_streams():
    work, _ = _work("alexnet")
    assert work.cross_stream_known and len(work.streams) == 2
    joined = np.nonzero(work.wait_for >= 0)[0]
    assert joined.size  # HTA: the inter-stream sync edges
    # each joins a kernel to one recorded earlier on the other stream
    assert all(work.stream[k] != work.stream[work.wait_for[k]] for k in joined)
    assert all(work.launch[work.wait_for[k]] <= work.launch[k] for k in joined)
    bound = joined[work.bound[joined] == EVENT]
    assert all(
        work.start[k] >= work.start[work.wait_for[k]] + work.dur[work.wait_for[k]] for k in bound
    )


def test_an_event_sync_waits_for_the_recorded_kernel():
    work, names = _work("cuda_event_sync")
    assert "cudaEventSynchronize" in work.sync_name or "cudaDeviceSynchronize" in work.sync_name
    for at, until, node in zip(work.sync_at, work.sync_until, work.sync_node):
        end = work.start[node] + work.dur[node]
        # the call returned after the kernel it waited for ended (HTA: a zero-weight edge kernel ->
        # call end; stepcli keeps the call's return after it, until - end, as the sync's tail)
        assert at < end <= until + 5.0
