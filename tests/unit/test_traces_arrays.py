"""The array pass (stepcli.traces.analyses.arrays) equals the per-event reference (summary._analyze)
on real and random traces."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from stepcli.traces.analyses import arrays as columnar
from stepcli.traces.analyses import traceanalysis as summary_module
from stepcli.traces.analyses.mergeparts import merge_parts
from stepcli.traces.analyses.results import FilePart
from stepcli.traces.analyses.traceanalysis import summarize_columns, summarize_file
from stepcli.traces.read.columns import load_columns
from stepcli.traces.read.events import Event
from stepcli.traces.read.tracereader import Trace, load_trace

DATA = Path(__file__).resolve().parent.parent / "data"
REAL = [
    DATA / "train_cpu.pt.trace.json",
    DATA / "cuda_small.pt.trace.json.gz",
    DATA / "cuda_compile.pt.trace.json.gz",
]


def reference_part(
    trace: Trace, monkeypatch: pytest.MonkeyPatch, by_shape: bool = False
) -> FilePart:
    """The part computed by the per-event reference (the array pass made to step aside)."""

    def step_aside(*_args: object, **_kwargs: object) -> None:
        raise columnar.TooLarge

    with monkeypatch.context() as patch:
        patch.setattr(summary_module, "_analyze_columns", step_aside)
        return summarize_file(trace, group_by_shape=by_shape)


def random_trace(seed: int) -> Trace:
    """Nested operators on a few threads and processes: equal starts, equal ends, zero lengths,
    partial overlaps, only children with their parent's name, steps, phases, communication and
    kernels."""
    rng = random.Random(seed)
    names = [
        "aten::add",
        "aten::mm",
        "aten::linear",
        "aten::addmm",
        "c10d::allreduce_",
        "Optimizer.step#SGD.step",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        "autograd::engine::evaluate_function: AddBackward0",
        "aten::copy_",
        "## backward ##",  # a user's wrapper: around a phase, its children stand in for it
    ]
    events: list[Event] = []
    t0 = 1_790_000_000_000.0 + rng.random()

    def grow(pid: int, tid: int, start: float, length: float, depth: int) -> None:
        cursor = start
        while cursor < start + length and depth < 6:
            dur = round(rng.choice([0.0, 0.001, rng.random() * length / 2, length]), 3)
            dur = min(dur, start + length - cursor)
            name = rng.choice(names)
            events.append(
                Event(
                    name=name,
                    cat="cpu_op",
                    ph="X",
                    pid=pid,
                    tid=tid,
                    ts=round(cursor, 3),
                    dur=dur,
                    shape=rng.choice(["", "[[2, 3]]", "[[4]]"]),
                )
            )
            if rng.random() < 0.3:  # an only child of the same name, sometimes two deep
                events.append(
                    Event(
                        name=name,
                        cat="cpu_op",
                        ph="X",
                        pid=pid,
                        tid=tid,
                        ts=round(cursor, 3),
                        dur=dur,
                    )
                )
            if rng.random() < 0.1:  # a partial overlap: starts inside, ends after
                events.append(
                    Event(
                        name="aten::odd",
                        cat="cpu_op",
                        ph="X",
                        pid=pid,
                        tid=tid,
                        ts=round(cursor + dur / 2, 3),
                        dur=round(dur + 1, 3),
                    )
                )
            if dur > 0.01 and rng.random() < 0.6:
                grow(pid, tid, cursor, dur, depth + 1)
            if rng.random() < 0.3:
                events.append(
                    Event(
                        name="volta_sgemm" if rng.random() < 0.7 else "ncclDevKernel_AllReduce",
                        cat="kernel",
                        ph="X",
                        pid=0,
                        tid=7,
                        ts=round(cursor + 2, 3),
                        dur=round(rng.random() * 3, 3),
                    )
                )
            cursor += dur + round(rng.choice([0.0, 0.5, 1.0]), 3)

    # a second thread of process 100 with steps that overlap the first's
    overlapping = rng.random() < 0.25
    for step in range(rng.randint(0, 3)):
        start = t0 + step * 100.0
        for pid, tid in ((100, 1), (100, 2), (200, 1)):
            if tid == 2 and overlapping:
                events.append(
                    Event(
                        name=f"ProfilerStep#{step + 10}",
                        cat="user_annotation",
                        ph="X",
                        pid=pid,
                        tid=tid,
                        ts=round(start + 45.0, 3),
                        dur=90.0,
                    )
                )
            if tid == 1:
                events.append(
                    Event(
                        name=f"ProfilerStep#{step}",
                        cat="user_annotation",
                        ph="X",
                        pid=pid,
                        tid=tid,
                        ts=round(start, 3),
                        dur=90.0,
                    )
                )
            grow(pid, tid, start + rng.random(), 80.0, 1)
    if not events or rng.random() < 0.3:
        grow(100, 1, t0 + 1000, 50.0, 0)
    events.append(
        Event(name="frame", cat="python_function", ph="X", pid=100, tid=1, ts=t0, dur=5.0)
    )
    rng.shuffle(events)
    return Trace.from_events(events, incomplete_step=rng.choice([None, 1]))


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("by_shape", [False, True])
def test_array_pass_equals_reference_on_random_traces(
    seed: int, by_shape: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = random_trace(seed)
    expected = merge_parts(
        [reference_part(trace, monkeypatch, by_shape)], group_by_shape=by_shape
    ).to_dict()
    assert (
        merge_parts(
            [summarize_file(trace, group_by_shape=by_shape)], group_by_shape=by_shape
        ).to_dict()
        == expected
    )


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_columns_read_from_file_equal_reference(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a real trace WHEN read into columns and summarized THEN it equals the per-event
    # reference
    for by_shape in (False, True):
        trace = load_trace(str(path), shapes=True)
        read = load_columns(str(path), shapes=True)
        assert (read.event_count, read.skipped_events, read.rank) == (
            trace.event_count,
            trace.skipped_events,
            trace.rank,
        )
        part = summarize_columns(
            read.columns,
            path=read.path,
            rank=read.rank,
            event_count=read.event_count,
            skipped_events=read.skipped_events,
            incomplete_step=read.incomplete_step,
            group_by_shape=by_shape,
        )
        assert (
            merge_parts([part], group_by_shape=by_shape).to_dict()
            == merge_parts(
                [reference_part(trace, monkeypatch, by_shape)], group_by_shape=by_shape
            ).to_dict()
        )


def test_huge_times_fall_back_to_the_reference() -> None:
    # GIVEN times 1e17 us apart (past 64-bit nanoseconds) WHEN summarized THEN both operators are
    # still counted
    trace = Trace.from_events(
        [
            Event(name="a", cat="cpu_op", ts=-1e17, dur=1.0),
            Event(name="b", cat="cpu_op", ts=1e17, dur=2.0),
        ]
    )
    rows = {r["name"]: r for r in merge_parts([summarize_file(trace)]).to_dict()["cpu_ops"]}
    assert rows["a"]["total_ms"] == pytest.approx(0.001) and rows["b"]["total_ms"] == pytest.approx(
        0.002
    )


def test_parents_are_the_latest_containing_event() -> None:
    import numpy as np

    # [0,10) holds [0,4) (which holds [1,2)), [3,6) (overlapping [0,4) and [4,10)) and [4,10);
    # [12,12) is alone.
    start = np.array([0, 0, 1, 3, 4, 12])
    dur = np.array([10, 4, 1, 3, 6, 0])
    got = columnar.parents(start, start + dur, dur, np.zeros(6, np.int64))
    assert got.tolist() == [-1, 0, 1, 0, 0, -1]


def test_columns_keep_and_skip_what_the_event_reader_does(tmp_path: Path) -> None:
    # GIVEN a trace with every kind of event the reader filters, skips and counts (typed and lenient
    # paths)
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 2,
            "ts": 10.0,
            "dur": 5.0,
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": "t",
            "ts": 11.0,
            "dur": 1.0,
        },
        {"ph": "i", "cat": "cpu_op", "name": "instant", "pid": 1, "tid": 2, "ts": 12.0},
        {"ph": "X", "cat": "ac2g", "name": "flow", "pid": 1, "tid": 2, "ts": 12.0, "dur": 1.0},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::is_leaf",
            "pid": 1,
            "tid": 2,
            "ts": 12.0,
            "dur": 1.0,
        },
        {"ph": "X", "cat": "cpu_op", "name": "no_dur", "pid": 1, "tid": 2, "ts": 12.0},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "negative",
            "pid": 1,
            "tid": 2,
            "ts": 12.0,
            "dur": -1.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#99999999999999999999",
            "pid": 1,
            "tid": 2,
            "ts": 9.0,
            "dur": 20.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#3",
            "pid": 1,
            "tid": 2,
            "ts": 9.0,
            "dur": 20.0,
        },
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 13.0, "dur": 2.0},
        {
            "ph": "X",
            "cat": "python_function",
            "name": "f",
            "pid": 1,
            "tid": 2,
            "ts": 9.5,
            "dur": 2.0,
        },
    ]
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({"traceEvents": events}))
    lenient = tmp_path / "lenient.json"
    lenient.write_text(
        json.dumps(
            {
                "traceEvents": [
                    *events,
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "str_ts",
                        "pid": 1,
                        "tid": 2,
                        "ts": "14.5",
                        "dur": "1",
                    },
                ]
            }
        )
    )
    for path in (typed, lenient):
        # WHEN read both ways THEN the same events are kept and the same are counted as skipped
        trace = load_trace(str(path))
        read = load_columns(str(path))
        assert (read.event_count, read.skipped_events) == (trace.event_count, trace.skipped_events)
        assert read.skipped_events == 3
        as_events = read.columns.to_events()
        assert [(e.name, e.pid, e.tid, e.ts, e.dur) for e in as_events] == [
            (e.name, e.pid, e.tid, e.ts, e.dur) for e in trace.events
        ]


@pytest.mark.parametrize("seed", range(20))
def test_thread_order_equals_lexsort(seed: int) -> None:
    # GIVEN events nearly sorted by start (a few swapped), with equal starts and few threads
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    start = np.cumsum(rng.integers(0, 3, n)).astype(np.int64)
    swap = rng.integers(0, max(n, 1), n // 10)
    start[swap] = start[swap[::-1]]
    dur = rng.integers(0, 5, n).astype(np.int64)
    thread = rng.integers(0, 3 if seed % 2 else 70_000, n).astype(np.int64)
    # THEN the order is np.lexsort's on (thread, start, -duration, position)
    expected = np.lexsort((np.arange(n), -dur, start, thread))
    assert np.array_equal(columnar.thread_order(thread, start, dur), expected)


def test_step_phases_claim_time_in_priority_order() -> None:
    # GIVEN two steps [0,100) and [100,200); a dataloader span over both steps' edges, an optimizer
    # span overlapping it, forward spans partly claimed already
    ns = lambda *v: np.array(v, np.int64)  # noqa: E731
    parts = columnar.step_phases(
        ns(0, 100),
        ns(100, 200),
        [ns(90), ns(95), ns(150)],
        [ns(110), ns(120), ns(160)],  # dataloader, optimizer, backward
        ns(0, 115, 140),
        ns(50, 150, 190),  # forward, clipped to their step
    )
    # THEN per step: dataloader, optimizer (only what dataloader left), backward, forward (the rest
    # of it), other
    assert [p.tolist() for p in parts] == [[10, 10], [0, 10], [0, 10], [50, 60], [40, 10]]


@pytest.mark.parametrize("seed", range(30))
def test_parents_equal_the_definition_on_random_threads(seed: int) -> None:
    # GIVEN random (overlapping, nested, zero-length, equal) intervals on a few threads, sorted as
    # the pass sorts
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    thread = np.sort(rng.integers(0, 3, n))
    start = rng.integers(0, 50 if seed % 3 else 2000, n)
    dur = rng.choice([0, 1, 2, 5, 20, 100, 1000], n)
    order = np.lexsort((-dur, start, thread))
    thread, start, dur = thread[order], start[order], dur[order]
    end = start + dur
    first = np.array([np.nonzero(thread == t)[0][0] for t in thread], np.int64)
    # THEN each parent is the latest earlier event of the thread whose end reaches past the event's
    need = end + (dur == 0)
    expected = [
        max((j for j in range(first[i], i) if end[j] >= need[i]), default=-1) for i in range(n)
    ]
    assert columnar.parents(start, end, dur, first).tolist() == expected


@pytest.mark.parametrize("shape", ["staircase", "nest", "siblings", "nest of siblings"])
def test_parents_equal_the_definition_on_long_chains(shape: str) -> None:
    # GIVEN 600 events shaped so that finding a parent means looking far back: each overlapping the
    # one before (no parents), each inside the one before (a deep nest), siblings under one parent,
    # or a nest whose every level holds siblings with children
    n = 600
    idx = np.arange(n, dtype=np.int64)
    if shape == "staircase":
        start, dur = idx * 10, np.full(n, 15, np.int64)
    elif shape == "nest":
        start, dur = idx, 2 * n - 2 * idx
    elif shape == "siblings":
        start, dur = idx * 10, np.r_[10 * n, np.full(n - 1, 5, np.int64)]
    else:
        start = np.sort(np.random.default_rng(0).integers(0, 4 * n, n))
        dur = np.maximum(4 * n - start, 1) * (idx % 3 == 0) + 1
    order = np.lexsort((-dur, start))
    start, dur = start[order], dur[order]
    end = start + dur
    first = np.zeros(n, np.int64)
    # THEN each parent is the latest earlier event whose end reaches past the event's
    need = end + (dur == 0)
    expected = [max((j for j in range(i) if end[j] >= need[i]), default=-1) for i in range(n)]
    assert columnar.parents(start, end, dur, first).tolist() == expected


@pytest.mark.parametrize("seed", range(20))
def test_unique_and_isin_equal_numpys(seed: int) -> None:
    # GIVEN integer arrays as the analysis has them: empty, one value, repeats, negatives, wide
    # ranges
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(0, 50)), int(rng.integers(0, 50))
    high = int(rng.choice([1, 5, 10**6, 2**62]))
    values = rng.integers(-high, high, n, dtype=np.int64)
    wanted = np.concatenate([rng.integers(-high, high, m, dtype=np.int64), values[: m // 2]])
    # THEN the sort-based helpers (no numpy.ma import) answer as np.unique and np.isin do
    assert columnar.unique(values).tolist() == np.unique(values).tolist()
    assert columnar.unique(values).dtype == values.dtype
    assert columnar.isin(values, wanted).tolist() == np.isin(values, wanted).tolist()


def _cut_gpu_trace() -> Trace:
    """Steps 1 and 2 complete, step 3 cut short; each step launches one kernel that runs after its
    launch (the kernel of step 2 runs on into step 3's time); step 3's kernel is a long one."""
    from stepcli.traces.read.events import EventArgs

    events: list[Event] = []
    for step, kernel_ms in ((1, 1.0), (2, 1.0), (3, 40.0)):
        start = step * 10_000.0
        events.append(
            Event(
                name=f"ProfilerStep#{step}",
                cat="user_annotation",
                pid=1,
                tid=1,
                ts=start,
                dur=10_000.0 if step < 3 else 500.0,
            )
        )
        events.append(
            Event(
                name="cudaLaunchKernel",
                cat="cuda_runtime",
                pid=1,
                tid=1,
                ts=start + 100,
                dur=5.0,
                args=EventArgs(correlation=step),
            )
        )
        events.append(
            Event(
                name="volta_sgemm",
                cat="kernel",
                pid=0,
                tid=7,
                # step 2's kernel ends inside step 3's time
                ts=start + (9_900.0 if step == 2 else 200.0),
                dur=kernel_ms * 1000,
                args=EventArgs(correlation=step),
            )
        )
    return Trace.from_events(events, incomplete_step=3)


def test_kernels_launched_in_the_cut_step_are_in_no_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a GPU trace whose window was cut short in step 3, which launched a 40 ms kernel
    trace = _cut_gpu_trace()
    # WHEN summarized
    data = merge_parts([summarize_file(trace)]).to_dict()
    # THEN only the two recorded steps' kernels count (it was 3 calls, 42 ms: 210% of the steps' 20
    # ms), the one of step 2 that ran on into step 3's time among them: the launch decides, not the
    # time
    (row,) = [r for r in data["device_kernels"] if r["name"] == "volta_sgemm"]
    assert (row["calls"], row["self_ms"]) == (2, 2.0)
    # AND the per-event reference agrees
    assert merge_parts([reference_part(trace, monkeypatch)]).to_dict() == data
