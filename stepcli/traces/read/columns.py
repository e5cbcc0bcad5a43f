"""Decoded trace events into typed columns, one decoded slice at a time, with the reader's rules
(stepcli.traces.read.tracereader).

The per-event work is done by C loops (`map` over attribute getters and dict lookups, numpy masks),
never by a Python statement per event: the same filter as `_Keeper.add` (complete events of kept
categories, utility names dropped, unusable times and step numbers skipped and counted), kept as
arrays instead of objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from stepcli.traces.read.events import DecodedArgs, group_of, int64_or_none, transfer_args
from stepcli.traces.read.files import rank_from_name
from stepcli.traces.read.names import gemm_op, op_dtype, undtyped_gemm
from stepcli.traces.read.tracereader import (
    FILTERED_NAMES,
    KEPT_CATEGORIES,
    MAX_TIME_US,
    Decode,
    _Keeper,
    _read,
    _usable_name,
)
from stepcli.traces.read.typedcolumns import DEVICE, OTHER_CPU, PARAM_COMMS, Columns, kind_of

_NAME, _CAT, _PH, _PID, _TID, _TS, _DUR = (
    attrgetter(f) for f in ("name", "cat", "ph", "pid", "tid", "ts", "dur")
)
_ARGS = attrgetter("args")
_CORRELATION = attrgetter("correlation")
_BYTES = attrgetter("bytes")
_COLLECTIVE = attrgetter("collective")
_FLOPS = attrgetter("flops")
_NO_ARGS = DecodedArgs()  # what an event without args reads as: every field its default (-1, "")


def _args_of(events: Sequence[Any]) -> list[Any]:
    """The events' args, an event without any (a user annotation's, often) reading as _NO_ARGS."""
    args = list(map(_ARGS, events))
    if None in args:
        args = [_NO_ARGS if a is None else a for a in args]
    return args


def _arg_ints(getter: Any, args: Sequence[Any]) -> np.ndarray:
    """An integer field of the events' args (_args_of), in C; a value past 64 bits (a hostile
    file's) reads as none, -1, as a missing one does."""
    try:
        return np.fromiter(map(getter, args), np.int64, len(args))
    except OverflowError:
        return np.fromiter((int64_or_none(getter(a)) for a in args), np.int64, len(args))


def _subset(items: Sequence[Any], where: np.ndarray) -> Sequence[Any]:
    """The items at the sorted positions `where` (all of them when nothing is left out), gathered in
    C."""
    if len(where) == len(items):
        return items
    if len(where) == 1:
        return [items[int(where[0])]]
    return itemgetter(*where.tolist())(items) if len(where) else []


class _CodeTable(dict[Any, int]):
    """value -> code, a new value getting the next code at first sight (so one C-level lookup per
    event)."""

    def __missing__(self, value: Any) -> int:
        code = self[value] = len(self)
        return code


class _Codes:
    """Strings (or ids) to small integers, assigned in order of first sight."""

    def __init__(self) -> None:
        self.codes: dict[Any, int] = _CodeTable()

    def encode(self, values: Iterable[Any], count: int | None = None) -> np.ndarray:
        """The codes of `values` (`count` of them: an iterator needs it; a sequence has its
        length)."""
        if count is None:
            assert isinstance(values, Sequence)
            count = len(values)
        return np.fromiter(map(self.codes.__getitem__, values), np.int32, count)


_MAX_CATEGORIES = 256
_GEMM_OP, _UNDTYPED_GEMM = 1, 2  # GEMM roles of a name (ColumnKeeper._gemm_roles)


class _Kinds(dict[Any, int]):
    """Category -> column kind, or -1 for a category not kept; filled at first sight, so the
    per-event lookup is one C-level dict access (no default argument to pass)."""

    def __missing__(self, category: Any) -> int:
        kind = kind_of(category) if category in KEPT_CATEGORIES else -1
        # a trace with a new category per event does not fill it
        if kind >= 0 or len(self) < _MAX_CATEGORIES:
            self[category] = kind
        return kind


