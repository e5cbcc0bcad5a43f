"""The per-event reference analysis: one Python step per event, written to be read. The columnar
analysis (stepcli.traces.analyses.traceanalysis) must equal it; it still runs for traces whose times
pass 64-bit nanoseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepcli.traces.analyses.device import MEMORY_CATEGORIES, class_of
from stepcli.traces.analyses.ranks import is_communication
from stepcli.traces.analyses.shares import STEP_KEY, stable_name
from stepcli.traces.analyses.steps import (
    BACKWARD,
    CLOSURE,
    COMM,
    DATALOADER,
    DEVICE_CATEGORIES,
    OPTIMIZER,
    PAUSE,
    Accumulator,
    StepSpans,
    TraceResult,
    Window,
    in_steps,
    is_closure,
    phase_of,
    step_spans_of,
    union,
    wraps_backward,
)
from stepcli.traces.read.names import STEP_PREFIX, step_of

if TYPE_CHECKING:
    from stepcli.traces.read.events import Event


def analyze_events(
    events: list[Event],
    cpu: Accumulator,
    device: Accumulator,
    by_shape: bool,
    incomplete_step: int | None = None,
) -> TraceResult:
    """Nest CPU events per (pid, tid) exactly as torch's _populate_cpu_children/_remove_dup_nodes
    do, and collect what the step breakdown and device-busy figures need.

    ProfilerStep#`incomplete_step` is no step: it opens no step window, and it and its events are
    outside the steps, as time after the last step is. Host events outside every step of their
    process are counted in the result's `outside_*`, not in `cpu` (module docstring).
    """
    nesting = _Nesting(events, cpu, device, by_shape, incomplete_step)
    nesting.sort_events(events)
    for (pid, _tid), items in nesting.threads.items():
        nesting.nest_thread(pid, items)
    return nesting.result()


# (start ns, -duration ns, index in file, event), torch's order
Thread = list[tuple[int, int, int, "Event"]]


class _Nesting:
    """The state of one trace's reference analysis: device rows and spans, host events per thread,
    the operator tree being built (frames), the step windows and phase spans found."""

    def __init__(
        self,
        events: list[Event],
        cpu: Accumulator,
        device: Accumulator,
        by_shape: bool,
        incomplete_step: int | None,
    ) -> None:
        self.base = int(events[0].ts) if events else 0
        self.rows = cpu.rows
        self.dev_rows = device.rows
        self.by_shape = by_shape
        self.incomplete_step = incomplete_step
        self.threads: dict[tuple[int | str, int | str], Thread] = {}
        self.device_spans: list[tuple[int, int]] = []
        self.comm_spans: dict[int | str, list[tuple[int, int]]] = {}
        self.pids: dict[int | str, int] = {}
        # kernel -> (row name, is communication, class)
        self.device_names: dict[str, tuple[str, bool, str]] = {}
        self.class_spans: dict[str, list[tuple[int, int]]] = {
            "compute": [],
            "comm": [],
            "memory": [],
        }
        self.windows: list[Window] = []
        self.phase_spans: dict[int, list[tuple[int, int, int | str]]] = {
            DATALOADER: [],
            OPTIMIZER: [],
            BACKWARD: [],
            COMM: [],
            PAUSE: [],
            CLOSURE: [],
        }
        # name -> (row key unless it is a step, phase, could be a ProfilerStep#N): computed once per
        # distinct name
        self.name_info: dict[str, tuple[str, int, bool, bool]] = {}
        self.outside = [0, 0]  # calls, self ns of the host events outside every step
        self.step_spans: StepSpans | None = None

    def ns(self, ts: float) -> int:
        return round((ts - self.base) * 1000)

    def sort_events(self, events: list[Event]) -> None:
        """Device work into rows and spans; host events into their threads; then the steps'
        spans."""
        last_pid: int | str | None = None
        last_tid: int | str | None = None
        bucket: Thread = []
        step_events: list[Event] = []
        cut = self.launched_in_cut_step(events) if self.incomplete_step is not None else set()
        for index, event in enumerate(events):
            if event.cat in DEVICE_CATEGORIES:
                if not cut or event.args is None or event.args.correlation not in cut:
                    self.add_device(event)
                continue
            if event.cat == "python_function":
                # a Python frame: a stack view's business, not an operator (see the module
                # docstring)
                continue
            if event.cat == "user_annotation" and event.name.startswith(STEP_PREFIX):
                step_events.append(event)
            # Consecutive events are mostly on the same thread: skip the dict lookup then.
            if event.tid is not last_tid or event.pid is not last_pid:
                last_pid, last_tid = event.pid, event.tid
                bucket = self.threads.setdefault((last_pid, last_tid), [])
                self.pids[last_pid] = self.pids.get(last_pid, 0) + 1
            # (start, -duration) is torch's order: a parent sorts before a child that starts at the
            # same time.
            bucket.append((self.ns(event.ts), -round(event.dur * 1000), index, event))
        starts = [self.ns(e.ts) for e in step_events]
        self.step_spans = step_spans_of(
            ((e.pid, e.name, s, s + round(e.dur * 1000)) for e, s in zip(step_events, starts)),
            self.incomplete_step,
        )

    def launched_in_cut_step(self, events: list[Event]) -> set[int]:
        """Correlation ids of the launches made inside the incomplete step: their device work
        belongs to no recorded step (a kernel of the last complete step may still run then: the
        launch decides, not the time)."""
        name = f"{STEP_PREFIX}{self.incomplete_step}"
        spans: dict[int | str, list[tuple[int, int]]] = {}
        for event in events:
            if event.cat == "user_annotation" and event.name == name:
                start = self.ns(event.ts)
                spans.setdefault(event.pid, []).append((start, start + round(event.dur * 1000)))
        found: set[int] = set()
        for event in events if spans else ():
            if (
                event.cat in DEVICE_CATEGORIES
                or event.args is None
                or event.args.correlation is None
            ):
                continue
            if any(lo <= self.ns(event.ts) < hi for lo, hi in spans.get(event.pid, ())):
                found.add(event.args.correlation)
        return found

    def add_device(self, event: Event) -> None:
        start = self.ns(event.ts)
        dur = round(event.dur * 1000)
        self.device_spans.append((start, start + dur))
        known = self.device_names.get(event.name)
        if known is None:
            kernel_class = class_of(event.name, False)
            known = self.device_names[event.name] = (
                stable_name(event.name),
                is_communication(event.name),
                kernel_class,
            )
        self.class_spans["memory" if event.cat in MEMORY_CATEGORIES else known[2]].append(
            (start, start + dur)
        )
        if known[1]:
            self.comm_spans.setdefault("device", []).append((start, start + dur))
        key: Any = (known[0], event.shape) if self.by_shape else known[0]
        row = self.dev_rows.get(key)
        if row is None:
            self.dev_rows[key] = [1, dur, dur]
        else:
            row[0] += 1
            row[1] += dur
            row[2] += dur

    def finish(self, frame: list[Any]) -> None:
        """Count a closed frame into its row (or the outside count); torch's _remove_dup_nodes
        first: an only child with its parent's name is folded into the parent."""
        rows, outside = self.rows, self.outside
        while frame[4] == 1 and frame[5][6] == frame[6]:
            child = frame[5]
            if child[8] is not None:  # (a cut step, counted nowhere: nothing to undo)
                undo = rows[child[1]] if child[8] else outside
                undo[0] -= 1
                undo[1] -= child[2] - child[3]
                if child[8]:
                    undo[2] -= child[2]
            frame[3], frame[4], frame[5] = child[3], child[4], child[5]
        if frame[8] is None:
            return
        if not frame[8]:
            outside[0] += 1
            outside[1] += frame[2] - frame[3]
            return
        row = rows.get(frame[1])
        if row is None:
            rows[frame[1]] = [1, frame[2] - frame[3], frame[2]]
        else:
            row[0] += 1
            row[1] += frame[2] - frame[3]
            row[2] += frame[2]

    def nest_thread(self, pid: int | str, items: Thread) -> None:
        """Build one thread's operator tree with a stack of open frames, counting each frame as it
        closes."""
        items.sort()
        # frame: [end, row key, dur, children's dur, number of children, last child, name, step
        #         window or None, counted: inside a step of the process, or the trace has no
        #         complete steps (None: a cut step then, counted nowhere), phase, holds a
        #         dataloader, optimizer or backward event below it, forward candidates below it (see
        #         hand_up), is the agent's range around an optimizer's closure]
        stack: list[list[Any]] = []

        def close() -> None:
            frame = stack.pop()
            self.finish(frame)
            if frame[7] is not None:
                frame[7].children = [(s, e, 0) for s, e in frame[11]]
            if stack:
                hand_up(frame, stack[-1])

        for start, neg_dur, _index, event in items:
            end = start - neg_dur
            while stack and (start >= stack[-1][0] or end > stack[-1][0]):
                close()
            frame, phase, wraps = self.frame_for(pid, event, start, end)
            closure = event.cat == "user_annotation" and is_closure(event.name)
            if closure:
                self.phase_spans[CLOSURE].append((start, end, pid))
            frame += [phase, wraps or closure, [], closure]
            if stack:
                parent = stack[-1]
                parent[3] += frame[2]
                parent[4] += 1
                parent[5] = frame
                if parent[7] is not None:  # a step's own top-level event (steps.Window.tops)
                    parent[7].tops.append((start, end))
            stack.append(frame)
        while stack:
            close()

    def frame_for(
        self, pid: int | str, event: Event, start: int, end: int
    ) -> tuple[list[Any], int, bool]:
        """A new frame for `event`, its phase, and whether it is named for backward
        (steps.wraps_backward); opens a step window for a complete ProfilerStep#N."""
        name = event.name
        info = self.name_info.get(name)
        if info is None:
            info = self.name_info[name] = (
                stable_name(name),
                phase_of(name),
                name.startswith(STEP_PREFIX),
                wraps_backward(name),
            )
        row_key: Any = info[0]
        window = None
        if info[2] and event.cat == "user_annotation":
            row_key = STEP_KEY
            number = step_of(name)
            if number is not None and number != self.incomplete_step:
                window = Window(number, pid, start, end, [])
                self.windows.append(window)
        if self.by_shape:
            row_key = (row_key, event.shape)
        phase = info[1]
        if phase:
            self.phase_spans[phase].append((start, end, pid))
        counted: bool | None = self.step_spans is None or in_steps(self.step_spans, pid, start, end)
        if self.step_spans is None and info[2] and event.cat == "user_annotation":
            # a step cut short where none is complete: no operator, and not outside the steps
            counted = None
        # a wrapper of backward, whatever is below it
        wraps = info[3] and event.cat == "user_annotation"
        return [end, row_key, end - start, 0, 0, None, name, window, counted], phase, wraps

    def result(self) -> TraceResult:
        threads, comm_spans = self.threads, self.comm_spans
        cpu_span = None
        if self.device_spans and not self.windows and threads:
            # Only needed to place device time when there are no steps: the extent of CPU activity.
            cpu_span = (
                min(items[0][0] for items in threads.values()),
                max(
                    start - neg_dur for items in threads.values() for start, neg_dur, _, _ in items
                ),
            )
        for s, e, pid in self.phase_spans[COMM]:
            comm_spans.setdefault(pid, []).append((s, e))
        pids = self.pids
        main_pid = max(pids, key=lambda p: pids[p]) if pids else None
        # NCCL kernels: the process's device waits for the others
        if main_pid is not None and "device" in comm_spans:
            comm_spans.setdefault(main_pid, []).extend(comm_spans.pop("device"))
        comm_union = {pid: union(spans) for pid, spans in comm_spans.items()}
        return TraceResult(
            self.windows,
            self.phase_spans,
            union(self.device_spans),
            cpu_span,
            comm_union,
            main_pid,
            self.outside[0],
            self.outside[1],
            device_classes=self.device_classes(),
        )

    def device_classes(self) -> dict[str, list[tuple[int, int]]]:
        spans = self.class_spans
        unions = {label: union(spans[label]) for label in ("compute", "comm", "memory")}
        unions["comm_or_compute"] = union(spans["compute"] + spans["comm"])
        return unions


def hand_up(frame: list[Any], parent: list[Any]) -> None:
    """Pass a closed frame's forward candidates to its parent
    (stepcli.traces.analyses.stepphases.forward_candidates): an operator that is no phase is one; a
    wrapper around a dataloader, optimizer or backward event (a user's `## backward ##`) is none:
    its own candidates stand in its place. Inside an optimizer event only the agent's closure ranges
    hold candidates (the closure's forward); the optimizer's other operators are its own work."""
    phase, holds = frame[9], frame[10]
    if holds or DATALOADER <= phase <= BACKWARD:
        parent[10] = True
    if phase == OPTIMIZER:
        parent[11].extend(frame[11])  # its closures' forward, nothing else (below)
        return
    if phase:
        return  # a phase, communication or a pause: never forward
    if parent[9] == OPTIMIZER and not frame[12]:
        return  # the optimizer's own work
    if not holds:
        parent[11].append((frame[0] - frame[2], frame[0]))
    elif frame[7] is None:
        parent[11].extend(frame[11])
