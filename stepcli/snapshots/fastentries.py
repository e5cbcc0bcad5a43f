"""The streaming decoder's state (its buffer, its memo, what it let go of) and its fast path.

Most history entries torch writes share one layout: memo references for keys, numbers, short
strings, a frames list of memo references. `FastEntryDecoder` reads those straight from the bytes
into a `Trace`, building no dict and no frames list and keeping nothing in the memo; the first byte
it does not expect hands over to the opcode loop of stepcli.snapshots.unpickle (`StreamDecoder`,
which extends this class).
"""

from __future__ import annotations

import re
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Any

from stepcli.snapshots.history import (
    _FRAME_CACHE_LIMIT,
    HistoryBuilder,
    HistoryColumns,
    HistoryFrame,
)
from stepcli.snapshots.opcodes import (
    APPEND,
    BINGET,
    BININT,
    BININT1,
    BININT2,
    EMPTY_DICT,
    EMPTY_LIST,
    LONG1,
    LONG_BINGET,
    MARK,
    MEMOIZE,
    NEWFALSE,
    NEWTRUE,
    NONE,
    SETITEMS,
    SHORT_BINUNICODE,
    _from_bytes,
    _unpack_H,
    _unpack_I,
    _unpack_i,
)

CHUNK = 1 << 20
# a frames list's items: memo references, then APPENDS
_REFS = re.compile(rb"(?:h.|j....)*e", re.DOTALL)
# A frame dict of its own (what torch writes: new dicts, shared strings): keys and values memo
# references (a line number an int), memoized; a list of them, then APPENDS; or one, then APPEND.
_FRAME = rb"\}\x94\((?:(?:h.|j....)(?:h.|j....|K.|M..|J....))*u"
_INLINE = re.compile(rb"(?:" + _FRAME + rb")+e", re.DOTALL)
_INLINE1 = re.compile(_FRAME + rb"a", re.DOTALL)
# keys whose value the fast loop reads only as a string/list
_NOT_NUMBERS = ("action", "user_metadata", "frames")
_NOT_STRINGS = ("action", "addr", "size", "device_free", "frames")


class _Dropped:
    """What the memo holds in place of an entry's dict or frames list it let go: naming one again is
    unsupported."""


