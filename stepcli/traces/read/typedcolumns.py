"""The typed columns every analysis reads: a trace's kept events in file order as numpy arrays
(`Columns`), the category kinds they are sorted into, and the same columns built from decoded events
(`columns_from_events`, for the per-event path and tests). The reader fills them
(stepcli.traces.read.columns); the analyses compute over them (stepcli.traces.analyses.arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stepcli.traces.read.events import Event

# Category kinds (the reference only tells these apart). DEVICE and MEMORY are device work: a
# kernel, a copy or set.
OTHER_CPU, USER_ANNOTATION, PYTHON_FUNCTION, DEVICE, MEMORY = 0, 1, 2, 3, 4
_KIND_CATEGORY = ("cpu_op", "user_annotation", "python_function", "kernel", "gpu_memcpy")
_MEMORY = frozenset({"gpu_memcpy", "gpu_memset"})
_DEVICE_CATEGORIES = _MEMORY | {"kernel"}
PARAM_COMMS = "record_param_comms"  # torch's host event of a collective, with its metadata in args


def kind_of(category: str) -> int:
    if category == "kernel":
        return DEVICE
    if category in _MEMORY:
        return MEMORY
    if category == "user_annotation":
        return USER_ANNOTATION
    if category == "python_function":
        return PYTHON_FUNCTION
    return OTHER_CPU


@dataclass
class Columns:
    """A trace's kept events in file order, as arrays; strings and ids are held once in the lookup
    lists."""

    name: np.ndarray  # int32 index into names
    kind: np.ndarray  # int8 category kind
    pid: np.ndarray  # int32 index into ids
    tid: np.ndarray  # int32 index into ids
    ts: np.ndarray  # float64 microseconds, as in the file
    dur: np.ndarray  # float64 microseconds
    shape: np.ndarray  # int32 index into shapes
    corr: np.ndarray  # int64 correlation id (launch call <-> device work), -1: none
    # event index -> (bytes, collective, in nelems, out nelems, group size, dtype) of the device
    # events that have them (stepcli.traces.read.tracereader.transfer_args): copies and collectives
    # only, so a dict, not a column
    transfers: dict[int, tuple[int, str, int, int, int, str]] = field(default_factory=dict)
    # event index -> the FLOPs in its args (operators only)
    flops: dict[int, int] = field(default_factory=dict)
    # event index -> (process group name, sequence number or -1, member ranks as written) of the
    # host events that carry them (`record_param_comms` on NCCL traces;
    # stepcli.traces.read.tracereader.group_of): few, so a dict
    groups: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    # event index -> (External id, dtype) of the GEMM operators whose kernels' dtype is known from
    # the operator (stepcli.traces.analyses.flops.op_dtype), and event index -> External id of the
    # GEMM kernels whose names say no dtype (nvjet_*): the kernel's dtype is its operator's. Few, so
    # dicts.
    gemm_ops: dict[int, tuple[int, str]] = field(default_factory=dict)
    gemm_kernels: dict[int, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    ids: list[int | str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=lambda: [""])

    def __len__(self) -> int:
        return len(self.ts)

    def to_events(self) -> list[Event]:
        """The events again (for the per-event reference)."""
        from stepcli.traces.read.events import Event, EventArgs

        def args_of(
            correlation: int,
            transfer: tuple[int, str, int, int, int, str] | None,
            group: tuple[str, int, str] | None,
        ) -> EventArgs | None:
            if transfer is None and group is None:
                return EventArgs(correlation=correlation) if correlation >= 0 else None
            args = EventArgs(correlation)
            if transfer is not None:
                size, collective, in_nelems, out_nelems, group_size, dtype = transfer
                args = EventArgs(
                    correlation, size, collective, in_nelems, out_nelems, group_size, dtype
                )
            if group is not None:
                args.pg_name, seq, args.pg_ranks = group
                args.seq = seq if seq >= 0 else None
            return args

        names, ids, shapes = self.names, self.ids, self.shapes
        return [
            Event(
                name=names[n],
                cat=_KIND_CATEGORY[k],
                ph="X",
                pid=ids[p],
                tid=ids[t],
                ts=s,
                dur=d,
                shape=shapes[h],
                args=args_of(c, self.transfers.get(i), self.groups.get(i)),
            )
            for i, (n, k, p, t, s, d, h, c) in enumerate(
                zip(
                    self.name.tolist(),
                    self.kind.tolist(),
                    self.pid.tolist(),
                    self.tid.tolist(),
                    self.ts.tolist(),
                    self.dur.tolist(),
                    self.shape.tolist(),
                    self.corr.tolist(),
                )
            )
        ]


def columns_from_events(events: list[Event]) -> Columns:
    """Columns of events already filtered to the kept subset
    (stepcli.traces.read.tracereader.Trace.events)."""
    from stepcli.traces.read.events import int64_or_none

    names: dict[str, int] = {}
    ids: dict[int | str, int] = {}
    shapes: dict[str, int] = {"": 0}
    n = len(events)
    return Columns(
        name=np.fromiter((names.setdefault(e.name, len(names)) for e in events), np.int32, n),
        kind=np.fromiter((kind_of(e.cat) for e in events), np.int8, n),
        pid=np.fromiter((ids.setdefault(e.pid, len(ids)) for e in events), np.int32, n),
        tid=np.fromiter((ids.setdefault(e.tid, len(ids)) for e in events), np.int32, n),
        ts=np.fromiter((e.ts for e in events), np.float64, n),
        dur=np.fromiter((e.dur for e in events), np.float64, n),
        shape=np.fromiter((shapes.setdefault(e.shape, len(shapes)) for e in events), np.int32, n),
        corr=np.fromiter(
            (-1 if e.args is None else int64_or_none(e.args.correlation) for e in events),
            np.int64,
            n,
        ),
        transfers=_transfers_of(events),
        flops={
            i: e.args.flops
            for i, e in enumerate(events)
            if e.args is not None
            and int64_or_none(e.args.flops) > 0
            and kind_of(e.cat) == OTHER_CPU
        },
        groups=_groups_of(events),
        **_gemm_links(events),
        names=list(names),
        ids=list(ids),
        shapes=list(shapes),
    )


def _transfers_of(events: list[Event]) -> dict[int, tuple[int, str, int, int, int, str]]:
    """Copy sizes and collective metadata of the device events
    (stepcli.traces.read.tracereader.transfer_args)."""
    from stepcli.traces.read.events import transfer_args

    out = {}
    for index, event in enumerate(events):
        if event.args is not None and event.cat in _DEVICE_CATEGORIES:
            found = transfer_args(event.args)
            if found is not None:
                out[index] = found
    return out


def _gemm_links(events: list[Event]) -> dict[str, Any]:
    """`gemm_ops` and `gemm_kernels` of events (as stepcli.traces.read.columns.ColumnKeeper takes
    them)."""
    from stepcli.traces.read.names import gemm_op, op_dtype, undtyped_gemm

    ops: dict[int, tuple[int, str]] = {}
    kernels: dict[int, int] = {}
    for index, event in enumerate(events):
        args = event.args
        if args is None or args.external < 0:
            continue
        if event.cat in _DEVICE_CATEGORIES:
            if event.cat == "kernel" and undtyped_gemm(event.name):
                kernels[index] = args.external
        elif gemm_op(event.name):
            types = getattr(args, "types", None)
            dtype = op_dtype(event.name, types.first if types is not None else None)
            if dtype is not None:
                ops[index] = (args.external, dtype)
    return {"gemm_ops": ops, "gemm_kernels": kernels}


def _groups_of(events: list[Event]) -> dict[int, tuple[str, int, str]]:
    """The process groups of the host `record_param_comms` events
    (stepcli.traces.read.tracereader.group_of)."""
    from stepcli.traces.read.events import group_of

    out = {}
    for index, event in enumerate(events):
        if (
            event.name == PARAM_COMMS
            and event.args is not None
            and event.cat not in _DEVICE_CATEGORIES
        ):
            found = group_of(event.args)
            if found is not None:
                out[index] = found
    return out
