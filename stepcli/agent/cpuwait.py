"""How long the steps' thread ran on a CPU and waited for one in each recorded step, written into
the trace.

A rank that is runnable but not running (more busy threads than cores: another job, DataLoader
workers, every rank's OpenMP threads) arrives late at each collective with no work of its own to
show for it: in the trace its extra time looks like Python code. Linux counts that time per thread
(/proc/thread-self/schedstat: nanoseconds on a CPU, nanoseconds runnable but waiting in a run
queue). The recorder samples it at the boundaries of each recorded step and writes both times of the
steps into the trace (stepcli.runfolder.layout.CPU_TIME_KEY), where the culprit analysis
(stepcli.traces.analyses.culprit) weighs the wait that the rank's own work does not explain as a
cause. Two reads of a small /proc file per recorded step (~10 µs each), none outside windows;
nothing where the file does not exist.
"""

from __future__ import annotations

from stepcli.runfolder.layout import CPU_TIME_KEY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_SCHEDSTAT = "/proc/thread-self/schedstat"


def _sample() -> tuple[float, float] | None:
    """The calling thread's (time on a CPU, time waiting in a run queue) since it started, ms; None
    where Linux does not say."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            fields = f.read(200).split()
        return int(fields[0]) / 1e6, int(fields[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


class CpuWait:
    """The recorded steps' CPU times of one window (the steps' thread: the main thread)."""

    def __init__(self) -> None:
        self.steps: dict[int, list[float]] = {}  # step -> [ms on a CPU, ms waiting for one]
        self._step: int | None = None  # the recorded step that began at the last sample
        self._at: tuple[float, float] | None = None
        self._unavailable = False

    def begin(self, step: int) -> None:
        """Recorded step `step` begins now."""
        if not self._unavailable:
            self._at = _sample()
            self._unavailable = self._at is None
            self._step = step

    def end(self, prof: Any) -> None:
        """The recorded step begun last ends now: its times go into the trace (while Kineto
        records)."""
        step, began, self._step = self._step, self._at, None
        if step is None or began is None:
            return
        now = _sample()
        if now is None:
            return
        self.steps[step] = [
            round(max(0.0, now[0] - began[0]), 3),
            round(max(0.0, now[1] - began[1]), 3),
        ]
        try:
            import json

            prof.add_metadata_json(
                CPU_TIME_KEY, json.dumps({str(k): v for k, v in self.steps.items()})
            )
        except Exception:  # a trace without it: the culprit analysis does without this cause
            pass

    def reset(self) -> None:
        """A new window: forget the last one's steps."""
        self.steps = {}
        self._step = self._at = None
