"""stepcli.traces.read.readahead: a .gz trace inflated by a forked process gives exactly the columns
of the ordinary read, and every surprise (a corrupt or oversized file, a failed child, other
threads) leaves the ordinary read and its error."""

from __future__ import annotations

import gzip
import mmap
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepcli.errors import TraceError
from stepcli.limits import LIMIT_ENV
from stepcli.traces.read import readahead, twoprocess
from stepcli.traces.read import tracereader as reader
from stepcli.traces.read.columns import ColumnTrace, load_columns
from stepcli.traces.read.shortcommand import read_ahead_one

pytestmark = pytest.mark.skipif(
    not hasattr(os, "memfd_create"), reason="the text goes through a memfd (Linux)"
)

REAL = Path(__file__).resolve().parent.parent / "data" / "train_cpu.pt.trace.json"
ACTIVE_COUNT = threading.active_count


def _facts(trace: ColumnTrace) -> tuple[object, ...]:
    events = [
        (e.name, e.cat, e.pid, e.tid, e.ts, e.dur, e.shape) for e in trace.columns.to_events()
    ]
    columns = trace.columns
    return (
        events,
        trace.event_count,
        trace.skipped_events,
        trace.rank,
        columns.transfers,
        columns.corr.tolist(),
    )


@pytest.fixture(autouse=True)
def small(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No minimum size and 2 KB slices, so the small real trace is read ahead and decoded in many
    slices; threads another test left in this worker do not count; nothing read ahead outlives a
    test."""
    monkeypatch.setattr(readahead, "MIN_BYTES", 0)
    monkeypatch.setattr(readahead.threading, "active_count", lambda: 1)
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(twoprocess, "MIN_BYTES", 0)
    yield
    readahead._stop_all()


@pytest.fixture
def gz(tmp_path: Path) -> Path:
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(REAL.read_bytes()))
    return path


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.parametrize("shapes", [False, True])
def test_a_read_ahead_trace_gives_the_ordinary_columns(
    gz: Path, forks: list[int], shapes: bool
) -> None:
    ordinary = _facts(load_columns(str(gz), shapes=shapes))
    readahead.read_ahead(str(gz))
    assert len(forks) == 1
    assert _facts(load_columns(str(gz), shapes=shapes)) == ordinary
    assert _reaped(forks[0])
    assert readahead.take(str(gz)) is None  # taken once: a second read is an ordinary one


def test_two_processes_decode_the_mapped_text_in_place_without_changing_the_file(
    gz: Path, forks: list[int]
) -> None:
    """The mapping is copy-on-write: the reader's in-place edits (and the decoding child's) never
    reach the text the read-ahead child wrote, so the same columns come out of it again."""
    ordinary = _facts(load_columns(str(gz)))
    for _ in range(2):
        readahead.read_ahead(str(gz))
        assert _facts(load_columns(str(gz), decode=twoprocess.decode_in_two)) == ordinary
    # (os.fork is patched for everyone): per read, the reading child and the decoding one
    assert len(forks) == 4
    assert gzip.decompress(gz.read_bytes()) == REAL.read_bytes()


def test_take_gives_a_private_mapping_of_the_inflated_text(gz: Path) -> None:
    readahead.read_ahead(str(gz))
    text = readahead.take(str(gz))
    assert isinstance(text, mmap.mmap)
    assert text[:] == REAL.read_bytes()
    text[0] = ord(" ")  # writable, and private to this process
    assert text[:1] == b" "


@pytest.mark.parametrize(
    "content, problem",
    [
        # the trailer intact, the stream cut
        (lambda data: data[: len(data) // 2] + data[-8:], "corrupt gzip"),
        (lambda data: data[:10] + bytes(len(data) - 18) + data[-8:], "corrupt gzip"),
    ],
)
def test_a_corrupt_file_gives_the_ordinary_error(
    tmp_path: Path, forks: list[int], content, problem: str
) -> None:
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content(gzip.compress(REAL.read_bytes())))
    with pytest.raises(TraceError) as ordinary:
        load_columns(str(path))
    readahead.read_ahead(str(path))
    assert len(forks) == 1
    with pytest.raises(TraceError) as ahead:
        load_columns(str(path))
    assert problem in ahead.value.problem
    assert (ahead.value.path, ahead.value.problem) == (ordinary.value.path, ordinary.value.problem)
    assert _reaped(forks[0])


def test_a_text_over_the_input_limit_gives_the_ordinary_error(
    gz: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LIMIT_ENV, str(REAL.stat().st_size // 2))
    readahead.read_ahead(str(gz))
    assert len(forks) == 1
    with pytest.raises(TraceError, match="decompressed content is larger than"):
        load_columns(str(gz))


def test_a_child_that_dies_leaves_the_ordinary_read(gz: Path, forks: list[int]) -> None:
    ordinary = _facts(load_columns(str(gz)))
    readahead.read_ahead(str(gz))
    os.kill(forks[0], 9)
    assert _facts(load_columns(str(gz))) == ordinary
    assert _reaped(forks[0])


def test_a_child_that_fails_leaves_the_ordinary_read(
    gz: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(path: str, memfd: int, pipe: int, parents_end: int) -> None:
        raise MemoryError

    monkeypatch.setattr(readahead, "_inflate", failing)
    ordinary = _facts(load_columns(str(gz)))
    readahead.read_ahead(str(gz))
    assert len(forks) == 1
    assert readahead.take(str(gz)) is None
    assert _facts(load_columns(str(gz))) == ordinary


def test_what_is_not_read_ahead(
    tmp_path: Path, gz: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not gzip, a text under MIN_BYTES, a missing file, another thread running: no fork."""
    plain = tmp_path / "plain.json.gz"
    plain.write_bytes(REAL.read_bytes())  # named .gz, but not gzip
    readahead.read_ahead(str(plain))
    readahead.read_ahead(str(tmp_path / "missing.json.gz"))
    monkeypatch.setattr(readahead, "MIN_BYTES", REAL.stat().st_size + 1)
    readahead.read_ahead(str(gz))
    monkeypatch.setattr(readahead, "MIN_BYTES", 0)
    monkeypatch.setattr(readahead.threading, "active_count", ACTIVE_COUNT)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        readahead.read_ahead(str(gz))
    finally:
        release.set()
        other.join()
    assert forks == []
    assert readahead.take(str(gz)) is None


