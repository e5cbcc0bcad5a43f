"""`--capture-on-slow`: a step slower than the rule says opens a window of the next steps, on every
rank.

Runs inside the target: standard library only. The tracker compares each step's duration with a
threshold it already holds (one compare per step); every REFRESH_STEPS steps it asks this module for
a new one, computed from the last BASELINE_STEPS steps outside any window (a sort of 64 numbers,
shared among 16 steps: O(1) per step).

A slow step (not one a window recorded) places a window through the machinery of `stepcli capture`
(stepcli/agent/ondemand.py): this process accepts it as if a capture had asked, and, when the job
has several ranks (WORLD_SIZE > 1), adds the same request to the control folder's requests.json,
under capture's lock, so that every rank picks it up at its next poll (every SLOW_POLL_INTERVAL_S
with several ranks) and records the same global steps. Alone, the window starts at the very next
step; with other ranks, far enough ahead (the steps this process makes in MARGIN_S, at its median
pace, plus 2) that they hear of it in time, and soon (half a second). Bounded: `--max-captures`
windows per run (counted in requests.json across ranks), none while another window records or waits,
and a cool-down of COOLDOWN_STEPS after each. The request carries the trigger (rank, step, its time,
the baseline); every rank saves it as trigger.json next to its trace and in the trace's own
metadata, and it is in the step log's window, hence the run summary; a window a process did not
record (the job ended first) is in its step log too, with why.

A periodic slowdown (every 50th step a checkpoint) is caught by prediction: once a window was
placed, the next slow step s, with the previous slow step p, places the window on the step predicted
next, s + (s - p), starting one step before it, instead of right after s (whose neighbours were seen
to be normal last time).
"""

from __future__ import annotations

import math
import os

from stepcli.runfolder.layout import LOCK_FILE, REQUESTS_FILE

from . import controlfiles
from .request import MAX_CONTROL_BYTES, MAX_ENTRIES, MAX_WARMUP
from .schedule import NONE
from .slowrule import BASELINE_STEPS, MIN_STEPS, REFRESH_STEPS, baseline, threshold_ns
from .tracker import NEVER

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .ondemand import Agent, OnDemand

COOLDOWN_STEPS = 10  # after a window's last step, before a slow step may place another
MAX_PERIOD = 10_000  # a predicted slow step further ahead than this is not waited for
# With several ranks, every process polls requests.json this often (instead of once a second), so a
# triggered window can start soon after the slow step: every rank hears of it within a poll
# interval, plus a little for the write to show on the other ranks and the step boundary the poll
# waits for (the 2 steps added in _plan).
SLOW_POLL_INTERVAL_S = 0.2
MARGIN_S = SLOW_POLL_INTERVAL_S + 0.3


