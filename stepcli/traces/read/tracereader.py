"""Reading PyTorch profiler traces (.json, .json.gz, folders of them) into the few event fields
stepcli analyses.

One rule for malformed input, shared by `table`, `compare` and the run summary
(docs/commands/table.md, "Malformed traces"):
- An event stepcli reads (`ph` "X" of a kept category) whose time cannot be placed is skipped and
  counted in `Trace.skipped_events`: `ts` or `dur` missing, not a number (null, a bool, a list, a
  non-numeric string; numeric strings such as "10.5" are read as numbers), infinite or NaN, beyond
  `MAX_TIME_US` (1e308 or 1e400, integers past 64 bits), or a negative `dur`; likewise a
  `ProfilerStep#N` whose N is past 2**63. The rest of the trace is still worth reading.
- The whole file is rejected, with one line naming it and the reason, when it is not a regular file,
  is larger than the input limit (stepcli/inputs.py), is corrupt gzip, is not UTF-8, is not JSON
  (bare NaN/Infinity included: no JSON reader, Perfetto's or TensorBoard's, accepts them), is nested
  too deeply, is truncated, or has no `traceEvents` list. A `distributedInfo.rank` that is not an
  integer from 0 to 2**31-1 is ignored (the rank then comes from the file name, as for traces
  without distributedInfo).
- One flaw is forgiven: event names holding bare double quotes, as PyTorch writes them with
  `with_stack` (stepcli.agent.tracenames), are read as if the quotes were escaped.

A trace saved by stepcli when its window was cut short carries the top-level string field
`"stepcli_incomplete_step": "N"` (written with `prof.add_metadata`): ProfilerStep#N holds only the
start of that step. It is read into `Trace.incomplete_step` so summaries can leave that step out of
step times.
"""

from __future__ import annotations

import gc
import mmap
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from stepcli.agent.tracenames import escape_names
from stepcli.errors import TraceError
from stepcli.inputs import read_input
from stepcli.traces.read.document import (
    MAX_STEP,
    as_utf8,
    clock_id,
    cpu_time_of,
    decode_lenient,
    describe_decode_error,
    device_name,
    rank_number,
    step_number,
    world_size_number,
)
from stepcli.traces.read.events import (
    NO_DIMS,
    DecodedEvent,
    Event,
    Header,
    Meta,
    ShapedEvent,
    ShapedHeader,
)
from stepcli.traces.read.files import list_trace_files, rank_from_name
from stepcli.traces.read.names import STEP_PREFIX
from stepcli.traces.read.readahead import take as take_read_ahead

# Kineto categories whose events run on a CPU thread and that torch's `key_averages()` counts as
# operators (it also nests python_function events with ops, so they must take part in self-time
# accounting).
CPU_CATEGORIES = frozenset(
    {
        "cpu_op",
        "user_annotation",
        "python_function",
        "cuda_runtime",
        "cuda_driver",
        "xpu_runtime",
        "xpu_driver",
        "privateuse1_runtime",
        "privateuse1_driver",
        "mtia_runtime",
    }
)
# Categories of work that runs on the device itself (one row per kernel or copy name).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
KEPT_CATEGORIES = CPU_CATEGORIES | DEVICE_CATEGORIES

# torch drops these utility events before building its operator tree
# (torch/autograd/profiler_util.py _filter_name), so their time counts as their parent's self time;
# we do the same to match key_averages().
FILTERED_NAMES = frozenset(
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)

# Decoding is done in slices of about this many bytes: the decoded structs of one slice are filtered
# and interned before the next is decoded, so peak memory stays near the file size instead of file +
# every event. decoded objects of a slice stay in the CPU's caches (measured: 1 MB beats 8 MB)
_CHUNK_BYTES = 1024 * 1024
_EVENT_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_TRACE_EVENTS_KEY = re.compile(rb'(?<!\\)"traceEvents"\s*:\s*\[')
_BLANK = re.compile(rb"[ \t\n\r\x0b\x0c]*")  # what bytes.isspace() calls space, for any buffer

# Largest |ts| and |dur| accepted, in microseconds (~31,700 years): epoch timestamps fit with room
# to spare, and nanosecond arithmetic on anything within it stays finite. NaN fails every
# comparison, so it is out of range too.
MAX_TIME_US = 1e18


def _usable_name(name: str) -> bool:
    """False for a `ProfilerStep#N` whose N no step count reaches (it could not be reported as an
    integer)."""
    if not name.startswith(STEP_PREFIX):
        return True
    number = name[len(STEP_PREFIX) :]
    if not (number.isascii() and number.isdecimal()):
        return True  # an ordinary name (names.step_of)
    return len(number) <= 19 and int(number) <= MAX_STEP


