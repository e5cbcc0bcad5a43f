"""Replaying one device's allocator history: allocated and reserved bytes after every event, per step.

The history is a ring (`max_entries`): it may start with memory already allocated. That memory is known from
its end: a block still allocated in the snapshot's segments that the history never allocated was there from
the start, and a free of an address the history never allocated frees memory that was there from the start.
Bytes count as allocated from `alloc` to `free_completed` (to `free_requested` in a history recorded without
`free_completed` events), as torch's own `_memory_viz.trace` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepcli.snapshots.reader import Entry, Segment

ALLOCATED_STATES = ("active_allocated",)


class Live:
    """One allocation alive in the replay."""

    __slots__ = ("size", "stack", "step")

    def __init__(self, size: int, stack: int, step: int | None) -> None:
        self.size, self.stack, self.step = size, stack, step


@dataclass
class StepFigures:
    step: int
    start_allocated: int  # allocated when the step's first event happened
    peak_allocated: int
    start_reserved: int
    peak_reserved: int
    complete: bool  # not the first step of the history, whose start the ring may have dropped


@dataclass
class Replay:
    """Totals over the history, and the live allocations at `stop` (an index into the entries)."""

    entries: list[Entry]
    segments: list[Segment]
    stop: int | None = None  # replay entries[:stop]; None: all
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_index: int = -1  # the entry that reached the peak (-1: the start)
    oom_index: int = -1  # the last `oom` entry
    live: dict[int, Live] = field(default_factory=dict)
    steps: dict[int, StepFigures] = field(default_factory=dict)
    survivors: dict[int, dict[int, int]] = field(default_factory=dict)  # step -> stack -> bytes alive 2 steps on

    def run(self) -> Replay:
        entries = self.entries if self.stop is None else self.entries[: self.stop]
        free_action = "free_completed" if any(e.action == "free_completed" for e in self.entries) else "free_requested"
        self._initial_state(free_action)
        self.peak_allocated = self.allocated
        by_step: dict[int, set[int]] = {}  # step -> addresses allocated in it and still alive
        current: int | None = None
        for index, entry in enumerate(entries):
            if entry.step is not None and entry.step != current:
                current = entry.step
                self._step_started(current, by_step, complete=bool(self.steps))
            action = entry.action
            if action == "alloc":
                self.live[entry.addr] = Live(entry.size, entry.stack, entry.step)
                self.allocated += entry.size
                if entry.step is not None:
                    by_step.setdefault(entry.step, set()).add(entry.addr)
                if self.allocated > self.peak_allocated:
                    self.peak_allocated, self.peak_index = self.allocated, index
            elif action == free_action:
                gone = self.live.pop(entry.addr, None)
                self.allocated -= gone.size if gone is not None else entry.size
                if gone is not None and gone.step is not None:
                    by_step.get(gone.step, set()).discard(entry.addr)
            elif action in ("segment_alloc", "segment_map"):
                self.reserved += entry.size
            elif action in ("segment_free", "segment_unmap"):
                self.reserved -= entry.size
            elif action == "oom":
                self.oom_index = index
            if current is not None:
                figures = self.steps[current]
                figures.peak_allocated = max(figures.peak_allocated, self.allocated)
                figures.peak_reserved = max(figures.peak_reserved, self.reserved)
        return self

    def _initial_state(self, free_action: str) -> None:
        """What was allocated and reserved before the history's first event."""
        allocated_in_history: set[int] = set()
        for entry in self.entries:
            if entry.action == "alloc":
                allocated_in_history.add(entry.addr)
            elif entry.action == free_action and entry.addr not in allocated_in_history and entry.addr not in self.live:
                self.live[entry.addr] = Live(entry.size, 0, None)
        for segment in self.segments:
            for block in segment.blocks:
                if block.state in ALLOCATED_STATES and block.address not in allocated_in_history:
                    self.live.setdefault(block.address, Live(block.size, block.stack, None))
        self.allocated = sum(live.size for live in self.live.values())
        reserved_end = sum(segment.total_size for segment in self.segments)
        grown = sum(e.size for e in self.entries if e.action in ("segment_alloc", "segment_map"))
        shrunk = sum(e.size for e in self.entries if e.action in ("segment_free", "segment_unmap"))
        self.reserved = max(reserved_end - grown + shrunk, 0)

    def _step_started(self, step: int, by_step: dict[int, set[int]], complete: bool) -> None:
        if step in self.steps:  # an untagged stretch inside a step (another thread): the same step goes on
            return
        self.steps[step] = StepFigures(step, self.allocated, self.allocated, self.reserved, self.reserved, complete)
        older = step - 2
        if older in by_step:
            alive: dict[int, int] = {}
            for addr in by_step.pop(older):
                live = self.live.get(addr)
                if live is not None:
                    alive[live.stack] = alive.get(live.stack, 0) + live.size
            self.survivors[older] = alive
