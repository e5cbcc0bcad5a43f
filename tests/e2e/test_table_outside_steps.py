"""Host events outside every recorded step are left out of the operator tables (their time is no
step's), in both engines (the array pass and the per-event reference), counted and said in one line;
traces without steps keep every event."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from conftest import run_stepcli

from stepcli.traces.analyses import arrays as columnar
from stepcli.traces.analyses import traceanalysis as summary_module
from stepcli.traces.analyses.mergeparts import merge_parts
from stepcli.traces.analyses.traceanalysis import summarize_file
from stepcli.traces.read.events import Event
from stepcli.traces.read.tracereader import Trace
from stepcli.traces.render.formats import markdown_report
from stepcli.traces.render.terminal import outside_note

T0 = 1_790_000_000_000.0  # an epoch-sized timestamp in microseconds, like real Kineto traces


def ev(
    name: str, ts: float, dur: float, *, cat: str = "cpu_op", tid: int = 1, pid: int = 100
) -> Event:
    return Event(name=name, cat=cat, ph="X", pid=pid, tid=tid, ts=T0 + ts, dur=dur)


def step(n: int, ts: float, dur: float, *, pid: int = 100) -> Event:
    return ev(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", pid=pid)


def _step_aside(*_args: object, **_kwargs: object) -> None:
    raise columnar.TooLarge


def both_engines(
    trace: Trace, monkeypatch: pytest.MonkeyPatch, by_shape: bool = False
) -> dict[str, Any]:
    """The summary of one trace by the array pass, asserted equal to the per-event reference's."""
    arrays = merge_parts(
        [summarize_file(trace, group_by_shape=by_shape)], group_by_shape=by_shape
    ).to_dict()
    with monkeypatch.context() as patch:
        patch.setattr(summary_module, "_analyze_columns", _step_aside)
        reference = merge_parts(
            [summarize_file(trace, group_by_shape=by_shape)], group_by_shape=by_shape
        ).to_dict()
    assert arrays == reference
    return arrays


def both(
    events: list[Event], monkeypatch: pytest.MonkeyPatch, incomplete_step: int | None = None
) -> dict[str, Any]:
    return both_engines(Trace.from_events(events, incomplete_step=incomplete_step), monkeypatch)


def calls(data: dict[str, Any]) -> dict[str, int]:
    return {r["name"]: r["calls"] for r in data["cpu_ops"]}


def test_op_after_the_last_step_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN two 100 us steps of 80 us work each, then the profiler's own 400 us sync after the last
    # step
    events = [
        step(1, 0, 100),
        ev("aten::mm", 10, 80),
        step(2, 100, 100),
        ev("aten::mm", 110, 80),
        ev("cudaDeviceSynchronize", 200, 400, cat="cuda_runtime"),
    ]
    data = both(events, monkeypatch)
    # THEN the sync is in no row and is counted as left out; the shares of step time add up to at
    # most 100%
    assert "cudaDeviceSynchronize" not in calls(data)
    assert calls(data) == {"aten::mm": 2, "ProfilerStep*": 2}
    assert data["outside_steps"] == {"events": 1, "self_ms": pytest.approx(0.4)}
    assert sum(r["self_share"] for r in data["cpu_ops"]) == pytest.approx(1.0)
    assert data["events"] == 5  # every event was read


def test_op_before_the_first_step_is_left_out_and_one_touching_a_step_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = [
        ev("before", 0, 10),
        ev("ends_at_start", 5, 15),
        step(1, 20, 100),
        ev("aten::mm", 30, 10),
        ev("zero_at_start", 20, 0),
        ev("zero_at_end", 120, 0),
        ev("starts_at_end", 120, 5),
    ]
    data = both(events, monkeypatch)
    # an event ending where the step starts, or starting where it ends, lies outside it; a
    # zero-length event at the step's start lies inside it
    assert calls(data) == {"ProfilerStep*": 1, "aten::mm": 1, "zero_at_start": 1}
    assert data["outside_steps"] == {"events": 4, "self_ms": pytest.approx(0.030)}


