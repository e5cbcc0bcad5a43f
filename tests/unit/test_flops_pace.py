"""MFU at the program's pace: `stepcli run` takes achieved FLOP/s and MFU over the untouched steps'
median time (a step's FLOPs do not change when it is profiled, its time does), and keeps the
recorded steps' figures only under `*_recorded`; `stepcli table` (bare traces: no untouched steps)
stays at the recorded pace and says so."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.runfolder.summaryfile import RunSummary
from stepcli.traces.analyses.flops import at_untouched_pace, flops_figures

H200 = {"NVIDIA H200"}
# The H200 run: 6.186e12 FLOPs per step, 3 recorded steps of 58 ms mean, untouched median
# 50.3 ms.
FLOPS_PER_STEP = 6.186e12


def _recorded() -> dict[str, Any]:
    return flops_figures(round(3 * FLOPS_PER_STEP), 3, 3 * 58_000_000, H200, gemm_ns={"bf16": 1})


def test_bare_traces_are_at_the_recorded_pace_said_so() -> None:
    figures = _recorded()
    assert figures["pace"] == "recorded" and figures["pace_step_ms"] == pytest.approx(58.0)
    assert (
        figures["achieved_flops_per_s"]
        == figures["achieved_flops_per_s_recorded"]
        == pytest.approx(FLOPS_PER_STEP / 0.058)
    )
    assert (
        figures["mfu"] == figures["mfu_recorded"] == pytest.approx(FLOPS_PER_STEP / 0.058 / 989e12)
    )


def test_the_untouched_steps_pace() -> None:
    figures = at_untouched_pace(_recorded(), 50.3)
    assert figures is not None
    assert figures["pace"] == "untouched" and figures["pace_step_ms"] == 50.3
    assert figures["achieved_flops_per_s"] == pytest.approx(FLOPS_PER_STEP / 0.0503)
    # the 12.4% at the program's own pace
    assert figures["mfu"] == pytest.approx(0.1243, abs=1e-4)
    assert figures["mfu_recorded"] == pytest.approx(0.1078, abs=1e-4)  # not the 10.7%... of 58 ms
    assert figures["flops_per_step"] == pytest.approx(FLOPS_PER_STEP)
    # AND without untouched steps, or without counts, nothing changes
    assert at_untouched_pace(_recorded(), None) == _recorded()
    assert at_untouched_pace(None, 50.3) is None


def _analysis() -> dict[str, Any]:
    flops = _recorded()
    device = {"busy_ms": 40.0, "busy_share": 0.7, "compute_ms": 30.0} | flops
    return {"flops": flops, "device": device}


def test_the_run_summary_is_at_the_untouched_steps_pace() -> None:
    from stepcli.run.summary.build import _at_program_pace

    # GIVEN the traces' figures (recorded pace) and untouched steps of a median 50.3 ms
    flops, device = _at_program_pace(_analysis(), [50.1, 50.3, 61.0, 49.0, 50.4])
    # THEN flops and device carry MFU at that pace, and the recorded pace under its own names
    assert flops is not None and device is not None
    for figures in (flops, device):
        assert figures["pace"] == "untouched" and figures["pace_step_ms"] == 50.3
        assert figures["mfu"] == pytest.approx(FLOPS_PER_STEP / 0.0503 / 989e12)
        assert figures["mfu_recorded"] == pytest.approx(FLOPS_PER_STEP / 0.058 / 989e12)
    assert device["busy_ms"] == 40.0 and "busy_ms" not in flops
    # AND a run without untouched steps stays at the recorded pace
    flops, device = _at_program_pace(_analysis(), [])
    assert flops == _recorded() and device == _analysis()["device"]
    assert _at_program_pace(None, [50.0]) == (None, None)


def test_the_terminal_and_the_page_say_the_pace() -> None:
    from stepcli.report.gpu import gpu_section
    from stepcli.traces.render.gpusection import flops_line

    recorded = _recorded()
    line = flops_line(recorded)
    assert line is not None and line.endswith(
        ", at the recorded steps' pace (the profiler's cost included)"
    )
    paced = at_untouched_pace(recorded, 50.3)
    line = flops_line(paced)
    assert line is not None
    assert (
        "MFU 12.4% of NVIDIA H200's dense BF16 peak (dtype of its GEMM kernels), at the untouched "
        "steps' pace" in line
    )
    assert line.endswith(
        "(median step 50.3 ms); at the recorded steps' pace 107 TFLOP/s, MFU 10.8%"
    )
    from stepcli.traces.engine import summarize_paths
    from tests.unit.test_traces_gemm_dtype import H200_TRACE

    device = summarize_paths([str(H200_TRACE)], jobs=1).to_dict()["device"]
    html = gpu_section(device)
    assert "at the recorded steps&#x27; pace (the profiler&#x27;s cost included)." in html
    html = gpu_section(device | (paced or {}))
    assert (
        "MFU 12.4% of the dense BF16 peak (dtype of its GEMM kernels), at the untouched "
        "steps&#x27; pace" in html
    )


def test_the_report_takes_the_run_summarys_pace() -> None:
    from stepcli.report.data import _at_the_runs_pace

    device = _analysis()["device"]
    paced = at_untouched_pace(_recorded(), 50.3)
    summary = RunSummary(flops=paced)
    mine = _at_the_runs_pace(device, summary)
    assert mine is not None and mine["mfu"] == paced["mfu"] and mine["busy_ms"] == 40.0  # type: ignore[index]
    assert _at_the_runs_pace(device, RunSummary(flops=_recorded())) is device
    assert _at_the_runs_pace(device, None) is device
