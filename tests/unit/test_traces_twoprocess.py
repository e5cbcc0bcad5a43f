"""stepcli.traces.read.twoprocess: one in-memory trace decoded by this process and a forked child
gives exactly the one-process columns, and every failure of the child falls back to the ordinary
read."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepcli.errors import TraceError
from stepcli.traces.read import tracereader as reader
from stepcli.traces.read import twoprocess
from stepcli.traces.read.columns import ColumnTrace, load_columns

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the child is forked (Linux)"
)

REAL = Path(__file__).resolve().parent.parent / "data" / "train_cpu.pt.trace.json"


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
        trace.incomplete_step,
        trace.device_name,
        columns.transfers,
        columns.flops,
        columns.groups,
        columns.gemm_ops,
        columns.gemm_kernels,
        columns.corr.tolist(),
    )


@pytest.fixture(autouse=True)
def reaped() -> Iterator[None]:
    """Each test starts and ends with no child of an earlier read still to be waited for."""
    twoprocess.reap_children()
    yield
    twoprocess.reap_children()


@pytest.fixture
def sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 2 KB and no minimum size, so the small real trace is decoded in many slices, half
    by a child."""
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(twoprocess, "MIN_BYTES", 0)


@pytest.mark.parametrize("shapes", [False, True])
@pytest.mark.usefixtures("sliced")
def test_two_processes_give_the_one_process_columns(
    tmp_path: Path, forks: list[int], shapes: bool
) -> None:
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(REAL.read_bytes()))
    for path in (str(REAL), str(gz)):
        whole = load_columns(path, shapes=shapes)
        halves = load_columns(path, shapes=shapes, decode=twoprocess.decode_in_two)
        assert _facts(halves) == _facts(whole)
    assert len(forks) == 2  # one child per read, really forked


@pytest.mark.usefixtures("sliced")
def test_a_child_that_fails_or_dies_falls_back_to_one_process(
    monkeypatch: pytest.MonkeyPatch, forks: list[int]
) -> None:
    whole = _facts(load_columns(str(REAL)))

    def dies(*args: object) -> object:
        os._exit(9)

    def fails(*args: object) -> object:
        raise MemoryError

    for broken in (dies, fails):
        # (only the child decodes the rest through it)
        monkeypatch.setattr(twoprocess, "decode_rest", broken)
        assert _facts(load_columns(str(REAL), decode=twoprocess.decode_in_two)) == whole
    assert len(forks) == 2


@pytest.mark.usefixtures("sliced")
def test_no_fork_decodes_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(twoprocess.os, "fork", refused)
    fds = len(os.listdir("/proc/self/fd"))
    assert _facts(load_columns(str(REAL), decode=twoprocess.decode_in_two)) == _facts(
        load_columns(str(REAL))
    )
    assert len(os.listdir("/proc/self/fd")) == fds  # the pipe is closed


