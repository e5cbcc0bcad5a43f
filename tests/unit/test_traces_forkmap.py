"""stepcli.traces.forkmap: files shared by this process and forked children, answers in order
whoever did them."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stepcli.errors import StepcliError
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


def test_a_childs_results_come_back_a_frame_each_whole_and_in_order_past_the_pipes_size() -> None:
    # GIVEN results larger than a pipe holds (1 MiB each), pickled and sent as they are made
    items = ["a", "b", "c", "d", "e", "f"]
    done = forkmap.forked_map(_big, items, 3)
    # THEN each is back whole, in order, whoever made it
    assert done == [_big(item) for item in items]


def _big(item: str) -> bytes:
    return item.encode() * (1 << 20)


def _a_child_first(
    parent: int, marker: str, in_the_child: Callable[[str], object], item: str
) -> object:
    """This process waits until a child has taken an item (it leaves a marker), so a child surely
    takes one; the child's result is `in_the_child(item)`."""
    if os.getpid() != parent:
        open(marker, "w").close()
        return in_the_child(item)
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.005)
    return item


def _dies(item: str) -> object:
    os._exit(3)  # killed, out of memory: no frame, no outcome


def test_a_child_that_dies_is_one_line_naming_jobs(tmp_path: Path) -> None:
    work = functools.partial(_a_child_first, os.getpid(), str(tmp_path / "child-took-one"), _dies)
    with pytest.raises(StepcliError) as died:
        forkmap.forked_map(work, ["a", "b", "c", "d"], 2)
    # the one line a pool's broken worker gives
    assert "a worker process reading the traces died" in str(died.value)
    assert "--jobs 1" in str(died.value)


def _unpicklable(item: str) -> object:
    return lambda: item


def test_a_result_that_cannot_be_sent_back_is_raised_here_with_the_reason(tmp_path: Path) -> None:
    work = functools.partial(
        _a_child_first, os.getpid(), str(tmp_path / "child-took-one"), _unpicklable
    )
    with pytest.raises(RuntimeError, match="could not be sent back"):
        forkmap.forked_map(work, ["a", "b", "c", "d"], 2)


def test_a_child_sends_each_result_as_soon_as_it_has_it() -> None:
    # GIVEN a child that, after its first result, waits until this process has read it
    go_read, go_write = os.pipe()

    def work(send: Callable[[int, object], object], between: Callable[[], object]) -> None:
        send(0, "first")
        os.read(go_read, 1)
        send(1, "second")

    child = forkmap._fork_worker(work)
    assert child is not None
    results: dict[int, object] = {}
    deadline = time.monotonic() + 60
    while 0 not in results and time.monotonic() < deadline:
        child.drain(results)
        time.sleep(0.005)
    # THEN the first result is here while the child still works: it holds one result at a time
    assert results == {0: "first"}
    os.write(go_write, b"x")
    forkmap._drain_to_the_end([child], results)
    child.reap(2)
    assert results == {0: "first", 1: "second"}
    os.close(go_read)
    os.close(go_write)


_CHILD_DONE: list[str] = []


def _parent_waits_for_the_child(parent: int, marker: str, count: int, item: str) -> object:
    """The parent's item waits until a child has done every other item; a child's results are
    larger than a pipe holds."""
    if os.getpid() != parent:
        _CHILD_DONE.append(item)
        if len(_CHILD_DONE) == count - 1:
            open(marker, "w").close()
        return item.encode() * (2 << 20)
    deadline = time.monotonic() + 30
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.005)
    return os.path.exists(marker)


def test_a_child_goes_on_while_this_process_is_busy_with_a_long_item(tmp_path: Path) -> None:
    # GIVEN this process on a long item (it waits for the child), and the child's results (2 MiB
    # each) more than its pipe holds while no one reads it
    items = ["a", "b", "c", "d"]
    work = functools.partial(
        _parent_waits_for_the_child, os.getpid(), str(tmp_path / "child-did-all"), len(items)
    )
    done = forkmap.forked_map(work, items, 2)
    assert done is not None
    # THEN the child did every other item meanwhile (its results wait in a backlog), and every
    # result is back whole
    assert [r for r in done if not isinstance(r, bytes)] in ([True], [])
    assert all(
        r == item.encode() * (2 << 20) for r, item in zip(done, items) if isinstance(r, bytes)
    )
