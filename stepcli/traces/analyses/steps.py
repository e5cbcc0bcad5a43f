"""Step windows, step phases and interval arithmetic shared by the columnar analysis
(stepcli.traces.analyses.traceanalysis) and its per-event reference
(stepcli.traces.analyses.reference).

Times are integer nanoseconds relative to the trace's first kept event: the Chrome format stores
microseconds with three decimals, and at epoch-sized timestamps a float cannot tell two nanoseconds
apart, while torch builds its operator tree from exact nanoseconds. Integers make "child ends where
parent ends" exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stepcli.runfolder.layout import CLOSURE_ANNOTATION
from stepcli.traces.analyses.arrivals import GC_PREFIX
from stepcli.traces.analyses.ranks import is_communication
from stepcli.traces.analyses.results import NS_PER_MS, OpRow
from stepcli.traces.analyses.shares import STEP_KEY
from stepcli.traces.read.names import STEP_PREFIX, step_of

# Same categories as stepcli.traces.read.tracereader (not imported at run time so this module stays
# free of the decoder).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
DATALOADER, OPTIMIZER, BACKWARD = 1, 2, 3
COMM = 4  # collective communication: never forward; in `other` unless inside another phase
# a Python garbage-collection pause the agent marked (stepcli.agent.gcpauses): never forward,
# `other`
PAUSE = 5
# Not a phase of any event (phase_of never says it): the key of the closure ranges in
# TraceResult.phase_spans.
CLOSURE = 6
PHASE_PREFIXES = (
    ("enumerate(DataLoader)", DATALOADER),
    ("Optimizer.step#", OPTIMIZER),
    ("Optimizer.zero_grad#", OPTIMIZER),
    ("autograd::engine::evaluate_function: ", BACKWARD),
)


@dataclass
class Window:
    """One ProfilerStep#N and its top-level operators on its thread (forward unless they are another
    phase)."""

    step: int
    pid: int | str
    start: int
    end: int
    children: list[tuple[int, int, int]]
    # every top-level event of the step, any phase
    tops: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class TraceResult:
    windows: list[Window]
    phase_spans: dict[int, list[tuple[int, int, int | str]]]  # phase -> (start, end, pid)
    device_union: list[tuple[int, int]]
    cpu_span: tuple[int, int] | None
    # pid -> union of communication spans (CPU and device)
    comm_union: dict[int | str, list[tuple[int, int]]]
    main_pid: int | str | None  # the process of the CPU events
    # host operator calls left out of the rows: outside every step of their process
    outside_events: int = 0
    outside_ns: int = 0  # their self time
    # (phase totals, steps) over the windows when measured on arrays; else `step_phases` measures
    # them
    phase_totals: tuple[dict[str, int], int] | None = None
    device_arrays: Any = None  # the device union as (starts, ends) arrays, when measured on arrays
    # per kernel class (stepcli.traces.analyses.device.CLASSES), its union: (starts, ends) arrays on
    # the columnar path, a list of (start, end) on the reference
    device_classes: dict[str, Any] | None = None
    nanoseconds: Any = (
        # every event's integer ns (stepcli.traces.analyses.arrays.Nanoseconds), on the columnar
        # path
        None
    )
    # of the steps' "other" time, the part inside a host operator that no phase claims (a wrapper's
    # or a closure's time between its children), when measured on arrays; the rest of "other" is
    # outside every operator
    other_inside_ns: int | None = None


class Accumulator:
    """Operator rows keyed by name (and shape), summed over threads and traces, in nanoseconds."""

    def __init__(self) -> None:
        self.rows: dict[Any, list[int]] = {}

    def self_ns_without_steps(self, by_shape: bool) -> int:
        return sum(v[1] for k, v in self.rows.items() if (k[0] if by_shape else k) != STEP_KEY)

    def rows_out(self, by_shape: bool, total_self: int) -> list[OpRow]:
        out: list[OpRow] = []
        for key, (calls, self_ns, total_ns) in self.rows.items():
            name, shape = key if by_shape else (key, None)
            out.append(
                OpRow(
                    name=name,
                    calls=calls,
                    self_ms=self_ns / NS_PER_MS,
                    total_ms=total_ns / NS_PER_MS,
                    avg_ms=total_ns / NS_PER_MS / calls if calls else 0.0,
                    self_share=self_ns / total_self if total_self > 0 else 0.0,
                    shape=shape,
                )
            )
        out.sort(key=lambda r: (-r.self_ms, r.name, r.shape or ""))
        return out


def phase_of(name: str) -> int:
    for prefix, phase in PHASE_PREFIXES:
        if name.startswith(prefix):
            return phase
    if name.startswith(GC_PREFIX):
        return PAUSE
    return COMM if is_communication(name) else 0


def wraps_backward(name: str) -> bool:
    """A user's annotation around the backward pass, by its name (`## backward ##`, Lightning's
    `[pl][profile]...backward`): a wrapper of that phase even where none of its events are below it,
    as on a GPU trace, where the autograd engine runs backward on its own threads."""
    return "backward" in name.lower() and not phase_of(name) and not name.startswith(STEP_PREFIX)


def is_closure(name: str) -> bool:
    """The agent's range around a call of an optimizer's closure (`optimizer.step(closure)`): no
    phase of its own and no operator; what runs in it is forward, backward or optimizer as anywhere
    else in the step."""
    return name == CLOSURE_ANNOTATION


def optimizer_own(
    optimizer: Iterable[tuple[int, int]], nested: Iterable[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The optimizer's own time: the union of its spans less the backward passes and closure calls
    that run inside one of them (`optimizer.step(closure)`: LBFGS runs forward and backward in the
    closure, up to max_iter times per step), though an optimizer event inside those (the closure's
    zero_grad) is the optimizer's again. An optimizer span inside a backward span (a step run from a
    gradient hook) stays the optimizer's: the innermost phase decides."""
    events = list(optimizer)
    spans = union(events)
    holes = union(inside(spans, nested))
    if not holes:
        return spans
    out: list[tuple[int, int]] = []
    j = 0
    for s, e in spans:
        while j < len(holes) and holes[j][1] <= s:
            j += 1
        at = s
        while j < len(holes) and holes[j][0] < e:
            if holes[j][0] > at:
                out.append((at, holes[j][0]))
            at = max(at, holes[j][1])
            j += 1
        if at < e:
            out.append((at, e))
    return union(out + inside(holes, events))


