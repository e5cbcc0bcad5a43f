"""Collectives matched by process group (stepcli.traces.analyses.arrivals,
stepcli.traces.analyses.culprit) on synthetic NCCL-style traces of 4 ranks in tensor- and
data-parallel groups (tests/nccl_groups.py): each collective is matched among its group's members
only, the culprit is found inside its group, and ranks outside a group are never charged a wait."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nccl_groups import SEQ_BASE, STEPS, rank_trace, write_group_traces

from stepcli.advice.culpritadvice import culprit_advice
from stepcli.traces.analyses.arrivals import RankArrivals, members, rank_arrivals
from stepcli.traces.analyses.culprit import analyze
from stepcli.traces.read.columns import load_columns
from stepcli.traces.read.splitread import join
from stepcli.traces.read.tracereader import load_trace
from stepcli.traces.read.typedcolumns import columns_from_events

GROUPS = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}


def _arrivals(folder: Path, **options: Any) -> list[RankArrivals]:
    out = []
    for path in write_group_traces(folder, **options):
        trace = load_columns(str(path))
        found = rank_arrivals(trace.columns, trace.rank)
        assert found is not None
        out.append(found)
    return out


def _section(folder: Path, **options: Any) -> dict[str, Any]:
    section = analyze(_arrivals(folder, **options), 90.0)
    assert section is not None
    return section


def test_arrivals_carry_the_process_group_and_its_sequence_number(tmp_path: Path) -> None:
    rank3 = _arrivals(tmp_path)[3]
    assert rank3.group_table == [("2", (2, 3)), ("4", (1, 3))]
    assert rank3.groups == [0, 1] * STEPS
    # (step, name, seq, order): TP then DP in each step, at the groups' own sequence numbers
    assert rank3.keys[:4] == [
        (0, "c10d::allreduce_", SEQ_BASE, 0),
        (0, "c10d::allreduce_", SEQ_BASE, 0),
        (1, "c10d::allreduce_", SEQ_BASE + 1, 0),
        (1, "c10d::allreduce_", SEQ_BASE + 1, 0),
    ]
    assert rank3.arrive_us[0] == pytest.approx(35_230)
    assert rank3.depart_us[0] == pytest.approx(36_230)  # the NCCL kernel's end


def _check_late_rank_3(section: dict[str, Any]) -> None:
    """Rank 3 idles 30 ms before its TP all-reduce (see tests/nccl_groups.py for the timeline)."""
    assert section["collectives"] == 4 * STEPS and section["steps"] == STEPS
    assert section["process_groups"] == GROUPS
    found = section["culprit"]
    assert found is not None and found["rank"] == 3 and found["last_share"] == 1.0
    # last at TP "2" by 30.01 ms (rank 2 waits) and at DP "4" by 30.04 ms (rank 1 waits)
    assert found["lateness_ms_per_step"] == pytest.approx(60.05, abs=0.01)
    assert found["wait_caused_ms_per_step"] == pytest.approx(60.05, abs=0.01)
    assert found["cause"] == "no_operator" and found["cause_ms_per_step"] == pytest.approx(
        30.0, abs=0.1
    )
    rows = {row["rank"]: row for row in section["ranks"]}
    # each rank waits only at its own groups' collectives: rank 0 for rank 2 at DP "3" (30.04) and
    # for rank 1 at TP "1" (0.01); never for rank 3, with which it shares no group
    assert rows[0]["waited_ms_per_step"] == pytest.approx(30.05, abs=0.005)
    assert rows[1]["waited_ms_per_step"] == pytest.approx(30.04, abs=0.005)
    assert rows[2]["waited_ms_per_step"] == pytest.approx(30.01, abs=0.005)
    assert rows[3]["waited_ms_per_step"] == pytest.approx(0.0, abs=0.005)
    # released late at DP "3"
    assert rows[2]["times_last"] == STEPS and rows[2]["last_share"] == 0.5
    for collective in section["per_collective"]:
        members = GROUPS[collective["group"]]
        assert sorted(int(r) for r in collective["arrive_us"]) == members
        assert sorted(int(r) for r in collective["waits_ms"]) == [
            r for r in members if r != collective["last_rank"]
        ]
        if collective["group"] == "2":
            assert collective["last_rank"] == 3 and collective["lateness_ms"] == pytest.approx(
                30.01, abs=0.001
            )
            assert collective["waits_ms"] == {"2": pytest.approx(30.01, abs=0.001)}


def test_late_rank_inside_its_tensor_parallel_group(tmp_path: Path) -> None:
    section = _section(tmp_path)
    _check_late_rank_3(section)
    assert {c["seq"] for c in section["per_collective"]} == set(range(SEQ_BASE, SEQ_BASE + STEPS))
    # rank 3 is aligned through rank 1 (two 1 µs floors), rank 2 directly: the two largest errors
    # summed
    assert section["alignment"]["errors_ms"] == {"0": 0.0, "1": 0.001, "2": 0.001, "3": 0.002}
    assert section["alignment"]["error_ms"] == pytest.approx(0.003)


def test_without_sequence_numbers_the_order_on_each_group(tmp_path: Path) -> None:
    """Older torch writes the group but no `Seq`: collectives are matched by their order on the
    group."""
    section = _section(tmp_path, seq=False)
    _check_late_rank_3(section)
    assert {c["seq"] for c in section["per_collective"]} == {None}


def test_cut_short_member_lists_take_the_ranks_that_have_the_group(tmp_path: Path) -> None:
    """torch writes at most 30 ranks ("[0, 1, ..., 63]"): the members are then the ranks whose
    traces have it."""
    section = _section(tmp_path, ranks_text=lambda ranks: f"[{ranks[0]}, ..., {ranks[-1]}]")
    _check_late_rank_3(section)


def test_ranks_sharing_no_group_are_aligned_through_those_that_do(tmp_path: Path) -> None:
    # ranks 0 and 3 meet at no collective: rank 3 is aligned through rank 1 (TP "1", then DP "4")
    section = _section(tmp_path, offset={3: -250_000.0, 2: 40_000.0, 1: 7_000.0})
    offsets = section["alignment"]["offsets_ms"]
    assert offsets == {
        "0": 0.0,
        "1": pytest.approx(7.0),
        "2": pytest.approx(40.0),
        "3": pytest.approx(-250.0),
    }
    assert section["alignment"]["errors_ms"]["3"] == pytest.approx(0.002)  # two hops, 1 µs each
    _check_late_rank_3(section)


def test_the_rank_of_another_group_is_not_the_culprit(tmp_path: Path) -> None:
    """Rank 0 late before TP "1": it holds back rank 1 there, and (released late) rank 1 holds back
    rank 3 at DP "4"; ranks 2 and 3's TP group is on time, and they wait for nobody but through
    DP."""
    section = _section(tmp_path, late_rank=0)
    found = section["culprit"]
    assert found is not None and found["rank"] == 0
    tp2 = [c for c in section["per_collective"] if c["group"] == "2"]
    assert all(c["lateness_ms"] < 0.02 for c in tp2)


def test_member_lists() -> None:
    assert members("[0, 1, 2, 3]") == (0, 1, 2, 3)
    assert members("[3,1]") == (1, 3)
    assert members("[0, 1, ..., 63]") == ()
    assert members("") == () and members("0, 1") == ()


def test_group_args_survive_every_reading_path(tmp_path: Path) -> None:
    """The typed reader, the per-event reference's columns, split reads joined, and the lenient
    reader (a trace with a field of an odd type) all keep the collectives' process groups."""
    path = write_group_traces(tmp_path / "plain")[1]
    typed = load_columns(str(path)).columns
    assert sorted(typed.groups.values())[0] == ("1", SEQ_BASE, "[0, 1]")
    events = load_trace(str(path)).events
    reference = columns_from_events(events)
    assert sorted(reference.groups.values()) == sorted(typed.groups.values())
    again = columns_from_events(reference.to_events())  # (the reference's round trip)
    assert again.groups == reference.groups
    half = len(events) // 2
    joined = join([columns_from_events(events[:half]), columns_from_events(events[half:])])
    assert joined.groups == reference.groups
    # "Group size" as text sends the file down the lenient path
    document = rank_trace(1)
    for event in document["traceEvents"]:
        if "Group size" in event.get("args", {}):
            event["args"]["Group size"] = "2"
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(document))
    assert sorted(load_columns(str(odd)).columns.groups.values()) == sorted(
        reference.groups.values()
    )