def test_an_event_straddling_a_step_boundary_is_kept_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an op that starts 10 us before the step and one that ends 30 us after it
    events = [ev("early", -10, 20), step(1, 0, 100), ev("late", 90, 40)]
    rows = {r["name"]: r for r in both(events, monkeypatch)["cpu_ops"]}
    # THEN both count with their whole time: they are inside the step in part
    assert rows["early"]["self_ms"] == pytest.approx(0.020) and rows["late"][
        "self_ms"
    ] == pytest.approx(0.040)


def test_children_outside_a_straddling_parent_are_left_out_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a parent that straddles the step's end, with one child inside the step and one after it,
    # and an only child of the same name (which torch folds into its parent) after the step under
    # another straddling parent
    events = [
        step(1, 0, 100),
        ev("parent", 80, 60),
        ev("inner", 85, 10),
        ev("outer", 110, 20),
        ev("aten::copy_", 90, 50, tid=2),
        ev("aten::copy_", 105, 30, tid=2),
    ]
    data = both(events, monkeypatch)
    rows = {r["name"]: r for r in data["cpu_ops"]}
    # THEN the parent keeps its own self time (its duration minus both children), the child after
    # the step is out
    assert rows["parent"]["self_ms"] == pytest.approx(0.030) and rows["inner"]["calls"] == 1
    assert "outer" not in rows
    # and the folded child leaves the parent one call holding the whole time, as key_averages()
    # folds it
    assert rows["aten::copy_"]["calls"] == 1 and rows["aten::copy_"]["self_ms"] == pytest.approx(
        0.050
    )
    assert data["outside_steps"] == {"events": 1, "self_ms": pytest.approx(0.020)}


def test_a_trace_without_steps_keeps_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    events = [
        ev("aten::mm", 0, 10),
        ev("aten::add", 20, 5),
        ev("cudaDeviceSynchronize", 30, 40, cat="cuda_runtime"),
    ]
    data = both(events, monkeypatch)
    assert calls(data) == {"aten::mm": 1, "aten::add": 1, "cudaDeviceSynchronize": 1}
    assert data["outside_steps"] == {"events": 0, "self_ms": 0.0}
    assert data["share_of"].startswith("total operator self time")


def test_steps_of_one_process_do_not_cover_another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN process 100 stepping over 0-100 us, process 200 stepping over 200-300 us, and process
    # 300 with no step
    events = [
        step(1, 0, 100),
        ev("a", 10, 10),
        step(1, 200, 100, pid=200),
        ev("b", 210, 10, pid=200),
        # inside process 100's step in time, in no step of its own
        ev("b_in_100s_step", 50, 10, pid=200),
        ev("c", 50, 10, pid=300),
    ]
    data = both(events, monkeypatch)
    # THEN each event needs a step of its own process
    assert calls(data) == {"ProfilerStep*": 2, "a": 1, "b": 1}
    assert data["outside_steps"]["events"] == 2


def test_the_incomplete_step_is_outside_the_recorded_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a complete step 1, and step 2 cut short (only begun) with an op inside it and one after
    # it
    events = [
        step(1, 0, 100),
        ev("a", 10, 10),
        step(2, 100, 20),
        ev("in_cut_step", 105, 10),
        ev("after", 130, 5),
    ]
    data = both(events, monkeypatch, incomplete_step=2)
    # THEN step 2 is no step time, and no operator time either: it, its op and the op after it are
    # left out, so that shares stay shares of the recorded steps' time (the cut step's ops had made
    # them 100x)
    assert [s["step"] for s in data["steps"]] == [1]
    assert calls(data) == {"ProfilerStep*": 1, "a": 1}
    assert data["outside_steps"]["events"] == 3
    assert sum(row["self_ms"] for row in data["cpu_ops"]) <= data["step_ms"]["mean"] * 1.0000001


def test_only_an_incomplete_step_leaves_out_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # no complete step: no step time to share, so shares are of the operators' self time and every
    # operator counts; the cut step itself is no operator (as a `ProfilerStep*` row its self time
    # was 150% of the operators')
    data = both([step(2, 0, 20), ev("a", 5, 5), ev("after", 30, 5)], monkeypatch, incomplete_step=2)
    assert calls(data) == {"a": 1, "after": 1} and data["outside_steps"]["events"] == 0


