"""Drives `torch.profiler.profile` through the schedule, one profiler object per window.

Runs inside the target: standard library plus the program's own torch. A profiler object that merely sits in
its wait phase costs 25-60 us per step (it opens a `ProfilerStep#N` record_function every step), so none exists
outside a window: one is created at the first warmup step of a cycle, told which global step it is at, stepped
once per global step, and dropped when the cycle has been saved.
"""

from __future__ import annotations

from .config import AgentConfig
from .output import export_trace, human_size, say, worker_name
from .schedule import NONE, RECORD, RECORD_AND_SAVE, WARMUP
from .tracker import FOREIGN, NEVER, StepTracker

TYPE_CHECKING = False  # typing is not imported at run time: this module loads in every profiled process
if TYPE_CHECKING:
    from typing import Any, Callable

_ACTIVITY_NAMES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}


class Recorder:
    """Opens, steps and saves profiler windows; steps aside while the program runs a profiler of its own."""

    def __init__(
        self,
        config: AgentConfig,
        tracker: StepTracker,
        on_saved: Callable[[], None],
        guard_signals: Callable[[bool], None] = lambda on: None,
    ) -> None:
        self.config = config
        self.guard_signals = guard_signals
        self.schedule = config.schedule
        self.tracker = tracker
        self.on_saved = on_saved
        self.prof: Any = None
        self.building = False  # true while our own profile object is being constructed
        self.foreign: set[int] = set()  # the program's profilers now running
        self.windows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.skipped_windows = 0
        self.disabled = False
        self._window: dict[str, Any] | None = None
        self._cut_reason = ""

    # -- schedule ---------------------------------------------------------------------------------------------
    def next_cycle_start(self, step: int) -> int:
        """The next step >= `step` at which a cycle's first profiled step begins (never mid-cycle)."""
        candidate = self.schedule.next_profiled_step(step)
        while candidate is not None and not self.schedule.starts_cycle(candidate):
            candidate = self.schedule.next_profiled_step(candidate + 1)
        return NEVER if candidate is None else candidate

    def on_step(self, step: int) -> tuple[int, int]:
        """Global step `step` begins: advance the open window or open one. Returns (phase, next wake step)."""
        if self.disabled:
            return NONE, NEVER
        try:
            return self._on_step(step)
        except Exception as exc:  # the program must never die of its profiler
            self._disable(f"profiling stopped after an error in torch.profiler: {type(exc).__name__}: {exc}")
            return NONE, NEVER

    def _on_step(self, step: int) -> tuple[int, int]:
        if self.prof is not None:
            self.prof.step()
            action = self.prof.current_action.value
            if action == NONE:
                self._close()
                return NONE, self.next_cycle_start(step + 1)
            if action in (RECORD, RECORD_AND_SAVE) and self._window is not None and self._window["first_step"] is None:
                self._window["first_step"] = step
            return (action if action <= RECORD_AND_SAVE else WARMUP), step + 1
        if self.foreign:
            if self.schedule.starts_cycle(step):
                self.skipped_windows += 1
            return FOREIGN, step + 1
        if self.schedule.starts_cycle(step):
            self._open(step)
            return self.schedule.action(step), step + 1
        return NONE, self.next_cycle_start(step)

    # -- profiler objects ---------------------------------------------------------------------------------------
    def _activities(self, profiler: Any) -> list[Any] | None:
        if self.config.activities is None:
            return None
        supported = profiler.supported_activities()
        chosen = []
        for name in self.config.activities:
            activity = getattr(profiler.ProfilerActivity, _ACTIVITY_NAMES[name], None)
            if activity in supported:
                chosen.append(activity)
            else:
                self.notes.append(f"activity {name} is not available in this torch build; not recorded")
        return chosen or [profiler.ProfilerActivity.CPU]

    def _open(self, step: int) -> None:
        import torch.profiler as profiler  # already imported by the program: we only run after it imported torch

        action = profiler.ProfilerAction(self.schedule.action(step))
        self.building = True
        try:
            prof = profiler.profile(
                activities=self._activities(profiler),
                schedule=self._torch_schedule,
                on_trace_ready=self._on_trace_ready,
                record_shapes=self.config.record_shapes,
                profile_memory=self.config.profile_memory,
                with_stack=self.config.with_stack,
                with_flops=self.config.with_flops,
                with_modules=self.config.with_modules,
            )
        finally:
            self.building = False
        # Start the object at the global step instead of 0, so ProfilerStep#N numbers global steps.
        prof.step_num = step
        prof.current_action = action
        prof._prev_schedule_action = action
        self.prof = prof
        first_record = step + (self.schedule.warmup if action == profiler.ProfilerAction.WARMUP else 0)
        self._window = {"warmup_from": step, "first_step": step if action.value >= RECORD else None}
        if not self.config.quiet:
            last = first_record + self.schedule.active - 1
            span = f"step {first_record}" if first_record == last else f"steps {first_record}-{last}"
            say(f"{worker_name()}: profiling {span}" + (f" (warming up from step {step})" if step < first_record else ""))
        self.guard_signals(True)
        prof.start()

    def _torch_schedule(self, step: int) -> Any:
        import torch.profiler as profiler

        return profiler.ProfilerAction(self.schedule.action(step))

    def _close(self) -> None:
        # prof stays `self.prof` during stop(), so the start/stop hooks recognize it as ours.
        try:
            self.prof.stop()
        finally:
            self.prof = None
            self._window = None
            self.guard_signals(False)

    def _on_trace_ready(self, prof: Any) -> None:
        """torch calls this when a cycle's recording ends (or at stop with a window open): save it now."""
        window = self._window or {"warmup_from": prof.step_num, "first_step": prof.step_num}
        complete = not self._cut_reason
        last = prof.step_num - 1 if complete else prof.step_num
        first = window["first_step"] if window["first_step"] is not None else last
        try:
            path, size = export_trace(prof, self.config.out_dir, self.config.use_gzip)
        except Exception as exc:
            say(f"could not save the trace of steps {first}-{last}: {type(exc).__name__}: {exc}")
            self.notes.append(f"trace of steps {first}-{last} not saved: {exc}")
        else:
            record = {"first_step": first, "last_step": last, "trace": path, "bytes": size, "complete": complete}
            if not complete:
                record["note"] = self._cut_reason
            self.windows.append(record)
            if not self.config.quiet:
                steps = f"step {first}" if first == last else f"steps {first}-{last}"
                extra = "" if complete else f", {self._cut_reason}"
                say(f"saved trace of {steps}{extra}: {path} ({human_size(size)})")
        # With wait=0 the same object goes straight on to the next cycle's warmup.
        self._window = {"warmup_from": prof.step_num, "first_step": None}
        self.on_saved()

    def stop(self, reason: str) -> None:
        """Close an open window now, saving what it recorded (program exit, or the program's own profiler)."""
        if self.prof is None:
            return
        self._cut_reason = reason
        try:
            self._close()
        except Exception as exc:
            self.notes.append(f"could not close the profiler: {exc}")
        finally:
            self._cut_reason = ""

    def _disable(self, message: str) -> None:
        self.disabled = True
        self.notes.append(message)
        say(message)
        prof, self.prof = self.prof, None
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass

    # -- the program's own profilers ---------------------------------------------------------------------------
    def foreign_started(self, key: int) -> None:
        """The program started a profiler of its own: nesting would leave the outer one empty, so we step aside."""
        if not self.foreign:
            self.stop("cut short: the program started its own profiler")
        self.foreign.add(key)
        self.tracker.set_phase(FOREIGN)
        self.tracker.wake_next_step()

    def foreign_stopped(self, key: int) -> None:
        """Stops of profilers we never saw start (torch's internal legacy profile objects) are ignored."""
        if key in self.foreign:
            self.foreign.discard(key)
            self.tracker.wake_next_step()

