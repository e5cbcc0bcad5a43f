"""Reading CUDA memory snapshots: pickles of `torch.cuda.memory._snapshot()`, from disk, possibly
hostile.

A pickle can run any code when loaded, so a snapshot is only ever decoded into plain data (dicts,
lists, tuples, strings, bytes, numbers, and the builtins `set` and `frozenset`): any request for
another class or function, or a persistent id, is refused before anything is built. The file is
streamed (its bytes are never held as a whole), and the size read (after gunzip for a `.gz`) is
capped like every input (STEPCLI_MAX_INPUT_BYTES, 4 GiB).

Shape and memory: stepcli.snapshots.unpickle decodes the pickle opcode by opcode, checks every
object against a snapshot's shape as it is built (stepcli.snapshots.shape: the first that is not is
refused, nothing more is built), and turns each history entry into a row of columns (25 bytes) as
soon as it is read, keeping neither its dict nor its frames list nor its frame dicts: the peak is
the rows, the interned stacks and frames, the segments and the replay's per-address state
(scripts/bench_memory.py). Whatever the file, the decoding never grows the process by more than an
absolute budget (`max_memory`, 4 GiB by default, `stepcli memory --max-memory`), looked at every MiB
of pickle read; past it, one line.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

from stepcli.agent.cudamemory import STEP_TAG
from stepcli.errors import TraceError
from stepcli.inputs import GZIP_MAGIC
from stepcli.limits import DEFAULT_DECODE_BYTES, input_limit
from stepcli.runfolder.layout import (
    ON_DEMAND_PREFIX,
    SNAPSHOT_KEY,
    SNAPSHOT_PREFIX,
    SNAPSHOT_SUFFIX,
)
from stepcli.snapshots.history import (
    ClassRefused,
    HistoryBuilder,
    HistoryColumns,
    NotSnapshot,
    Stack,
    Truncated,
    Unsupported,
)
from stepcli.snapshots.history import Entry as Entry  # the snapshot's model, for its readers
from stepcli.snapshots.history import HistoryFrame as HistoryFrame
from stepcli.snapshots.unpickle import StreamDecoder

# Older protocols build sets through these names. Not bytearray: `bytearray(10**12)` would be a
# memory bomb.
_PLAIN_BUILTINS = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset}


class Block(NamedTuple):
    address: int
    size: int
    requested: int
    # active_allocated, active_pending_free (torch's docs: active_awaiting_free), inactive
    state: str
    stack: int  # index into Snapshot.stacks


class Segment(NamedTuple):
    device: int
    address: int
    total_size: int
    stream: int
    expandable: bool
    blocks: tuple[Block, ...]


@dataclass
class Snapshot:
    path: str
    segments: list[Segment]
    traces: list[HistoryColumns]  # per device index
    stacks: list[Stack] = field(default_factory=lambda: [()])  # index 0: no Python stack recorded
    # what `stepcli run --memory` added: step, phase, the failed request
    info: dict[str, Any] | None = None
    allocator_settings: dict[str, Any] = field(default_factory=dict)


class _TooBig(Exception):
    pass


# what decoding one snapshot may add to the process (--max-memory)
DEFAULT_MAX_MEMORY = DEFAULT_DECODE_BYTES
Progress = Callable[[int, int], None]  # (bytes of the file read, the file's size)


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # protocols 0-2
        plain = _PLAIN_BUILTINS.get(("builtins" if module == "__builtin__" else module, name))
        if plain is None:
            raise ClassRefused(f"{module}.{name}")
        return plain

    def persistent_load(self, pid: Any) -> Any:
        raise ClassRefused("a persistent object")


class _OverBudget(Exception):
    """The decoding grew the process past the memory budget."""


def _resident_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), or None where it cannot be
    read."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _Capped(io.RawIOBase):
    """A readable stream that fails past `limit` bytes (a gzip bomb or a growing file stops at the
    cap) and, when `budget` is set, as soon as the process has grown by more than `budget` bytes
    since the stream was opened: it looks at every MiB read (a read asks for no more), so a decoding
    stops within a MiB of pickle of its budget."""

    def __init__(
        self,
        stream: Any,
        limit: int,
        budget: int | None = None,
        progress: Callable[[], None] | None = None,
    ) -> None:
        self._stream = stream
        self._left = limit
        self._budget = budget
        self._progress = progress
        self._start = _resident_bytes() if budget else None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._start is not None and self._budget is not None:
            now = _resident_bytes()
            if now is not None and now - self._start > self._budget:
                raise _OverBudget(now - self._start)
        if self._progress is not None:
            self._progress()
        with memoryview(buffer) as view:
            count: int = self._stream.readinto(view[:_LOOK_EVERY])
        self._left -= count
        if self._left < 0:
            raise _TooBig
        return count


_LOOK_EVERY = 1 << 20


def find_snapshots(path: str) -> list[str]:
    """The snapshot files PATH names: itself, or the `oom-*.pickle[.gz]` and `memory-*.pickle[.gz]`
    files of a run folder (out-of-memory and `capture --memory-snapshot` snapshots)."""
    target = Path(path)
    if target.is_dir():
        try:
            names = [p.name for p in target.iterdir()]
        except OSError as exc:
            raise TraceError(path, f"cannot list the folder: {exc.strerror or exc}") from None
        wanted = (SNAPSHOT_SUFFIX, SNAPSHOT_SUFFIX + ".gz")
        prefixes = (SNAPSHOT_PREFIX, ON_DEMAND_PREFIX)
        return sorted(
            str(target / n) for n in names if n.startswith(prefixes) and n.endswith(wanted)
        )
    if not target.exists() and not target.is_symlink():
        raise TraceError(path, "no such file or folder")
    return [path]


def load_snapshot(
    path: str,
    streamed: bool = True,
    *,
    max_memory: int = DEFAULT_MAX_MEMORY,
    progress: Progress | None = None,
) -> Snapshot:
    """Decode and check one snapshot, or TraceError saying in one line what is wrong with the file.
    `max_memory`: what the decoding may add to the process; `progress(read, size)`: called at every
    MiB of pickle read. `streamed=False`: Python's C unpickler (every entry's dict held at once; the
    reference the tests compare to)."""
    if not streamed:
        return _load_whole(path, max_memory)
    # keep: a pickle that names an entry again, read again keeping them all
    for keep in (False, True):
        builder = HistoryBuilder(STEP_TAG)
        try:
            decode = _streamed(builder, keep)
            data, histories = _read(path, decode, max_memory, progress)
            if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
                # decoded completely: the C unpickler would say the same
                raise TraceError(path, _NOT_A_SNAPSHOT)
            return _convert(path, data, builder, histories)
        except Unsupported as exc:
            if keep:
                raise TraceError(path, f"not a CUDA memory snapshot torch writes: {exc}") from None
        except RecursionError:
            raise TraceError(
                path, "not a CUDA memory snapshot torch writes: nested too deeply"
            ) from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise TraceError(path, f"not a CUDA memory snapshot torch writes: {exc}") from None
    raise AssertionError("unreachable")


def _streamed(
    builder: HistoryBuilder, keep: bool
) -> Callable[[Any], tuple[Any, dict[int, HistoryColumns]]]:
    return lambda stream: StreamDecoder(stream.read, builder, keep=keep).run()


def _load_whole(path: str, max_memory: int) -> Snapshot:
    """Python's C unpickler restricted to plain data, its memo indexes checked first: the tests'
    reference."""
    builder = HistoryBuilder(STEP_TAG)
    # the C unpickler sizes its memo from the largest index it is given
    _read(path, _check_memo_indexes)
    data = _read(path, lambda stream: _PlainDataUnpickler(stream).load(), max_memory)
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise TraceError(path, _NOT_A_SNAPSHOT)
    try:
        return _convert(path, data, builder, {})
    except RecursionError:
        raise TraceError(
            path, "not a CUDA memory snapshot torch writes: nested too deeply"
        ) from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise TraceError(path, f"not a CUDA memory snapshot torch writes: {exc}") from None


_NOT_A_SNAPSHOT = (
    "a pickle, but not a CUDA memory snapshot (torch.cuda.memory._snapshot() has 'segments')"
)
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


class _MemoBomb(Exception):
    """A memo index past the objects built so far: a pickle made to take memory (the C unpickler's
    memo is an array as long as the largest index: `K\x01r\xff\xff\xff\x7f.`, 10 bytes, would take
    16 GB)."""


def _check_memo_indexes(stream: Any) -> None:
    """Read the pickle's opcodes (building nothing) and refuse any memo index larger than the
    opcodes read so far: a pickler numbers what it memoizes 0, 1, 2, ..., one object per opcode at
    most."""
    import pickletools

    # read() only: genops asks a stream that has tell() for its position, which this one lacks
    class _Reader:
        read = stream.read
        readline = stream.readline

    try:
        for count, (opcode, argument, _) in enumerate(
            pickletools.genops(cast("IO[bytes]", _Reader()))
        ):
            if opcode.name in _PUTS and isinstance(argument, int) and argument > count:
                raise _MemoBomb(argument)
    except (ValueError, EOFError, UnicodeDecodeError):
        # not a pickle from here on: the unpickler says so in its own words, before reaching it
        return


def _read(
    path: str,
    decode: Callable[[Any], Any],
    budget: int | None = None,
    progress: Progress | None = None,
) -> Any:
    """decode(a capped, buffered stream of the file's pickle bytes), with the file's problems as
    TraceError. `budget`: the memory the decoding may add to the process (None: not watched)."""
    limit = input_limit()
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    with open(fd, "rb", buffering=0) as raw:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError(path, "not a regular file (a device, FIFO or socket)")
        try:
            head = raw.read(2)
            raw.seek(0)
            stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if head == GZIP_MAGIC else raw
            size = os.fstat(fd).st_size
            told = None if progress is None else (lambda: progress(raw.tell(), size))
            capped = io.BufferedReader(_Capped(stream, limit, budget, told), buffer_size=1 << 20)
            return decode(capped)
        except ClassRefused as exc:
            raise TraceError(
                path,
                f"refused: the pickle asks to build {exc}, which is not plain data (a snapshot "
                f"holds only dicts, "
                "lists, strings and numbers; loading a pickle that names a class or function can "
                "run any code)",
            ) from None
        except NotSnapshot as exc:
            if exc.verbatim:
                raise TraceError(path, str(exc)) from None
            raise TraceError(
                path, f"refused: {exc}: not a CUDA memory snapshot torch writes (read no further)"
            ) from None
        except _OverBudget as exc:
            raise TraceError(
                path,
                f"refused: decoding it took more than the {_size(budget or 0)} memory budget "
                f"({_size(exc.args[0])} "
                "so far; a real snapshot takes about as much as its events and frames: raise it "
                "with --max-memory)",
            ) from None
        except _MemoBomb as exc:
            raise TraceError(
                path,
                f"refused: memo index {exc} is past the objects built so far (a pickle made to "
                f"take memory, "
                "not one torch writes)",
            ) from None
        except _TooBig:
            raise TraceError(
                path, f"larger than the {limit} bytes stepcli reads (set STEPCLI_MAX_INPUT_BYTES)"
            ) from None
        except Truncated:
            raise TraceError(path, "not a pickle (pickle data was truncated)") from None
        except (gzip.BadGzipFile, EOFError) as exc:
            raise TraceError(
                path, f"not a complete pickle ({type(exc).__name__}: {exc or 'truncated'})"
            ) from None
        except pickle.UnpicklingError as exc:
            raise TraceError(path, f"not a pickle ({exc})") from None
        except (
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            AttributeError,
            MemoryError,
            RecursionError,
        ) as exc:
            raise TraceError(path, f"not a readable pickle ({type(exc).__name__}: {exc})") from None
        except OSError as exc:
            raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None


def _convert(
    path: str, data: dict[str, Any], builder: HistoryBuilder, histories: dict[int, HistoryColumns]
) -> Snapshot:
    """The snapshot's parts, checked; `histories`: the device traces the streaming decoder already
    turned into columns (their lists emptied), by id."""
    segments = [_segment(raw, builder) for raw in data["segments"]]
    traces: list[HistoryColumns] = []
    raw_traces = data.get("device_traces") or []
    if not isinstance(raw_traces, list):
        raise TypeError("'device_traces' is not a list")
    for raw_trace in raw_traces:
        if not isinstance(raw_trace, list):
            raise TypeError("a device trace is not a list")
        trace = histories.get(id(raw_trace))
        if trace is None or raw_trace:
            if trace is not None:
                raise Unsupported("a history list with items left")
            trace = builder.new_trace()
            for index, raw in enumerate(raw_trace):
                builder.add(trace, raw)
                raw_trace[index] = None  # each dict released as it goes
        traces.append(trace)
    info = _plain_info(data.get(SNAPSHOT_KEY))
    settings = data.get("allocator_settings")
    return Snapshot(
        path=path,
        segments=segments,
        traces=traces,
        stacks=builder.stacks,
        info=info,
        allocator_settings=settings if isinstance(settings, dict) else {},
    )


def _plain_info(raw: Any) -> dict[str, Any] | None:
    """The agent's record, keeping only fields of the types it writes (the file may have been
    written by anyone)."""
    if not isinstance(raw, dict):
        return None
    info: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(key, str) and (value is None or type(value) in (int, float, str, bool)):
            info[key] = value
        elif (
            key == "argv"
            and isinstance(value, list)
            and all(isinstance(part, str) for part in value)
        ):
            info[key] = list(value)
    return info


def _segment(raw: Any, builder: HistoryBuilder) -> Segment:
    blocks = []
    address = int(raw["address"])
    for block in raw["blocks"]:
        size = int(block["size"])
        blocks.append(
            Block(
                int(block.get("address", address)),
                size,
                int(block.get("requested_size", size)),
                str(block["state"]),
                builder.stack(block.get("frames")),
            )
        )
        address += size
    return Segment(
        int(raw.get("device", 0)),
        int(raw["address"]),
        int(raw["total_size"]),
        int(raw.get("stream", 0)),
        bool(raw.get("is_expandable", False)),
        tuple(blocks),
    )


def _size(count: int) -> str:
    from stepcli.fmt import size

    return size(count)