def test_device_kernels_after_the_step_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a kernel launched in the step that runs after the step's CPU side ended
    events = [
        step(1, 0, 100),
        ev("cudaLaunchKernel", 90, 5, cat="cuda_runtime"),
        ev("volta_sgemm", 150, 30, cat="kernel", pid=0, tid=7),
    ]
    data = both(events, monkeypatch)
    assert [(k["name"], k["calls"]) for k in data["device_kernels"]] == [("volta_sgemm", 1)]
    assert data["outside_steps"]["events"] == 0


def test_outside_counts_add_up_over_files() -> None:
    one = Trace.from_events([step(1, 0, 100), ev("late", 150, 10)], path="a.json")
    two = Trace.from_events(
        [step(1, 0, 100), ev("late", 150, 20), ev("early", -50, 5)], path="b.json"
    )
    data = merge_parts([summarize_file(one), summarize_file(two)]).to_dict()
    assert data["outside_steps"] == {"events": 3, "self_ms": pytest.approx(0.035)}


def around_steps(seed: int) -> Trace:
    """Random steps on two processes with random nested operators before, between, across and after
    them, on a third process with no step, with only children of their parent's name, zero lengths
    and equal edges."""
    rng = random.Random(seed)
    events: list[Event] = []
    edges = [0.0]
    for n in range(rng.randint(1, 3)):
        start = edges[-1] + rng.choice([0.0, 5.0, 20.0])
        dur = rng.choice([0.0, 30.0, 60.0])
        for pid in (100, 200):
            events.append(
                step(n, start + (0 if pid == 100 else rng.choice([0.0, 40.0])), dur, pid=pid)
            )
        edges += [start, start + dur]
    for _ in range(rng.randint(5, 40)):
        pid = rng.choice([100, 100, 200, 300])
        tid = rng.choice([1, 2])
        ts = (
            rng.choice(edges)
            + rng.choice([-15.0, -1.0, 0.0, 0.0, 1.0, 15.0])
            + rng.choice([0.0, 0.5])
        )
        dur = rng.choice([0.0, 1.0, 14.0, 15.0, 40.0])
        name = rng.choice(["aten::mm", "aten::add", "cudaDeviceSynchronize"])
        events.append(ev(name, ts, dur, pid=pid, tid=tid))
        if rng.random() < 0.5:  # a child, sometimes an only child of the same name
            events.append(
                ev(
                    name if rng.random() < 0.5 else "aten::copy_",
                    ts + dur / 2,
                    dur / 2,
                    pid=pid,
                    tid=tid,
                )
            )
        if rng.random() < 0.2:
            events.append(ev("volta_sgemm", ts + 3, 10, cat="kernel", pid=0, tid=7))
    rng.shuffle(events)
    return Trace.from_events(events, incomplete_step=rng.choice([None, 0, 1]))