class SlowTrigger:
    def __init__(self, agent: Agent, ondemand: OnDemand, rule: dict[str, Any]) -> None:
        self.agent = agent
        self.ondemand = ondemand
        self.kind, self.value, self.text = (
            str(rule["kind"]),
            float(rule["value"]),
            str(rule["text"]),
        )
        self.steps, self.max_captures = int(rule["steps"]), int(rule["max"])
        self.placed = 0
        self.cooldown_until = 0
        self.median_ns = 0
        self.threshold = NEVER
        self.check_at = MIN_STEPS + 1
        self.slow_steps: list[int] = []  # the last few slow steps, for the period
        self.world = _world_size()
        if self.world > 1 and ondemand.active:
            agent.tracker.set_poller(ondemand.poll, SLOW_POLL_INTERVAL_S)
        agent.tracker.watch_slow(self.watch, self.check_at)

    def watch(self, new_step: int, duration: int) -> tuple[int, int]:
        """Called by the tracker: the step `new_step - 1` just ended, slow or due for a new
        baseline."""
        try:
            if duration > self.threshold and new_step > 1:
                self._slow(new_step - 1, duration, new_step)
            # every REFRESH_STEPS steps at first, then every BASELINE_STEPS
            if new_step >= self.check_at:
                self.check_at = new_step + (
                    REFRESH_STEPS if new_step < 2 * BASELINE_STEPS else BASELINE_STEPS
                )
                self.threshold = self._refresh()
                if self.threshold == NEVER and new_step < 4 * BASELINE_STEPS:
                    # fewer than MIN_STEPS known outside windows (the schedule's window took some):
                    # try again at the next step, so the first slow step after MIN_STEPS ordinary
                    # ones triggers
                    self.check_at = new_step + 1
            return self.threshold, self.check_at
        except Exception as exc:  # stepcli's own bug must never cost the program its run
            from .output import say

            say(f"--capture-on-slow disabled in this process: {type(exc).__name__}: {exc}")
            return NEVER, NEVER

    def _refresh(self) -> int:
        tracker = self.agent.tracker
        lo = max(1, len(tracker.durations_ns) - BASELINE_STEPS)
        phases = tracker.phases[lo:]
        if phases.count(NONE) == len(phases):  # the usual case: no window among them
            sample = tracker.durations_ns[lo:].tolist()
        else:
            sample = [d for d, phase in zip(tracker.durations_ns[lo:], phases) if phase == NONE]
        if len(sample) < MIN_STEPS:
            return NEVER
        self.median_ns, spread = baseline(sample, self.kind == "z")
        return threshold_ns(self.kind, self.value, self.median_ns, spread)

    # -- a slow step
    # ----------------------------------------------------------------------------------------
    def _slow(self, step: int, duration: int, next_step: int) -> None:
        if self.agent.tracker.phases[step] != NONE:
            return  # a window recorded it: the profiler's cost, not the program's
        compiles = getattr(self.agent, "compiles", None)
        if compiles is not None and compiles.events and compiles.events[-1].get("step") == step:
            return  # torch compiled in it: a known one-off, not a slowdown
        self.slow_steps = [*self.slow_steps[-3:], step]
        if self.placed >= self.max_captures or next_step < self.cooldown_until:
            return
        recorder = self.agent.recorder
        if recorder is None or recorder.prof is not None or self.ondemand.pending:
            return  # another window records or waits: never two at once
        first, predicted, period = self._plan(step, next_step)
        last = first + self.steps - 1
        trigger: dict[str, Any] = {
            "rank": _rank(),
            "step": step,
            "ms": round(duration / 1e6, 3),
            "baseline_ms": round(self.median_ns / 1e6, 3),
            "threshold_ms": round(self.threshold / 1e6, 3),
            "rule": self.text,
        }
        if predicted is not None:
            trigger.update(predicted_step=predicted, period=period)
        rid = f"slow-{self.agent.pid}-{self.placed + 1}"
        if self.world > 1 and not self._publish(rid, first, last, trigger, step):
            return
        self.placed += 1
        self.cooldown_until = last + 1 + COOLDOWN_STEPS
        self.ondemand.triggers[rid] = trigger
        self.ondemand.trigger_steps[rid] = (first, last)
        self.ondemand.own.add(rid)
        self.ondemand._consider(rid, first, first, last, next_step)
        answer = self.ondemand.responses.get(rid, {})
        self._announce(
            trigger,
            first,
            last,
            "" if answer.get("status") == "accepted" else str(answer.get("reason")),
        )

    def _plan(self, step: int, next_step: int) -> tuple[int, int | None, int | None]:
        """(first step of the window, the predicted slow step it is placed on, the period) for slow
        step `step`."""
        lead = 0
        # the other ranks hear of it within a poll interval: place it that far ahead
        if self.world > 1:
            lead = min(MAX_WARMUP, math.ceil(MARGIN_S * 1e9 / max(self.median_ns, 1)) + 2)
        first = next_step + lead
        if self.placed and len(self.slow_steps) >= 2:
            period = self.slow_steps[-1] - self.slow_steps[-2]
            if self.steps < period <= MAX_PERIOD:
                before = 1 if self.steps >= 2 else 0
                predicted = step + period
                while predicted - before < first:
                    predicted += period
                return predicted - before, predicted, period
        return first, None, None

    def _publish(self, rid: str, first: int, last: int, trigger: dict[str, Any], step: int) -> bool:
        """Add the request to requests.json for the other ranks, unless another rank's trigger
        already covers this moment or used up the captures. Under capture's lock: one writer at a
        time."""
        import fcntl
        import socket
        import time

        folder_fd = self.ondemand.folder_fd
        if folder_fd < 0:
            return False
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        lock = os.open(LOCK_FILE, flags, 0o600, dir_fd=folder_fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                document = controlfiles.read_json(folder_fd, REQUESTS_FILE, MAX_CONTROL_BYTES)
            except FileNotFoundError:
                document = {}
            if not isinstance(document, dict) or document.get("run_id") not in (
                None,
                self.ondemand.run_id,
            ):
                return False
            requests = [r for r in document.get("requests") or [] if isinstance(r, dict)]
            triggered = [r for r in requests if isinstance(r.get("trigger"), dict)]
            if len(triggered) >= self.max_captures:
                self.placed = self.max_captures
                return False
            recent = [int(r["last_step"]) for r in triggered if isinstance(r.get("last_step"), int)]
            # another rank's trigger covers this moment
            if recent and max(recent) + COOLDOWN_STEPS >= step:
                self.cooldown_until = max(recent) + 1 + COOLDOWN_STEPS
                return False
            if len(requests) >= MAX_ENTRIES:
                return False
            entry = {
                "id": rid,
                "open_at": first,
                "first_step": first,
                "last_step": last,
                "trigger": trigger,
            }
            entry.update(host=socket.gethostname(), pid=self.agent.pid, created_at=time.time())
            pings = document.get("pings") if isinstance(document.get("pings"), list) else []
            body = {"run_id": self.ondemand.run_id, "requests": [*requests, entry], "pings": pings}
            controlfiles.write_json(folder_fd, REQUESTS_FILE, body)
            return True
        finally:
            os.close(lock)

    def _announce(self, trigger: dict[str, Any], first: int, last: int, refused: str) -> None:
        if self.agent.config.quiet:
            return
        from .output import say, worker_name

        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        where = (
            f" (predicted slow step {trigger['predicted_step']})"
            if "predicted_step" in trigger
            else ""
        )
        if refused:  # another window holds those steps, or the program's own profiler runs
            where += f"; not here: {refused}"
        say(
            f"{worker_name()}: step {trigger['step']} took {trigger['ms']:.1f} ms (baseline "
            f"{trigger['baseline_ms']:.1f} ms, rule {self.text}): recording {steps}{where}"
        )


def _world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _rank() -> int | None:
    from .output import current_rank

    return current_rank()
