"""Replaying one device's allocator history: allocated and reserved bytes after every event, per
step.

The history is a ring (`max_entries`): it may start with memory already allocated. That memory is
known from its end: a block still allocated in the snapshot's segments that the history never
allocated was there from the start, and a free of an address the history never allocated frees
memory that was there from the start. Bytes count as allocated from `alloc` to `free_completed` (to
`free_requested` in a history recorded without `free_completed` events), as torch's own
`_memory_viz.trace` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepcli.snapshots.snapshotreader import HistoryColumns, Segment

ALLOCATED_STATES = ("active_allocated",)


# one allocation alive in the replay: size, stack index, step made in
Live = tuple[int, int, "int | None"]


@dataclass
class StepFigures:
    step: int
    start_allocated: int  # allocated when the step's first event happened
    peak_allocated: int
    start_reserved: int
    peak_reserved: int
    complete: bool  # not the first step of the history, whose start the ring may have dropped


@dataclass
class AllocatorReplay:
    """Totals over the history, and the live allocations at `stop` (an index into the entries)."""

    entries: HistoryColumns
    segments: list[Segment]
    stop: int | None = None  # replay entries[:stop]; None: all
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_index: int = -1  # the entry that reached the peak (-1: the start)
    oom_index: int = -1  # the last `oom` entry
    live: dict[int, Live] = field(default_factory=dict)
    steps: dict[int, StepFigures] = field(default_factory=dict)
    # step -> stack -> bytes alive 2 steps on
    survivors: dict[int, dict[int, int]] = field(default_factory=dict)

    def run(self) -> AllocatorReplay:
        """One pass, locals only in the loop: a history of millions of events takes seconds, not
        minutes."""
        entries = self.entries.rows(None, self.stop)
        free_action = (
            "free_completed" if self.entries.has_action("free_completed") else "free_requested"
        )
        self._initial_state(free_action)
        live, steps = self.live, self.steps
        allocated, reserved = self.allocated, self.reserved
        peak, peak_index, oom_index = allocated, -1, -1
        by_step: dict[int, set[int]] = {}  # step -> addresses allocated in it and still alive
        current: int | None = None
        figures: StepFigures | None = None
        for index, (action, addr, size, stack, step) in enumerate(entries):
            if step is not None and step != current:
                self.allocated, self.reserved = allocated, reserved
                current = step
                figures = self._step_started(step, by_step, complete=bool(steps))
            if action == "alloc":
                live[addr] = (size, stack, step)
                allocated += size
                if step is not None:
                    born = by_step.get(step)
                    if born is None:
                        born = by_step[step] = set()
                    born.add(addr)
                if allocated > peak:
                    peak, peak_index = allocated, index
                if figures is not None and allocated > figures.peak_allocated:
                    figures.peak_allocated = allocated
            elif action == free_action:
                gone = live.pop(addr, None)
                if gone is None:
                    allocated -= size
                else:
                    allocated -= gone[0]
                    if gone[2] is not None and gone[2] in by_step:
                        by_step[gone[2]].discard(addr)
            elif action == "segment_alloc" or action == "segment_map":
                reserved += size
                if figures is not None and reserved > figures.peak_reserved:
                    figures.peak_reserved = reserved
            elif action == "segment_free" or action == "segment_unmap":
                reserved -= size
            elif action == "oom":
                oom_index = index
        self.allocated, self.reserved = allocated, reserved
        self.peak_allocated, self.peak_index, self.oom_index = peak, peak_index, oom_index
        return self

    def _initial_state(self, free_action: str) -> None:
        """What was allocated and reserved before the history's first event."""
        allocated_in_history: set[int] = set()
        grown = shrunk = 0
        for action, addr, size, _stack, _step in self.entries.rows():
            if action == "alloc":
                allocated_in_history.add(addr)
            elif action == free_action:
                if addr not in allocated_in_history and addr not in self.live:
                    self.live[addr] = (size, 0, None)
            elif action == "segment_alloc" or action == "segment_map":
                grown += size
            elif action == "segment_free" or action == "segment_unmap":
                shrunk += size
        for segment in self.segments:
            for block in segment.blocks:
                if block.state in ALLOCATED_STATES and block.address not in allocated_in_history:
                    self.live.setdefault(block.address, (block.size, block.stack, None))
        self.allocated = sum(live[0] for live in self.live.values())
        reserved_end = sum(segment.total_size for segment in self.segments)
        self.reserved = max(reserved_end - grown + shrunk, 0)

    def _step_started(self, step: int, by_step: dict[int, set[int]], complete: bool) -> StepFigures:
        known = self.steps.get(step)
        # an untagged stretch inside a step (another thread): the same step goes on
        if known is not None:
            return known
        figures = self.steps[step] = StepFigures(
            step, self.allocated, self.allocated, self.reserved, self.reserved, complete
        )
        older = step - 2
        if older in by_step:
            alive: dict[int, int] = {}
            for addr in by_step.pop(older):
                live = self.live.get(addr)
                if live is not None:
                    alive[live[1]] = alive.get(live[1], 0) + live[0]
            self.survivors[older] = alive
        return figures