def test_without_groups_the_order_among_all_ranks_as_before(tmp_path: Path) -> None:
    """A world-wide group only (every rank a member): the same figures with or without its args."""
    folder = tmp_path / "world"
    parts = []
    for rank in range(4):
        document = rank_trace(rank)
        # keep the DP all-reduces only (each one's events start within 20 µs), and make them one
        # world group "0"
        events = document["traceEvents"]
        tp = [
            e["ts"]
            for e in events
            if e["name"] == "record_param_comms" and e["args"]["Process Group Name"] < "3"
        ]
        events = [e for e in events if not any(-5 <= e["ts"] - t <= 15 for t in tp)]
        for event in events:
            if "Process Group Name" in event.get("args", {}):
                event["args"]["Process Group Name"], event["args"]["Process Group Ranks"] = (
                    "0",
                    "[0, 1, 2, 3]",
                )
        document["traceEvents"] = events
        folder.mkdir(exist_ok=True)
        (folder / f"rank{rank}.json").write_text(json.dumps(document))
        trace = load_columns(str(folder / f"rank{rank}.json"))
        found = rank_arrivals(trace.columns, trace.rank)
        assert found is not None
        parts.append(found)
    grouped = analyze(parts, 90.0)
    for part in parts:
        part.groups = [-1] * len(part.keys)
        part.keys = [(step, name, -1, order) for step, name, _, order in part.keys]
    plain = analyze(parts, 90.0)
    assert grouped is not None and plain is not None
    assert grouped["process_groups"] == {"0": [0, 1, 2, 3]} and plain["process_groups"] == {}
    for section in (grouped, plain):
        del section["process_groups"]
        for collective in section["per_collective"]:
            del collective["group"], collective["seq"]
    assert grouped == plain


