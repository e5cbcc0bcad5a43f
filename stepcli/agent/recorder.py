"""Drives `torch.profiler.profile` through the schedule, one profiler object per window.

Runs inside the target: standard library plus the program's own torch. A profiler object that merely
sits in its wait phase costs 25-60 us per step (it opens a `ProfilerStep#N` record_function every
step), so none exists outside a window: one is created at the first warmup step of a cycle, told
which global step it is at, stepped once per global step, and dropped when the cycle has been saved.

Kineto's session belongs to the thread that started it: stopping it from any other thread, even
after that thread has ended, crashes the process (measured on torch 2.13, with plain torch.profiler
too). atexit and signal handlers run on the main thread, so windows are opened only there; every
profiler call happens on the main thread, steps counted on other threads are caught up by it, and a
cycle that would start on another thread is skipped with a note.
"""

from __future__ import annotations

import sys
import threading

from stepcli.runfolder.layout import INCOMPLETE_STEP_KEY, flops_path

from .config import AgentConfig
from .cpuwait import CpuWait
from .interrupts import Held
from .output import (
    cause,
    export_trace,
    human_size,
    rank_prefix,
    say,
    trace_folder,
    worker_name,
    write_failed,
)
from .schedule import NONE, RECORD, RECORD_AND_SAVE, WARMUP
from .torchprofiler import (
    begin_step_range,
    cuda_sync_events,
    end_step_range,
    mark_clock,
    step_without_range,
)
from .torchquiet import QuietProfiler, ask_cupti_teardown
from .tracecost import SaveClock, first_window_cost, took
from .tracker import AFTER_WINDOW, FOREIGN, NEVER, StepTracker
from .windowstate import WindowState

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_ACTIVITY_NAMES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}


