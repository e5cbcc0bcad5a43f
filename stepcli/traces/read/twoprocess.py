"""One trace held in memory decoded by this process and one forked child at once.

A .gz trace, or a plain one too small to be cut into ranges read by several processes
(stepcli.traces.read.splitread), is held in memory (read, or inflated ahead by
stepcli.traces.read.readahead) and decoded in ~1 MB slices (stepcli.traces.read.tracereader). Here a
forked child decodes part of the slices from its copy-on-write view of the same text and sends its
columns back (through an in-memory file), while this process decodes the rest. Decoding is most of
`stepcli table`'s time on one file, so on two cores this takes about half of it off the wall clock
(`scripts/bench_gpu.py`):

- the text is whole: the slices are shared out as they go (a pipe holds one byte per slice: each
  process claims the next with a one-byte read), this process from the front, the child from the
  back after the document around the list; so when one of them runs slower (the other core busy, the
  child's first writes to shared memory copying pages, this process importing the analysis
  meanwhile) the other decodes more, instead of waiting;
- a .gz trace inflated here: the child is forked when the text is half inflated (read_input's
  `midway`) and decodes that first half while this process inflates the second and then decodes it.

Only `stepcli table`'s engine uses it, and only where forking is safe (one thread;
stepcli.traces.engine). Any surprise (no fork, a slice that does not decode, a child that fails or
dies) falls back to decoding the data the ordinary way in this process, which also gives the exact
error.
"""

from __future__ import annotations

import atexit
import mmap
import os
import pickle
from collections.abc import Callable
from typing import Any, NamedTuple

from stepcli.traces.read.columns import ColumnKeeper
from stepcli.traces.read.events import Meta
from stepcli.traces.read.forked import fork_child, stop_child
from stepcli.traces.read.tracereader import (
    Text,
    _decode,
    _Keeper,
    _NotChunkable,
    decode_rest,
    decode_slices,
    slice_layout,
)

MIN_BYTES = 8 * 1024 * 1024  # below this, a fork and a pipe cost about what the child would save

_Layout = tuple[int, list[int]]