class ColumnKeeper(_Keeper):
    """The columns of the kept events of every slice added, in file order."""

    def __init__(self, shapes: bool) -> None:
        super().__init__(shapes)
        self._name_codes = _Codes()
        self._id_codes = _Codes()
        self._shape_codes = _Codes()
        self._shape_codes.codes[""] = 0
        self._category = _Kinds()
        # Per name code: 1 kept, 0 dropped silently (utility names), -1 skipped and counted
        # (unusable step number).
        self._name_rule = np.zeros(0, np.int8)
        # Per name code: _GEMM_OP a GEMM operator, _UNDTYPED_GEMM a GEMM kernel whose name says no
        # dtype, else 0.
        self._name_gemm = np.zeros(0, np.int8)
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._rows = 0  # events kept so far
        self._transfers: dict[int, tuple[int, str, int, int, int, str]] = {}
        self._flops: dict[int, int] = {}
        self._groups: dict[int, tuple[str, int, str]] = {}
        self._gemm_ops: dict[int, tuple[int, str]] = {}
        self._gemm_kernels: dict[int, int] = {}
        # the names of the codes _name_gemm covers, in code order
        self._name_codes_list: list[str] = []

    def add(self, decoded: list[Any]) -> None:
        count = len(decoded)
        self.count += count
        if not count:
            return
        kind = np.fromiter(map(self._category.__getitem__, map(_CAT, decoded)), np.int8, count)
        candidate = np.nonzero(kind >= 0)[0]
        chosen = _subset(decoded, candidate)
        phases = list(map(_PH, chosen))
        # (rare: kept categories are complete events; one C loop checks it)
        if phases.count("X") != len(phases):
            is_x = np.fromiter(map("X".__eq__, phases), bool, len(phases))
            candidate = candidate[is_x]
            chosen = _subset(chosen, np.nonzero(is_x)[0])
        if not candidate.size:
            return
        kind = kind[candidate]
        names = self._name_codes.encode(map(_NAME, chosen), len(chosen))
        rule = self._rules(len(self._name_codes.codes))[names]
        ts = np.fromiter(map(_TS, chosen), np.float64, len(chosen))
        dur = np.fromiter(map(_DUR, chosen), np.float64, len(chosen))
        # NaN: False
        usable_time = (ts >= -MAX_TIME_US) & (ts <= MAX_TIME_US) & (dur >= 0) & (dur <= MAX_TIME_US)
        listed = rule != 0
        keep = listed & usable_time & (rule > 0)
        self.skipped += int(np.count_nonzero(listed & ~keep))
        where = np.nonzero(keep)[0]
        if not where.size:
            return
        kept = _subset(chosen, where)
        pid = self._id_codes.encode(map(_PID, kept), len(kept))
        tid = self._id_codes.encode(map(_TID, kept), len(kept))
        if self.shapes:
            shape = self._shape_codes.encode([self._shape_of(e) for e in kept])
        else:
            shape = np.zeros(len(kept), np.int32)
        args = _args_of(kept)
        corr = _arg_ints(_CORRELATION, args)
        self._parts.append(
            (names[where], kind[where], pid, tid, ts[where], dur[where], shape, corr)
        )
        self._take_transfers(args, kind[where])
        self._take_flops(args, kind[where])
        self._take_groups(kept, names[where], kind[where])
        self._take_gemms(kept, names[where], kind[where])
        self._rows += len(kept)

    def _take_gemms(self, kept: Sequence[Any], names: np.ndarray, kind: np.ndarray) -> None:
        """The External id and dtype of the GEMM operators, and the External id of the GEMM kernels
        whose names say no dtype (stepcli.traces.analyses.flops.op_dtype): one array lookup per
        slice, Python only for those events."""
        role = self._gemm_roles(len(self._name_codes.codes))[names]
        found = np.nonzero(role)[0]
        if not found.size:
            return
        role, device = role[found].tolist(), (kind[found] >= DEVICE).tolist()
        for at, is_op, on_device in zip(found.tolist(), role, device):
            args = kept[at].args
            if args is None or args.external < 0:
                continue
            if is_op == _GEMM_OP and not on_device:
                types = getattr(args, "types", None)
                dtype = op_dtype(
                    self._name_codes_list[names[at]], types.first if types is not None else None
                )
                if dtype is not None:
                    self._gemm_ops[self._rows + at] = (args.external, dtype)
            elif is_op == _UNDTYPED_GEMM and on_device:
                self._gemm_kernels[self._rows + at] = args.external

    def _gemm_roles(self, size: int) -> np.ndarray:
        """The per-name GEMM role array (`_name_gemm`), extended to the names seen so far."""
        have = len(self._name_gemm)
        if have < size:
            new = list(self._name_codes.codes)[have:size]
            self._name_codes_list.extend(new)
            roles = [
                _GEMM_OP if gemm_op(n) else (_UNDTYPED_GEMM if undtyped_gemm(n) else 0) for n in new
            ]
            self._name_gemm = np.concatenate([self._name_gemm, np.array(roles, np.int8)])
        return self._name_gemm

    def _take_flops(self, args: Sequence[Any], kind: np.ndarray) -> None:
        """The FLOPs torch wrote into the args of operators (`with_flops=True`), of the events that
        have them."""
        host = np.nonzero(kind == OTHER_CPU)[0]
        if not host.size:
            return
        flops = _arg_ints(_FLOPS, _subset(args, host))
        counted = np.nonzero(flops > 0)[0]
        if counted.size:
            self._flops.update(zip((host[counted] + self._rows).tolist(), flops[counted].tolist()))

    def _take_transfers(self, args: Sequence[Any], kind: np.ndarray) -> None:
        """Copy sizes and collective metadata of the device events
        (stepcli.traces.read.tracereader.transfer_args)."""
        device = np.nonzero(kind >= DEVICE)[0]
        if not device.size:
            return
        of_device = _subset(args, device)
        sizes = _arg_ints(_BYTES, of_device)
        named = np.fromiter(map(bool, map(_COLLECTIVE, of_device)), bool, len(of_device))
        for at in np.nonzero((sizes >= 0) | named)[0].tolist():
            found = transfer_args(of_device[at])
            if found is not None:
                self._transfers[self._rows + int(device[at])] = found

    def _take_groups(self, kept: Sequence[Any], names: np.ndarray, kind: np.ndarray) -> None:
        """The process groups of the host `record_param_comms` events
        (stepcli.traces.read.tracereader.group_of): one name lookup per slice when the trace has
        none."""
        code = self._name_codes.codes.get(PARAM_COMMS)
        if code is None:
            return
        for at in np.nonzero((names == code) & (kind < DEVICE))[0].tolist():
            found = group_of(_ARGS(kept[at]))
            if found is not None:
                self._groups[self._rows + at] = found

    def _rules(self, size: int) -> np.ndarray:
        """The per-name rule array, extended to the names seen so far."""
        have = len(self._name_rule)
        if have < size:
            new = list(self._name_codes.codes)[have:size]
            rules = [
                0 if name in FILTERED_NAMES else (1 if _usable_name(name) else -1) for name in new
            ]
            self._name_rule = np.concatenate([self._name_rule, np.array(rules, np.int8)])
        return self._name_rule

    def _shape_of(self, event: Any) -> str:
        args = _ARGS(event)
        if args is None or not args.dims:
            return ""
        raw = bytes(args.dims)
        key = self._shape_keys.get(raw)
        if key is None:
            key = self._shape_keys[raw] = " ".join(raw.decode("utf-8", "replace").split())
        return key

    def absorb(self, other: ColumnKeeper) -> None:
        """Append what another keeper (of the events after this one's) kept, counted and skipped."""
        self.absorb_columns(other.columns(), other.count, other.skipped)

    def absorb_columns(self, columns: Columns, count: int, skipped: int) -> None:
        """Append the columns another keeper kept of the events after this one's (`count` read,
        `skipped`)."""
        self.count += count
        self.skipped += skipped
        if len(columns):
            self._parts.append(_encode_again(self, columns))
            self._transfers.update({self._rows + i: v for i, v in columns.transfers.items()})
            self._flops.update({self._rows + i: v for i, v in columns.flops.items()})
            self._groups.update({self._rows + i: v for i, v in columns.groups.items()})
            self._gemm_ops.update({self._rows + i: v for i, v in columns.gemm_ops.items()})
            self._gemm_kernels.update({self._rows + i: v for i, v in columns.gemm_kernels.items()})
            self._rows += len(columns)

    def columns(self) -> Columns:
        parts = self._parts
        types = (np.int32, np.int8, np.int32, np.int32, np.float64, np.float64, np.int32, np.int64)
        arrays = [
            np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, t)
            for i, t in enumerate(types)
        ]
        name, kind, pid, tid, ts, dur, shape, corr = arrays
        return Columns(
            name=name,
            kind=kind,
            pid=pid,
            tid=tid,
            ts=ts,
            dur=dur,
            shape=shape,
            corr=corr,
            transfers=self._transfers,
            flops=self._flops,
            groups=self._groups,
            gemm_ops=self._gemm_ops,
            gemm_kernels=self._gemm_kernels,
            names=list(self._name_codes.codes),
            ids=list(self._id_codes.codes),
            shapes=list(self._shape_codes.codes),
        )


