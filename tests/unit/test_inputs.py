"""stepcli.inputs: the one reader of files stepcli did not write, side files and gzip trailers
included (issue 47)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from stepcli.errors import TraceError
from stepcli.inputs import gzip_trailer, read_input, read_side_json


def test_a_side_file_is_read_only_when_it_is_a_small_regular_file_of_finite_json(
    tmp_path: Path,
) -> None:
    side = tmp_path / "t.flops"
    assert read_side_json(str(side)) is None  # nothing there: nothing to say
    side.write_text('{"flops": 12, "device": null}')
    assert read_side_json(str(side)) == {"flops": 12, "device": None}
    cases = {
        "fifo": "not a regular file",
        "dev_zero": "not a regular file",
        "dangling": "which does not exist",
        "big": "larger than the 64.0 KiB stepcli reads in such a file",
        "1e400": "out of range",
        "-Infinity": "not a number JSON allows",
        "[" * 10_000: "nested too deeply",
    }
    for case, words in cases.items():
        path = tmp_path / f"{len(os.listdir(tmp_path))}.flops"
        if case == "fifo":
            os.mkfifo(path)  # (opened without blocking: no writer ever comes)
        elif case == "dev_zero":
            path.symlink_to("/dev/zero")
        elif case == "dangling":
            path.symlink_to(tmp_path / "gone")
        elif case == "big":
            path.write_bytes(b" " * (1 << 17))
        else:
            path.write_text(f'{{"flops": {case}}}' if len(case) < 20 else case)
        with pytest.raises(TraceError, match=words):
            read_side_json(str(path), 1 << 16)


def test_a_gzip_trailer_is_read_only_from_a_regular_gzip_file(tmp_path: Path) -> None:
    packed = tmp_path / "a.pt.trace.json.gz"
    packed.write_bytes(gzip.compress(b"x" * 1000))
    assert gzip_trailer(str(packed)) == (packed.stat().st_size, 1000)
    fifo = tmp_path / "b.pt.trace.json.gz"
    os.mkfifo(fifo)
    plain = tmp_path / "c.pt.trace.json.gz"
    plain.write_bytes(b"not gzip at all")
    for path in (fifo, plain, tmp_path / "missing.gz", Path("/dev/zero")):
        assert gzip_trailer(str(path)) is None


def _forge(path: Path) -> None:
    """Another user's swap: a same-size, same-mtime forgery renamed over `path` (another inode)."""
    data, info = path.read_bytes(), os.stat(path)
    forged = path.with_name("forged")
    forged.write_bytes(data.replace(b"aten::addmm", b"EVIL::addmm"))
    os.utime(forged, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(forged, path)


def test_a_trace_swapped_after_the_run_ends_check_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import threading
    import time

    from stepcli.agent.config import AgentConfig
    from stepcli.agent.signing import sign
    from stepcli.runfolder.steplogreader import load_step_logs
    from stepcli.traces.runtraces import RunTraces

    monkeypatch.setattr("stepcli.inputs._written", {})
    # GIVEN a run whose two traces pass the run end's check (issue 47: the check and the read were
    # two opens)
    out = tmp_path / "out"
    config = AgentConfig(run_id="r1", out_dir=str(out), launcher_pid=1, run_key="k" * 32)
    Path(config.log_dir).mkdir(parents=True)
    started = time.time()
    source = (Path(__file__).parent.parent / "data" / "train_cpu.pt.trace.json").read_bytes()
    assert b"aten::addmm" in source
    traces = [out / f"rank{rank}.1.pt.trace.json" for rank in (0, 1)]
    windows = []
    for trace in traces:
        trace.write_bytes(source)
        info = os.stat(trace)
        windows.append(
            {
                "first_step": 1,
                "last_step": 1,
                "bytes": info.st_size,
                "complete": True,
                "trace": str(trace),
                "inode": info.st_ino,
                "device": info.st_dev,
            }
        )
    log = {
        "schema_version": 1,
        "worker": "rank0",
        "rank": 0,
        "pid": 7,
        "host": "h",
        "argv": ["t.py"],
        "python": "3",
        "torch": "2",
        "started_at": started,
        "global_steps": 3,
        "requesters": [],
        "durations_us": [5, 6, 7],
        "phases": "013",
        "skipped_windows": 0,
        "notes": [],
        "exit": "exit",
        "peak_rss_bytes": None,
        "cuda_peak_bytes": None,
        "windows": windows,
    }
    log["signature"] = sign(config.run_key, log)
    (Path(config.log_dir) / "h.7.steps.json").write_text(json.dumps(log))
    logs, notes = load_step_logs(config, since=started)
    assert len(logs[0]["windows"]) == 2 and notes == []
    # WHEN another user swaps one for a forgery after that check, before the traces are read
    _forge(traces[1])
    # THEN no read of it (in this process, or in workers that do not inherit its memory: a
    # launcher's spinner thread makes them forkserver workers) reads the forgery: the trace is
    # refused by name
    for jobs in (1, 2):
        spinner = threading.Event()
        thread = threading.Thread(target=spinner.wait)
        thread.start()
        try:
            with pytest.raises(TraceError, match="not the file the run wrote") as refused:
                RunTraces(jobs=jobs).summary([str(t) for t in traces])
        finally:
            spinner.set()
            thread.join()
        assert str(traces[1]) in refused.value.message
    with pytest.raises(TraceError, match="not the file the run wrote"):
        read_input(str(traces[1]))
    assert b"EVIL" not in read_input(str(traces[0]))


def test_a_json_gz_is_read_as_a_document_only_where_that_never_inflates_a_large_trace(
    tmp_path: Path,
) -> None:
    from stepcli.inputs import read_document
    from stepcli.traces.read.files import reads_as_document

    summary = b'{"schema": "stepcli.run", "schema_version": 2}'
    resorted = b'{"advice": [], "schema": "stepcli.run", "schema_version": 2}'
    event = b'{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2},'
    big_trace = b'{"traceEvents": [' + event * 200_000 + b"{}]}"  # ~10 MB inflated
    files = {
        "plain.json.gz": summary,  # what `run --json plain.json.gz` writes
        "gzipped.json.gz": gzip.compress(summary),
        "resorted.json.gz": gzip.compress(resorted),  # small: read whole
        "big.pt.trace.json.gz": gzip.compress(big_trace),
        "whatif.json.gz": gzip.compress(b'{"stepcli_whatif_trace": 1, ' + big_trace[1:]),
        "corrupt.json.gz": b"\x1f\x8b\x08\x00garbage",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    os.mkfifo(tmp_path / "fifo.json.gz")
    decided = {name: reads_as_document(str(tmp_path / name)) for name in [*files, "fifo.json.gz"]}
    assert decided == {
        "plain.json.gz": True,
        "gzipped.json.gz": True,
        "resorted.json.gz": True,
        "big.pt.trace.json.gz": False,
        "whatif.json.gz": False,
        "corrupt.json.gz": False,
        "fifo.json.gz": False,
    }
    for name, text in (("plain", summary), ("gzipped", summary), ("resorted", resorted)):
        assert read_document(str(tmp_path / f"{name}.json.gz")) == text
    with pytest.raises(TraceError, match="corrupt gzip"):
        read_document(str(tmp_path / "corrupt.json.gz"))