@pytest.mark.usefixtures("sliced")
def test_a_cut_inside_a_string_and_a_truncated_trace(tmp_path: Path, forks: list[int]) -> None:
    # GIVEN names holding the text between two events, so some slices are not JSON lists
    doc = json.loads(REAL.read_text())
    for event in doc["traceEvents"][::5]:
        event["name"] = event["name"] + ' }, {"ph": "X"'
    tricky = tmp_path / "tricky.json"
    tricky.write_text(json.dumps(doc))
    # THEN the events are still the ordinary read's
    assert _facts(load_columns(str(tricky), decode=twoprocess.decode_in_two)) == _facts(
        load_columns(str(tricky))
    )
    # AND a truncated trace gets the ordinary one-line error
    cut = tmp_path / "cut.json"
    cut.write_bytes(REAL.read_bytes()[: REAL.stat().st_size * 3 // 4])
    with pytest.raises(TraceError) as ordinary:
        load_columns(str(cut))
    with pytest.raises(TraceError) as halves:
        load_columns(str(cut), decode=twoprocess.decode_in_two)
    assert halves.value.problem == ordinary.value.problem
    # AND no child is left: every forked one was waited for
    for pid in forks:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_small_data_is_decoded_in_one_process(forks: list[int]) -> None:
    # the real trace is far below MIN_BYTES: no fork
    assert _facts(load_columns(str(REAL), decode=twoprocess.decode_in_two)) == _facts(
        load_columns(str(REAL))
    )
    assert forks == []


GPU_TRACE = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "traces"
    / "dlrm_control.rank3.pt.trace.json.gz"
)


@pytest.mark.skipif(not GPU_TRACE.is_file(), reason=f"no real GPU trace at {GPU_TRACE}")
def test_a_real_gpu_trace_read_by_two_processes(forks: list[int]) -> None:
    # GIVEN a real NCCL trace (35 MB inflated: forked with the default sizes) THEN every column and
    # table is the one-process read's, copies' and collectives' args included
    halves = load_columns(str(GPU_TRACE), decode=twoprocess.decode_in_two)
    assert len(forks) == 1
    whole = load_columns(str(GPU_TRACE))
    assert halves.columns.transfers and halves.columns.groups is not None
    assert _facts(halves) == _facts(whole)


@pytest.mark.parametrize("shapes", [False, True])
@pytest.mark.usefixtures("sliced")
def test_a_gz_trace_gets_its_child_half_inflated(
    tmp_path: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch, shapes: bool
) -> None:
    # GIVEN a .gz trace, inflated in small pieces so that its half is reached well before its end
    from stepcli import inputs

    monkeypatch.setattr(inputs, "_INFLATE_STEP", 4096)
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(REAL.read_bytes()))
    seen: list[int] = []
    decoder = twoprocess.DecodeInTwo(shapes)
    real_midway = decoder.midway

    def midway(prefix: bytearray) -> None:
        seen.append(len(prefix))
        real_midway(prefix)

    decoder.midway = midway  # type: ignore[method-assign]
    # WHEN read with the two-process decoder THEN the child starts at half the text, and the columns
    # are the one-process read's
    halves = load_columns(str(gz), shapes=shapes, decode=decoder)
    size = REAL.stat().st_size
    assert len(seen) == 1 and size // 2 <= seen[0] < size // 2 + 8192
    assert len(forks) == 1
    assert _facts(halves) == _facts(load_columns(str(gz), shapes=shapes))


