"""The allocated-memory curve of traces recorded with `--profile-memory` (torch's `[memory]` instant
events).

The trace reader keeps only the events operator tables need, so the curve is read here, and only
from files that contain memory events at all (a byte search, far cheaper than decoding).
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import msgspec

from stepcli.errors import TraceError
from stepcli.inputs import GZIP_MAGIC, open_input
from stepcli.limits import input_limit

MAX_CURVE_POINTS = 4000  # per device per trace, before the chart's own reduction
_MARKER = b'"[memory]"'


class _MemArgs(
    msgspec.Struct,
    rename={"allocated": "Total Allocated", "device_type": "Device Type", "device_id": "Device Id"},
):
    allocated: int = -1
    device_type: int = 0
    device_id: int = -1


class _MemEvent(msgspec.Struct):
    name: str = ""
    ts: float = 0.0
    args: _MemArgs | None = None


class _Document(msgspec.Struct):
    traceEvents: list[_MemEvent] = []  # noqa: N815 (the trace format's field name)


def _device_name(device_type: int, device_id: int) -> str:
    # c10::DeviceType: 0 CPU, 1 CUDA; others (XPU, MTIA, ...) by number.
    if device_type == 0:
        return "CPU"
    if device_type == 1:
        return f"CUDA:{device_id}" if device_id >= 0 else "CUDA"
    return f"device type {device_type}:{device_id}"


def read_curves(path: str) -> list[tuple[str, list[tuple[float, float]]]]:
    """(device label, [(ms since the first memory event, allocated bytes)]) per device in one
    trace."""
    from stepcli.inputs import read_input

    data = read_input(path)
    if _MARKER not in data:
        return []
    try:
        document = msgspec.json.decode(data, type=_Document)
    except msgspec.DecodeError:
        return []  # truncated or odd: the operator tables already name the problem
    by_device: dict[str, list[tuple[float, float]]] = {}
    events = [
        e
        for e in document.traceEvents
        if e.name == "[memory]" and e.args is not None and e.args.allocated >= 0
    ]
    if not events:
        return []
    events.sort(key=lambda e: e.ts)
    origin = events[0].ts
    for event in events:
        assert event.args is not None
        label = _device_name(event.args.device_type, event.args.device_id)
        by_device.setdefault(label, []).append(
            ((event.ts - origin) / 1000.0, float(event.args.allocated))
        )
    return [(label, _thin(points)) for label, points in sorted(by_device.items())]


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_CURVE_POINTS:
        return points
    stride = len(points) / MAX_CURVE_POINTS
    keep = {int(i * stride) for i in range(MAX_CURVE_POINTS)}
    # Keep the peak: it is the number people look for.
    keep.add(max(range(len(points)), key=lambda i: points[i][1]))
    keep.add(len(points) - 1)
    return [points[i] for i in sorted(keep)]


def memory_curves(
    paths: Sequence[str], jobs: int | None = None
) -> list[tuple[str, list[tuple[float, float]]]]:
    """Curves of every trace that has memory events, labelled with the trace's file name and device;
    the files are read in worker processes (stepcli.traces.engine.map_files), as the operator tables
    are."""
    from stepcli.errors import StepcliError
    from stepcli.traces.engine import map_files

    marked = [str(p) for p in paths if _may_hold_memory_events(str(p))]
    if not marked:
        return []
    try:
        per_file = map_files(_curves_of, marked, jobs)
    except StepcliError:  # a worker died (out of memory?): the page goes without the curves
        return []
    out: list[tuple[str, list[tuple[float, float]]]] = []
    for path, curves in zip(marked, per_file):
        for device, points in curves:
            out.append((f"{Path(path).name.split('.')[0]} {device}", points))
    return out


def _curves_of(path: str) -> list[tuple[str, list[tuple[float, float]]]]:
    """read_curves, with a file that is no readable trace giving no curve (the operator tables name
    it)."""
    try:
        return read_curves(path)
    except TraceError:
        return []


def _may_hold_memory_events(path: str) -> bool:
    """False when a plain trace file certainly holds no memory event: a byte search of its pages
    where they lie (mmap: no copy, no worker process). A 1,024-rank job recorded without
    --profile-memory then reads nothing more for the page; before, every file was read again by
    workers forked from a process already holding every rank's figures. Gzip files (the marker is
    compressed) and anything odd are left to read_curves."""
    if path.endswith(".gz"):
        return True
    try:
        fd, info = open_input(path)
    except TraceError:
        return False  # read_curves would find no curve in it either
    try:
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0 or info.st_size > input_limit():
            # nothing to draw, or a file read_curves refuses (a huge sparse one is not scanned)
            return False
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as view:
            return view[:2] == GZIP_MAGIC or view.find(_MARKER) >= 0
    except (OSError, ValueError):
        return True
    finally:
        os.close(fd)
