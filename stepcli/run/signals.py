"""Signals between stepcli run and the program: forwarded once, never lost, no process left behind.

The program runs in a process group of its own outside a terminal's foreground (so a scheduler's
signal to stepcli's group reaches stepcli alone and is forwarded once) and gets SIGTERM if stepcli
dies.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class SignalForwarder:
    """Signals meant for the program reach it exactly once.

    In a terminal's foreground the program shares stepcli's process group, so the terminal's Ctrl-C
    (SIGINT, SIGQUIT) reaches it directly and is not forwarded. Anywhere else (CI, a scheduler, the
    background) the program gets a process group of its own, so a signal sent to stepcli's group
    reaches stepcli alone and is forwarded: SIGINT/SIGQUIT to the program's whole group, as a
    terminal would; SIGTERM, SIGHUP and SIGUSR1/2 (schedulers' pre-emption notices) to the program.
    A repeated SIGTERM/SIGHUP kills the whole tree."""

    FORWARDED = (
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGINT,
        signal.SIGQUIT,
    )
    FROM_TERMINAL = (signal.SIGINT, signal.SIGQUIT)
    FATAL = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, proc: subprocess.Popen[bytes], terminal_foreground: bool) -> None:
        self.proc = proc
        self.received: list[int] = []
        self.descendants: list[Any] = []
        self._previous: dict[int, Any] = {}
        self._terminal_foreground = terminal_foreground

    def __enter__(self) -> SignalForwarder:
        # Installed only after the child started: an ignored SIGINT at exec time would be inherited.
        for signum in self.FORWARDED:
            self._previous[signum] = signal.signal(signum, self._forward)
        if hasattr(signal, "SIGCHLD"):
            from stepcli.run.subreaper import reap_adopted

            # the job's orphans stepcli adopted (stepcli/run/subreaper.py) are reaped as they exit,
            # by pid
            self._previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, reap_adopted)
        return self

    def __exit__(self, *_exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _forward(self, signum: int, _frame: Any) -> None:
        if signum in self.FROM_TERMINAL and self._terminal_foreground:
            return  # the terminal sent it to the program too
        repeated = signum in self.FATAL and signum in self.received
        self.received.append(signum)
        if signum in self.FATAL:
            self._snapshot_descendants()
        try:
            if repeated:
                for process in [*self.descendants]:
                    _quietly(process.kill)
                self.proc.kill()
            elif signum in self.FROM_TERMINAL:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def _snapshot_descendants(self) -> None:
        try:
            import psutil

            known = {p.pid for p in self.descendants}
            self.descendants += [
                p
                for p in psutil.Process(self.proc.pid).children(recursive=True)
                if p.pid not in known
            ]
        except Exception:
            pass

    def reap_orphans(self, grace_s: float = 5.0) -> None:
        """After a forwarded SIGTERM/SIGHUP, no process the program started may outlive it: neither
        those of its tree nor the orphans stepcli adopted as their child subreaper (a daemonized
        grandchild)."""
        if not any(signum in self.FATAL for signum in self.received):
            return
        from stepcli.run import subreaper

        alive = [p for p in self.descendants if _quietly(p.is_running)]
        subreaper.terminate(alive, grace_s)
        subreaper.end_adopted(grace_s)


class SummaryCut(BaseException):
    """A SIGTERM, SIGHUP or SIGINT reached stepcli after the program ended, while it read the
    traces: the summary is cut short (a BaseException, so no `except Exception` on the way takes it
    for a bug)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


CUT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextmanager
def cut_by_signals(unblock: bool = False) -> Iterator[None]:
    """While the run is summarized: the first SIGTERM/SIGHUP/SIGINT raises SummaryCut (the program's
    status and the files CI reads next are kept, stepcli/run/summaryfallback.py); a second one acts
    as it would have without stepcli. `unblock`: the launcher held them since the program ended; one
    that arrived meanwhile is taken now."""
    wanted = CUT_SIGNALS
    previous = {signum: signal.getsignal(signum) for signum in wanted}

    def cut(signum: int, _frame: Any) -> None:
        for each in wanted:
            signal.signal(
                each, signal.SIG_DFL if each != signal.SIGINT else signal.default_int_handler
            )
        raise SummaryCut(signum)

    for signum in wanted:
        signal.signal(signum, cut)
    try:
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_POLL_S = 0.05  # the longest a signal's handler waits where the program cannot be waited on by fd


def wait_for_exit(proc: subprocess.Popen[bytes]) -> int:
    """`proc.wait()`, with each signal's handler run as the signal arrives.

    Python runs a signal's handler between bytecodes: one that lands just before `os.waitpid`
    blocks (after the last check, before the system call) would wait there for the program to end,
    and a SIGTERM meant for the program would never be forwarded. So the wait is a select on the
    program's pidfd and on a pipe every signal writes to (signal.set_wakeup_fd): a signal that came
    early has already written, and the select returns at once. Where the program has no pidfd (not
    Linux, a kernel before 5.3), a wait of _POLL_S at a time."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return _polled_wait(proc)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    try:
        previous = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: no signal handler runs here anyway
        for fd in (pidfd, wake_read, wake_write):
            os.close(fd)
        return proc.wait()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            selector.register(wake_read, selectors.EVENT_READ)
            while proc.poll() is None:
                selector.select()
                _drain(wake_read)
    finally:
        signal.set_wakeup_fd(previous)
        for fd in (pidfd, wake_read, wake_write):
            os.close(fd)
    return proc.wait()


def _polled_wait(proc: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            continue


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def child_setup(terminal_foreground: bool, signal_mask: Any = None) -> Any:
    """What the child does between fork and exec: outside a terminal's foreground, take its own
    process group (see SignalForwarder); on Linux, get SIGTERM if stepcli dies, even of SIGKILL, so
    it is never orphaned."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            # resolved before fork: nothing to import after it
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup() -> None:
        if signal_mask is not None:
            # the program gets stepcli's original mask
            signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
        if not terminal_foreground:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return setup


def in_terminal_foreground() -> bool:
    """True when stepcli runs in the foreground of a terminal, whose Ctrl-C reaches the program
    directly."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def _quietly(call: Any) -> Any:
    try:
        return call()
    except Exception:
        return None
