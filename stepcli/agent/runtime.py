"""The agent of one profiled process: activation, requesters, exit/signal/fork guards, when to save
the step log (steplogwriter.py writes it).

Runs inside the target: standard library only. `activate()` is all the bootstrap calls; it does
almost nothing until the program imports torch, and nothing costly until the process proves it
trains (an optimizer, a profiler object or a `--step-on` function appears). Processes that never
step write no files.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import weakref

from stepcli.runfolder.layout import HELLO_PREFIX

from . import hooks
from .config import AgentConfig, atomic_write_json
from .exitguard import ExitGuard
from .gcpauses import GcPauses
from .interrupts import Held
from .tracker import StepTracker

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable
    from types import ModuleType
    from typing import Any

    from .compiles import CompileWatcher
    from .ondemand import OnDemand
    from .recorder import Recorder
    from .stacks import StackDumper

_STEP_LOG_MIN_INTERVAL_S = 10.0
# The stacks thread saves the step log while the process trains (`save_progress`), so a process
# killed where no handler can run (SIGKILL, or blocked in C past its launcher's grace) still leaves
# every step it made: when it stops stepping (--hang-timeout) and at most this often otherwise,
# stretched so one save costs at most 1/_PROGRESS_COST_SHARE of the time between saves (the log is
# O(steps) to write).
PROGRESS_INTERVAL_S = 30.0
_PROGRESS_COST_SHARE = 100.0

_agent: Agent | None = None


class Agent:
    """Owns the tracker and recorder of this process; every hook is a no-op once `enabled` is
    False."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.pid = os.getpid()
        self.enabled = True
        self.tracker = StepTracker()
        self.recorder: Recorder | None = None
        self.ondemand: OnDemand | None = None
        self.compiles: CompileWatcher | None = None  # once the program imports torch._dynamo
        self.stacks: StackDumper | None = None  # once the process trains
        self.in_step: set[int] = set()
        # the program's own profilers now collecting (warmup or recording)
        self.foreign: set[int] = set()
        # ... and those started, collecting or idle
        self.entered: weakref.WeakSet[Any] = weakref.WeakSet()
        self.is_compiling: Callable[[], bool] = _never
        self.torch_imported = False
        self.trains = False
        self.exit_reason = ""
        # --step-on targets that could not be hooked, for the run summary
        self.hook_notes: list[str] = []
        self._names: dict[str, int] = {}
        self.saved_steps = -1  # global step of the last step log written (steplogwriter.py)
        # ... written when the process stopped stepping (its steps are whole)
        self.saved_stalled = False
        # a whole-run record was written: every later step log rewrites it too
        self.record_saved = False
        self._progress_due = 0.0  # time.monotonic() before which no periodic save is made
        self._forked_child = False
        # a profiler (ours or the program's) has run here: see forkexit.py
        self.profiler_started = False
        self._last_log_write = 0.0
        self.wall_start = time.time()
        self.hooks = hooks.PostImportHooks(self._hook_failed)
        self.gc_pauses = GcPauses()
        # SIGTERM/SIGHUP, os._exit and the exit itself save the step log first (once the process
        # trains)
        self.exits = ExitGuard(self._save_at_exit, self._owns_the_steps, lambda: self.recorder)

    # -- start-up
    # ---------------------------------------------------------------------------------------------
    def install(self) -> None:
        os.register_at_fork(after_in_child=self._forked)
        from .tracebacks import install as plain_tracebacks

        plain_tracebacks()  # the program's tracebacks without stepcli's wrapper frames
        self.gc_pauses.install()
        self.hooks.when_imported("torch", self._torch_imported)
        for spec in self.config.step_on:
            module_name, _, qualname = spec.partition(":")
            self.hooks.when_imported(module_name, self._step_on_patcher(spec, qualname))
        if self.config.hang_timeout:
            from .stacks import install_collective_hook

            install_collective_hook(self)
        self._top_level = os.getppid() == self.config.launcher_pid
        if self._top_level:
            self._write_hello()
            atexit.register(self._write_hello)

    def _torch_imported(self, torch: ModuleType) -> None:
        self.torch_imported = True
        if self._top_level:
            self._write_hello()  # so a later SIGKILL still shows torch was imported
        if self.tracker.global_step == 0:
            self.tracker.restart_clock()  # step 0 starts when torch is imported
        self.gc_pauses.torch_imported(torch, lambda: not self.foreign and self.window_open())
        compiler = getattr(torch, "compiler", None)
        self.is_compiling = getattr(compiler, "is_compiling", _never)
        from .patches import patch_optimizers, patch_profilers

        patch_optimizers(self, torch)
        patch_profilers(self, torch)
        if self.config.memory_entries:
            from .cudamemory import install

            install(self, torch, self.config.memory_entries)
        # imported by the program, never by us
        self.hooks.when_imported("torch._dynamo", self._dynamo_imported)

    def _dynamo_imported(self, dynamo: ModuleType) -> None:
        """The program uses torch.compile: attribute compile time to the steps where it happens."""
        if not self.enabled or self.compiles is not None:
            return
        from .compiles import CompileWatcher

        watcher = CompileWatcher(self.tracker)
        watcher.attach(dynamo)
        self.compiles = watcher

    def _step_on_patcher(self, spec: str, qualname: str) -> Callable[[ModuleType], None]:
        def patch(module: ModuleType) -> None:
            from .patches import patch_step_on

            patch_step_on(self, module, spec, qualname)

        return patch

    def _hook_failed(self, name: str, exc: BaseException) -> None:
        from .patches import StepOnError

        reason = str(exc) if isinstance(exc, StepOnError) else f"{type(exc).__name__}: {exc}"
        message = f"could not hook {name} ({reason}); it will not count steps"
        self.hook_notes.append(message)
        _say(message)

    # -- requesters
    # -------------------------------------------------------------------------------------------
    def requester_created(
        self, key: Hashable, base_name: str, owner: object = None, arm: bool = True
    ) -> None:
        """A new step requester; the first one proves the process trains and arms the recorder and
        exit guards (`--step-on` functions arm at their first call instead: DataLoader workers
        import their modules too).

        `owner` (an optimizer or profiler whose id is `key`) un-registers the key when it is
        collected, so a new object at the same address starts fresh at the global step.
        """
        if not self.enabled or key in self.tracker.requesters:
            return
        if owner is not None:
            try:
                weakref.finalize(owner, self.tracker.forget, key)
            except TypeError:  # not weak-referenceable
                pass
        index = self._names.get(base_name, 0)
        self._names[base_name] = index + 1
        self.tracker.register(key, f"{base_name}#{index}" if ":" not in base_name else base_name)
        if arm and not self.trains:
            self.arm()

    def arm(self) -> None:
        """This process trains: set up the recorder and the exit guards (once). Never raises."""
        if self.trains or not self.enabled:
            return
        self.trains = True
        try:
            from .recorder import Recorder  # loaded only by processes that train

            self.recorder = Recorder(
                self.config,
                self.tracker,
                self.foreign,
                self._window_saved,
                self.exits.guard_signals,
                self.exits.die_of,
            )
            self.recorder.program_profiler_due = self.program_profiler_due
            # Registered now, after torch's own atexit handlers, so ours runs first (LIFO).
            atexit.register(self.flush, "exit")
            self.exits.guard_os_exit()
            from .ondemand import OnDemand

            self.ondemand = OnDemand(self)  # first: it owns the schedule the recorder follows
            if self.config.slow_trigger:
                from .slowtrigger import SlowTrigger

                SlowTrigger(self, self.ondemand, self.config.slow_trigger)
            if self.stacks is None:
                from .stacks import start_stacks

                self.stacks = start_stacks(self)  # `capture --stacks` and --hang-timeout dumps
            else:
                self.stacks.train()  # registered when it joined its job (joined_job)
            self.tracker.set_listener(
                self.recorder.on_step, self.recorder.next_cycle_start(self.tracker.global_step)
            )
            self.exits.guard_for_the_run()  # SIGTERM/SIGHUP save the step log first
            if self.stacks is not None:
                # ... even while the main thread is blocked in C
                self.stacks.watch_signals(self.exits.on_signal)
            self.tracker.begin()
        except Exception as exc:
            self.fail("starting the recorder", exc)

    def joined_job(self) -> None:
        """torch.distributed.init_process_group was called (with --hang-timeout): register for stack
        dumps now, so that a rank stuck before its first step (loading data, building its model) is
        in a hang's report while the others wait for it; it counts towards calling a hang only once
        it trains. Never raises."""
        if self.stacks is None and not self.trains and self.enabled:
            from .stacks import start_stacks

            self.stacks = start_stacks(self, training=False)  # (never raises)

    def fail(self, what: str, exc: BaseException) -> None:
        """An error in stepcli's own bookkeeping: say so once and stop profiling; the program
        carries on."""
        if not self.enabled:
            return
        message = (
            f"profiling disabled in this process after an error in {what}: {type(exc).__name__}: "
            f"{exc}"
        )
        self.enabled = False
        self.tracker.set_listener(None)
        if self.recorder is not None:
            # closes an open window: one left running crashes at exit
            self.recorder._disable(message)
        else:
            _say(message)

    def is_own_profiler(self, prof: Any) -> bool:
        """True for the profile objects stepcli itself drives (its hooks must ignore them)."""
        recorder = self.recorder
        return recorder is not None and (recorder.building or prof is recorder.prof)

    def foreign_profiler_started(self, key: int) -> None:
        """The program started a profiler of its own (tracked even before this process trains)."""
        first = not self.foreign
        self.foreign.add(key)
        if self.recorder is not None:
            self.recorder.step_aside(first)

    def foreign_profiler_stopped(self, key: int) -> None:
        """Stops of profilers never seen starting (torch's internal legacy profile objects) are
        ignored."""
        if key in self.foreign:
            self.foreign.discard(key)
            self.tracker.wake_next_step()

    def program_profiler_entered(self, prof: Any) -> None:
        self.entered.add(prof)
        if not self.profiler_started:  # Kineto's threads will exist in this process (forkexit.py)
            from .forkexit import prepare

            prepare()
            self.profiler_started = True

    def program_profiler_left(self, prof: Any) -> None:
        self.entered.discard(prof)

    def window_open(self) -> bool:
        return self.recorder is not None and self.recorder.prof is not None

    def program_profiler_due(self, steps: int) -> bool:
        """Will an idle profiler of the program start collecting within its next `steps` step()
        calls?

        Asked before a window opens: a window the program's profiler would cut before it held a
        whole step costs a profiler start and saves nothing."""
        from .schedule import NONE

        for prof in list(self.entered):
            if id(prof) in self.foreign:
                continue
            try:
                schedule, step_num = prof.schedule, int(prof.step_num)
                # inside the step() that starts it
                now = int(bool(getattr(prof, "_stepcli_starting", False)))
                if any(
                    schedule(step_num + ahead - now).value != NONE for ahead in range(1, steps + 1)
                ):
                    return True
            # a schedule of the program's that cannot be asked: assume it stays idle
            except Exception:
                continue
        return False

    # -- exit, signals, fork
    # ----------------------------------------------------------------------------------
    def _forked(self) -> None:
        """A child forked from a process that trains (a DataLoader worker) never profiles or flushes
        its parent's state. One forked before its parent trained (`torch.multiprocessing` with the
        fork start method, a fork-per-rank launcher) has no parent state to inherit: it is a process
        of its own, as a spawned one is. Either way, a child of a process where a profiler ran must
        not hang in Kineto at exit (forkexit.py)."""
        if self.profiler_started or (self.recorder is not None and self.recorder.started_once):
            from .forkexit import skip_inherited_native_exit_handlers

            skip_inherited_native_exit_handlers()
        if self.enabled and not self.trains and self.recorder is None:
            self.pid = os.getpid()
            # its parent's, if it had joined a job (stopped in here): it registers its own
            self.stacks = None
            self._top_level = False  # its parent, not the launcher, started it
            self.tracker.restart_clock()
            return
        self.enabled = False
        self._forked_child = True
        self.tracker.set_listener(None)
        self.tracker.set_poller(None)
        self.tracker.watch_slow(None)  # --capture-on-slow belongs to the parent, like its windows
        self.recorder = None
        self.ondemand = None

    def die_off_main_thread(self, signum: int) -> None:
        """The stacks thread's end of a SIGTERM/SIGHUP the blocked main thread could not take
        (exitguard.py)."""
        self.exits.die_off_main_thread(signum)

    def flush(self, reason: str, blocked: bool = False) -> None:
        """Save an open window and the step log, once, and only in the process that made them.
        `blocked`: the main thread cannot run (saved by the stacks thread)."""
        self.exits.flush(reason, blocked)

    def _owns_the_steps(self) -> bool:
        return os.getpid() == self.pid and not self._forked_child

    def _save_at_exit(self, reason: str, blocked: bool) -> None:
        from .steplogwriter import save_at_exit

        # a Ctrl-C at exit (a second one, say) would cut the last window's trace in half
        with Held():
            save_at_exit(self, reason, blocked)

    def _window_saved(self) -> None:
        if self.ondemand is not None:
            self.ondemand.window_saved()
        now = time.monotonic()
        if now - self._last_log_write >= _STEP_LOG_MIN_INTERVAL_S:  # bounded cost with --repeat 0
            self._last_log_write = now
            from . import steplogwriter

            try:
                with self.exits.lock:
                    if not self.exits.flushed:
                        steplogwriter.write_step_log(self)
            except Exception as exc:
                steplogwriter.step_log_failed(self, exc)

    def save_progress(self, stalled: bool = False) -> bool:
        """From the stacks thread: save the step log and the whole-run record as they are now, when
        steps were made since the last save and the process has not saved its final one; `stalled`:
        it stopped stepping (--hang-timeout), saved at once. Otherwise at most every
        PROGRESS_INTERVAL_S (stretched for long logs). Whether it saved. A process killed later
        (SIGKILL) still leaves every step it made."""
        now = time.monotonic()
        if self.exits.flushed or not self.trains or not self.enabled or not self._owns_the_steps():
            return False
        saved = self.tracker.global_step == self.saved_steps
        # (a saved log that says "stalled" is wrong once steps resume: it is replaced at once, not
        # 30 s later)
        due = now >= self._progress_due or self.saved_stalled
        if (saved and (not stalled or self.saved_stalled)) or (not stalled and not due):
            return False
        with self.exits.lock:
            if self.exits.flushed:
                return False
            from .steplogwriter import write_step_log

            started = time.monotonic()
            try:
                write_step_log(self, progress="stalled" if stalled else "running")
            except Exception:
                return False  # the exit save says it, once, if it fails too
            cost = time.monotonic() - started
            self._progress_due = time.monotonic() + max(
                PROGRESS_INTERVAL_S, cost * _PROGRESS_COST_SHARE
            )
            return True

    # -- files
    # ----------------------------------------------------------------------------------------------
    def _write_hello(self) -> None:
        """The launcher's own child says it ran, so "no steps" can be told apart from "the hook
        never loaded"."""
        try:
            os.makedirs(self.config.log_dir, mode=0o700, exist_ok=True)
            atomic_write_json(
                os.path.join(self.config.log_dir, f"{HELLO_PREFIX}{self.pid}.json"),
                {
                    "pid": self.pid,
                    "argv": list(sys.argv),
                    "torch_imported": self.torch_imported,
                    "steps": self.tracker.global_step,
                    # a process that never steps writes no step log
                    "hook_notes": list(self.hook_notes),
                },
                0o600,
                private_folder=True,
            )
        except Exception:
            pass


def _never() -> bool:
    return False


def _say(message: str) -> None:
    from .output import say

    say(message)


def activate(config_text: str) -> Agent | None:
    """Start the agent in this process (idempotent); the bootstrap reports any exception as one
    line."""
    global _agent
    if _agent is not None:
        return _agent
    agent = Agent(AgentConfig.from_env(config_text))
    agent.install()
    _agent = agent
    return agent