@pytest.mark.parametrize("seed", range(40))
def test_both_engines_leave_out_the_same_events(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = around_steps(seed)
    for by_shape in (False, True):
        both_engines(trace, monkeypatch, by_shape)


def test_random_traces_do_leave_events_out() -> None:
    # the differential test above is only worth something if the generator does produce left-out
    # events
    counts = [summarize_file(around_steps(seed)).outside_events for seed in range(40)]
    assert sum(1 for c in counts if c) >= 20


def test_the_line_says_how_many_and_how_long() -> None:
    assert (
        outside_note({"events": 3, "self_ms": 1.234})
        == "3 host events (1.23 ms) outside recorded steps left out"
    )
    assert (
        outside_note({"events": 1, "self_ms": 0.5})
        == "1 host event (0.500 ms) outside recorded steps left out"
    )
    assert outside_note({"events": 0, "self_ms": 0.0}) is None and outside_note(None) is None
    data = merge_parts(
        [summarize_file(Trace.from_events([step(1, 0, 100), ev("a", 10, 5), ev("late", 150, 10)]))]
    )
    markdown = markdown_report(data.to_dict())
    assert "1 host event (0.010 ms) outside recorded steps left out." in markdown
    assert "outside recorded steps" not in markdown_report(
        merge_parts(
            [summarize_file(Trace.from_events([step(1, 0, 100), ev("a", 10, 5)]))]
        ).to_dict()
    )


def test_table_says_what_it_left_out_and_shares_stay_within_step_time(tmp_path: Path) -> None:
    # GIVEN a trace file like a CUDA run's: two steps, then the profiler's own long sync after the
    # last one
    raw = (
        [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{n}",
                "pid": 7,
                "tid": 7,
                "ts": T0 + n * 1000.0,
                "dur": 1000.0,
            }
            for n in (1, 2)
        ]
        + [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 7,
                "tid": 7,
                "ts": T0 + n * 1000.0 + 100,
                "dur": 800.0,
            }
            for n in (1, 2)
        ]
        + [
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaDeviceSynchronize",
                "pid": 7,
                "tid": 7,
                "ts": T0 + 3000.0,
                "dur": 1400.0,
            }
        ]
    )
    trace = tmp_path / "host_7.123.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": raw}))
    # WHEN summarized by the real command, as text and as JSON
    text = run_stepcli("table", trace)
    as_json = run_stepcli("table", "--json", trace)
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    # THEN the table says what it left out, right after the CPU operator table, and the shares stay
    # within 100%
    assert "1 host event (1.40 ms) outside recorded steps left out" in text.stdout
    assert "cudaDeviceSynchronize" not in text.stdout
    data = json.loads(as_json.stdout)
    assert data["outside_steps"] == {"events": 1, "self_ms": pytest.approx(1.4)}
    assert sum(r["self_share"] for r in data["cpu_ops"]) <= 1.0 + 1e-9
    assert [r["name"] for r in data["cpu_ops"]] == ["aten::mm", "ProfilerStep*"]
    # AND the HTML report says it under its operator table too
    page = tmp_path / "page.html"
    report = run_stepcli("report", trace, "-o", page)
    assert report.returncode == 0, report.stderr
    html = page.read_text()
    assert (
        '<p class="muted" id="outside-steps">1 host event (1.40 ms) outside recorded steps left '
        "out</p>" in html
    )
    assert html.index('id="cpu-ops"') < html.index('id="outside-steps"')


def test_run_summary_says_it_under_the_top_operators(capsys: pytest.CaptureFixture[str]) -> None:
    import msgspec

    from stepcli.run.summary.console import print_run_summary
    from stepcli.runfolder.summaryfile import RunSummary

    # GIVEN the analysis of a window whose trace has an event after its last step, as the run
    # summary holds it
    events = [
        step(1, 0, 100),
        ev("aten::mm", 10, 80),
        ev("cudaDeviceSynchronize", 150, 1234, cat="cuda_runtime"),
    ]
    analysis = merge_parts([summarize_file(Trace.from_events(events))]).to_dict()
    summary: dict[str, Any] = {
        "command": ["python", "train.py"],
        "exit_status": 0,
        "duration_s": 1.0,
        "steps": {"global": 3, "requesters": {"SGD#0": 3}},
        "processes": [{"worker": "w", "global_steps": 3}],
        "step_time_ms": {"untouched": None, "profiled": None, "first_step": None},
        "timeline_ms": [],
        "timeline_phases": "",
        "peak_memory": {"rss_bytes": None, "cuda_bytes": None},
        "windows": [],
        "top_operators": [op for op in analysis["cpu_ops"] if op["name"] != "ProfilerStep*"],
        "top_kernels": [],
        "share_of": analysis["share_of"],
        "outside_steps": analysis["outside_steps"],
        "breakdown_ms": None,
        "ranks": [],
        "notes": [],
        "traces": [],
        "out_dir": "out",
    }
    # WHEN printed THEN the line follows the operator table; without left-out events there is no
    # line
    print_run_summary(msgspec.convert(summary, RunSummary))
    err = capsys.readouterr().err
    assert "1 host event (1.23 ms) outside recorded steps left out" in err
    assert err.index("Top CPU operators") < err.index("outside recorded steps")
    print_run_summary(
        msgspec.convert(dict(summary, outside_steps={"events": 0, "self_ms": 0.0}), RunSummary)
    )
    assert "outside recorded steps" not in capsys.readouterr().err
    # a summary saved before this field
    before = {k: v for k, v in summary.items() if k != "outside_steps"}
    print_run_summary(msgspec.convert(before, RunSummary))
    assert "outside recorded steps" not in capsys.readouterr().err
