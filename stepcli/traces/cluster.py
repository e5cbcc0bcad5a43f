"""The same per-file plan as stepcli.traces.engine on a Dask distributed cluster (`--scheduler
tcp://host:8786`): each file is read and summarized by a cluster worker and only the small per-file
parts come back to be merged here.

An optional extra (`pip install 'stepcli[dask]'`); the workers need stepcli installed and the trace
paths readable at the same absolute paths (a shared file system).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stepcli.errors import StepcliError

_INSTALL = "--scheduler needs Dask's distributed package: pip install 'stepcli[dask]'"
# the whole check: name lookup, TCP connection and the scheduler's first message
CONNECT_TIMEOUT_S = 10.0
# tasks per worker thread: a slow file or worker holds back a quarter of a thread's share
TASKS_PER_THREAD = 4
MIN_TASKS = 16  # a cluster still scaling up (no worker yet) gets work it can spread
# --scheduler-wait: how long a cluster may have no worker (none joined, or all died)
WORKER_WAIT_S = 120.0
_MAX_HANDSHAKE_BYTES = 1 << 20  # a scheduler's greeting is a few hundred bytes
_ADDRESS = re.compile(
    r"(?:tcp://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})/?"
)


def parse_scheduler(address: str) -> tuple[str, int]:
    """(host, port) of `tcp://HOST:PORT` (or `HOST:PORT`); StepcliError (exit 2) for anything else,
    before any connection is tried."""
    scheme = address.split("://", 1)[0] if "://" in address else None
    if scheme is not None and scheme != "tcp":
        raise StepcliError(
            f"--scheduler {address}: {scheme}:// is not supported; give tcp://HOST:PORT"
        )
    match = _ADDRESS.fullmatch(address)
    if match is None:
        raise StepcliError(f"--scheduler {address}: not a scheduler address; give tcp://HOST:PORT")
    port = int(match["port"])
    if not 0 < port < 65536:
        raise StepcliError(f"--scheduler {address}: port {port} is not between 1 and 65535")
    return match["host"].strip("[]"), port


def check_scheduler(address: str, host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Within `timeout` seconds in all: the host resolves, accepts a TCP connection and greets as a
    Dask scheduler does (it sends its handshake first: an 8-byte little-endian length, then that
    many bytes). Anything else is one StepcliError, so Dask never waits on a silent listener or
    sizes a buffer from garbage."""
    deadline = time.monotonic() + timeout
    where = f"the Dask scheduler at {address}"
    addresses = _resolve(host, port, timeout)
    if addresses is None:
        raise StepcliError(
            f"cannot reach {where}: no answer from the name lookup within {timeout:.0f} s"
        )
    if isinstance(addresses, OSError):
        raise StepcliError(f"cannot reach {where}: {addresses.strerror or addresses}")
    try:
        with socket.create_connection(
            (addresses, port), timeout=max(0.1, deadline - time.monotonic())
        ) as sock:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            header = _receive(sock, 8)
            size = int.from_bytes(header, "little") if len(header) == 8 else 0
            greeting = _receive(sock, size) if 0 < size <= _MAX_HANDSHAKE_BYTES else b""
    except TimeoutError:
        raise StepcliError(f"cannot reach {where}: no answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise StepcliError(f"cannot reach {where}: {exc.strerror or exc}") from None
    if len(header) < 8:
        raise StepcliError(
            f"{where} closed the connection without a greeting: not a Dask scheduler"
        )
    if not _is_framed(greeting, size):
        raise StepcliError(f"{where} did not greet as a Dask scheduler does: not a Dask scheduler")


def _is_framed(greeting: bytes, size: int) -> bool:
    """Whether `greeting` is one message as Dask's TCP comm frames it: a frame count, each frame's
    length, the frames, exactly `size` bytes in all."""
    if len(greeting) != size or size < 8:
        return False
    count = int.from_bytes(greeting[:8], "little")
    if not 0 < count <= (size - 8) // 8:
        return False
    lengths = [int.from_bytes(greeting[8 + 8 * i : 16 + 8 * i], "little") for i in range(count)]
    return 8 + 8 * count + sum(lengths) == size


def _resolve(host: str, port: int, timeout: float) -> str | OSError | None:
    """The host's first address; None when the lookup does not answer within `timeout` (it cannot be
    cancelled, so it runs on a daemon thread that is left behind)."""
    answer: list[str | OSError] = []

    def lookup() -> None:
        try:
            answer.append(str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]))
        except OSError as exc:
            answer.append(exc)

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else None