@pytest.mark.usefixtures("sliced")
def test_a_gz_trace_corrupt_after_its_half_stops_the_child(
    tmp_path: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepcli import inputs

    monkeypatch.setattr(inputs, "_INFLATE_STEP", 4096)
    # GIVEN a .gz trace whose last quarter is cut off (its trailer lost: the half is guessed from
    # garbage bytes) and one whose child fails
    whole = gzip.compress(REAL.read_bytes())
    cut = tmp_path / "cut.json.gz"
    # the trailer kept: the child starts at half
    cut.write_bytes(whole[: len(whole) * 3 // 4] + whole[-8:])
    with pytest.raises(TraceError) as ordinary:
        load_columns(str(cut))
    with pytest.raises(TraceError) as halves:
        load_columns(str(cut), decode=twoprocess.DecodeInTwo(False))
    assert halves.value.problem == ordinary.value.problem
    assert len(forks) == 1
    for pid in forks:  # waited for
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(whole)

    def fails(*args: object) -> object:
        raise MemoryError

    monkeypatch.setattr(
        twoprocess,
        "pickle",
        type("P", (), {"dumps": fails, "loads": pickle.loads, "HIGHEST_PROTOCOL": 5}),
    )
    assert _facts(load_columns(str(gz), decode=twoprocess.DecodeInTwo(False))) == _facts(
        load_columns(str(gz))
    )
    assert len(forks) == 2


@pytest.mark.usefixtures("sliced")
def test_work_done_meanwhile_runs_once_and_the_slices_are_shared_as_they_go(
    tmp_path: Path, forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a decoder with work for this process to do while the child decodes (stepcli table: its
    # imports)
    calls: list[int] = []
    mine: list[tuple[int, int]] = []
    real_slices = twoprocess.decode_slices

    child_decoded = tmp_path / "child-decoded"

    def slices(data: object, layout: object, first: int, stop: int, *rest: object) -> None:
        if os.getpid() == parent:
            mine.append((first, stop))
            # a busy machine may not run the child at all before this process is done: wait for it
            if first == 1:
                deadline = time.monotonic() + 120
                while not child_decoded.exists() and time.monotonic() < deadline:
                    time.sleep(0.005)
        real_slices(data, layout, first, stop, *rest)  # type: ignore[arg-type]
        if os.getpid() != parent:
            child_decoded.touch()

    parent = os.getpid()
    monkeypatch.setattr(twoprocess, "decode_slices", slices)
    whole = _facts(load_columns(str(REAL)))
    count = len(reader.slice_layout(bytearray(REAL.read_bytes()))[1])  # type: ignore[index]
    # WHEN a plain trace is read with it THEN the work ran once, in this process, and the columns
    # are the ordinary read's; this process decoded slices from the front, one claim at a time, and
    # the child the others
    decoder = twoprocess.DecodeInTwo(False, meanwhile=lambda: calls.append(os.getpid()))
    assert _facts(load_columns(str(REAL), decode=decoder)) == whole
    assert calls == [parent] and len(forks) == 1
    assert mine == [(i, i + 1) for i in range(len(mine))] and len(mine) < count
    # AND when this process is busy until the child has ended, the child decodes every slice
    mine.clear()
    busy = twoprocess.DecodeInTwo(False, meanwhile=lambda: os.waitpid(forks[-1], 0))
    assert _facts(load_columns(str(REAL), decode=busy)) == whole
    assert mine == [] and len(forks) == 2
    # AND a .gz trace read with a child started at half inflation runs it once too
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(REAL.read_bytes()))
    decoder = twoprocess.DecodeInTwo(False, meanwhile=lambda: calls.append(os.getpid()))
    assert _facts(load_columns(str(gz), decode=decoder)) == whole
    assert calls == [parent, parent] and len(forks) == 3
    # AND work that fails stops the child (killed and waited for) and leaves the ordinary read
    decoder = twoprocess.DecodeInTwo(False, meanwhile=lambda: 1 / 0)
    assert _facts(load_columns(str(REAL), decode=decoder)) == whole
    with pytest.raises(ChildProcessError):
        os.waitpid(forks[3], os.WNOHANG)
    # AND the children that sent their columns were left to exit on their own, and are waited for
    # later (at exit) (the second was waited for by its `meanwhile`)
    assert sorted(twoprocess._exiting) == sorted(forks[:3])
    twoprocess.reap_children()
    assert twoprocess._exiting == []
    for pid in forks:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("memfd", [True, False])
@pytest.mark.usefixtures("sliced")
def test_the_columns_come_back_through_an_in_memory_file_or_the_pipe(
    monkeypatch: pytest.MonkeyPatch, forks: list[int], memfd: bool
) -> None:
    # GIVEN a system with in-memory files (the columns' way back; the pipe carries their length), or
    # without
    made: list[int] = []
    real_memfd = os.memfd_create

    def memfd_create(name: str, flags: int = 0) -> int:
        if not memfd:
            raise OSError(38, "Function not implemented")
        made.append(real_memfd(name, flags))
        return made[-1]

    monkeypatch.setattr(twoprocess.os, "memfd_create", memfd_create)
    fds = len(os.listdir("/proc/self/fd"))
    # THEN the columns are the one-process read's either way, and no descriptor is left open
    assert _facts(load_columns(str(REAL), decode=twoprocess.decode_in_two)) == _facts(
        load_columns(str(REAL))
    )
    assert len(made) == (1 if memfd else 0) and len(forks) == 1
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.usefixtures("sliced")
def test_a_first_half_that_does_not_decode_gives_the_ordinary_error(
    tmp_path: Path, forks: list[int]
) -> None:
    # GIVEN a .gz trace whose first half holds a bare word where a number belongs (its child,
    # started at half inflation, fails on it)
    from stepcli import inputs

    text = REAL.read_text()
    at = text.index('"dur":', len(text) // 8)
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress((text[:at] + '"dur": tru' + text[at + len('"dur":') :]).encode()))
    with pytest.raises(TraceError) as ordinary:
        load_columns(str(bad))
    # WHEN read with the two-process decoder THEN the error is the ordinary read's, word for word
    real_step = inputs._INFLATE_STEP
    try:
        inputs._INFLATE_STEP = 4096
        with pytest.raises(TraceError) as halves:
            load_columns(str(bad), decode=twoprocess.DecodeInTwo(False))
    finally:
        inputs._INFLATE_STEP = real_step
    assert halves.value.problem == ordinary.value.problem and "invalid JSON" in halves.value.problem
    assert len(forks) == 1


@pytest.mark.usefixtures("sliced")
def test_an_interrupt_while_decoding_stops_the_child(forks: list[int]) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_columns(str(REAL), decode=twoprocess.DecodeInTwo(False, meanwhile=interrupted))
    assert len(forks) == 1
    with pytest.raises(ChildProcessError):  # killed and waited for
        os.waitpid(forks[0], os.WNOHANG)
    assert twoprocess._exiting == []