def test_kernels_pair_with_the_collective_that_launched_them(tmp_path: Path) -> None:
    """Two groups' collectives issued back to back, each kernel on its group's own stream: the
    second one's kernel starts first. Each collective leaves when the kernel its launch (same
    correlation id) started ends, not the kernel that happened to start k-th."""
    host = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1}
    events: list[dict[str, Any]] = [
        {**host, "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 5e3}
    ]
    # (group, host call start, kernel start, kernel end): TP "1" issued first, its kernel starts
    # last
    for group, start, kernel_start, kernel_end, corr in (
        ("1", 1000, 1500, 3000, 11),
        ("3", 1100, 1200, 1400, 12),
    ):
        meta = {"Process Group Name": group, "Process Group Ranks": str(GROUPS[group]), "Seq": 5}
        events += [
            {**host, "name": "c10d::allreduce_", "ts": start, "dur": 60},
            {**host, "name": "record_param_comms", "ts": start + 5, "dur": 50, "args": meta},
            {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": start + 15, "dur": 10}
            | {"args": {"correlation": corr}},
            {
                "ph": "X",
                "cat": "kernel",
                "pid": 0,
                "tid": 6 + int(group),
                "name": "ncclDevKernel_AllReduce_Sum_f32",
            }
            | {"ts": kernel_start, "dur": kernel_end - kernel_start, "args": {"correlation": corr}},
        ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    trace = load_columns(str(path))
    found = rank_arrivals(trace.columns, trace.rank)
    assert found is not None
    assert [found.group_table[g][0] for g in found.groups] == ["1", "3"]
    # (in start order, the 1400 µs kernel would be taken for TP's)
    assert found.depart_us == [3000, 1400]
    # without correlation ids (no launches recorded), the k-th collective still pairs with the k-th
    # kernel
    for event in events:
        event.get("args", {}).pop("correlation", None)
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    trace = load_columns(str(path))
    again = rank_arrivals(trace.columns, trace.rank)
    assert again is not None and again.depart_us == [1400, 3000]


def test_departures_without_launches_as_before(tmp_path: Path) -> None:
    """Traces without correlation ids pair kernels by order: the same figures on the synthetic
    layout."""
    with_launches = _section(tmp_path / "a")
    without = _section(tmp_path / "b", launches=False)
    assert with_launches == without


def test_late_only_at_its_tensor_parallel_group_is_judged_on_that_group(tmp_path: Path) -> None:
    """The DP all-reduce first, then rank 3 idles 30 ms before its TP all-reduce: last at every TP
    all-reduce of group "2" but at no DP one, half its collectives. Judged on group "2" alone it is
    the culprit."""
    section = _section(tmp_path, dp_first=True)
    rows = {row["rank"]: row for row in section["ranks"]}
    # below the 60% over all its collectives
    assert rows[3]["last_share"] == 0.5 and rows[3]["times_last"] == STEPS
    found = section["culprit"]
    assert found is not None and found["rank"] == 3
    assert found["group"] == {
        "name": "2",
        "ranks": [2, 3],
        "collectives": STEPS,
        "times_last": STEPS,
        "last_share": 1.0,
        "lateness_ms_per_step": pytest.approx(30.005, abs=0.001),
        "wait_caused_ms_per_step": pytest.approx(30.005, abs=0.001),
    }
    # (the rank's own figures over all its collectives, as its row)
    assert found["last_share"] == 0.5
    assert found["cause"] == "no_operator" and found["cause_ms_per_step"] == pytest.approx(
        30.0, abs=0.1
    )
    assert found["evidence"].startswith(
        "rank 3 arrives last at 100% of the collectives on process group 2 [ranks 2, 3], 30.0 "
        "ms/step late, making the others wait 30.0 ms/step; its extra time before arriving is time "
        "with no operator"
    )
    assert found["evidence"].endswith("30.0 ms/step more than the other members")
    advice = culprit_advice(section)
    assert advice is not None
    assert advice["evidence"].startswith(
        "rank 3 arrives last at 100% of the collectives on process group 2 [ranks"
    )
    assert "of the collectives of one of its process groups" in advice["threshold"]


def test_a_group_judged_alone_keeps_the_noise_rules(tmp_path: Path) -> None:
    """Late by 2 ms at a 90 ms step (under 5% of it): last at every TP all-reduce of its group,
    still no finding."""
    section = _section(tmp_path, dp_first=True, late_us=2_000.0)
    assert section["culprit"] is None


def test_a_finding_on_every_collective_names_the_group_of_its_cause(tmp_path: Path) -> None:
    """Rank 3 late before TP is last at its DP all-reduces too (released late): both of its groups
    pass, and the one where it lost the time itself, TP "2", is named."""
    found = _section(tmp_path)["culprit"]
    assert found["group"]["name"] == "2" and found["group"][
        "lateness_ms_per_step"
    ] == pytest.approx(30.01, abs=0.01)
