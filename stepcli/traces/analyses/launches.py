"""Kernel launches and device idle time by cause over the recorded steps, from the correlation ids
that link a launch call on the host (`cudaLaunchKernel`, `hipLaunchKernel`, `cudaGraphLaunch`, ...)
to the device work it queued. Definitions follow Holistic Trace Analysis (docs/concepts/gpu.md,
"Idle time by cause and launch statistics"):

- launch delay: the device event's start minus the end of its launch call, 0 when negative;
- CPU launch time per kernel: the launch calls' durations over the device events they queued (a CUDA
  graph replay is one call for many kernels);
- short kernel: a device event that ran for less time than its launch call took on the host;
- idle by cause, per stream (a device event's `tid` is its stream): the gap between a device event
  and the end of the one before it on its stream is **host wait** when the event's launch call
  started after that end (the device waited for the host), else **kernel wait** when the gap is
  under KERNEL_WAIT_NS (back-to-back kernels), else **other**; only the part of a gap inside the
  recorded steps counts.

A device event belongs to the recorded steps when its launch call starts inside one (like the
operator tables' rule for kernels); one without a launch call in the trace counts only in the idle
gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from stepcli.stats import percentile

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.read.typedcolumns import Columns

KERNEL_LAUNCHES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "hipMemcpyAsync",
        "hipMemsetAsync",
    }
)
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
# HTA's consecutive_kernel_delay default (30, applied to its microsecond times)
KERNEL_WAIT_NS = 30_000
NS_PER_MS = 1_000_000.0
DEVICE_KIND = 3  # stepcli.traces.analyses.arrays.DEVICE: kinds from it on are device work


@dataclass
class LaunchTimes:
    """Integer nanoseconds and counts of one file (or summed over files); `delays_ns` kept whole for
    percentiles."""

    steps: int
    kernels: int = 0  # device events inside the steps linked to a launch call
    launch_calls: int = 0
    launch_ns: int = 0  # the launch calls' total duration
    short_kernels: int = 0
    graph_replays: int = 0
    graph_kernels: int = 0
    # device idle (no stream busy) by cause; `other` is the rest of the idle time
    host_wait_ns: int = 0
    kernel_wait_ns: int = 0
    # stream -> [host, kernel, other wait] ns
    streams: dict[str, list[int]] = field(default_factory=dict)
    delays_ns: list[int] = field(default_factory=list)

    def __add__(self, other: LaunchTimes) -> LaunchTimes:
        total = LaunchTimes(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in fields(self)
                if f.name != "streams"
            }
        )
        for times in (self, other):
            for stream, waits in times.streams.items():
                total.streams[stream] = [
                    a + b for a, b in zip(total.streams.get(stream, [0, 0, 0]), waits)
                ]
        return total

    def idle_by_cause(self, idle_ns: int) -> dict[str, Any]:
        """Mean milliseconds per step of device idle time by cause (the three add up to the idle
        time), and of each stream's idle time by cause."""
        steps = max(self.steps, 1)

        def ms(ns: int) -> float:
            return ns / steps / NS_PER_MS

        return {
            "host_wait_ms": ms(self.host_wait_ns),
            "kernel_wait_ms": ms(self.kernel_wait_ns),
            "other_ms": ms(idle_ns - self.host_wait_ns - self.kernel_wait_ns),
            "streams": [
                {
                    "stream": stream,
                    "host_wait_ms": ms(h),
                    "kernel_wait_ms": ms(k),
                    "other_ms": ms(o),
                }
                for stream, (h, k, o) in sorted(
                    self.streams.items(), key=lambda item: _stream_key(item[0])
                )
            ],
        }

    def launch_stats(self) -> dict[str, Any] | None:
        """Launch statistics per step and per kernel; None when no device event was linked to a
        launch call."""
        if not self.kernels:
            return None
        steps = max(self.steps, 1)
        ordered: list[float] = sorted(self.delays_ns)
        return {
            "kernels_per_step": self.kernels / steps,
            "delay_us": {
                name: percentile(ordered, q) / 1000
                for name, q in (("p50", 50), ("p90", 90), ("p99", 99))
            }
            | {"max": ordered[-1] / 1000},
            "cpu_launch_us_per_kernel": self.launch_ns / self.kernels / 1000,
            "short_kernel_share": self.short_kernels / self.kernels,
            "graph_replays_per_step": self.graph_replays / steps,
            "graph_kernels_per_step": self.graph_kernels / steps,
        }


