"""The wait/warmup/active schedule, with `torch.profiler.schedule` semantics. Pure; runs inside the
target too."""

from __future__ import annotations

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

# The values of torch.profiler.ProfilerAction, kept as ints so this module never needs torch.
NONE, WARMUP, RECORD, RECORD_AND_SAVE = 0, 1, 2, 3


class Schedule:
    """Which global steps the profiler warms up on and records; `repeat=0` repeats until the program
    ends.

    A plain immutable class rather than a dataclass: `dataclasses` costs ~5 ms to import in every
    process.
    """

    __slots__ = ("skip_first", "wait", "warmup", "active", "repeat")
    FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")

    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int

    def __init__(
        self, skip_first: int = 0, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 1
    ) -> None:
        values = {
            "skip_first": skip_first,
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": repeat,
        }
        for name, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
            if value < (1 if name == "active" else 0):
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= {1 if name == 'active' else 0}, got "
                    f"{value}"
                )
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Schedule is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().values()))

    def __repr__(self) -> str:
        return "Schedule(" + ", ".join(f"{k}={v}" for k, v in self.to_dict().items()) + ")"

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def action(self, step: int) -> int:
        """What the profiler does during global step `step` (0-based), exactly as
        torch.profiler.schedule."""
        if step < self.skip_first:
            return NONE
        step -= self.skip_first
        if self.repeat > 0 and step >= self.repeat * self.cycle:
            return NONE
        phase = step % self.cycle
        if phase < self.wait:
            return NONE
        if phase < self.wait + self.warmup:
            return WARMUP
        return RECORD if phase < self.cycle - 1 else RECORD_AND_SAVE

    def starts_cycle(self, step: int) -> bool:
        """True when `step` is the first profiled (warmup or recorded) step of a cycle."""
        if self.action(step) == NONE:
            return False
        return step == 0 or self.action(step - 1) in (NONE, RECORD_AND_SAVE)

    def next_profiled_step(self, step: int) -> int | None:
        """The first step >= `step` that the profiler touches, or None when no cycle is left."""
        if step < self.skip_first:
            step = self.skip_first
        offset = step - self.skip_first
        cycle_index, phase = divmod(offset, self.cycle)
        if self.repeat > 0 and cycle_index >= self.repeat:
            return None
        if phase >= self.wait:
            return step
        return self.skip_first + cycle_index * self.cycle + self.wait

    def _cycle_base(self, step: int) -> int:
        """The first step (its wait phase) of the cycle `step` falls in; `step` is past
        `skip_first`."""
        return self.skip_first + (step - self.skip_first) // self.cycle * self.cycle

    def next_cycle_start(self, step: int) -> int | None:
        """The first step >= `step` at which a cycle's first profiled step begins (never mid-cycle),
        or None."""
        candidate = self.next_profiled_step(step)
        if candidate is None or self.starts_cycle(candidate):
            return candidate
        # the next cycle's first one
        return self.next_profiled_step(self._cycle_base(candidate) + self.cycle)

    def cycle_end(self, step: int) -> int:
        """The last step (RECORD_AND_SAVE) of the cycle that profiled step `step` belongs to."""
        return self._cycle_base(step) + self.cycle - 1

    def recorded_span(self, step: int) -> tuple[int, int]:
        """(first, last) recorded step of the cycle that profiled step `step` belongs to, from
        `step` on."""
        base = self._cycle_base(step)
        return max(step, base + self.wait + self.warmup), base + self.cycle - 1

    def last_step(self) -> int | None:
        """The last step any cycle profiles, or None when cycles repeat until the program ends."""
        return self.skip_first + self.repeat * self.cycle - 1 if self.repeat > 0 else None

    def windows(self, limit: int = 3) -> Iterator[tuple[int, int, int]]:
        """(first warmup step, first recorded step, last recorded step) of the first `limit`
        cycles."""
        cycles = self.repeat if self.repeat > 0 else limit
        for index in range(min(cycles, limit)):
            first = self.skip_first + index * self.cycle + self.wait
            yield first, first + self.warmup, first + self.warmup + self.active - 1

    def describe(self) -> str:
        """One line for humans: which steps get recorded."""
        spans = [f"{a}-{b}" if a != b else f"{a}" for _, a, b in self.windows()]
        more = (
            ""
            if self.repeat and self.repeat <= 3
            else ", ... until the program ends"
            if self.repeat == 0
            else ", ..."
        )
        # `--active 1`: "recording step 2"
        one = len(spans) == 1 and "-" not in spans[0] and not more
        # the options at their defaults (skip-first 0, repeat 1) are left out: the line fits 80
        # columns
        options = [f"skip-first {self.skip_first}"] if self.skip_first else []
        options += [f"wait {self.wait}", f"warmup {self.warmup}", f"active {self.active}"]
        options += [f"repeat {self.repeat}"] if self.repeat != 1 else []
        return f"recording step{'' if one else 's'} {', '.join(spans)}{more} ({', '.join(options)})"

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.FIELDS}


