"""Device time by kernel class (stepcli.traces.analyses.device) against intervals computed by hand,
on both analysis paths (the columnar pass and the per-event reference)."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.traces.analyses import arrays as columnar
from stepcli.traces.analyses import traceanalysis as analysis
from stepcli.traces.analyses.device import DeviceTimes, class_of, is_collective_kernel
from stepcli.traces.analyses.mergeparts import merge_parts
from stepcli.traces.analyses.traceanalysis import summarize_file
from stepcli.traces.read.events import Event, EventArgs
from stepcli.traces.read.tracereader import Trace

T0 = 1_700_000_000_000.0  # epoch-sized microseconds, as real traces have


def ev(name: str, ts: float, dur: float, cat: str = "kernel", pid: int = 0, tid: int = 7) -> Event:
    return Event(name=name, cat=cat, ph="X", pid=pid, tid=tid, ts=T0 + ts, dur=dur)


def step(n: int, ts: float, dur: float) -> Event:
    return ev(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", pid=100, tid=1)


def device_of(events: list[Event], path: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The job's device figures, from the columnar pass ("columns") or the per-event reference
    ("reference")."""
    trace = Trace.from_events(events)
    if path == "reference":

        def step_aside(*_args: object, **_kwargs: object) -> None:
            raise columnar.TooLarge

        monkeypatch.setattr(analysis, "_analyze_columns", step_aside)
    device: dict[str, Any] = merge_parts([summarize_file(trace)]).to_dict()["device"]
    return device


PATHS = pytest.mark.parametrize("path", ["columns", "reference"])


