"""Leave the process without the interpreter's teardown.

At a normal exit Python frees every module and object one by one and runs a last garbage collection:
with numpy, msgspec, click and a trace's tables loaded that is ~75 ms, 15% of `stepcli table` on a
100k-event trace, spent on memory the operating system takes back at once anyway. The `stepcli`
command therefore ends with os._exit, after doing what the teardown would have done that anyone can
see: the atexit handlers run (logging, multiprocessing, coverage) and the standard streams are
flushed. Every file stepcli writes is closed where it is written.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def quick_exit(code: int) -> NoReturn:
    """Exit with `code` now; the ordinary way (sys.exit) while other threads run, since they would
    be joined."""
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        # a closed pipe (`| head`): nothing more to show
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def remove_temps_on_signals() -> None:
    """From now on SIGTERM and SIGHUP (where they would kill the process, not where ignored or
    handled) first remove the temporary files being written, then end the process by the same
    signal, as before. Ctrl-C raises KeyboardInterrupt, whose unwinding removes them
    (safefile.NewFile.__exit__); the command's last words call safefile.remove_live_temps too. For
    the stepcli command's own process only (never the profiled program)."""
    import signal

    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None and signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _remove_and_die)


def _remove_and_die(signum: int, frame: object) -> None:
    import signal

    from stepcli.safefile import remove_live_temps

    remove_live_temps()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
