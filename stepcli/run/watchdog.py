"""If stepcli itself dies, even of SIGKILL, the program's whole process group goes down with it.

On Linux the program already gets SIGTERM when stepcli dies (PR_SET_PDEATHSIG, set in the launcher) and saves its
open window; but processes the program started (a `sleep 300`, a data server) would be left running under init.
A tiny forked watchdog holds the read end of a pipe whose write end only stepcli holds: the kernel closes it when
stepcli dies, however it dies. Seeing end-of-file without the "done" byte, the watchdog gives the program time
to save its trace, then sends SIGTERM and, after a grace period, SIGKILL to the program's process group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable

SAVE_GRACE_S = 30.0  # time for the program to save its open window after stepcli died
TERM_GRACE_S = 5.0  # time for the group to exit on SIGTERM before SIGKILL
_DONE = b"d"


class Watchdog:
    """The launcher's handle on its watchdog: `release()` once the program has exited normally."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._fd: int | None = write_fd

    def release(self) -> None:
        """Tell the watchdog the run ended under stepcli's control, and reap it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.write(fd, _DONE)
        except OSError:
            pass
        os.close(fd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def start_watchdog(program_pid: int, program_pgid: int) -> Watchdog | None:
    """Fork the watchdog for the program started as `program_pid` in process group `program_pgid`."""
    if not hasattr(os, "fork"):
        return None
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:  # the watchdog: never returns into stepcli's code
        status = 0
        try:
            os.close(write_fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # hold no one's pipes open (a caller reading stepcli's output waits for EOF)
                os.dup2(devnull, fd)
            os.setsid()  # out of the terminal's and the program's groups: their signals are not for it
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())  # stepcli blocks signals while it starts the program
            if _wait_for_eof(read_fd) != _DONE:
                _take_down(program_pid, program_pgid)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(read_fd)
    return Watchdog(pid, write_fd)


def _wait_for_eof(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, 1)
        except InterruptedError:
            continue


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie nobody reaped does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _take_down(program_pid: int, program_pgid: int) -> None:
    if not sys.platform.startswith("linux"):
        _signal(lambda: os.kill(program_pid, signal.SIGTERM))  # no PR_SET_PDEATHSIG there: send it ourselves
    deadline = time.monotonic() + SAVE_GRACE_S
    while _alive(program_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _signal(lambda: os.killpg(program_pgid, signal.SIGTERM)):
        return  # the group is gone already
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(program_pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    _signal(lambda: os.killpg(program_pgid, signal.SIGKILL))


def _signal(send: Callable[[], None]) -> bool:
    try:
        send()
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
