"""The Python stacks of the recorded steps (stepcli.traces.analyses.pystacks), their words, and the
flame graph."""

from __future__ import annotations

import pytest

from stepcli.report.flamegraph import flame_graph, stacks_section
from stepcli.traces.analyses.pystacks import merge_stacks, short_frame, short_stack, stacks_of
from stepcli.traces.read.events import Event
from stepcli.traces.read.typedcolumns import columns_from_events

T0 = 1_000_000.0


def ev(name: str, ts: float, dur: float, cat: str = "python_function", tid: int = 1) -> Event:
    return Event(name=name, cat=cat, ph="X", pid=7, tid=tid, ts=T0 + ts, dur=dur)


def step(n: int, ts: float, dur: float) -> Event:
    return ev(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")


MAIN = "train.py(20): main"
WORK = "train.py(5): work"
EVENTS = [
    ev(MAIN, 0, 1000),  # spans both steps and the time around them
    step(1, 100, 200),
    step(2, 300, 200),
    step(3, 500, 100),  # the incomplete step: no recorded time
    ev(WORK, 150, 100),  # in step 1: 40 us in an operator, 60 us of its own Python
    ev("aten::mm", 160, 40, cat="cpu_op"),
    ev("<built-in method sum of Tensor object at 0x7f00>", 350, 50),  # in step 2
    ev(WORK, 320, 10, tid=2),  # another thread: not the steps' thread
]


def _document() -> dict:
    part = stacks_of(columns_from_events(EVENTS), incomplete_step=3)
    assert part is not None
    document = merge_stacks([part])
    assert document is not None
    return document


def test_stacks_are_measured_inside_the_complete_steps_of_the_steps_thread() -> None:
    document = _document()
    # 400 us over 2 steps
    assert document["steps"] == 2 and document["step_ms"] == pytest.approx(0.2)
    rows = {tuple(r["stack"]): r for r in document["stacks"]}
    work = rows[(MAIN, WORK)]
    # 100 us / 2 steps, the operator it called included
    assert work["self_ms"] == pytest.approx(0.05)
    assert work["outside_operators_ms"] == pytest.approx(0.03)  # less the 40 us in aten::mm
    builtin = rows[(MAIN, "<built-in method sum of Tensor object>")]  # the address stripped
    assert builtin["self_ms"] == pytest.approx(0.025)
    main = rows[(MAIN,)]
    # only its time inside steps 1 and 2
    assert main["self_ms"] == pytest.approx(0.2 - 0.05 - 0.025)
    assert main["total_ms"] == pytest.approx(0.2) and main["total_share"] == pytest.approx(1.0)
    assert sum(r["self_ms"] for r in document["stacks"]) == pytest.approx(document["step_ms"])
    assert [r["self_ms"] for r in document["stacks"]] == sorted(
        (r["self_ms"] for r in document["stacks"]), reverse=True
    )


def test_traces_without_frames_have_no_stacks() -> None:
    assert (
        stacks_of(columns_from_events([step(1, 0, 10), ev("aten::mm", 1, 2, cat="cpu_op")]), None)
        is None
    )
    assert merge_stacks([None, None]) is None


def test_frames_read_as_people_read_them() -> None:
    assert short_frame("/home/u/proj/train.py(11): main") == "main (train.py:11)"
    assert short_frame("<built-in method sum of Tensor object>") == "Tensor.sum"
    assert short_frame("<built-in method randn of type object>") == "randn"
    assert short_frame("<built-in function linear>") == "linear"
    assert short_frame("nn.Module: Linear_0") == "nn.Module: Linear_0"
    stack = ["a.py(1): outer", "a.py(2): middle", "b.py(3): inner"]
    assert short_stack(stack, 80) == "inner (b.py:3) < middle (a.py:2) < outer (a.py:1)"
    assert short_stack(stack, 30) == "inner (b.py:3) <…"
    assert short_stack(stack, 30, lines=2) == "inner (b.py:3)\n< middle (a.py:2) <…"
    assert all(
        len(line) <= 12 for line in short_stack(["x" * 40 + ".py(1): f"], 12, lines=2).split("\n")
    )


def test_the_flame_graph_escapes_names_and_fits_the_steps() -> None:
    hostile = '<script>alert(1)</script>"&.py(1): f'
    document = {
        "steps": 1,
        "step_ms": 2.0,
        "stacks": [
            {"stack": [MAIN, hostile], "self_ms": 1.5, "total_ms": 1.5},
            {"stack": [MAIN], "self_ms": 0.5, "total_ms": 2.0},
        ],
    }
    svg = flame_graph(document)
    assert "<script" not in svg and "&lt;script&gt;" in svg
    assert svg.count('<g class="frame">') == 3  # the steps, main, the hostile frame
    assert 'width="959.7"' in svg  # main: every step's time
    missing = "".join(stacks_section(None, recorded=False))
    assert "stepcli run --with-stack" in missing and "<svg" not in missing
