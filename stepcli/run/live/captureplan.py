"""Choosing the steps of a `stepcli capture` window: ahead of every rank, clear of every other
window.

Pure: what the processes' heartbeats say, the run's schedule and the other captures' windows in, a
request out. Placing a window costs a few operations per window it has to step over, never one per
step: `--wait 100000 --active 1000` is placed as fast as `--active 3`.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from stepcli.agent.ondemand import POLL_INTERVAL_S
from stepcli.agent.schedule import Schedule
from stepcli.errors import StepcliError

MARGIN_S = POLL_INTERVAL_S + 0.5  # every process notices a request within one poll interval


@dataclass(frozen=True)
class CaptureRequest:
    id: str
    open_at: int
    first_step: int
    last_step: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "open_at": self.open_at,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created_at": time.time(),
        }


def patience(process: dict[str, Any], slack_steps: float = 3.0) -> float:
    """Seconds a stepping process may take to write a heartbeat: a poll interval plus a few of its
    steps."""
    rate = _rate(process)
    return POLL_INTERVAL_S + 1.0 + (slack_steps / rate if rate > 0 else 3.0)


def fresh(process: dict[str, Any], now: float, slack_steps: float = 3.0) -> bool:
    """Still stepping: its heartbeat is no older than a poll interval plus a few of its steps (while
    a capture listens, a stepping process writes its heartbeat at every poll), counted from its last
    step."""
    return now - step_time(process) <= patience(process, slack_steps)


def step_time(process: dict[str, Any]) -> float:
    """When the process last stepped, by its heartbeat: the heartbeat's time, less `no_step_for_s`
    when its stacks thread wrote it for a main thread that makes no step (stepcli/agent/ondemand.py,
    beat_off_main)."""
    idle = process.get("no_step_for_s")
    idle = (
        float(idle)
        if isinstance(idle, (int, float)) and not isinstance(idle, bool) and idle > 0
        else 0.0
    )
    return _number(process.get("time")) - idle


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _rate(process: dict[str, Any]) -> float:
    rate = _number(process.get("steps_per_s"))
    return rate if math.isfinite(rate) and rate > 0 else 0.0


def plan_request(
    processes: list[dict[str, Any]],
    others: list[dict[str, Any]],
    schedule: Schedule | None,
    wait: int,
    warmup: int,
    active: int,
    now: float,
    margin_s: float = MARGIN_S,
) -> CaptureRequest:
    """The first step every rank can still meet, clear of scheduled windows and of other captures'
    windows.

    Every rank is projected forward from its freshest heartbeat at its own pace; then the steps the
    fastest makes in `margin_s` (each process notices a request within a poll interval; a capture
    that finds the run already past its steps plans again with a wider margin) and `wait` are
    added."""
    live = [p for p in processes if not p.get("ended")] or processes
    top, rate = 0.0, 0.0
    for process in live:
        speed = _rate(process)
        age = (
            max(0.0, min(now - step_time(process), patience(process)))
            if fresh(process, now)
            else 0.0
        )
        top = max(top, _number(process.get("step")) + speed * age)
        rate = max(rate, speed)
    open_at = math.ceil(top) + math.ceil(rate * margin_s) + 2 + wait
    length = warmup + active
    # each jump passes one other window or the scheduled cycles in the way
    for _ in range(2 * len(others) + 8):
        clash = _clash_end(schedule, others, open_at - 1, open_at + length, length)
        if clash is None:
            return CaptureRequest(
                uuid.uuid4().hex[:12], open_at, open_at + warmup, open_at + length - 1
            )
        open_at = clash + 2
    raise StepcliError(f"the run's schedule leaves no room for a window of {length} steps")


def _clash_end(
    schedule: Schedule | None, others: list[dict[str, Any]], lo: int, hi: int, length: int
) -> int | None:
    """The last busy step of the first window touching steps lo..hi, or None when they are free.
    Another capture's window keeps a free step on either side; a scheduled cycle too close to the
    next one for the window to fit between them is passed with all of its kind (no room at all when
    they repeat until the program ends)."""
    ends = []
    for other in others:
        start, end = int(other["open_at"]) - 1, int(other["last_step"]) + 1
        if start <= hi and end >= lo:
            ends.append(end)
    if schedule is not None:
        scheduled = schedule.next_profiled_step(lo)
        if scheduled is not None and scheduled <= hi:
            if schedule.wait >= length + 2:
                ends.append(schedule.cycle_end(scheduled))
            else:
                last = schedule.last_step()
                if last is None:
                    raise StepcliError(
                        f"the run's schedule leaves no room for a window of {length} steps"
                    )
                ends.append(last)
    return max(ends) if ends else None
