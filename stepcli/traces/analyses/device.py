"""Device time by kernel class over the recorded steps: computation, communication, memory, their
overlap, idle.

Classes (Holistic Trace Analysis's): communication is a collective kernel of NCCL or RCCL under any
naming (`ncclKernel_*`, `ncclDevKernel_*`, `rccl*`); memory is a `gpu_memcpy` or `gpu_memset` event;
computation is every other kernel. For each class, the time of the union of its intervals inside the
measured spans (the recorded steps, or the extent of the trace's activity when it has no steps),
over the same spans' length:

- busy: any device work; compute, comm, memory: that class; idle: no device work (1 - busy share);
- overlap: communication while computation also runs (the intersection of the two unions);
- comm_overlap_share = overlap / comm (None without communication); exposed comm = comm - overlap.

The same figures per recorded step (`steps`): each step window of each process measured alone, then
per step number the mean over the processes (files) that recorded it.

Times are integer nanoseconds, so figures of several files and ranks add up exactly
(`DeviceTimes.__add__`). The measuring itself takes a `within` function: array prefix sums on the
columnar path, Python integers on the per-event reference (times past 64-bit nanoseconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from stepcli.traces.analyses.collectivestats import Transfers
from stepcli.traces.analyses.launches import LaunchTimes

NS_PER_MS = 1_000_000.0
# The unions a trace result carries, by class; "comm_or_compute" measures the overlap (|A| + |B| -
# |A u B|).
CLASSES = ("compute", "comm", "memory", "comm_or_compute")
MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset"})
_COLLECTIVE_PREFIXES = ("nccl", "rccl")


def is_collective_kernel(name: str) -> bool:
    """Whether a device kernel is an NCCL/RCCL collective (any naming: ncclKernel_, ncclDevKernel_,
    rccl...)."""
    if name.startswith("void "):
        name = name[5:]
    return name[:4].lower() in _COLLECTIVE_PREFIXES


def class_of(name: str, memory: bool) -> str:
    """The kernel class of a device event: "memory" for copies and sets, "comm" for collectives,
    else "compute"."""
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
    # and idle time by cause
    launches: LaunchTimes = field(default_factory=lambda: LaunchTimes(steps=0))
    # collectives and copies
    transfers: Transfers = field(default_factory=lambda: Transfers(steps=0))
    # per step window: (step number, *STEP_FIELDS) in ns; lists add up by concatenation, in file
    # order
    steps_ns: list[tuple[int, ...]] = field(default_factory=list)

    def __add__(self, other: DeviceTimes) -> DeviceTimes:
        return DeviceTimes(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, Any]:
        """The `device` figures of `table --json` and the run summary (docs/concepts/gpu.md)."""
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
            "steps": steps_to_dicts(self.steps_ns),
        }


# The figures of one step window after its step number (integer ns), in the order of
# DeviceTimes.steps_ns tuples.
STEP_FIELDS = ("span", "busy", "compute", "comm", "memory", "overlap", "host_wait", "kernel_wait")


def steps_to_dicts(rows: list[tuple[int, ...]]) -> list[dict[str, Any]]:
    """Per step number (ascending), the mean over the windows that recorded it of each figure, in
    milliseconds and with the job figures' names (the parts a report bar stacks: see
    stepcli.report.gpu.step_parts)."""
    sums: dict[int, list[int]] = {}
    for step, *values in rows:
        into = sums.get(step)
        if into is None:
            sums[step] = [1, *values]
        else:
            into[0] += 1
            for i, value in enumerate(values, 1):
                into[i] += value
    out = []
    for step in sorted(sums):
        count, span, busy, compute, comm, memory, overlap, host, kernel = sums[step]

        def ms(ns: int, count: int = count) -> float:
            return ns / count / NS_PER_MS

        idle = span - busy
        out.append(
            {
                "step": step,
                "windows": count,
                "step_ms": ms(span),
                "busy_ms": ms(busy),
                "compute_ms": ms(compute),
                "comm_ms": ms(comm),
                "exposed_comm_ms": ms(comm - overlap),
                "memory_ms": ms(memory),
                "idle_ms": ms(idle),
                "idle_by_cause": {
                    "host_wait_ms": ms(host),
                    "kernel_wait_ms": ms(kernel),
                    "other_ms": ms(idle - host - kernel),
                },
            }
        )
    return out


def measure_steps(
    steps: list[int],
    lo: Any,
    hi: Any,
    busy: Any,
    unions: dict[str, Any],
    waits: Any,
    within: Within,
) -> list[tuple[int, ...]]:
    """Per step window (numbers `steps`, bounds `lo`, `hi`: int64 arrays), its STEP_FIELDS: the
    device union `busy` and the class unions measured inside it, and its idle waits by cause
    (`waits`, an (n, 2) array from stepcli.traces.analyses.launches). `within` as for `measure`:
    with `within_arrays`, all windows at once (prefix sums)."""
    import numpy as np

    if within is within_arrays:
        from stepcli.traces.analyses.arrays import covered

        def inside(union: Any) -> Any:
            return covered(union[0], union[1], lo, hi)
    else:

        def inside(union: Any) -> Any:
            return np.array(
                [within(union, [(a, b)]) for a, b in zip(lo.tolist(), hi.tolist())], np.int64
            )

    classes = {label: inside(unions[label]) for label in CLASSES}
    overlap = classes["compute"] + classes["comm"] - classes["comm_or_compute"]
    columns = (
        hi - lo,
        inside(busy),
        classes["compute"],
        classes["comm"],
        classes["memory"],
        overlap,
        waits[:, 0],
        waits[:, 1],
    )
    return list(zip(steps, *(c.tolist() for c in columns)))


# (a class's union, disjoint spans) -> its time inside them
Within = Callable[[Any, list[tuple[int, int]]], int]


def measure(
    busy: tuple[int, int],
    steps: int,
    unions: dict[str, Any],
    spans: list[tuple[int, int]],
    within: Within,
) -> DeviceTimes:
    """The class times of one trace from its busy figure (busy ns, span ns), its class unions and
    the disjoint spans measured."""
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
    """The time of a union given as sorted (starts, ends) arrays inside disjoint spans (array prefix
    sums)."""
    import numpy as np

    from stepcli.traces.analyses.arrays import covered

    starts, ends = union
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    return int(covered(starts, ends, lo, hi).sum())


def union_by_class(starts: Any, ends: Any, classes: Any) -> dict[str, Any]:
    """Per class (CLASSES), the union of the device intervals as (starts, ends) arrays; `classes`
    holds 0 for compute, 1 for comm, 2 for memory per interval."""
    from stepcli.traces.analyses.arrays import union_arrays

    out = {}
    for label, mask in (
        ("compute", classes == 0),
        ("comm", classes == 1),
        ("memory", classes == 2),
        ("comm_or_compute", classes < 2),
    ):
        out[label] = union_arrays(starts[mask], ends[mask])
    return out
