"""Ctrl-C held back while stepcli's own work must not be cut in half, then delivered to the program
as it came.

Runs inside the target: standard library only. A SIGINT raises KeyboardInterrupt wherever the main
thread is. When that is inside torch.profiler's stop or the trace's export (seconds, the moment a
user sees the program pause and presses Ctrl-C), the profiler is left half stopped and the window's
trace is lost. So while stepcli's driver works (`Held`), a program's Python-level SIGINT handler
(the default's KeyboardInterrupt, or the program's own) is swapped for one that only notes the
signal; afterwards the handler is put back and the signal raised again, so the program gets it once,
just after. A SIGINT that is ignored or left to the system is not touched. `redeliver` does the same
for one raised where Python drops it (a gc callback).
"""

from __future__ import annotations

import signal
import threading
import time

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Any


class Held:
    """`with Held():` SIGINT waits until the block is done (on the main thread; elsewhere it does
    nothing)."""

    __slots__ = ("_previous", "_arrived")

    def __init__(self) -> None:
        self._previous: Any = None
        self._arrived = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._arrived = True

    def __enter__(self) -> Held:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            previous = signal.getsignal(signal.SIGINT)
            # (a program that takes signals through the wakeup fd, asyncio's add_signal_handler,
            # gets the first one there whatever the handler: holding it would have it run twice)
            wakeup = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(wakeup)
            # a Python handler: KeyboardInterrupt's, or the program's own
            if callable(previous) and wakeup == -1:
                signal.signal(signal.SIGINT, self._note)
                self._previous = previous
        except (ValueError, OSError):  # (an interpreter without signals)
            pass
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        previous, self._previous = self._previous, None
        if previous is None:
            return
        try:
            # (the program may have set its own meanwhile)
            if signal.getsignal(signal.SIGINT) == self._note:
                signal.signal(signal.SIGINT, previous)
        except (ValueError, OSError):
            return
        if self._arrived:
            self._arrived = False
            redeliver()


def redeliver() -> None:
    """Raise SIGINT again, a moment later from a thread of its own: the program's handler runs on
    the main thread at its next check, after stepcli's code has returned (raised at once, it would
    run inside it: a gc callback drops it again, and a step's bookkeeping would be cut; one still
    caught there is passed on again). Raised where it is when no thread can start (at exit)."""
    try:
        threading.Thread(target=_raise_soon, name="stepcli-sigint", daemon=True).start()
    except RuntimeError:
        _raise()


def _raise_soon() -> None:
    time.sleep(_AFTER_S)
    _raise()


# stepcli's code around a gc callback or a step returns within microseconds, even on a busy machine
_AFTER_S = 0.02


def _raise() -> None:
    """SIGINT to the main thread itself, so a main thread blocked in a sleep, a lock or a read is
    woken (EINTR) as by a real Ctrl-C, which a signal raised on this thread would not do."""
    try:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    except (ValueError, OSError, AttributeError):
        try:
            signal.raise_signal(signal.SIGINT)
        except (ValueError, OSError):
            pass
