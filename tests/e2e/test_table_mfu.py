"""`stepcli table` on the real H200 trace of a bf16 GPT step whose matmuls all run as cuBLAS
`nvjet_sm90_*` kernels (tests/data/h200_gpt_bf16.pt.trace.json.gz with its `.flops`; see
tests/unit/test_traces_gemm_dtype.py)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, run_stepcli

H200_TRACE = REPO / "tests" / "data" / "h200_gpt_bf16.pt.trace.json.gz"


def test_table_on_the_h200_trace_gives_bf16_mfu_at_the_recorded_pace() -> None:
    # WHEN the real H200 trace is summarized
    result = run_stepcli("table", "--json", H200_TRACE)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # THEN MFU is against the H200's dense BF16 peak, its dtype taken from the nvjet kernels'
    # operators
    for figures in (data["flops"], data["device"]):
        assert figures["mfu_dtype"] == "bf16" and figures["mfu_dtype_assumed"] is False
        assert figures["device_name"] == "NVIDIA H200" and figures["peak_flops_per_s"] == 989e12
        assert figures["flops_per_step"] == pytest.approx(6.185e12, rel=1e-3)  # the analytic count
        # AND at the recorded steps' pace (bare traces have no untouched steps), said so
        assert figures["pace"] == "recorded" and figures["mfu"] == figures["mfu_recorded"]
        # the 10.7% at the recorded pace
        assert figures["mfu"] == pytest.approx(0.107, abs=5e-4)
    text = run_stepcli("table", H200_TRACE)
    assert text.returncode == 0, text.stderr
    line = " ".join(text.stdout.split())
    assert "MFU 10.7% of NVIDIA H200's dense BF16 peak (dtype of its GEMM kernels)" in line
    assert "at the recorded steps' pace (the profiler's cost included)" in line
