"""A forked child that does one piece of work and leaves, never returning into the code that forked it.

`stepcli table` forks helpers of its own (stepcli.traces.readahead, stepcli.traces.twoprocess). A child must never
unwind into click, print a second "Aborted!", run the parent's exit handlers or flush output the parent still
buffers: it ends with os._exit whatever happens. SIGINT is blocked across the fork and unblocked inside the
child's guard, so a Ctrl-C cannot land in the moment between the fork and the guard.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def fork_child(work: Callable[[], object]) -> int:
    """Fork a child that runs `work()` and exits with status 0, or 1 if it raised anything (Ctrl-C too); the
    child's pid. Raises OSError when the fork is refused (a process limit)."""
    for stream in (sys.stdout, sys.stderr):  # a forked process must not inherit text this one still buffers
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return pid
    status = 1
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # (a Ctrl-C pending since the fork is raised here)
        work()
        status = 0
    except BaseException:  # the parent sees a failed child and does its work itself
        pass
    finally:
        os._exit(status)
