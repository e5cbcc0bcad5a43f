"""A streaming decoder of the plain-data pickles torch writes for memory snapshots, in bounded memory.

Python's unpicklers keep every memoized object (each history entry's dict and frames list) in their memo until the
load ends, so a snapshot decodes to about 8x its file. This decoder runs the subset of pickle opcodes that plain
data uses (protocols 2-5: dicts, lists, tuples, sets, strings, bytes, numbers) and, once a list turns out to be a
history (its first item is a dict with an "action"), turns each of its entries into a row of `Trace` columns as
it completes and keeps neither the entry's dict nor its frames list: only what later opcodes can still name
(strings, frame dicts, the rest of the snapshot) stays in the memo. Most entries never become dicts at all: a
tight loop reads the common layout (memo references for keys, numbers, short strings, a frames list of memo
references, the list's bytes being the stack's cache key) straight from the bytes.

Anything outside that subset (a class, REDUCE, protocol 0-1 text opcodes, a reference to an entry it dropped)
raises `Unsupported`, and the caller decodes the file again with the restricted C unpickler instead: that
one refuses whatever is not plain data and words every error. Nothing here builds anything but plain data.
"""

from __future__ import annotations

import re
import struct
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any, NamedTuple, cast, overload

CHUNK = 1 << 20
_FRAME_CACHE_LIMIT = 1 << 20


class Unsupported(Exception):
    """Not a pickle this decoder handles: decode it with the C unpickler instead."""


class Truncated(Exception):
    """The pickle ends before its STOP."""


class Frame(NamedTuple):
    filename: str
    line: int
    name: str


Stack = tuple[Frame, ...]


class Entry(NamedTuple):
    """One allocator event of the history: alloc, free_requested, free_completed, segment_alloc, segment_free,
    segment_map, segment_unmap, snapshot or oom (whose `addr` is the device's free bytes)."""

    action: str
    addr: int
    size: int
    stack: int
    step: int | None  # the global step stepcli tagged it with (`user_metadata`), None when untagged


class StackRef(NamedTuple):
    """A frames list the decoder dropped, named again (torch shares one list among an allocation's alloc and free
    events): the stack it was."""

    stack: int


class StepRef(NamedTuple):
    """A string made for one entry (its `user_metadata`) the decoder dropped, named again: its step code."""

    code: int


class Trace(Sequence[Entry]):
    """One device's history as columns: 25 bytes an entry, where a tuple of Python objects would take ~150."""

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
            return list(self.rows(index.start, index.stop)) if index.step is None else list(self)[index]
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
        """(action, addr, size, stack, step) tuples, made one at a time: a replay's loop over millions."""
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
    """A frame's file or function name: a string in every snapshot torch writes. Anything else is refused rather
    than turned into text (a list nested 200,000 deep would take the whole stack to print)."""
    if type(value) is not str:
        raise TypeError(f"a frame's name is a {type(value).__name__}, not a string")
    return value


class HistoryBuilder:
    """Stacks interned (frame dicts kept once), steps and actions coded, entries appended to `Trace` columns."""

    def __init__(self, step_tag: str) -> None:
        self.stacks: list[Stack] = [()]
        self._stack_index: dict[Stack, int] = {(): 0}
        self._frames: dict[int, tuple[object, Frame]] = {}  # id(frame dict) -> (the dict, kept alive; its Frame)
        self._by_ids: dict[tuple[int, ...], int] = {}
        self.names: list[str] = []
        self._codes: dict[str, int] = {}
        self.step_values: list[int | None] = [None]
        self._step_codes: dict[Any, int] = {}
        self._tag = step_tag

    def new_trace(self) -> Trace:
        return Trace(self.names, self.step_values)

    def stack(self, frames: Any) -> int:
        """The index of this stack. torch shares each distinct frame dict among all entries, so the ids of a
        list's frame dicts (kept alive here, so ids stay unique) find a known stack without reading a field."""
        if not frames:
            return 0
        if type(frames) is StackRef:
            return int(frames.stack)
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
                hit = cache[id(raw)] = (raw, Frame(_text(raw["filename"]), int(raw["line"]), _text(raw["name"])))
            out.append(hit[1])
        key = tuple(out)
        index = self._stack_index.get(key)
        if index is None:
            index = self._stack_index[key] = len(self.stacks)
            self.stacks.append(key)
        self._by_ids[ids] = index
        return index

    def step_code(self, metadata: Any) -> int:
        """The code of the step a `user_metadata` (str, or the bytes of one) names; 0: none."""
        if not metadata:
            return 0
        if type(metadata) is StepRef:
            return metadata.code
        code = self._step_codes.get(metadata)
        if code is None:
            text = metadata.decode("utf-8", "surrogatepass") if isinstance(metadata, bytes) else str(metadata)
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

    def add(self, trace: Trace, raw: Any) -> None:
        """One entry's dict (any layout torch writes) -> one row: the fields as `int`/`str` read them."""
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


