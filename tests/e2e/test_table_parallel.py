"""Folders of rank traces summarized in worker processes give exactly the serial answers
(stepcli.traces.engine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RANKS, run_stepcli

from stepcli.errors import TraceError
from stepcli.traces.analyses.mergeparts import summarize
from stepcli.traces.engine import available_cores, file_parts, summarize_paths
from stepcli.traces.read.tracereader import load_paths

DATA = Path(__file__).resolve().parent.parent / "data"
REAL = DATA / "train_cpu.pt.trace.json"


def test_parallel_equals_serial_on_a_rank_folder(rank_folder: Path) -> None:
    # GIVEN a folder of four rank traces (one gzipped) WHEN summarized one by one in-process, in 2
    # and 4 workers
    serial = summarize(load_paths([str(rank_folder)])).to_dict()
    one_job = summarize_paths([str(rank_folder)], jobs=1).to_dict()
    two_jobs = summarize_paths([str(rank_folder)], jobs=2).to_dict()
    # THEN every per-op, per-step and per-rank figure is the same
    assert one_job == serial
    assert two_jobs == serial
    assert [r["rank"] for r in two_jobs["ranks"]] == list(range(RANKS))
    assert len(two_jobs["steps"]) == 2 * RANKS
    # 2 steps per rank are no evidence of a straggler (traces.ranks)
    assert two_jobs["slowest_rank"] is None
    ops = {row["name"]: row for row in two_jobs["cpu_ops"]}
    assert (
        ops["aten::addmm"]["calls"]
        == RANKS
        * {r["name"]: r for r in summarize(load_paths([str(REAL)])).to_dict()["cpu_ops"]}[
            "aten::addmm"
        ]["calls"]
    )


def test_shape_groupings_come_from_one_read(rank_folder: Path) -> None:
    # GIVEN the folder WHEN each file is read once for both groupings in workers
    parts = file_parts([str(rank_folder)], groupings=(False, True), shapes=True, jobs=2)
    # THEN each grouping equals summarizing the loaded traces that way
    from stepcli.traces.analyses.mergeparts import merge_parts

    traces = load_paths([str(rank_folder)], shapes=True)
    assert merge_parts([p[0] for p in parts]).to_dict() == summarize(traces).to_dict()
    by_shape = merge_parts([p[1] for p in parts], group_by_shape=True).to_dict()
    assert by_shape == summarize(traces, group_by_shape=True).to_dict()
    assert all(p[1].has_shapes for p in parts)


def test_a_bad_file_in_a_worker_is_one_line(tmp_path: Path, rank_folder: Path) -> None:
    # GIVEN a folder with good traces and one truncated trace
    folder = tmp_path / "mixed"
    folder.mkdir()
    for path in sorted(rank_folder.iterdir())[:2]:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "host_9.9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": "a"')
    # WHEN read in workers THEN the error names the file
    with pytest.raises(TraceError, match="host_9.9.pt.trace.json: truncated JSON"):
        summarize_paths([str(folder)], jobs=2)
    # AND the command line says it in one line, without a traceback
    result = run_stepcli("table", "--jobs", "2", folder)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "truncated JSON" in result.stderr.strip().splitlines()[-1]


def test_table_jobs_flag_end_to_end(rank_folder: Path) -> None:
    # GIVEN the rank folder WHEN `stepcli table --json` reads it with 1 and 2 jobs
    one = run_stepcli("table", "--json", "--jobs", "1", rank_folder)
    two = run_stepcli("table", "--json", "-j", "2", rank_folder)
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    # THEN the JSON is identical, and equals the in-process summary
    assert json.loads(one.stdout) == json.loads(two.stdout)
    assert json.loads(two.stdout) == json.loads(
        json.dumps(summarize(load_paths([str(rank_folder)])).to_dict())
    )
    # AND a zero job count is refused in one line
    bad = run_stepcli("table", "--jobs", "0", rank_folder)
    assert bad.returncode == 2 and "--jobs" in bad.stderr and "Traceback" not in bad.stderr


def test_default_jobs_are_the_available_cores() -> None:
    import os

    assert available_cores() == len(os.sched_getaffinity(0))


def test_one_trace_cut_into_ranges_gives_the_same_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stepcli.traces import engine
    from stepcli.traces.read import splitread

    # GIVEN the real trace, ranges small enough that it is cut in three, and three cores (jobs never
    # exceed them)
    monkeypatch.setattr(splitread, "MIN_PIECE_BYTES", 20_000)
    monkeypatch.setattr(engine, "available_cores", lambda: 3)
    ranges = splitread.plan(str(REAL), 3)
    assert ranges is not None and len(ranges) == 3
    # WHEN read by three processes THEN every figure equals the one-process read
    expected = summarize(load_paths([str(REAL)])).to_dict()
    assert summarize_paths([str(REAL)], jobs=3).to_dict() == expected
    # AND the columns joined from the ranges are the file's columns
    from concurrent.futures import ThreadPoolExecutor

    from stepcli.traces.read import tracereader as traces
    from stepcli.traces.read.columns import load_columns

    whole = load_columns(str(REAL), shapes=True)
    # each range read in one block and decoded in one slice; in one block of many slices; in many
    # blocks
    for slice_bytes, block_bytes in (
        (traces._CHUNK_BYTES, splitread._BLOCK_BYTES),
        (3_000, splitread._BLOCK_BYTES),
        (3_000, 10_000),
    ):
        monkeypatch.setattr(traces, "_CHUNK_BYTES", slice_bytes)
        monkeypatch.setattr(splitread, "_BLOCK_BYTES", block_bytes)
        # (without shapes, slices are decoded where they lie in a reused buffer)
        for shapes in (True, False):
            with ThreadPoolExecutor(2) as pool:
                joined = splitread.read_split(str(REAL), ranges, shapes, pool)
            assert joined is not None
            assert (joined.event_count, joined.skipped_events, joined.rank) == (
                whole.event_count,
                whole.skipped_events,
                whole.rank,
            )
            assert [
                (e.name, e.ts, e.shape if shapes else "", e.tid) for e in joined.columns.to_events()
            ] == [
                (e.name, e.ts, e.shape if shapes else "", e.tid) for e in whole.columns.to_events()
            ]


def test_a_file_read_a_block_at_a_time_gives_the_same_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepcli.traces.read import splitread
    from stepcli.traces.read import tracereader as traces
    from stepcli.traces.read.columns import load_columns

    # GIVEN the real trace, read as one range in many blocks of many slices (as a rank file of tens
    # of MB is)
    monkeypatch.setattr(splitread, "MIN_BLOCKED_BYTES", 1_000)
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 3_000)
    monkeypatch.setattr(splitread, "_BLOCK_BYTES", 10_000)
    monkeypatch.setattr(splitread, "_spare_blocks", [])
    for shapes in (True, False):
        whole = load_columns(str(REAL), shapes=shapes)
        blocked = splitread.read_blocked(str(REAL), shapes)
        # THEN it holds the whole read's events, counts and metadata
        assert blocked is not None
        assert (
            blocked.event_count,
            blocked.skipped_events,
            blocked.rank,
            blocked.incomplete_step,
        ) == (
            whole.event_count,
            whole.skipped_events,
            whole.rank,
            whole.incomplete_step,
        )
        assert blocked.columns.to_events() == whole.columns.to_events()
    # AND one block buffer served both reads (its pages stay faulted in)
    assert len(splitread._spare_blocks) == 1
    # AND the table read in-process this way gives the answers of the ordinary read
    assert (
        summarize_paths([str(REAL)], jobs=1).to_dict()
        == summarize(load_paths([str(REAL)])).to_dict()
    )


def test_files_not_fit_for_a_blocked_read_are_read_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import gzip
    import os

    from stepcli.traces.read import splitread
    from stepcli.traces.read import tracereader as traces

    monkeypatch.setattr(splitread, "MIN_BLOCKED_BYTES", 1_000)
    # (slices: the quoted names' slice fails to decode)
    monkeypatch.setattr(traces, "_CHUNK_BYTES", 3_000)
    text = REAL.read_bytes()
    # GIVEN a gzip trace, a file under the threshold, a FIFO (no writer), a truncated trace and one
    # whose names hold bare quotes (PyTorch's with_stack): THEN none is read a block at a time (and
    # the FIFO is not waited on)
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(text))
    (tmp_path / "small.json").write_bytes(b'{"traceEvents": []}')
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "cut.json").write_bytes(text[: len(text) * 2 // 3])
    quoted = text.replace(b'"name": "aten::mm"', b'"name": "aten::mm("a")"', 1)
    assert quoted != text
    (tmp_path / "quotes.json").write_bytes(quoted)
    for name in ("t.json.gz", "small.json", "fifo.json", "cut.json", "quotes.json"):
        assert splitread.read_blocked(str(tmp_path / name), False) is None, name
    # AND the table reads the gzip and the quoted names as ever, and names the truncated file
    expected = summarize(load_paths([str(REAL)])).to_dict()
    assert (
        summarize_paths([str(tmp_path / "t.json.gz")], jobs=1).to_dict()["cpu_ops"]
        == expected["cpu_ops"]
    )
    assert (
        summarize_paths([str(tmp_path / "quotes.json")], jobs=1).to_dict()["steps"]
        == expected["steps"]
    )
    with pytest.raises(TraceError, match="cut.json"):
        summarize_paths([str(tmp_path / "cut.json")], jobs=1)


def test_ranges_read_by_forked_children_give_the_file_s_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepcli.traces.read import splitread
    from stepcli.traces.read.columns import load_columns

    # GIVEN the real trace cut in three ranges, two of them decoded by forked children (columns via
    # an in-memory file)
    monkeypatch.setattr(splitread, "MIN_PIECE_BYTES", 20_000)
    ranges = splitread.plan(str(REAL), 3)
    assert ranges is not None and len(ranges) == 3
    whole = load_columns(str(REAL))
    called: list[str] = []
    joined = splitread.read_split_forked(
        str(REAL), ranges, False, meanwhile=lambda: called.append("meanwhile")
    )
    # THEN the joined columns are the file's, and this process did its other work meanwhile
    assert joined is not None and called == ["meanwhile"]
    assert (joined.event_count, joined.skipped_events) == (whole.event_count, whole.skipped_events)
    assert [(e.name, e.ts, e.dur, e.tid) for e in joined.columns.to_events()] == [
        (e.name, e.ts, e.dur, e.tid) for e in whole.columns.to_events()
    ]
    # WHEN a child's range does not decode (a cut inside a string, say) THEN None: the caller reads
    # the file whole
    broken = [ranges[0], (ranges[1][0] + 7, ranges[1][1]), ranges[2]]
    assert splitread.read_split_forked(str(REAL), broken, False) is None


def test_a_cut_inside_a_string_falls_back_to_the_whole_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stepcli.traces.read import splitread

    # GIVEN a trace whose names hold "}, {" (a cut can land inside a string) WHEN read cut in ranges
    monkeypatch.setattr(splitread, "MIN_PIECE_BYTES", 2_000)
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "x" * 40 + "}, {" + "y" * 40 + "}, {",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i,
            "dur": 5.0,
        }
        for i in range(400)
    ]
    path = tmp_path / "odd_names.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ranges = splitread.plan(str(path), 4)
    assert ranges is not None
    # THEN the answers are still the one-process read's
    assert (
        summarize_paths([str(path)], jobs=4).to_dict()
        == summarize(load_paths([str(path)])).to_dict()
    )
    assert summarize_paths([str(path)], jobs=4).to_dict()["cpu_ops"][0]["calls"] == 400


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="fork and forkserver are Linux's start methods here",
)
def test_workers_fork_only_from_a_single_threaded_process() -> None:
    # GIVEN a fresh process with one thread THEN its workers fork (they start at once, with its
    # imports)
    code = (
        "import threading, time; from stepcli.traces.engine import _context; "
        "print(_context().get_start_method());threading.Thread(target=time.sleep, args=(1,), "
        "daemon=True).start(); print(_context().get_start_method())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    # AND once a second thread runs (a launcher's pipes), they start from a clean server process
    # instead
    assert out == ["fork", "forkserver"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only")
def test_a_refused_fork_leaves_no_worker_behind(rank_folder: Path) -> None:
    # GIVEN a single-threaded process whose second fork is refused (a container's process limit)
    big = rank_folder.parent / "cut_in_three.json"
    big.write_bytes(REAL.read_bytes())
    code = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent.parent)!r})
from stepcli.traces.read import splitread
splitread.MIN_PIECE_BYTES = 20_000
real, calls = os.fork, [0]
def fork():
    calls[0] += 1
    if calls[0] % 2 == 0:
        raise BlockingIOError(11, "Resource temporarily unavailable")
    return real()
os.fork = fork
from stepcli.traces.engine import summarize_paths
import json
print(json.dumps([summarize_paths([{str(rank_folder)!r}], jobs=3).to_dict()["cpu_ops"],
                  summarize_paths([{str(big)!r}], jobs=3).to_dict()["cpu_ops"]]))
"""
    # WHEN a folder and one big file are read with 3 jobs THEN it ends (the workers it did start are
    # killed)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # AND the answers are the serial ones
    folder_ops, file_ops = json.loads(done.stdout)
    assert folder_ops == summarize(load_paths([str(rank_folder)])).to_dict()["cpu_ops"]
    assert file_ops == summarize(load_paths([str(big)])).to_dict()["cpu_ops"]