def test_a_read_never_taken_is_stopped_at_exit(gz: Path, forks: list[int]) -> None:
    readahead.read_ahead(str(gz))
    readahead._stop_all()
    assert _reaped(forks[0])
    assert readahead.take(str(gz)) is None


def test_table_reads_ahead_only_one_gz_file_on_several_cores(
    tmp_path: Path, gz: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    other = tmp_path / "other.json.gz"
    other.write_bytes(gz.read_bytes())
    read_ahead_one([str(gz), str(other)], None, None)  # several files: workers read them
    read_ahead_one([str(gz)], 1, None)  # --jobs 1: one process
    read_ahead_one([str(gz)], None, "tcp://scheduler:8786")  # a cluster's workers read it
    read_ahead_one([str(REAL)], None, None)  # plain JSON: nothing to inflate
    read_ahead_one([str(tmp_path)], None, None)  # a folder
    assert forks == []
    read_ahead_one([str(gz)], None, None)
    assert len(forks) == 1
    assert isinstance(readahead.take(str(gz)), mmap.mmap)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    read_ahead_one([str(gz)], None, None)  # one core: nothing to overlap
    assert len(forks) == 1


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_the_child_is_forked_before_numpy_would_be_needed(gz: Path) -> None:
    """The child imports only the reading code: stepcli.inputs (msgspec), never numpy or the
    analysis."""
    import subprocess

    code = (
        "import sys, os\nimport stepcli.traces.read.readahead as r\nr.MIN_BYTES = 0\ndef "
        "child(path, memfd, pipe, parents_end, real=r._inflate):\n    import stepcli.inputs\n    "
        "os.write(2, repr(sorted(m for m in ('numpy', 'stepcli.traces.analyses.traceanalysis') if "
        "m in sys.modules)).encode())\n    real(path, memfd, pipe, parents_end)\nr._inflate = "
        "child\nr.read_ahead(sys.argv[1])\nprint(len(r.take(sys.argv[1])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(gz)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "[]"
    assert int(done.stdout) == REAL.stat().st_size


def test_a_text_past_the_read_ahead_size_is_left_to_the_ordinary_read(
    tmp_path: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a gzip file of two members whose trailer (the last member's) gives a size far below its
    # text's
    text = REAL.read_bytes()
    path = tmp_path / "two_members.json.gz"
    path.write_bytes(gzip.compress(text[:-100]) + gzip.compress(text[-100:]))
    monkeypatch.setattr(readahead, "MAX_BYTES", len(text) // 2)
    ordinary = _facts(load_columns(str(path)))
    # WHEN it is read ahead THEN the child stops past MAX_BYTES, and the ordinary read gives the
    # same columns
    readahead.read_ahead(str(path))
    assert len(forks) == 1
    assert readahead.take(str(path)) is None
    assert _facts(load_columns(str(path))) == ordinary