_unpack_I = struct.Struct("<I").unpack_from
_unpack_H = struct.Struct("<H").unpack_from
_unpack_i = struct.Struct("<i").unpack_from
_unpack_Q = struct.Struct("<Q").unpack_from
_unpack_d = struct.Struct(">d").unpack_from
_from_bytes = int.from_bytes
_REFS = re.compile(rb"(?:h.|j....)*e", re.DOTALL)  # a frames list's items: memo references, then APPENDS

MARK = 0x28
STOP = 0x2E
EMPTY_DICT = 0x7D
EMPTY_LIST = 0x5D
MEMOIZE = 0x94
BINPUT = 0x71
LONG_BINPUT = 0x72
BINGET = 0x68
LONG_BINGET = 0x6A
SETITEMS = 0x75
APPENDS = 0x65
APPEND = 0x61
SHORT_BINUNICODE = 0x8C
BININT1 = 0x4B
BININT2 = 0x4D
BININT = 0x4A
LONG1 = 0x8A
NONE = 0x4E
NEWTRUE = 0x88
NEWFALSE = 0x89
FRAME = 0x95
_NOT_NUMBERS = ("action", "user_metadata", "frames")  # keys whose value the fast loop reads only as a string/list
_NOT_STRINGS = ("action", "addr", "size", "device_free", "frames")


class _Dropped:
    """What the memo holds in place of an entry's dict or frames list it let go: naming one again is unsupported."""


