"""Reading files stepcli did not write (traces, run summaries, the small files beside them): regular
files only, bounded in size, never blocking.

A path given to `table` or `compare` may name anything: `/dev/zero` (endless), a FIFO (blocks
forever on open or read), a gzip bomb. Each is refused with one line before it can hang stepcli or
take all memory. The same holds for the side files found beside an input (a trace's `NAME.flops`,
read_side_json) and for a glance at a gzip trailer (gzip_trailer): a name in a shared folder may be
a FIFO or a link to `/dev/zero` planted by anyone.

A trace a run wrote is read only while it is still that file (expect_written): another user can
rename a forgery over it at any moment, so the check is made on the descriptor the bytes are then
read from, never on the path before an open.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from stepcli.errors import TraceError
from stepcli.fmt import size as _size
from stepcli.limits import LIMIT_ENV, input_limit  # (input_limit: read_input bounds every read)

GZIP_MAGIC = b"\x1f\x8b"
_READ_STEP = 1 << 20
# inflated pieces that stay in the CPU's caches until appended (4 MB: +20% gunzip time)
_INFLATE_STEP = 1 << 20


def _too_big(path: str, what: str, limit: int, raisable: bool = True) -> TraceError:
    """`raisable`: the limit is the input limit, which the environment raises (a side file's is
    fixed)."""
    how = f" (set {LIMIT_ENV} to raise it)" if raisable else " in such a file"
    return TraceError(path, f"{what} is larger than the {_size(limit)} stepcli reads{how}")


def read_input(
    path: str, *, gunzip: bool = True, midway: Callable[[bytearray], None] | None = None
) -> bytes | bytearray:
    """The bytes of a regular file (decompressed when it is gzip), or TraceError naming the problem.

    Opened non-blocking, so a FIFO is refused instead of waiting for a writer forever. `midway` is
    called once with the inflated text so far when a gzip file is about half inflated (its trailer
    says its size), so work on the first half can begin while the rest inflates.
    """
    limit = input_limit()
    data = read_file(path, limit)
    if gunzip and (path.endswith(".gz") or data[:2] == GZIP_MAGIC):
        return _gunzipped(data, limit, path, midway)
    return data


def read_document(path: str) -> bytes | bytearray:
    """A JSON document's bytes (a run summary), inflated when they are gzip's, whatever the name
    says: `run --json NAME.json.gz` writes plain JSON, and a CI job's artifact step may gzip it."""
    limit = input_limit()
    data = read_file(path, limit)
    return _gunzipped(data, limit, path) if data[:2] == GZIP_MAGIC else data


def _gunzipped(
    data: bytes | bytearray,
    limit: int,
    path: str,
    midway: Callable[[bytearray], None] | None = None,
) -> bytes | bytearray:
    try:
        # (ISIZE, mod 4 GiB)
        half = int.from_bytes(data[-4:], "little") // 2 if midway is not None else 0
        return gunzip_bounded(data, limit, path, midway, half)
    except EOFError:
        raise TraceError(path, "corrupt gzip: the compressed stream is truncated") from None
    except (OSError, zlib.error) as exc:
        raise TraceError(path, f"corrupt gzip: {exc}") from None


# How an input is opened: non-blocking, so a FIFO is refused (after fstat) instead of waiting for a
# writer.
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def broken_link(path: str) -> str | None:
    """Why `path`, a symbolic link that leads to no file, leads nowhere (a loop, or a missing
    target); None when it is no link (then it is simply missing)."""
    if not os.path.islink(path):
        return None
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link in a loop of links"
    try:
        return f"a symbolic link to {os.readlink(path)[:200]!r}, which does not exist"
    except OSError:  # (gone meanwhile)
        return None


@dataclass(frozen=True)
class Written:
    """What a run recorded of a trace it wrote: the file a later read must still find at that path.
    `device` None: not comparable here (a step log of another node: its mount of a shared file
    system)."""

    inode: int | None
    device: int | None
    size: int
    uid: int


# Traces this process reads only while they are the file the run wrote, by absolute path
# (expect_written).
_written: dict[str, Written] = {}