class FastEntryDecoder:
    """The buffer and memo of one pickle read from `read` (a function like a file's), and the fast
    path that reads history entries of the common layout into their `Trace`."""

    def __init__(
        self,
        read: Callable[[int], bytes],
        builder: HistoryBuilder,
        keep: bool = False,
    ) -> None:
        self._read = read
        self.builder = builder
        # True: every entry and frame stays in the memo (a pickle that names one again)
        self._keep = keep
        self.histories: dict[int, HistoryColumns] = {}  # id(history list) -> its columns
        self._history_lists: list[list[Any]] = []  # kept alive, so their ids stay theirs
        self._memo: dict[int, Any] = {}
        # MEMOIZE's index: how many objects were memoized, dropped ones included
        self._memo_next = 0
        # id(dict or list in the memo) -> its index, to drop entries
        self._containers: dict[int, int] = {}
        # Dropped frames lists, by memo index (increasing) -> their stack: 8 bytes each where the
        # list took ~200
        self._list_indexes = array("I")
        self._list_stacks = array("I")
        # dropped strings of single entries, by memo index -> their step code
        self._string_indexes = array("I")
        self._string_steps = array("I")
        # frame dicts let go, by memo index (increasing) -> their Frame
        self._frame_indexes = array("I")
        self._frame_values: list[HistoryFrame] = []
        # Frames lists of frame dicts of their own the fast path read, by memo index -> their stack:
        # the list's dicts were memoized right after it, so memo index + k names the stack's k-th
        # frame
        self._inline_indexes = array("I")
        self._inline_stacks = array("I")
        self._nested_lists = 0  # lists held in lists so far (shape.MAX_NESTED_LISTS)
        self._held = 0  # dicts, lists and sets held in dicts so far (shape.MAX_HELD)
        # ids of the segment and block dicts put in lists (each once)
        self._records: set[int] = set()
        # a frames list's bytes (memo references) -> stack index
        self._stacks_by_refs: dict[bytes, int] = {}
        self._key_names: dict[bytes, str] = {}  # a key's memo reference bytes -> the key
        self._data = b""
        self._pos = 0
        self._eof = False
        self._seen_memoize = False
        self._seen_put = False

    def _frame_at(self, index: int) -> HistoryFrame | None:
        """The Frame of a frame dict at memo `index` that was let go, else None."""
        at = bisect_left(self._frame_indexes, index)
        if at < len(self._frame_indexes) and self._frame_indexes[at] == index:
            return self._frame_values[at]
        at = bisect_right(self._inline_indexes, index) - 1
        if at >= 0:
            frames = self.builder.stacks[self._inline_stacks[at]]
            offset = index - self._inline_indexes[at] - 1
            if 0 <= offset < len(frames):
                return frames[offset]
        return None

    # -- the buffer
    # ----------------------------------------------------------------------------------------------
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

    # -- the fast path
    # ----------------------------------------------------------------------------------------------
    def _fast_entries(self, trace: HistoryColumns) -> None:
        """History entries in the common layout, read straight from the bytes: no dict, no frames
        list, nothing kept in the memo (each MEMOIZE only counted). Stops at the first byte it does
        not expect, where the slow loop takes over (the end of a batch, a frame boundary, a new
        string or frame, an odd layout)."""
        if self._seen_put or self._keep:
            return
        try:
            self._fast_loop(trace)
        # an entry past the bytes at hand: the slow loop reads it
        except (IndexError, struct.error):
            pass

    # one function: a call per field would cost ~20%
    def _fast_loop(self, trace: HistoryColumns) -> None:  # noqa: C901
        data, pos = self._data, self._pos
        memo = self._memo
        key_names = self._key_names
        stacks_by_refs = self._stacks_by_refs
        builder = self.builder
        action_code, step_code = builder.action_code, builder.step_code
        add_action, add_addr, add_size = (
            trace.actions.append,
            trace.addrs.append,
            trace.sizes.append,
        )
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
            new_inline = False
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
                # a memoized value: the action, "", a shared string
                if op == BINGET or op == LONG_BINGET:
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
                    # a list named again: a block's, or an earlier event's of this allocation
                    elif key == "frames":
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
                # a string made for this entry (user_metadata, compile_context)
                elif op == SHORT_BINUNICODE:
                    n = data[pos + 1]
                    text = data[pos + 2 : pos + 2 + n]
                    pos += 2 + n
                    if key in _NOT_STRINGS:
                        ok = False
                        break
                    text_step = step_code(text)
                    if key == "user_metadata":
                        step = text_step
                    # torch makes this string for this entry alone: its step is kept
                    if data[pos] == MEMOIZE:
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
                    inline = None
                    if op == MARK:
                        found = _REFS.match(data, pos + 1) or _INLINE.match(data, pos + 1)
                        if found is None:
                            ok = False
                            break
                        refs = data[pos + 1 : found.end() - 1]
                        pos = found.end()
                        if data[found.start()] == EMPTY_DICT:
                            inline = refs
                    elif op == EMPTY_DICT:
                        found = _INLINE1.match(data, pos)
                        if found is None:
                            ok = False
                            break
                        refs = inline = data[pos : found.end() - 1]
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
                            hit = (
                                self._stack_of_refs(refs)
                                if inline is None
                                else self._stack_of_inline(inline)
                            )
                            if hit is None:
                                ok = False
                                break
                        stack = hit
                        if inline is not None:  # its frame dicts: memoized after the list, one each
                            memo_next += len(builder.stacks[stack])
                            new_inline = True
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
                named = memo.get(
                    action[1] if len(action) == 2 else unpack_I(action, 1)[0], _Dropped
                )
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
                if new_inline:
                    self._inline_indexes.append(new_list)
                    self._inline_stacks.append(stack)
            for index, text_step in new_strings:
                string_indexes.append(index)
                string_steps.append(text_step)
            # this entry is done, whatever happens to the next
            self._pos, self._memo_next = pos, memo_next

    def _stack_of_refs(self, refs: bytes) -> int | None:
        """The stack a frames list of memo references names; None when the bytes are not only
        references."""
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
            if found is _Dropped:
                found = self._frame_at(index)
            if type(found) is not dict and type(found) is not HistoryFrame:
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

    def _stack_of_inline(self, body: bytes) -> int | None:
        """The stack of a frames list of frame dicts of their own (each `}\\x94(` key value ... `u`,
        the keys torch's three); None for any other layout (the slow loop reads it)."""
        frames = []
        memo = self._memo
        pos = 0
        while pos < len(body):
            pos += 3  # EMPTY_DICT MEMOIZE MARK
            fields: dict[str, Any] = {}
            while body[pos] != SETITEMS:
                key, pos = self._ref_or_int(body, pos, memo)
                value, pos = self._ref_or_int(body, pos, memo)
                if type(key) is not str or key in fields:
                    return None
                fields[key] = value
            pos += 1
            if len(fields) != 3:
                return None
            try:
                frames.append(self.builder.frame(fields))
            except (KeyError, TypeError, ValueError):
                return None
        index = self.builder.stack(frames)
        if len(self._stacks_by_refs) < _FRAME_CACHE_LIMIT:
            self._stacks_by_refs[body] = index
        return index

    @staticmethod
    def _ref_or_int(body: bytes, pos: int, memo: dict[int, Any]) -> tuple[Any, int]:
        """The value at pos (a memo reference or an int) and the position after it; _Dropped when
        unknown."""
        op = body[pos]
        if op == BINGET:
            return memo.get(body[pos + 1], _Dropped), pos + 2
        if op == LONG_BINGET:
            return memo.get(_unpack_I(body, pos + 1)[0], _Dropped), pos + 5
        if op == BININT1:
            return body[pos + 1], pos + 2
        if op == BININT2:
            return _unpack_H(body, pos + 1)[0], pos + 3
        return _unpack_i(body, pos + 1)[0], pos + 5
