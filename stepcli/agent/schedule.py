"""The wait/warmup/active schedule, with `torch.profiler.schedule` semantics. Pure; runs inside the target too."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: this module loads in every profiled process
if TYPE_CHECKING:
    from collections.abc import Iterator

# The values of torch.profiler.ProfilerAction, kept as ints so this module never needs torch.
NONE, WARMUP, RECORD, RECORD_AND_SAVE = 0, 1, 2, 3


class Schedule:
    """Which global steps the profiler warms up on and records; `repeat=0` repeats until the program ends.

    A plain immutable class rather than a dataclass: `dataclasses` costs ~5 ms to import in every process.
    """

    __slots__ = ("skip_first", "wait", "warmup", "active", "repeat")
    FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")

    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int

    def __init__(self, skip_first: int = 0, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 1) -> None:
        values = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "active": active, "repeat": repeat}
        for name, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
            if value < (1 if name == "active" else 0):
                raise ValueError(f"--{name.replace('_', '-')} must be >= {1 if name == 'active' else 0}, got {value}")
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
        """What the profiler does during global step `step` (0-based), exactly as torch.profiler.schedule."""
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

    def windows(self, limit: int = 3) -> Iterator[tuple[int, int, int]]:
        """(first warmup step, first recorded step, last recorded step) of the first `limit` cycles."""
        cycles = self.repeat if self.repeat > 0 else limit
        for index in range(min(cycles, limit)):
            first = self.skip_first + index * self.cycle + self.wait
            yield first, first + self.warmup, first + self.warmup + self.active - 1

    def describe(self) -> str:
        """One line for humans: which steps get recorded."""
        spans = [f"{a}-{b}" if a != b else f"{a}" for _, a, b in self.windows()]
        more = (
            "" if self.repeat and self.repeat <= 3 else ", ... until the program ends" if self.repeat == 0 else ", ..."
        )
        return f"recording steps {', '.join(spans)}{more} (skip-first {self.skip_first}, wait {self.wait}, warmup {self.warmup}, active {self.active}, repeat {self.repeat})"

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.FIELDS}
