"""One large plain-JSON trace read by several processes at once: its traceEvents list is cut between
two events into byte ranges, each range is read (pread) and decoded into columns by its own process,
and the columns are joined in file order. Decoding is most of the time of `stepcli table` on one
file, so this is what lets one big trace use more than one core.

A cut can only be wrong when it falls inside a string or a nested value; then a range is not a
complete JSON list, its decode fails, and the caller reads the file whole the ordinary way (which
also gives the exact error).

A file too small to cut is still read this way, as one range, by the process that summarizes it
(`read_blocked`): a block at a time through one buffer the process keeps, instead of into a new
buffer of the file's size, whose every page the kernel faults in and zeroes again (a folder of 8
rank traces of 39 MiB: about a tenth of the CPU of reading them).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from stepcli.errors import TraceError
from stepcli.inputs import GZIP_MAGIC, open_input
from stepcli.limits import input_limit
from stepcli.traces.read.columns import ColumnTrace
from stepcli.traces.read.files import rank_from_name
from stepcli.traces.read.tracereader import _EVENT_SEPARATOR, _TRACE_EVENTS_KEY
from stepcli.traces.read.typedcolumns import Columns

if TYPE_CHECKING:  # (planning a read of a file that is not cut imports no concurrent.futures)
    from concurrent.futures import Executor, Future

# smaller files gain less from more processes than starting them costs
MIN_PIECE_BYTES = 32 * 1024 * 1024
# the first range's extra share (a worker starts ~0.15 s late, ~20% of a 150 MB range's decode)
FIRST_EXTRA = 0.25
_BLOCK_BYTES = 8 * 1024 * 1024  # read at once by a range's process, then decoded in slices
# bytes searched for the traceEvents key, and after each cut for the gap between two events
_LOOK = 1 << 20
_OPEN, _CLOSE = ord("["), ord("]")
# below this, a file's own buffer costs a few ms at most: it is read whole
MIN_BLOCKED_BYTES = 4 * 1024 * 1024
# Block buffers of this process not in use: kept between ranges and files, so their pages stay
# faulted in.
_spare_blocks: list[bytearray] = []


def plan(path: str, pieces: int, head_start: float = FIRST_EXTRA) -> list[tuple[int, int]] | None:
    """Byte ranges [start, end) of about equal size, each holding whole events; the last runs to the
    end of the file (with the document's closing part). The first range is `head_start` larger, for
    the process that begins reading it while workers still start. None when the file is not worth or
    not fit for cutting."""
    if pieces < 2:
        return None
    found = _list_start(path, 2 * MIN_PIECE_BYTES)
    if found is None:
        return None
    size, start = found
    pieces = min(pieces, size // MIN_PIECE_BYTES)
    cuts: list[int] = []
    weights = [1.0 + head_start, *([1.0] * (pieces - 1))]
    total = sum(weights)
    try:
        with _opened(path) as file:
            for k in range(1, pieces):
                target = start + int((size - start) * sum(weights[:k]) / total)
                file.seek(target)
                window = file.read(_LOOK)
                gap = _EVENT_SEPARATOR.search(window)
                if gap is None:
                    return None
                comma = target + window.index(b",", gap.start())
                if cuts and comma <= cuts[-1]:
                    return None
                cuts.append(comma)
    except OSError:
        return None
    return [(start, cuts[0]), *[(a + 1, b) for a, b in zip(cuts, cuts[1:])], (cuts[-1] + 1, size)]


def _list_start(path: str, least: int) -> tuple[int, int] | None:
    """(size, where traceEvents' list starts) of a plain regular file of at least `least` bytes
    within the input limit whose first MB holds the traceEvents key; else None."""
    try:
        with _opened(path) as file:
            size = os.fstat(file.fileno()).st_size
            if not least <= size <= input_limit():
                return None
            head = file.read(_LOOK)
    except OSError:
        return None
    key = _TRACE_EVENTS_KEY.search(head)
    if head[:2] == GZIP_MAGIC or key is None:
        return None
    return size, key.end()


def _opened(path: str) -> Any:
    """The file, opened without waiting (a FIFO put in a regular file's place is refused, not waited
    on)."""
    try:
        fd, info = open_input(path)  # (a trace the run wrote: only while it is still that file)
    except TraceError as exc:
        raise OSError(exc.message) from None
    try:
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_blocked(path: str, shapes: bool) -> ColumnTrace | None:
    """The columns of one plain trace file of at least MIN_BLOCKED_BYTES, read as one range a block
    at a time (read_piece); None for any other file and for any surprise (the caller reads it the
    ordinary way, which also gives the exact error)."""
    found = _list_start(path, MIN_BLOCKED_BYTES)
    if found is None:
        return None
    size, start = found
    result = read_piece(path, start, size, start, True, shapes)
    return None if result is None else _trace_of(path, [result])


def _take_block(size: int) -> bytearray:
    """A block buffer of `size` bytes: a spare one of that size, else a new one (the first, or one
    in use by another thread)."""
    while _spare_blocks:
        block = _spare_blocks.pop()
        if len(block) == size:
            return block
    return bytearray(size)


def read_piece(path: str, start: int, end: int, header_end: int, last: bool, shapes: bool) -> Any:
    """Columns of one range (runs in a worker): (meta, columns, event count, skipped), or None if it
    failed.

    The range is read a block (~8 MB, cut between events) at a time and each block decoded in small
    slices, so a process holds one block of the file, not its whole range, and a slice's decoded
    objects stay in the CPU's caches; the last range's final slices are decoded inside the document
    around the list (header and tail), which also checks the file's end and gives its metadata."""
    import msgspec

    from stepcli.traces.read.columns import ColumnKeeper
    from stepcli.traces.read.events import DecodedEvent, Meta, ShapedEvent
    from stepcli.traces.read.tracereader import _CHUNK_BYTES, _decode

    keeper = ColumnKeeper(shapes)
    decoder: msgspec.json.Decoder[list[Any]] = msgspec.json.Decoder(
        list[ShapedEvent] if shapes else list[DecodedEvent]
    )
    meta = Meta()
    # One buffer for every block, kept for the next range or file: a new 8 MB buffer per block had
    # each of its pages faulted in again (~1 ms per MB on these VMs, a fifth of decoding it).
    block = _take_block(max(_BLOCK_BYTES, 2 * _CHUNK_BYTES) + 2)
    try:
        with _opened(path) as file:
            fd = file.fileno()
            position = start
            # the last range keeps its final slices for the document
            stop = end - 2 * _CHUNK_BYTES if last else end
            while position < stop:
                block_end = min(end, position + max(_BLOCK_BYTES, 2 * _CHUNK_BYTES))
                # The block sits between brackets; each slice is decoded where it lies, its closing
                # comma turned into "]" and then into "[" to open the next slice (no copy of the
                # slice).
                length = _fill(file, block, position, block_end)
                limit = length - 1 if block_end == end else _last_cut(block, length)
                if limit is None:
                    return None
                view = memoryview(block)
                # the "[" of the slice being decoded; the slice's data starts at `opening` in the
                # range
                opening = 0
                while opening + 1 < limit and position + opening < stop:
                    gap = _EVENT_SEPARATOR.search(block, opening + 1 + _CHUNK_BYTES, limit)
                    cut = block.index(b",", gap.start()) if gap else limit
                    if last and block_end == end and cut == limit:
                        break  # the final events: decoded with the document below
                    block[cut] = _CLOSE
                    # With shapes, msgspec.Raw values may keep a view of their input: they get a
                    # copy.
                    keeper.add(
                        decoder.decode(
                            bytes(view[opening : cut + 1]) if shapes else view[opening : cut + 1]
                        )
                    )
                    block[cut] = _OPEN
                    opening = cut
                view.release()
                if not opening:
                    break
                position += opening
            if last:
                head = os.pread(fd, header_end, 0)
                meta, rest = _decode(
                    path, _read_into(file, head, position, end, b""), shapes, ColumnKeeper
                )
                assert isinstance(rest, ColumnKeeper)
                keeper.absorb(rest)
    except Exception:  # any surprise: the caller reads the file whole, the ordinary way
        return None
    finally:
        _spare_blocks.append(block)
    return meta, keeper.columns(), keeper.count, keeper.skipped


def _last_cut(block: bytes | bytearray, length: int | None = None) -> int | None:
    """Position of the comma of the last gap between two events that lies wholly inside
    `block[:length]`."""
    at = len(block) if length is None else length
    while True:
        at = block.rfind(b"}", 0, at)
        if at < 0:
            return None
        if _EVENT_SEPARATOR.match(block, at):
            return block.index(b",", at)


def _fill(file: Any, block: bytearray, start: int, end: int) -> int:
    """`"[" + file[start:end] + "]"` into the start of `block` (which is large enough), read
    straight into it; the length written."""
    size = end - start
    block[0] = _OPEN
    block[size + 1] = _CLOSE
    _read_range(file, block, 1, start, size)
    return size + 2


def _read_into(file: Any, before: bytes, start: int, end: int, after: bytes) -> bytearray:
    """`before + file[start:end] + after` in one buffer, the range read straight into it (held once,
    not twice)."""
    size = end - start
    buffer = bytearray(len(before) + size + len(after))
    buffer[: len(before)] = before
    buffer[len(before) + size :] = after
    _read_range(file, buffer, len(before), start, size)
    return buffer


def _read_range(file: Any, buffer: bytearray, at: int, start: int, size: int) -> None:
    """`file[start:start + size]` read straight into `buffer[at:]`; EOFError if the file is shorter
    now."""
    with memoryview(buffer) as whole, whole[at : at + size] as view:
        file.seek(start)
        done = 0
        while done < size:
            got = file.readinto(view[done:])
            if not got:
                raise EOFError("the file got shorter while it was read")
            done += got


def read_split(
    path: str,
    ranges: list[tuple[int, int]],
    shapes: bool,
    pool: Executor,
    submit_aside: bool = True,
) -> ColumnTrace | None:
    """The file's columns, its ranges decoded in `pool`, and by this process meanwhile (the first
    range, then any range not yet begun). With `submit_aside`, the ranges are handed to the pool
    from a thread, because starting its workers takes a while (forkserver, spawn); a forking pool
    starts them at once, from this thread."""
    header_end = ranges[0][0]
    last = len(ranges) - 1
    futures: list[Future[Any]] = []

    # starting the workers takes a while: this process decodes its range meanwhile
    def submit() -> None:
        try:
            for index, (start, end) in enumerate(ranges[1:], 1):
                futures.append(
                    pool.submit(read_piece, path, start, end, header_end, index == last, shapes)
                )
        except Exception:  # no worker could start: counted below
            pass

    if submit_aside:
        starter = threading.Thread(target=submit, daemon=True)
        starter.start()
    else:
        submit()
    done: dict[int, Any] = {0: read_piece(path, *ranges[0], header_end, False, shapes)}
    if submit_aside:
        starter.join()
    if len(futures) < len(ranges) - 1:  # the pool could not take them (broken): read the file whole
        return None
    # Workers start later than this process: it takes back, last first, the ranges no worker has
    # begun.
    for index in range(len(futures), 0, -1):
        if futures[index - 1].cancel():
            start, end = ranges[index]
            done[index] = read_piece(path, start, end, header_end, index == last, shapes)
    results = [done[i] if i in done else futures[i - 1].result() for i in range(len(ranges))]
    if any(r is None for r in results):
        return None
    return _trace_of(path, results)


def read_split_forked(
    path: str,
    ranges: list[tuple[int, int]],
    shapes: bool,
    meanwhile: Callable[[], object] | None = None,
) -> ColumnTrace | None:
    """The file's columns, its ranges after the first decoded by forked children, each sending its
    columns back through an in-memory file (stepcli.traces.read.twoprocess.start_result_child), the
    first by this process meanwhile, then `meanwhile()`. Without a pool there is no queue, thread or
    pickled round trip through a pipe (12.6 MB of columns came back in 35 ms that way). None when a
    child cannot start or fails: the caller reads the file whole."""
    from functools import partial

    from stepcli.traces.read.twoprocess import start_result_child

    header_end = ranges[0][0]
    last = len(ranges) - 1
    children = []
    results: list[Any] = []
    try:
        for index, (start, end) in enumerate(ranges[1:], 1):
            child = start_result_child(
                partial(read_piece, path, start, end, header_end, index == last, shapes)
            )
            if child is None:
                return None
            children.append(child)
        results.append(read_piece(path, *ranges[0], header_end, False, shapes))
        if meanwhile is not None:
            meanwhile()
        while children:
            results.append(children.pop(0).collect())
    finally:
        # not collected: a child that could not start, an error or an interrupt here
        for child in children:
            child.stop()
    if any(r is None for r in results):
        return None
    return _trace_of(path, results)


def _trace_of(path: str, results: list[Any]) -> ColumnTrace:
    """The trace of a file's ranges read by read_piece, in file order (the last one's metadata is
    the file's)."""
    meta = results[-1][0]
    rank = meta.rank if meta.rank is not None else rank_from_name(path)
    columns = results[0][1] if len(results) == 1 else join([r[1] for r in results])
    return ColumnTrace(
        path,
        rank,
        columns,
        sum(r[2] for r in results),
        sum(r[3] for r in results),
        meta.incomplete_step,
        meta.device,
        meta.clock,
        meta.cpu_time,
        meta.world_size,
    )


def _offset(parts: list[Columns], sparse: str) -> dict[int, Any]:
    """The parts' sparse per-event values (`transfers`, `flops`, `groups`, `gemm_ops`,
    `gemm_kernels`) keyed by event index in the joined columns."""
    out: dict[int, Any] = {}
    offset = 0
    for part in parts:
        out.update({offset + i: v for i, v in getattr(part, sparse).items()})
        offset += len(part)
    return out


def join(parts: list[Columns]) -> Columns:
    """Columns of consecutive ranges as one, their name, id and shape tables merged (first sight
    keeps order)."""
    names: dict[str, int] = {}
    ids: dict[int | str, int] = {}
    shapes: dict[str, int] = {"": 0}

    def remap(table: dict[Any, int], values: list[Any]) -> np.ndarray:
        return np.array([table.setdefault(v, len(table)) for v in values] or [0], np.int32)

    name, pid, tid, shape = [], [], [], []
    for part in parts:
        name.append(remap(names, part.names)[part.name])
        id_map = remap(ids, part.ids)
        pid.append(id_map[part.pid])
        tid.append(id_map[part.tid])
        shape.append(remap(shapes, part.shapes)[part.shape])
    return Columns(
        name=np.concatenate(name),
        kind=np.concatenate([p.kind for p in parts]),
        pid=np.concatenate(pid),
        tid=np.concatenate(tid),
        ts=np.concatenate([p.ts for p in parts]),
        dur=np.concatenate([p.dur for p in parts]),
        shape=np.concatenate(shape),
        corr=np.concatenate([p.corr for p in parts]),
        transfers=_offset(parts, "transfers"),
        flops=_offset(parts, "flops"),
        groups=_offset(parts, "groups"),
        gemm_ops=_offset(parts, "gemm_ops"),
        gemm_kernels=_offset(parts, "gemm_kernels"),
        names=list(names),
        ids=list(ids),
        shapes=list(shapes),
    )
