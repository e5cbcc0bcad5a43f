"""Collectives and copies (stepcli.traces.analyses.collectivestats): sizes, nccl-tests' bus
bandwidth, pageable vs pinned."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.traces.analyses.collectivestats import bus_factor, collective_of
from stepcli.traces.analyses.mergeparts import merge_parts
from stepcli.traces.analyses.traceanalysis import summarize_file
from stepcli.traces.read.events import Event, EventArgs
from stepcli.traces.read.tracereader import Trace

T0 = 1_700_000_000_000.0


def ev(
    name: str, ts: float, dur: float, cat: str = "kernel", transfer: Any = None, tid: int = 7
) -> Event:
    args = EventArgs(-1, *transfer) if transfer else None
    return Event(name=name, cat=cat, ph="X", pid=0, tid=tid, ts=T0 + ts, dur=dur, args=args)


STEPS = [
    Event(name="ProfilerStep#1", cat="user_annotation", ph="X", pid=100, tid=1, ts=T0, dur=5000.0),
    Event(
        name="ProfilerStep#2",
        cat="user_annotation",
        ph="X",
        pid=100,
        tid=1,
        ts=T0 + 5000,
        dur=5000.0,
    ),
]
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALLGATHER = "ncclKernel_AllGather_RING_LL128_Sum_bf16(ncclWorkElem)"


def figures(events: list[Event]) -> dict[str, Any]:
    device: dict[str, Any] = merge_parts(
        [summarize_file(Trace.from_events([*STEPS, *events]))]
    ).to_dict()["device"]
    return device


def test_collectives_by_type_and_size_with_bus_bandwidth() -> None:
    # GIVEN over two steps: two all-reduces of 1M floats on 8 ranks, 1 ms each; one all-gather of 1M
    # bf16 per rank into 8M, 2 ms; and a send/recv with no metadata (an older torch)
    allreduce = (-1, "allreduce", 1 << 20, 1 << 20, 8, "Float")
    events = [
        ev(ALLREDUCE, 100, 1000, transfer=allreduce),
        ev(ALLREDUCE, 5100, 1000, transfer=allreduce),
        ev(ALLGATHER, 2000, 2000, transfer=(-1, "allgather", 1 << 20, 8 << 20, 8, "BFloat16")),
        ev("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 7000, 500),
    ]
    rows = {row["collective"]: row for row in figures(events)["collectives"]}
    # THEN all-reduce: 4 MiB in 1 ms = 4.19 GB/s algbw, x 2*7/8 bus
    reduce = rows["allreduce"]
    assert (reduce["algorithm"], reduce["protocol"], reduce["dtype"], reduce["ranks"]) == (
        "RING",
        "LL",
        "Float",
        8,
    )
    assert (
        reduce["bytes"] == 4 << 20
        and reduce["calls_per_step"] == 1.0
        and reduce["ms_per_step"] == 1.0
    )
    assert reduce["algbw_gbps"] == pytest.approx((4 << 20) / 1e6)
    assert reduce["busbw_gbps"] == pytest.approx((4 << 20) / 1e6 * 2 * 7 / 8)
    # AND all-gather: the 16 MiB output in 2 ms, x 7/8 bus
    gather = rows["allgather"]
    assert gather["bytes"] == 16 << 20 and gather["protocol"] == "LL128"
    assert gather["busbw_gbps"] == pytest.approx((16 << 20) / 2e6 * 7 / 8)
    # AND send/recv without metadata: calls and time, no size or bandwidth
    send = rows["sendrecv"]
    assert send["calls_per_step"] == 0.5 and send["bytes"] is None and send["busbw_gbps"] is None


def test_copies_by_direction_and_host_memory() -> None:
    # GIVEN 1 MB copies in both directions from pageable and pinned memory, and one after the steps
    events = [
        ev(
            "Memcpy HtoD (Pageable -> Device)",
            10,
            100,
            "gpu_memcpy",
            (1_000_000, "", -1, -1, -1, ""),
        ),
        ev(
            "Memcpy HtoD (Pinned -> Device)", 300, 50, "gpu_memcpy", (1_000_000, "", -1, -1, -1, "")
        ),
        ev(
            "Memcpy HtoD (Pinned -> Device)", 600, 50, "gpu_memcpy", (1_000_000, "", -1, -1, -1, "")
        ),
        ev(
            "Memcpy DtoH (Device -> Pageable)",
            900,
            250,
            "gpu_memcpy",
            (500_000, "", -1, -1, -1, ""),
        ),
        ev(
            "Memcpy HtoD (Pinned -> Device)",
            20000,
            50,
            "gpu_memcpy",
            (1_000_000, "", -1, -1, -1, ""),
        ),
    ]
    rows = {(row["copy"], row["host_memory"]): row for row in figures(events)["copies"]}
    # THEN bandwidth = bytes / time (GB/s), per direction and host memory; the copy after the steps
    # is left out
    assert rows[("HtoD", "Pageable")]["gbps"] == pytest.approx(10.0)
    assert (
        rows[("HtoD", "Pinned")]["gbps"] == pytest.approx(20.0)
        and rows[("HtoD", "Pinned")]["calls_per_step"] == 1
    )
    assert rows[("DtoH", "Pageable")]["gbps"] == pytest.approx(2.0)
    assert rows[("DtoH", "Pageable")]["bytes_per_step"] == 250_000


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", ("allreduce", "RING", "LL")),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)",
            ("reducescatter", "RING", "LL128"),
        ),
        ("rccl_AllGather_TREE_SIMPLE", ("allgather", "TREE", "SIMPLE")),
        ("void ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", ("broadcast", "RING", "LL")),
        ("sm80_xmma_gemm", None),
    ],
)
def test_collective_names(name: str, expected: tuple[str, str, str] | None) -> None:
    assert collective_of(name, None) == expected


@pytest.mark.parametrize(
    ("kind", "ranks", "factor"),
    [
        ("allreduce", 8, 1.75),
        ("allgather", 4, 0.75),
        ("reducescatter", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("sendrecv", 2, 1.0),
    ],
)
def test_bus_factors_of_nccl_tests(kind: str, ranks: int, factor: float) -> None:
    assert bus_factor(kind, ranks) == pytest.approx(factor)