def written_problem(info: os.stat_result, written: Written) -> str | None:
    """Why the file `info` describes (an fstat, or an lstat: a link is no regular file) is not the
    one `written` records (owner, inode, size), or None. The one check of a run's traces: at the
    run's end, and when `report` or `compare` read a run folder back."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != written.uid:
        return f"owned by uid {info.st_uid}, not this user"
    if (written.inode is not None and info.st_ino != written.inode) or (
        written.device is not None and info.st_dev != written.device
    ):
        return "not the file the agent wrote (replaced since)"
    if info.st_size != written.size:
        return f"{info.st_size} bytes, the agent wrote {written.size}"
    return None


def file_problem(path: str, written: Written) -> str | None:
    """Why the file at `path` is not the one `written` records (written_problem, on a descriptor
    opened without following a link or waiting on a FIFO), "missing" when nothing is there, or
    None."""
    try:
        fd = os.open(path, READ_FLAGS | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return (
            "not a regular file"
            if exc.errno == errno.ELOOP
            else f"cannot be read ({exc.strerror or exc})"
        )
    try:
        return written_problem(os.fstat(fd), written)
    finally:
        os.close(fd)


def expect_written(path: str, written: Written) -> None:
    """From now on (in this process and the workers it starts), `path` is read only while it is the
    file `written` records: checked on the very descriptor its bytes are read from (open_input), so
    a forgery renamed over it after any earlier look is refused, never read."""
    _written[os.path.abspath(path)] = written


def expected_files() -> dict[str, Written]:
    """The files expect_written named, for a worker process that does not inherit this one's
    memory."""
    return dict(_written)


def restore_expected(files: Mapping[str, Written]) -> None:
    """In a worker process: expect what its parent expects (expected_files)."""
    _written.update(files)


def open_input(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of `path` opened without waiting (a FIFO is refused after fstat, never waited
    on) and its fstat; for a file expect_written named, opened without following a link and refused
    (TraceError) unless it is still that file. The caller reads from the descriptor and closes
    it."""
    written = _written.get(os.path.abspath(path)) if _written else None
    flags = READ_FLAGS | (getattr(os, "O_NOFOLLOW", 0) if written is not None else 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise TraceError(path, broken_link(path) or "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a folder") from None
    except OSError as exc:
        if written is not None and exc.errno == errno.ELOOP:
            raise TraceError(path, "not the file the run wrote: a symbolic link") from None
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        problem = written_problem(info, written) if written is not None else None
    except OSError as exc:
        os.close(fd)
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if problem is not None:
        os.close(fd)
        raise TraceError(path, f"not the file the run wrote: {problem}")
    return fd, info


def read_file(path: str, limit: int, *, raisable: bool = True) -> bytearray:
    """The bytes of a regular file as they are (see read_input), or TraceError (`raisable`: see
    _too_big)."""
    fd, info = open_input(path)
    try:
        if stat.S_ISDIR(info.st_mode):
            raise TraceError(path, "is a folder")
        if not stat.S_ISREG(info.st_mode):
            raise TraceError(
                path, "not a regular file (a device, FIFO or socket); save the data to a file first"
            )
        if info.st_size > limit:
            raise _too_big(path, f"the file ({_size(info.st_size)})", limit, raisable)
        data = _read_regular(fd, info.st_size, limit, path, raisable)
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return data


SIDE_FILE_LIMIT = 1 << 16  # a side file stepcli writes holds a few hundred bytes


def read_side_json(path: str, limit: int = SIDE_FILE_LIMIT) -> Any:
    """The JSON document of a small file read beside an input (a trace's FLOPs), None when nothing
    is at `path`; TraceError when what is there is not a regular file of at most `limit` bytes (a
    FIFO is refused, never waited on; a link to `/dev/zero` is never read) holding JSON whose every
    number is finite (`1e400` and `NaN` are no counts; an integer of thousands of digits is refused
    by Python's own limit)."""
    if not os.path.lexists(path):
        return None
    data = read_file(path, limit, raisable=False)
    import json  # (only when a side file is there: most inputs have none)

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"the number {text[:20]} is out of range")
        return value

    def constant(text: str) -> Any:
        raise ValueError(f"{text} is not a number JSON allows")

    try:
        return json.loads(data, parse_float=finite, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        problem = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise TraceError(path, f"not valid JSON: {problem[:120]}") from None


def gzip_trailer(path: str) -> tuple[int, int] | None:
    """(file size, inflated size from the trailer: ISIZE, modulo 4 GiB) of a regular gzip file; None
    for anything else. Opened non-blocking and checked with fstat before a byte is read, so a FIFO
    named `*.json.gz` never blocks the caller (which only estimates; the reader refuses such a file
    in one line later)."""
    try:
        fd, info = open_input(path)
    except TraceError:
        return None
    try:
        if not stat.S_ISREG(info.st_mode) or info.st_size < 6 or os.pread(fd, 2, 0) != GZIP_MAGIC:
            return None
        return info.st_size, int.from_bytes(os.pread(fd, 4, info.st_size - 4), "little")
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_regular(fd: int, size: int, limit: int, path: str, raisable: bool = True) -> bytearray:
    """Read the whole file into one buffer of its size (held once, as `read()` would), and never
    past `limit` when the file grows while it is read."""
    buffer = bytearray(size + 1)  # one spare byte tells a file that grew
    got = 0
    with memoryview(buffer) as view:
        while got < len(buffer):
            count = os.readv(fd, [view[got:]])
            if count == 0:
                break
            got += count
    del buffer[got:]
    if got == size + 1:
        while True:
            piece = os.read(fd, _READ_STEP)
            if not piece:
                break
            buffer += piece
            if len(buffer) > limit:
                raise _too_big(path, "the file", limit, raisable)
    return buffer


def gunzip_bounded(
    data: bytes | bytearray,
    limit: int,
    path: str = "<memory>",
    midway: Callable[[bytearray], None] | None = None,
    midway_at: int = 0,
) -> bytearray:
    """Decompress every gzip member into one buffer, refusing output past `limit` (a gzip bomb);
    `midway(out)` once the output reaches `midway_at` bytes (see read_input).

    Compressed input goes in 1 MB pieces and output comes out in 1 MB pieces, so neither side is
    ever held twice (gzip.decompress joins a list of pieces at the end, holding the output twice at
    its peak).
    """
    out = bytearray()
    for piece in inflated_pieces(data, limit, path):
        out += piece
        if midway is not None and len(out) >= midway_at:
            midway(out)
            midway = None
    return out


def inflated_pieces(data: bytes | bytearray, limit: int, path: str = "<memory>") -> Iterator[bytes]:
    """The decompressed text of every gzip member, in ~1 MB pieces; TraceError once it passes
    `limit`, OSError, EOFError or zlib.error for data that is not (whole) gzip."""
    view = memoryview(data)
    position = total = 0
    while True:
        if bytes(view[position : position + 2]) != GZIP_MAGIC:
            raise OSError(
                "not a gzip file" if position == 0 else "unexpected data after the last member"
            )
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        while not inflater.eof and position < len(data):
            piece = view[position : position + _READ_STEP]
            pending: bytes | memoryview = piece
            while True:
                out = inflater.decompress(pending, _INFLATE_STEP)
                total += len(out)
                if total > limit:
                    raise _too_big(path, "the decompressed content", limit)
                yield out
                if inflater.eof or not inflater.unconsumed_tail:
                    break
                pending = inflater.unconsumed_tail
            # unused_data is what follows the member's end, a suffix of this piece.
            position += len(piece) - len(inflater.unused_data)
        if not inflater.eof:
            raise EOFError
        # Like gzip itself: further members follow, or only zero padding is left.
        if data.count(b"\0", position) == len(data) - position:
            return


class _Outline(msgspec.Struct):
    """The top level of a JSON document, decoded without building its (possibly huge)
    traceEvents."""

    schema: Any = None
    traceEvents: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))