# A child forked to share the files kills itself once it has taken one; this process, meanwhile,
# waits in its own file until that child has gone (the marker it leaves), so the child is sure to
# have taken one.
_DIES_IN_A_CHILD = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from stepcli.errors import StepcliError
from stepcli.traces.engine import map_files
me, marker = os.getpid(), {marker!r}

def work(item):
    if os.getpid() != me:
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    return item

try:
    map_files(work, ["a", "b"], jobs=2)
except StepcliError as exc:
    print("error:", exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only")
@pytest.mark.skipif(available_cores() < 2, reason="one core: no child is forked")
def test_a_forked_worker_that_dies_is_one_clear_error(tmp_path: Path) -> None:
    # GIVEN a single-threaded process sharing files with a forked child that dies (as a killed one
    # would)
    repo = str(Path(__file__).resolve().parent.parent.parent)
    code = _DIES_IN_A_CHILD.format(repo=repo, marker=str(tmp_path / "gone"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # THEN the caller gets one line that says so and what to try, not a traceback or a retry in its
    # own process
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"error: a worker process reading the traces died .*--jobs 1\n", done.stdout
    ), done.stdout


@pytest.mark.skipif(not Path("/bin/true").exists(), reason="needs /bin/true")
def test_a_pool_worker_that_dies_is_one_clear_error() -> None:
    import functools
    import os
    import threading

    from stepcli.errors import StepcliError
    from stepcli.traces.engine import map_files

    # GIVEN a process running a second thread (a launcher's), so its workers come from a pool, and
    # work whose worker process vanishes (replaced by a program that exits at once, as a killed one
    # would)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        # THEN the caller gets one line that says so and what to try
        with pytest.raises(
            StepcliError, match=r"a worker process reading the traces died .*--jobs 1"
        ):
            map_files(functools.partial(os.execl, "/bin/true"), ["a", "b"], jobs=2)
    finally:
        stop.set()
