"""The what-if graph and replay on constructed traces whose answers are computed by hand (times in
µs).

Each trace is built from events as torch writes them (ProfilerStep#N, operators on the steps'
thread, the host `c10d::allreduce_` that is a rank's arrival and gloo's worker event that is its
departure), read into columns as any trace is, so the lane builder and the collective matching are
the real ones."""

from __future__ import annotations

import pytest

from stepcli.errors import StepcliError
from stepcli.traces.analyses.lanes import lane_of
from stepcli.traces.read.columns import ColumnTrace
from stepcli.traces.read.events import Event
from stepcli.traces.read.typedcolumns import columns_from_events
from stepcli.whatif.answer import WhatifRequest, answer, choose_steps, parse_change
from stepcli.whatif.lanegraph import build_graph
from stepcli.whatif.lanereplay import replay
from stepcli.whatif.lanetime import step_ms

MAIN, WORKER = 1, 2


def _trace(
    rank: int | None, events: list[tuple[str, str, int, float, float]], world: int | None = None
) -> ColumnTrace:
    """events: (name, category, thread, start, end)."""
    decoded = [Event(name=n, cat=c, pid=7, tid=t, ts=s, dur=e - s) for n, c, t, s, e in events]
    columns = columns_from_events(decoded)
    return ColumnTrace(
        f"rank{rank}.json", rank, columns, len(decoded), clock="host:boot", world_size=world
    )


def _rank(rank: int, forward_end: float, depart: float, world: int = 2) -> ColumnTrace:
    """One step [0, 100]: forward [0, F), the allreduce called at F (2 µs), a wait until 95, the
    optimizer [95, 100]; gloo's worker ends the collective at `depart`."""
    f = forward_end
    return _trace(
        rank,
        [
            ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
            ("forward_op", "cpu_op", MAIN, 0, f),
            ("c10d::allreduce_", "cpu_op", MAIN, f, f + 2),
            ("gloo:all_reduce", "cpu_op", WORKER, f + 1, depart),
            ("Optimizer.step#SGD.step", "cpu_op", MAIN, 95, 100),
        ],
        world,
    )


def _one_process() -> ColumnTrace:
    return _trace(
        None,
        [
            ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
            ("a_op", "cpu_op", MAIN, 10, 40),
            ("inner_op", "cpu_op", MAIN, 20, 30),
            ("b_op", "cpu_op", MAIN, 50, 90),
        ],
    )


def _predicted(traces: list[ColumnTrace], *changes: tuple[str, str]) -> list[float]:
    lanes = [lane_of(t) for t in traces]
    doc = answer(lanes, WhatifRequest(list(changes)), None)
    assert doc["verdict"] == "ok", doc["reason"]
    return [round(entry["predicted_ms"] * 1000, 6) for entry in doc["changes"]]


def test_one_process_chain_scales_operators_phases_and_nested_calls() -> None:
    lanes = [lane_of(_one_process())]
    graph = build_graph(lanes, [1])
    assert step_ms(graph) == step_ms(graph, replay(graph)) == pytest.approx(0.1)
    # its whole span, the nested call too
    assert _predicted([_one_process()], ("scale", "a_op=0")) == [70.0]
    assert _predicted([_one_process()], ("scale", "inner_op=0")) == [90.0]
    assert _predicted([_one_process()], ("scale", "a_op=0.5"), ("scale", "inner_op=0")) == [
        85.0,
        90.0,
        80.0,
    ]
    # the gaps: 10 + 10 + 10
    assert _predicted([_one_process()], ("scale", "phase:other=0")) == [70.0]
    assert _predicted([_one_process()], ("scale", "re:^[ab]_op$=2")) == [170.0]


