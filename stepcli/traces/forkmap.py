"""Many files' work shared by this process and children forked from it, each taking the next file as
it is free.

A process pool costs each file a round trip (the task out, its result back, through a queue and a
thread) and leaves this process idle while its workers read: at 1,024 rank files those round trips
were a sixth of `table`'s reading. Here the files to do are tokens in a pipe written once before the
fork; this process and each child read a token (a few bytes, one system call) whenever they are
free, so a slow file holds up no one; each child sends each result back as soon as it has it, and
this process reads them between its own files, so no child holds more than one.
Only for a process that may fork (one thread, Linux: see stepcli.traces.engine._context); the pool
stays for the rest.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import selectors
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from stepcli.errors import StepcliError
from stepcli.traces.read.forked import fork_child, stop_child

_T = TypeVar("_T")
_TOKEN = 4  # bytes per token: the first item of a run of items, little-endian
_LENGTH = 8  # bytes of a result frame's length, little-endian
_RESULTS_PIPE = 1 << 20  # a results pipe's capacity asked for (Linux's default limit for anyone)


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

    def work(send: Callable[[int, _T], object], between: Callable[[], object]) -> None:
        while True:
            token = os.read(claims_read, _TOKEN)
            if len(token) < _TOKEN:
                return
            first = int.from_bytes(token, "little")
            for index in range(first, min(first + per_token, len(items))):
                send(index, function(items[index]))
                between()

    results: dict[int, _T] = {}
    children: list[_ForkedWorker] = []
    try:
        for _ in range(processes - 1):
            child = _fork_worker(work)
            if child is None:
                break
            children.append(child)

        def drain() -> None:
            for child in children:
                child.drain(results)

        work(results.__setitem__, drain)
        _drain_to_the_end(children, results)
        while children:
            children.pop(0).reap(processes)
    finally:
        # this process failed (Ctrl-C?) while they worked: they stop with it
        for child in children:
            stop_child(child.pid)
            os.close(child.fd)
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


_Work = Callable[[Callable[[int, Any], object], Callable[[], object]], None]


def _fork_worker(work: _Work) -> _ForkedWorker | None:
    """A child doing `work()` and sending each result (pickled, a frame each) through a pipe of its
    own as soon as it has it, or None when the fork (or its pipe) is refused."""
    try:
        out_read, out_write = os.pipe()
    except OSError:
        return None
    try:  # room for a few results, so a child rarely waits for this process to read
        fcntl.fcntl(out_write, fcntl.F_SETPIPE_SZ, _RESULTS_PIPE)
    except (AttributeError, OSError):
        pass

    def child() -> None:
        os.close(out_read)
        sink = _PipeSink(out_write)

        def send(index: int, result: object) -> None:
            try:
                frame = pickle.dumps(("item", index, result), pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # an unpicklable result
                raise RuntimeError(f"a worker's result could not be sent back: {exc}") from None
            sink.frame(frame)

        try:
            work(send, lambda: None)
            outcome: object = ("done",)
        except Exception as exc:  # a bug in `function`: raised in the parent, as a pool would
            outcome = ("raised", exc)
        try:
            last = pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an exception that does not pickle
            last = pickle.dumps(("raised", RuntimeError(f"a worker failed: {exc}")))
        sink.frame(last)
        sink.finish()
        os.close(out_write)

    try:
        pid = fork_child(child)
    except OSError:
        os.close(out_read)
        os.close(out_write)
        return None
    os.close(out_write)
    os.set_blocking(out_read, False)
    return _ForkedWorker(pid, out_read)


class _PipeSink:
    """The child's end of its results pipe: each result a frame (its length, then its pickle),
    sent as soon as it is made, so a child holds one result at a time (at 1,024 rank files,
    `whatif`'s lanes were ~12 MiB pickled a child, sent at its end, and that copy and the lanes
    behind it were the peak of the process tree). What the pipe cannot take at once (the parent is
    busy with a long file of its own) waits in a backlog while the child goes on with its next
    item, so no one waits for the parent; it is sent before the next frame, and at the end."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.backlog = bytearray()
        os.set_blocking(fd, False)

    def frame(self, data: bytes) -> None:
        self._send(len(data).to_bytes(_LENGTH, "little"))
        self._send(data)

    def finish(self) -> None:
        """Send the backlog, waiting for the parent to read it."""
        os.set_blocking(self.fd, True)
        while self.backlog:
            del self.backlog[: os.write(self.fd, self.backlog)]

    def _send(self, data: bytes) -> None:
        done = 0
        try:
            while self.backlog:  # (in order: what waits goes first)
                del self.backlog[: os.write(self.fd, self.backlog)]
            while done < len(data):
                with memoryview(data)[done:] as rest:
                    done += os.write(self.fd, rest)
        except BlockingIOError:  # the pipe is full: the rest waits
            if self.backlog:
                self.backlog += data
            else:
                self.backlog += memoryview(data)[done:]


