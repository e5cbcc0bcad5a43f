"""Python garbage-collection pauses, counted for the whole run and marked in the traces (standard
library only).

A `gc.callbacks` entry costs a clock read per collection, nothing per step. Per generation it counts
collections, pause time, the longest pause and the objects collected (written into the step log as
`gc`). While a torch profiler records, each pause also becomes a `python gc (gen N)` range in the
trace, opened and closed by the callback itself as the collection starts and stops (the same
record_function ops `torch.profiler.record_function` uses), so the culprit analysis sees it on the
thread it stopped.
"""

from __future__ import annotations

import gc
import time

from .interrupts import redeliver

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

# The trace annotation's name prefix (stepcli.traces.analyses.arrivals.GC_PREFIX reads it back).
ANNOTATION = "python gc (gen {})"


class GcPauses:
    """Collections per generation since install(); the record_function ops once torch is
    imported."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.clock = clock
        self.collections = [0, 0, 0]
        self.pause_ns = [0, 0, 0]
        self.max_ns = [0, 0, 0]
        self.collected = [0, 0, 0]
        self._started = 0
        self._open: Any = None
        self._enabled: Callable[[], bool] | None = None  # torch's "is the profiler on" (one C call)
        self._ours: Callable[[], bool] = _never  # is it stepcli's own window
        self._enter: Callable[[str, Any], Any] | None = None
        self._exit: Callable[[Any], Any] | None = None

    def install(self) -> None:
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)

    def uninstall(self) -> None:
        if self.callback in gc.callbacks:
            gc.callbacks.remove(self.callback)

    def torch_imported(self, torch: ModuleType, ours: Callable[[], bool] = lambda: True) -> None:
        """Mark pauses in traces from now on: only while `ours()` (a stepcli window is open, not the
        program's own profiler: its traces stay as the program made them) and the profiler is on
        (one C call)."""
        try:
            ops = torch.ops.profiler
            self._enter = ops._record_function_enter_new
            self._exit = ops._record_function_exit._RecordFunction
            self._ours = ours
            self._enabled = torch._C._autograd._profiler_enabled
        except Exception:
            self._enabled = None

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        try:
            if phase == "start":
                self._started = self.clock()
                enabled = self._enabled
                # most collections: one C call here
                if enabled is not None and enabled() and self._ours():
                    self._mark_start(info.get("generation", 0))
                return
            elapsed = self.clock() - self._started
            if self._open is not None:
                self._mark_stop()
            generation = min(max(int(info.get("generation", 0)), 0), 2)
            self.collections[generation] += 1
            self.pause_ns[generation] += elapsed
            self.max_ns[generation] = max(self.max_ns[generation], elapsed)
            self.collected[generation] += int(info.get("collected", 0))
        except Exception:  # never let accounting break the program's collections
            self._open = None
        # a Ctrl-C (or a handler's sys.exit): Python drops what a gc
        except (KeyboardInterrupt, SystemExit):
            redeliver()  # callback raises, so it would never reach the program

    def _mark_start(self, generation: int) -> None:
        if self._enter is not None:
            self._open = self._enter(ANNOTATION.format(generation), None)

    def _mark_stop(self) -> None:
        record, self._open = self._open, None
        if record is not None and self._exit is not None:
            self._exit(record)

    def to_log(self) -> dict[str, list[float]]:
        """The step log's `gc` entry: per generation 0, 1, 2."""
        return {
            "collections": list(self.collections),
            "pause_ms": [round(ns / 1e6, 3) for ns in self.pause_ns],
            "max_pause_ms": [round(ns / 1e6, 3) for ns in self.max_ns],
            "collected": list(self.collected),
        }


def _never() -> bool:
    return False
