"""Many files' work shared by this process and children forked from it, each taking the next file as
it is free.

A process pool costs each file a round trip (the task out, its result back, through a queue and a
thread) and leaves this process idle while its workers read: at 1,024 rank files those round trips
were a sixth of `table`'s reading. Here the files to do are tokens in a pipe written once before the
fork; this process and each child read a token (a few bytes, one system call) whenever they are
free, so a slow file holds up no one, and each child sends all its results back once, at its end.
Only for a process that may fork (one thread, Linux: see stepcli.traces.engine._context); the pool
stays for the rest.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable, Sequence
from typing import TypeVar

from stepcli.errors import StepcliError
from stepcli.traces.read.forked import fork_child, stop_child

_T = TypeVar("_T")
_TOKEN = 4  # bytes per token: the first item of a run of items, little-endian


def forked_map(
    function: Callable[[str], _T], items: Sequence[str], processes: int
) -> list[_T] | None:
    """`function(item)` for each item, in order, done by this process and up to `processes - 1`
    forked children; None, before any work, when the pipe of tokens cannot be made (no file
    descriptor left): the caller does the items itself. A child that cannot be forked (a process
    limit) leaves its share to the others; one that dies (killed, out of memory) is a StepcliError
    naming `--jobs`, as a pool's broken worker is; an exception `function` raises in a child is
    raised here."""
    try:
        claims_read, claims_write = os.pipe()
    except OSError:
        return None
    try:
        per_token = _write_tokens(claims_write, len(items))
    except OSError:
        os.close(claims_read)
        return None
    finally:
        os.close(claims_write)

    def work() -> list[tuple[int, _T]]:
        done: list[tuple[int, _T]] = []
        while True:
            token = os.read(claims_read, _TOKEN)
            if len(token) < _TOKEN:
                return done
            first = int.from_bytes(token, "little")
            for index in range(first, min(first + per_token, len(items))):
                done.append((index, function(items[index])))

    results: dict[int, _T] = {}
    children: list[tuple[int, int]] = []  # (pid, the read end of its results)
    try:
        for _ in range(processes - 1):
            child = _fork_worker(work)
            if child is None:
                break
            children.append(child)
        results.update(work())
        while children:
            pid, pipe = children.pop(0)
            results.update(_collect(pid, pipe, processes))
    finally:
        # this process failed (Ctrl-C?) while they worked: they stop with it
        for pid, pipe in children:
            stop_child(pid)
            os.close(pipe)
        os.close(claims_read)
    return [results[i] for i in range(len(items))]


def _write_tokens(pipe: int, count: int) -> int:
    """Write the tokens of `count` items into the pipe, all at once (its capacity bounds them: past
    that, each token stands for a run of neighbouring items); the items per token."""
    try:
        capacity = fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):
        capacity = 4096  # what every pipe holds (PIPE_BUF)
    tokens = max(1, capacity // _TOKEN)
    per_token = max(1, -(-count // tokens))
    data = b"".join(first.to_bytes(_TOKEN, "little") for first in range(0, count, per_token))
    written = os.write(pipe, data)
    # (a pipe takes what its capacity holds in one write; never seen short)
    if written != len(data):
        raise OSError("the work tokens did not fit in their pipe")
    return per_token


def _fork_worker(work: Callable[[], list[tuple[int, _T]]]) -> tuple[int, int] | None:
    """A child doing `work()` and sending its results (pickled) through a pipe of its own, or None
    when the fork (or its pipe) is refused."""
    try:
        out_read, out_write = os.pipe()
    except OSError:
        return None

    def child() -> None:
        os.close(out_read)
        try:
            outcome: object = ("done", work())
        except Exception as exc:  # a bug in `function`: raised in the parent, as a pool would
            outcome = ("raised", exc)
        sink = _PipeSink(out_write)
        try:
            pickle.dump(outcome, sink, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an unpicklable result or exception
            if sink.sent:
                raise  # (partly sent: the parent sees a child that failed)
            pickle.dump(
                ("raised", RuntimeError(f"a worker's result could not be sent back: {exc}")), sink
            )
        os.close(out_write)

    try:
        pid = fork_child(child)
    except OSError:
        os.close(out_read)
        os.close(out_write)
        return None
    os.close(out_write)
    return pid, out_read


class _PipeSink:
    """pickle.dump's file: the pipe, written frame by frame as the pickle is made, so a child never
    holds its whole result twice (at 1,024 rank files, `whatif`'s lanes are ~12 MiB pickled a
    child, and that copy was the peak of its process tree)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.sent = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        while view:  # (a pipe takes a large write in parts)
            view = view[os.write(self.fd, view) :]
        self.sent += size
        return size


def _collect(pid: int, pipe: int, processes: int) -> list[tuple[int, _T]]:
    """A child's results, once it has sent them (the pipe is closed and the child reaped);
    StepcliError when it died first."""
    try:
        with open(pipe, "rb") as source:
            data = source.read()
    except BaseException:  # (Ctrl-C while waiting for it)
        stop_child(pid)
        raise
    _, status = os.waitpid(pid, 0)
    try:
        kind, value = pickle.loads(data) if status == 0 else (None, None)
    except Exception:
        kind, value = None, None
    if kind == "raised" and isinstance(value, BaseException):
        raise value
    if kind != "done" or not isinstance(value, list):
        raise worker_died(processes)
    return value


def worker_died(processes: int) -> StepcliError:
    """The one line for a worker process that died while reading (a pool's or forked_map's)."""
    return StepcliError(
        f"a worker process reading the traces died (out of memory?); try again with fewer, e.g. "
        f"--jobs {max(1, processes // 2)}"
    )