class _ForkedWorker:
    """A forked worker as this process sees it: its pid, the read end of its results (non-blocking)
    and the frames read so far; its results go into the caller's dict as each frame is whole."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.pending = bytearray()
        self.ended = False  # the pipe is closed: every frame is in
        self.outcome: tuple[Any, ...] | None = None  # ("done",) or ("raised", exc): the last frame
        self.broken = False  # a frame that did not unpickle

    def drain(self, results: dict[int, Any]) -> None:
        """Read what the child has sent so far, without waiting, and keep its whole frames."""
        while not self.ended:
            try:
                data = os.read(self.fd, _RESULTS_PIPE)
            except BlockingIOError:
                break
            if not data:
                self.ended = True
                break
            self.pending += data
            self._frames(results)

    def _frames(self, results: dict[int, Any]) -> None:
        pending = self.pending
        while len(pending) >= _LENGTH:
            size = int.from_bytes(pending[:_LENGTH], "little")
            if len(pending) < _LENGTH + size:
                return
            try:
                with memoryview(pending)[_LENGTH : _LENGTH + size] as body:  # (not copied)
                    frame = pickle.loads(body)
            except Exception:
                frame, self.broken = None, True
            del pending[: _LENGTH + size]
            if isinstance(frame, tuple) and frame and frame[0] == "item" and len(frame) == 3:
                results[frame[1]] = frame[2]
            elif isinstance(frame, tuple) and frame and frame[0] in ("done", "raised"):
                self.outcome = frame
            else:
                self.broken = True

    def reap(self, processes: int) -> None:
        """Wait for the child (its pipe is closed); raise what it raised, or StepcliError when it
        died before it was done."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except BaseException:  # (Ctrl-C while waiting for it)
            stop_child(self.pid)
            raise
        finally:
            os.close(self.fd)
        outcome = self.outcome
        if (
            outcome is not None
            and outcome[0] == "raised"
            and isinstance(outcome[-1], BaseException)
        ):
            raise outcome[-1]
        if status != 0 or outcome != ("done",) or self.broken or self.pending:
            raise worker_died(processes)


def _drain_to_the_end(children: list[_ForkedWorker], results: dict[int, Any]) -> None:
    """Read every child's frames as they come until each has closed its pipe."""
    with selectors.DefaultSelector() as waiting:
        for child in children:
            child.drain(results)
            if not child.ended:
                waiting.register(child.fd, selectors.EVENT_READ, child)
        while waiting.get_map():
            for key, _ in waiting.select():
                child = key.data
                child.drain(results)
                if child.ended:
                    waiting.unregister(child.fd)


def worker_died(processes: int) -> StepcliError:
    """The one line for a worker process that died while reading (a pool's or forked_map's)."""
    return StepcliError(
        f"a worker process reading the traces died (out of memory?); try again with fewer, e.g. "
        f"--jobs {max(1, processes // 2)}"
    )
