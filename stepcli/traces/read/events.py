"""The typed structs trace events are decoded into (msgspec): only the fields stepcli reads, so the
decoder skips the rest of every event, and of its args, without building it. `Event` is what the
analyses see; the Decoded and Shaped variants are the reader's (a missing time reads as NaN so the
event is skipped and counted; shapes only when asked for); `Header` and `Meta` are the document
around the events (stepcli.traces.read.tracereader).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import msgspec

from stepcli.runfolder.layout import CLOCK_KEY, CPU_TIME_KEY, INCOMPLETE_STEP_KEY
from stepcli.traces.read.jsonvalues import is_int64


class Event(msgspec.Struct, gc=False):
    """One trace event with only the fields stepcli reads; times in microseconds, as in the Chrome
    trace format.

    `shape` is not a trace field: the loader fills it from `args["Input Dims"]` when shapes are
    asked for. `args` holds only what stepcli reads of the event's args (EventArgs: the correlation
    id linking a launch call to the device work it queued, a copy's size, a collective's metadata),
    or None.
    """

    name: str = ""
    cat: str = ""
    ph: str = "X"
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: Any = None  # EventArgs or None
    shape: str = msgspec.field(default="", name="__stepcli_shape__")


class EventArgs(msgspec.Struct, gc=False):
    """The few `args` fields stepcli reads (decoding more of args costs time on every event)."""

    correlation: int = -1
    # a copy's size, and a collective's (NCCL metadata torch records):
    # stepcli.traces.analyses.collectivestats reads them
    bytes: int = -1
    collective: str = msgspec.field(default="", name="Collective name")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    group_size: int = msgspec.field(default=-1, name="Group size")
    dtype: str = ""
    # an operator's FLOPs, as torch writes them with `with_flops=True` where it exports them
    # (stepcli.traces.analyses.flops)
    flops: int = -1
    # a collective's process group, on `record_param_comms` (torch's ParamCommsUtils):
    # stepcli.traces.analyses.arrivals matches collectives across ranks by them. Any: checked where
    # read (group_of), an odd value is never fatal.
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    # the id torch gives an operator and the device work it launches (a kernel's is its innermost
    # operator's)
    external: int = msgspec.field(default=-1, name="External id")


def transfer_args(args: EventArgs | None) -> tuple[int, str, int, int, int, str] | None:
    """(bytes, collective, in nelems, out nelems, group size, dtype) of a device event, or None
    without any."""
    if args is None or (args.bytes < 0 and not args.collective):
        return None
    return (
        _count(args.bytes),
        args.collective,
        _count(args.in_nelems),
        _count(args.out_nelems),
        _count(args.group_size),
        args.dtype,
    )


def int64_or_none(value: int) -> int:
    """An id or count read from args, or -1 (none) for one outside 64 bits (a hostile file's:
    numpy's arrays of them would overflow)."""
    return value if is_int64(value) else -1


def _count(value: int) -> int:
    """A size or count as read, or -1 (none) for one no trace can hold (negative, or past 2^62: a
    hostile file's, which would overflow the arrays it is summed in)."""
    return value if 0 <= value < 1 << 62 else -1


def group_of(args: EventArgs | None) -> tuple[str, int, str] | None:
    """(process group name, sequence number or -1, member ranks as written) of a collective, or None
    without a process group name."""
    if args is None or not isinstance(args.pg_name, (str, int)) or isinstance(args.pg_name, bool):
        return None
    name = str(args.pg_name)
    if not name:
        return None
    seq = (
        args.seq
        if isinstance(args.seq, int) and not isinstance(args.seq, bool) and args.seq >= 0
        else -1
    )
    ranks = args.pg_ranks
    if isinstance(ranks, list):
        ranks = "[" + ", ".join(str(r) for r in ranks) + "]"
    return (name, seq, ranks if isinstance(ranks, str) else "")


class InputTypes(msgspec.Struct, array_like=True, gc=False):
    """An operator's `Input type` list (record_shapes), of which only the first entry is decoded:
    the rest is skipped by the decoder, so reading it costs one small struct per operator (the dtype
    of a GEMM whose kernel names none, stepcli.traces.analyses.flops.op_dtype). Any: an odd value is
    checked where read, never fatal."""

    first: Any = ""


class DecodedArgs(EventArgs, gc=False):
    """What the reader decodes of args: EventArgs and the first `Input type`."""

    types: InputTypes | None = msgspec.field(default=None, name="Input type")


class DecodedEvent(Event, gc=False):
    """Decoding-only variant: a missing `ts` or `dur` reads as NaN, so the event is skipped and
    counted."""

    ts: float = math.nan
    dur: float = math.nan
    args: DecodedArgs | None = None


class ShapeArgs(DecodedArgs, gc=False):
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")


NO_DIMS = msgspec.Raw(b"")


class ShapedEvent(DecodedEvent, gc=False):
    """Decoding-only variant that also reads `args["Input Dims"]` (kept as raw JSON text, never
    parsed)."""

    args: ShapeArgs | None = None


class DistributedInfo(msgspec.Struct):
    # checked by rank_number (stepcli.traces.read.document): a bad rank is ignored, never fatal
    rank: Any = None
    world_size: Any = None  # checked alike (world_size_number)


class Header(msgspec.Struct):
    traceEvents: list[DecodedEvent]
    distributedInfo: DistributedInfo | None = None
    # Kineto's list of the GPUs ({"name": ...}); checked by device_name
    deviceProperties: Any = None
    # Any: a malformed value must not send the whole file down the slow lenient path; step_number
    # checks it.
    incomplete_step: Any = msgspec.field(default=None, name=INCOMPLETE_STEP_KEY)
    clock: Any = msgspec.field(default=None, name=CLOCK_KEY)  # checked by clock_id
    cpu_time: Any = msgspec.field(default=None, name=CPU_TIME_KEY)  # checked by cpu_time_of


class ShapedHeader(msgspec.Struct):
    traceEvents: list[ShapedEvent]
    distributedInfo: DistributedInfo | None = None
    deviceProperties: Any = None
    incomplete_step: Any = msgspec.field(default=None, name=INCOMPLETE_STEP_KEY)
    clock: Any = msgspec.field(default=None, name=CLOCK_KEY)  # checked by clock_id
    cpu_time: Any = msgspec.field(default=None, name=CPU_TIME_KEY)  # checked by cpu_time_of


class Meta(NamedTuple):
    """What the trace document says about itself, outside traceEvents."""

    rank: int | None = None
    incomplete_step: int | None = None
    device: str | None = None  # the name of the trace's first GPU (deviceProperties), for MFU
    clock: str | None = None  # the clock its times come from (CLOCK_KEY), when stepcli recorded it
    # step -> (ms on a CPU, ms waiting for one) (CPU_TIME_KEY)
    cpu_time: dict[int, tuple[float, float]] | None = None
    # the job's size (distributedInfo.world_size): traces of several jobs differ
    world_size: int | None = None