class StreamDecoder:
    """One pickle, read from `read` (a function like a file's), its histories turned into `Trace`s as they go."""

    def __init__(self, read: Callable[[int], bytes], builder: HistoryBuilder) -> None:
        self._read = read
        self.builder = builder
        self.histories: dict[int, Trace] = {}  # id(history list) -> its columns
        self._history_lists: list[list[Any]] = []  # kept alive, so their ids stay theirs
        self._not_histories: set[int] = set()  # lists seen with items that are not history entries
        self._memo: dict[int, Any] = {}
        self._memo_next = 0  # MEMOIZE's index: how many objects were memoized, dropped ones included
        self._containers: dict[int, int] = {}  # id(dict or list in the memo) -> its index, to drop entries
        # Dropped frames lists, by memo index (increasing) -> their stack: 8 bytes each where the list took ~200
        self._list_indexes = array("I")
        self._list_stacks = array("I")
        self._string_indexes = array("I")  # dropped strings of single entries, by memo index -> their step code
        self._string_steps = array("I")
        self._stacks_by_refs: dict[bytes, int] = {}  # a frames list's bytes (memo references) -> stack index
        self._key_names: dict[bytes, str] = {}  # a key's memo reference bytes -> the key
        self._data = b""
        self._pos = 0
        self._eof = False
        self._seen_memoize = False
        self._seen_put = False

    # -- the buffer -----------------------------------------------------------------------------------------------
    def _fill(self, data: bytes, pos: int, need: int) -> tuple[bytes, int]:
        """At least `need` bytes from pos on (fewer only at the end of the file)."""
        parts = [data[pos:]]
        have = len(parts[0])
        while have < need and not self._eof:
            chunk = self._read(max(CHUNK, min(need - have, 1 << 26)))
            if not chunk:
                self._eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts), 0

    # -- the opcode loop ------------------------------------------------------------------------------------------
    def run(self) -> tuple[Any, dict[int, Trace]]:
        """The pickle's object and its histories; any problem but a truncated file: Unsupported."""
        try:
            return self.load(), self.histories
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise Unsupported(f"{type(exc).__name__}: {exc}") from None

    def load(self) -> Any:
        """The pickle's object, histories emptied into `self.histories`; Truncated, Unsupported or the error of
        a conversion (KeyError, ValueError...: the caller decodes the file the other way for the exact words)."""
        try:
            return self._load()
        except (IndexError, struct.error) as exc:
            if self._eof:
                raise Truncated from None
            raise Unsupported(str(exc)) from None

    def _load(self) -> Any:  # noqa: C901 (an opcode loop: its state in locals, one branch per opcode)
        data, pos = self._fill(b"", 0, CHUNK)
        memo = self._memo
        containers = self._containers
        stack: list[Any] = []
        metastack: list[list[Any]] = []
        histories = self.histories
        unpack_I, unpack_H, unpack_i, unpack_Q = _unpack_I, _unpack_H, _unpack_i, _unpack_Q
        while True:
            if len(data) - pos < 16:
                data, pos = self._fill(data, pos, 16)
                if pos >= len(data):
                    raise Truncated
            op = data[pos]
            pos += 1
            if op == BINGET or op == LONG_BINGET:
                if op == BINGET:
                    index = data[pos]
                    pos += 1
                else:
                    index = unpack_I(data, pos)[0]
                    pos += 4
                value = memo.get(index, _Dropped)
                if value is _Dropped:
                    value = self._dropped_list(index)
                stack.append(value)
            elif op == MEMOIZE:
                if self._seen_put:
                    raise Unsupported("both MEMOIZE and PUT")
                self._seen_memoize = True
                value = stack[-1]
                memo[self._memo_next] = value
                if type(value) is dict or type(value) is list:
                    containers[id(value)] = self._memo_next
                self._memo_next += 1
            elif op == EMPTY_DICT:
                if metastack and metastack[-1] and id(metastack[-1][-1]) in histories:
                    for raw in stack:  # entries that went the slow way: in order, before this one
                        self._add_entry(histories[id(metastack[-1][-1])], raw)
                    stack.clear()
                    self._data, self._pos = data, pos - 1
                    self._fast_entries(histories[id(metastack[-1][-1])])
                    data, pos = self._data, self._pos
                    if data[pos] == EMPTY_DICT:  # not the common layout: this one the slow way
                        pos += 1
                        stack.append({})
                else:
                    stack.append({})
            elif op == MARK:
                metastack.append(stack)
                stack = []
            elif op == SETITEMS:
                items = stack
                stack = metastack.pop()
                target = stack[-1]
                for i in range(0, len(items), 2):
                    target[items[i]] = items[i + 1]
            elif op == SHORT_BINUNICODE:
                n = data[pos]
                if len(data) - pos < n + 1:
                    data, pos = self._fill(data, pos, n + 1)
                stack.append(str(data[pos + 1 : pos + 1 + n], "utf-8", "surrogatepass"))
                pos += 1 + n
            elif op == BININT1:
                stack.append(data[pos])
                pos += 1
            elif op == BININT2:
                stack.append(unpack_H(data, pos)[0])
                pos += 2
            elif op == BININT:
                stack.append(unpack_i(data, pos)[0])
                pos += 4
            elif op == LONG1:
                n = data[pos]
                if len(data) - pos < n + 1:
                    data, pos = self._fill(data, pos, n + 1)
                stack.append(_from_bytes(data[pos + 1 : pos + 1 + n], "little", signed=True))
                pos += 1 + n
            elif op == EMPTY_LIST:
                stack.append([])
            elif op == APPENDS or op == APPEND:
                if op == APPENDS:
                    items = stack
                    stack = metastack.pop()
                else:
                    items = [stack.pop()]
                target = stack[-1]
                if type(target) is not list:
                    raise Unsupported("APPENDS to a non-list")
                self._append(target, items)
            elif op == NONE:
                stack.append(None)
            elif op == NEWTRUE:
                stack.append(True)
            elif op == NEWFALSE:
                stack.append(False)
            elif op == FRAME:
                pos += 8
            elif op == 0x73:  # SETITEM
                value = stack.pop()
                key = stack.pop()
                stack[-1][key] = value
            elif op == 0x85:  # TUPLE1
                stack[-1] = (stack[-1],)
            elif op == 0x86:  # TUPLE2
                stack[-2:] = [(stack[-2], stack[-1])]
            elif op == 0x87:  # TUPLE3
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif op == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif op == 0x74:  # TUPLE
                items = stack
                stack = metastack.pop()
                stack.append(tuple(items))
            elif op == BINPUT or op == LONG_BINPUT:
                if self._seen_memoize:
                    raise Unsupported("both MEMOIZE and PUT")
                self._seen_put = True
                if op == BINPUT:
                    index = data[pos]
                    pos += 1
                else:
                    index = unpack_I(data, pos)[0]
                    pos += 4
                value = stack[-1]
                memo[index] = value
                if type(value) is dict or type(value) is list:
                    containers[id(value)] = index
            elif op in (0x58, 0x8D, 0x43, 0x42, 0x8E):  # BINUNICODE, BINUNICODE8, SHORT_BINBYTES, BINBYTES(8)
                width = 8 if op in (0x8D, 0x8E) else (1 if op == 0x43 else 4)
                n = data[pos] if width == 1 else (unpack_I(data, pos)[0] if width == 4 else unpack_Q(data, pos)[0])
                pos += width
                if len(data) - pos < n:
                    data, pos = self._fill(data, pos, n)
                    if len(data) < n:
                        raise Truncated
                raw = data[pos : pos + n]
                stack.append(str(raw, "utf-8", "surrogatepass") if op in (0x58, 0x8D) else bytes(raw))
                pos += n
            elif op == 0x8B:  # LONG4
                n = unpack_i(data, pos)[0]
                if n < 0 or n > 1 << 16:
                    raise Unsupported("LONG4")
                pos += 4
                if len(data) - pos < n:
                    data, pos = self._fill(data, pos, n)
                stack.append(_from_bytes(data[pos : pos + n], "little", signed=True))
                pos += n
            elif op == 0x47:  # BINFLOAT
                stack.append(_unpack_d(data, pos)[0])
                pos += 8
            elif op == 0x8F:  # EMPTY_SET
                stack.append(set())
            elif op == 0x90:  # ADDITEMS
                items = stack
                stack = metastack.pop()
                target = stack[-1]
                if type(target) is not set:
                    raise Unsupported("ADDITEMS")
                target.update(items)
            elif op == 0x91:  # FROZENSET
                items = stack
                stack = metastack.pop()
                stack.append(frozenset(items))
            elif op == 0x30:  # POP
                if stack:
                    stack.pop()
                else:
                    stack = metastack.pop()
            elif op == 0x31:  # POP_MARK
                stack = metastack.pop()
            elif op == 0x32:  # DUP
                stack.append(stack[-1])
            elif op == 0x80:  # PROTO
                if not 2 <= data[pos] <= 5:
                    raise Unsupported("protocol")
                pos += 1
            elif op == STOP:
                if len(stack) != 1 or metastack:
                    raise Unsupported("STOP")
                return stack[0]
            else:
                raise Unsupported(f"opcode {op:#x}")

    # -- histories --------------------------------------------------------------------------------------------
    def _append(self, target: list[Any], items: list[Any]) -> None:
        trace = self.histories.get(id(target))
        if trace is None and not target and id(target) not in self._not_histories:
            first = items[0] if items else None
            if type(first) is dict and "action" in first:
                trace = self.histories[id(target)] = self.builder.new_trace()
                self._history_lists.append(target)
            else:
                self._not_histories.add(id(target))
        if trace is None:
            target.extend(items)
            return
        for raw in items:
            self._add_entry(trace, raw)

    def _add_entry(self, trace: Trace, raw: Any) -> None:
        """A history entry built the slow way: a row, and its dict and frames list out of the memo."""
        if type(raw) is not dict:
            raise Unsupported("a history entry that is not a dict")
        self.builder.add(trace, raw)
        memo, containers = self._memo, self._containers
        index = containers.pop(id(raw), None)
        if index is None:
            return
        del memo[index]  # naming it again: Unsupported
        frames = raw.get("frames")
        at = containers.get(id(frames))
        if type(frames) is list and at is not None and at > index and self._remember(at, trace.stacks[-1]):
            del containers[id(frames)]  # made inside this entry: only its stack is kept
            del memo[at]

    def _remember(self, index: int, stack: int) -> bool:
        """Keep the stack of a frames list memoized at `index` in place of the list; False: out of order."""
        if self._list_indexes and index <= self._list_indexes[-1]:
            return False
        self._list_indexes.append(index)
        self._list_stacks.append(stack)
        return True

    def _dropped_list(self, index: int) -> StackRef | StepRef:
        """A memo reference to something dropped: a frames list's stack, a string's step; else Unsupported."""
        at = bisect_left(self._list_indexes, index)
        if at < len(self._list_indexes) and self._list_indexes[at] == index:
            return StackRef(self._list_stacks[at])
        at = bisect_left(self._string_indexes, index)
        if at < len(self._string_indexes) and self._string_indexes[at] == index:
            return StepRef(self._string_steps[at])
        raise Unsupported(f"a reference to memo {index}, an entry this decoder let go")

    def _fast_entries(self, trace: Trace) -> None:
        """History entries in the common layout, read straight from the bytes: no dict, no frames list, nothing
        kept in the memo (each MEMOIZE only counted). Stops at the first byte it does not expect, where the
        slow loop takes over (the end of a batch, a frame boundary, a new string or frame, an odd layout)."""
        if self._seen_put:
            return
        try:
            self._fast_loop(trace)
        except (IndexError, struct.error):  # an entry past the bytes at hand: the slow loop reads it
            pass

    def _fast_loop(self, trace: Trace) -> None:  # noqa: C901 (one function: a call per field would cost ~20%)
        data, pos = self._data, self._pos
        memo = self._memo
        key_names = self._key_names
        stacks_by_refs = self._stacks_by_refs
        builder = self.builder
        action_code, step_code = builder.action_code, builder.step_code
        add_action, add_addr, add_size = trace.actions.append, trace.addrs.append, trace.sizes.append
        add_stack, add_step = trace.stacks.append, trace.steps.append
        unpack_I, unpack_H, unpack_i = _unpack_I, _unpack_H, _unpack_i
        memo_next = self._memo_next
        list_indexes, list_stacks = self._list_indexes, self._list_stacks
        string_indexes, string_steps = self._string_indexes, self._string_steps
        new_strings: list[tuple[int, int]] = []
        codes: dict[Any, int] = {}  # action value's bytes -> action code
        while True:
            if len(data) - pos < 65536 and not self._eof:
                data, pos = self._fill(data, pos, 65536)
                self._data, self._pos = data, pos
            if data[pos] != EMPTY_DICT or data[pos + 1] != MEMOIZE or data[pos + 2] != MARK:
                break
            memo_next += 1
            pos += 3
            action = b""
            new_list = -1
            if new_strings:
                new_strings = []
            addr = free = 0
            size = -1
            stack = 0
            step = 0
            ok = True
            while True:
                op = data[pos]
                if op == SETITEMS:
                    pos += 1
                    break
                if op == BINGET:
                    key_ref = data[pos : pos + 2]
                    pos += 2
                elif op == LONG_BINGET:
                    key_ref = data[pos : pos + 5]
                    pos += 5
                else:
                    ok = False
                    break
                key = key_names.get(key_ref)
                if key is None:
                    index = key_ref[1] if op == BINGET else unpack_I(key_ref, 1)[0]
                    found = memo.get(index)
                    if type(found) is not str:
                        ok = False
                        break
                    key = key_names[key_ref] = found
                op = data[pos]
                if op == BINGET or op == LONG_BINGET:  # a memoized value: the action, "", a shared string
                    width = 2 if op == BINGET else 5
                    value_ref = data[pos : pos + width]
                    pos += width
                    if key == "action":
                        action = value_ref
                    elif key == "user_metadata":
                        index = value_ref[1] if width == 2 else unpack_I(value_ref, 1)[0]
                        found = memo.get(index, _Dropped)
                        if found is _Dropped:
                            at = bisect_left(string_indexes, index)
                            if at == len(string_indexes) or string_indexes[at] != index:
                                ok = False
                                break
                            step = string_steps[at]
                        elif type(found) is str:
                            step = step_code(found)
                        else:
                            ok = False
                            break
                    elif key == "frames":  # a list named again: a block's, or an earlier event's of this allocation
                        index = value_ref[1] if width == 2 else unpack_I(value_ref, 1)[0]
                        found = memo.get(index, _Dropped)
                        if found is _Dropped:
                            if not list_indexes or list_indexes[-1] < index:
                                ok = False
                                break
                            at = bisect_left(list_indexes, index)
                            if list_indexes[at] != index:
                                ok = False
                                break
                            stack = list_stacks[at]
                        elif type(found) is list:
                            stack = builder.stack(found)
                        else:
                            ok = False
                            break
                    elif key in ("addr", "size", "device_free"):
                        ok = False  # a number named again: the slow way reads it
                        break
                elif op == LONG1 or op == BININT1 or op == BININT2 or op == BININT:
                    if op == BININT1:
                        value = data[pos + 1]
                        pos += 2
                    elif op == BININT2:
                        value = unpack_H(data, pos + 1)[0]
                        pos += 3
                    elif op == BININT:
                        value = unpack_i(data, pos + 1)[0]
                        pos += 5
                    else:
                        n = data[pos + 1]
                        value = _from_bytes(data[pos + 2 : pos + 2 + n], "little", signed=True)
                        pos += 2 + n
                    if key == "addr":
                        addr = value
                    elif key == "size":
                        size = value
                    elif key == "device_free":
                        free = value
                    elif key in _NOT_NUMBERS:
                        ok = False
                        break
                elif op == SHORT_BINUNICODE:  # a string made for this entry (user_metadata, compile_context)
                    n = data[pos + 1]
                    text = data[pos + 2 : pos + 2 + n]
                    pos += 2 + n
                    if key in _NOT_STRINGS:
                        ok = False
                        break
                    text_step = step_code(text)
                    if key == "user_metadata":
                        step = text_step
                    if data[pos] == MEMOIZE:  # torch makes this string for this entry alone: its step is kept
                        new_strings.append((memo_next, text_step))
                        memo_next += 1
                        pos += 1
                elif op == EMPTY_LIST and key == "frames":
                    if data[pos + 1] != MEMOIZE:
                        ok = False
                        break
                    list_index = memo_next
                    memo_next += 1
                    pos += 2
                    op = data[pos]
                    if op == MARK:
                        found = _REFS.match(data, pos + 1)
                        if found is None:
                            ok = False
                            break
                        refs = data[pos + 1 : found.end() - 1]
                        pos = found.end()
                    elif op == BINGET and data[pos + 2] == APPEND:
                        refs = data[pos : pos + 2]
                        pos += 3
                    elif op == LONG_BINGET and data[pos + 5] == APPEND:
                        refs = data[pos : pos + 5]
                        pos += 6
                    else:
                        refs = b""
                    if refs:
                        hit = stacks_by_refs.get(refs)
                        if hit is None:
                            hit = self._stack_of_refs(refs)
                            if hit is None:
                                ok = False
                                break
                        stack = hit
                    new_list = list_index
                elif op == NONE or op == NEWTRUE or op == NEWFALSE:
                    pos += 1
                    if key in ("action", "addr", "size", "device_free", "frames", "user_metadata"):
                        ok = False
                        break
                else:
                    ok = False
                    break
            if not ok or size < 0 or not action:
                break
            code = codes.get(action)
            if code is None:
                named = memo.get(action[1] if len(action) == 2 else unpack_I(action, 1)[0], _Dropped)
                if type(named) is not str:
                    break
                code = codes[action] = action_code(named)
            name = builder.names[code]
            add_action(code)
            add_addr(free if name == "oom" else addr)
            add_size(size)
            add_stack(stack)
            add_step(step)
            if new_list >= 0:
                list_indexes.append(new_list)
                list_stacks.append(stack)
            for index, text_step in new_strings:
                string_indexes.append(index)
                string_steps.append(text_step)
            self._pos, self._memo_next = pos, memo_next  # this entry is done, whatever happens to the next

    def _stack_of_refs(self, refs: bytes) -> int | None:
        """The stack a frames list of memo references names; None when the bytes are not only references."""
        frames = []
        pos = 0
        memo = self._memo
        while pos < len(refs):
            if refs[pos] == BINGET:
                index = refs[pos + 1]
                pos += 2
            elif refs[pos] == LONG_BINGET:
                index = _unpack_I(refs, pos + 1)[0]
                pos += 5
            else:
                return None
            found = memo.get(index, _Dropped)
            if type(found) is not dict:
                return None
            frames.append(found)
        if pos != len(refs):
            return None
        try:
            index = self.builder.stack(frames)
        except (KeyError, TypeError, ValueError):
            return None
        if len(self._stacks_by_refs) < _FRAME_CACHE_LIMIT:
            self._stacks_by_refs[refs] = index
        return index
