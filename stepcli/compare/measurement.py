"""What `stepcli compare` knows about one side: step statistics, every step's time per run when the
input has them, and operator times. Loading (stepcli.compare.load) fills it; the verdict
(stepcli.compare.verdict) reads it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from stepcli.fmt import plural
from stepcli.stats import Stats

Kind = Literal["run", "trace"]

# One digit per step, as the run summary's phases: 0 untouched, 1 warmup, 2/3 recorded, 4 the
# program's profiler, 5 the first step after a window (it pays for the window's stop and save: in no
# population, see `set_aside`).
UNTOUCHED_PHASES = frozenset("0")
PROFILED_PHASES = frozenset("123")
AFTER_WINDOW_PHASE = "5"


@dataclass(frozen=True)
class OpTime:
    """One operator's times on one side, totals over that side's recorded steps."""

    name: str
    calls: int
    self_ms: float
    total_ms: float


@dataclass(frozen=True)
class MeasuredProcess:
    """Every step one process made: its step numbers, times (ms) and phase digits, in step order."""

    name: str
    steps: tuple[int, ...]
    times_ms: tuple[float, ...]
    phases: str  # one digit per step; traces: "2" for every recorded step


@dataclass(frozen=True)
class RunSteps:
    """One run (one program execution, all its processes); runs are what a side is resampled by."""

    label: str
    run_id: str | None
    processes: tuple[MeasuredProcess, ...]
    # run summaries: step 0 holds start-up (import, first allocation), never a sample
    start_up_step: bool

    def set_aside(self) -> int:
        """Steps of all processes left out of every population because a window had just closed
        (phase 5)."""
        return sum(process.phases.count(AFTER_WINDOW_PHASE) for process in self.processes)

    def population(self, name: str, first_step: int = 0) -> list[list[tuple[int, float]]]:
        """Per process, the (step, ms) of one population ("untouched", "profiled", "recorded") from
        `first_step`."""
        phases = (
            UNTOUCHED_PHASES
            if name == "untouched"
            else PROFILED_PHASES
            if name == "profiled"
            else None
        )
        out = []
        for process in self.processes:
            kept = [
                (step, ms)
                for step, ms, phase in zip(process.steps, process.times_ms, process.phases)
                if step >= first_step
                and not (self.start_up_step and step == 0)
                and (phases is None or phase in phases)
            ]
            if kept:
                out.append(kept)
        return out


@dataclass(frozen=True)
class OpSteps:
    """Self time (ms) of each operator in each recorded step of one run, for per-operator
    intervals."""

    label: str
    steps: tuple[tuple[int | None, int], ...]  # (rank, step) of each column
    ops: Mapping[tuple[str, str], tuple[float, ...]]  # (kind "cpu"/"device", name) -> ms per step


@dataclass(frozen=True)
class Measurement:
    """One side of a comparison, whatever file(s) it came from."""

    label: str
    kind: Kind
    steps: int  # run: global steps; trace: ProfilerStep#N annotations
    populations: Mapping[str, Stats | None]  # ordered; run: untouched, profiled; trace: recorded
    ops: tuple[OpTime, ...] = ()
    # Run summaries keep only their top operators: an op missing there may just be below the cut.
    ops_complete: bool = True
    events: int | None = None  # trace events; None for run summaries (they do not count them)
    exit_status: int | None = None  # the profiled program's, for run summaries
    empty_reason: str | None = None  # set when loading already found nothing to measure
    # Every step's time, per run; empty when the input only has statistics (a v1 summary without a
    # timeline).
    runs: tuple[RunSteps, ...] = ()
    # Traces behind each run (for per-operator attribution) and, once read, their per-step operator
    # times.
    trace_files: tuple[tuple[str, ...], ...] = ()
    op_steps: tuple[OpSteps, ...] | None = None
    # run summaries: the program each run ran (train.py, -m pkg.train)
    programs: frozenset[str] = frozenset()

    @property
    def description(self) -> str:
        what = "run summary" if self.kind == "run" else "trace"
        if len(self.runs) > 1:
            what = (
                f"{len(self.runs)} "
                f"{what.replace('summary', 'summaries') if self.kind == 'run' else 'runs of traces'}"  # noqa: E501
            )
        extra = f", {self.events} events" if self.events is not None else ""
        return f"{what}, {plural(self.steps, 'step')}{extra}"

    def nothing_measured(self) -> str | None:
        """Why this side cannot be compared at all, or None when it measured something."""
        if self.empty_reason:
            return self.empty_reason
        if self.events == 0:
            return "0 trace events"
        no_stats = all(stats is None for stats in self.populations.values())
        if self.kind == "trace" and (no_stats or self.steps == 0):
            return f"no ProfilerStep#N step annotations in its {self.events} events"
        if self.steps == 0:
            return "0 steps"
        if no_stats:
            return "no step times"
        return None
