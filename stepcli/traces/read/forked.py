"""A forked child that does one piece of work and leaves, never returning into the code that forked
it.

`stepcli table` forks helpers of its own (stepcli.traces.read.readahead,
stepcli.traces.read.twoprocess). A child must never unwind into click, print a second "Aborted!",
run the parent's exit handlers or flush output the parent still buffers: it ends with os._exit
whatever happens. SIGINT is blocked across the fork and unblocked inside the child's guard, so a
Ctrl-C cannot land in the moment between the fork and the guard. Also how many cores such processes
(and the engine's workers) have to run on.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a job scheduler or taskset
    narrows): how many processes, helpers or workers, can usefully run at once."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def fork_child(work: Callable[[], object]) -> int:
    """Fork a child that runs `work()` and exits with status 0, or 1 if it raised anything (Ctrl-C
    too); the child's pid. Raises OSError when the fork is refused (a process limit)."""
    # a forked process must not inherit text this one still buffers
    for stream in (sys.stdout, sys.stderr):
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
        # (a Ctrl-C pending since the fork is raised here)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        work()
        status = 0
    except BaseException:  # the parent sees a failed child and does its work itself
        pass
    finally:
        os._exit(status)


def stop_child(pid: int) -> None:
    """Kill a child of fork_child and wait for it (it has not been waited for, so its pid is still
    its own)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
