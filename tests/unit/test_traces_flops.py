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