class WindowSchedule:
    """The run's schedule (None with `--on-demand`) plus the windows asked for on demand.

    Answers `action`, `starts_cycle`, `next_profiled_step`, `next_cycle_start` and `recorded_span`
    like `Schedule`, so the recorder drives both kinds of window the same way. Every answer costs a
    few operations per window (a process holds a handful at most), never one per step of a window: a
    window of a million steps or one a million steps ahead is as cheap as one of three.
    """

    def __init__(self, base: Schedule | None) -> None:
        self.base = base
        # (first warmup step, first recorded step, last step)
        self.windows: list[tuple[int, int, int]] = []

    def add(self, open_at: int, first: int, last: int) -> None:
        self.windows.append((open_at, first, last))

    def remove(self, first: int, last: int) -> tuple[int, int, int] | None:
        """Take back the on-demand window recording `first`-`last` (its capture withdrew it)."""
        for window in self.windows:
            if window[1:] == (first, last):
                self.windows.remove(window)
                return window
        return None

    def forget_before(self, step: int) -> None:
        self.windows = [w for w in self.windows if w[2] >= step]

    def on_demand(self, step: int) -> bool:
        """Whether `step` belongs to a window asked for on demand."""
        return any(open_at <= step <= last for open_at, _, last in self.windows)

    def action(self, step: int) -> int:
        for open_at, first, last in self.windows:
            if open_at <= step <= last:
                return WARMUP if step < first else RECORD_AND_SAVE if step == last else RECORD
        return self.base.action(step) if self.base is not None else NONE

    def starts_cycle(self, step: int) -> bool:
        if self.action(step) == NONE:
            return False
        return step == 0 or self.action(step - 1) in (NONE, RECORD_AND_SAVE)

    def next_profiled_step(self, step: int) -> int | None:
        candidates = [max(step, open_at) for open_at, _, last in self.windows if last >= step]
        if self.base is not None:
            scheduled = self.base.next_profiled_step(step)
            if scheduled is not None:
                candidates.append(scheduled)
        return min(candidates, default=None)

    def next_cycle_start(self, step: int) -> int | None:
        """The first step >= `step` at which a window (scheduled or on demand) begins; None when
        none is left."""
        candidates = [open_at for open_at, _, _ in self.windows if open_at >= step]
        if self.base is not None:
            # requests never overlap it (see first_busy)
            scheduled = self.base.next_cycle_start(step)
            if scheduled is not None:
                candidates.append(scheduled)
        return min(candidates, default=None)

    def recorded_span(self, step: int) -> tuple[int, int]:
        """(first, last) recorded step of the window profiled step `step` belongs to, from `step`
        on."""
        for open_at, first, last in self.windows:
            if open_at <= step <= last:
                return max(step, first), last
        if self.base is not None and self.base.action(step) != NONE:
            return self.base.recorded_span(step)
        return step, step

    def first_busy(self, start: int, end: int) -> int | None:
        """The first step in [start, end] some window (scheduled or on demand) already uses."""
        hits = [
            max(start, open_at)
            for open_at, _, last in self.windows
            if open_at <= end and last >= start
        ]
        if self.base is not None:
            scheduled = self.base.next_profiled_step(start)
            if scheduled is not None and scheduled <= end:
                hits.append(scheduled)
        return min(hits, default=None)