def test_two_ranks_a_late_member_binds_and_a_change_off_the_critical_path_buys_nothing() -> None:
    # rank 0 arrives at 20, rank 1 at 60; both threads resume at 95 (gloo's worker closes its event
    # at 90, no later than they do): the transfer is 35 after the last arrival, the wake-up
    # included.
    ranks = [_rank(0, 20, 90), _rank(1, 60, 90)]
    lanes = [lane_of(t) for t in ranks]
    graph = build_graph(lanes, [1])
    assert graph.transfer == [35.0]
    base = replay(graph)
    assert base.end == [100.0, 100.0]
    assert base.blocked == [40.0, 0.0]  # waiting for the other rank to arrive, not for the transfer
    # the late rank's forward halved: it arrives at 30, both resume at 65, end at 70.
    assert _predicted(ranks, ("scale", "rank:1/forward_op=0.5")) == [70.0]
    # off the critical path: ~0
    assert _predicted(ranks, ("scale", "rank:0/forward_op=0")) == [100.0]
    assert _predicted(ranks, ("comm", "0")) == [65.0]
    assert _predicted(ranks, ("comm", "2")) == [135.0]
    # rank 1's compute before its arrival as rank 0's: it arrives at 20, both resume at 55, end at
    # 60.
    assert _predicted(ranks, ("idealize", "1")) == [60.0]
    assert _predicted(ranks, ("idealize", "0")) == [100.0]
    doc = answer(lanes, WhatifRequest([]), None)
    path = doc["critical_path"]
    assert sum(s["ms"] for s in path["segments"]) == pytest.approx(path["ms"])
    assert [s["kind"] for s in path["segments"]][:2] == ["cpu", "collective"] and path["segments"][
        0
    ]["rank"] == 1
    best = doc["opportunities"][0]
    assert best["saved_ms"] == max(o["saved_ms"] for o in doc["opportunities"]) > 0


def test_clocks_that_disagree_make_the_replay_miss_and_the_answer_inconclusive() -> None:
    # rank 0 stops waiting at 50 and computes until 95; rank 1 "arrives" at 93 by a clock that
    # cannot be rank 0's: no collective completes before its last member arrives, so the replay
    # holds rank 0 until then and misses.
    early = _trace(
        0,
        [
            ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
            ("forward_op", "cpu_op", MAIN, 0, 20),
            ("c10d::allreduce_", "cpu_op", MAIN, 20, 22),
            ("gloo:all_reduce", "cpu_op", WORKER, 21, 48),
            ("late_op", "cpu_op", MAIN, 50, 95),
            ("Optimizer.step#SGD.step", "cpu_op", MAIN, 95, 100),
        ],
        2,
    )
    doc = answer(
        [lane_of(early), lane_of(_rank(1, 93, 96))], WhatifRequest([("comm", "0.5")]), None
    )
    assert doc["verdict"] == "inconclusive" and "off the measured step" in doc["reason"], doc
    assert doc["changes"] == [] and doc["opportunities"] == []


def test_one_rank_of_a_job_and_unmatched_ranks_are_inconclusive_with_the_reason() -> None:
    alone = answer([lane_of(_rank(0, 20, 90, world=2))], WhatifRequest([]), None)
    assert alone["verdict"] == "inconclusive" and "only rank 0 of a 2-rank job" in alone["reason"]
    quiet = [lane_of(_one_process()), lane_of(_one_process())]
    quiet[0].rank, quiet[1].rank = 0, 1
    doc = answer(quiet, WhatifRequest([]), None)
    assert doc["verdict"] == "inconclusive" and "no collective could be matched" in doc["reason"]


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        (
            "scale",
            "b_opp=0",
            "matches no operator on the steps' thread of these traces; near names: b_op",
        ),
        ("scale", "phase:warmup=0", "no phase 'warmup'"),
        ("scale", "a_op", "expected SELECTOR=FACTOR"),
        ("scale", "a_op=-1", "from 0 to 1000"),
        ("scale", "a_op=nan", "from 0 to 1000"),
        ("scale", "re:(=0", "not a regular expression"),
        ("scale", "rank:3/a_op=0", "no rank 3"),
        ("comm", "0.5", "these traces are one process"),
        ("idealize", "1", "these traces are one process"),
    ],
)
def test_bad_changes_are_usage_errors_in_one_line(flag: str, value: str, words: str) -> None:
    with pytest.raises(StepcliError) as caught:
        parse_change(flag, value, [lane_of(_one_process())])
    assert words in str(caught.value) and caught.value.exit_code == 2


