"""The model of a memory snapshot's history, and the builder the streaming decoder fills it with.

`Trace` keeps one device's allocator events as columns (25 bytes an event); `HistoryBuilder` interns
stacks, codes actions and steps, and appends each entry to those columns, whichever way the decoder
read it (the fast path in stepcli.snapshots.fastentries or the opcode loop in
stepcli.snapshots.unpickle). The decoder's errors live here too, since the builder raises them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, NamedTuple, cast, overload

_FRAME_CACHE_LIMIT = 1 << 20


class Unsupported(Exception):
    """Not a pickle this decoder handles: decode it with the C unpickler instead."""


class Truncated(Exception):
    """The pickle ends before its STOP."""


class NotSnapshot(Exception):
    """The first object that is not of a snapshot's shape (a list of empty lists, a dict of the
    wrong keys, a string of megabytes): refused as soon as it is read, before the rest is built.
    `verbatim`: the message is the whole line (not a pickle at all, a pickle of something else)."""

    def __init__(self, reason: str, verbatim: bool = False) -> None:
        super().__init__(reason)
        self.verbatim = verbatim


class ClassRefused(Exception):
    """The pickle asks for a class or function (or a persistent object): never built, whatever it
    is."""


class HistoryFrame(NamedTuple):
    filename: str
    line: int
    name: str


Stack = tuple[HistoryFrame, ...]


class Entry(NamedTuple):
    """One allocator event of the history: alloc, free_requested, free_completed, segment_alloc,
    segment_free, segment_map, segment_unmap, snapshot or oom (whose `addr` is the device's free
    bytes)."""

    action: str
    addr: int
    size: int
    stack: int
    step: int | None  # the global step stepcli tagged it with (`user_metadata`), None when untagged


class StackRef(NamedTuple):
    """A frames list the decoder dropped, named again (torch shares one list among an allocation's
    alloc and free events): the stack it was."""

    stack: int


class StepRef(NamedTuple):
    """A string made for one entry (its `user_metadata`) the decoder dropped, named again: its step
    code."""

    code: int


class HistoryColumns(Sequence[Entry]):
    """One device's history as columns: 25 bytes an entry, where a tuple of Python objects would
    take ~150."""

    def __init__(self, names: list[str], steps: list[int | None]) -> None:
        self.names = names  # action code -> action (shared by the snapshot's traces)
        self.step_values = steps  # step code -> step; code 0 is None
        self.actions = array("B")
        self.addrs = array("q")
        self.sizes = array("q")
        self.stacks = array("I")
        self.steps = array("I")

    def __len__(self) -> int:
        return len(self.actions)

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | Sequence[Entry]:
        if isinstance(index, slice):
            return (
                list(self.rows(index.start, index.stop))
                if index.step is None
                else list(self)[index]
            )
        return Entry(
            self.names[self.actions[index]],
            self.addrs[index],
            self.sizes[index],
            self.stacks[index],
            self.step_values[self.steps[index]],
        )

    def __iter__(self) -> Iterator[Entry]:
        return map(Entry._make, self.rows())

    def rows(self, start: int | None = None, stop: int | None = None) -> Iterator[Entry]:
        """(action, addr, size, stack, step) tuples, made one at a time: a replay's loop over
        millions."""
        names, steps = self.names, self.step_values
        rows = zip(
            map(names.__getitem__, self.actions),
            self.addrs,
            self.sizes,
            self.stacks,
            map(steps.__getitem__, self.steps),
        )
        if start is None and stop is None:
            return cast("Iterator[Entry]", rows)
        return cast("Iterator[Entry]", islice(rows, *slice(start, stop).indices(len(self))[:2]))

    def has_action(self, action: str) -> bool:
        return action in self.names and self.names.index(action) in self.actions


def _text(value: Any) -> str:
    """A frame's file or function name: a string in every snapshot torch writes. Anything else is
    refused rather than turned into text (a list nested 200,000 deep would take the whole stack to
    print)."""
    if type(value) is not str:
        raise TypeError(f"a frame's name is a {type(value).__name__}, not a string")
    return value


class HistoryBuilder:
    """Stacks interned (frame dicts kept once), steps and actions coded, entries appended to `Trace`
    columns."""

    def __init__(self, step_tag: str) -> None:
        self.stacks: list[Stack] = [()]
        self.frames: dict[
            HistoryFrame, HistoryFrame
        ] = {}  # each distinct frame once, whatever number of dicts named it
        self._stack_index: dict[Stack, int] = {(): 0}
        # id(frame dict) -> (the dict, kept alive; its Frame)
        self._frames: dict[int, tuple[object, HistoryFrame]] = {}
        self._by_ids: dict[tuple[int, ...], int] = {}
        self.names: list[str] = []
        self._codes: dict[str, int] = {}
        self.step_values: list[int | None] = [None]
        self._step_codes: dict[Any, int] = {}
        self._tag = step_tag

    def new_trace(self) -> HistoryColumns:
        return HistoryColumns(self.names, self.step_values)

    def stack(self, frames: Any) -> int:
        """The index of this stack. torch shares each distinct frame dict among all entries, so the
        ids of a list's frame dicts (kept alive here, so ids stay unique) find a known stack without
        reading a field."""
        if not frames:
            return 0
        if type(frames) is StackRef:
            return int(frames.stack)
        ids = tuple(map(id, frames))
        index = self._by_ids.get(ids)
        if index is not None:
            return index
        cache = self._frames
        # a writer that never shares frame dicts: start the cache over
        if len(cache) > _FRAME_CACHE_LIMIT:
            cache.clear()
            self._by_ids.clear()
        out: list[HistoryFrame] = []
        for raw in frames:
            # converted as its dict was read: interned, so its id is stable
            if type(raw) is HistoryFrame:
                out.append(raw)
                continue
            hit = cache.get(id(raw))
            if hit is None:
                if type(raw) is not dict:
                    raise TypeError(f"a frame is a {type(raw).__name__}, not a dict")
                hit = cache[id(raw)] = (raw, self.frame(raw))
            out.append(hit[1])
        key = tuple(out)
        index = self._stack_index.get(key)
        if index is None:
            index = self._stack_index[key] = len(self.stacks)
            self.stacks.append(key)
        self._by_ids[ids] = index
        return index

    def frame(self, raw: Any) -> HistoryFrame:
        """The interned Frame of a frame dict ({filename, line, name}: torch's keys)."""
        made = HistoryFrame(_text(raw["filename"]), int(raw["line"]), _text(raw["name"]))
        return self.frames.setdefault(made, made)

    def step_code(self, metadata: Any) -> int:
        """The code of the step a `user_metadata` (str, or the bytes of one) names; 0: none."""
        if not metadata:
            return 0
        if type(metadata) is StepRef:
            return metadata.code
        code = self._step_codes.get(metadata)
        if code is None:
            text = (
                metadata.decode("utf-8", "surrogatepass")
                if isinstance(metadata, bytes)
                else str(metadata)
            )
            tag = self._tag
            digits = text[len(tag) :]
            value = int(digits) if text.startswith(tag) and digits.isdigit() else None
            if value is None:
                code = 0
            elif value in self.step_values:
                code = self.step_values.index(value)
            else:
                code = len(self.step_values)
                self.step_values.append(value)
            if len(self._step_codes) < _FRAME_CACHE_LIMIT:
                self._step_codes[metadata] = code
        return code

    def action_code(self, action: str) -> int:
        code = self._codes.get(action)
        if code is None:
            if len(self.names) >= 256:
                raise ValueError("more than 256 different actions")
            code = self._codes[action] = len(self.names)
            self.names.append(action)
        return code

    def add(self, trace: HistoryColumns, raw: Any) -> None:
        """One entry's dict (any layout torch writes) -> one row: the fields as `int`/`str` read
        them."""
        action = raw["action"]
        if type(action) is StepRef or type(action) is StackRef:
            raise Unsupported("an action named by reference to a dropped string")
        action = str(action)
        addr = raw.get("device_free", 0) if action == "oom" else raw.get("addr", 0)
        size = int(raw["size"])
        stack = self.stack(raw.get("frames"))
        trace.actions.append(self.action_code(action))
        trace.addrs.append(int(addr))
        trace.sizes.append(size)
        trace.stacks.append(stack)
        trace.steps.append(self.step_code(raw.get("user_metadata")))
