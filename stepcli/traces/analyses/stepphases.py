"""The host events and the steps' phases on typed arrays, for the columnar pass
(stepcli.traces.analyses.traceanalysis) and the per-step figures (stepcli.traces.analyses.stepops).

The host events are the CPU events nested and folded (stepcli.traces.analyses.arrays), with
which of them are steps; a window per complete step; the phases (dataloader, optimizer,
backward, forward, other) summed over the windows with array operations per process, equal to
the per-window reference (stepcli.traces.analyses.steps.step_phases), which still measures
windows of one process that overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepcli.traces.analyses.results import PHASES
from stepcli.traces.analyses.steps import (
    BACKWARD,
    CLOSURE,
    COMM,
    DATALOADER,
    OPTIMIZER,
    StepSpans,
    Window,
    is_closure,
    phase_of,
    wraps_backward,
)
from stepcli.traces.read.names import STEP_PREFIX, step_of

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.analyses.arrays import Nanoseconds
    from stepcli.traces.read.typedcolumns import Columns


@dataclass(frozen=True)
class HostEvents:
    """The CPU events nested and folded (stepcli.traces.analyses.arrays.analysis_arrays), in
    its order, with the columns every later step reads, and which of them are steps
    (ProfilerStep#N annotations)."""

    arrays: dict[str, np.ndarray]  # analysis_arrays' answer: kept, self, dur, in_file...
    index: np.ndarray  # each event's position in the columns
    start: np.ndarray
    end: np.ndarray
    parent: np.ndarray  # each event's enclosing one (its position here), -1 at the top level
    name: np.ndarray  # name codes
    pid_code: np.ndarray
    is_step: np.ndarray
    step_rows: np.ndarray  # the positions of the steps


def host_events(columns: Columns, ns: Nanoseconds) -> HostEvents:
    """The host events, read once for the operator rows, the steps' phases and the main process."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    a = col.analysis_arrays(columns, ns)
    index = a["index"]
    name = columns.name[index]
    step_name = np.array([n.startswith(STEP_PREFIX) for n in columns.names] or [False], bool)
    is_step = step_name[name] & (columns.kind[index] == typedcolumns.USER_ANNOTATION)
    pid_code = columns.pid[index]
    step_rows = np.nonzero(is_step)[0]
    start, end, parent = a["start"], a["end"], a["parent"]
    return HostEvents(a, index, start, end, parent, name, pid_code, is_step, step_rows)


@dataclass(frozen=True)
class StepPhases:
    """The complete steps as windows and their phases: the totals when measured on arrays (else
    None, and the windows hold what the per-window `step_phases` measures), each phase's spans."""

    windows: list[Window]
    phase_spans: dict[int, list[tuple[int, int, int | str]]]
    phase_totals: tuple[dict[str, int], int] | None
    other_inside: int | None


def measure_step_phases(
    columns: Columns,
    host: HostEvents,
    incomplete_step: int | None,
) -> StepPhases:
    """Measure the steps' phases on arrays, unless two windows of one process overlap: then fill
    the windows for the per-window reference (steps.step_phases), which measures those."""
    import numpy as np

    from stepcli.traces.read import typedcolumns

    names = columns.names
    start, end, parent, pid_code = host.start, host.end, host.parent, host.pid_code
    annotation = columns.kind[host.index] == typedcolumns.USER_ANNOTATION
    phase = np.array([phase_of(n) for n in names] or [0], np.int8)[host.name]
    by_row = _complete_windows(columns, host, incomplete_step)
    wrapper_name = np.array([wraps_backward(n) for n in names] or [False], bool)
    named = wrapper_name[host.name] & annotation & ~host.is_step
    closure_name = np.array([is_closure(n) for n in names] or [False], bool)
    closure = closure_name[host.name] & annotation
    steps = list(by_row)
    forward, forward_row = forward_candidates(parent, phase, steps, named, closure)
    measured = _phase_totals_arrays(
        steps,
        start,
        end,
        phase,
        closure,
        pid_code,
        forward,
        forward_row,
        parent,
    )
    phase_totals, other_inside = _measured_parts(measured)
    # The phase spans and the steps' children feed the per-window reference (`step_phases`);
    # with the totals already measured on arrays, only communication spans are still needed.
    closure_ranges = closure if phase_totals is None else None
    phase_spans = _phase_spans(phase, closure_ranges, start, end, pid_code, columns.ids)
    if by_row and phase_totals is None:
        _fill_windows(by_row, forward, forward_row, parent, start, end)
    return StepPhases(list(by_row.values()), phase_spans, phase_totals, other_inside)


def _complete_windows(
    columns: Columns,
    host: HostEvents,
    incomplete_step: int | None,
) -> dict[int, Window]:
    """A window per complete step, by the step's position in `host`: the incomplete step (a
    window cut short) holds only the start of its step."""
    by_row: dict[int, Window] = {}
    for row in host.step_rows.tolist():
        number = step_of(columns.names[int(host.name[row])])
        if number is not None and number != incomplete_step:
            pid = columns.ids[int(host.pid_code[row])]
            by_row[row] = Window(number, pid, int(host.start[row]), int(host.end[row]), [])
    return by_row


def _measured_parts(
    measured: tuple[dict[str, int], int, int] | None,
) -> tuple[tuple[dict[str, int], int] | None, int | None]:
    """_phase_totals_arrays' answer as (phase totals and steps, other inside operators), both None
    unmeasured."""
    return (None, None) if measured is None else ((measured[0], measured[1]), measured[2])


def _fill_windows(
    by_row: dict[int, Window], forward: Any, forward_row: Any, parent: Any, start: Any, end: Any
) -> None:
    """The windows' forward candidates and top-level events, for the per-window `step_phases`."""
    import numpy as np

    for row, s, e in zip(forward_row.tolist(), start[forward].tolist(), end[forward].tolist()):
        by_row[row].children.append((s, e, 0))
    top = np.nonzero(parent >= 0)[0]
    for row, s, e in zip(parent[top].tolist(), start[top].tolist(), end[top].tolist()):
        if row in by_row:
            by_row[row].tops.append((s, e))


def _phase_spans(
    phase: Any, closure: Any, start: Any, end: Any, pid_code: Any, ids: list[int | str]
) -> dict[int, list[tuple[int, int, int | str]]]:
    """Per phase, its events' (start, end, pid): communication only when `closure` is None (the
    totals are measured on arrays), else every phase and the closure ranges (steps.CLOSURE), for the
    per-window `step_phases`."""
    import numpy as np

    spans: dict[int, list[tuple[int, int, int | str]]] = {
        DATALOADER: [],
        OPTIMIZER: [],
        BACKWARD: [],
        COMM: [],
        CLOSURE: [],
    }
    with_phase = np.nonzero(phase == COMM if closure is None else (phase > 0) & (phase <= COMM))[0]
    codes = phase[with_phase].tolist()
    if closure is not None:
        at = np.nonzero(closure)[0]
        with_phase = np.concatenate((with_phase, at))
        codes += [CLOSURE] * len(at)
    for p, s, e, pid in zip(
        codes, start[with_phase].tolist(), end[with_phase].tolist(), pid_code[with_phase].tolist()
    ):
        spans[p].append((s, e, ids[pid]))
    return spans


def in_steps_array(spans: StepSpans, pid: Any, start: Any, end: Any) -> Any:
    """`in_steps` for arrays of events (pid codes, as `spans` is keyed): a boolean array."""
    import numpy as np

    inside = np.zeros(len(pid), bool)
    for code, (spans_of_pid, ends) in spans.items():
        mine = pid == code
        # mostly one process: no copies then
        rows: Any = slice(None) if mine.all() else np.nonzero(mine)[0]
        first = np.array([s for s, _ in spans_of_pid], np.int64)
        # first span ending later
        after = np.searchsorted(np.array(ends, np.int64), start[rows], side="right")
        reach = np.maximum(end[rows], start[rows] + 1)
        inside[rows] = (after < len(spans_of_pid)) & (
            first[np.minimum(after, len(spans_of_pid) - 1)] < reach
        )
    return inside


def forward_candidates(
    parent: Any, phase: Any, rows: list[int], named: Any, closure: Any
) -> tuple[Any, Any]:
    """The steps' forward candidates (`step_phases`): the events, and the step event (at `rows`) of
    each.

    A step's top-level operator that is no phase is forward. A wrapper around a phase (a user's `##
    backward ##` around the autograd engine's events, Lightning's `[pl][profile]...backward`) is no
    operator of its own: its children stand in its place, so that naming a phase never moves the
    time between its events to forward. `named`: the user annotations named for backward
    (steps.wraps_backward), wrappers whatever is below them. `closure`: the agent's ranges around an
    optimizer's closure (steps.is_closure), wrappers too, and the only events inside an optimizer
    event whose children can be forward: the optimizer's other operators are its own."""
    import numpy as np

    n = len(parent)
    # holds a dataloader, optimizer or backward event somewhere below it (or wraps one)
    contains = named | closure
    below = np.nonzero(((phase >= DATALOADER) & (phase <= BACKWARD)) | named)[0]
    while below.size:
        up = parent[below]
        up = up[up >= 0]
        up = up[~contains[up]]
        contains[up] = True
        below = up
    owner = np.full(n, -1, np.int64)  # the step event an event is a candidate of, through wrappers
    owner[np.array(rows, np.int64)] = np.array(rows, np.int64)
    is_row = owner >= 0
    # Parents come before their children in this order: one pass over the wrappers (few) reaches
    # every depth. An optimizer event passes its step on only to what is an optimizer event or a
    # closure range below it.
    passing = (contains & (phase == 0)) | (phase == OPTIMIZER)
    for wrapper in np.nonzero(passing & ~is_row)[0].tolist():
        up = int(parent[wrapper])
        if (
            up >= 0
            and owner[up] >= 0
            and (phase[up] != OPTIMIZER or closure[wrapper] or phase[wrapper] == OPTIMIZER)
        ):
            owner[wrapper] = owner[up]
    candidate = np.nonzero((parent >= 0) & (phase == 0) & ~contains)[0]
    candidate = candidate[(owner[parent[candidate]] >= 0) & (phase[parent[candidate]] == 0)]
    return candidate, owner[parent[candidate]]


def _phase_totals_arrays(
    rows: list[int],
    start: Any,
    end: Any,
    phase: Any,
    closure: Any,
    pid_code: Any,
    forward: Any,
    forward_row: Any,
    parent: Any,
) -> tuple[dict[str, int], int, int] | None:
    """`step_phases` summed over the windows (the step events at `rows`; `forward` the forward
    candidates and `forward_row` the step of each, from forward_candidates; `closure` the agent's
    closure ranges, which with the backward nested in an optimizer event are no optimizer time:
    steps.optimizer_own), with array operations per process
    (stepcli.traces.analyses.arrays.step_phases) instead of a Python step per span. None when two
    windows of one process overlap: the per-window reference measures those. The third figure is the
    part of "other" inside the steps' top-level operators (`parent`: each event's): what no phase
    claims of a wrapper or a closure range."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col

    totals = dict.fromkeys(PHASES, 0)
    inside = 0
    if not rows:
        return totals, 0, 0
    at = np.array(rows, np.int64)
    window_pid, window_start, window_end = pid_code[at], start[at], end[at]
    window_of = np.full(len(start), -1, np.int64)
    window_of[at] = np.arange(len(at))
    child, child_window = forward, window_of[forward_row]
    top = np.nonzero(parent >= 0)[0]
    top = top[window_of[parent[top]] >= 0]  # the steps' own top-level events, whatever their phase
    top_window = window_of[parent[top]]
    for pid in sorted(set(window_pid.tolist())):  # (np.unique would import numpy.ma: 10 ms)
        mine = np.nonzero(window_pid == pid)[0]
        by_start = mine[np.argsort(window_start[mine], kind="stable")]
        if np.any(window_start[by_start][1:] < window_end[by_start][:-1]):
            return None
        of_pid = pid_code == pid
        spans = [np.nonzero(of_pid & (phase == p))[0] for p in (DATALOADER, OPTIMIZER, BACKWARD)]
        phase_start, phase_end = [start[e] for e in spans], [end[e] for e in spans]
        if len(spans[1]):
            phase_start[1], phase_end[1] = col.optimizer_own(
                start, end, spans[1], spans[2], np.nonzero(of_pid & closure)[0]
            )
        of_window = window_pid[child_window] == pid
        forward_of, forward_events = child_window[of_window], child[of_window]
        of_top = window_pid[top_window] == pid
        top_of, top_events = top_window[of_top], top[of_top]
        # Forward as a fourth phase, then every top-level event: what that claims is "other" inside
        # an operator.
        parts = col.step_phases(
            window_start[mine],
            window_end[mine],
            [*phase_start, np.maximum(start[forward_events], window_start[forward_of])],
            [*phase_end, np.minimum(end[forward_events], window_end[forward_of])],
            np.maximum(start[top_events], window_start[top_of]),
            np.minimum(end[top_events], window_end[top_of]),
        )
        for label, values in zip(PHASES, [*parts[:4], parts[4] + parts[5]]):
            totals[label] += int(values.sum())
        inside += int(parts[4].sum())
    return totals, len(rows), inside
