"""The state of the recorder's window, in one object: open or not, its first recorded step, how it
is closing, and what other threads asked of it.

Only the main thread may stop torch's profiler (recorder.py says why), so a cut or a drop asked for
on another thread waits here until the main thread's next step. A window closes one of three ways,
which decide what `Recorder._on_trace_ready` does with the trace torch hands over while it stops: as
scheduled (saved, complete), cut short (saved, marked incomplete with the reason; discarded if it
held no whole step) or dropped (its capture withdrew it: discarded, with a note).

Runs inside the target: standard library only, no torch: tests/unit/test_agent_windowstate.py drives
it alone.
"""

from __future__ import annotations


class WindowState:
    """Where the recorder's window stands; the Recorder moves it through the methods below."""

    __slots__ = (
        "is_open",
        "first_step",
        "cut_reason",
        "discard",
        "dropping",
        "pending_cut",
        "pending_drop",
    )

    def __init__(self) -> None:
        self.is_open = False
        self.first_step: int | None = None  # its first recorded step (None while it warms up)
        # it is closing early, and why ("" closing as scheduled): the trace's note
        self.cut_reason = ""
        # ... and its trace is not saved (no whole step, dropped, or profiling disabled)
        self.discard = False
        self.dropping = False  # ... because nobody wants it any more (its capture withdrew it)
        # a cut asked for on another thread, done by the main thread at its next step
        self.pending_cut = ""
        self.pending_drop = ""  # a drop asked for on another thread, likewise

    def open(self, first_step: int | None) -> None:
        """A profiler object was started; `first_step` when it records from its first step."""
        self.is_open, self.first_step = True, first_step

    def recording_from(self, step: int) -> None:
        """The warmup ended: it records from `step`."""
        self.first_step = step

    def next_cycle(self) -> None:
        """Its cycle was saved; the same profiler object goes straight on to the next cycle's warmup
        (wait=0)."""
        self.is_open, self.first_step = True, None

    def close(self) -> None:
        """The profiler object is gone (stopped, or abandoned to the program's own profiler)."""
        self.is_open, self.first_step = False, None

    def closing(self, reason: str, discard: bool, dropping: bool = False) -> None:
        """It is being closed early, now, on the main thread: how `_on_trace_ready` treats its
        trace."""
        self.cut_reason, self.discard, self.dropping = reason, discard, dropping

    def closed_early(self) -> None:
        """The early close is over (saved, discarded, or failed)."""
        self.cut_reason, self.discard, self.dropping = "", False, False

    def ask_cut(self, reason: str) -> None:
        """Another thread wants it cut short; the first reason asked for is the one kept."""
        self.pending_cut = self.pending_cut or reason

    def ask_drop(self, reason: str) -> None:
        """Another thread wants it closed unsaved; the first reason asked for is the one kept."""
        self.pending_drop = self.pending_drop or reason

    def take_drop(self) -> str:
        """The drop asked for, if any, now being done (asked no more)."""
        reason, self.pending_drop = self.pending_drop, ""
        return reason