def measure_launches(
    columns: Columns,
    start: np.ndarray,
    dur: np.ndarray,
    device: np.ndarray,
    spans: list[tuple[int, int]],
    steps: int,
    windows: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[LaunchTimes, np.ndarray]:
    """Launch statistics and idle by cause of one trace. `start`, `dur`: every event's integer
    nanoseconds; `device`: the indices of its device events; `spans`: the disjoint spans measured
    (the steps). Also, per window of `windows` (starts, ends: each recorded step), its host wait and
    kernel wait ns (an (n, 2) array)."""
    import numpy as np

    from stepcli.traces.analyses.arrays import unique

    out = LaunchTimes(steps=steps)
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    corr = columns.corr
    waits = np.zeros((0 if windows is None else len(windows[0]), 2), np.int64)
    if len(corr) != len(start) or not len(device):
        return out, waits
    host = np.nonzero((columns.kind < DEVICE_KIND) & (corr >= 0))[0]
    # the host event of each device event (its launch call, or the runtime call that queued it; -1:
    # none)
    call = _linked(corr, host, device)
    found = call >= 0
    # none: never host wait
    call_start = np.where(found, start[np.maximum(call, 0)], np.iinfo(np.int64).min)
    _idle_by_cause(out, columns, start, dur, device, call_start, lo, hi, windows, waits)
    kinds = np.array([_launch_kind(n) for n in columns.names] or [0], np.int8)
    found &= kinds[columns.name[np.maximum(call, 0)]] > 0
    # launch statistics over the device events launched inside the steps
    inside = found & in_spans(call_start, lo, hi)
    linked, their_call = device[inside], call[inside]
    if not len(linked):
        return out, waits
    call_end = start[their_call] + dur[their_call]
    delays = np.maximum(start[linked] - call_end, 0)
    unique_calls = unique(their_call)
    graph = kinds[columns.name[their_call]] == 2
    out.kernels = len(linked)
    out.launch_calls = len(unique_calls)
    out.launch_ns = int(dur[unique_calls].sum())
    out.short_kernels = int(np.count_nonzero(dur[linked] < dur[their_call]))
    out.graph_replays = len(unique(their_call[graph]))
    out.graph_kernels = int(np.count_nonzero(graph))
    out.delays_ns = delays.tolist()
    return out, waits


def _linked(corr: np.ndarray, host: np.ndarray, device: np.ndarray) -> np.ndarray:
    """Per device event, the index of the host event with its correlation id (the first in file
    order), or -1."""
    import numpy as np

    by_corr = host[np.argsort(corr[host], kind="stable")]
    sorted_corr = corr[by_corr]
    at = np.searchsorted(sorted_corr, corr[device])
    found = (at < len(sorted_corr)) & (corr[device] >= 0)
    found[found] = sorted_corr[at[found]] == corr[device][found]
    call = np.full(len(device), -1, np.int64)
    call[found] = by_corr[at[found]]
    return call


def _stream_key(stream: str) -> tuple[int, str]:
    return (
        (0, f"{int(stream):020d}")
        if stream.isascii() and stream.isdecimal() and len(stream) <= 20
        else (1, stream)
    )


def in_spans(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each time lies in one of the disjoint sorted spans [lo, hi)."""
    import numpy as np

    k = np.searchsorted(lo, t, side="right") - 1
    return (k >= 0) & (t < hi[np.maximum(k, 0)]) if len(lo) else np.zeros(len(t), bool)


def _launch_kind(name: str) -> int:
    """1 for a kernel (or copy) launch call, 2 for a CUDA graph replay, 0 for anything else."""
    return 1 if name in KERNEL_LAUNCHES else 2 if name in GRAPH_LAUNCHES else 0


def _idle_by_cause(
    out: LaunchTimes,
    columns: Columns,
    start: np.ndarray,
    dur: np.ndarray,
    device: np.ndarray,
    call_start: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    windows: tuple[np.ndarray, np.ndarray] | None,
    waits: np.ndarray,
) -> None:
    """Idle gaps by cause, cut to the steps: of the device as a whole (no stream busy), and per
    stream; and of the device as a whole per window into `waits` (host wait, kernel wait)."""
    import numpy as np

    from stepcli.traces.analyses.arrays import covered

    begin, end = start[device], start[device] + dur[device]
    gap_lo, gap_hi, host, short = _gaps(begin, end, call_start)
    counted = covered(lo, hi, gap_lo, gap_hi)
    out.host_wait_ns, out.kernel_wait_ns = int(counted[host].sum()), int(counted[short].sum())
    # the gaps are sorted and disjoint: a union each cause's subset is too
    if windows is not None and len(waits):
        waits[:, 0] = covered(gap_lo[host], gap_hi[host], *windows)
        waits[:, 1] = covered(gap_lo[short], gap_hi[short], *windows)
    stream = columns.tid[device]
    for code in sorted(set(stream.tolist())):
        mine = np.nonzero(stream == code)[0]
        out.streams[str(columns.ids[code])] = list(
            _gaps_by_cause(begin[mine], end[mine], call_start[mine], lo, hi)
        )


def _gaps_by_cause(
    begin: np.ndarray, end: np.ndarray, call_start: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[int, int, int]:
    """(host wait, kernel wait, other) ns of the gaps between consecutive intervals (each gap from
    the end of all before to the next start) inside the spans [lo, hi); the cause from the interval
    that ends the gap."""
    from stepcli.traces.analyses.arrays import covered

    gap_lo, gap_hi, host, short = _gaps(begin, end, call_start)
    counted = covered(lo, hi, gap_lo, gap_hi)
    return int(counted[host].sum()), int(counted[short].sum()), int(counted[~host & ~short].sum())


def _gaps(
    begin: np.ndarray, end: np.ndarray, call_start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The gaps between consecutive intervals, sorted and disjoint (starts, ends), and which are
    host wait and which kernel wait (the rest is other)."""
    import numpy as np

    order = np.argsort(begin, kind="stable")
    b, reach = begin[order], np.maximum.accumulate(end[order])
    after = np.nonzero(b[1:] > reach[:-1])[0] + 1  # the intervals that end a gap
    gap_lo, gap_hi = reach[after - 1], b[after]
    host = call_start[order][after] > gap_lo
    short = ~host & (gap_hi - gap_lo < KERNEL_WAIT_NS)
    return gap_lo, gap_hi, host, short