def _usable_time(ts: float, dur: float) -> bool:
    """Whether an event can be placed in time: both values finite and within MAX_TIME_US, `dur` not
    negative."""
    return -MAX_TIME_US <= ts <= MAX_TIME_US and 0 <= dur <= MAX_TIME_US


@dataclass(frozen=True)
class Trace:
    """One trace file: where it came from, its rank, the CPU/device events summaries need, and its
    event count.

    `skipped_events` counts kept-category events dropped for unusable times; `incomplete_step` is
    the N of a ProfilerStep#N that only holds the start of its step (a window cut short), or None.
    """

    path: str
    rank: int | None
    events: list[Event]
    event_count: int
    skipped_events: int = 0
    incomplete_step: int | None = None
    device_name: str | None = None  # the trace's first GPU (deviceProperties)
    # the clock its times come from (host and boot), when stepcli recorded it
    clock: str | None = None
    # step -> (ms on a CPU, ms waiting for one) of the steps' thread, when stepcli recorded it
    cpu_time: dict[int, tuple[float, float]] | None = None
    world_size: int | None = None  # distributedInfo.world_size

    @classmethod
    def from_events(
        cls,
        events: Iterable[Event],
        *,
        path: str = "<memory>",
        rank: int | None = None,
        incomplete_step: int | None = None,
    ) -> Trace:
        """A trace built from events in memory (tests, other tools): keeps the same subset the
        loader keeps."""
        all_events = list(events)
        candidates = [
            e
            for e in all_events
            if e.ph == "X" and e.cat in KEPT_CATEGORIES and e.name not in FILTERED_NAMES
        ]
        kept = [e for e in candidates if _usable_time(e.ts, e.dur) and _usable_name(e.name)]
        return cls(
            path=path,
            rank=rank,
            events=kept,
            event_count=len(all_events),
            skipped_events=len(candidates) - len(kept),
            incomplete_step=incomplete_step,
        )


def load_paths(paths: Sequence[str], *, shapes: bool = False) -> list[Trace]:
    """Load every trace named by `paths` (files, or folders searched recursively), in a stable
    order.

    Raises TraceError naming the file and the problem for anything that is not a readable profiler
    trace. With `shapes`, each operator event also carries its recorded input shapes (for grouping
    by shape).
    """
    return [load_trace(file, shapes=shapes) for file in list_trace_files(paths)]


def load_trace(path: str, *, shapes: bool = False) -> Trace:
    """Read one trace file; see load_paths."""
    meta, keeper = _read(path, shapes, _Keeper)
    rank = meta.rank if meta.rank is not None else rank_from_name(path)
    return Trace(
        path=path,
        rank=rank,
        events=keeper.events,
        event_count=keeper.count,
        skipped_events=keeper.skipped,
        incomplete_step=meta.incomplete_step,
        device_name=meta.device,
        clock=meta.clock,
        cpu_time=meta.cpu_time,
        world_size=meta.world_size,
    )


# A trace's text: read into memory, or mapped copy-on-write where stepcli.traces.read.readahead
# inflated it.
Text = bytes | bytearray | mmap.mmap
Decode = Callable[[str, Text, bool, "type[_Keeper]"], "tuple[Meta, _Keeper]"]


def _read(
    path: str, shapes: bool, keeper_type: type[_Keeper], decode: Decode | None = None
) -> tuple[Meta, _Keeper]:
    """Read and decode one trace file (`decode`: how its data is decoded, _decode by default; one
    with a `midway` method also sees the text half inflated, see stepcli.inputs.read_input)."""
    data: Text | None = take_read_ahead(path)
    if data is None:
        try:
            data = read_input(path, midway=getattr(decode, "midway", None))
        except BaseException:
            abandon = getattr(decode, "abandon", None)  # (a child started at midway is stopped)
            if abandon is not None:
                abandon()
            raise
    if not data or _BLANK.fullmatch(data):
        raise TraceError(path, "empty file")
    # Millions of gc=False structs are allocated below; a cyclic collection pass over them buys
    # nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return (decode or _decode)(path, data, shapes, keeper_type)
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start : exc.start + 1].hex() if isinstance(exc.object, bytes) else "?"
        raise TraceError(
            path, f"not UTF-8 text (a string holds the invalid byte 0x{bad})"
        ) from None
    except RecursionError:
        raise TraceError(path, "invalid JSON: nested too deeply to be a profiler trace") from None
    except MemoryError:
        raise TraceError(path, "too large to read in the memory available") from None
    finally:
        if was_enabled:
            gc.enable()


