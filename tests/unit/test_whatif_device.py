"""The what-if graph's device part on constructed traces whose answers are computed by hand (times
in µs).

Each trace is built from events as torch writes them (ProfilerStep#N and operators on the steps'
thread, CUDA runtime calls there with correlation ids, kernels on streams of device 0), read into
columns as any trace is, so the lane builder, the launch matching and the replay are the real
ones."""

from __future__ import annotations

from stepcli.traces.analyses.lanes import lane_of
from stepcli.traces.read.columns import ColumnTrace
from stepcli.traces.read.events import Event, EventArgs
from stepcli.traces.read.syncevents import StreamWait
from stepcli.traces.read.typedcolumns import columns_from_events
from stepcli.whatif.answer import WhatifRequest, answer

MAIN = 1
STEP = ("ProfilerStep#1", "user_annotation", MAIN, 0.0, 100.0, -1)


def _trace(events: list[tuple[str, str, int, float, float, int]]) -> ColumnTrace:
    """events: (name, category, thread or stream, start, end, correlation id or -1); kernels run on
    device 0."""
    decoded = [
        Event(
            name=n,
            cat=c,
            pid=0 if c == "kernel" else 7,
            tid=t,
            ts=s,
            dur=e - s,
            args=EventArgs(correlation=corr) if corr >= 0 else None,
        )
        for n, c, t, s, e, corr in events
    ]
    columns = columns_from_events(decoded)
    return ColumnTrace("gpu.json", None, columns, len(decoded))


def _answer(
    trace: ColumnTrace, *changes: tuple[str, str], waits: list[StreamWait] | None = None
) -> dict:
    return answer([lane_of(trace, waits)], WhatifRequest(list(changes)), None)


def _saved(doc: dict) -> list[float]:
    return [round(entry["saved_ms"] * 1000, 3) for entry in doc["changes"]]


def _fork() -> ColumnTrace:
    """Kernel A on stream 7 [15, 60], B on stream 8 [25, 90], both launched (5 µs latency) before a
    device sync [30, 95) that returns 5 µs after B; an operator [95, 100] ends the step."""
    return _trace(
        [
            STEP,
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 10, 12, 1),
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 20, 22, 2),
            ("cudaDeviceSynchronize", "cuda_runtime", MAIN, 30, 95, 3),
            ("post_op", "cpu_op", MAIN, 95, 100, -1),
            ("kern_A", "kernel", 7, 15, 60, 1),
            ("kern_B", "kernel", 8, 25, 90, 2),
        ]
    )


def test_a_fork_over_two_streams_waits_for_the_later_stream():
    doc = _answer(_fork(), ("scale", "kern_A=0.5"), ("scale", "kern_B=0.5"))
    assert doc["verdict"] == "ok" and doc["replay_error"] == 0.0
    # A off the critical path: halving it buys nothing. B halved ends at 25 + 32.5 = 57.5, but A
    # ends at 60: the device sync returns at 60 + 5 and the step is 65 + 5 = 70 µs. Both: B's 57.5 +
    # 5 + 5 = 67.5.
    assert _saved(doc) == [0.0, 30.0, 32.5]
    segments = [(seg["kind"], seg["name"]) for seg in doc["critical_path"]["segments"]]
    assert ("gpu", "stream 8") in segments and ("gpu", "stream 7") not in segments
    assert ("sync", "cudaDeviceSynchronize") in segments


def _waiting() -> ColumnTrace:
    """A on stream 7 [15, 60]; an event recorded on stream 7 at 22, stream 8 made to wait for it at
    24; B launched on stream 8 at 26 runs [62, 80] (2 µs after A); a device sync [30, 85) returns 5
    µs after B."""
    return _trace(
        [
            STEP,
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 10, 12, 1),
            ("cudaEventRecord", "cuda_runtime", MAIN, 22, 23, 3),
            ("cudaStreamWaitEvent", "cuda_runtime", MAIN, 24, 25, 4),
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 26, 28, 5),
            ("cudaDeviceSynchronize", "cuda_runtime", MAIN, 30, 85, 6),
            ("post_op", "cpu_op", MAIN, 85, 100, -1),
            ("kern_A", "kernel", 7, 15, 60, 1),
            ("kern_B", "kernel", 8, 62, 80, 5),
        ]
    )