def outline(data: bytes | bytearray) -> tuple[str, Any]:
    """What a document is, by content (never by size): ("run", schema) for a document with a
    `schema` field, ("trace", None) for one with `traceEvents`, ("other", None) for other valid
    JSON, and ("broken", None) when it is not valid JSON at all (the trace reader then names the
    precise problem)."""
    try:
        document = msgspec.json.decode(data, type=_Outline)
    except msgspec.ValidationError:
        return "other", None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return "broken", None
    if document.schema is not None:
        return "run", document.schema
    if len(document.traceEvents):
        return "trace", None
    return "other", None


def run_paths_problem(doc: dict[str, Any]) -> str | None:
    """Why the trace paths a run summary lists cannot be trusted, or None.

    A run summary names only traces inside its own `out_dir` (stepcli writes nothing elsewhere); a
    document that points at `/etc/passwd` or `../other-run` was not written by stepcli and is
    refused.
    """
    out_dir = doc.get("out_dir")
    listed: list[tuple[str, Any]] = []
    traces = doc.get("traces", [])
    if not isinstance(traces, list):
        return "traces is not a list"
    listed += [(f"traces[{i}]", path) for i, path in enumerate(traces)]
    windows = doc.get("windows", [])
    if not isinstance(windows, list):
        return "windows is not a list"
    for i, window in enumerate(windows):
        if not isinstance(window, dict):
            return f"windows[{i}] is not an object"
        if "trace" in window:
            listed.append((f"windows[{i}].trace", window["trace"]))
    if not listed:
        return None
    if not isinstance(out_dir, str) or not os.path.isabs(out_dir):
        return "out_dir is not an absolute path, so its traces cannot be placed"
    root = os.path.normpath(out_dir)
    for where, path in listed:
        if not isinstance(path, str):
            return f"{where} is not a path"
        full = os.path.normpath(os.path.join(root, path))
        if os.path.commonpath([root, full]) != root or full == root:
            return f"{where} ({path!r}) is outside its out_dir {out_dir!r}"
    return None
