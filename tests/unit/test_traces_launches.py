"""Launch statistics and idle time by cause (stepcli.traces.analyses.launches) against figures
computed by hand."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.traces.analyses.mergeparts import merge_parts
from stepcli.traces.analyses.traceanalysis import summarize_file
from stepcli.traces.read.events import Event, EventArgs
from stepcli.traces.read.tracereader import Trace

T0 = 1_700_000_000_000.0


def ev(
    name: str, ts: float, dur: float, cat: str, corr: int = -1, pid: int = 0, tid: int = 7
) -> Event:
    args = EventArgs(correlation=corr) if corr >= 0 else None
    return Event(name=name, cat=cat, ph="X", pid=pid, tid=tid, ts=T0 + ts, dur=dur, args=args)


def call(name: str, ts: float, dur: float, corr: int) -> Event:
    return ev(name, ts, dur, "cuda_runtime", corr, pid=100, tid=1)


def kernel(ts: float, dur: float, corr: int, stream: int = 7, name: str = "gemm") -> Event:
    return ev(name, ts, dur, "kernel", corr, tid=stream)


def device_of(events: list[Event]) -> dict[str, Any]:
    device: dict[str, Any] = merge_parts([summarize_file(Trace.from_events(events))]).to_dict()[
        "device"
    ]
    return device


STEP = [ev("ProfilerStep#1", 0, 100, "user_annotation", pid=100, tid=1)]
# One 100 us step. Stream 7: four launched kernels; stream 8: a CUDA graph replay of two kernels,
# then a kernel whose launch call is not in the trace.
EVENTS = [
    *STEP,
    call("cudaLaunchKernel", 0, 5, 1),
    kernel(10, 10, 1),  # 10-20, delay 10 - 5 = 5
    call("cudaLaunchKernel", 8, 2, 2),
    # 22-30: gap 20-22 after a launch at 8 (before the gap): kernel wait 2; delay 12
    kernel(22, 8, 2),
    call("hipLaunchKernel", 40, 4, 3),
    kernel(50, 5, 3),  # 50-55: gap 30-50, launched at 40 (inside the gap): host wait 20; delay 6
    call("cudaLaunchKernel", 41, 1, 4),
    kernel(95, 4, 4),  # 95-99: gap 55-95 (40 us), launched at 41: other 40; delay 53
    call("cudaGraphLaunch", 60, 10, 9),
    kernel(72, 2, 9, stream=8),  # graph replay: delays 2 and 4
    kernel(74, 2, 9, stream=8),
    kernel(80, 1, -1, stream=8),  # no launch call: gap 76-80 on stream 8 is kernel wait 4
]


def test_idle_time_by_cause_for_the_device_and_per_stream() -> None:
    idle = device_of(EVENTS)["idle_by_cause"]
    # device (all streams): gaps 20-22 kernel, 30-50 host, 55-72 host (graph launched at 60), 76-80
    # kernel, 81-95 kernel (launched at 41, 14 us); busy 32 of 100, so other = 68 - 37 - 20 = 11
    # (before/after all work)
    assert idle["host_wait_ms"] == pytest.approx(0.037)
    assert idle["kernel_wait_ms"] == pytest.approx(0.020)
    assert idle["other_ms"] == pytest.approx(0.011)
    streams = {
        s["stream"]: (s["host_wait_ms"], s["kernel_wait_ms"], s["other_ms"])
        for s in idle["streams"]
    }
    assert streams["7"] == pytest.approx((0.020, 0.002, 0.040))
    assert streams["8"] == pytest.approx((0.0, 0.004, 0.0))


def test_launch_statistics_with_a_graph_replay() -> None:
    launch = device_of(EVENTS)["launch"]
    # six kernels linked to launch calls inside the step (the one without a launch call is not)
    assert launch["kernels_per_step"] == 6
    # delays 2, 4, 5, 6, 12, 53 us: linear percentiles
    assert launch["delay_us"] == pytest.approx(
        {"p50": 5.5, "p90": 32.5, "p99": 53 - 0.05 * 41, "max": 53.0}
    )
    # launch calls 5 + 2 + 4 + 1 + 10 us over 6 kernels; the two graph kernels ran shorter than
    # their call
    assert launch["cpu_launch_us_per_kernel"] == pytest.approx(22 / 6)
    assert launch["short_kernel_share"] == pytest.approx(2 / 6)
    assert (launch["graph_replays_per_step"], launch["graph_kernels_per_step"]) == (1, 2)


def test_kernels_launched_outside_the_steps_are_not_counted() -> None:
    # GIVEN a kernel launched after the step's end (it runs after it, too)
    events = [
        *STEP,
        call("cudaLaunchKernel", 1, 1, 1),
        kernel(5, 1, 1),
        call("cudaLaunchKernel", 120, 1, 2),
    ]
    events.append(kernel(125, 1, 2))
    launch = device_of(events)["launch"]
    assert launch["kernels_per_step"] == 1 and launch["delay_us"]["max"] == pytest.approx(3.0)


def test_without_correlation_ids_there_are_no_launch_statistics() -> None:
    # GIVEN kernels whose launches cannot be linked THEN no launch figures, and no gap is host wait
    device = device_of([*STEP, kernel(10, 10, -1), kernel(25, 10, -1), kernel(80, 10, -1)])
    assert device["launch"] is None
    assert device["idle_by_cause"]["host_wait_ms"] == 0.0
    assert device["idle_by_cause"]["kernel_wait_ms"] == pytest.approx(0.005)  # 20-25
    assert device["idle_by_cause"]["other_ms"] == pytest.approx(0.100 - 0.030 - 0.005)


def test_the_launch_line_rounds_per_step_means_as_people_read_them() -> None:
    from stepcli.traces.render.gpusection import launch_line

    launch = {
        "kernels_per_step": 420.0,
        "delay_us": {"p50": 12.0, "p90": 40.0},
        "cpu_launch_us_per_kernel": 4.5,
        "short_kernel_share": 0.25,
        "graph_replays_per_step": 12 / 19,
        "graph_kernels_per_step": 5046 / 19,
    }
    idle = {"host_wait_ms": 1.0, "kernel_wait_ms": 0.5, "other_ms": 0.25}
    line = launch_line({"launch": launch, "idle_by_cause": idle})
    assert line is not None and "0.63 graph replays/step (266 kernels)" in line, line
    launch["graph_replays_per_step"], launch["graph_kernels_per_step"] = 3.0, 1234.0
    assert "3 graph replays/step (1,234 kernels)" in (
        launch_line({"launch": launch, "idle_by_cause": idle}) or ""
    )
