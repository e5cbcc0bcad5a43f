"""A streaming decoder of the plain-data pickles torch writes for memory snapshots, in bounded
memory.

Python's unpicklers keep every memoized object (each history entry's dict, each frame dict) in their
memo until the load ends, so a snapshot decodes to about 8x its file. This decoder runs the subset
of pickle opcodes that plain data uses (protocols 2-5: dicts, lists, tuples, sets, strings, bytes,
numbers) and, once a list turns out to be a history (its first item is a dict with an "action"),
turns each of its entries into a row of `Trace` columns as it completes and keeps neither the
entry's dict nor its frames list; each frame dict becomes an interned `Frame` as its list is filled.
Only what later opcodes can still name (strings, the rest of the snapshot) stays in the memo. Most
entries never become dicts at all: a tight loop reads the common layouts (memo references for keys,
numbers, short strings, a frames list of memo references or of frame dicts of references) straight
from the bytes: stepcli.snapshots.fastentries, the base of `StreamDecoder`. The columns and the
builder that fills them: stepcli.snapshots.history.

Every object is checked against a snapshot's shape as it is built (stepcli.snapshots.shape): the
first that is not (a list of empty lists, a dict of unknown keys in a list, a string of megabytes, a
class or function) raises `NotSnapshot` or `Refused` and nothing more is built. A reference back to
an entry it let go raises `Unsupported`: the caller decodes the file again with `keep=True` (entries
kept in the memo, the same checks).
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_left
from typing import Any

from stepcli.snapshots import shape
from stepcli.snapshots.fastentries import CHUNK, FastEntryDecoder, _Dropped
from stepcli.snapshots.history import (
    ClassRefused,
    HistoryColumns,
    HistoryFrame,
    NotSnapshot,
    StackRef,
    StepRef,
    Truncated,
    Unsupported,
)
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
    """One pickle, read from `read` (a function like a file's), its histories turned into `Trace`s
    as they go."""

    # -- the opcode loop
    # ------------------------------------------------------------------------------------------
    def run(self) -> tuple[Any, dict[int, HistoryColumns]]:
        """The pickle's object and its histories; a value a conversion refused (KeyError,
        ValueError...) becomes NotSnapshot."""
        try:
            return self.load(), self.histories
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise NotSnapshot(f"{type(exc).__name__}: {exc}") from None

    def load(self) -> Any:
        """The pickle's object, histories emptied into `self.histories`; Truncated, Unsupported or
        the error of a conversion (KeyError, ValueError...: the caller decodes the file the other
        way for the exact words)."""
        try:
            return self._load()
        except (IndexError, struct.error) as exc:
            if self._eof:
                raise Truncated from None
            raise NotSnapshot(f"{type(exc).__name__}: {exc}") from None

    # an opcode loop: its state in locals, one branch per opcode
    def _load(self) -> Any:  # noqa: C901
        data, pos = self._fill(b"", 0, CHUNK)
        self._check_start(data)
        memo = self._memo
        containers = self._containers
        stack: list[Any] = []
        metastack: list[list[Any]] = []
        histories = self.histories
        unpack_I, unpack_H, unpack_i, unpack_Q = _unpack_I, _unpack_H, _unpack_i, _unpack_Q
        max_stack = shape.MAX_STACK
        while True:
            if len(data) - pos < 16:
                if len(stack) > max_stack:
                    raise _piled_up()
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
                if len(stack) > max_stack:
                    raise _piled_up()
                if (
                    not self._keep
                    and metastack
                    and metastack[-1]
                    and id(metastack[-1][-1]) in histories
                ):
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
                if len(metastack) >= shape.MAX_DEPTH or len(stack) > max_stack:
                    raise _piled_up()
                metastack.append(stack)
                stack = []
            elif op == SETITEMS:
                items = stack
                stack = metastack.pop()
                target = stack[-1]
                if type(target) is not dict:
                    raise NotSnapshot(f"SETITEMS on a {type(target).__name__}")
                shape.check_keys(items, target)
                self._count_held(shape.held(items))
                for i in range(0, len(items), 2):
                    target[items[i]] = items[i + 1]
            elif op == SHORT_BINUNICODE:
                if len(stack) > max_stack:
                    raise _piled_up()
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
                if len(stack) > max_stack:
                    raise _piled_up()
                stack.append([])
            elif op == APPENDS or op == APPEND:
                if op == APPENDS:
                    items = stack
                    stack = metastack.pop()
                else:
                    items = [stack.pop()]
                target = stack[-1]
                if type(target) is not list:
                    raise NotSnapshot(f"APPENDS to a {type(target).__name__}")
                if items:
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
                target = stack[-1]
                if type(target) is not dict:
                    raise NotSnapshot(f"SETITEM on a {type(target).__name__}")
                shape.check_keys([key], target)
                self._count_held(shape.held([key, value]))
                target[key] = value
            elif op == 0x85:  # TUPLE1
                shape.check_scalars(stack[-1:], "tuple")
                stack[-1] = (stack[-1],)
            elif op == 0x86:  # TUPLE2
                shape.check_scalars(stack[-2:], "tuple")
                stack[-2:] = [(stack[-2], stack[-1])]
            elif op == 0x87:  # TUPLE3
                shape.check_scalars(stack[-3:], "tuple")
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif op == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif op == 0x74:  # TUPLE
                items = stack
                stack = metastack.pop()
                shape.check_scalars(items, "tuple")
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
            # BINUNICODE, BINUNICODE8, SHORT_BINBYTES, BINBYTES(8)
            elif op in (0x58, 0x8D, 0x43, 0x42, 0x8E):
                width = 8 if op in (0x8D, 0x8E) else (1 if op == 0x43 else 4)
                n = (
                    data[pos]
                    if width == 1
                    else (unpack_I(data, pos)[0] if width == 4 else unpack_Q(data, pos)[0])
                )
                pos += width
                if n > shape.MAX_TEXT:
                    raise NotSnapshot(f"a string of {n} bytes (a snapshot's are names and paths)")
                if len(stack) > max_stack:
                    raise _piled_up()
                if len(data) - pos < n:
                    data, pos = self._fill(data, pos, n)
                    if len(data) < n:
                        raise Truncated
                raw = data[pos : pos + n]
                stack.append(
                    str(raw, "utf-8", "surrogatepass") if op in (0x58, 0x8D) else bytes(raw)
                )
                pos += n
            elif op == 0x8B:  # LONG4
                n = unpack_i(data, pos)[0]
                if n < 0 or n > 1 << 16:
                    raise NotSnapshot(f"an integer of {n} bytes")
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
                    raise NotSnapshot("ADDITEMS to a non-set")
                shape.check_scalars(items, "set")
                target.update(items)
            elif op == 0x91:  # FROZENSET
                items = stack
                stack = metastack.pop()
                shape.check_scalars(items, "set")
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
                    raise NotSnapshot(f"pickle protocol {data[pos]}")
                pos += 1
            elif op == STOP:
                if len(stack) != 1 or metastack:
                    raise NotSnapshot("a pickle that ends with more than its object on its stack")
                return stack[0]
            elif op == 0x63:  # GLOBAL: protocols 2-3 build sets by naming `set`
                if len(data) - pos < 512:
                    data, pos = self._fill(data, pos, 512)
                first = data.find(b"\n", pos, pos + 256)
                end = data.find(b"\n", first + 1, first + 257) if first >= 0 else -1
                if end < 0:
                    raise NotSnapshot("a GLOBAL name of over 256 bytes")
                module, name = str(data[pos:end], "utf-8", "replace").split("\n")
                stack.append(_plain_global(module, name))
                pos = end + 1
            elif op == 0x93:  # STACK_GLOBAL
                name = stack.pop()
                stack[-1] = _plain_global(str(stack[-1]), str(name))
            elif op == 0x52:  # REDUCE: set(list) or frozenset(list), what a set is in protocols 2-3
                args = stack.pop()
                if type(args) is not tuple or len(args) > 1 or (args and type(args[0]) is not list):
                    raise NotSnapshot("REDUCE with other arguments than a list")
                shape.check_scalars(args[0] if args else (), "set")
                stack[-1] = stack[-1](*args)
            elif op == 0x50 or op == 0x51:  # PERSID, BINPERSID
                raise ClassRefused("a persistent object")
            else:
                raise NotSnapshot(f"opcode {op:#x}, which plain data of protocols 2-5 never uses")

    def _check_start(self, data: bytes) -> None:
        """A snapshot's pickle starts with a protocol of 2 or more and its dict (or a GLOBAL:
        refused by name)."""
        at = 0
        if data[:1] == b"\x80":
            at = 2
            if data[at : at + 1] == b"\x95":  # FRAME
                at += 9
        first = data[at : at + 1]
        if first == b"}" or (first == b"c" and _GLOBAL.match(data, at)):
            return
        if at == 0:
            raise NotSnapshot(
                f"not a pickle of protocol 2-5 (it starts with {data[:8]!r})", verbatim=True
            )
        raise NotSnapshot(_NOT_A_SNAPSHOT, verbatim=True)

    # -- histories
    # --------------------------------------------------------------------------------------------
    def _append(self, target: list[Any], items: list[Any]) -> None:
        trace = self.histories.get(id(target))
        if trace is None and not target:
            first = items[0]
            if type(first) is dict and "action" in first:
                trace = self.histories[id(target)] = self.builder.new_trace()
                self._history_lists.append(target)
        if trace is None:
            self._append_plain(target, items)
            return
        for raw in items:
            self._add_entry(trace, raw)

    def _append_plain(self, target: list[Any], items: list[Any]) -> None:
        """Items of a list that is no history: of one kind, the snapshot's (shape.kind); frame dicts
        become Frames, annotations are let go (nothing reads them)."""
        want = shape.kind(target[0] if target else items[0])
        if want == "frame":
            self._add_frames(target, items)
            return
        for item in items:
            if shape.kind(item) != want:
                raise NotSnapshot(f"a list of both {want}s and {shape.kind(item)}s")
        if want == "annotation":
            for item in items:
                self._forget(item)
            return
        if want == "list":
            self._nested_lists += len(items)
            if self._nested_lists > shape.MAX_NESTED_LISTS:
                raise shape.too_many(shape.MAX_NESTED_LISTS, "lists held in lists")
        elif want == "scalar":
            if len(target) + len(items) > shape.MAX_SCALARS:
                raise shape.too_many(shape.MAX_SCALARS, "strings or numbers in one list")
        elif want in ("segment", "block"):
            for item in items:
                if id(item) in self._records:
                    raise NotSnapshot(f"the same {want} twice")
                self._records.add(id(item))
        elif want == "event":
            raise NotSnapshot("a history event in a list that holds other things")
        target.extend(items)

    def _count_held(self, count: int) -> None:
        if count:
            self._held += count
            if self._held > shape.MAX_HELD:
                raise shape.too_many(shape.MAX_HELD, "dicts, lists or sets held in dicts")

    def _add_frames(self, target: list[Any], items: list[Any]) -> None:
        """A frames list's items, each an interned Frame; a frame dict leaves the memo (8 bytes in
        its place)."""
        memo, containers = self._memo, self._containers
        indexes, values = self._frame_indexes, self._frame_values
        for at, item in enumerate(items):
            if type(item) is HistoryFrame:
                continue
            if type(item) is not dict or shape.kind(item) != "frame":
                raise NotSnapshot("a frames list of other things than frames")
            try:
                made = items[at] = self.builder.frame(item)
            except (KeyError, TypeError, ValueError) as exc:
                raise NotSnapshot(f"a frame: {exc}") from None
            index = containers.get(id(item))
            if index is not None and not self._keep and (not indexes or index > indexes[-1]):
                del containers[id(item)]
                del memo[index]  # named again: _dropped_list finds its Frame
                indexes.append(index)
                values.append(made)
        if len(target) + len(items) > shape.MAX_FRAMES:
            raise shape.too_many(shape.MAX_FRAMES, "frames in one stack")
        target.extend(items)

    def _forget(self, item: Any) -> None:
        """Let go of a dict nothing reads (an annotation); named again: Unsupported (decoded again,
        kept)."""
        index = self._containers.pop(id(item), None)
        if index is not None and not self._keep:
            del self._memo[index]
        elif index is not None:
            self._containers[id(item)] = index

    def _add_entry(self, trace: HistoryColumns, raw: Any) -> None:
        """A history entry built the slow way: a row, and its dict and frames list out of the
        memo."""
        if type(raw) is not dict:
            raise Unsupported("a history entry that is not a dict")
        self.builder.add(trace, raw)
        if self._keep:
            return
        memo, containers = self._memo, self._containers
        index = containers.pop(id(raw), None)
        if index is None:
            return
        del memo[index]  # naming it again: Unsupported
        frames = raw.get("frames")
        at = containers.get(id(frames))
        if (
            type(frames) is list
            and at is not None
            and at > index
            and self._remember(at, trace.stacks[-1])
        ):
            del containers[id(frames)]  # made inside this entry: only its stack is kept
            del memo[at]

    def _remember(self, index: int, stack: int) -> bool:
        """Keep the stack of a frames list memoized at `index` in place of the list; False: out of
        order."""
        if self._list_indexes and index <= self._list_indexes[-1]:
            return False
        self._list_indexes.append(index)
        self._list_stacks.append(stack)
        return True

    def _dropped_list(self, index: int) -> StackRef | StepRef | HistoryFrame:
        """A memo reference to something dropped: a frames list's stack, a string's step, a frame;
        else Unsupported."""
        at = bisect_left(self._list_indexes, index)
        if at < len(self._list_indexes) and self._list_indexes[at] == index:
            return StackRef(self._list_stacks[at])
        at = bisect_left(self._string_indexes, index)
        if at < len(self._string_indexes) and self._string_indexes[at] == index:
            return StepRef(self._string_steps[at])
        frame = self._frame_at(index)
        if frame is not None:
            return frame
        raise Unsupported(f"a reference to memo {index}, an entry this decoder let go")


_GLOBAL = re.compile(rb"c[A-Za-z_][\w.]{0,200}\n[A-Za-z_][\w.]{0,200}\n")  # GLOBAL module\nname\n
_NOT_A_SNAPSHOT = (
    "a pickle, but not a CUDA memory snapshot (torch.cuda.memory._snapshot() has 'segments')"
)


def _piled_up() -> NotSnapshot:
    return NotSnapshot(
        f"nested too deeply or piled up: over {shape.MAX_STACK} objects or {shape.MAX_DEPTH} marks "
        f"at once on the "
        "pickle's stack (Python's pickler puts 2,000 at most)"
    )


def _plain_global(module: str, name: str) -> type:
    """`set` or `frozenset` (what protocols 2-3 name to build a set); any other name: Refused, never
    imported."""
    if module in ("builtins", "__builtin__") and name in ("set", "frozenset"):
        return set if name == "set" else frozenset
    raise ClassRefused(f"{module}.{name}"[:200])
