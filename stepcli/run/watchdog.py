"""If stepcli itself dies, even of SIGKILL, the program's whole process group goes down with it.

On Linux the program already gets SIGTERM when stepcli dies (PR_SET_PDEATHSIG, set in the launcher)
and saves its open window; but processes the program started (a `sleep 300`, a data server) would be
left running under init. A tiny forked watchdog holds the read end of a pipe whose write end only
stepcli holds: the kernel closes it when stepcli dies, however it dies. Seeing end-of-file without
the "done" byte, the watchdog gives the program time to save its trace, then sends SIGTERM and,
after a grace period, SIGKILL to the program's processes.

Which processes: in the background the program leads a process group of its own, and that group is
the job. In a terminal's foreground the program shares stepcli's group, and so the group of whoever
started stepcli: a shell script run from a terminal is in it. There the watchdog ends the program's
tree (its descendants, found from /proc) and the group's members that were orphaned on the way
(re-parented out of the group, to init or a subreaper outside it) and carry the run's own
`STEPCLI_CONFIG` in their environment, never a member that descends from a process older than the
program (the calling script and what else it runs), nor an orphan the calling script made itself
while the program ran (`( helper & )`), which has no such environment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

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


def start_watchdog(
    program_pid: int, program_pgid: int, job_marker: bytes | None = None
) -> Watchdog | None:
    """Fork the watchdog for the program started as `program_pid` in process group `program_pgid`.
    `job_marker`: the environment entry (`NAME=value`) the program was started with, that marks its
    job's orphans."""
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
            # hold no one's pipes open (a caller reading stepcli's output waits for EOF)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            # out of the terminal's and the program's groups: their signals are not for it
            os.setsid()
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            # stepcli blocks signals while it starts the program
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            program_start = _start_time(program_pid) if sys.platform.startswith("linux") else None
            if _wait_for_eof(read_fd) != _DONE:
                _take_down(program_pid, program_pgid, program_start, job_marker)
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


def _take_down(
    program_pid: int, program_pgid: int, program_start: int | None, job_marker: bytes | None
) -> None:
    if not sys.platform.startswith("linux"):
        # no PR_SET_PDEATHSIG there: send it ourselves
        _signal(lambda: os.kill(program_pid, signal.SIGTERM))
    deadline = time.monotonic() + SAVE_GRACE_S
    while _alive(program_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if program_pgid == program_pid:  # the program leads its own group: the group is the job
        _end_group(program_pgid)
    # a group shared with stepcli's caller: only the program's processes
    elif program_start is not None:
        _end_each(lambda: job_processes(program_pid, program_pgid, program_start, job_marker))
    else:
        _end_each(lambda: [program_pid] if _alive(program_pid) else [])


def _end_group(pgid: int) -> None:
    if not _signal(lambda: os.killpg(pgid, signal.SIGTERM)):
        return  # the group is gone already
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    _signal(lambda: os.killpg(pgid, signal.SIGKILL))


def _end_each(find: Callable[[], list[int]]) -> None:
    """SIGTERM to each process `find()` names (looked up again as they fork), SIGKILL to those left
    after the grace."""
    deadline = time.monotonic() + TERM_GRACE_S
    termed: set[int] = set()
    while time.monotonic() < deadline:
        pids = find()
        if not pids:
            return
        for pid in pids:
            if pid not in termed:
                termed.add(pid)
                _kill(pid, signal.SIGTERM)
        time.sleep(0.05)
    for pid in find():
        _kill(pid, signal.SIGKILL)


class _Proc(NamedTuple):
    ppid: int
    pgid: int
    start: int  # clock ticks since boot


def _stat(pid: int) -> _Proc | None:
    """Parent, process group and start time of `pid` from /proc/PID/stat; None when it is gone or a
    zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()
        if fields[0] == b"Z":
            return None
        return _Proc(int(fields[1]), int(fields[2]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    found = _stat(pid)
    return found.start if found is not None else None


def job_processes(
    program_pid: int, pgid: int, program_start: int, marker: bytes | None = None
) -> list[int]:
    """The live processes of the program's job when it shares process group `pgid` with stepcli's
    caller.

    A process belongs to the job when its chain of parents reaches the program, or leaves the group
    (an orphan re-parented to init) before it meets a group member older than the program (the
    caller's own processes) and its environment holds `marker` (the caller's own orphans do not:
    they never descended from the program)."""
    procs: dict[int, _Proc] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                procs[int(entry)] = found
    procs.pop(os.getpid(), None)
    members = []
    for pid in procs:
        how = _of_job(pid, procs, program_pid, pgid, program_start)
        if how == _DESCENDANT or (how == _ORPHAN and (marker is None or _has_entry(pid, marker))):
            members.append(pid)
    return members


def _has_entry(pid: int, entry: bytes) -> bool:
    """Whether `entry` (`NAME=value`) is in the environment `pid` was started with (False when
    unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return entry in handle.read().split(b"\0")
    except OSError:
        return False


_DESCENDANT, _ORPHAN = "descendant", "orphan"


def _of_job(
    pid: int, procs: dict[int, _Proc], program_pid: int, pgid: int, program_start: int
) -> str:
    """_DESCENDANT: its parents reach the program; _ORPHAN: they leave the group below members
    younger than the program (re-parented to init: the job's daemon, or one the caller made itself);
    "" otherwise."""
    in_group_below = False  # a group member younger than the program was met on the way up
    seen: set[int] = set()
    while pid not in seen:
        seen.add(pid)
        proc = procs.get(pid)
        if proc is None:
            return ""
        if pid == program_pid:
            return _DESCENDANT if proc.start == program_start else ""  # not a reused pid
        if proc.pgid == pgid:
            if proc.start < program_start:  # the caller, or something it started before stepcli
                return ""
            in_group_below = True
        elif in_group_below:  # a member re-parented out of the group
            return _ORPHAN
        pid = proc.ppid
    return ""


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _signal(send: Callable[[], None]) -> bool:
    """Send a signal; False when its target is gone."""
    try:
        send()
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
