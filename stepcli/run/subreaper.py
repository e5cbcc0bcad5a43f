"""`stepcli run` as a child subreaper: a process the program daemonizes (double fork, `setsid`) is
still stepcli's.

Without it, a grandchild whose parent exits is re-parented to init and nothing of the job can find
it: `--on-hang kill` or a forwarded SIGTERM ended the program's tree and left the daemon running. On
Linux the launcher marks itself a child subreaper (prctl(PR_SET_CHILD_SUBREAPER)) before it starts
the program, so every orphaned descendant of the job becomes its child instead. Those it did not
start itself ("adopted") are:

- reaped as they exit while the program runs (a SIGCHLD handler, waitpid on each adopted pid with
  WNOHANG: never the program's own pid, whose status `Popen.wait()` takes, nor the watchdog's);
- ended with the job when stepcli ends it (`--on-hang kill`) or the job ends by a signal stepcli
  forwarded (SIGTERM, SIGHUP): SIGTERM (and SIGCONT, for a stopped one), SIGKILL to those left after
  a grace period;
- left alone when the program exits by itself: a server it daemonizes on purpose keeps running, as
  it would without stepcli (it is re-parented to init when stepcli exits).

The launcher is not the profiled process: ctypes is fine here. Elsewhere than Linux nothing of this
happens.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_S = 5.0  # SIGTERM, then SIGKILL to the adopted processes left this much later
# an adopted process may fork more while it is ended: look again, this many times at most
_SWEEPS = 5

# the children the launcher started itself (the program, the watchdog): never adopted
_own: set[int] = set()
_enabled = False


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux); whether it now is."""
    global _enabled
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _enabled = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _enabled = False
    return _enabled


def own(pid: int) -> None:
    """`pid` is a child the launcher started itself: its status is taken by whoever started it,
    never here."""
    _own.add(pid)


def children() -> list[int]:
    """This process's children, from /proc/self/task/*/children (each thread's), or psutil where
    that is missing.

    Read as bytes: a text file would look up its codec, and from the SIGCHLD handler (reap_adopted)
    that lookup could interrupt the same lookup half done (two children exiting at once: the handler
    runs again inside itself), find the codec's module half imported and have Python remember the
    codec as unknown for the rest of the launcher's life ("LookupError: unknown encoding: ascii" at
    the run's end, with DataLoader workers)."""
    found: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    listed = False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as handle:
                found.update(int(pid) for pid in handle.read().split())
            listed = True
        except (OSError, ValueError):
            continue
    if not listed:
        try:
            import psutil

            found.update(p.pid for p in psutil.Process().children())
        except Exception:
            pass
    return sorted(found)


def adopted() -> list[int]:
    """The children this process did not start: orphaned descendants of the job, re-parented
    here."""
    if not _enabled:
        return []
    return [pid for pid in children() if pid not in _own]


def reap(pids: Iterable[int]) -> None:
    """Collect the exit status of each of `pids` that has exited (WNOHANG: a running one is left
    running)."""
    for pid in pids:
        if pid in _own:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def reap_adopted(*_args: object) -> None:
    """Reap the adopted processes that have exited (a SIGCHLD handler while the program runs). Never
    raises: it runs between any two steps of the launcher's own code, which must not see its errors
    (one not reaped now is reaped at the next SIGCHLD, or becomes init's when stepcli exits)."""
    try:
        reap(adopted())
    except Exception:
        pass


def end_adopted(grace_s: float = TERM_GRACE_S) -> list[int]:
    """End every adopted process and its descendants: SIGTERM and SIGCONT, SIGKILL to those left
    after `grace_s`; reap them. Returns the pids signalled."""
    import psutil

    ended: list[int] = []
    for _ in range(_SWEEPS):
        family: list[Any] = []
        for pid in adopted():
            try:
                process = psutil.Process(pid)
                family += [process, *process.children(recursive=True)]
            except psutil.Error:
                continue
        family = [p for p in family if _running(p)]
        if not family:
            break
        ended += [p.pid for p in family]
        terminate(family, grace_s)
        reap(adopted())
    reap(adopted())
    return ended


def terminate(family: list[Any], grace_s: float) -> None:
    """SIGTERM to each process of `family` (psutil processes), SIGCONT to the stopped ones (a
    stopped process acts on its SIGTERM only once continued: the program then saves its step log),
    SIGKILL to those left running after `grace_s`. Zombies count as gone."""
    import psutil

    processes = list(family)
    for process in processes:
        _quietly(process.terminate)
    for process in processes:
        if _status(process) in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            _quietly(lambda p=process: p.send_signal(signal.SIGCONT))
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_running(p) for p in processes):
        time.sleep(0.05)
        reap(adopted())
    for process in processes:
        if _running(process):
            _quietly(process.kill)


def _status(process: Any) -> str | None:
    try:
        return str(process.status())
    except Exception:
        return None


def _running(process: Any) -> bool:
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _quietly(call: Any) -> None:
    try:
        call()
    except Exception:
        pass
