"""Unit tests of the pure summary on small hand-built traces with known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import assert_matches_key_averages

from stepcli.traces.analyses import traceanalysis as analysis_module
from stepcli.traces.analyses.mergeparts import summarize
from stepcli.traces.analyses.results import STUB_WHY
from stepcli.traces.read.events import Event
from stepcli.traces.read.tracereader import Trace, load_trace, rank_from_name

DATA = Path(__file__).resolve().parent.parent / "data"
T0 = 1_790_000_000_000.0  # an epoch-sized timestamp in microseconds, like real Kineto traces


def ev(
    name: str,
    ts: float,
    dur: float,
    *,
    cat: str = "cpu_op",
    tid: int = 1,
    pid: int = 100,
    shape: str = "",
) -> Event:
    """A complete ("X") event `ts` microseconds after T0."""
    return Event(name=name, cat=cat, ph="X", pid=pid, tid=tid, ts=T0 + ts, dur=dur, shape=shape)


def step(n: int, ts: float, dur: float, tid: int = 1) -> Event:
    return ev(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", tid=tid)


def ops(summary_dict: dict) -> dict[str, dict]:
    return {row["name"]: row for row in summary_dict["cpu_ops"]}


def test_self_time_subtracts_direct_children_only() -> None:
    # GIVEN a parent [0, 10) with children [1, 3) and [3, 4), and a grandchild [1, 2)
    trace = Trace.from_events([ev("parent", 0, 10), ev("a", 1, 2), ev("g", 1, 1), ev("b", 3, 1)])
    # WHEN summarized
    rows = ops(summarize([trace]).to_dict())
    # THEN self = total - direct children, like key_averages()
    assert rows["parent"]["self_ms"] == pytest.approx(0.007)
    assert rows["parent"]["total_ms"] == pytest.approx(0.010)
    assert rows["a"]["self_ms"] == pytest.approx(0.001)
    assert rows["g"]["self_ms"] == pytest.approx(0.001)
    assert rows["b"]["avg_ms"] == pytest.approx(0.001)
    assert sum(r["self_share"] for r in rows.values()) == pytest.approx(1.0)


def test_child_ending_with_parent_nests_at_epoch_timestamps() -> None:
    # A float cannot tell nanoseconds apart at epoch magnitudes; the summary must still see this
    # exact nesting.
    trace = Trace.from_events([ev("parent", 0.001, 5.432), ev("child", 2.222, 3.211)])
    rows = ops(summarize([trace]).to_dict())
    assert rows["parent"]["self_ms"] == pytest.approx(0.002221)


def test_partial_overlap_and_other_threads_do_not_nest() -> None:
    trace = Trace.from_events(
        [ev("a", 0, 10), ev("overlaps", 5, 10), ev("other-thread", 1, 2, tid=2)]
    )
    rows = ops(summarize([trace]).to_dict())
    assert rows["a"]["self_ms"] == pytest.approx(0.010)
    assert rows["overlaps"]["self_ms"] == pytest.approx(0.010)


def test_only_child_with_same_name_is_folded_like_torch() -> None:
    # torch's _remove_dup_nodes: add_ -> add_ (only child) -> x counts as one add_ call whose child
    # is x.
    trace = Trace.from_events([ev("aten::add_", 0, 10), ev("aten::add_", 1, 8), ev("x", 2, 3)])
    rows = ops(summarize([trace]).to_dict())
    assert rows["aten::add_"]["calls"] == 1
    assert rows["aten::add_"]["self_ms"] == pytest.approx(0.007)
    assert rows["aten::add_"]["total_ms"] == pytest.approx(0.010)
    # two same-name children are not folded
    trace = Trace.from_events([ev("f", 0, 10), ev("f", 1, 2), ev("f", 4, 2)])
    assert ops(summarize([trace]).to_dict())["f"]["calls"] == 3


def test_utility_events_torch_filters_count_as_parent_self_time() -> None:
    trace = Trace.from_events([ev("op", 0, 10), ev("aten::is_leaf", 1, 4)])
    rows = ops(summarize([trace]).to_dict())
    assert "aten::is_leaf" not in rows
    assert rows["op"]["self_ms"] == pytest.approx(0.010)


def test_steps_are_folded_into_one_row_and_listed_per_step() -> None:
    trace = Trace.from_events([step(3, 0, 100), step(4, 100, 300), ev("op", 10, 5)], rank=None)
    data = summarize([trace]).to_dict()
    assert ops(data)["ProfilerStep*"]["calls"] == 2
    assert data["steps"] == [
        {"rank": None, "process": "pid 100", "step": 3, "dur_ms": 0.1},
        {"rank": None, "process": "pid 100", "step": 4, "dur_ms": 0.3},
    ]
    assert data["step_ms"]["count"] == 2 and data["step_ms"]["mean"] == pytest.approx(0.2)
    assert [(r["process"], r["files"], r["step_ms"]) for r in data["ranks"]] == [
        ("pid 100", ["<memory>"], data["step_ms"])
    ]
    assert data["slowest_rank"] is None


def test_breakdown_on_one_thread() -> None:
    # GIVEN a 100 us step: dataloader 10, zero_grad 2, forward ops 20 + 1, backward 20, optimizer
    # 20, gaps 27
    events = [
        step(1, 0, 100),
        ev(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            1,
            10,
            cat="user_annotation",
        ),
        ev("Optimizer.zero_grad#SGD.zero_grad", 11, 2, cat="user_annotation"),
        ev("aten::linear", 15, 20),
        ev("aten::addmm", 16, 10),  # nested in linear: forward time is not counted twice
        ev("autograd::engine::evaluate_function: AddmmBackward0", 40, 20),
        ev("aten::mm", 41, 5),
        # after backward started, no phase: still forward (the program's own ops)
        ev("aten::add_", 65, 1),
        ev("Optimizer.step#SGD.step", 70, 20, cat="user_annotation"),
    ]
    data = summarize([Trace.from_events(events)]).to_dict()
    assert data["breakdown_ms"] == pytest.approx(
        {
            "dataloader": 0.010,
            "forward": 0.021,
            "backward": 0.020,
            "optimizer": 0.022,
            "other": 0.027,
        }
    )
    assert data["device"] is None


@pytest.mark.parametrize("engine", ["arrays", "reference"])
def test_annotating_a_phase_moves_none_of_its_time_to_forward(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # GIVEN the step of test_breakdown_on_one_thread, with the user's `## forward ##`, `## backward
    # ##` (around the backward and its gaps, two deep) and `## optimizer ##` annotations, as the
    # PyTorch profiler recipe writes them
    events = [
        step(1, 0, 100),
        ev(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            1,
            10,
            cat="user_annotation",
        ),
        ev("## forward ##", 14, 23, cat="user_annotation"),
        ev("aten::linear", 15, 20),
        ev("aten::addmm", 16, 10),
        ev("## backward ##", 38, 30, cat="user_annotation"),
        ev("loss_scaler", 39, 28, cat="user_annotation"),
        ev("autograd::engine::evaluate_function: AddmmBackward0", 40, 20),
        ev("aten::mm", 41, 5),
        # no phase of its own, inside the wrapper: an operator of its own
        ev("aten::ones_like", 62, 2),
        ev("## optimizer ##", 69, 30, cat="user_annotation"),
        ev("Optimizer.step#SGD.step", 70, 20, cat="user_annotation"),
    ]
    if engine == "reference":
        monkeypatch.setattr(analysis_module, "_analyze_columns", _step_aside)
    data = summarize([Trace.from_events(events)]).to_dict()
    # THEN backward's and the optimizer's wrappers hold no forward: only `## forward ##` (23) and
    # ones_like (2)
    assert data["breakdown_ms"] == pytest.approx(
        {
            "dataloader": 0.010,
            "forward": 0.025,
            "backward": 0.020,
            "optimizer": 0.020,
            "other": 0.025,
        }
    )


@pytest.mark.parametrize("engine", ["arrays", "reference"])
def test_a_backward_annotation_with_the_engine_on_its_own_thread_holds_no_forward(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # GIVEN (as in CUDA traces) the user's `## backward ##` on the main thread around the engine's
    # work, which runs on the autograd engine's own thread: nothing of backward is below the
    # annotation
    events = [
        step(1, 0, 100),
        ev("aten::linear", 5, 25),
        ev("## backward ##", 35, 50, cat="user_annotation"),
        ev("aten::ones_like", 36, 2),  # the program's own operator inside it: still forward
        ev("autograd::engine::evaluate_function: MmBackward0", 40, 20, tid=2),
        ev("autograd::engine::evaluate_function: MmBackward0", 65, 15, tid=2),
    ]
    if engine == "reference":
        monkeypatch.setattr(analysis_module, "_analyze_columns", _step_aside)
    data = summarize([Trace.from_events(events)]).to_dict()
    # THEN the gaps between the engine's events inside the annotation are `other`, as without the
    # annotation (it was forward: 25 + 50 - 35 = 40 us)
    assert data["breakdown_ms"] == pytest.approx(
        {"dataloader": 0.0, "forward": 0.027, "backward": 0.035, "optimizer": 0.0, "other": 0.038}
    )


@pytest.mark.parametrize("engine", ["arrays", "reference"])
def test_forward_and_backward_in_an_optimizer_closure_are_forward_and_backward(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # GIVEN `optimizer.step(closure)` as LBFGS runs it: inside Optimizer.step#, the agent's closure
    # range twice (zero_grad, forward 20, backward 20 on the main thread), the optimizer's own work
    # (5) between and after
    closure = "stepcli: optimizer closure"
    events = [
        step(1, 0, 100),
        ev("Optimizer.step#LBFGS.step", 2, 96, cat="user_annotation"),
        ev(closure, 3, 44, cat="user_annotation"),
        ev("Optimizer.zero_grad#LBFGS.zero_grad", 4, 1, cat="user_annotation"),
        ev("aten::linear", 6, 20),
        ev("aten::addmm", 7, 10),
        ev("autograd::engine::evaluate_function: AddmmBackward0", 26, 20),
        ev("aten::dot", 48, 5),  # the optimizer's own work, between the closure's calls
        ev(closure, 54, 43, cat="user_annotation"),
        ev("aten::linear", 55, 20),
        ev("autograd::engine::evaluate_function: AddmmBackward0", 76, 20),
    ]
    if engine == "reference":
        monkeypatch.setattr(analysis_module, "_analyze_columns", _step_aside)
    data = summarize([Trace.from_events(events)]).to_dict()
    # THEN (it was optimizer 96, backward 0, forward 0) forward 40, backward 40, the optimizer what
    # is left of its 96: zero_grad 1 and its own time outside the closures (1 + 1 + 6 + 1 = 9 of it,
    # with the dot)
    assert data["breakdown_ms"] == pytest.approx(
        {"dataloader": 0.0, "forward": 0.040, "backward": 0.040, "optimizer": 0.010, "other": 0.010}
    )


@pytest.mark.parametrize("engine", ["arrays", "reference"])
def test_backward_nested_in_an_optimizer_step_without_the_agent_is_backward(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # GIVEN a plain torch.profiler trace of a closure step (no agent range), and a step run from a
    # gradient hook (an optimizer event inside a backward event: the innermost phase decides)
    events = [
        step(1, 0, 100),
        ev("Optimizer.step#SGD.step", 2, 50, cat="user_annotation"),
        ev("aten::linear", 6, 20),
        ev("autograd::engine::evaluate_function: AddmmBackward0", 26, 20),
        ev("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 60, 30),
        ev("Optimizer.step#SGD.step", 62, 20, cat="user_annotation"),
    ]
    if engine == "reference":
        monkeypatch.setattr(analysis_module, "_analyze_columns", _step_aside)
    data = summarize([Trace.from_events(events)]).to_dict()
    # THEN the nested backward is backward (it was optimizer); the closure's forward is the
    # optimizer's, unknowable
    assert data["breakdown_ms"] == pytest.approx(
        {"dataloader": 0.0, "forward": 0.0, "backward": 0.030, "optimizer": 0.050, "other": 0.020}
    )


def test_breakdown_with_backward_on_the_autograd_thread_and_device_busy() -> None:
    # GIVEN (as in CUDA traces) backward ops on their own thread, and kernels on the device timeline
    events = [
        step(7, 0, 100),
        ev("aten::linear", 5, 25),
        ev("autograd::engine::evaluate_function: MmBackward0", 40, 30, tid=2),
        # runs past the step's end
        ev("autograd::engine::evaluate_function: MmBackward0", 90, 30, tid=2),
        ev("Optimizer.step#Adam.step", 80, 15, cat="user_annotation"),
        ev("gemm_kernel", 10, 20, cat="kernel", pid=0, tid=7),
        ev("gemm_kernel", 20, 20, cat="kernel", pid=0, tid=7),
        ev("Memcpy HtoD", 90, 30, cat="gpu_memcpy", pid=0, tid=8),
    ]
    data = summarize([Trace.from_events(events)]).to_dict()
    # optimizer claims 80-95 first; backward gets 40-70 and 95-100 (clipped to the step)
    assert data["breakdown_ms"] == pytest.approx(
        {"dataloader": 0.0, "forward": 0.025, "backward": 0.035, "optimizer": 0.015, "other": 0.025}
    )
    assert sum(data["breakdown_ms"].values()) == pytest.approx(data["step_ms"]["mean"])
    # union of device work inside the step: 10-40 and 90-100
    busy = {key: data["device"][key] for key in ("busy_ms", "busy_share")}
    assert busy == pytest.approx({"busy_ms": 0.040, "busy_share": 0.4})
    kernels = {r["name"]: r for r in data["device_kernels"]}
    assert kernels["gemm_kernel"]["calls"] == 2 and kernels["gemm_kernel"][
        "self_ms"
    ] == pytest.approx(0.040)
    assert kernels["Memcpy HtoD"]["total_ms"] == pytest.approx(0.030)
    assert "gemm_kernel" not in ops(data)


def test_no_steps_means_no_breakdown_but_device_share_over_the_trace() -> None:
    events = [ev("op", 0, 100), ev("k", 0, 25, cat="kernel", pid=0, tid=7)]
    data = summarize([Trace.from_events(events)]).to_dict()
    assert data["steps"] == [] and data["step_ms"] is None and data["breakdown_ms"] is None
    assert data["device"]["busy_share"] == pytest.approx(0.25)


@pytest.mark.parametrize("engine", ["arrays", "reference"])
def test_the_profilers_closing_stub_is_left_out_by_what_it_holds(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    if engine == "reference":
        monkeypatch.setattr(analysis_module, "_analyze_columns", _step_aside)
    # GIVEN steps 2 and 3 with the program's operators, and a last step 4 with none (the profiler's
    # stop stub)
    work = [step(2, 0, 100), ev("aten::mm", 10, 50), step(3, 100, 100), ev("aten::mm", 110, 50)]
    data = summarize([Trace.from_events([*work, step(4, 200, 0.017)], path="t.json")]).to_dict()
    # THEN it is in no step figure, and the JSON says so
    assert [s["step"] for s in data["steps"]] == [2, 3] and data["step_ms"]["min"] == pytest.approx(
        0.1
    )
    assert data["left_out_steps"] == [{"file": "t.json", "step": 4, "why": STUB_WHY}]
    # BUT a last step as short that holds an operator is a step; so is an empty one while another
    # thread of its process still works after its start, or when no step holds any operator (nothing
    # says this one lacks any), or one as long as the step before it
    for events in (
        [*work, step(4, 200, 0.017), ev("aten::add", 200.001, 0.01)],
        [*work, step(4, 200, 0.017), ev("aten::add", 201, 5, tid=2)],
        [step(2, 0, 100), step(3, 100, 100), step(4, 200, 0.017)],
        [*work, step(4, 200, 100)],
    ):
        kept = summarize([Trace.from_events(events, path="t.json")]).to_dict()
        assert [s["step"] for s in kept["steps"]] == [2, 3, 4] and kept["left_out_steps"] == []


def test_ranks_and_slowest_rank() -> None:
    fast = Trace.from_events([step(1, 0, 100), step(2, 100, 100)], path="rank0.json", rank=0)
    slow = Trace.from_events([step(1, 0, 150), step(2, 150, 130)], path="rank1.json", rank=1)
    data = summarize([fast, slow]).to_dict()
    assert data["slowest_rank"] is None and data["straggler"] is None  # 2 steps are no evidence
    assert [(r["rank"], r["file"], r["step_ms"]["count"]) for r in data["ranks"]] == [
        (0, "rank0.json", 2),
        (1, "rank1.json", 2),
    ]
    assert [(s["rank"], s["step"]) for s in data["steps"]] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert data["step_ms"]["count"] == 4 and data["step_ms"]["max"] == pytest.approx(0.15)
    assert data["files"] == ["rank0.json", "rank1.json"]


def test_rank_from_file_name() -> None:
    assert rank_from_name("/runs/rank3.1795317190328144397.pt.trace.json") == 3
    assert rank_from_name("host_rank_12.json.gz") == 12
    assert rank_from_name("vm_1234.1795.pt.trace.json") is None


def test_group_by_shape_splits_rows() -> None:
    events = [
        ev("aten::mm", 0, 10, shape="[[2, 3], [3, 4]]"),
        ev("aten::mm", 20, 30, shape="[[8, 3], [3, 4]]"),
        ev("aten::mm", 60, 10, shape="[[2, 3], [3, 4]]"),
    ]
    rows = summarize([Trace.from_events(events)], group_by_shape=True).to_dict()["cpu_ops"]
    assert [(r["shape"], r["calls"]) for r in rows] == [
        ("[[8, 3], [3, 4]]", 1),
        ("[[2, 3], [3, 4]]", 2),
    ]
    assert "shape" not in summarize([Trace.from_events(events)]).to_dict()["cpu_ops"][0]


def test_incomplete_step_is_left_out_of_step_times() -> None:
    # GIVEN steps 2 and 3, and a step 4 that holds only the start of its step (a window cut short)
    events = [
        step(2, 0, 100),
        ev("aten::mm", 10, 50),
        step(3, 100, 100),
        ev("aten::mm", 110, 50),
        step(4, 200, 5),
        ev("aten::mm", 201, 3),
    ]
    data = summarize(
        [Trace.from_events(events, path="rank0.json", rank=0, incomplete_step=4)]
    ).to_dict()
    # THEN step 4 is in no step figure: steps, step statistics, the rank's statistics, the breakdown
    assert [s["step"] for s in data["steps"]] == [2, 3]
    assert data["step_ms"]["count"] == 2 and data["step_ms"]["min"] == pytest.approx(0.1)
    assert data["ranks"][0]["step_ms"] == data["step_ms"]
    assert sum(data["breakdown_ms"].values()) == pytest.approx(0.1)
    # AND the operator tables count the recorded steps' events only: step 4 and its operator are
    # outside them
    assert ops(data)["aten::mm"]["calls"] == 2 and ops(data)["ProfilerStep*"]["calls"] == 2
    assert data["outside_steps"]["events"] == 2
    # Another rank's step 4 is complete: only the marked trace loses it
    other = Trace.from_events([step(3, 0, 100), step(4, 100, 100)], path="rank1.json", rank=1)
    both = summarize(
        [Trace.from_events(events, path="rank0.json", rank=0, incomplete_step=4), other]
    ).to_dict()
    assert [(s["rank"], s["step"]) for s in both["steps"]] == [(0, 2), (0, 3), (1, 3), (1, 4)]


def test_skipped_events_are_counted_over_traces() -> None:
    bad = Event(name="bad", cat="cpu_op", ph="X", ts=T0, dur=float("inf"))
    traces = [
        Trace.from_events([ev("op", 0, 1), bad]),
        Trace.from_events([bad, bad, ev("op", 0, 1)]),
    ]
    data = summarize(traces).to_dict()
    assert data["skipped_events"] == 3 and ops(data)["op"]["calls"] == 2


def test_to_dict_has_the_contract_keys_and_is_json() -> None:
    data = summarize([Trace.from_events([step(1, 0, 10), ev("op", 1, 2)])]).to_dict()
    assert list(data) == [
        "files",
        "step_ms",
        "steps",
        "ranks",
        "slowest_rank",
        "breakdown_ms",
        "device",
        "cpu_ops",
        "device_kernels",
        "events",
        "skipped_events",
        "share_of",
        "straggler",
        "outside_steps",
        "flops",
        "culprit",
        "repeated_ranks",
        "mixed_jobs",
        "left_out_steps",
        "other_ms",
        "recorded_with",
        "python_stacks",
    ]
    assert set(data["cpu_ops"][0]) == {
        "name",
        "calls",
        "self_ms",
        "total_ms",
        "avg_ms",
        "self_share",
    }
    assert set(data["breakdown_ms"]) == {"dataloader", "forward", "backward", "optimizer", "other"}
    assert data["events"] == 2 and data["skipped_events"] == 0
    assert data["outside_steps"] == {"events": 0, "self_ms": 0.0}
    json.dumps(data)


def test_table_json_text_is_what_orjson_wrote() -> None:
    # GIVEN summaries of real traces (CPU; CUDA with device figures) and one with odd names and
    # numbers
    import orjson

    from stepcli.traces.render.formats import json_text

    odd = Trace.from_events([step(1, 0, 10), ev('op \x1b[2J \u202e é "q" \\ </script>', 1, 2)])
    summaries = [
        summarize([load_trace(str(DATA / name))])
        for name in ("train_cpu.pt.trace.json", "cuda_small.pt.trace.json.gz")
    ]
    for data in [s.to_dict() for s in [*summaries, summarize([odd])]] + [
        {"nan": math.nan, "big": 2**63, "tiny": 1e-7}
    ]:
        # THEN `table --json` (msgspec, no orjson import) writes the text orjson wrote, byte for
        # byte
        assert json_text(data) == orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"


def test_empty_input() -> None:
    data = summarize([]).to_dict()
    assert data["cpu_ops"] == [] and data["step_ms"] is None and data["events"] == 0


def test_real_trace_matches_torch_key_averages() -> None:
    # The fixture pair comes from plain torch.profiler (scripts/make_fixture_traces.py).
    expected = json.loads((DATA / "train_cpu.key_averages.json").read_text())
    data = summarize([load_trace(str(DATA / "train_cpu.pt.trace.json"))]).to_dict()
    assert_matches_key_averages(data["cpu_ops"], expected)


def test_every_forward_counts_whatever_the_order() -> None:
    # GIVEN a 100 us step with two micro-batches: forward 10, backward 20, forward 10, backward 20,
    # optimizer 10
    events = [
        step(1, 0, 100),
        ev("aten::linear", 0, 10),
        ev("autograd::engine::evaluate_function: AddmmBackward0", 10, 20),
        ev("aten::linear", 30, 10),
        # the autograd engine's thread
        ev("autograd::engine::evaluate_function: AddmmBackward0", 40, 20, tid=2),
        ev("Optimizer.step#SGD.step", 70, 10, cat="user_annotation"),
    ]
    data = summarize([Trace.from_events(events)]).to_dict()
    # THEN both forwards count, and "other" is only the 30 us that is none of them
    assert data["breakdown_ms"] == pytest.approx(
        {"dataloader": 0.0, "forward": 0.020, "backward": 0.040, "optimizer": 0.010, "other": 0.030}
    )


def test_python_frames_are_no_operators_and_addresses_are_stripped() -> None:
    events = [
        step(1, 0, 100),
        ev("train.py(12): <module>", 0, 100, cat="python_function"),
        ev(
            "<built-in method mul_ of Parameter object at 0x7fd0a1b2c3d0>",
            5,
            10,
            cat="python_function",
        ),
        ev("aten::mul_", 6, 8),
        ev("record_function at 0x7f00aa", 20, 5, cat="user_annotation"),
    ]
    data = summarize([Trace.from_events(events)]).to_dict()
    assert set(ops(data)) == {"ProfilerStep*", "aten::mul_", "record_function"}
    # the op under a Python frame is still the step's forward work
    assert data["breakdown_ms"]["forward"] == pytest.approx(0.013)


def test_shares_are_of_the_recorded_step_time() -> None:
    # GIVEN two 100 us steps holding 50 us and 30 us of operators
    events = [step(1, 0, 100), ev("a", 10, 50), step(2, 100, 100), ev("b", 110, 30)]
    data = summarize([Trace.from_events(events)]).to_dict()
    # THEN each share is of the 200 us of steps, and the rows with ProfilerStep* add up to 100%
    assert ops(data)["a"]["self_share"] == pytest.approx(0.25)
    assert ops(data)["b"]["self_share"] == pytest.approx(0.15)
    assert sum(r["self_share"] for r in data["cpu_ops"]) == pytest.approx(1.0)
    assert data["share_of"] == "recorded step time (2 steps)"


def test_windows_of_one_process_are_one_row_and_processes_never_merge_steps() -> None:
    # GIVEN two windows of pid 100 and one trace of pid 200 reusing step numbers (two runs in one
    # folder)
    first = Trace.from_events([step(1, 0, 100), step(2, 100, 100)], path="a.json")
    second = Trace.from_events([step(5, 500, 100)], path="b.json")
    other = Trace.from_events(
        [ev("ProfilerStep#1", 0, 300, cat="user_annotation", pid=200)], path="c.json"
    )
    data = summarize([first, second, other]).to_dict()
    # THEN one row per process, its windows inside labelled by their steps, and step 1 twice
    assert [(r["process"], [w["steps"] for w in r["windows"]]) for r in data["ranks"]] == [
        ("pid 100", ["steps 1-2", "step 5"]),
        ("pid 200", ["step 1"]),
    ]
    assert [(s["process"], s["step"]) for s in data["steps"]] == [
        ("pid 100", 1),
        ("pid 100", 2),
        ("pid 100", 5),
        ("pid 200", 1),
    ]
    assert data["slowest_rank"] is None


def test_straggler_is_named_by_compute_not_step_time() -> None:
    # GIVEN equal 100 us steps: rank 0 computes 20 and waits 80 in all_reduce, rank 1 computes 90
    # and waits 10
    def rank(r: int, compute: float, steps: int = 12, jitter: float = 0.0) -> Trace:
        events = []
        for n in range(steps):
            c = compute + jitter * ((n * 7 + r * 3) % 5 - 2)
            events += [
                step(n + 1, n * 100, 100),
                ev("aten::mm", n * 100, c),
                ev("c10d::allreduce_", n * 100 + c, 100 - c),
            ]
        return Trace.from_events(events, path=f"rank{r}.json", rank=r)

    # 2 steps are no evidence; a balanced run whose ranks differ by step-to-step noise names nobody
    assert summarize([rank(0, 20, steps=2), rank(1, 90, steps=2)]).to_dict()["slowest_rank"] is None
    balanced = summarize([rank(0, 50, jitter=10), rank(1, 50, jitter=10)]).to_dict()
    assert balanced["slowest_rank"] is None and balanced["straggler"] is None
    data = summarize([rank(0, 20), rank(1, 90)]).to_dict()
    assert [(r["rank"], r["compute_ms"], r["comm_ms"]) for r in data["ranks"]] == [
        (0, pytest.approx(0.02), pytest.approx(0.08)),
        (1, pytest.approx(0.09), pytest.approx(0.01)),
    ]
    assert data["slowest_rank"] == 1
    assert data["straggler"]["evidence"].startswith(
        "rank 1: compute 0.09 ms/step vs median 0.02 ms of the other ranks, more in 12 of 12 "
        "common steps"
    )
    # the wait is neither forward nor any other phase
    assert data["breakdown_ms"]["other"] == pytest.approx((0.08 + 0.01) / 2)


def _step_aside(*_args: object, **_kwargs: object) -> None:
    from stepcli.traces.analyses import arrays

    raise arrays.TooLarge


@pytest.mark.parametrize("engine", ["arrays", "reference"])
def test_a_trace_whose_only_step_was_cut_short_shows_its_operators_and_no_step(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # GIVEN a window cut short in its first step: ProfilerStep#0 holds only the start of that step
    events = [
        step(0, 0, 100),
        ev("aten::linear", 10, 40),
        ev("aten::addmm", 12, 30),
        ev("aten::sum", 60, 20),
    ]
    if engine == "reference":
        monkeypatch.setattr(analysis_module, "_analyze_columns", _step_aside)
    data = summarize([Trace.from_events(events, incomplete_step=0)]).to_dict()
    # THEN no step figure, and the operators of the whole trace without the cut step itself (it was
    # a `ProfilerStep*` row of 40 us self time, 133% of the operators' 30 us, and the shares added
    # up to 233%)
    assert data["steps"] == [] and data["step_ms"] is None
    assert sorted(ops(data)) == ["aten::addmm", "aten::linear", "aten::sum"]
    assert sum(row["self_share"] for row in data["cpu_ops"]) == pytest.approx(1.0)
    assert data["outside_steps"]["events"] == 0


def test_traces_of_different_jobs_are_named_with_their_folders_when_names_repeat() -> None:
    import types

    from stepcli.traces.analyses.mergeparts import mixed_jobs_note

    def part(path: str, size: int | None) -> types.SimpleNamespace:
        return types.SimpleNamespace(path=path, world_size=size, device_name=None)

    # GIVEN two runs' folders with the same per-rank file names, of jobs of 2 and 8 ranks
    note = mixed_jobs_note(
        [part("runA/rank0.json", 2), part("runA/rank1.json", 2), part("runB/rank0.json", 8)]
    )
    # THEN each size names its files with their folder
    assert (
        note is not None
        and "world size 2 in runA/rank0.json, runA/rank1.json, 8 in runB/rank0.json" in note
    )
    # AND one job (or traces that do not say) is no mix
    assert mixed_jobs_note([part("a/rank0.json", 2), part("a/rank1.json", None)]) is None
