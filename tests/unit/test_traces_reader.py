"""The trace reader: files, gzip, folders, ranks, sliced decoding, and one clear error per kind of
bad input."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import stepcli.traces.read.tracereader as traces
from stepcli.errors import TraceError
from stepcli.traces.read.events import Event
from stepcli.traces.read.tracereader import Trace, load_paths, load_trace

DATA = Path(__file__).resolve().parent.parent / "data"
REAL = DATA / "train_cpu.pt.trace.json"


def fields(events: list[Event]) -> list[tuple]:
    return [(e.name, e.cat, e.pid, e.tid, e.ts, e.dur, e.shape) for e in events]


def test_real_trace_keeps_only_the_events_summaries_need() -> None:
    trace = load_trace(str(REAL))
    raw = json.loads(REAL.read_text())["traceEvents"]
    assert trace.event_count == len(raw)
    assert trace.rank is None
    assert {e.cat for e in trace.events} == {"cpu_op", "user_annotation"}
    assert all(e.ph == "X" for e in trace.events)
    assert sum(e.name.startswith("ProfilerStep#") for e in trace.events) == 2


def test_gzip_reads_the_same(tmp_path: Path) -> None:
    gz = tmp_path / "t.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(REAL.read_bytes()))
    assert fields(load_trace(str(gz)).events) == fields(load_trace(str(REAL)).events)


def test_sliced_decoding_matches_whole_decoding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    whole = load_trace(str(REAL), shapes=True)
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 2048)
    sliced = load_trace(str(REAL), shapes=True)
    assert fields(sliced.events) == fields(whole.events)
    assert sliced.event_count == whole.event_count
    assert any(e.shape for e in sliced.events)
    # A separator-looking text inside a string or nested value makes a slice invalid: the reader
    # falls back.
    doc = json.loads(REAL.read_text())
    for event in doc["traceEvents"][:400:7]:
        event["name"] = event["name"] + ' }, {"ph": "X"'
        event.setdefault("args", {})["nested"] = [{"a": 1}, {"b": 2}]
    (tmp_path / "tricky.json").write_text(json.dumps(doc, indent=1))
    tricky = load_trace(str(tmp_path / "tricky.json"))
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 1 << 30)
    assert fields(tricky.events) == fields(load_trace(str(tmp_path / "tricky.json")).events)


def test_slices_are_decoded_in_place_and_the_text_is_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a trace's text in a buffer, decoded in slices where it lies (without shapes: no copy of
    # a slice)
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 2048)
    text = REAL.read_bytes()
    data = bytearray(text)
    result = traces._decode_chunked(data, False, traces._Keeper)
    # THEN the events are the whole-document decode's, and the buffer holds the same text again
    assert result is not None
    assert fields(result[1].events) == fields(
        traces._decode_whole(str(REAL), text, False, traces._Keeper)[1].events
    )
    assert data == text
    # AND a cut inside a string (a slice that is not JSON) leaves the text as it was, for the
    # whole-document decode
    doc = json.loads(text)
    for event in doc["traceEvents"]:
        event["name"] = event["name"] + ' }, {"ph": "X"'
    tricky = json.dumps(doc).encode()
    data = bytearray(tricky)
    with pytest.raises(msgspec.DecodeError):
        traces._decode_chunked(data, False, traces._Keeper)
    assert data == tricky


def test_rank_from_distributed_info_wins_over_file_name(tmp_path: Path) -> None:
    doc = json.loads(REAL.read_text())
    doc["distributedInfo"] = {"backend": "gloo", "rank": 5, "world_size": 8}
    path = tmp_path / "rank1.123.pt.trace.json"
    path.write_text(json.dumps(doc))
    assert load_trace(str(path)).rank == 5
    shutil.copy(REAL, tmp_path / "worker_rank2.pt.trace.json")
    assert load_trace(str(tmp_path / "worker_rank2.pt.trace.json")).rank == 2


def test_unexpected_field_types_are_coerced(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "a",
                        "pid": "host",
                        "tid": 3.0,
                        "ts": "10.5",
                        "dur": 2,
                    },
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "b",
                        "pid": 1,
                        "tid": 1,
                        "ts": None,
                        "dur": 1,
                    },
                    "not an event",
                ]
            }
        )
    )
    trace = load_trace(str(path))
    assert trace.event_count == 3
    assert [(e.name, e.ts, e.dur) for e in trace.events] == [("a", 10.5, 2.0)]


def test_folder_is_searched_recursively_skipping_hidden_and_temporary(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".stepcli").mkdir()
    shutil.copy(REAL, tmp_path / "rank0.1.pt.trace.json")
    (tmp_path / "sub" / "rank1.2.pt.trace.json.gz").write_bytes(gzip.compress(REAL.read_bytes()))
    (tmp_path / ".stepcli" / "hello.json").write_text("{}")
    (tmp_path / ".rank2.3.pt.trace.json").write_text("{")
    (tmp_path / "rank3.4.pt.trace.json.1234.tmp.json").write_text("{")
    # a run folder's step log is not a trace
    (tmp_path / "1234.steps.json").write_text('{"steps": []}')
    loaded = load_paths([str(tmp_path)])
    assert [Path(t.path).name for t in loaded] == [
        "rank0.1.pt.trace.json",
        "rank1.2.pt.trace.json.gz",
    ]
    assert [t.rank for t in loaded] == [0, 1]
    # the same file named twice is read once
    assert len(load_paths([str(tmp_path / "rank0.1.pt.trace.json"), str(tmp_path)])) == 2


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    """kind -> (path, words the one-line message must contain)."""
    text = REAL.read_text()
    (tmp / "empty.json").write_text("")
    (tmp / "truncated.json").write_text(text[: len(text) // 2])
    (tmp / "notjson.json").write_text("this is not json\n")
    (tmp / "corrupt.json.gz").write_bytes(gzip.compress(text.encode())[:-200])
    (tmp / "garbage.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    (tmp / "other.json").write_text(json.dumps({"schemaVersion": 1, "events": []}))
    (tmp / "empty_dir").mkdir()
    (tmp / "empty_dir" / "notes.txt").write_text("hi")
    return {
        "missing": (tmp / "missing.json", "no such file"),
        "empty": (tmp / "empty.json", "empty"),
        "truncated": (tmp / "truncated.json", "truncated"),
        "non-json": (tmp / "notjson.json", "not JSON"),
        "corrupt-gzip": (tmp / "corrupt.json.gz", "gzip"),
        "garbage-gzip": (tmp / "garbage.json.gz", "gzip"),
        "not-a-trace": (tmp / "other.json", "not a profiler trace"),
        "empty-dir": (tmp / "empty_dir", "no .json or .json.gz trace"),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "missing",
        "empty",
        "truncated",
        "non-json",
        "corrupt-gzip",
        "garbage-gzip",
        "not-a-trace",
        "empty-dir",
    ],
)
def test_bad_inputs_raise_one_trace_error_naming_the_file(tmp_path: Path, kind: str) -> None:
    path, words = _bad_inputs(tmp_path)[kind]
    with pytest.raises(TraceError) as info:
        load_paths([str(path)])
    assert info.value.path == str(path)
    assert str(path) in info.value.message and words in info.value.message
    assert "\n" not in info.value.message


def test_truncated_big_trace_is_reported_even_when_sliced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 4096)
    text = REAL.read_text()
    path = tmp_path / "cut.json"
    path.write_text(text[: int(len(text) * 0.9)])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(str(path))


def test_multi_member_gzip_and_zero_padding(tmp_path: Path) -> None:
    raw = REAL.read_bytes()
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]) + b"\0" * 16)
    assert fields(load_trace(str(path)).events) == fields(load_trace(str(REAL)).events)


def _kept(name: str, ts: object, dur: object) -> str:
    """One kept-category event as JSON text, `ts`/`dur` written verbatim (so 1e400 and huge integers
    stay)."""
    return (
        f'{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": '
        f"{dur}}}"
    )


@pytest.mark.parametrize(
    "bad",
    [
        "1e308",
        "-1e308",
        "1e400",
        "1" + "0" * 400,
        "1" + "0" * 5000,
        '"inf"',
        '"nan"',
        '"-Infinity"',
    ],
    # (5,000 digits: more than Python converts)
    ids=lambda bad: bad if len(bad) < 20 else f"{len(bad)}-digit",
)
def test_unusable_times_are_skipped_and_counted(tmp_path: Path, bad: str) -> None:
    # GIVEN a trace with good events and one whose dur (then ts) is infinite, NaN or absurdly large
    for field in ("dur", "ts"):
        bad_event = _kept("bad", 5, bad) if field == "dur" else _kept("bad", bad, 1)
        # not kept: never counted
        other = '{"ph": "i", "cat": "cpu_op", "name": "instant", "ts": ' + bad + "}"
        path = tmp_path / f"{field}.json"
        path.write_text(
            '{"traceEvents": ['
            + ", ".join([_kept("a", 0, 10), bad_event, other, _kept("b", 2, 3)])
            + "]}"
        )
        # WHEN read
        trace = load_trace(str(path))
        # THEN the bad event is skipped and counted, the others are read as usual
        assert [e.name for e in trace.events] == ["a", "b"], field
        assert trace.skipped_events == 1 and trace.event_count == 4, field


def test_unusable_times_are_skipped_when_sliced_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = json.loads(REAL.read_text())
    kept = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in traces.KEPT_CATEGORIES
        and e.get("name") not in traces.FILTERED_NAMES
    ]
    kept[10]["dur"] = 1e308  # in an early slice
    kept[-1]["ts"] = 1e300  # in the last slice, decoded with the header
    path = tmp_path / "sliced.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 2048)
    trace = load_trace(str(path))
    assert trace.skipped_events == 2 and len(trace.events) == len(kept) - 2
    # Trace.from_events applies the same rule to events built in memory
    built = Trace.from_events(
        [Event(name="a", cat="cpu_op", dur=float("nan")), Event(name="b", cat="cpu_op", ts=1.0)]
    )
    assert [e.name for e in built.events] == ["b"] and built.skipped_events == 1


def test_incomplete_step_metadata_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # GIVEN stepcli's cut-short marker, a top-level JSON string next to traceEvents (where
    # add_metadata puts it)
    doc = json.loads(REAL.read_text())
    assert load_trace(str(REAL)).incomplete_step is None
    for value, expected in (("4", 4), (7, 7), ("soon", None), ([1], None), (None, None)):
        doc["stepcli_incomplete_step"] = value
        path = tmp_path / "cut.json"
        path.write_text(json.dumps(doc))
        # THEN whole, sliced and lenient decoding all read it (a malformed value reads as no marker)
        assert load_trace(str(path)).incomplete_step == expected, value
        with monkeypatch.context() as patch:
            patch.setattr(traces, "_CHUNK_BYTES", 2048)
            assert load_trace(str(path), shapes=True).incomplete_step == expected, value
    doc["stepcli_incomplete_step"] = "4"
    doc["traceEvents"][0]["tid"] = 3.5  # an unexpected type sends the file down the lenient path
    (tmp_path / "odd.json").write_text(json.dumps(doc))
    assert load_trace(str(tmp_path / "odd.json")).incomplete_step == 4


def test_reader_and_summary_do_not_import_rich() -> None:
    code = (
        "import sys, stepcli.traces.read.tracereader, stepcli.traces.analyses.traceanalysis; "
        "print(sorted({'rich', 'click', 'torch'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "value, expected",
    [
        ({"3": [2.5, 0.5], "4": [2, 0]}, {3: (2.5, 0.5), 4: (2.0, 0.0)}),
        ({"3": [2.5]}, None),
        ({"3": [2.5, -1]}, None),
        ({"x": [1, 1]}, None),
        ({"3": [True, 1]}, None),
        ([1, 2], None),
        ("3", None),
    ],
)
def test_cpu_times_stepcli_records_are_read_and_odd_values_ignored(
    tmp_path: Path, value: object, expected: object
) -> None:
    from stepcli.traces.read.columns import load_columns

    path = tmp_path / "t.json"
    event = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 1,
        "ts": 1.0,
        "dur": 2.0,
    }
    path.write_text(json.dumps({"traceEvents": [event], "stepcli_cpu_ms": value}))
    assert load_trace(str(path)).cpu_time == expected
    assert load_columns(str(path)).cpu_time == expected


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_a_trace_saved_with_a_byte_order_mark_or_in_utf16_reads_the_same(
    tmp_path: Path, encoding: str
) -> None:
    # GIVEN the real trace re-saved by an editor: with a UTF-8 byte order mark, or as UTF-16/32
    # (json.loads reads all)
    path = tmp_path / "saved.json"
    path.write_bytes(REAL.read_text().encode(encoding))
    # THEN it reads as the original does
    assert fields(load_trace(str(path)).events) == fields(load_trace(str(REAL)).events)


def test_step_numbers_are_ascii_digits_only(tmp_path: Path) -> None:
    # GIVEN step annotations numbered in ASCII, in Arabic-Indic digits (int() reads them), and past
    # 19 digits
    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.names import step_of

    assert step_of("ProfilerStep#12") == 12 and step_of("ProfilerStep#\u0661\u0662") is None
    assert (
        step_of("ProfilerStep#" + "9" * 20) is None
        and step_of("ProfilerStep#") is None
        and step_of("mm") is None
    )
    step = (
        '{{"ph": "X", "cat": "user_annotation", "name": "{0}", "pid": 1, "tid": 1, "ts": {1}, '
        '"dur": 10}}'
    )
    events = [
        step.format("ProfilerStep#3", 0),
        step.format("ProfilerStep#\u0664", 20),
        _kept("aten::mm", 1, 5),
    ]
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ", ".join(events) + "]}", encoding="utf-8")
    # THEN only the ASCII-numbered one is a step; the other stays an ordinary annotation
    summary = summarize([load_trace(str(path))])
    assert [row.step for row in summary.steps] == [3]


def test_ids_of_thousands_of_digits_do_not_stop_the_analysis(tmp_path: Path) -> None:
    # GIVEN a kernel whose stream and thread, and a collective whose group member, are 5,000-digit
    # strings (Python's int() refuses to convert them: ValueError past 4,300 digits)
    from stepcli.traces.analyses.mergeparts import summarize

    big = "7" * 5000
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 10,
            "dur": 5,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": big,
            "ts": 20,
            "dur": 30,
            "args": {"correlation": 1, "stream": big, "device": 0},
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "nccl:all_reduce",
            "pid": 1,
            "tid": 1,
            "ts": 60,
            "dur": 5,
            "args": {"Process Group Ranks": f"[{big}]"},
        },
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    # THEN it is summarized and written out as `table --json` writes it: the step and the kernel's
    # device time
    summary = summarize([load_trace(str(path))])
    assert [row.step for row in summary.steps] == [1]
    assert summary.device is not None and json.dumps(summary.to_dict())


def test_not_utf8_is_found_from_the_bytes_whatever_the_decoder_says() -> None:
    """msgspec 0.23 says "Invalid UTF-8 encoded string" (a DecodeError) where older releases raised
    UnicodeDecodeError: the words come from the bytes, so every msgspec gives the same line."""
    import msgspec

    from stepcli.traces.read.document import describe_decode_error, first_invalid_utf8

    text = ("é" * 10).encode() + b"\xff" + b"x"
    assert all(first_invalid_utf8(text, chunk) == 20 for chunk in (1, 2, 3, 5, 7, 1 << 20))
    assert first_invalid_utf8("é".encode() * 3, 1) is None
    document = b'{"traceEvents": [{"name": "\xffaten::mm"}]}'
    for message in ("Invalid UTF-8 encoded string", "some future wording"):
        line = describe_decode_error(document, msgspec.DecodeError(message))
        assert line == "not UTF-8 text (a string holds the invalid byte 0xff)", line
    # A malformed document whose only non-UTF-8 byte lies far past the error is said to be
    # malformed.
    late = b'{"traceEvents": [1,,]}' + b" " * 100 + b"\xff"
    assert describe_decode_error(
        late, msgspec.DecodeError("JSON is malformed (byte 19)")
    ).startswith("invalid JSON")
