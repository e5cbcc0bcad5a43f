"""The trace document around its events, and the slow path for an odd one: header values checked one
by one (a bad value is ignored, never fatal), a decode error said in words, and the lenient decode
of valid JSON whose fields have unexpected types (coerced where they can be, the event skipped where
not). The fast typed decode is stepcli.traces.read.tracereader's.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

import msgspec

from stepcli.errors import TraceError
from stepcli.runfolder.layout import CLOCK_KEY, CPU_TIME_KEY, INCOMPLETE_STEP_KEY
from stepcli.traces.read.events import InputTypes, Meta, ShapeArgs, ShapedEvent
from stepcli.traces.read.jsonvalues import as_id, as_text, as_time, is_int64

BARE_CONSTANT = re.compile(rb"-?(?:NaN|Infinity)")
MAX_RANK = 2**31 - 1
MAX_STEP = 2**63 - 1


def clock_id(value: Any) -> str | None:
    """A `stepcli_clock` value, when it is a short string; else None (aligned by collectives, never
    fatal)."""
    return value if isinstance(value, str) and 0 < len(value) <= 300 else None


def cpu_time_of(value: Any) -> dict[int, tuple[float, float]] | None:
    """A `stepcli_cpu_ms` value ({"12": [3.1, 0.4], ...}) as step -> (ms on a CPU, ms waiting for
    one); None when it is anything else (never fatal)."""
    if not isinstance(value, dict) or not value or len(value) > 1_000_000:
        return None
    times: dict[int, tuple[float, float]] = {}
    for key, pair in value.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 19):
            return None
        if not (isinstance(pair, list) and len(pair) == 2):
            return None
        if any(
            isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms < 1e9
            for ms in pair
        ):
            return None
        times[int(key)] = (float(pair[0]), float(pair[1]))
    return times


def device_name(properties: Any) -> str | None:
    """The `name` of the first entry of Kineto's `deviceProperties`, when it is a string; else
    None."""
    if isinstance(properties, list) and properties and isinstance(properties[0], dict):
        name = properties[0].get("name")
        return name[:200] if isinstance(name, str) and name else None
    return None


def step_number(value: Any) -> int | None:
    """The step N of a `stepcli_incomplete_step` value ("N", as add_metadata writes it, or N); else
    None."""
    if (
        isinstance(value, str)
        and value.strip().isascii()
        and value.strip().isdecimal()
        and len(value.strip()) <= 18
    ):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP:
        return value
    return None


def world_size_number(info: Any) -> int | None:
    """`distributedInfo.world_size` when it is an integer from 1 to 2**31, else None."""
    size = info.get("world_size") if isinstance(info, dict) else getattr(info, "world_size", None)
    if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_RANK + 1:
        return size
    return None


def rank_number(info: Any) -> int | None:
    """`distributedInfo.rank` when it is an integer from 0 to 2**31-1, else None (the file name
    decides)."""
    rank = info.get("rank") if isinstance(info, dict) else getattr(info, "rank", None)
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= MAX_RANK:
        return rank
    return None


def as_utf8(data: bytes | bytearray) -> bytes | None:
    """The text as plain UTF-8 when it is JSON in another encoding a JSON reader accepts (UTF-8 with
    a byte order mark, as Windows editors save it; UTF-16 or UTF-32, as Python's json detects them);
    None when it is plain UTF-8 already or does not decode. (Only a failed decode asks: `table
    --json` imports no `json`.)"""
    import json

    encoding = json.detect_encoding(bytes(data[:4]))
    if encoding == "utf-8":
        return None
    if encoding == "utf-8-sig":
        return bytes(data[3:])
    try:
        return bytes(data).decode(encoding).encode("utf-8", "surrogatepass")
    except UnicodeError:
        return None


def first_invalid_utf8(data: bytes | bytearray, chunk: int = 1 << 20) -> int | None:
    """The offset of the first byte that is not UTF-8, or None; decoded in slices, so memory stays
    bounded."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for start in range(0, len(data), chunk):
        pending = len(decoder.getstate()[0])  # bytes of a character split across the slices
        try:
            decoder.decode(view[start : start + chunk], final=start + chunk >= len(data))
        except UnicodeDecodeError as exc:
            return max(0, start - pending + exc.start)
    return None


def not_utf8(data: bytes | bytearray, before: int | None = None) -> str | None:
    """ "not UTF-8 ..." when the text holds a byte that is not UTF-8 (at or before `before`, where
    the decoder stopped), else None. Decided from the bytes, not from the decoder's message: msgspec
    0.23 raises a DecodeError saying "Invalid UTF-8 encoded string" where older releases raised
    UnicodeDecodeError."""
    bad = first_invalid_utf8(data)
    if bad is None or (before is not None and bad > before + 4):
        return None
    return f"not UTF-8 text (a string holds the invalid byte 0x{bytes(data[bad : bad + 1]).hex()})"


def describe_decode_error(data: bytes | bytearray, exc: msgspec.DecodeError) -> str:
    message = str(exc)
    if "truncated" in message:
        return (
            "truncated JSON (the file ends in the middle of the trace; was it still being written?)"
        )
    if data.lstrip()[:1] not in (b"{", b"["):
        return "not JSON (is this a profiler trace?)"
    where = re.search(r"\(byte (\d+)\)", message)
    encoding = not_utf8(data, int(where.group(1)) if where else None)
    if encoding is not None:
        return encoding
    if where:
        position = int(where.group(1))
        # the decoder stops after the sign
        if position > 0 and data[position - 1 : position] == b"-":
            position -= 1
        token = BARE_CONSTANT.match(data, position)
        if token:
            return (
                f"invalid JSON: bare {token.group().decode()} at byte {position} is not JSON "
                f"(write null or a number)"
            )
    return f"invalid JSON: {message}"


def _decode_huge_integers(path: str, data: bytes | bytearray, exc: msgspec.DecodeError) -> Any:
    """The document through Python's json, for an integer of thousands of digits (more than Python
    converts, so msgspec refuses it): such an integer reads as a float (inf), an unusable time
    skipped and counted like 1e400. Rare, so the slow reader is fine; a bare NaN or Infinity stays
    invalid JSON."""
    import json

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    def integer(text: str) -> int | float:
        return int(text) if len(text) <= 4000 else float(text)

    try:
        return json.loads(bytes(data), parse_int=integer, parse_constant=refuse)
    except (ValueError, RecursionError):
        raise TraceError(path, describe_decode_error(data, exc)) from None


def decode_lenient(path: str, data: bytes | bytearray, shapes: bool) -> tuple[Meta, list[Any], int]:
    """Slow path for valid JSON whose fields have unexpected types: check it is a trace, coerce what
    can be; its header, its events and the count of every event in the file."""
    # float_hook: a number out of float range (1e400) becomes inf, skipped below, instead of failing
    # the decode.
    try:
        document = msgspec.json.Decoder(float_hook=float).decode(data)
    except msgspec.DecodeError as exc:  # malformed after the point where the typed decode gave up
        if "Integer value out of range" not in str(exc):
            raise TraceError(path, describe_decode_error(data, exc)) from None
        document = _decode_huge_integers(path, data, exc)
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise TraceError(path, "not a profiler trace (no traceEvents list)")
    rank = rank_number(document.get("distributedInfo"))
    events: list[Any] = []
    for raw in document["traceEvents"]:
        if not isinstance(raw, dict):
            continue
        event = ShapedEvent(
            name=as_text(raw.get("name", "")),
            cat=as_text(raw.get("cat", "")),
            ph=as_text(raw.get("ph", "X")),
            pid=as_id(raw.get("pid", 0)),
            tid=as_id(raw.get("tid", 0)),
            ts=as_time(raw.get("ts")),
            dur=as_time(raw.get("dur")),
        )
        args = raw.get("args")
        if isinstance(args, dict):
            link: Any = args.get("correlation")
            flops: Any = args.get("flops")
            external: Any = args.get("External id")
            types: Any = args.get("Input type")
            event.args = ShapeArgs(
                correlation=link if is_int64(link) else -1,
                flops=flops if is_int64(flops) and flops >= 0 else -1,
                external=external if is_int64(external) else -1,
                types=InputTypes(types[0]) if isinstance(types, list) and types else None,
            )
            if "Process Group Name" in args:  # (group_of checks the values)
                event.args.pg_name = args["Process Group Name"]
                event.args.pg_ranks = args.get("Process Group Ranks")
                event.args.seq = args.get("Seq")
            if shapes and "Input Dims" in args:
                event.args.dims = msgspec.Raw(msgspec.json.encode(args["Input Dims"]))
        events.append(event)
    meta = Meta(
        rank,
        step_number(document.get(INCOMPLETE_STEP_KEY)),
        device_name(document.get("deviceProperties")),
        clock_id(document.get(CLOCK_KEY)),
        cpu_time_of(document.get(CPU_TIME_KEY)),
        world_size_number(document.get("distributedInfo")),
    )
    return meta, events, len(document["traceEvents"])
