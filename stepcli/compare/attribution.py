"""Attribution for `stepcli compare`: which phases of the step, then which operators and kernels,
changed their time per step, each with its own bootstrap interval, so a regression names its cause.

Needs traces on both sides (trace inputs, or the traces a run summary lists). Each recorded
ProfilerStep#N is one sample: its phase breakdown and the self time of every operator whose events
start inside that step, summarized exactly as `stepcli table` does
(stepcli.traces.analyses.traceanalysis), so the numbers agree with the tables.

Phases first: five numbers per step (data loading, forward, backward, optimizer, other/Python) whose
sum is the step, so a change anywhere shows in one of them, a `time.sleep` outside any operator
included. Operators only with OP_MIN_STEPS recorded steps per side: picking the largest of a hundred
operators' changes from a few steps names noise (a +328 ms convolution_backward from 3 steps, for a
change that was only a sleep).

A row is marked significant only when it holds the comparison's own false-positive rate (measured on
A/A pairs, the same program run twice, with scripts/aa_pairs.py; docs/commands/compare.md gives the
numbers):
- each family of rows (the phases; the operators and kernels) is judged at a Bonferroni-corrected
  level: with m candidates (every operator whose change could have been picked for the top rows, not
  only the rows shown), each row's interval is made at 1 - (1 - confidence) / m, so picking the
  largest changes cannot make noise significant;
- a job's ranks are resampled at the same steps (as the verdict's are): ranks that move together
  count once;
- its whole interval must lie beyond a practical limit, the verdict's own rule applied to the
  recorded step: max(tolerance x the baseline's mean recorded step, --min-delta-ms). With one run
  per side, the intervals cannot see run-to-run variation (the machine's load while one window
  recorded moves every one of its steps); a change smaller than the tolerance of the whole step
  explains no verdict either.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepcli.compare.inference import DEFAULT_RESAMPLES, estimate_change
from stepcli.compare.measurement import OpSteps
from stepcli.traces.analyses.shares import STEP_KEY
from stepcli.traces.read.names import step_of

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.read.columns import ColumnTrace
    from stepcli.traces.read.events import Event
    from stepcli.traces.read.tracereader import Trace
    from stepcli.traces.read.typedcolumns import Columns

TOP_CHANGES = 8
# Recorded steps per side (distinct steps per run, summed over runs) before phases, and before
# operators, are attributed: a phase is one of five sums, an operator one of many candidates, so
# operators need more evidence.
PHASE_MIN_STEPS = 5
OP_MIN_STEPS = 20
PHASE_LABELS = {
    "dataloader": "data loading",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other (Python, outside any phase)",
}


@dataclass(frozen=True)
class OpChange:
    """One operator's mean self time per step on both sides, and the interval of the change (ms)."""

    kind: str  # "phase", "cpu" or "device"
    name: str
    baseline_ms: float
    current_ms: float
    low: float
    high: float
    limit_ms: float = 0.0  # the practical limit its interval must lie beyond (module docstring)
    row_confidence: float = 0.95  # the level of its own interval (Bonferroni over its family)
    # the rows of its family that were candidates: phases, or operators and kernels
    family_size: int = 1

    @property
    def delta_ms(self) -> float:
        return self.current_ms - self.baseline_ms

    @property
    def significant(self) -> bool:
        return self.low > self.limit_ms or self.high < -self.limit_ms


def op_steps_from_traces(traces: Sequence[Trace | ColumnTrace], label: str) -> OpSteps:
    """Self time per operator in each recorded step of each trace: each step's events (from its
    start up to the next step's start: kernels a step launched may run after its CPU side ended)
    summarized as `stepcli table` summarizes a trace, all steps of a trace in one array pass
    (stepcli.traces.analyses.stepops); a step that pass leaves to it, or a trace it cannot take, is
    summarized alone. A trace read into columns (ColumnTrace, as `compare` reads them) has its steps
    found and cut from its columns, with no object per event."""
    import numpy as np

    from stepcli.traces.analyses.stepops import step_times
    from stepcli.traces.read.columns import ColumnTrace

    columns_of: list[tuple[int | None, int]] = []
    # (first column, count, times)
    blocks: list[tuple[int, int, dict[tuple[str, str], np.ndarray]]] = []
    # column -> times of a step summarized alone
    alone: dict[int, dict[tuple[str, str], float]] = {}
    for trace in traces:
        source = None
        events: list[Event] | None = None
        if isinstance(trace, ColumnTrace):
            # as sorted() orders events
            source = (trace.columns, np.argsort(trace.columns.ts, kind="stable"))
            windows, segments = _step_segments_of_columns(source, trace.incomplete_step)
        else:
            events = sorted(trace.events, key=lambda e: e.ts)
            windows, segments = _step_segments(events, trace.incomplete_step)
        fast = step_times(events or [], segments, source) if segments else None
        first = len(columns_of)
        if fast is not None:
            blocks.append((first, len(segments), fast.times))
        for index, ((lo, hi), (_start, _end, step)) in enumerate(zip(segments, windows)):
            if fast is None or index in fast.fallback:
                # (a ColumnTrace: its events, for the few steps summarized alone)
                if events is None:
                    events = sorted(_events_of(trace), key=lambda e: e.ts)
                alone[first + index] = _step_alone(events[lo:hi], trace.path)
            columns_of.append((trace.rank, step))
    keys = sorted(
        {key for _first, _count, times in blocks for key in times}
        | {key for figures in alone.values() for key in figures}
    )
    ops = {}
    for key in keys:
        values = np.zeros(len(columns_of))
        for first, count, times in blocks:
            if key in times:
                values[first : first + count] = times[key]
        for column, figures in alone.items():
            values[column] = figures.get(key, 0.0)
        ops[key] = tuple(values.tolist())
    return OpSteps(label=label, steps=tuple(columns_of), ops=ops)


