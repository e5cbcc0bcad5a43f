"""One trace held in memory decoded by this process and one forked child at once.

A .gz trace, or a plain one too small to be cut into ranges read by several processes (stepcli.traces.splitread),
is read into one buffer and decoded in ~1 MB slices (stepcli.traces.reader). Here a forked child decodes part of
the slices from its copy-on-write view of the same buffer and sends its columns back through a pipe, while this
process decodes the rest. Decoding is most of `stepcli table`'s time on one file, so on two cores this takes
about half of it off the wall clock (`scripts/bench_gpu.py`):

- a .gz trace: the child is forked when the text is half inflated (read_input's `midway`) and decodes that first
  half while this process inflates the second and then decodes it, with the document around the list;
- otherwise: the child is forked once the text is read and decodes its later half and the document.

Only `stepcli table`'s engine uses it, and only where forking is safe (one thread; stepcli.traces.engine). Any
surprise (no fork, a slice that does not decode, a child that fails or dies) falls back to decoding the data the
ordinary way in this process, which also gives the exact error.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any

from stepcli.traces.columns import ColumnKeeper
from stepcli.traces.reader import (
    Text,
    _decode,
    _Keeper,
    _Meta,
    _NotChunkable,
    decode_rest,
    decode_slices,
    slice_layout,
)

MIN_BYTES = 8 * 1024 * 1024  # below this, a fork and a pipe cost about what the child would save
# The share of the slices this process decodes when it also has other work to do while the child decodes (its
# `meanwhile`: stepcli table imports its analysis, ~35 ms, ~a fifth of decoding a 35 MB trace's half).
MEANWHILE_SHARE = 0.4

_Layout = tuple[int, list[int]]


class DecodeInTwo:
    """The decoder of one file (stepcli.traces.reader.Decode), with the `midway` hook that starts the child early."""

    def __init__(self, shapes: bool, meanwhile: Callable[[], object] | None = None) -> None:
        self.shapes = shapes
        self.meanwhile = meanwhile  # work of this process that can be done while the child decodes
        self._early: tuple[int, int, _Layout] | None = None  # the child decoding the first half: pid, pipe, layout

    def midway(self, prefix: bytearray) -> None:
        """Half of a .gz trace is inflated: a child decodes its slices now, while the rest inflates."""
        layout = _layout(prefix, MIN_BYTES // 2)
        if layout is None:
            return
        child = _start_child(prefix, layout, 0, len(layout[1]), self.shapes, with_rest=False)
        if child is not None:
            self._early = (*child, layout)

    def abandon(self) -> None:
        """The file could not be read after all: stop the child."""
        early, self._early = self._early, None
        if early is not None:
            os.close(early[1])
            _stop(early[0])

    def __call__(self, path: str, data: Text, shapes: bool, keeper_type: type[_Keeper]) -> tuple[_Meta, _Keeper]:
        early, self._early = self._early, None
        if early is None:
            return decode_in_two(path, data, shapes, keeper_type, self.meanwhile)
        pid, pipe, prefix = early
        stop = len(prefix[1])
        keeper = ColumnKeeper(shapes)
        try:
            if self.meanwhile is not None:
                self.meanwhile()
            layout = slice_layout(data, prefix)
            assert layout is not None
            decode_slices(data, layout, stop, len(layout[1]), shapes, keeper)
            meta, _ = decode_rest(data, layout, shapes, keeper)
        except Exception:  # the ordinary way names the problem
            os.close(pipe)
            _stop(pid)
            return _decode(path, data, shapes, keeper_type)
        result = _collect(pid, pipe)
        whole = ColumnKeeper(shapes)
        if result is None:  # the child failed: its slices are decoded here
            decode_slices(data, layout, 0, stop, shapes, whole)
        else:
            whole.absorb_columns(*result[1:])
        whole.absorb(keeper)
        return meta, whole


def decode_in_two(
    path: str, data: Text, shapes: bool, keeper_type: type[_Keeper], meanwhile: Callable[[], object] | None = None
) -> tuple[_Meta, _Keeper]:
    """Decode `data` like stepcli.traces.reader._decode does, its later part in a forked child; this process calls
    `meanwhile()` first, and so decodes MEANWHILE_SHARE of the slices instead of half (the child also sends its
    columns)."""
    layout = _layout(data, MIN_BYTES) if keeper_type is ColumnKeeper else None
    if layout is None:
        return _decode(path, data, shapes, keeper_type)
    slices = len(layout[1])
    mine = round(slices * MEANWHILE_SHARE) if meanwhile is not None else (slices + 1) // 2
    mine = min(max(mine, 1), slices - 1)  # each process decodes at least one slice; the child, the document too
    child = _start_child(data, layout, mine, slices, shapes, with_rest=True)
    if child is None:
        return _decode(path, data, shapes, keeper_type)
    pid, pipe = child
    keeper = ColumnKeeper(shapes)
    try:
        if meanwhile is not None:
            meanwhile()
        decode_slices(data, layout, 0, mine, shapes, keeper)
    except Exception:  # a slice that does not decode: the ordinary way below names the problem
        os.close(pipe)
        _stop(pid)
        return _decode(path, data, shapes, keeper_type)
    result = _collect(pid, pipe)
    if result is None:
        return _decode(path, data, shapes, keeper_type)
    meta, columns, count, skipped = result
    keeper.absorb_columns(columns, count, skipped)
    return meta, keeper


def _layout(data: Text, min_bytes: int) -> _Layout | None:
    """The data's slices when it is worth a second process (at least two slices), else None."""
    if len(data) < min_bytes:
        return None
    try:
        layout = slice_layout(data)
    except _NotChunkable:
        return None
    return layout if layout is not None and len(layout[1]) >= 2 else None


def _start_child(
    data: Text, layout: _Layout, first: int, stop: int, shapes: bool, with_rest: bool
) -> tuple[int, int] | None:
    """Fork the child that decodes slices `first` to `stop - 1` (and the document's rest: `with_rest`); (its pid,
    the pipe's reading end), or None when it cannot start."""
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
        decode_slices(data, layout, first, stop, shapes, keeper)
        meta = decode_rest(data, layout, shapes, keeper)[0] if with_rest else None
        payload = pickle.dumps((meta, keeper.columns(), keeper.count, keeper.skipped), protocol=pickle.HIGHEST_PROTOCOL)
        with open(writing, "wb") as pipe:
            pipe.write(payload)
        status = 0
    except BaseException:  # (Ctrl-C too) the parent sees a failed child and decodes its part itself
        pass
    finally:
        os._exit(status)


def _collect(pid: int, pipe: int) -> Any:
    """What the child sent, once it exited cleanly; None if it failed or died. The child is waited for (killed
    first if this process is interrupted) and the pipe closed."""
    status: int | None = None
    try:
        with open(pipe, "rb", closefd=False) as reading:
            payload = reading.read()
        status = os.waitpid(pid, 0)[1]
        if os.waitstatus_to_exitcode(status) == 0 and payload:
            return pickle.loads(payload)
        return None
    except Exception:
        return None
    finally:
        os.close(pipe)
        if status is None:  # not waited for yet: stop it first
            _stop(pid)


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
