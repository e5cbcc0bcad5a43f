"""A streaming decoder of the plain-data pickles torch writes for memory snapshots, in bounded memory.

Python's unpicklers keep every memoized object (each history entry's dict and frames list) in their memo until the
load ends, so a snapshot decodes to about 8x its file. This decoder runs the subset of pickle opcodes that plain
data uses (protocols 2-5: dicts, lists, tuples, sets, strings, bytes, numbers) and, once a list turns out to be a
history (its first item is a dict with an "action"), turns each of its entries into a row of `Trace` columns as
it completes and keeps neither the entry's dict nor its frames list: only what later opcodes can still name
(strings, frame dicts, the rest of the snapshot) stays in the memo. Most entries never become dicts at all: a
tight loop reads the common layout (memo references for keys, numbers, short strings, a frames list of memo
references, the list's bytes being the stack's cache key) straight from the bytes: stepcli.snapshots.fastentries,
the base of `StreamDecoder`. The columns and the builder that fills them: stepcli.snapshots.history.

Anything outside that subset (a class, REDUCE, protocol 0-1 text opcodes, a reference to an entry it dropped)
raises `Unsupported`, and the caller decodes the file again with the restricted C unpickler instead: that
one refuses whatever is not plain data and words every error. Nothing here builds anything but plain data.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from typing import Any

from stepcli.snapshots.fastentries import CHUNK, FastEntryDecoder, _Dropped
from stepcli.snapshots.history import StackRef, StepRef, Trace, Truncated, Unsupported
from stepcli.snapshots.opcodes import (
    APPEND,
    APPENDS,
    BINGET,
    BININT,
    BININT1,
    BININT2,
    BINPUT,
    EMPTY_DICT,
    EMPTY_LIST,
    FRAME,
    LONG1,
    LONG_BINGET,
    LONG_BINPUT,
    MARK,
    MEMOIZE,
    NEWFALSE,
    NEWTRUE,
    NONE,
    SETITEMS,
    SHORT_BINUNICODE,
    STOP,
    _from_bytes,
    _unpack_d,
    _unpack_H,
    _unpack_I,
    _unpack_i,
    _unpack_Q,
)


class StreamDecoder(FastEntryDecoder):
    """One pickle, read from `read` (a function like a file's), its histories turned into `Trace`s as they go."""

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