def _events_of(trace: Trace | ColumnTrace) -> list[Event]:
    from stepcli.traces.read.columns import ColumnTrace

    return trace.columns.to_events() if isinstance(trace, ColumnTrace) else trace.events


Windows = list[tuple[float, float, int]]  # each recorded step's (start, end, number), by start


def _step_segments(
    events: list[Event], incomplete: int | None
) -> tuple[Windows, list[tuple[int, int]]]:
    """The recorded steps of events sorted by start, and each one's events: [lo, hi) from its start
    up to the next step's start (or its own end, when later)."""
    starts = [e.ts for e in events]
    numbered = ((e, step_of(e.name)) for e in events if e.cat == "user_annotation")
    windows = sorted(
        (e.ts, e.ts + e.dur, number)
        for e, number in numbered
        if number is not None and number != incomplete
    )
    segments = []
    for index, (start, end, _step) in enumerate(windows):
        stop = windows[index + 1][0] if index + 1 < len(windows) else end
        segments.append(
            (bisect.bisect_left(starts, start), bisect.bisect_left(starts, max(stop, end)))
        )
    return windows, segments


def _step_segments_of_columns(
    source: tuple[Columns, np.ndarray], incomplete: int | None
) -> tuple[Windows, list[tuple[int, int]]]:
    """_step_segments of a trace's columns and the order that sorts them by start: the same windows
    and segments."""
    import numpy as np

    from stepcli.traces.read.typedcolumns import USER_ANNOTATION

    columns, order = source
    starts = columns.ts[order]
    rows = np.nonzero(columns.kind == USER_ANNOTATION)[0]
    names = columns.names
    windows = sorted(
        (ts, ts + dur, number)
        for ts, dur, code in zip(
            columns.ts[rows].tolist(), columns.dur[rows].tolist(), columns.name[rows].tolist()
        )
        if (number := step_of(names[code])) is not None and number != incomplete
    )
    if not windows:
        return windows, []
    start = np.array([w[0] for w in windows])
    end = np.array([w[1] for w in windows])
    stop = np.append(start[1:], end[-1])
    lo = np.searchsorted(starts, start, side="left")
    hi = np.searchsorted(starts, np.maximum(stop, end), side="left")
    return windows, list(zip(lo.tolist(), hi.tolist()))


def _step_alone(events: list[Event], path: str) -> dict[tuple[str, str], float]:
    """One step's figures from its events summarized alone, as `stepcli table` would."""
    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.tracereader import Trace as TraceType

    summary = summarize([TraceType.from_events(events, path=path)])
    times = {("cpu", op.name): op.self_ms for op in summary.cpu_ops if op.name != STEP_KEY}
    times.update({("device", op.name): op.self_ms for op in summary.device_kernels})
    if summary.breakdown_ms is not None:
        times.update({("phase", label): ms for label, ms in summary.breakdown_ms.to_dict().items()})
    return times


def recorded_steps(runs: Sequence[OpSteps]) -> int:
    """Distinct recorded steps per run, summed over runs (ranks that step together count once)."""
    return sum(len({step for _rank, step in run.steps}) for run in runs)