def test_a_closure_optimizers_forward_and_backward_are_not_the_optimizers() -> None:
    """LBFGS runs forward and backward inside `optimizer.step(closure)`: the lane's phases are the
    breakdown's (the agent marks each closure call), so removing the optimizer removes only its own
    time."""
    closure = _trace(
        None,
        [
            ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
            ("Optimizer.step#LBFGS.step", "user_annotation", MAIN, 10, 90),
            ("stepcli: optimizer closure", "user_annotation", MAIN, 20, 70),
            ("Optimizer.zero_grad#LBFGS.zero_grad", "user_annotation", MAIN, 20, 25),
            ("aten::linear", "cpu_op", MAIN, 25, 45),
            ("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", MAIN, 45, 70),
        ],
    )
    # optimizer: [10, 20) + [20, 25) + [70, 90) = 35; forward: [25, 45) = 20; backward: [45, 70) =
    # 25; other: 20
    assert _predicted([closure], ("scale", "phase:optimizer=0")) == [65.0]
    assert _predicted([closure], ("scale", "phase:forward=0")) == [80.0]
    assert _predicted([closure], ("scale", "phase:backward=0")) == [75.0]
    assert _predicted([closure], ("scale", "phase:other=0")) == [80.0]


def test_a_regex_nested_too_deep_for_python_is_a_usage_error() -> None:
    # (it was a RecursionError out of re.compile: exit 70, an internal error)
    with pytest.raises(StepcliError) as caught:
        parse_change("scale", "re:" + "(a" * 5_000 + ")" * 5_000 + "=0", [lane_of(_one_process())])
    assert "too deeply nested" in str(caught.value) and caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("scale", "x" * 10_000 + "=0.5"),
        ("scale", "a_op=" + "9" * 10_000 + "x"),
        ("scale", "phase:" + "w" * 10_000 + "=0"),
        ("scale", "rank:1" + "/" * 10_000),
        ("idealize", "r" * 10_000),
    ],
)
def test_a_long_value_is_quoted_by_its_start(flag: str, value: str) -> None:
    with pytest.raises(StepcliError) as caught:
        parse_change(flag, value, [lane_of(_rank(0, 20, 90)), lane_of(_rank(1, 20, 90))])
    assert len(str(caught.value)) < 200 and "..." in str(caught.value), str(caught.value)[:300]


def test_traces_without_a_common_step_are_named() -> None:
    with_steps = lane_of(_rank(0, 20, 90))
    without = lane_of(_trace(1, [("forward_op", "cpu_op", MAIN, 0, 10)], 2))
    with pytest.raises(StepcliError) as caught:
        choose_steps([with_steps, without], None)
    assert str(caught.value) == (
        "rank1.json: no complete ProfilerStep, where another trace has steps: give traces of one "
        "run, each with its steps"
    )
    later = lane_of(_rank(1, 20, 90))
    later.steps = [7, 8]
    with pytest.raises(StepcliError) as caught:
        choose_steps([with_steps, later], None)
    assert str(caught.value) == (
        "the traces share no recorded step (rank0.json: step 1; rank1.json: steps 7-8): give "
        "traces of one run"
    )


@pytest.mark.parametrize("flag", ["comm", "idealize"])
def test_a_lone_rank_of_a_job_is_not_called_one_process(flag: str) -> None:
    # (it said "these traces are one process" of rank 3 of an 8-rank job)
    with pytest.raises(StepcliError) as caught:
        parse_change(flag, "0", [lane_of(_rank(0, 20, 90, world=8))])
    assert "only rank 0 of a 8-rank job was read; " in str(caught.value)
    assert caught.value.exit_code == 2