def _receive(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        piece = sock.recv(count - len(data))
        if not piece:
            break
        data += piece
    return data


def cluster_results(
    scheduler: str, work: Callable[[str], Any], files: list[str], wait_s: float = WORKER_WAIT_S
) -> list[Any]:
    """`work(path)` (a per-file step: stepcli.traces.engine's summary of a file, whatif's lane) for
    every file on the cluster at `scheduler`, in file order, the results naming the files as given
    here (their `path`). Never waits for ever and never shows Dask's own tracebacks: no worker for
    `wait_s` seconds (none joined, or they died on the work), a task a worker could not run, a
    scheduler gone mid-read: each is one StepcliError (exit 2)."""
    host, port = parse_scheduler(scheduler)
    try:
        from distributed import Client
    except ImportError:
        raise StepcliError(_INSTALL) from None
    check_scheduler(scheduler, host, port)
    _quiet_dask()
    absolute = [os.path.abspath(f) for f in files]
    try:
        client = Client(
            f"tcp://{scheduler.split('://', 1)[-1]}",
            timeout=f"{CONNECT_TIMEOUT_S:.0f}s",
            set_as_default=False,
        )
    # whatever answered is not a scheduler Dask can use (MemoryError included)
    except Exception as exc:
        raise StepcliError(
            f"cannot use the Dask scheduler at {scheduler}: {type(exc).__name__}: {exc}"
        ) from None
    try:
        try:
            # none yet: an adaptive cluster scales up on the work
            threads = sum(client.nthreads().values())
        except Exception as exc:
            raise _lost(scheduler, exc) from None
        batches = batched(absolute, threads)
        futures = client.map(_each, batches, per_file=work, pure=False)
        results = [
            result for batch in _gather(client, futures, scheduler, wait_s) for result in batch
        ]
    finally:
        _close(client)
    # name the files as the user gave them, like the local engine
    for given, result in zip(files, results):
        for part in result if isinstance(result, list) else [result]:
            if hasattr(part, "path"):
                part.path = given
    return list(results)


def _no_worker(scheduler: str, wait_s: float, seen: bool) -> StepcliError:
    what = (
        "lost its workers (they left, or died on stepcli's work: is stepcli installed on them?)"
        if seen
        else "has no worker"
    )
    return StepcliError(
        f"the Dask scheduler at {scheduler} {what}, and none ran the work for {wait_s:g} s: start "
        f"workers that have stepcli installed (`dask worker {scheduler}`), or give a longer "
        f"--scheduler-wait"
    )


def _gather(client: Any, futures: list[Any], scheduler: str, wait_s: float) -> list[Any]:
    """The futures' results, in order. Polled rather than awaited whole: a cluster whose workers are
    all gone (died on the work, or left) for `wait_s` seconds, or a scheduler gone, ends the wait
    with one line; a task's own error (a bad trace: StepcliError) is raised as it is, any other a
    worker raised in one line."""
    alone_since: float | None = None
    # a worker was there: none now means they left, or died on the work (no stepcli on them?)
    seen = False
    while True:
        try:
            if all(f.status != "pending" for f in futures) or any(
                f.status != "finished" and f.done() for f in futures
            ):
                # (raises the first error: a bad file is named at once)
                return list(client.gather(futures))
            threads = sum(client.nthreads().values())
        except StepcliError:
            raise
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            if client.status != "running" or _is_comm_error(exc):
                raise _lost(scheduler, exc) from None
            if type(exc).__name__ == "KilledWorker":
                raise StepcliError(
                    f"the Dask workers of {scheduler} died running stepcli's work ({exc}): are "
                    f"stepcli and its "
                    "dependencies installed on them?"
                ) from None
            raise StepcliError(
                f"a Dask worker of {scheduler} could not run stepcli's work: {type(exc).__name__}: "
                f"{exc} (stepcli "
                "must be installed on the workers, the traces at the same paths)"
            ) from None
        if threads:
            alone_since, seen = None, True
        elif alone_since is None:
            alone_since = time.monotonic()
            print(
                f"stepcli: waiting for a worker of the Dask scheduler at {scheduler} (at most "
                f"{wait_s:g} s: "
                "--scheduler-wait)",
                file=sys.stderr,
                flush=True,
            )
        elif time.monotonic() - alone_since >= wait_s:
            raise _no_worker(scheduler, wait_s, seen)
        time.sleep(0.1)


def _is_comm_error(exc: BaseException) -> bool:
    """A lost connection to the scheduler, as Dask raises it (CommClosedError, an OSError, a
    cancelled future)."""
    names = {
        type(exc).__name__,
        *(type(c).__name__ for c in (exc.__cause__, exc.__context__) if c is not None),
    }
    return isinstance(exc, (OSError, EOFError)) or bool(
        names & {"CommClosedError", "CancelledError", "FutureCancelledError", "TimeoutError"}
    )


def _lost(scheduler: str, exc: BaseException) -> StepcliError:
    text = str(exc).strip()
    cancelled = "cancelled" in type(exc).__name__.lower() or "connection-lost" in text
    reason = "the connection to it was lost" if cancelled or not text else text.splitlines()[0]
    return StepcliError(
        f"lost the Dask scheduler at {scheduler} while the traces were read: {reason}"
    )


def _close(client: Any) -> None:
    """Close the client without waiting on a scheduler that is gone, and without Dask's words at
    exit."""
    try:
        client.close(timeout=2)
    except BaseException:  # noqa: S110 (gone already: nothing to close, nothing to say)
        pass


def _quiet_dask() -> None:
    """Dask reports a lost scheduler, a Ctrl-C or a dead worker through logging and asyncio ("Task
    exception was never retrieved", tracebacks of its comms) besides raising: stepcli says it in one
    line instead."""
    import logging

    # (Dask's loggers set their own levels; a short command logs nothing else)
    logging.disable(logging.CRITICAL)
    sys.unraisablehook = _silent  # a half-built Client's __del__ would print a traceback at exit


def batched(files: list[str], threads: int) -> list[list[str]]:
    """The files in order, in `TASKS_PER_THREAD` runs of neighbours per worker thread (at least
    `MIN_TASKS`, at most one file each). A task costs a worker ~3 ms and the scheduler ~1.4 ms
    besides its reading (~4 ms for one rank of a 1,024-rank job): one task per file spent more on
    the cluster than on the files."""
    count = min(len(files), max(MIN_TASKS, TASKS_PER_THREAD * threads))
    if count <= 0:
        return []
    size, extra = divmod(len(files), count)
    out, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        out.append(files[start:end])
        start = end
    return out


def _each(files: list[str], per_file: Callable[[str], Any]) -> list[Any]:
    """One task: `per_file` for each of a batch of files, on a worker."""
    return [per_file(path) for path in files]


def _silent(unraisable: Any) -> None:
    """sys.unraisablehook that prints nothing."""
