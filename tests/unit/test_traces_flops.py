"""FLOPs per step, FLOP/s and MFU (stepcli.traces.flops) from the counts written beside traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepcli.traces.flops import flops_figures, flops_path, peak_of, read_flops


@pytest.mark.parametrize(
    ("device", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-PG509-200", 312e12),
        ("Tesla V100-SXM2-16GB", 125e12),  # no BF16: the FP16 tensor peak
        ("AMD Instinct MI300X", 1307.4e12),
        ("NVIDIA GeForce GTX 1080", None),
        (None, None),
    ],
)
def test_dense_bf16_peaks_by_device_name(device: str | None, peak: float | None) -> None:
    assert peak_of(device) == peak


def test_figures_over_the_recorded_steps() -> None:
    # GIVEN 3e12 FLOPs over 3 steps taking 2 s in all, on an A100 (312 TFLOP/s dense BF16)
    figures = flops_figures(3_000_000_000_000, 3, 2_000_000_000, {"NVIDIA A100-SXM4-80GB"})
    assert figures["flops_per_step"] == 1e12 and figures["achieved_flops_per_s"] == 1.5e12
    assert figures["mfu"] == pytest.approx(1.5e12 / 312e12)
    # AND on CPU, or with two kinds of device, no MFU
    assert flops_figures(10, 1, 10, {""})["mfu"] is None and flops_figures(10, 1, 10, {""})["device_name"] is None
    assert flops_figures(10, 1, 10, {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"})["mfu"] is None


def test_reads_the_file_beside_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "w.123.pt.trace.json.gz"
    assert flops_path(str(trace)) == str(tmp_path / "w.123.flops")
    assert read_flops(str(trace)) is None
    Path(flops_path(str(trace))).write_text(json.dumps({"flops": 42, "device": "NVIDIA H100 80GB HBM3"}))
    assert read_flops(str(trace)) == (42, "NVIDIA H100 80GB HBM3")
    for bad in ('{"flops": -1}', '{"flops": true}', "[1]", "not json", '{"flops": 1.5}'):
        Path(flops_path(str(trace))).write_text(bad)
        assert read_flops(str(trace)) is None


def _flops_trace(path: Path, *, device: str | None = "NVIDIA H100 80GB HBM3", null_args: bool = False) -> Path:
    """Two complete steps of 1 ms, FLOP-carrying operators inside and outside them, like a trace recorded with
    `with_flops=True` on a GPU (torch writes `flops` into the args of the operators it counts)."""
    t0 = 1_700_000_000_000.0

    def op(name: str, ts: float, flops: int | None) -> dict[str, object]:
        args: dict[str, object] = {"External id": 1, "Input type": ["c10::BFloat16", "c10::BFloat16"]}
        if flops is not None:
            args["flops"] = flops
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t0 + ts, "dur": 10, "args": args}

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t0, "dur": 1000},
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#2",
            "pid": 1,
            "tid": 1,
            "ts": t0 + 1000,
            "dur": 1000,
        },
        op("aten::mm", 10, 4_000_000_000),
        op("aten::addmm", 1100, 2_000_000_000),
        op("aten::add", 1200, 1000),
        op("aten::relu", 1300, None),
        op("aten::mm", 5000, 7_000_000_000),  # after the last step: not the recorded steps' work
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t0 + 20, "dur": 500, "args": None},
    ]
    if null_args:
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::empty",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 30,
                "dur": 1,
                "args": None,
            }
        )
    document: dict[str, object] = {"traceEvents": events}
    if device:
        document["deviceProperties"] = [{"id": 0, "name": device, "totalGlobalMem": 1}]
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("null_args", [False, True])
def test_flops_in_a_traces_operator_args_count_over_the_recorded_steps(tmp_path: Path, null_args: bool) -> None:
    from stepcli.traces.engine import summarize_paths

    # GIVEN a trace whose operators carry torch's FLOP counts, and no NAME.flops beside it
    trace = _flops_trace(tmp_path / "gpu.pt.trace.json", null_args=null_args)
    flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    # THEN the counts of the operators inside the two steps are summed (not the one after them) against the
    # H100 the trace names, with the dtype of the peak said to be assumed
    total = 4_000_000_000 + 2_000_000_000 + 1000
    assert flops["flops_per_step"] == total / 2 and flops["achieved_flops_per_s"] == pytest.approx(total / 2e-3)
    assert flops["device_name"] == "NVIDIA H100 80GB HBM3" and flops["mfu"] == pytest.approx(total / 2e-3 / 989e12)
    assert flops["flops_source"] == "trace"
    assert flops["mfu_dtype"] == "bf16" and flops["mfu_dtype_assumed"] is True


def test_the_side_file_wins_over_the_traces_own_counts(tmp_path: Path) -> None:
    from stepcli.traces.engine import summarize_paths

    trace = _flops_trace(tmp_path / "gpu.pt.trace.json", device=None)
    Path(flops_path(str(trace))).write_text(json.dumps({"flops": 8_000, "device": None}))
    flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    assert flops["flops_per_step"] == 4_000 and flops["flops_source"] == "file"
    assert flops["mfu"] is None and flops["mfu_dtype"] is None and flops["mfu_dtype_assumed"] is None


def test_a_trace_without_counts_has_no_flops(tmp_path: Path) -> None:
    from stepcli.traces.engine import summarize_paths

    trace = tmp_path / "plain.pt.trace.json"
    document = json.loads(_flops_trace(tmp_path / "x.pt.trace.json").read_text())
    for event in document["traceEvents"]:
        if event.get("args"):
            event["args"].pop("flops", None)
    trace.write_text(json.dumps(document))
    assert summarize_paths([str(trace)], jobs=1).to_dict()["flops"] is None


def test_flops_of_a_large_trace_read_in_slices_and_in_ranges(tmp_path: Path) -> None:
    """Decoded in 1 MB slices, and cut in ranges for several processes: every operator's count is kept once."""
    from stepcli.traces.engine import summarize_paths

    t0 = 1_700_000_000_000.0
    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t0, "dur": 1e6}
    ]
    for i in range(40_000):
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 10 + i * 20,
                "dur": 5,
                "args": {"External id": i, "Sequence number": i, "flops": 1000 + i},
            }
        )
    trace = tmp_path / "big.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}, indent=1))
    assert trace.stat().st_size > 4_000_000
    expected = sum(1000 + i for i in range(40_000))
    for jobs in (1, 2):
        assert summarize_paths([str(trace)], jobs=jobs).to_dict()["flops"]["flops_per_step"] == expected
