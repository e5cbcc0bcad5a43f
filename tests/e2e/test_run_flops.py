"""`stepcli run --with-flops` on CPU: FLOPs per step against an analytic count of an MLP's
matmuls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_stepcli, trace_files, write_script

B, SIZES = 32, [64, 256, 128, 16]
MLP = f"""
    import torch
    torch.manual_seed(0)
    B, SIZES = {B}, {SIZES}
    layers = []
    for a, b in zip(SIZES, SIZES[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(B, SIZES[0])
    for i in range(12):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
"""


def analytic_flops_per_step() -> int:
    """Forward 2*B*in*out per layer; backward twice that (input and weight gradients), less the
    first layer's input gradient, which autograd does not compute for an input that needs none."""
    forward = sum(2 * B * a * b for a, b in zip(SIZES, SIZES[1:]))
    return forward + 2 * forward - 2 * B * SIZES[0] * SIZES[1]


def test_with_flops_gives_flops_per_step_of_the_analytic_count(tmp_path: Path) -> None:
    # GIVEN an MLP training loop WHEN run with --with-flops
    script = write_script(tmp_path, "mlp.py", MLP)
    out = tmp_path / "out"
    result = run_stepcli(
        "run", "--with-flops", "-o", out, "--json", tmp_path / "s.json", "--", "python", script
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    (trace,) = trace_files(out)
    # THEN the FLOPs are written beside the trace, and the summary's FLOPs per step are the matmuls'
    # count (torch also counts the loss's elementwise multiplies: 2 x 512 FLOPs, under 0.02%)
    assert (trace.parent / (trace.name.split(".pt.trace.json")[0] + ".flops")).is_file()
    flops = summary["flops"]
    assert flops["flops_per_step"] == pytest.approx(analytic_flops_per_step(), rel=2e-4)
    # AND FLOP/s at the program's own pace: FLOPs per step over the untouched steps' median time
    # (the run had untouched steps), no MFU on CPU (no known peak)
    median_ms = summary["step_time_ms"]["untouched"]["median"]
    assert flops["pace"] == "untouched" and flops["pace_step_ms"] == median_ms
    assert flops["achieved_flops_per_s"] == pytest.approx(
        flops["flops_per_step"] / (median_ms / 1000)
    )
    assert flops["mfu"] is None and flops["mfu_recorded"] is None and summary["device"] is None
    # AND the recorded steps' pace only under names that say so, as `table` gives it for the same
    # traces
    table = json.loads(run_stepcli("table", "--json", out).stdout)
    seconds = sum(s["dur_ms"] for s in table["steps"]) / 1000
    recorded = flops["flops_per_step"] * len(table["steps"]) / seconds
    assert flops["achieved_flops_per_s_recorded"] == pytest.approx(recorded)
    # AND `table` (no untouched steps in bare traces) stays at the recorded pace, said so; FLOPs per
    # step the same
    assert (
        table["flops"]["pace"] == "recorded"
        and table["flops"]["flops_per_step"] == flops["flops_per_step"]
    )
    assert table["flops"]["achieved_flops_per_s"] == table["flops"]["achieved_flops_per_s_recorded"]
    assert table["flops"]["achieved_flops_per_s"] == pytest.approx(recorded)
    same = ("achieved_flops_per_s", "mfu", "pace", "pace_step_ms")
    assert {k: v for k, v in table["flops"].items() if k not in same} == {
        k: v for k, v in flops.items() if k not in same
    }
    # AND the terminal says it in one line, with its pace
    text = " ".join(run_stepcli("table", out).stdout.split())
    assert f"FLOPs: {flops['flops_per_step']:.3g} per step" in text
    assert "at the recorded steps' pace (the profiler's cost included)" in text
    run_text = " ".join(result.stderr.split())
    assert f"at the untouched steps' pace (median step {median_ms:.3g} ms)" in run_text, (
        result.stderr
    )


# Without --with-flops: test_run.py::test_without_with_flops_no_flops
