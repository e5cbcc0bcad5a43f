"""A trace read a piece at a time, for a command that writes as it reads (`stepcli merge`).

The file's text is read once and its events decoded ~256 KB of text at a time, as `table` slices it
(stepcli.traces.read.tracereader.slice_layout), so memory never holds a file's events as Python
objects (a crafted trace of tiny events took 51x its size that way). An event whose `ts` or `dur` is
not a finite number (`1e400`) is left out and counted, as `table` skips it, and so is any other
non-finite number: what is written from it never holds `Infinity` or `NaN`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import msgspec

from stepcli.errors import TraceError
from stepcli.traces.read.files import MERGED_MARKER as MARKER

_STRICT = msgspec.json.Decoder()
_LENIENT = msgspec.json.Decoder(float_hook=float)  # a number past float range (1e400) reads as inf
# Text decoded at once: its events as Python objects take up to ~25 times its size (tiny events),
# twice while rewritten. Smaller slices cost nothing measurable.
_SLICE_BYTES = 256 * 1024
_BATCH = 4096  # events decoded at once when the list could not be cut into slices


class _Unsliced(msgspec.Struct):
    """A trace document when its traceEvents list cannot be cut into slices: each event kept as its
    text only."""

    traceEvents: list[msgspec.Raw]
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    merged: Any = msgspec.field(default=msgspec.UNSET, name=MARKER)


class CutWrong(Exception):
    """A slice of the traceEvents list is no JSON list (a cut fell inside a string): read the file
    unsliced."""


class PiecewiseTrace:
    """One trace read for merging: its header, then its events a piece at a time (`pieces`), each
    event whose time is not a finite number left out and each other non-finite number dropped, and
    both counted. `sliced=False`: event by event (the file's list could not be cut: CutWrong)."""

    def __init__(self, path: str, sliced: bool = True) -> None:
        from stepcli.inputs import read_input
        from stepcli.traces.read.tracereader import _NotChunkable, slice_layout

        self.path = path
        self.data = read_input(path)
        self.dropped_events = self.dropped_values = 0
        self.layout: tuple[int, list[int]] | None = None
        if sliced:
            try:
                self.layout = slice_layout(self.data, chunk=_SLICE_BYTES)
            except _NotChunkable:
                self.layout = None  # (no traceEvents key: the unsliced read names the problem)
        self._raw: list[msgspec.Raw] = []
        self._last: list[Any] = []
        self.header = self._sliced_header() if self.layout is not None else self._unsliced_header()
        if MARKER in self.header:
            raise TraceError(path, "is already a merged trace (stepcli merge output)")

    def _decode(self, text: bytes | memoryview) -> tuple[Any, bool]:
        """The decoded text, and whether it may hold non-finite numbers (a number past float range
        was in it)."""
        try:
            return _STRICT.decode(text), False
        except msgspec.DecodeError as exc:
            if "out of range" not in str(exc):
                raise
            return _LENIENT.decode(text), True

    def _sliced_header(self) -> dict[str, Any]:
        """The document with only the events after the last cut (as table's decode_rest reads
        it)."""
        assert self.layout is not None
        start, splits = self.layout
        view = memoryview(self.data)
        try:
            document, lenient = self._decode(b"".join((view[:start], view[splits[-1] + 1 :])))
        except (msgspec.DecodeError, RecursionError):
            raise CutWrong from None
        if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
            raise CutWrong
        self._last = self._events(document.pop("traceEvents"), lenient)
        return document  # (its own non-finite numbers are never written: only the events are)

    def _unsliced_header(self) -> dict[str, Any]:
        try:
            try:
                document = msgspec.json.decode(self.data, type=_Unsliced)
            except msgspec.DecodeError as exc:
                if "out of range" not in str(exc):
                    raise
                document = msgspec.json.Decoder(_Unsliced, float_hook=float).decode(self.data)
        except msgspec.ValidationError:
            raise TraceError(self.path, "no traceEvents list: not a profiler trace") from None
        except (msgspec.DecodeError, RecursionError):
            raise TraceError(self.path, "not a JSON trace") from None
        self._raw = document.traceEvents
        header = {
            "distributedInfo": document.distributedInfo,
            "baseTimeNanoseconds": document.baseTimeNanoseconds,
        }
        return header | ({MARKER: document.merged} if document.merged is not msgspec.UNSET else {})

    def pieces(self) -> Iterator[list[dict[str, Any]]]:
        """The events (objects only, in file order), ~256 KB of text (_SLICE_BYTES) or _BATCH events
        at a time; CutWrong when a slice is no JSON list, TraceError when an event of an unsliced
        file is no JSON."""
        if self.layout is not None:
            start, splits = self.layout
            view = memoryview(self.data)
            previous = start
            for comma in splits:
                try:
                    piece, lenient = self._decode(b"".join((b"[", view[previous:comma], b"]")))
                except (msgspec.DecodeError, RecursionError):
                    raise CutWrong from None
                if not isinstance(piece, list):
                    raise CutWrong
                yield self._events(piece, lenient)
                previous = comma + 1
            yield self._last
            return
        for first in range(0, len(self._raw), _BATCH):
            text = b"".join((b"[", b",".join(self._raw[first : first + _BATCH]), b"]"))
            try:
                piece, lenient = self._decode(text)
            except (msgspec.DecodeError, RecursionError):
                raise TraceError(self.path, "not a JSON trace") from None
            yield self._events(piece, lenient)

    def _events(self, decoded: list[Any], lenient: bool) -> list[dict[str, Any]]:
        """The objects of a decoded piece. When it was decoded leniently (only then can a number be
        infinite), an event whose `ts` or `dur` is not finite is left out and any other non-finite
        number dropped, each counted."""
        if not lenient:
            return [event for event in decoded if isinstance(event, dict)]
        kept = []
        for event in decoded:
            if not isinstance(event, dict):
                continue
            if any(
                isinstance(event.get(key), float) and not math.isfinite(event[key])
                for key in ("ts", "dur")
            ):
                self.dropped_events += 1
                continue
            kept.append(self._scrub(event))
        return kept

    def _scrub(self, value: Any) -> Any:
        """`value` without its non-finite numbers, each counted."""
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if isinstance(item, float) and not math.isfinite(item):
                    self.dropped_values += 1
                    continue
                out[key] = self._scrub(item)
            return out
        if isinstance(value, list):
            kept = [
                item for item in value if not (isinstance(item, float) and not math.isfinite(item))
            ]
            self.dropped_values += len(value) - len(kept)
            return [self._scrub(item) for item in kept]
        return value
