"""Hostile values in inputs are one clear line and exit 2, never exit 70 nor gigabytes (issue 30,
items 2, 3, 13, 14): `merge` on out-of-range base times, ids and pids; `memory` on pickles built to
take memory or stack."""

from __future__ import annotations

import json
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from stepcli.errors import StepcliError, TraceError
from stepcli.snapshots.snapshotreader import load_snapshot
from stepcli.traces.mergetraces import merge_traces

DATA = Path(__file__).resolve().parent.parent / "data" / "train_cpu.pt.trace.json"


def _ranks(tmp_path: Path, first: dict[str, Any]) -> list[str]:
    second = json.loads(DATA.read_text())
    (tmp_path / "rank0.json").write_text(json.dumps(first))
    (tmp_path / "rank1.json").write_text(json.dumps(second))
    return [str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json")]


def test_merge_takes_a_base_time_past_int64_as_none(tmp_path: Path) -> None:
    trace = json.loads(DATA.read_text())
    trace["baseTimeNanoseconds"] = 10**400
    facts = merge_traces(_ranks(tmp_path, trace), str(tmp_path / "m.json"))
    assert facts["ranks"] == [0, 1]


def test_merge_takes_a_list_pid_as_text_table_does(tmp_path: Path) -> None:
    trace = json.loads(DATA.read_text())
    trace["traceEvents"][5]["pid"] = [1, 2]
    merge_traces(_ranks(tmp_path, trace), str(tmp_path / "m.json"))
    merged = json.loads((tmp_path / "m.json").read_text())
    assert all(isinstance(e.get("pid", 0), int) for e in merged["traceEvents"])


@pytest.mark.parametrize("ident", [2**40 + 5, -1, 2**70])
def test_merge_refuses_an_id_it_cannot_keep_apart_from_the_next_ranks(
    tmp_path: Path, ident: int
) -> None:
    trace = json.loads(DATA.read_text())
    trace["traceEvents"].append(
        {"ph": "s", "id": ident, "pid": 1, "tid": 1, "ts": 1.0, "name": "x", "cat": "c"}
    )
    with pytest.raises(TraceError, match="outside 0..2\\^40"):
        merge_traces(_ranks(tmp_path, trace), str(tmp_path / "m.json"))


def test_merge_refuses_more_processes_than_a_rank_has_pids(tmp_path: Path) -> None:
    trace = json.loads(DATA.read_text())
    trace["traceEvents"] += [
        {"ph": "i", "pid": 10_000 + n, "tid": 1, "ts": 1.0, "name": "x"} for n in range(1001)
    ]
    with pytest.raises(StepcliError, match="more than 1000 processes"):
        merge_traces(_ranks(tmp_path, trace), str(tmp_path / "m.json"))


def test_a_snapshot_with_a_frame_name_nested_200000_deep_is_one_line(tmp_path: Path) -> None:
    # (item 13) built by hand: pickling it with Python would itself overflow the stack
    snapshot = {
        "segments": [
            {
                "device": 0,
                "address": 0,
                "total_size": 512,
                "stream": 0,
                "segment_type": "large",
                "allocated_size": 512,
                "active_size": 512,
                "requested_size": 512,
                "blocks": [
                    {
                        "address": 0,
                        "size": 512,
                        "requested_size": 512,
                        "state": "active_allocated",
                        "frames": [{"filename": "PLACEHOLDERX", "line": 1, "name": "f"}],
                    }
                ],
            }
        ],
        "device_traces": [[]],
    }
    data = pickle.dumps(snapshot, protocol=2)
    deep = b"]" * 200_000 + b"X\x04\x00\x00\x00f.py" + b"a" * 200_000
    (tmp_path / "deep.pickle").write_bytes(data.replace(b"X\x0c\x00\x00\x00PLACEHOLDERX", deep))
    with pytest.raises(TraceError, match="not a string|nested too deeply"):
        load_snapshot(str(tmp_path / "deep.pickle"))


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x02K\x01r" + (1 << 24).to_bytes(4, "little") + b".",  # LONG_BINPUT 2^24
        b"\x80\x02](K\x01r"
        + (1 << 24).to_bytes(4, "little")
        + b"e}X\x08\x00\x00\x00segmentsh\x00s.",
        b"I1\np16777216\n.",  # protocol 0: the C unpickler reads it
    ],
    ids=["streamed", "streamed-then-fallback", "protocol-0"],
)
def test_a_memo_index_bomb_is_refused_without_its_memo(tmp_path: Path, data: bytes) -> None:
    # (item 2) a memo index of 2^24 made the C unpickler allocate 16M memo slots (128 MiB) for a
    # 10-byte file
    path = tmp_path / "bomb.pickle"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(TraceError):
            load_snapshot(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip-bomb"])
def test_an_empty_list_flood_is_refused_before_it_takes_memory(
    tmp_path: Path, gzipped: bool
) -> None:
    # (item 3) 1-byte EMPTY_LIST opcodes: 4.8 MB of them took 788 MB; a 5 MB gzip of them, gigabytes
    import gzip
    import resource

    if not Path("/proc/self/statm").exists():
        pytest.skip("the decoder's memory watch reads /proc/self/statm (Linux)")
    body = b"\x80\x04" + b"]" * (5 << 20 if not gzipped else 256 << 20) + b"."
    path = tmp_path / ("flood.pickle.gz" if gzipped else "flood.pickle")
    path.write_bytes(gzip.compress(body, 1) if gzipped else body)
    del body
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    with pytest.raises(TraceError, match="not a CUDA memory snapshot"):
        load_snapshot(str(path))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
    # refused at its first list (a snapshot is a dict), not 5-250 million lists
    assert grown < 64 << 20, grown


def test_merge_keeps_two_traces_of_one_rank_apart_and_says_so(tmp_path: Path) -> None:
    # (item 14) two files both rank 0: their pids and ids no longer land on each other, and the line
    # says it
    from stepcli.traces.mergetraces import merge_main

    trace = json.loads(DATA.read_text())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "rank0.json").write_text(json.dumps(trace))
    (tmp_path / "b" / "rank0.json").write_text(json.dumps(trace))
    line = merge_main(
        [str(tmp_path / "a" / "rank0.json"), str(tmp_path / "b" / "rank0.json")],
        str(tmp_path / "m.json"),
    )
    assert "rank 0 in 2 traces" in line
    merged = json.loads((tmp_path / "m.json").read_text())
    pids = {e["pid"] for e in merged["traceEvents"] if e.get("ph") == "X"}
    assert any(p < 1000 for p in pids) and any(1000 <= p < 2000 for p in pids)