def _decode(
    path: str, data: Text, shapes: bool, keeper: type[_Keeper] | None = None
) -> tuple[Meta, _Keeper]:
    """Decode in slices when the layout allows it (checked by the decoder itself), else in one
    piece."""
    try:
        chunked = _decode_chunked(data, shapes, keeper or _Keeper)
    except (msgspec.DecodeError, _NotChunkable):
        chunked = None  # fall back: the whole-document decode below gives the precise error, if any
    if chunked is not None:
        return chunked
    return _decode_whole(
        path, data[:] if isinstance(data, mmap.mmap) else data, shapes, keeper or _Keeper
    )


class _NotChunkable(Exception):
    pass


_BAD_NAME = "\0unusable"  # the interning table's marker for names whose events are skipped


class _Keeper:
    """Filters decoded events to the kept subset and interns repeated strings, one slice at a
    time."""

    def __init__(self, shapes: bool) -> None:
        self.events: list[Event] = []
        self.count = 0
        self.skipped = 0
        self.shapes = shapes
        self._names: dict[str, str] = {}
        self._cats = {c: c for c in KEPT_CATEGORIES}
        self._ids: dict[int | str, int | str] = {}
        self._shape_keys: dict[bytes, str] = {}

    def add(self, decoded: list[Any]) -> None:
        self.count += len(decoded)
        names = self._names
        cats = self._cats
        ids = self._ids
        keep = self.events.append
        filtered = FILTERED_NAMES
        high = MAX_TIME_US
        low = -high
        bad_name = _BAD_NAME
        for event in decoded:
            if event.ph != "X":
                continue
            cat = cats.get(event.cat)
            if cat is None:
                continue
            name = event.name
            if name in filtered:
                continue
            # Inlined _usable_time (this loop runs once per event of the file).
            ts = event.ts
            dur = event.dur
            if not (low <= ts <= high and 0 <= dur <= high):
                self.skipped += 1
                continue
            interned = names.get(name)
            if interned is None:  # first sight of this name: check it once
                interned = names[name] = name if _usable_name(name) else bad_name
            if interned is bad_name:
                self.skipped += 1
                continue
            event.name = interned
            event.cat = cat
            event.ph = "X"
            pid = event.pid
            event.pid = ids.setdefault(pid, pid)
            tid = event.tid
            event.tid = ids.setdefault(tid, tid)
            if self.shapes:
                self._take_shape(event)
            keep(event)

    def _take_shape(self, event: ShapedEvent) -> None:
        args = event.args
        if args is None or not args.dims:
            return
        raw = bytes(args.dims)
        args.dims = NO_DIMS  # the text is interned below: the event keeps its key, not the raw JSON
        key = self._shape_keys.get(raw)
        if key is None:
            key = self._shape_keys[raw] = " ".join(raw.decode("utf-8", "replace").split())
        event.shape = key


def _decode_chunked(
    data: Text, shapes: bool, keeper_type: type[_Keeper]
) -> tuple[Meta, _Keeper] | None:
    """Decode traceEvents in ~1 MB slices split between two events, plus one small document for the
    rest.

    A split can only be wrong if it falls inside a string or a nested value, and then the slice on
    its left is not a complete JSON array, so the decoder rejects it and the caller falls back to
    decoding the whole file.
    """
    layout = slice_layout(data)
    if layout is None:
        return None
    keeper = keeper_type(shapes)
    decode_slices(data, layout, 0, len(layout[1]), shapes, keeper)
    return decode_rest(data, layout, shapes, keeper)


def slice_layout(
    data: Text, prefix: tuple[int, list[int]] | None = None, chunk: int | None = None
) -> tuple[int, list[int]] | None:
    """Where traceEvents' list starts (just after its "[") and the commas between two events that
    cut it into slices of about `chunk` bytes (_CHUNK_BYTES by default); None for data too small to
    slice. Raises _NotChunkable without a traceEvents key. With `prefix`, the layout of a beginning
    of `data`, it is continued (the slices already cut stay as they are)."""
    chunk = chunk or _CHUNK_BYTES
    if prefix is not None and prefix[1]:
        start, splits = prefix[0], list(prefix[1])
        position = splits[-1] + 1 + chunk
    else:
        if len(data) < 2 * chunk:
            return None
        key = _TRACE_EVENTS_KEY.search(data)
        if key is None:
            raise _NotChunkable
        start = key.end()
        splits = []
        position = start + chunk
    while position < len(data):
        match = _EVENT_SEPARATOR.search(data, position)
        if match is None:
            break
        splits.append(data.find(b",", match.start()))  # (the separator holds one)
        position = match.end() + chunk
    return (start, splits) if splits else None


