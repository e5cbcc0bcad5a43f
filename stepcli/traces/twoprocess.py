"""One trace held in memory decoded by this process and one forked child at once.

A .gz trace, or a plain one too small to be cut into ranges read by several processes (stepcli.traces.splitread),
is read into one buffer and decoded in ~1 MB slices (stepcli.traces.reader). Here a forked child decodes the later
half of the slices, and the document around them, from its copy-on-write view of the same buffer, and sends its
columns back through a pipe, while this process decodes the first half. Decoding is most of `stepcli table`'s time
on one file, so on two cores this takes about half of it off the wall clock (`scripts/bench_gpu.py`).

Only `stepcli table`'s engine uses it, and only where forking is safe (one thread; stepcli.traces.engine). Any
surprise (no fork, a slice that does not decode, a child that fails or dies) falls back to decoding the data the
ordinary way in this process, which also gives the exact error.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys

from stepcli.traces.columns import ColumnKeeper
from stepcli.traces.reader import _decode, _Keeper, _Meta, _NotChunkable, decode_rest, decode_slices, slice_layout

MIN_BYTES = 8 * 1024 * 1024  # below this, a fork and a pipe cost about what the child would save


def decode_in_two(
    path: str, data: bytes | bytearray, shapes: bool, keeper_type: type[_Keeper]
) -> tuple[_Meta, _Keeper]:
    """Decode `data` like stepcli.traces.reader._decode does, its later half in a forked child."""
    layout = None
    if keeper_type is ColumnKeeper and len(data) >= MIN_BYTES:
        try:
            layout = slice_layout(data)
        except _NotChunkable:
            pass
    if layout is None or len(layout[1]) < 2:
        return _decode(path, data, shapes, keeper_type)
    half = (len(layout[1]) + 1) // 2  # this process takes the odd slice: the child also decodes the document
    child = _start_child(data, layout, half, shapes)
    if child is None:
        return _decode(path, data, shapes, keeper_type)
    pid, pipe = child
    keeper = ColumnKeeper(shapes)
    result = None
    status: int | None = None
    try:
        decode_slices(data, layout, 0, half, shapes, keeper)
        with open(pipe, "rb", closefd=False) as reading:
            payload = reading.read()
        status = os.waitpid(pid, 0)[1]
        if os.waitstatus_to_exitcode(status) == 0 and payload:
            result = pickle.loads(payload)
    except Exception:  # a slice that does not decode: the ordinary way below names the problem
        result = None
    finally:
        os.close(pipe)
        if status is None:  # not waited for yet (this process failed or was interrupted): stop it first
            _stop(pid)
    if result is None:
        return _decode(path, data, shapes, keeper_type)
    meta, columns, count, skipped = result
    keeper.absorb_columns(columns, count, skipped)
    return meta, keeper


def _start_child(
    data: bytes | bytearray, layout: tuple[int, list[int]], half: int, shapes: bool
) -> tuple[int, int] | None:
    """Fork the child that decodes slices `half` on and the document's rest; (its pid, the pipe's reading end)."""
    for stream in (sys.stdout, sys.stderr):  # a forked process must not inherit text this one still buffers
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        reading, writing = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:  # a process limit: decode here alone
        os.close(reading)
        os.close(writing)
        return None
    if pid:
        os.close(writing)
        return pid, reading
    status = 1
    try:  # the child: never returns, never runs the parent's exit handlers
        os.close(reading)
        keeper = ColumnKeeper(shapes)
        decode_slices(data, layout, half, len(layout[1]), shapes, keeper)
        meta, _ = decode_rest(data, layout, shapes, keeper)
        payload = pickle.dumps((meta, keeper.columns(), keeper.count, keeper.skipped), protocol=pickle.HIGHEST_PROTOCOL)
        with open(writing, "wb") as pipe:
            pipe.write(payload)
        status = 0
    except BaseException:  # (Ctrl-C too) the parent sees a failed child and decodes this half itself
        pass
    finally:
        os._exit(status)


def _stop(pid: int) -> None:
    """Kill the child and wait for it (it has not been waited for, so its pid is still its own)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
