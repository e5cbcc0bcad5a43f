"""stepcli.traces.forkmap: files shared by this process and forked children, answers in order
whoever did them."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import pytest

from stepcli.traces import forkmap

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="children fork on Linux only"
)


def _who(item: str) -> tuple[str, int]:
    return item, os.getpid()


def _after_the_parent(parent: int, marker: str, item: str) -> tuple[str, int]:
    """The children wait until the parent has done a file of its own (it leaves a marker), so it
    surely does one."""
    if os.getpid() == parent:
        open(marker, "w").close()
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.005)
    return item, os.getpid()


def test_every_item_is_done_once_in_order_by_this_process_and_its_children(tmp_path: Path) -> None:
    items = [f"f{i}" for i in range(300)]
    work = functools.partial(_after_the_parent, os.getpid(), str(tmp_path / "parent-did-one"))
    done = forkmap.forked_map(work, items, 3)
    assert [item for item, _ in done] == items
    # this process takes files too, instead of waiting
    assert os.getpid() in {pid for _, pid in done}


def test_more_items_than_the_pipe_holds_are_shared_in_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a pipe that holds 4 tokens (a small pipe-max-size) and 10,001 items
    real = forkmap.fcntl.fcntl
    monkeypatch.setattr(
        forkmap.fcntl,
        "fcntl",
        lambda fd, op, *a: 16 if op == forkmap.fcntl.F_GETPIPE_SZ else real(fd, op, *a),
    )
    items = [str(i) for i in range(10_001)]
    # THEN each token stands for a run of neighbours, and every item is still done once, in order
    assert [item for item, _ in forkmap.forked_map(_who, items, 2)] == items


def _fails_on_b(item: str) -> str:
    if item == "b":
        raise ValueError(f"bad {item} in {os.getpid()}")
    return item


def test_an_exception_in_a_child_is_raised_here() -> None:
    with pytest.raises(ValueError, match="bad b"):
        forkmap.forked_map(_fails_on_b, ["a", "b", "c", "d"], 2)


def test_a_refused_fork_leaves_the_work_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    done = forkmap.forked_map(_who, ["a", "b", "c"], 4)
    assert done == [("a", os.getpid()), ("b", os.getpid()), ("c", os.getpid())]


def test_no_pipe_for_the_tokens_leaves_every_item_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a process out of file descriptors THEN nothing is done and the caller is told to do the
    # items itself
    def refused() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(forkmap.os, "pipe", refused)
    assert forkmap.forked_map(_who, ["a", "b"], 2) is None


def test_a_childs_result_goes_into_the_pipe_as_it_is_pickled_whole_and_in_order() -> None:
    # a result larger than the pipe holds, read while it is written (as the parent does)
    read_end, write_end = os.pipe()
    big = bytes(range(256)) * 4096  # 1 MiB, pickled in parts past the pipe's 64 KiB
    sink = forkmap._PipeSink(write_end)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(read_end)
        forkmap.pickle.dump(("done", [big, 7]), sink, forkmap.pickle.HIGHEST_PROTOCOL)
        os._exit(0 if sink.sent > len(big) else 1)
    os.close(write_end)
    with open(read_end, "rb") as source:
        data = source.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and forkmap.pickle.loads(data) == ("done", [big, 7])