@PATHS
def test_classes_over_one_step_with_several_streams(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN one 100 us step and device work on four streams, overlapping within and across classes:
    events = [
        step(1, 0, 100),
        ev("aten::mm", 1, 2, cat="cpu_op", pid=100, tid=1),
        ev("gemm", 10, 20, tid=7),  # compute 10-30
        ev("relu", 25, 15, tid=8),  # compute 25-40 on another stream: compute union 10-40
        # 20-60
        ev(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            20,
            40,
            tid=9,
        ),
        ev("Memcpy HtoD (Pageable -> Device)", 70, 10, cat="gpu_memcpy", tid=7),  # memory 70-80
        ev("Memset (Device)", 75, 10, cat="gpu_memset", tid=8),  # memory 75-85
        ev("late_kernel", 95, 15, tid=7),  # compute 95-110: 95-100 inside the step
    ]
    device = device_of(events, path, monkeypatch)
    # THEN, by hand: compute 10-40 + 95-100 = 35; comm 20-60 = 40; memory 70-85 = 15; busy 10-60 +
    # 70-85 + 95-100 = 70; comm with compute beside it 20-40 = 20, so 20 exposed; idle 30
    classes = {
        k: v
        for k, v in device.items()
        if k not in ("idle_by_cause", "launch", "collectives", "copies", "steps")
    }
    assert classes == pytest.approx(
        {
            "busy_ms": 0.070,
            "busy_share": 0.70,
            "compute_share": 0.35,
            "comm_share": 0.40,
            "memory_share": 0.15,
            "idle_share": 0.30,
            "comm_overlap_share": 0.5,
            "exposed_comm_ms": 0.020,
            "compute_ms": 0.035,
            "comm_ms": 0.040,
            "memory_ms": 0.015,
            "idle_ms": 0.030,
        }
    )


@PATHS
def test_classes_over_two_steps_leave_the_gap_between_them_out(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two 50 us steps with a 50 us gap between them, and a collective that runs through the
    # gap
    events = [
        step(1, 0, 50),
        step(2, 100, 50),
        # 40-120: 40-50 and 100-120
        ev("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 40, 80, tid=20),
        ev("gemm", 45, 10, tid=7),  # 45-55: 45-50 inside
        ev("gemm", 110, 5, tid=7),  # 110-115
    ]
    device = device_of(events, path, monkeypatch)
    # THEN comm = 10 + 20 = 30 over 100 us of steps; overlap = 5 + 5 = 10; exposed 20 over 2 steps =
    # 10 per step
    assert device["comm_share"] == pytest.approx(0.30)
    assert device["compute_share"] == pytest.approx(0.10)
    assert device["comm_overlap_share"] == pytest.approx(10 / 30)
    assert device["exposed_comm_ms"] == pytest.approx(0.010)
    assert device["busy_share"] == pytest.approx(0.30) and device["idle_ms"] == pytest.approx(0.035)


@PATHS
def test_each_step_has_its_own_parts_and_they_add_up_to_the_job(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN three steps: a collective through the first two, a compute kernel the host launched late
    # in the third
    events = [
        step(1, 0, 50),
        step(2, 100, 50),
        step(3, 200, 100),
        ev("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 40, 80, tid=20),  # 40-120
        ev("gemm", 45, 10, tid=7),  # 45-55
        ev("gemm", 110, 5, tid=7),  # 110-115
        ev("cudaLaunchKernel", 240, 2, cat="cuda_runtime", pid=100, tid=1),
        # 250-260, launched at 240: the device waited for the host since 120
        ev("k", 250, 10, tid=7),
    ]
    events[-2].args = EventArgs(correlation=5)
    events[-1].args = EventArgs(correlation=5)
    job = device_of(events, path, monkeypatch)
    steps = {s["step"]: s for s in job["steps"]}
    # THEN, by hand (us): step 1 (0-50): comm 40-50, compute 45-50, so 5 exposed, idle 0-40 with no
    # gap before it (other); step 2 (100-150): comm 100-120, compute 110-115, 15 exposed, idle
    # 120-150 waiting for the host; step 3 (200-300): compute 250-260, idle 200-250 host wait and
    # 260-300 other
    expected = {
        1: (0.050, 0.010, 0.005, 0.010, 0.005, 0.040, 0.0, 0.040),
        2: (0.050, 0.020, 0.005, 0.020, 0.015, 0.030, 0.030, 0.0),
        3: (0.100, 0.010, 0.010, 0.0, 0.0, 0.090, 0.050, 0.040),
    }
    for number, (span, busy, compute, comm, exposed, idle, host, other) in expected.items():
        got = steps[number]
        assert (got["step_ms"], got["busy_ms"], got["compute_ms"], got["comm_ms"]) == pytest.approx(
            (span, busy, compute, comm)
        )
        assert (got["exposed_comm_ms"], got["idle_ms"], got["memory_ms"]) == pytest.approx(
            (exposed, idle, 0.0)
        )
        causes = got["idle_by_cause"]
        assert (
            causes["host_wait_ms"],
            causes["kernel_wait_ms"],
            causes["other_ms"],
        ) == pytest.approx((host, 0.0, other))
    # AND the steps' mean is the job's figure per step
    for key in ("busy_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "idle_ms"):
        assert sum(s[key] for s in steps.values()) / 3 == pytest.approx(job[key]), key
    assert sum(s["idle_by_cause"]["host_wait_ms"] for s in steps.values()) / 3 == pytest.approx(
        job["idle_by_cause"]["host_wait_ms"]
    )


def test_per_step_figures_average_a_step_over_the_ranks_that_recorded_it() -> None:
    zero = Trace.from_events(
        [step(1, 0, 100), step(2, 100, 100), ev("gemm", 0, 100)], path="rank0.json", rank=0
    )
    one = Trace.from_events([step(1, 0, 100), ev("gemm", 0, 50)], path="rank1.json", rank=1)
    data = merge_parts([summarize_file(zero), summarize_file(one)]).to_dict()
    job = {s["step"]: (s["windows"], s["compute_ms"]) for s in data["device"]["steps"]}
    assert job == {1: (2, pytest.approx(0.075)), 2: (1, pytest.approx(0.0))}
    ranks = {r["rank"]: [s["compute_ms"] for s in r["device"]["steps"]] for r in data["ranks"]}
    assert ranks == {0: pytest.approx([0.1, 0.0]), 1: pytest.approx([0.05])}


@PATHS
def test_without_communication_overlap_is_null(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN no step and one compute kernel over a quarter of the CPU activity
    events = [ev("op", 0, 100, cat="cpu_op", pid=100, tid=1), ev("k", 0, 25)]
    device = device_of(events, path, monkeypatch)
    # THEN the span is the trace's activity, there is no communication and so no overlap share
    assert device["compute_share"] == pytest.approx(0.25) and device["comm_share"] == 0.0
    assert device["comm_overlap_share"] is None and device["exposed_comm_ms"] == 0.0


def test_ranks_carry_their_own_device_figures_and_the_job_pools_them() -> None:
    # GIVEN two ranks: rank 0's step fully computing, rank 1's step half communicating
    zero = Trace.from_events([step(1, 0, 100), ev("gemm", 0, 100)], path="rank0.json", rank=0)
    one = Trace.from_events(
        [step(1, 0, 100), ev("ncclKernel_SendRecv", 0, 50)], path="rank1.json", rank=1
    )
    data = merge_parts([summarize_file(zero), summarize_file(one)]).to_dict()
    by_rank = {r["rank"]: r["device"] for r in data["ranks"]}
    assert (
        by_rank[0]["compute_share"] == pytest.approx(1.0)
        and by_rank[0]["comm_overlap_share"] is None
    )
    assert by_rank[1]["comm_share"] == pytest.approx(0.5) and by_rank[1][
        "exposed_comm_ms"
    ] == pytest.approx(0.05)
    assert data["device"]["compute_share"] == pytest.approx(0.5) and data["device"][
        "comm_share"
    ] == pytest.approx(0.25)
    assert data["device"]["exposed_comm_ms"] == pytest.approx(0.025)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", True),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
        (
            "void ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, "
            "ncclWork*)",
            True,
        ),
        ("rccl_AllReduce_Sum_f32", True),
        ("RCCLKernel", True),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            False,
        ),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8", False),
        ("fused_nccl_like_name", False),
    ],
)
def test_collective_kernels_under_every_naming(name: str, expected: bool) -> None:
    assert is_collective_kernel(name) is expected
    assert class_of(name, memory=False) == ("comm" if expected else "compute")
    assert class_of(name, memory=True) == "memory"


def test_device_times_add_exactly() -> None:
    a = DeviceTimes(
        steps=1, span_ns=3, busy_ns=2, compute_ns=1, comm_ns=1, memory_ns=0, overlap_ns=1
    )
    b = DeviceTimes(
        steps=2, span_ns=5, busy_ns=4, compute_ns=2, comm_ns=0, memory_ns=1, overlap_ns=0
    )
    assert a + b == DeviceTimes(
        steps=3, span_ns=8, busy_ns=6, compute_ns=3, comm_ns=1, memory_ns=1, overlap_ns=1
    )
