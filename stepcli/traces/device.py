"""Device time by kernel class over the recorded steps: computation, communication, memory, their overlap, idle.

Classes (Holistic Trace Analysis's): communication is a collective kernel of NCCL or RCCL under any naming
(`ncclKernel_*`, `ncclDevKernel_*`, `rccl*`); memory is a `gpu_memcpy` or `gpu_memset` event; computation is
every other kernel. For each class, the time of the union of its intervals inside the measured spans (the
recorded steps, or the extent of the trace's activity when it has no steps), over the same spans' length:

- busy: any device work; compute, comm, memory: that class; idle: no device work (1 - busy share);
- overlap: communication while computation also runs (the intersection of the two unions);
- comm_overlap_share = overlap / comm (None without communication); exposed comm = comm - overlap.

Times are integer nanoseconds, so figures of several files and ranks add up exactly (`DeviceTimes.__add__`).
The measuring itself takes a `within` function: array prefix sums on the columnar path, Python integers on the
per-event reference (times past 64-bit nanoseconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from stepcli.traces.collectives import Transfers
from stepcli.traces.launches import LaunchTimes

NS_PER_MS = 1_000_000.0
# The unions a trace result carries, by class; "comm_or_compute" measures the overlap (|A| + |B| - |A u B|).
CLASSES = ("compute", "comm", "memory", "comm_or_compute")
MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset"})
_COLLECTIVE_PREFIXES = ("nccl", "rccl")


def is_collective_kernel(name: str) -> bool:
    """Whether a device kernel is an NCCL/RCCL collective (any naming: ncclKernel_, ncclDevKernel_, rccl...)."""
    if name.startswith("void "):
        name = name[5:]
    return name[:4].lower() in _COLLECTIVE_PREFIXES


def class_of(name: str, memory: bool) -> str:
    """The kernel class of a device event: "memory" for copies and sets, "comm" for collectives, else "compute"."""
    if memory:
        return "memory"
    return "comm" if is_collective_kernel(name) else "compute"


@dataclass
class DeviceTimes:
    """Integer nanoseconds over the measured spans of one file (or the sum over files, ranks)."""

    steps: int  # the steps measured (1 for a trace without steps)
    span_ns: int  # their length
    busy_ns: int
    compute_ns: int
    comm_ns: int
    memory_ns: int
    overlap_ns: int  # communication with computation beside it
    launches: LaunchTimes = field(default_factory=lambda: LaunchTimes(steps=0))  # and idle time by cause
    transfers: Transfers = field(default_factory=lambda: Transfers(steps=0))  # collectives and copies

    def __add__(self, other: DeviceTimes) -> DeviceTimes:
        return DeviceTimes(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, Any]:
        """The `device` figures of `table --json` and the run summary (README "Device time")."""
        span, steps = self.span_ns, max(self.steps, 1)

        def share(ns: int) -> float:
            return ns / span if span else 0.0

        def per_step(ns: int) -> float:
            return ns / steps / NS_PER_MS

        exposed = self.comm_ns - self.overlap_ns
        return {
            "busy_ms": per_step(self.busy_ns),
            "busy_share": share(self.busy_ns),
            "compute_share": share(self.compute_ns),
            "comm_share": share(self.comm_ns),
            "memory_share": share(self.memory_ns),
            "idle_share": share(span - self.busy_ns),
            "comm_overlap_share": self.overlap_ns / self.comm_ns if self.comm_ns else None,
            "exposed_comm_ms": per_step(exposed),
            "compute_ms": per_step(self.compute_ns),
            "comm_ms": per_step(self.comm_ns),
            "memory_ms": per_step(self.memory_ns),
            "idle_ms": per_step(span - self.busy_ns),
            "idle_by_cause": self.launches.idle_by_cause(span - self.busy_ns),
            "launch": self.launches.launch_stats(),
            **self.transfers.to_dict(),
        }


Within = Callable[[Any, list[tuple[int, int]]], int]  # (a class's union, disjoint spans) -> its time inside them


def measure(
    busy: tuple[int, int], steps: int, unions: dict[str, Any], spans: list[tuple[int, int]], within: Within
) -> DeviceTimes:
    """The class times of one trace from its busy figure (busy ns, span ns), its class unions and the disjoint
    spans measured."""
    inside = {label: within(unions[label], spans) for label in CLASSES}
    overlap = inside["compute"] + inside["comm"] - inside["comm_or_compute"]
    return DeviceTimes(
        steps=steps,
        span_ns=busy[1],
        busy_ns=busy[0],
        compute_ns=inside["compute"],
        comm_ns=inside["comm"],
        memory_ns=inside["memory"],
        overlap_ns=overlap,
    )


def within_arrays(union: Any, spans: list[tuple[int, int]]) -> int:
    """The time of a union given as sorted (starts, ends) arrays inside disjoint spans (array prefix sums)."""
    import numpy as np

    from stepcli.traces.arrays import covered

    starts, ends = union
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    return int(covered(starts, ends, lo, hi).sum())


def union_by_class(starts: Any, ends: Any, classes: Any) -> dict[str, Any]:
    """Per class (CLASSES), the union of the device intervals as (starts, ends) arrays; `classes` holds 0 for
    compute, 1 for comm, 2 for memory per interval."""
    from stepcli.traces.arrays import union_arrays

    out = {}
    for label, mask in (
        ("compute", classes == 0),
        ("comm", classes == 1),
        ("memory", classes == 2),
        ("comm_or_compute", classes < 2),
    ):
        out[label] = union_arrays(starts[mask], ends[mask])
    return out


CLASS_CODES = {"compute": 0, "comm": 1, "memory": 2}