def test_a_cross_stream_wait_passes_a_change_on_to_the_waiting_stream():
    waits = [StreamWait(wait_corr=4, record_corr=3, stream=8, record_stream=7)]
    doc = _answer(_waiting(), ("scale", "kern_A=0.5"), waits=waits)
    assert doc["verdict"] == "ok" and doc["replay_error"] == 0.0
    # A halved ends at 37.5; B waits for it (2 µs) and runs 18 µs: ends 57.5; the sync returns at
    # 62.5: saved 22.5
    assert _saved(doc) == [22.5]
    # Without the CUDA sync events the wait is unknown: B's 36 µs after its launch count as its
    # launch's delay, so halving A predicts nothing (HTA's graph needs the same events for this
    # edge)
    assert _saved(_answer(_waiting(), ("scale", "kern_A=0.5"))) == [0.0]


def _blocking() -> ColumnTrace:
    """An operator [5, 12] launches A (call [8, 10]); A runs [14, 90]; a stream sync [30, 95)
    returns 5 µs after it; an operator [95, 100] ends the step."""
    return _trace(
        [
            STEP,
            ("model_op", "cpu_op", MAIN, 5, 12, -1),
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 8, 10, 1),
            ("cudaStreamSynchronize", "cuda_runtime", MAIN, 30, 95, 2),
            ("post_op", "cpu_op", MAIN, 95, 100, -1),
            ("kern_A", "kernel", 7, 14, 90, 1),
        ]
    )


def test_a_device_sync_blocks_the_host_until_the_kernel_ends():
    doc = _answer(_blocking(), ("scale", "kern_A=0.5"), ("scale", "model_op=0.5"))
    assert doc["verdict"] == "ok" and doc["replay_error"] == 0.0
    # kern_A halved: ends 14 + 38 = 52, the sync returns at 57, the step ends at 62: saved 38.
    # model_op halved scales its kernel too: the launch moves from 8 to 6.5, A starts 6 µs later
    # (12.5) and runs 38 µs (ends 50.5); the host reaches the sync at 26.5, it returns at 55.5, the
    # step ends at 60.5: saved 39.5.
    assert _saved(doc)[:2] == [38.0, 39.5]
    # host [0, 8) (other, then forward; post_op's forward 5 µs merge into it), the launch's 6 µs
    # delay, the kernel's 76, the sync's 5 µs return after it
    path = [(seg["kind"], round(seg["ms"] * 1000, 3)) for seg in doc["critical_path"]["segments"]]
    assert path == [("cpu", 5.0), ("cpu", 8.0), ("launch", 6.0), ("gpu", 76.0), ("sync", 5.0)]


def test_a_kernel_named_inside_an_operator_named_by_the_same_selector_is_scaled_once():
    # `re:` naming both model_op and the kernel it launches: the kernel runs half as long, as with
    # model_op=0.5 alone (39.5 saved, see above), not a quarter (58.5 saved)
    doc = _answer(_blocking(), ("scale", "re:^(model_op|kern_A)$=0.5"), ("scale", "model_op=0.5"))
    assert _saved(doc)[:2] == [39.5, 39.5]


def test_a_kernel_off_the_critical_path_of_a_cpu_bound_step_buys_nothing():
    trace = _trace(
        [
            STEP,
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 8, 10, 1),
            ("cpu_work", "cpu_op", MAIN, 20, 90, -1),
            ("cudaStreamSynchronize", "cuda_runtime", MAIN, 90, 91, 2),
            ("kern_A", "kernel", 7, 14, 20, 1),
        ]
    )
    doc = _answer(trace, ("scale", "kern_A=0.5"), ("scale", "cpu_work=0.5"))
    assert doc["verdict"] == "ok"
    assert _saved(doc)[:2] == [0.0, 35.0]
    assert all(seg["kind"] == "cpu" for seg in doc["critical_path"]["segments"])


