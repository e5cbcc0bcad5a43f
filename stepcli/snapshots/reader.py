"""Reading CUDA memory snapshots: pickles of `torch.cuda.memory._snapshot()`, from disk, possibly hostile.

A pickle can run any code when loaded, so a snapshot is decoded by an Unpickler that builds plain data only
(dicts, lists, tuples, strings, bytes, numbers, and the builtins `set` and `frozenset`): any request
for another class or function, or a persistent id, is refused before anything is built. Memory is the decoded
snapshot, held once: the file is streamed into Python's C unpickler (its bytes are never held as a whole), the
size read (after gunzip for a `.gz`) is capped like every input (STEPCLI_MAX_INPUT_BYTES, 4 GiB), and each
history entry is turned into a small tuple (frames interned, so a stack shared by a million entries is kept once)
and its dict dropped as it goes. A pickle cannot be analyzed without decoding it: the decoded objects take about
8x the file (scripts/bench_memory.py), which `--memory-entries` bounds at the source.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from stepcli.agent.cudamemory import ON_DEMAND_PREFIX, SNAPSHOT_KEY, SNAPSHOT_PREFIX, SNAPSHOT_SUFFIX, STEP_TAG
from stepcli.errors import TraceError
from stepcli.inputs import GZIP_MAGIC, input_limit

# Older protocols build sets through these names. Not bytearray: `bytearray(10**12)` would be a memory bomb.
_PLAIN_BUILTINS = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset}
_FRAME_CACHE_LIMIT = 1 << 20


class Frame(NamedTuple):
    filename: str
    line: int
    name: str


Stack = tuple[Frame, ...]


class Block(NamedTuple):
    address: int
    size: int
    requested: int
    state: str  # active_allocated, active_pending_free (torch's docs: active_awaiting_free), inactive
    stack: int  # index into Snapshot.stacks


class Segment(NamedTuple):
    device: int
    address: int
    total_size: int
    stream: int
    expandable: bool
    blocks: tuple[Block, ...]


class Entry(NamedTuple):
    """One allocator event of the history: alloc, free_requested, free_completed, segment_alloc, segment_free,
    segment_map, segment_unmap, snapshot or oom (whose `addr` is the device's free bytes)."""

    action: str
    addr: int
    size: int
    stack: int
    step: int | None  # the global step stepcli tagged it with (`user_metadata`), None when untagged


@dataclass
class Snapshot:
    path: str
    segments: list[Segment]
    traces: list[list[Entry]]  # per device index
    stacks: list[Stack] = field(default_factory=lambda: [()])  # index 0: no Python stack recorded
    info: dict[str, Any] | None = None  # what `stepcli run --memory` added: step, phase, the failed request
    allocator_settings: dict[str, Any] = field(default_factory=dict)


class _Refused(Exception):
    """The pickle asked for something that is not plain data."""


class _TooBig(Exception):
    pass


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        plain = _PLAIN_BUILTINS.get(("builtins" if module == "__builtin__" else module, name))  # protocols 0-2
        if plain is None:
            raise _Refused(f"{module}.{name}")
        return plain

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent object")


class _Capped(io.RawIOBase):
    """A readable stream that fails past `limit` bytes: a gzip bomb or a growing file stops at the cap."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count: int = self._stream.readinto(buffer)
        self._left -= count
        if self._left < 0:
            raise _TooBig
        return count


def find_snapshots(path: str) -> list[str]:
    """The snapshot files PATH names: itself, or the `oom-*.pickle[.gz]` and `memory-*.pickle[.gz]` files of a run
    folder (out-of-memory and `capture --memory-snapshot` snapshots)."""
    target = Path(path)
    if target.is_dir():
        try:
            names = [p.name for p in target.iterdir()]
        except OSError as exc:
            raise TraceError(path, f"cannot list the folder: {exc.strerror or exc}") from None
        wanted = (SNAPSHOT_SUFFIX, SNAPSHOT_SUFFIX + ".gz")
        prefixes = (SNAPSHOT_PREFIX, ON_DEMAND_PREFIX)
        return sorted(str(target / n) for n in names if n.startswith(prefixes) and n.endswith(wanted))
    if not target.exists() and not target.is_symlink():
        raise TraceError(path, "no such file or folder")
    return [path]


def load_snapshot(path: str) -> Snapshot:
    """Decode and check one snapshot, or TraceError saying in one line what is wrong with the file."""
    data = _unpickle(path)
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise TraceError(
            path, "a pickle, but not a CUDA memory snapshot (torch.cuda.memory._snapshot() has 'segments')"
        )
    try:
        return _convert(path, data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceError(path, f"not a CUDA memory snapshot torch writes: {exc}") from None


def _unpickle(path: str) -> Any:
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
            capped = io.BufferedReader(_Capped(stream, limit), buffer_size=1 << 20)
            return _PlainDataUnpickler(capped).load()
        except _Refused as exc:
            raise TraceError(
                path,
                f"refused: the pickle asks to build {exc}, which is not plain data (a snapshot holds only dicts, "
                "lists, strings and numbers; loading a pickle that names a class or function can run any code)",
            ) from None
        except _TooBig:
            raise TraceError(
                path, f"larger than the {limit} bytes stepcli reads (set STEPCLI_MAX_INPUT_BYTES)"
            ) from None
        except (gzip.BadGzipFile, EOFError) as exc:
            raise TraceError(path, f"not a complete pickle ({type(exc).__name__}: {exc or 'truncated'})") from None
        except pickle.UnpicklingError as exc:
            raise TraceError(path, f"not a pickle ({exc})") from None
        except (ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError, RecursionError) as exc:
            raise TraceError(path, f"not a readable pickle ({type(exc).__name__}: {exc})") from None
        except OSError as exc:
            raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None


class _Interner:
    """Frames and stacks kept once each; stack 0 is the empty stack."""

    def __init__(self) -> None:
        self.stacks: list[Stack] = [()]
        self._stack_index: dict[Stack, int] = {(): 0}
        self._frames: dict[int, tuple[object, Frame]] = {}  # id(frame dict) -> (the dict, kept alive; its Frame)
        self._by_ids: dict[tuple[int, ...], int] = {}  # ids of a stack's frame dicts (all in _frames) -> stack
        self._steps: dict[str, int | None] = {}

    def stack(self, frames: Any) -> int:
        """The index of this stack. torch shares each distinct frame dict among all entries, so the ids of a
        list's frame dicts (kept alive here, so ids stay unique) find a known stack without reading a field."""
        if not frames:
            return 0
        ids = tuple(map(id, frames))
        index = self._by_ids.get(ids)
        if index is not None:
            return index
        cache = self._frames
        if len(cache) > _FRAME_CACHE_LIMIT:  # a writer that never shares frame dicts: start the cache over
            cache.clear()
            self._by_ids.clear()
        out: list[Frame] = []
        for raw in frames:
            hit = cache.get(id(raw))
            if hit is None:
                hit = cache[id(raw)] = (raw, Frame(str(raw["filename"]), int(raw["line"]), str(raw["name"])))
            out.append(hit[1])
        key = tuple(out)
        index = self._stack_index.get(key)
        if index is None:
            index = self._stack_index[key] = len(self.stacks)
            self.stacks.append(key)
        self._by_ids[ids] = index
        return index

    def step(self, metadata: Any) -> int | None:
        if not metadata:
            return None
        try:
            return self._steps[metadata]
        except KeyError:
            text = str(metadata)
            value = (
                int(text[len(STEP_TAG) :]) if text.startswith(STEP_TAG) and text[len(STEP_TAG) :].isdigit() else None
            )
            self._steps[metadata] = value
            return value


def _convert(path: str, data: dict[str, Any]) -> Snapshot:
    interner = _Interner()
    segments = [_segment(raw, interner) for raw in data["segments"]]
    traces: list[list[Entry]] = []
    raw_traces = data.get("device_traces") or []
    if not isinstance(raw_traces, list):
        raise TypeError("'device_traces' is not a list")
    for raw_trace in raw_traces:
        if not isinstance(raw_trace, list):
            raise TypeError("a device trace is not a list")
        traces.append(list(_entries(raw_trace, interner)))
    info = _plain_info(data.get(SNAPSHOT_KEY))
    settings = data.get("allocator_settings")
    return Snapshot(
        path=path,
        segments=segments,
        traces=traces,
        stacks=interner.stacks,
        info=info,
        allocator_settings=settings if isinstance(settings, dict) else {},
    )


def _plain_info(raw: Any) -> dict[str, Any] | None:
    """The agent's record, keeping only fields of the types it writes (the file may have been written by anyone)."""
    if not isinstance(raw, dict):
        return None
    info: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(key, str) and (value is None or type(value) in (int, float, str, bool)):
            info[key] = value
        elif key == "argv" and isinstance(value, list) and all(isinstance(part, str) for part in value):
            info[key] = list(value)
    return info


def _segment(raw: Any, interner: _Interner) -> Segment:
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
                interner.stack(block.get("frames")),
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


def _entries(raw_trace: list[Any], interner: _Interner) -> Iterator[Entry]:
    """Each entry becomes a tuple and its dict is released at once, so the decoded history is held only once."""
    for index, raw in enumerate(raw_trace):
        action = str(raw["action"])
        addr = raw.get("device_free", 0) if action == "oom" else raw.get("addr", 0)
        yield Entry(
            action,
            int(addr),
            int(raw["size"]),
            interner.stack(raw.get("frames")),
            interner.step(raw.get("user_metadata")),
        )
        raw_trace[index] = None
