"""Each malformed input of issue 14, decided once: skipped and counted, or the file rejected in one
line.

`table`, `table --json` and `compare` must agree on every case. Most cases run through
`stepcli.cli.main` (the entry point that maps errors to exit codes); the ones about files that block
or never end run as subprocesses.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import run_stepcli

from stepcli.traces.read.files import MERGED_PROBLEM

DATA = Path(__file__).resolve().parent.parent / "data"
REAL = DATA / "train_cpu.pt.trace.json"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from stepcli.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepcli: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


def _real() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(REAL.read_text())
    return doc


def _with_events(tmp_path: Path, name: str, change: Any) -> Path:
    doc = _real()
    doc["traceEvents"] = [change(dict(e)) if e.get("ph") == "X" else e for e in doc["traceEvents"]]
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


REJECTED = {
    # name: (file content, words of the one line)
    "deep": (b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", "nested too deeply"),
    "bad_utf8": (REAL.read_bytes().replace(b'"aten::', b'"\xffaten::', 1), "not UTF-8"),
    "lenient_then_malformed": (b'{"traceEvents": [{"ts": "x"}, 1, {"a": }]}', "invalid JSON"),
    "bare_nan": (
        REAL.read_bytes().replace(b'"dur": ', b'"dur": NaN, "x": ', 1),
        "bare NaN at byte",
    ),
    "bare_infinity": (
        REAL.read_bytes().replace(b'"ts": ', b'"ts": -Infinity, "y": ', 1),
        "bare -Infinity",
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_files_that_are_rejected_get_one_line_from_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    content, words = REJECTED[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(content)
    for argv in (
        ["table", str(path)],
        ["table", "--json", str(path)],
        ["compare", str(REAL), str(path)],
    ):
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and out == "", (argv, err)
        line = _one_line(err)
        assert str(path) in line and words in line, (argv, line)


def test_deep_nesting_from_the_real_command(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(REJECTED["deep"][0])
    for argv in (["table", path], ["compare", path, path]):
        proc = run_stepcli(*argv, timeout=60)
        assert proc.returncode == 2 and "nested too deeply" in _one_line(proc.stderr)


SKIPPED = {
    # name: event change applied to every complete event -> every kept event is skipped and counted
    "negative_dur": lambda e: e | {"dur": -abs(e.get("dur", 1)) - 1},
    "string_ts": lambda e: e | {"ts": "soon"},
    "missing_dur": lambda e: {k: v for k, v in e.items() if k != "dur"},
    "null_ts": lambda e: e | {"ts": None},
    "bool_dur": lambda e: e | {"dur": True},
}


@pytest.mark.parametrize("case", sorted(SKIPPED))
def test_unplaceable_events_are_skipped_and_counted_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    # GIVEN a real trace where every complete event has the same unusable time
    path = _with_events(tmp_path, f"{case}.json", SKIPPED[case])
    good = json.loads(_cli(capsys, "table", "--json", str(REAL))[1])
    kept = sum(row["calls"] for row in good["cpu_ops"] if row["name"] != "ProfilerStep*")
    # WHEN summarized
    code, out, err = _cli(capsys, "table", "--json", str(path))
    # THEN nothing is placed, all of it is counted as skipped, and no step of -0.005 ms appears
    assert code == 0 and err == "", err
    report = json.loads(out)
    assert report["cpu_ops"] == [] and report["steps"] == []
    assert report["skipped_events"] >= kept
    code, out, _ = _cli(capsys, "table", str(path))
    assert code == 0 and "skipped" in out and "-0.0" not in out
    # and compare, reading with the same reader, says nothing was measured (exit 3), never "run
    # summary"
    code, out, err = _cli(capsys, "compare", str(REAL), str(path))
    assert code == 3 and "NOTHING MEASURED" in out and "run summary" not in err


def test_one_negative_dur_is_skipped_and_the_rest_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _real()
    odd = next(
        e
        for e in doc["traceEvents"]
        if e.get("name", "").startswith("aten::") and e.get("ph") == "X"
    )
    odd["dur"] = -5
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    report = json.loads(_cli(capsys, "table", "--json", str(path))[1])
    good = json.loads(_cli(capsys, "table", "--json", str(REAL))[1])
    assert report["skipped_events"] == 1 and report["steps"] == good["steps"]


def test_numeric_string_times_are_read_as_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_events(
        tmp_path, "strings.json", lambda e: e | {"ts": str(e["ts"]), "dur": str(e["dur"])}
    )
    report = json.loads(_cli(capsys, "table", "--json", str(path))[1])
    good = json.loads(_cli(capsys, "table", "--json", str(REAL))[1])
    assert report["skipped_events"] == 0 and report["steps"] == good["steps"]


def test_rank_past_64_bits_is_ignored_and_json_still_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in (2**64, -1, "3", 2**31):
        doc = _real()
        doc["distributedInfo"] = {"rank": rank}
        path = tmp_path / "rank7.pt.trace.json"
        path.write_text(json.dumps(doc))
        code, out, err = _cli(capsys, "table", "--json", str(path))
        assert code == 0 and err == "", err
        assert [r["rank"] for r in json.loads(out)["ranks"]] == [7], rank  # from the file name
    huge = tmp_path / "huge_step.json"
    huge.write_text(
        json.dumps(_real()).replace('"ProfilerStep#3"', '"ProfilerStep#' + "9" * 40 + '"')
    )
    code, out, err = _cli(capsys, "table", "--json", str(huge))
    assert code == 0 and json.loads(out)["skipped_events"] == 1


def test_args_past_64_bits_read_as_missing_in_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a launch, its kernel (a collective with a copy size) and an operator with FLOPs, where
    # one of the ids or counts numpy holds in 64 bits is past them (a hostile file's)
    def trace(field: str, value: int | None) -> Path:
        def args(**fields: Any) -> dict[str, Any]:
            return {k: v for k, v in fields.items() if k != field} | (
                {} if value is None else {field: value}
            )

        events = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 1000,
                "dur": 100,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 1001,
                "dur": 5,
                "args": args(flops=1000, **{"External id": 5}),
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 1002,
                "dur": 5,
                "args": args(correlation=7),
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce",
                "pid": 0,
                "tid": 7,
                "ts": 1010,
                "dur": 5,
                "args": args(
                    correlation=7, bytes=4096, **{"Collective name": "allreduce", "External id": 5}
                ),
            },
        ]
        path = tmp_path / f"{field}_{value}.pt.trace.json"
        path.write_text(json.dumps({"traceEvents": events}))
        return path

    for field in ("correlation", "bytes", "flops", "External id"):
        without = trace(field, None)
        missing = _cli(capsys, "table", "--json", str(without))
        assert missing[0] == 0, missing
        expected = json.loads(missing[1].replace(json.dumps(str(without)), '"FILE"'))
        for value in (2**63, 2**64, -(2**64)):
            path = trace(field, value)
            # WHEN any command reads it THEN no internal error: the value reads as missing
            code, out, err = _cli(capsys, "table", "--json", str(path))
            assert (code, err) == (0, ""), (field, value, err)
            assert json.loads(out.replace(json.dumps(str(path)), '"FILE"')) == expected, (
                field,
                value,
            )
            assert _cli(capsys, "compare", str(path), str(path))[0] in (0, 4), (field, value)
            code, _, err = _cli(capsys, "merge", str(path), "-o", str(tmp_path / "merged.json"))
            # an id merge moves (a positive one) must fit (merge.md): one line, exit 2
            if code == 2:
                assert field in ("correlation", "External id") and value > 0, (field, value, err)
                assert "is outside 0..2^40" in _one_line(err), (field, value, err)
            else:
                assert code == 0, (field, value, err)
            assert _cli(capsys, "report", str(path), "-o", str(tmp_path / "page.html"))[0] == 0, (
                field,
                value,
            )


def test_merge_reads_odd_values_as_table_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two ranks of a real trace, rank 1 later by 500 us, as numbers; then rank 1's times as
    # numeric strings
    def job(name: str, change: Any = None) -> tuple[int, dict[str, Any]]:
        folder = tmp_path / name
        folder.mkdir()
        for rank in (0, 1):
            doc = _real()
            doc["distributedInfo"] = {"rank": rank}
            for event in doc["traceEvents"]:
                if rank == 1 and isinstance(event.get("ts"), (int, float)):
                    event["ts"] += 500
                if rank == 1 and change is not None:
                    change(event)
            (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))
        code, _, err = _cli(capsys, "merge", str(folder), "-o", str(tmp_path / f"{name}.json"))
        assert code == 0, err
        return code, json.loads((tmp_path / f"{name}.json").read_text())

    def as_strings(event: dict[str, Any]) -> None:
        for key in ("ts", "dur"):
            if isinstance(event.get(key), (int, float)):
                event[key] = repr(float(event[key]))

    _, numbers = job("numbers")
    # WHEN merged THEN the strings are read as numbers, moved onto the merged clock and written as
    # numbers
    _, strings = job("strings", as_strings)
    assert strings["traceEvents"] == numbers["traceEvents"]
    # AND a pid or tid that is a list (an object, a bool) is taken as text, as table takes it: no
    # internal error
    _, lists = job(
        "lists",
        lambda e: e.update(pid=[e.get("pid")], tid={"t": e.get("tid")}) if "pid" in e else None,
    )
    names = [e["args"]["name"] for e in lists["traceEvents"] if e.get("name") == "process_name"]
    assert "rank 1" in names

    def timed(doc: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [(e.get("ts"), e.get("name")) for e in doc["traceEvents"] if e.get("ph") != "M"]

    assert timed(lists) == timed(numbers)


def test_not_regular_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.pt.trace.json"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero")):
        for argv in (["table", target], ["compare", REAL, target], ["compare", target, REAL]):
            proc = run_stepcli(*argv, timeout=30)
            assert proc.returncode == 2, proc.stderr
            assert "not a regular file" in _one_line(proc.stderr) and str(target) in proc.stderr


SIDE_FILES = {
    # what is planted as the trace's FLOPs side file (issue 47, items 1-3): the words of its one
    # warning
    "fifo": (None, "not a regular file"),
    "dev_zero": (None, "not a regular file"),
    "huge": (b'{"flops": 1}' + b" " * 200_000, "larger than"),
    "inf": (b'{"flops": 1e400}', "out of range"),
    "digits_401": (b'{"flops": 1' + b"0" * 400 + b"}", "no FLOP count"),
    "digits_5000": (b'{"flops": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    "nan": (b'{"flops": NaN}', "not a number JSON allows"),
}


@pytest.mark.parametrize("case", sorted(SIDE_FILES))
def test_a_planted_flops_side_file_is_left_out_with_a_warning(tmp_path: Path, case: str) -> None:
    # GIVEN a trace whose `NAME.flops` beside it is a FIFO, a link to /dev/zero, huge, or holds a
    # count no float can hold
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(REAL, folder / "rank0.pt.trace.json")
    side = folder / "rank0.flops"
    content, words = SIDE_FILES[case]
    if case == "fifo":
        os.mkfifo(side)
    elif case == "dev_zero":
        side.symlink_to("/dev/zero")
    else:
        side.write_bytes(content or b"")
    # WHEN table, table --json, report and compare read the folder
    for argv in (
        ["table", folder],
        ["table", "--json", folder],
        ["report", folder, "-o", tmp_path / "page.html"],
        ["compare", REAL, folder],
    ):
        proc = run_stepcli(*argv, timeout=60)
        # THEN none blocks, runs out of memory or fails (compare's exit is its verdict, inconclusive
        # on one trace a side): the side file is left out with one warning
        assert proc.returncode in ((0, 1, 4) if argv[0] == "compare" else (0,)), (argv, proc.stderr)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        warnings = [line for line in proc.stderr.splitlines() if "rank0.flops" in line]
        assert len(warnings) == 1 and warnings[0].startswith("stepcli: warning: "), proc.stderr
        assert words in warnings[0] and "FLOPs are left out" in warnings[0], proc.stderr
    assert "FLOPs" not in run_stepcli("table", folder).stdout
    assert json.loads(run_stepcli("table", "--json", folder).stdout)["flops"] is None


def test_a_fifo_named_like_a_gzip_trace_blocks_no_command(tmp_path: Path) -> None:
    # GIVEN a folder of two gzip traces and a FIFO named like a third (issue 47, item 4: the gzip
    # size estimate opened every .gz before anything checked it was a regular file)
    folder = tmp_path / "job"
    folder.mkdir()
    for name in ("rank0", "rank1"):
        (folder / f"{name}.pt.trace.json.gz").write_bytes(gzip.compress(REAL.read_bytes()))
    os.mkfifo(folder / "rank2.pt.trace.json.gz")
    # WHEN table, merge and report read the folder THEN each refuses the FIFO in one line, without
    # blocking
    for argv in (
        ["table", folder],
        ["merge", folder, "-o", tmp_path / "merged.json"],
        ["report", folder, "-o", tmp_path / "page.html"],
    ):
        proc = run_stepcli(*argv, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "rank2.pt.trace.json.gz: not a regular file" in _one_line(proc.stderr)


def test_inputs_over_the_limit_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a 40 KB gzip that inflates to 40 MB (a small bomb), and a limit of 1 MB
    bomb = tmp_path / "bomb.pt.trace.json.gz"
    bomb.write_bytes(
        gzip.compress(b'{"traceEvents": [' + b" " * 40_000_000 + b"]}", compresslevel=9)
    )
    assert bomb.stat().st_size < 100_000
    monkeypatch.setenv("STEPCLI_MAX_INPUT_BYTES", str(1024 * 1024))
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"traceEvents": [' + b" " * 2_000_000 + b"]}")
    for argv in (["table", str(bomb)], ["compare", str(REAL), str(bomb)], ["table", str(plain)]):
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and "larger than the 1.0 MiB stepcli reads" in _one_line(err), err
    monkeypatch.setenv("STEPCLI_MAX_INPUT_BYTES", str(64 * 1024 * 1024))
    code, _, err = _cli(capsys, "table", str(bomb))
    assert code == 0, err  # under the limit it is just an empty trace


@pytest.fixture(scope="module")
def run_summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from conftest import TRAIN_LOOP, write_script

    folder = tmp_path_factory.mktemp("summary")
    script = write_script(folder, "train.py", TRAIN_LOOP)
    proc = run_stepcli(
        "run", "-q", "--json", folder / "s.json", "-o", folder / "out", "--active", "1", script, "6"
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads((folder / "s.json").read_text())
    assert doc["traces"] and doc["windows"]
    return doc


def test_big_run_summary_is_read_as_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_summary: dict[str, Any]
) -> None:
    # GIVEN a valid run summary padded past 8 MB (a long timeline)
    big = dict(run_summary, timeline_ms=[1.0] * 2_000_000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    assert path.stat().st_size > 8 * 1024 * 1024
    # WHEN compared with itself THEN it is read as a run summary, by content
    code, out, err = _cli(capsys, "compare", str(path), str(path))
    assert code in (0, 4) and "run summary, 6 steps" in out and "REGRESSION" not in out, (out, err)


@pytest.mark.parametrize("field", ["traces", "windows"])
def test_run_summary_naming_files_outside_its_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_summary: dict[str, Any], field: str
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(run_summary))
    for outside in ("/etc/passwd", os.path.join(run_summary["out_dir"], "..", "elsewhere.json")):
        doc = json.loads(json.dumps(run_summary))
        if field == "traces":
            doc["traces"] = [*doc["traces"], outside]
        else:
            doc["windows"][0]["trace"] = outside
        path = tmp_path / "evil.json"
        path.write_text(json.dumps(doc))
        code, _, err = _cli(capsys, "compare", str(good), str(path))
        assert code == 2 and "outside its out_dir" in _one_line(err), err
    code, _, err = _cli(capsys, "compare", str(good), str(good))
    # read and decided (a few steps against themselves: inconclusive), not refused
    assert code in (0, 4), err


def test_a_merged_trace_is_refused_by_name_and_left_out_of_its_folder(
    rank_folder: Path, tmp_path: Path
) -> None:
    # GIVEN the four rank traces and `stepcli merge`'s output of them in the same folder (as `-o`
    # puts it there)
    folder = tmp_path / "ranks"
    shutil.copytree(rank_folder, folder)
    merged = folder / "merged.pt.trace.json"
    assert run_stepcli("merge", folder, "-o", merged).returncode == 0
    (tmp_path / "merged.json.gz").write_bytes(gzip.compress(merged.read_bytes()))
    # WHEN the folder is summarized THEN the merged file is left out: the answer is the ranks' own
    alone = json.loads(run_stepcli("table", "--json", rank_folder).stdout)
    beside = json.loads(run_stepcli("table", "--json", folder).stdout)
    assert len(beside["files"]) == len(alone["files"]) == 4
    assert beside["step_ms"] == alone["step_ms"] and len(beside["steps"]) == len(alone["steps"])
    # AND named, plain or gzipped, it is refused in one line (read as one process, every rank's
    # steps were one's)
    for path in (merged, tmp_path / "merged.json.gz"):
        for command in (["table"], ["compare", path], ["report", "-o", tmp_path / "r.html"]):
            result = run_stepcli(*command, path)
            assert result.returncode == 2, (command, result.stderr)
            assert result.stderr == f"stepcli: error: {path}: {MERGED_PROBLEM}\n", command
