"""stepcli.traces.read.forked: a forked helper ends with its own status and never runs the parent's
code after it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="stepcli forks helpers on Linux only"
)

_SCRIPT = """
import atexit, os, sys
from stepcli.traces.read.forked import fork_child
atexit.register(lambda: print("parent exit handler", flush=True))
print("buffered before the fork", end="")

def interrupted():
    raise KeyboardInterrupt

def writes():
    os.write(1, b"[child wrote]")

statuses = []
for work in (writes, interrupted, lambda: 1 / 0, lambda: os._exit(7)):
    statuses.append(os.waitstatus_to_exitcode(os.waitpid(fork_child(work), 0)[1]))
print("", statuses)
"""


def test_a_child_exits_with_its_status_and_never_runs_the_parents_code() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # THEN work that ends is 0, anything raised (Ctrl-C too) 1, its own exit its own; the text this
    # process had buffered is printed once, its exit handler runs once, and no child printed a
    # traceback
    assert (
        done.stdout == "buffered before the fork[child wrote] [0, 1, 1, 7]\nparent exit handler\n"
    )
    assert done.stderr == ""


def test_a_refused_fork_raises_and_leaves_ctrl_c_unblocked(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    from stepcli.traces.read import forked

    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forked.os, "fork", refused)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with pytest.raises(OSError):
        forked.fork_child(lambda: None)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert signal.SIGINT not in before
    assert os.getpid() > 0
