"""torch.compile: compile and recompile time attributed to the steps where it happened, kept out of
the statistics."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import profiler_steps, run_stepcli, trace_files, write_script

from stepcli.agent.compiles import _short_reason
from stepcli.run.summary.compilesteps import (
    compile_lines,
    compile_summary,
    compiled_steps,
    describe_step,
)

COMPILED_LOOP = """
    import sys
    import torch
    print("after import torch:", "torch._dynamo" in sys.modules)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 4)

        def forward(self, x):
            y = self.linear(x)
            torch._dynamo.graph_break()  # one graph break per compiled forward
            return y.relu()

    torch.manual_seed(0)
    model = torch.compile(Net(), backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(8):
        if i == 7:
            torch._dynamo.reset()  # clears torch's compile callbacks too: stepcli registers again
        x = torch.randn(8 if i < 4 else 12, 16)  # the batch size changes at step 4: a recompilation
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
"""


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("compile")
    script = write_script(tmp, "compiled.py", COMPILED_LOOP)
    out = tmp / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "5",
        "--warmup",
        "1",
        "--active",
        "1",
        "-o",
        out,
        "--json",
        tmp / "run.json",
        script,
        cwd=tmp,
    )
    assert result.returncode == 0, result.stderr
    return {"result": result, "summary": json.loads((tmp / "run.json").read_text()), "out": out}


def test_compile_and_recompile_are_attributed_to_their_steps(compiled_run: dict[str, Any]) -> None:
    section = compiled_run["summary"]["compile"]
    by_step = {entry["step"]: entry for entry in section["by_step"]}
    assert sorted(by_step) == [0, 4, 7]
    first, again = by_step[0], by_step[4]
    # step 0: the forward frame and its resume function after the graph break, compiled for the
    # first time
    assert (first["frames"], first["recompiles"], first["graph_breaks"]) == (2, 0, 1)
    assert first["text"].startswith(
        "step 0: compiled forward, compiled torch_dynamo_resume_in_forward"
    )
    # step 4: both recompiled because the input's size changed, with torch's reason
    assert (again["frames"], again["recompiles"], again["graph_breaks"]) == (2, 2, 1)
    assert "tensor 'x' size mismatch at index 0. expected 8, actual 12" in again["reasons"]
    # compile time lies within the step that paid for it
    assert 0 < again["seconds"] * 1000 <= again["step_ms"]
    # step 7: compiled from scratch after torch._dynamo.reset()
    assert (by_step[7]["frames"], by_step[7]["recompiles"]) == (2, 0)
    assert (
        section["steps"],
        section["frames"],
        section["recompiles"],
        section["graph_breaks"],
    ) == (3, 6, 2, 3)
    # steps 4 and 7 (step 0 is the start-up step, reported apart)
    assert section["step_time_ms"]["count"] == 2


def test_compile_steps_are_kept_out_of_the_statistics(compiled_run: dict[str, Any]) -> None:
    summary = compiled_run["summary"]
    # steps 1-7: 5 warms up and 6 is recorded (--wait 5), 4 and 7 compiled: 1, 2 and 3 are untouched
    assert summary["step_time_ms"]["untouched"]["count"] == 3
    assert summary["step_time_ms"]["profiled"]["count"] == 2
    recompile_ms = summary["compile"]["by_step"][1]["step_ms"]
    assert summary["step_time_ms"]["untouched"]["max"] < recompile_ms


def test_summary_says_which_step_recompiled_and_why(compiled_run: dict[str, Any]) -> None:
    stderr = " ".join(compiled_run["result"].stderr.split())  # the table wraps long lines
    assert "3 step(s) compiled" in stderr and "2 recompilation(s)" in stderr
    assert (
        "step 4: recompiled forward (reason: tensor 'x' size mismatch at index 0. expected 8, "
        "actual 12)" in stderr
    )
    (trace,) = trace_files(compiled_run["out"])
    assert profiler_steps(trace) == [6]


def test_the_agent_imports_dynamo_only_after_the_program_does(compiled_run: dict[str, Any]) -> None:
    # torch itself imports torch._dynamo when the program compiles, builds its first optimizer or
    # starts a profiler: stepcli attaches then, and never earlier (under plain python the line says
    # False too: stepcli only adds)
    assert compiled_run["result"].stdout == "after import torch: False\n"
    # a program that never compiles has no compile section:
    # test_run.py::test_a_program_that_never_compiles_...


# -- pure parts
# --------------------------------------------------------------------------------------------------


def _log(
    events: list[dict[str, Any]], durations_ms: list[float], worker: str = "rank0"
) -> dict[str, Any]:
    return {
        "worker": worker,
        "durations_us": [int(ms * 1000) for ms in durations_ms],
        "compile": {"events": events},
    }


def test_compile_summary_groups_events_per_step_and_process() -> None:
    events = [
        {"step": 0, "kind": "compiled", "frame": "forward", "seconds": 2.0, "graph_breaks": 0},
        {"step": 0, "kind": "backward", "frame": "forward", "seconds": 0.5, "graph_breaks": 0},
        {
            "step": 3,
            "kind": "recompiled",
            "frame": "forward",
            "seconds": 1.4,
            "graph_breaks": 2,
            "reason": "size of input changed",
        },
    ]
    logs = [_log(events, [2600, 1, 1, 1500, 1]), _log([], [1, 1], worker="rank1")]
    section = compile_summary(logs)
    assert section is not None
    assert [(s.worker, s.step, s.frames, s.recompiles) for s in section.by_step] == [
        ("rank0", 0, 1, 0),
        ("rank0", 3, 1, 1),
    ]
    assert (
        section.by_step[1].text
        == "step 3: recompiled forward (reason: size of input changed), 2 graph break(s), 1.40 s"
    )
    assert section.seconds == pytest.approx(3.9)
    assert section.step_time_ms is not None
    assert section.step_time_ms.count == 1 and section.step_time_ms.max == pytest.approx(1500)
    assert compiled_steps(logs[0]) == {0, 3} and compiled_steps(logs[1]) == set()
    lines = compile_lines(section, workers=2)
    assert lines[0].startswith("2 step(s) compiled, 3.90 s in all: 2 frame(s), 1 recompilation(s)")
    assert lines[2].startswith("rank0 step 3: recompiled forward")


def test_no_compile_events_give_no_section() -> None:
    assert compile_summary([_log([], [1, 2]), {"worker": "x"}]) is None
    assert compile_lines(None) == []


def test_describe_step_lists_two_frames_then_counts_the_rest() -> None:
    events = [{"step": 2, "kind": "compiled", "frame": f"f{i}", "seconds": 0.01} for i in range(4)]
    assert describe_step(2, events) == "step 2: compiled f0, compiled f1, +2 more frame(s), 40.0 ms"


def test_short_reason_drops_the_compile_id_and_extra_lines() -> None:
    assert _short_reason("0/1: tensor 'x' size mismatch\nmore") == "tensor 'x' size mismatch"
    assert _short_reason("___check_obj_id(self.flag)") == "___check_obj_id(self.flag)"
    assert len(_short_reason("x" * 1000)) == 300


def test_report_marks_compile_steps_on_the_step_time_chart(compiled_run: dict[str, Any]) -> None:
    # GIVEN the run's report.html WHEN the step-time chart is drawn THEN steps 4 and 7 (recompiled,
    # compiled after reset) are dots of their own phase, with a legend entry; step 0 stays the
    # start-up step
    html = (compiled_run["out"] / "report.html").read_text()
    compile_dots = re.findall(
        r'<circle class="dot ph-compile"[^>]*><title>[^<]* step (\d+) \(torch\.compile\)', html
    )
    assert sorted(int(s) for s in compile_dots) == [4, 7], compile_dots
    assert "torch.compile</span>" in html or ">torch.compile<" in html
    assert "other phases" not in html  # compile steps are a known phase, not "other"