def _encode_again(keeper: ColumnKeeper, columns: Columns) -> tuple[np.ndarray, ...]:
    """Another keeper's columns in this keeper's codes."""
    name_map = keeper._name_codes.encode(columns.names)
    keeper._rules(len(keeper._name_codes.codes))
    id_map = keeper._id_codes.encode(columns.ids) if columns.ids else np.zeros(1, np.int32)
    shape_map = keeper._shape_codes.encode(columns.shapes)
    return (
        name_map[columns.name],
        columns.kind,
        id_map[columns.pid],
        id_map[columns.tid],
        columns.ts,
        columns.dur,
        shape_map[columns.shape],
        columns.corr,
    )


@dataclass
class ColumnTrace:
    """One trace file read straight into typed columns (stepcli.traces.analyses.arrays), without an
    object per event."""

    path: str
    rank: int | None
    columns: Columns
    event_count: int
    skipped_events: int = 0
    incomplete_step: int | None = None
    device_name: str | None = None  # the trace's first GPU (deviceProperties)
    # the clock its times come from (host and boot), when stepcli recorded it
    clock: str | None = None
    # step -> (ms on a CPU, ms waiting for one) of the steps' thread, when stepcli recorded it
    cpu_time: dict[int, tuple[float, float]] | None = None
    world_size: int | None = None  # distributedInfo.world_size


def load_columns(path: str, *, shapes: bool = False, decode: Decode | None = None) -> ColumnTrace:
    """Read one trace file into columns: the same events, checks and errors as load_trace (`decode`:
    how its data is decoded, e.g. stepcli.traces.read.twoprocess.decode_in_two)."""
    meta, keeper = _read(path, shapes, ColumnKeeper, decode)
    assert isinstance(keeper, ColumnKeeper)
    rank = meta.rank if meta.rank is not None else rank_from_name(path)
    return ColumnTrace(
        path,
        rank,
        keeper.columns(),
        keeper.count,
        keeper.skipped,
        meta.incomplete_step,
        meta.device,
        meta.clock,
        meta.cpu_time,
        meta.world_size,
    )
