"""The exit guard: however a profiled process ends, its step log is saved once first, then it ends
as it would have.

atexit runs the save for a normal exit (runtime.Agent registers `flush`). SIGTERM and SIGHUP skip
atexit: their handlers save, then end the process of the same signal, so its exit status still says
what killed it. os._exit skips both: it is wrapped. A signal arriving during profiler work waits for
it (the recorder's `busy`); one arriving during the final save waits for the save. A Python-level
handler cannot run while the main thread is blocked in C (a collective waiting for a dead peer): the
stacks thread sees the signal too and, when the main thread has not taken it within a second, saves
the step log itself and ends the process (`die_off_main_thread`).

Runs inside the target: standard library only. The agent gives it three callables, so it is tested
without one (tests/unit/test_agent_exitguard.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .recorder import Recorder

SAVE_WAIT_S = 30.0  # a signal waits this long at most for another thread's final save


class ExitGuard:
    """Saves once, in the process that made the steps, before it ends; then lets it end as it would
    have."""

    def __init__(
        self,
        save: Callable[[str, bool], None],
        owns_the_steps: Callable[[], bool],
        recorder: Callable[[], Recorder | None],
    ) -> None:
        # the final save: (why the process ends, whether the main thread is blocked)
        self._save = save
        # False in a forked child: its parent's steps are not its own
        self._owns_the_steps = owns_the_steps
        self._recorder = recorder
        # the stacks thread and the main thread both save the step log
        self.lock = threading.RLock()
        self.flushed = False  # the final save was made (or is being made)
        # SIGTERM/SIGHUP save first for the whole run, not only during windows
        self.signals_guarded = False
        # the signal whose handler the main thread entered (stacks.py waits for it)
        self.signal_handled = 0
        self._saving_on: int | None = None  # the thread now writing the final save, while it does
        # a SIGTERM/SIGHUP that arrived during this thread's own final save
        self._pending_signal = 0

    def guard_signals(self, on: bool) -> None:
        """SIGTERM/SIGHUP (which skip atexit) first save the open window and the step log, then kill
        as before.

        Installed once the process trains, for the whole run (`guard_for_the_run`), and around each
        window, for a process that armed on another thread. Only where the program left the default
        action."""
        if threading.current_thread() is not threading.main_thread():
            return
        if not on and self.signals_guarded:
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            try:
                current = signal.getsignal(signum)
                if on and current == signal.SIG_DFL:
                    signal.signal(signum, self.on_signal)
                elif not on and current == self.on_signal:
                    signal.signal(signum, signal.SIG_DFL)
            except (ValueError, OSError):
                pass

    def guard_for_the_run(self) -> None:
        """SIGTERM/SIGHUP save first from now to the end of the run (the process trains)."""
        self.guard_signals(True)
        self.signals_guarded = True

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.signal_handled = signum
        recorder = self._recorder()
        # mid-export, mid-transition or mid-flush: finish that first
        if recorder is not None and recorder.busy:
            recorder.deferred_signal = signum
            return
        self.die_of(signum)

    def die_of(self, signum: int) -> None:
        """Save, then die of the same signal, so the exit status still says what killed the program.

        The final save may be under way already: on this thread (a second SIGTERM, from torchrun
        forwarding the scheduler's, lands inside the first one's save) the signal waits for it; on
        the stacks thread (it took a signal the blocked main thread could not) this one waits until
        the save is written. Dying at once would cut the step log short and leave the last progress
        save saying "running"."""
        saving = self._saving_on
        if saving == threading.get_ident():
            self._pending_signal = signum
            return
        if saving is not None:
            self.lock.acquire(timeout=SAVE_WAIT_S)
        self.flush(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def guard_os_exit(self) -> None:
        """os._exit skips atexit: save first (in the process that made the steps)."""
        original = os._exit
        if getattr(original, "_stepcli", False):
            return
        guard = self

        def stepcli_os_exit(status: int) -> Any:
            if guard._owns_the_steps():
                guard.flush("os._exit")
            return original(status)

        stepcli_os_exit._stepcli = True  # type: ignore[attr-defined]
        os._exit = stepcli_os_exit

    def die_off_main_thread(self, signum: int) -> None:
        """The stacks thread's end of a SIGTERM/SIGHUP the main thread could not take (blocked in
        C): save the step log (an open window cannot be saved from this thread: it is named in the
        notes), then die of the same signal, so the exit status says what killed the process."""
        try:
            self.flush(signal.Signals(signum).name, blocked=True)
        finally:
            die_now(signum)

    def flush(self, reason: str, blocked: bool = False) -> None:
        """The final save, once, and only in the process that made the steps. `blocked`: the main
        thread cannot run (saved by the stacks thread)."""
        if self.flushed or not self._owns_the_steps():
            return
        with self.lock:
            if self.flushed:
                return
            self.flushed = True
            self._saving_on = threading.get_ident()
            try:
                self._save(reason, blocked)
            finally:
                self._saving_on = None
        pending, self._pending_signal = self._pending_signal, 0
        # it arrived mid-save (at exit, say): delivered now, as it would have been without stepcli
        if pending:
            signal.signal(pending, signal.SIG_DFL)
            os.kill(os.getpid(), pending)


def die_now(signum: int) -> None:
    """End this process of `signum` from any thread: Python's own handler (which only the blocked
    main thread could run) is replaced by the default action through libc, then the signal is sent;
    SIGKILL if that fails."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(1.0)  # delivered to some thread at once; the default action ends every thread
    except Exception:
        pass
    os.kill(os.getpid(), signal.SIGKILL)
