"""One global step count fed by many requesters, with `KinetoStepTracker` semantics, and every
step's duration.

Runs inside the target: standard library only. Each requester (an optimizer instance, a profiler
object, a `--step-on` function) has its own count, starting at the global step when it appears; the
global step is the max over requesters, so two optimizers stepping once per iteration, or a profiler
plus an optimizer, advance it once. This is the hot path of every training step, so it is kept to a
dict lookup, an add and a compare; the listener (the profiler driver) is called only at steps it
asked to be woken at.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array

from .schedule import NONE

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    Listener = Callable[[int], tuple[int, int]]

# Phase codes stored per step: the schedule's actions (0-3), one for "the program's own profiler
# ran", and one for the first step after a window closed: the profiler's stop and save are charged
# to no step, but that step still pays for them (caches refilled, and on several ranks the wait in
# its first collective for a rank still saving its larger trace), so it is not the program's own
# time either.
FOREIGN = 4
AFTER_WINDOW = 5
NEVER = sys.maxsize


class Requester:
    """A source of step() calls; `count` follows KinetoStepTracker, `calls` is what it actually
    did."""

    __slots__ = ("name", "count", "start")

    def __init__(self, name: str, start: int) -> None:
        self.name = name
        self.count = start
        self.start = start

    @property
    def calls(self) -> int:
        return self.count - self.start


class StepTracker:
    """Global step = max over requesters; records each step's duration and what the profiler was
    doing.

    `listener(step)` is called when global step `step` begins (the previous one just ended) and
    returns (phase of the new step, the next step at which to call it again). Time the listener
    spends (starting or saving a trace) is charged to no step, so profiler overhead never leaks into
    untouched steps.
    """

    def __init__(
        self, started_ns: int | None = None, clock: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        self.global_step = 0
        self.requesters: dict[Hashable, Requester] = {}
        self.order: list[Requester] = []  # every requester ever seen, for the report
        self.durations_ns = array("q")
        self.phases = bytearray()
        self._clock = clock
        self._step_start = clock() if started_ns is None else started_ns
        self._phase = NONE
        self._wake_at = NEVER
        self._listener: Listener | None = None
        # clock value at which `_poller` runs next (a time bound, not a step bound)
        self._poll_at = NEVER
        self._poll_interval_ns = 1_000_000_000
        self._poller: Callable[[int], None] | None = None
        # requesters may step from several threads (--step-on in a server)
        self._lock = threading.Lock()
        self._slow_ns = NEVER  # a step longer than this calls `_slow_watch` (--capture-on-slow)
        self._slow_check_at = NEVER  # the step at which `_slow_watch` next recomputes its baseline
        self._slow_watch: Callable[[int, int], tuple[int, int]] | None = None

    def restart_clock(self) -> None:
        """Make the current step start now."""
        self._step_start = self._clock()

    def set_listener(self, listener: Listener | None, wake_at: int = 0) -> None:
        """Install the profiler driver; it is called at the start of step `wake_at` and whenever it
        asks."""
        self._listener = listener
        self._wake_at = wake_at if listener is not None else NEVER

    def set_poller(self, poller: Callable[[int], None] | None, interval_s: float = 1.0) -> None:
        """Call `poller(step)` at a step boundary at most once per `interval_s` (on-demand
        requests): the per-step cost is one integer compare against the clock value the step already
        reads."""
        self._poller = poller
        self._poll_interval_ns = int(interval_s * 1e9)
        self._poll_at = 0 if poller is not None else NEVER

    def watch_slow(
        self, watch: Callable[[int, int], tuple[int, int]] | None, first_check: int = 0
    ) -> None:
        """Call `watch(new_step, duration_ns)` before the listener when the step that just ended was
        longer than the threshold, or at the step it asked to be called at; it returns (the new
        threshold, the next such step). The per-step cost is one compare of numbers the step already
        has (--capture-on-slow)."""
        self._slow_watch = watch
        self._slow_ns, self._slow_check_at = (
            (NEVER, first_check) if watch is not None else (NEVER, NEVER)
        )

    def wake_at_step(self, step: int) -> None:
        """Make the listener run at the start of `step` at the latest (a window asked for on
        demand)."""
        if self._listener is not None and step < self._wake_at:
            self._wake_at = step

    def wake_next_step(self) -> None:
        """Make the listener run at the next step (e.g. the program opened or closed its own
        profiler)."""
        if self._listener is not None:
            self._wake_at = self.global_step + 1

    def add_step_callback(self, callback: Callable[[int], None]) -> None:
        """Also call `callback(new_step)` at every step boundary (`--memory` tags allocations with
        the step).

        Wraps `_advance` on this instance only, so a run without such a callback pays nothing per
        step."""
        advance = self._advance

        def advance_and_call(new_step: int) -> None:
            advance(new_step)
            callback(new_step)

        self._advance = advance_and_call  # type: ignore[method-assign]

    def set_phase(self, phase: int) -> None:
        """Overwrite what the current step is marked as (e.g. FOREIGN once the program's profiler
        starts)."""
        self._phase = phase

    def begin(self) -> None:
        """Run the listener for step 0 if it wants it (a window that starts at the very first step).
        Opening the window is charged to no step; the time step 0 ran before it (since torch was
        imported) stays its own, so the start-up step measures the same whatever the window."""
        if self._listener is not None and self.global_step >= self._wake_at:
            before = self._clock()
            self._phase, self._wake_at = self._listener(self.global_step)
            self._step_start += self._clock() - before

    def register(self, key: Hashable, name: str) -> Requester:
        """A new requester starts at the current global step (registered when it is created, not at
        its first step)."""
        requester = Requester(name, self.global_step)
        self.requesters[key] = requester
        self.order.append(requester)
        return requester

    def forget(self, key: Hashable) -> None:
        """A requester was garbage collected: its key (an id) may be reused by a new one."""
        self.requesters.pop(key, None)

    def step(self, key: Hashable, name: str = "step") -> None:
        """One step() call by `key`; advances the global step when this requester is now ahead of
        it."""
        with self._lock:
            requester = self.requesters.get(key)
            if requester is None:
                requester = self.register(key, name)
            requester.count += 1
            if requester.count > self.global_step:
                self._advance(requester.count)

    def _advance(self, new_step: int) -> None:
        now = self._clock()
        duration = now - self._step_start
        self.durations_ns.append(duration)
        self.phases.append(self._phase)
        self.global_step = new_step
        if duration > self._slow_ns or new_step >= self._slow_check_at:
            watch = self._slow_watch
            if watch is not None:
                self._slow_ns, self._slow_check_at = watch(new_step, duration)
                # like the poll's, its work (rare: a slow step) is charged to no step
                now = self._clock()
        if now >= self._poll_at:
            self._poll(now, new_step)
            now = self._clock()  # the poll's file work is charged to no step, like the listener's
        if new_step >= self._wake_at and self._listener is not None:
            self._phase, self._wake_at = self._listener(new_step)
            self._step_start = self._clock()
        else:
            self._step_start = now

    def _poll(self, now: int, step: int) -> None:
        self._poll_at = now + self._poll_interval_ns
        poller = self._poller
        if poller is not None:
            poller(step)

    def counts(self) -> dict[str, int]:
        """Step calls per requester name (names are unique per run)."""
        return {r.name: r.calls for r in self.order}