class Recorder:
    """Opens, steps and saves profiler windows; steps aside while the program runs a profiler of its
    own."""

    def __init__(
        self,
        config: AgentConfig,
        tracker: StepTracker,
        foreign: set[int],
        on_saved: Callable[[], None],
        guard_signals: Callable[[bool], None] = lambda on: None,
        deliver_signal: Callable[[int], None] = lambda signum: None,
    ) -> None:
        self.config = config
        self.schedule = config.schedule
        self.tracker = tracker
        self.foreign = foreign  # the program's own profilers now running (kept by the agent)
        self.on_saved = on_saved
        self.guard_signals = guard_signals
        self.deliver_signal = deliver_signal
        self.busy = False  # inside profiler work: a signal arriving now waits until it is done
        self.deferred_signal = 0
        self.prof: Any = None
        self.building = False  # true while our own profile object is being constructed
        self.started_once = False
        self.windows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.skipped_windows = 0
        self.disabled = False
        self._abandoned: list[Any] = []
        # open or not, its first recorded step, how it closes, what was asked of it
        self.window = WindowState()
        # the recorded steps' time on and waiting for a CPU, into the trace
        self._cpu_time = CpuWait()
        # the pause of the open window's save, and lines while it lasts
        self._save_clock = SaveClock()
        # Set by the agent: will the program's idle profiler start collecting within this many of
        # its steps?
        self.program_profiler_due: Callable[[int], bool] = lambda steps: False
        # Set by on-demand capture: what triggered the window recording from this step
        # (--capture-on-slow), if any
        self.trigger_at: Callable[[int], dict[str, Any] | None] = lambda step: None

    # -- schedule
    # ---------------------------------------------------------------------------------------------
    def next_cycle_start(self, step: int) -> int:
        """The next step >= `step` at which a cycle's first profiled step begins (never
        mid-cycle)."""
        candidate = self.schedule.next_cycle_start(step)
        return NEVER if candidate is None else candidate

    def on_step(self, step: int) -> tuple[int, int]:
        """Global step `step` begins: advance the open window or open one. Returns (phase, next wake
        step)."""
        if self.disabled:
            # a write failed while this window was open
            if self.prof is not None and _on_main_thread():
                self._close()
            return NONE, NEVER
        if not _on_main_thread():
            return self._off_main_thread(step)
        if self.prof is not None:
            # what stepcli does at a step boundary is never counted in the program's step
            end_step_range(self.prof)
        # signal handlers run on the main thread: one arriving now waits for this work
        self.busy = True
        # (Ctrl-C too: in the middle of stopping the profiler or saving its trace it would lose the
        # window)
        with Held():
            try:
                return self._on_step(step)
            except Exception as exc:  # the program must never die of its profiler
                self._disable(
                    f"profiling stopped after an error in torch.profiler: {type(exc).__name__}: "
                    f"{exc}"
                )
                return NONE, NEVER
            finally:
                self.busy = False
                self.deliver_deferred_signal()

    def deliver_deferred_signal(self) -> None:
        if self.deferred_signal and _on_main_thread():
            signum, self.deferred_signal = self.deferred_signal, 0
            self.deliver_signal(signum)

    def _off_main_thread(self, step: int) -> tuple[int, int]:
        """A step made on another thread. torch records only the thread that started the profiler,
        so such a step would blur `ProfilerStep#N`: an open window ends at the main thread's next
        step (or at exit)."""
        if self.prof is not None:
            self.window.ask_cut("cut short: a step was made on another thread")
            return WARMUP, step + 1  # the profiler ran during it: not an untouched step
        if self.foreign:
            return FOREIGN, step + 1
        if self.schedule.starts_cycle(step):
            self._note_once(
                "steps on a thread other than the main thread: windows are recorded only on the "
                "main thread (Kineto cannot close another thread's session at exit)"
            )
            return NONE, self.next_cycle_start(step + 1)
        return NONE, self.next_cycle_start(step)

    def _on_step(self, step: int) -> tuple[int, int]:
        prof = self.prof
        if prof is not None:
            if self.window.pending_drop:
                self.drop(self.window.take_drop())
                return (
                    (FOREIGN, self.next_cycle_start(step + 1))
                    if self.foreign
                    else (AFTER_WINDOW, step + 1)
                )
            if self.window.pending_cut:
                self.stop(self.window.pending_cut)
                return (
                    (FOREIGN, self.next_cycle_start(step + 1))
                    if self.foreign
                    else (AFTER_WINDOW, step + 1)
                )
            self._cpu_time.end(prof)  # (before step(), which may stop the profiler)
            if prof.current_action.value == RECORD_AND_SAVE:
                # this step() stops the profiler and saves: a pause worth a line
                self._announce_save(step - 1)
            with QuietProfiler():
                step_without_range(prof)
            # disabled: saving its last cycle failed
            if prof.current_action.value == NONE or self.disabled:
                self._close()
                # This step pays for the stop and save: "after a window", not untouched; woken at
                # the next step again (to mark it untouched, or open the next window), as an idle
                # recorder would be.
                return AFTER_WINDOW, step + 1
            phase = self._phase_of(prof)
            if phase >= RECORD and self.window.is_open and self.window.first_step is None:
                self.window.recording_from(step)
                self._cpu_time.reset()
                mark_clock(prof)
                self._mark_trigger(prof, step)
            if phase >= RECORD:
                self._cpu_time.begin(step)
            begin_step_range(prof)  # the program's step starts now, after stepcli's bookkeeping
            return phase, step + 1
        if self.foreign or self._profiler_already_running():
            if self.schedule.starts_cycle(step):
                self.skipped_windows += 1
            return FOREIGN, step + 1
        if self.schedule.starts_cycle(step):
            if "torch" not in sys.modules:  # --step-on in a program that never imported torch
                self._disable("nothing to profile: the program never imported torch")
                return NONE, NEVER
            # scheduled or on-demand window alike
            warmup = _recorded_span(self.schedule, step)[0] - step
            if self.program_profiler_due(warmup + 1):  # it would cut ours before a whole step
                self.skipped_windows += 1
                return NONE, self.next_cycle_start(step + 1)
            self._open(step)
            return self.schedule.action(step), step + 1
        return NONE, self.next_cycle_start(step)

    def _note_once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    @staticmethod
    def _phase_of(prof: Any) -> int:
        action = prof.current_action.value
        # DEVICE_STOPPED: still a touched step
        return action if action <= RECORD_AND_SAVE else WARMUP

    def _profiler_already_running(self) -> bool:
        """A profiler we never saw start (begun before stepcli's hooks, or from C++): nesting would
        empty it."""
        autograd_profiler = sys.modules.get("torch.autograd.profiler")
        try:
            return bool(autograd_profiler is not None and autograd_profiler._is_profiler_enabled)
        except Exception:
            return False

    # -- profiler objects
    # ---------------------------------------------------------------------------------------
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
                self.notes.append(
                    f"activity {name} is not available in this torch build; not recorded"
                )
        return chosen or [profiler.ProfilerActivity.CPU]

    def _open(self, step: int) -> None:
        import torch.profiler as profiler  # already imported by the program (checked by the caller)

        action: Any = profiler.ProfilerAction(self.schedule.action(step))
        self.building = True
        ask_cupti_teardown()
        activities = self._activities(profiler)
        options: dict[str, Any] = dict(
            activities=activities,
            schedule=self._torch_schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
            with_flops=self.config.with_flops,
            with_modules=self.config.with_modules,
        )
        sync_events = cuda_sync_events(profiler, activities)
        try:
            with QuietProfiler():
                try:
                    prof = profiler.profile(**options, **sync_events)
                except TypeError:  # a torch whose profile() takes no experimental_config
                    if not sync_events:
                        raise
                    prof = profiler.profile(**options)
        finally:
            self.building = False
        # Start the object at the global step instead of 0, so ProfilerStep#N numbers global steps.
        prof.step_num = step
        prof.current_action = action
        prof._prev_schedule_action = action
        self.prof = prof
        self.window.open(step if action.value >= RECORD else None)
        if not self.config.quiet:
            first_record, last = _recorded_span(self.schedule, step)
            span = (
                f"step {first_record}" if first_record == last else f"steps {first_record}-{last}"
            )
            say(
                f"{worker_name()}: profiling {span}"
                + (f" (warming up from step {step})" if step < first_record else "")
            )
        self.guard_signals(True)
        with QuietProfiler():
            prof.start()
        # Kineto's threads now exist in this process: a forked child must not hang
        if not self.started_once:
            from .forkexit import prepare

            prepare()
            self.started_once = True
        self._cpu_time.reset()
        if action.value >= RECORD:
            mark_clock(prof)
            self._mark_trigger(prof, step)
            self._cpu_time.begin(step)

    def _torch_schedule(self, step: int) -> Any:
        import torch.profiler as profiler

        return profiler.ProfilerAction(self.schedule.action(step))

    def _close(self) -> None:
        # prof stays `self.prof` during stop(), so the start/stop hooks recognize it as ours.
        try:
            with QuietProfiler():
                self.prof.stop()
        finally:
            self.prof = None
            self.window.close()
            self.guard_signals(False)

    def _on_trace_ready(self, prof: Any) -> None:
        """torch calls this when a cycle's recording ends (or at stop with a window open): save it
        now."""
        window = self.window
        # A cycle that ends normally stops at the start of the step after its last; a cut-short one
        # stops inside step `step_num`, which only just began: it is marked so `table`/`compare`
        # leave it out.
        last = prof.step_num - 1
        first = window.first_step if window.first_step is not None else prof.step_num
        if window.discard:
            why = (
                window.cut_reason
                if window.dropping
                else f"{window.cut_reason} before it held a whole step"
            )
            self.notes.append(f"the window from step {first} was not saved ({why})")
        else:
            self._save(prof, first, last)
        self._save_clock.stop()  # (a window not saved: its ticker stops too)
        # With wait=0 the same object goes straight on to the next cycle's warmup.
        window.next_cycle()
        self.on_saved()

    def _save(self, prof: Any, first: int, last: int) -> None:
        complete = not self.window.cut_reason
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        if self.disabled:  # a write failed before: nothing more is saved in this process
            return
        folder = self.config.out_dir
        try:
            # A window asked for on demand gets a folder of its own, like each window of --repeat.
            several = self.config.schedule.repeat != 1 or _asked_for(self.schedule, first)
            folder = trace_folder(self.config.out_dir, first, several)
            path, info = export_trace(prof, folder, self.config.use_gzip, own_folder=several)
        except Exception as exc:
            self.stop_after_write_failure(
                f"could not save the trace of {steps} in {folder}: {cause(exc)}"
            )
            return
        record: dict[str, Any] = {
            "first_step": first,
            "last_step": last,
            "trace": path,
            "bytes": info.st_size,
            # the file this process wrote: a same-size forgery swapped in is another inode
            "inode": info.st_ino,
            "device": info.st_dev,
            "complete": complete,
        }
        if not complete:
            record["note"] = self.window.cut_reason
        if self.config.with_flops:
            record["flops"] = self._write_flops(prof, path, first, last)
        if (pause := self._save_clock.stop()) is not None:
            record["save_s"] = round(pause, 3)  # stopping the profiler and writing the file
        self.windows.append(record)
        # said now, and a note of the summary
        heavy = first_window_cost(self.windows, steps, self.config)
        self.notes += [heavy] if heavy else []
        if not self.config.quiet:
            extra = (
                ""
                if complete
                else f" ({self.window.cut_reason}; the start of step {last + 1} is in it too)"
            )
            # the path on its own line (kept whole, never wrapped: it can be copied), the rank first
            # on several
            say(
                f"{rank_prefix()}saved trace of {steps}{extra}{took(pause)} "
                f"({human_size(info.st_size)}):"
            )
            say(f"  {path}")
            if heavy:
                say(heavy)

    def _write_flops(self, prof: Any, trace: str, first: int, last: int) -> int | None:
        """The window's estimated FLOPs (the sum of key_averages()' flops), written beside the trace
        as `NAME.flops` (flops_path) with the device's name; None when torch could not count
        them."""
        import json

        try:
            flops = int(sum(event.flops for event in prof.key_averages()))
            device = None
            torch = sys.modules.get("torch")
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_available() and cuda.is_initialized():
                device = cuda.get_device_name(cuda.current_device())
            document = {"schema": "stepcli.flops", "version": 1, "flops": flops, "device": device}
            document["first_step"], document["last_step"] = first, last
            final = flops_path(trace)
            from stepcli import safefile

            safefile.write_bytes(final, json.dumps(document).encode("utf-8"))
            return flops
        except Exception as exc:
            self.notes.append(
                f"FLOPs of steps {first}-{last} not saved: {type(exc).__name__}: {exc}"
            )
            return None

    def _mark_trigger(self, prof: Any, step: int) -> None:
        """A window --capture-on-slow placed says why it exists in its own trace (TRIGGER_KEY, as
        trigger.json beside it has it), so a trace passed on keeps its reason. While Kineto records:
        add_metadata is dropped outside that."""
        try:
            trigger = self.trigger_at(step)
            if trigger:
                import json

                from .triggerinfo import TRIGGER_KEY

                prof.add_metadata_json(TRIGGER_KEY, json.dumps(trigger))
        except Exception:  # trigger.json and the step log still say it
            pass

    def stop(self, reason: str) -> None:
        """Close an open window now, saving its completed steps (program exit, or the program's own
        profiler).

        Only the main thread may stop it; elsewhere the stop waits for the main thread's next
        step."""
        prof = self.prof
        if prof is None:
            return
        if not _on_main_thread():
            self.window.ask_cut(reason)
            return
        first = self.window.first_step
        self.window.closing(reason, discard=first is None or first > prof.step_num - 1)
        if not self.window.discard:
            self._announce_save(prof.step_num - 1)
        busy, self.busy = self.busy, True
        try:
            try:
                prof.add_metadata(INCOMPLETE_STEP_KEY, str(prof.step_num))
            finally:
                self._close()
        except Exception as exc:
            self.notes.append(f"could not close the profiler: {exc}")
        finally:
            self._save_clock.stop()
            self.window.closed_early()
            self.window.pending_cut = ""
            self.busy = busy

    def drop(self, reason: str) -> None:
        """Close the open window without saving it: nobody wants it any more (its capture gave up).
        Only the main thread may stop it; elsewhere the drop waits for the main thread's next
        step."""
        if self.prof is None:
            return
        if not _on_main_thread():
            self.window.ask_drop(reason)
            return
        busy, self.busy = self.busy, True
        self.window.closing(reason, discard=True, dropping=True)
        try:
            self._close()
        except Exception as exc:
            self.notes.append(f"could not close the profiler: {exc}")
        finally:
            self.window.closed_early()
            self.busy = busy

    def _announce_save(self, last: int) -> None:
        """`saving trace of steps A-B ...` before torch stops the profiler and writes the file,
        which can freeze the program for seconds on a large window: the user sees why (every few
        seconds: SaveTicker); timed from here."""
        first = self.window.first_step
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        self._save_clock.start(None if self.config.quiet or first is None else steps)
        if not (self.config.quiet or first is None):
            say(f"{rank_prefix()}saving trace of {steps} ...")

    def stop_after_write_failure(self, message: str) -> None:
        """A trace or the step log could not be written (a full or read-only folder): one line, and
        no window opens again in this process; an open one is closed unsaved at the main thread's
        next step."""
        self.disabled = True
        self.notes.append(f"{message}; profiling stopped")
        write_failed(f"{message}; profiling stops in this process")

    def _disable(self, message: str) -> None:
        """Stop profiling for good; an open window is closed unsaved (a profiler left running
        crashes at exit)."""
        self.disabled = True
        self.notes.append(message)
        say(message)
        prof = self.prof
        if prof is not None and _on_main_thread():
            self.window.closing("profiling was disabled", discard=True)
            try:
                with QuietProfiler():
                    prof.stop()
            except Exception:
                pass
            finally:
                self.prof = None
                self.window.closed_early()
        elif prof is not None:
            self.window.pending_cut = "profiling was disabled"  # closed by flush on the main thread

    # -- the program's own profilers
    # ---------------------------------------------------------------------------
    def step_aside(self, first: bool) -> None:
        """The program started a profiler of its own: nesting would leave the outer one empty, so we
        step aside."""
        if first and self.prof is not None:
            if _on_main_thread():
                self.stop("cut short: the program started its own profiler")
            else:
                # Ours cannot be stopped from this thread, and stopping it later, after the
                # program's profiler has run inside it, crashes Kineto: it is abandoned, never
                # stopped, and kept referenced.
                self._abandoned.append(self.prof)
                self.prof = None
                self.window.close()
                self.guard_signals(False)
                self.notes.append(
                    "a window was abandoned: the program started its own profiler on another thread"
                )
        self.tracker.set_phase(FOREIGN)
        self.tracker.wake_next_step()


def _recorded_span(schedule: Any, step: int) -> tuple[int, int]:
    """(first, last) recorded step of the window that starts at `step` (scheduled or asked for on
    demand)."""
    # arithmetic: no loop over the window's steps
    span: tuple[int, int] = schedule.recorded_span(step)
    return span


def _asked_for(schedule: Any, step: int) -> bool:
    """Whether `step` belongs to a window asked for on demand (only a WindowSchedule holds
    those)."""
    on_demand = getattr(schedule, "on_demand", None)
    return bool(on_demand(step)) if on_demand is not None else False


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