def decode_slices(
    data: Text, layout: tuple[int, list[int]], first: int, stop: int, shapes: bool, keeper: _Keeper
) -> None:
    """Decode slices `first` to `stop - 1` of the layout into `keeper` (slice i ends at the layout's
    i-th comma; raises msgspec errors)."""
    start, splits = layout
    decoder: msgspec.json.Decoder[list[Any]] = msgspec.json.Decoder(
        list[ShapedEvent] if shapes else list[DecodedEvent]
    )
    view = memoryview(data)
    if isinstance(data, (bytearray, mmap.mmap)) and not shapes:
        _decode_in_place(
            data,
            view,
            start - 1 if first == 0 else splits[first - 1],
            splits[first:stop],
            decoder,
            keeper,
        )
        return
    # (with shapes, msgspec.Raw values may keep a view of their input: each slice is a copy)
    previous = start if first == 0 else splits[first - 1] + 1
    for comma in splits[first:stop]:
        keeper.add(decoder.decode(b"".join((b"[", view[previous:comma], b"]"))))
        previous = comma + 1


def decode_rest(
    data: Text, layout: tuple[int, list[int]], shapes: bool, keeper: _Keeper
) -> tuple[Meta, _Keeper]:
    """The events after the layout's last comma, decoded back inside the document with everything
    before and after traceEvents, so the header (distributedInfo, stepcli's metadata) and the
    closing brackets are decoded and validated too; with the document's metadata."""
    start, splits = layout
    view = memoryview(data)
    meta, last = _decode_document(b"".join((view[:start], view[splits[-1] + 1 :])), shapes)
    keeper.add(last)
    return meta, keeper


def _decode_in_place(
    data: bytearray | mmap.mmap,
    view: memoryview,
    opening: int,
    splits: list[int],
    decoder: msgspec.json.Decoder[list[Any]],
    keeper: _Keeper,
) -> None:
    """Decode the slices where they lie, without copying them: the byte at `opening` (traceEvents'
    own "[", or the comma that ends the slice before) opens the first slice; each cut's comma
    becomes the "]" that closes its slice, then the "[" that opens the next. Every byte is put back,
    also when a slice fails, so the caller can decode the data whole."""
    first, was = opening, data[opening]
    data[first] = 0x5B  # "["
    try:
        for comma in splits:
            data[comma] = 0x5D  # "]"
            keeper.add(decoder.decode(view[opening : comma + 1]))
            data[comma] = 0x5B  # "["
            opening = comma
    finally:
        for comma in splits:
            data[comma] = 0x2C  # ","
        data[first] = was


def _decode_document(data: bytes | bytearray, shapes: bool) -> tuple[Meta, list[Any]]:
    """Header fields and events of a whole trace document (raises msgspec errors)."""
    header: Header | ShapedHeader
    if shapes:
        header = msgspec.json.decode(data, type=ShapedHeader)
    else:
        header = msgspec.json.decode(data, type=Header)
    meta = Meta(
        rank_number(header.distributedInfo),
        step_number(header.incomplete_step),
        device_name(header.deviceProperties),
        clock_id(header.clock),
        cpu_time_of(header.cpu_time),
        world_size_number(header.distributedInfo),
    )
    return meta, header.traceEvents


def _decode_whole(
    path: str,
    data: bytes | bytearray,
    shapes: bool,
    keeper_type: type[_Keeper],
    transcoded: bool = False,
) -> tuple[Meta, _Keeper]:
    try:
        meta, events = _decode_document(data, shapes)
    except msgspec.ValidationError:
        meta, events, count = decode_lenient(path, data, shapes)
        keeper = keeper_type(shapes)
        keeper.add(events)
        keeper.count = count
        return meta, keeper
    except msgspec.DecodeError as exc:
        utf8 = None if transcoded else as_utf8(data)
        if utf8 is not None:  # a byte order mark, UTF-16 or UTF-32: read as any JSON reader would
            if _BLANK.fullmatch(utf8):
                raise TraceError(path, "empty file") from None
            return _decode_whole(path, utf8, shapes, keeper_type, transcoded=True)
        # PyTorch leaves quotes inside event names bare (stepcli.agent.tracenames)
        repaired = escape_names(data)
        if repaired is None:
            raise TraceError(path, describe_decode_error(data, exc)) from None
        try:
            return _decode_whole(path, repaired, shapes, keeper_type)
        except TraceError:
            raise TraceError(path, describe_decode_error(data, exc)) from None
    keeper = keeper_type(shapes)
    keeper.add(events)
    return meta, keeper
