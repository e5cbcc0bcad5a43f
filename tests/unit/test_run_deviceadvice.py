"""Device advice rules (stepcli.advice.deviceadvice): each fires just above its threshold, stays
silent just below it, and stays silent without its evidence."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.advice import deviceadvice
from stepcli.advice.deviceadvice import advise_device
from stepcli.advice.rules import Evidence


def device(**figures: Any) -> dict[str, Any]:
    """Device figures of a 100 ms step (busy + idle), overridable."""
    base: dict[str, Any] = {
        "busy_ms": 80.0,
        "idle_ms": 20.0,
        "comm_share": 0.3,
        "comm_overlap_share": 0.5,
        "exposed_comm_ms": 0.0,
        "idle_by_cause": {"host_wait_ms": 0.0, "kernel_wait_ms": 0.0, "other_ms": 20.0},
        "launch": None,
    }
    return base | figures


def rules(evidence: Evidence) -> list[str]:
    return [a.rule for a in advise_device(evidence)]


def test_no_device_no_advice() -> None:
    assert advise_device(Evidence()) == []


@pytest.mark.parametrize(("exposed_ms", "fires"), [(9.9, False), (10.0, True), (30.0, True)])
def test_exposed_communication_share(exposed_ms: float, fires: bool) -> None:
    found = advise_device(Evidence(device=device(exposed_comm_ms=exposed_ms)))
    assert ("exposed-comm" in [a.rule for a in found]) is fires
    if fires:
        assert (
            f"{exposed_ms:.2f} ms per step" in found[0].evidence and "≥ 10%" in found[0].threshold
        )
        assert "bucket_cap_mb" in found[0].suggestion and "prefetch" in found[0].suggestion


@pytest.mark.parametrize(("overlap", "says"), [(0.04, "do not overlap"), (0.05, "only 5%")])
def test_exposed_communication_says_when_nothing_overlaps(overlap: float, says: str) -> None:
    (item,) = advise_device(
        Evidence(device=device(exposed_comm_ms=40.0, comm_overlap_share=overlap))
    )
    assert says in item.evidence


def test_exposed_communication_needs_communication() -> None:
    assert (
        rules(
            Evidence(device=device(exposed_comm_ms=40.0, comm_share=0.0, comm_overlap_share=None))
        )
        == []
    )


@pytest.mark.parametrize(("wait_ms", "fires"), [(19.9, False), (20.0, True)])
def test_host_bound(wait_ms: float, fires: bool) -> None:
    causes = {"host_wait_ms": wait_ms, "kernel_wait_ms": 0.0, "other_ms": 0.0}
    launch = {"delay_us": {"p50": 350.0}, "kernels_per_step": 900.0}
    found = advise_device(Evidence(device=device(idle_by_cause=causes, launch=launch)))
    assert ("host-bound" in [a.rule for a in found]) is fires
    if fires:
        assert "launch delay p50 350 µs, 900 kernels per step" in found[0].evidence
        assert "reduce-overhead" in found[0].suggestion


@pytest.mark.parametrize(("wait_ms", "fires"), [(4.9, False), (5.0, True)])
def test_host_bound_needs_five_ms_per_step(wait_ms: float, fires: bool) -> None:
    # GIVEN a 10 ms step whose device waits for its host about half of it
    causes = {"host_wait_ms": wait_ms, "kernel_wait_ms": 0.0, "other_ms": 0.0}
    figures = device(busy_ms=10.0 - wait_ms, idle_ms=wait_ms, idle_by_cause=causes)
    assert ("host-bound" in rules(Evidence(device=figures))) is fires


def test_host_bound_leaves_many_short_kernels_to_the_launch_bound_rule() -> None:
    # GIVEN a device idle 60% waiting for the host, running 100 kernels of 5 us per step
    # (launch-bound fires)
    causes = {"host_wait_ms": 60.0, "kernel_wait_ms": 0.0, "other_ms": 0.0}
    figures = device(busy_ms=40.0, idle_ms=60.0, idle_by_cause=causes)
    kernels = [{"name": "k", "calls": 1000, "self_ms": 5.0}]
    assert (
        rules(Evidence(device=figures, device_busy_share=0.4, kernels=kernels, recorded_steps=10))
        == []
    )
    # AND with long kernels instead, host-bound speaks
    long_kernels = [{"name": "k", "calls": 1000, "self_ms": 400.0}]
    found = rules(
        Evidence(device=figures, device_busy_share=0.4, kernels=long_kernels, recorded_steps=10)
    )
    assert found == ["host-bound"]


@pytest.mark.parametrize(("copy_ms", "fires"), [(0.99, False), (1.0, True)])
def test_pageable_copies(copy_ms: float, fires: bool) -> None:
    kernels = [
        {"name": "Memcpy HtoD (Pageable -> Device)", "calls": 20, "self_ms": copy_ms * 10},
        {"name": "Memcpy HtoD (Pinned -> Device)", "calls": 20, "self_ms": 50.0},
    ]
    found = advise_device(Evidence(device=device(), kernels=kernels, recorded_steps=10))
    assert ("pageable-copies" in [a.rule for a in found]) is fires
    if fires:
        assert "2 copies per step" in found[0].evidence and "pin_memory" in found[0].suggestion


def test_thresholds_are_the_documented_ones() -> None:
    assert (
        deviceadvice.EXPOSED_COMM_SHARE,
        deviceadvice.HOST_WAIT_SHARE,
        deviceadvice.PAGEABLE_SHARE,
    ) == (
        0.10,
        0.20,
        0.01,
    )