def test_the_time_between_steps_is_not_a_steps_time() -> None:
    # GIVEN two steps of 100 µs with the profiler's step transition (20 µs) between them
    two_steps = _trace(
        None,
        [
            ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
            ("a_op", "cpu_op", MAIN, 10, 40),
            ("ProfilerStep#2", "user_annotation", MAIN, 120, 220),
            ("a_op", "cpu_op", MAIN, 130, 160),
        ],
    )
    doc = answer([lane_of(two_steps)], WhatifRequest([("scale", "a_op=0")]), None)
    assert doc["verdict"] == "ok", doc["reason"]
    # THEN the step is the steps' mean, as `table` gives it, not the window over two (0.11 ms)
    assert doc["measured_ms"] == pytest.approx(0.1) and doc["replayed_ms"] == pytest.approx(0.1)
    # the critical path walks through the transition without counting it
    path = doc["critical_path"]
    assert path["ms"] == pytest.approx(0.1)
    assert {s["name"] for s in path["segments"]} == {"other", "forward"}
    # a_op removed: 30 of each step's 100 µs
    assert doc["changes"][0]["predicted_ms"] == pytest.approx(0.07)
    # the gaps inside the steps and the transition removed: only the steps' own gaps count
    other = answer([lane_of(two_steps)], WhatifRequest([("scale", "phase:other=0")]), None)
    assert other["changes"][0]["predicted_ms"] == pytest.approx(0.03)


@pytest.mark.parametrize(
    ("loader", "change", "noted"),
    [
        (
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            "phase:dataloader=0",
            True,
        ),
        # no data-loading change asked
        ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "a_op=0.5", False),
        # the loader runs on the steps' thread: all of it is in the trace
        (
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "phase:dataloader=0",
            False,
        ),
    ],
)
def test_a_data_loading_change_with_worker_processes_says_their_cpu_is_not_in_it(
    loader: str, change: str, noted: bool
) -> None:
    from stepcli.whatif.answer import loader_workers_note

    lanes = [
        lane_of(
            _trace(
                None,
                [
                    ("ProfilerStep#1", "user_annotation", MAIN, 0, 100),
                    (loader, "user_annotation", MAIN, 0, 30),
                    ("a_op", "cpu_op", MAIN, 40, 90),
                ],
            )
        )
    ]
    doc = answer(lanes, WhatifRequest([("scale", change)]), None)
    note = loader_workers_note(lanes, doc)
    assert (note is not None and "worker processes" in note) == noted


def _two_steps(rank: int, forward: float) -> ColumnTrace:
    """Two of _rank's steps, [0, 100] and [120, 220]: 20 µs of the profiler's step transition
    between them."""
    events: list[tuple[str, str, int, float, float]] = []
    for number, s in ((1, 0.0), (2, 120.0)):
        f = s + forward
        events += [
            (f"ProfilerStep#{number}", "user_annotation", MAIN, s, s + 100),
            ("forward_op", "cpu_op", MAIN, s, f),
            ("c10d::allreduce_", "cpu_op", MAIN, f, f + 2),
            ("gloo:all_reduce", "cpu_op", WORKER, f + 1, s + 90),
            ("Optimizer.step#SGD.step", "cpu_op", MAIN, s + 95, s + 100),
        ]
    return _trace(rank, events, 2)


def test_an_idealized_rank_keeps_the_time_between_its_steps() -> None:
    # GIVEN rank 1 late by 40 µs in each of two steps, with the step transition between them
    ranks = [_two_steps(0, 20), _two_steps(1, 60)]
    doc = answer([lane_of(t) for t in ranks], WhatifRequest([("idealize", "1")]), None)
    assert doc["verdict"] == "ok" and doc["measured_ms"] == pytest.approx(0.1)
    # WHEN rank 1 is idealized: its compute before step 1's collective takes 20 (was 60), before
    # step 2's 25 (rank 0's: the optimizer's 5 and the forward's 20; was 65), the profiler's
    # transition (20) not its compute and kept as it is; so both arrive at 20 and 100, resume at
    # 55 and 135, and end at 140. THEN each rank's steps are 140 less the 20 of transition: 60 a
    # step, on both
    assert doc["changes"][0]["predicted_ms"] == pytest.approx(0.06)
