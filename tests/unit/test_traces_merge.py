"""`stepcli merge`'s pure parts (stepcli.traces.mergetraces): the output guard and the per-rank
rewrite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepcli.errors import StepcliError
from stepcli.traces.mergetraces import _Rewriter, check_output, merge_main


def test_merge_never_replaces_a_foreign_file(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.json"
    foreign.write_text("{}")
    with pytest.raises(StepcliError, match="not written by stepcli merge"):
        check_output(str(foreign))
    (tmp_path / "ours.json").write_text('{"stepcli_merged": {}, "traceEvents": []}')
    check_output(str(tmp_path / "ours.json"))
    check_output(str(tmp_path / "absent.json"))
    with pytest.raises(StepcliError, match="not a regular file"):
        check_output(str(tmp_path))


def test_merge_moves_ids_pids_and_clock_per_rank() -> None:
    rewriter = _Rewriter(rank=3, slot=1, shift_us=250.0)
    flow = rewriter.event(
        {"ph": "s", "id": 7, "pid": 4242, "tid": 1, "ts": 1000.0, "args": {"correlation": 9}}
    )
    name = rewriter.event(
        {"ph": "M", "name": "process_name", "pid": 4242, "args": {"name": "python"}}
    )
    device = rewriter.event(
        {"ph": "X", "pid": 0, "tid": 7, "ts": 2000.0, "dur": 5.0, "args": {"External id": 9}}
    )
    assert flow["ts"] == 750.0 and flow["pid"] == 1000 and device["pid"] == 1001
    assert flow["id"] == 7 + (1 << 40) and flow["args"]["correlation"] == 9 + (1 << 40)
    # still linked within the rank
    assert device["args"]["External id"] == flow["args"]["correlation"]
    assert name["args"]["name"] == "rank 3: python"


DATA = Path(__file__).resolve().parent.parent / "data" / "train_cpu.pt.trace.json"


def _strict(path: Path) -> dict[str, Any]:
    """A merged trace as strict JSON readers (Perfetto, HTA) read it: `Infinity` or `NaN` is an
    error."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} in the merged trace")

    document: dict[str, Any] = json.loads(path.read_bytes(), parse_constant=refuse)
    return document


def test_merge_writes_no_infinity_and_counts_what_it_left_out(tmp_path: Path) -> None:
    # GIVEN a trace with one operator's dur 1e400 and one argument 1e400 (issue 47, item 8)
    document = json.loads(DATA.read_text())
    operators = [
        e for e in document["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    ]
    operators[0]["dur"] = "DUR"
    operators[1].setdefault("args", {})["Ev Idx"] = "ARG"
    text = json.dumps(document).replace('"DUR"', "1e400").replace('"ARG"', "-1e400")
    (tmp_path / "rank0.json").write_text(text)
    # WHEN merged
    line = merge_main([str(tmp_path / "rank0.json")], str(tmp_path / "m.json"))
    # THEN the output is JSON every viewer reads: that event left out, that value dropped, both
    # counted and said
    merged = _strict(tmp_path / "m.json")
    assert "1 event left out (ts or dur not a finite number); 1 non-finite value left out" in line
    assert (
        merged["stepcli_merged"]["dropped_events"] == 1
        and merged["stepcli_merged"]["dropped_values"] == 1
    )
    kept = [e for e in merged["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert len(kept) == len(operators) - 1 and "Ev Idx" not in kept[0].get("args", {})


def test_merge_reads_a_trace_it_cannot_slice_event_by_event(tmp_path: Path) -> None:
    # GIVEN a trace whose slices would be cut inside a long name that holds "},{" (no JSON list on
    # either side)
    document = json.loads(DATA.read_text())
    long_name = '"},{"x":' * 200_000
    document["traceEvents"].insert(3, {"ph": "i", "name": long_name, "pid": 1, "tid": 1, "ts": 5.0})
    (tmp_path / "rank0.json").write_text(json.dumps(document))
    # WHEN merged THEN every event is there as written (the name whole)
    from stepcli.traces.mergetraces import _survey

    merge_main([str(tmp_path / "rank0.json")], str(tmp_path / "m.json"))
    merged = _strict(tmp_path / "m.json")["traceEvents"]
    assert _survey(str(tmp_path / "rank0.json"), 0)[1].sliced is False  # (read event by event)
    assert [(e["ts"], e["tid"]) for e in merged if e.get("name") == long_name] == [(5.0, 1)]
    assert len([e for e in merged if e.get("ph") == "X"]) == len(
        [e for e in document["traceEvents"] if e.get("ph") == "X"]
    )


def test_merge_names_the_processes_of_one_rank_in_two_traces_apart(tmp_path: Path) -> None:
    # GIVEN two traces of rank 0 (two runs in one folder)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank0.json").write_text(DATA.read_text())
    # WHEN merged THEN they are two processes, each named as which trace it is
    line = merge_main([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "m.json"))
    assert "rank 0 in 2 traces (kept apart, as 2 processes)" in line
    merged = _strict(tmp_path / "m.json")["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"]
        for e in merged
        if e.get("name") == "process_name"
        and "rank 0 (" in e["args"]["name"]
        and ":" not in e["args"]["name"].split(")")[-1]
    }
    assert sorted(names.values()) == [
        "rank 0 (trace 1 of 2: rank0.json)",
        "rank 0 (trace 2 of 2: rank0.json)",
    ]
    assert len(names) == 2