def test_unexplained_device_waits_make_the_answer_inconclusive_with_the_reason():
    # B starts 600 µs after its launch on an idle stream: nothing in the graph says why (no sync
    # events)
    trace = _trace(
        [
            ("ProfilerStep#1", "user_annotation", MAIN, 0.0, 1000.0, -1),
            ("cudaLaunchKernel", "cuda_runtime", MAIN, 10, 12, 1),
            ("cudaStreamSynchronize", "cuda_runtime", MAIN, 20, 990, 2),
            ("kern_B", "kernel", 8, 610, 985, 1),
        ]
    )
    doc = _answer(trace)
    assert doc["verdict"] == "inconclusive"
    assert "no CUDA sync events" in doc["reason"] and "off the measured step" in doc["reason"]


def _gpu_rank(rank: int, compute_end: float) -> ColumnTrace:
    """One GPU rank of two: a kernel [10, compute_end] on stream 7, then the NCCL all-reduce its
    host call (at 20) queues behind it on the same stream; both ranks' NCCL kernels end 20 µs after
    the later one starts (at 110 on rank 0). A stream sync [30, 135) returns 5 µs after it; an
    operator [135, 200] ends the step."""
    events = [
        ("ProfilerStep#1", "user_annotation", MAIN, 0.0, 200.0, -1),
        ("fwd_op", "cpu_op", MAIN, 0, 20, -1),
        ("cudaLaunchKernel", "cuda_runtime", MAIN, 5, 7, 1),
        ("c10d::allreduce_", "cpu_op", MAIN, 20, 24, -1),
        ("cudaLaunchKernel", "cuda_runtime", MAIN, 21, 23, 2),
        ("cudaStreamSynchronize", "cuda_runtime", MAIN, 30, 135, 3),
        ("post_op", "cpu_op", MAIN, 135, 200, -1),
        ("compute_kernel", "kernel", 7, 10, compute_end, 1),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 7, compute_end, 130, 2),
    ]
    decoded = [
        Event(
            name=n,
            cat=c,
            pid=0 if c == "kernel" else 7,
            tid=t,
            ts=s,
            dur=e - s,
            args=EventArgs(correlation=corr) if corr >= 0 else None,
        )
        for n, c, t, s, e, corr in events
    ]
    columns = columns_from_events(decoded)
    return ColumnTrace(
        f"rank{rank}.json", rank, columns, len(decoded), clock="host:boot", world_size=2
    )


def test_nccl_collectives_join_the_ranks_device_streams():
    lanes = [lane_of(_gpu_rank(0, 110)), lane_of(_gpu_rank(1, 60))]
    changes = [
        ("scale", "rank:0/compute_kernel=0.5"),
        ("scale", "rank:1/compute_kernel=0.5"),
        ("comm", "0.5"),
    ]
    doc = answer(lanes, WhatifRequest(changes), None)
    assert doc["verdict"] == "ok" and doc["replay_error"] == 0.0, doc["reason"]
    # rank 0's kernel halved: it ends at 60, both ranks arrive at 60, the all-reduce ends at 80, the
    # syncs return at 85 and the steps end at 150: saved 50. Rank 1's (which waited for rank 0
    # anyway): nothing. The transfer halved: 10 µs sooner everywhere. All three: both arrive at 60
    # (rank 1's at 35), end at 70, steps at 140.
    assert _saved(doc) == [50.0, 0.0, 10.0, 60.0]
    segments = [(seg["rank"], seg["kind"]) for seg in doc["critical_path"]["segments"]]
    assert (0, "collective") in segments and (0, "gpu") in segments and (1, "gpu") not in segments


def test_a_graph_launch_queues_all_its_kernels():
    # one cudaGraphLaunch (correlation 1) queues K1 [15, 40] and K2 [41, 80] on stream 7; a sync
    # [30, 85) returns 5 µs after K2. K1 halved ends at 27.5; K2 follows 1 µs later (its stream gap)
    # and ends at 67.5: saved 12.5.
    trace = _trace(
        [
            STEP,
            ("cudaGraphLaunch", "cuda_runtime", MAIN, 10, 12, 1),
            ("cudaStreamSynchronize", "cuda_runtime", MAIN, 30, 85, 2),
            ("post_op", "cpu_op", MAIN, 85, 100, -1),
            ("K1", "kernel", 7, 15, 40, 1),
            ("K2", "kernel", 7, 41, 80, 1),
        ]
    )
    doc = _answer(trace, ("scale", "K1=0.5"))
    assert doc["verdict"] == "ok" and doc["replay_error"] == 0.0
    assert _saved(doc) == [12.5]