def inside(
    spans: list[tuple[int, int]], candidates: Iterable[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The candidates that each lie inside one interval of the disjoint sorted union `spans`."""
    ends = [e for _, e in spans]
    out = []
    for s, e in candidates:
        i = bisect.bisect_right(ends, s)  # the first interval ending after s
        if i < len(spans) and spans[i][0] <= s and e <= spans[i][1]:
            out.append((s, e))
    return out


# pid -> (union of its steps, the union's ends)
StepSpans = dict[Any, tuple[list[tuple[int, int]], list[int]]]


def step_spans_of(
    steps: Iterable[tuple[int | str, str, int, int]], incomplete_step: int | None
) -> StepSpans | None:
    """Per process, the union of its complete ProfilerStep#N annotations (pid, name, start, end),
    and that union's ends (for bisect); None when no step is complete: nothing is then left out.

    The incomplete step (a window cut short) is no recorded step: what ran in it is no step's time,
    like the time after the last step, and giving it a share of the complete steps' time made shares
    of 100x."""
    by_pid: dict[int | str, list[tuple[int, int]]] = {}
    for pid, name, start, end in steps:
        number = step_of(name)
        if number is not None and number != incomplete_step:
            by_pid.setdefault(pid, []).append((start, end))
    if not by_pid:
        return None
    unions = {pid: union(spans) for pid, spans in by_pid.items()}
    return {pid: (union, [e for _, e in union]) for pid, union in unions.items()}


def in_steps(spans: StepSpans, pid: int | str, start: int, end: int) -> bool:
    """Whether [start, end) overlaps a step of its process (a zero-length event: whether it lies in
    one)."""
    union, ends = spans.get(pid, ((), ()))
    i = bisect.bisect_right(ends, start)  # the first step span ending after `start`
    return i < len(union) and union[i][0] < max(end, start + 1)


def union(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint intervals covering the same time as `spans`."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def clip(
    union: list[tuple[int, int]], ends: list[int], start: int, end: int
) -> list[tuple[int, int]]:
    """The parts of a disjoint sorted union that fall inside [start, end)."""
    out: list[tuple[int, int]] = []
    i = bisect.bisect_right(ends, start)
    while i < len(union) and union[i][0] < end:
        s, e = union[i]
        out.append((max(s, start), min(e, end)))
        i += 1
    return out


def length(spans: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in union(spans))


OTHER_INSIDE = "other inside operators"  # step_phases' figure beside the phases, not one of them


def step_phases(result: TraceResult) -> list[tuple[Window, dict[str, int]]]:
    """Split each step into phases: union time of dataloader, then optimizer, backward and forward
    spans, each counting only time not already claimed by the phases before it; the rest of the step
    is `other`. The optimizer's spans are its own time (`optimizer_own`): without the backward and
    closures nested in them.

    Forward is every top-level operator of the step's thread that is no other phase, wherever it
    falls in the step: gradient accumulation and GANs run several forward passes between backward
    passes. Backward spans come from every thread of the process (the autograd engine's threads
    included)."""
    unions: dict[tuple[int, int | str], list[tuple[int, int]]] = {}
    for phase, spans in result.phase_spans.items():
        by_pid: dict[int | str, list[tuple[int, int]]] = {}
        for s, e, pid in spans:
            by_pid.setdefault(pid, []).append((s, e))
        for pid, pid_spans in by_pid.items():
            unions[(phase, pid)] = union(pid_spans)
    for pid in [pid for phase, pid in unions if phase == OPTIMIZER]:
        nested = unions.get((BACKWARD, pid), []) + unions.get((CLOSURE, pid), [])
        events = [(s, e) for s, e, of in result.phase_spans[OPTIMIZER] if of == pid]
        unions[(OPTIMIZER, pid)] = optimizer_own(events, nested)
    ends = {key: [e for _, e in union] for key, union in unions.items()}

    out: list[tuple[Window, dict[str, int]]] = []
    for window in result.windows:
        claimed: list[tuple[int, int]] = []
        ms: dict[str, int] = {}
        covered = 0
        for phase, label in (
            (DATALOADER, "dataloader"),
            (OPTIMIZER, "optimizer"),
            (BACKWARD, "backward"),
        ):
            key = (phase, window.pid)
            parts = clip(unions[key], ends[key], window.start, window.end) if key in unions else []
            claimed.extend(parts)
            now = length(claimed)
            ms[label] = now - covered
            covered = now
        # Forward: the step's own top-level ops that are no other phase (and no communication).
        claimed.extend(
            (max(s, window.start), min(e, window.end))
            for s, e, phase in window.children
            if not phase
        )
        now = length(claimed)
        ms["forward"] = now - covered
        ms["other"] = (window.end - window.start) - now
        # of "other", the part inside a top-level operator no phase claims
        # (TraceResult.other_inside_ns)
        claimed.extend((max(s, window.start), min(e, window.end)) for s, e in window.tops)
        ms[OTHER_INSIDE] = length(claimed) - now
        out.append((window, ms))
    return out


def measured_spans(result: TraceResult) -> list[tuple[int, int]]:
    """The disjoint spans device figures are measured over: the steps, or the extent of the CPU and
    device activity when there are no steps (the device union must not be empty)."""
    spans = [(w.start, w.end) for w in result.windows]
    if not spans:
        first = min(
            result.device_union[0][0],
            result.cpu_span[0] if result.cpu_span else result.device_union[0][0],
        )
        last = max(
            result.device_union[-1][1],
            result.cpu_span[1] if result.cpu_span else result.device_union[-1][1],
        )
        spans = [(first, last)]
    return union(spans)


def within_lists(spans_union: list[tuple[int, int]], spans: list[tuple[int, int]]) -> int:
    """The time of a disjoint sorted union inside disjoint spans, on Python integers."""
    ends = [e for _, e in spans_union]
    return sum(length(clip(spans_union, ends, s, e)) for s, e in spans)


def device_busy(result: TraceResult) -> tuple[int, int] | None:
    """(busy ns, span ns) of the device over the steps, or over the CPU activity when there are no
    steps."""
    if not result.device_union:
        return None
    spans = measured_spans(result)
    return within_lists(result.device_union, spans), sum(e - s for s, e in spans)