class DecodeInTwo:
    """The decoder of one file (stepcli.traces.read.tracereader.Decode), with the `midway` hook that
    starts the child early."""

    def __init__(self, shapes: bool, meanwhile: Callable[[], object] | None = None) -> None:
        self.shapes = shapes
        self.meanwhile = meanwhile  # work of this process that can be done while the child decodes
        # the child decoding the first half, and its layout
        self._early: tuple[_Child, _Layout] | None = None

    def midway(self, prefix: bytearray) -> None:
        """Half of a .gz trace is inflated: a child decodes its slices now, while the rest
        inflates."""
        layout = _layout(prefix, MIN_BYTES // 2)
        if layout is None:
            return
        child = _start_child(prefix, layout, 0, len(layout[1]), self.shapes, with_rest=False)
        if child is not None:
            self._early = (child, layout)

    def abandon(self) -> None:
        """The file could not be read after all: stop the child."""
        early, self._early = self._early, None
        if early is not None:
            early[0].stop()

    def __call__(
        self, path: str, data: Text, shapes: bool, keeper_type: type[_Keeper]
    ) -> tuple[Meta, _Keeper]:
        early, self._early = self._early, None
        if early is None:
            return decode_in_two(path, data, shapes, keeper_type, self.meanwhile)
        child, prefix = early
        stop = len(prefix[1])
        keeper = ColumnKeeper(shapes)
        try:
            if self.meanwhile is not None:
                self.meanwhile()
            layout = slice_layout(data, prefix)
            assert layout is not None
            decode_slices(data, layout, stop, len(layout[1]), shapes, keeper)
            meta, _ = decode_rest(data, layout, shapes, keeper)
        # the ordinary way names the problem; an interrupt stops the child too
        except BaseException as exc:
            child.stop()
            if not isinstance(exc, Exception):
                raise
            return _decode(path, data, shapes, keeper_type)
        result = child.collect()
        whole = ColumnKeeper(shapes)
        try:
            if result is None:  # the child failed: its slices are decoded here
                decode_slices(data, layout, 0, stop, shapes, whole)
            else:
                whole.absorb_columns(*result[1:4])
        except Exception:  # (a slice the child could not decode either)
            return _decode(path, data, shapes, keeper_type)
        whole.absorb(keeper)
        return meta, whole


def decode_in_two(
    path: str,
    data: Text,
    shapes: bool,
    keeper_type: type[_Keeper],
    meanwhile: Callable[[], object] | None = None,
) -> tuple[Meta, _Keeper]:
    """Decode `data` like stepcli.traces.read.tracereader._decode does, shared with a forked child
    as they go (_claims): this process takes slices from the front, after `meanwhile()`; the child
    the document's rest, then slices from the back. Whichever runs faster (the other core may be
    busy, the child's first writes copy pages) decodes more."""
    layout = _layout(data, MIN_BYTES) if keeper_type is ColumnKeeper else None
    if layout is None:
        return _decode(path, data, shapes, keeper_type)
    slices = len(layout[1])
    claims = _claims(slices)
    if claims is None:
        return _decode(path, data, shapes, keeper_type)
    child = _start_child(data, layout, 0, slices, shapes, with_rest=True, claims=claims)
    keeper = ColumnKeeper(shapes)
    mine = 0
    try:
        if child is None:
            return _decode(path, data, shapes, keeper_type)
        try:
            if meanwhile is not None:
                meanwhile()
            while os.read(claims, 1):
                decode_slices(data, layout, mine, mine + 1, shapes, keeper)
                mine += 1
        # a slice that does not decode: the ordinary way names the problem
        except BaseException as exc:
            child.stop()  # (an interrupt stops the child too)
            if not isinstance(exc, Exception):
                raise
            return _decode(path, data, shapes, keeper_type)
    finally:
        os.close(claims)
    result = child.collect()
    # (the child decoded the slices this process did not)
    if result is None or result[-1] != slices - mine:
        return _decode(path, data, shapes, keeper_type)
    meta, columns, count, skipped, _ = result
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


class _Child(NamedTuple):
    """A forked child decoding slices: its pid, the pipe's reading end, and the in-memory file it
    leaves its columns in (None: they come through the pipe)."""

    pid: int
    pipe: int
    memfd: int | None

    def collect(self) -> Any:
        return _collect(self.pid, self.pipe, self.memfd)

    def stop(self) -> None:
        """Kill it, wait for it, close what leads to it (its result is not needed)."""
        for fd in (self.pipe, self.memfd):
            if fd is not None:
                os.close(fd)
        stop_child(self.pid)


def _claims(slices: int) -> int | None:
    """The reading end of a pipe that holds one byte per slice, and no writer: each process claims
    the next slice with a one-byte read (atomic), until the end of file. None when the slices
    outnumber what a pipe surely holds (4096: a 4 GB text) or no pipe can be made."""
    if slices > 4096:
        return None
    try:
        reading, writing = os.pipe()
    except OSError:
        return None
    try:
        os.write(writing, bytes(slices))
    finally:
        os.close(writing)
    return reading


def _start_child(
    data: Text,
    layout: _Layout,
    first: int,
    stop: int,
    shapes: bool,
    with_rest: bool,
    claims: int | None = None,
) -> _Child | None:
    """Fork the child that decodes slices `first` to `stop - 1` (and the document's rest:
    `with_rest`), or with `claims` (see _claims) the rest first, then the slices it claims, from
    `stop - 1` down; None when it cannot start. It sends (meta or None, columns, events read,
    skipped, slices claimed)."""

    def work() -> Any:
        if claims is None:
            keeper = ColumnKeeper(shapes)
            decode_slices(data, layout, first, stop, shapes, keeper)
            meta = decode_rest(data, layout, shapes, keeper)[0] if with_rest else None
            taken = stop - first
        else:
            meta, keeper, taken = _decode_claimed(data, layout, stop, shapes, claims)
        return meta, keeper.columns(), keeper.count, keeper.skipped, taken

    return start_result_child(work)


def start_result_child(produce: Callable[[], Any]) -> _Child | None:
    """Fork a child that sends back what `produce()` returns (pickled); None when it cannot start.
    Collect it with `.collect()` (None: it failed or died) or end it with `.stop()`.

    The result (~2 MB of columns for a 35 MB trace) goes through an in-memory file (memfd) and only
    its length through the pipe: through a 64 KB pipe it took 15 ms of back-and-forth between the
    two processes."""
    try:
        reading, writing = os.pipe()
    except OSError:
        return None
    try:
        memfd: int | None = os.memfd_create("stepcli-columns", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # (no memfd: the result comes through the pipe)
        memfd = None

    def work() -> None:
        os.close(reading)
        payload = pickle.dumps(produce(), protocol=pickle.HIGHEST_PROTOCOL)
        if memfd is not None:
            _write_all(memfd, payload)
            payload = len(payload).to_bytes(_LENGTH, "little")
        _write_all(writing, payload)
        # the parent's end of file now, not after this process's exit has torn down its memory
        os.close(writing)

    try:
        pid = fork_child(work)
    except OSError:  # a process limit: decode here alone
        for fd in (reading, writing, memfd):
            if fd is not None:
                os.close(fd)
        return None
    os.close(writing)
    return _Child(pid, reading, memfd)


def _decode_claimed(
    data: Text, layout: _Layout, stop: int, shapes: bool, claims: int
) -> tuple[Meta, ColumnKeeper, int]:
    """In the child: the document's rest, then each slice it claims from `stop - 1` down, each into
    its own keeper, joined in file order; (the document's meta, the columns, how many slices it
    claimed)."""
    rest = ColumnKeeper(shapes)
    meta = decode_rest(data, layout, shapes, rest)[0]
    backwards: list[ColumnKeeper] = []
    while os.read(claims, 1):
        index = stop - 1 - len(backwards)
        backwards.append(ColumnKeeper(shapes))
        decode_slices(data, layout, index, index + 1, shapes, backwards[-1])
    keeper = ColumnKeeper(shapes)
    for part in reversed(backwards):
        keeper.absorb(part)
    keeper.absorb(rest)
    return meta, keeper, len(backwards)


# bytes of the length the child writes to the pipe when its columns are in the in-memory file
_LENGTH = 8


def _write_all(fd: int, data: bytes) -> None:
    with memoryview(data) as view:
        while view:
            view = view[os.write(fd, view) :]


def _collect(pid: int, pipe: int, memfd: int | None) -> Any:
    """What the child sent; None if it failed or died (it is then killed if need be, and waited
    for). The pipe and the in-memory file are closed. A child that sent its columns is left to exit
    on its own (tearing down its copy of this process takes it 5-7 ms): it is waited for later
    (reap_children), at the latest at exit."""
    result: Any = None
    try:
        with open(pipe, "rb", closefd=False) as reading:
            sent = reading.read()
        if memfd is None:
            result = pickle.loads(sent) if sent else None
        elif len(sent) == _LENGTH:
            with mmap.mmap(memfd, int.from_bytes(sent, "little"), prot=mmap.PROT_READ) as columns:
                result = pickle.loads(columns)
    except Exception:
        result = None
    finally:
        os.close(pipe)
        if memfd is not None:
            os.close(memfd)
        if result is None:
            stop_child(pid)
        else:
            _exiting.append(pid)
            if len(_exiting) == 1:
                atexit.register(reap_children)
    return result


_exiting: list[int] = []  # children that sent their columns and have not been waited for yet


def reap_children() -> None:
    """Wait for the children that sent their columns (they have exited, or are exiting)."""
    while _exiting:
        try:
            os.waitpid(_exiting.pop(), 0)
        except ChildProcessError:
            pass