def attribution_note(baseline: Sequence[OpSteps], current: Sequence[OpSteps]) -> str | None:
    """Why phases or operators are not attributed, or None when both are."""
    steps = min(recorded_steps(baseline), recorded_steps(current))
    if steps >= OP_MIN_STEPS:
        return None
    if steps >= PHASE_MIN_STEPS:
        return (
            f"attributed by phase only: {steps} recorded steps on the smaller side, operators need "
            f"at least {OP_MIN_STEPS} per side, so no operator change is judged (record more with "
            f"--active)"
        )
    return (
        f"no attribution: {steps} recorded steps on the smaller side, phases need at least "
        f"{PHASE_MIN_STEPS} and operators {OP_MIN_STEPS} per side, so no phase or operator change "
        f"is judged (record more with --active)"
    )


def attribute(
    baseline: Sequence[OpSteps],
    current: Sequence[OpSteps],
    *,
    confidence: float,
    tolerance: float = 0.0,
    min_delta_ms: float = 0.0,
    top: int = TOP_CHANGES,
) -> tuple[OpChange, ...]:
    """Every phase whose time per step changed, then the `top` operators whose mean self time per
    step changed most (each only with enough recorded steps), each with its bootstrap interval at
    its family's corrected level and the practical limit it must pass to be significant (see the
    module docstring).

    Steps are resampled in blocks within each run, and runs are resampled when a side has several
    (as for the step time), so an interval carries the same kinds of noise as the verdict's.
    """
    base_runs = [run for run in baseline if run.steps]
    cur_runs = [run for run in current if run.steps]
    steps = min(recorded_steps(base_runs), recorded_steps(cur_runs))
    if steps < PHASE_MIN_STEPS:
        return ()
    keys = {key for run in base_runs + cur_runs for key in run.ops}
    phases = [key for key in keys if key[0] == "phase"]
    operators = [key for key in keys if key[0] != "phase"] if steps >= OP_MIN_STEPS else []
    step_ms = sum(_mean(base_runs, key) for key in phases)  # the phases add up to the recorded step
    limit = max(min_delta_ms, tolerance * step_ms)
    return _changes(base_runs, cur_runs, phases, confidence, len(phases), limit) + _changes(
        base_runs, cur_runs, operators, confidence, top, limit
    )


def row_level(confidence: float, candidates: int) -> float:
    """The confidence of each row's interval in a family of `candidates` rows (Bonferroni): the
    chance that any row of an unchanged family is called significant stays within 1 - confidence."""
    return 1 - (1 - confidence) / max(1, candidates)


def _resamples(level: float) -> int:
    """Enough resamples for the interval's tails at `level` (about ten beyond each end), at least
    the verdict's 2,000, at most 100,000 (a row is a few dozen steps: a fraction of a second)."""
    return min(100_000, max(DEFAULT_RESAMPLES, math.ceil(20 / (1 - level))))


def _series(runs: list[OpSteps], key: tuple[str, str]) -> list[list[list[float]]]:
    """Per run, per rank (one process each), the key's time in each recorded step in step order: the
    ranks of a job are resampled at the same steps, as the verdict's are, so ranks that move
    together count once."""
    out = []
    for run in runs:
        by_rank: dict[int | None, list[tuple[int, float]]] = {}
        for (rank, step), value in zip(run.steps, run.ops.get(key, (0.0,) * len(run.steps))):
            by_rank.setdefault(rank, []).append((step, value))
        ranks = sorted(by_rank, key=lambda rank: (rank is None, rank or 0))
        out.append([[value for _, value in sorted(by_rank[rank])] for rank in ranks])
    return out


def _mean(runs: list[OpSteps], key: tuple[str, str]) -> float:
    values = [v for run in _series(runs, key) for process in run for v in process]
    return sum(values) / len(values) if values else 0.0


def _changes(
    base_runs: list[OpSteps],
    cur_runs: list[OpSteps],
    keys: list[tuple[str, str]],
    confidence: float,
    top: int,
    limit: float,
) -> tuple[OpChange, ...]:
    """The `top` keys by absolute change of their mean per step, each with its interval of the
    difference at the level corrected for every key of the family (all were candidates for the
    top)."""
    level = row_level(confidence, len(keys))
    deltas = sorted(
        ((_mean(cur_runs, k) - _mean(base_runs, k), k) for k in keys),
        key=lambda d: (-abs(d[0]), d[1]),
    )
    changes = []
    for delta, key in deltas[:top]:
        if delta == 0:
            break
        change = estimate_change(
            _series(base_runs, key),
            _series(cur_runs, key),
            "mean",
            confidence=level,
            resamples=_resamples(level),
            log_scale=False,
        )
        changes.append(
            OpChange(
                key[0],
                key[1],
                change.baseline,
                change.current,
                change.low,
                change.high,
                limit,
                level,
                len(keys),
            )
        )
    return tuple(changes)
