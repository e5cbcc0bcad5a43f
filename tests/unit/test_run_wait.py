"""stepcli run's wait for the program (stepcli.run.signals.wait_for_exit): a signal whose Python
handler is pending while the main thread waits is handled at once, not when the program ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stepcli.run.signals import wait_for_exit

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _blocked_in_a_system_call(thread_id: int) -> bool:
    """Whether the thread sleeps in the kernel (state S in /proc), as a wait does."""
    stat = Path(f"/proc/self/task/{thread_id}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "S"


def test_a_signal_pending_while_the_program_is_waited_for_is_handled_at_once() -> None:
    # GIVEN a program that would run for a minute, and a handler on the main thread that stops it
    # (as stepcli run's forwarder passes a SIGTERM on)
    program = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    handled: list[float] = []

    def forward(_signum: int, _frame: object) -> None:
        handled.append(time.monotonic())
        program.terminate()

    previous = signal.signal(signal.SIGUSR1, forward)
    # The main thread holds SIGUSR1, so the kernel hands it to the thread below: its handler is then
    # pending while the main thread sleeps in the wait's system call, which no signal interrupts.
    # That is what a signal landing just before the wait's system call does.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    main = threading.get_native_id()
    sent: list[float] = []

    def send_once_waiting() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        deadline = time.monotonic() + 30
        while not _blocked_in_a_system_call(main) and time.monotonic() < deadline:
            time.sleep(0.01)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR1)
        # never a test that waits a minute: the program ends anyway 20 s on
        if not stopped.wait(20):
            program.kill()

    stopped = threading.Event()
    sender = threading.Thread(target=send_once_waiting, daemon=True)
    try:
        sender.start()
        # WHEN stepcli waits for the program
        status = wait_for_exit(program)
    finally:
        stopped.set()
        sender.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        signal.signal(signal.SIGUSR1, previous)
        if program.poll() is None:
            program.kill()
            program.wait()
    # THEN the handler ran while it waited, and the program ended by its hand, well before the
    # guard's 20 s
    assert handled and sent, (handled, sent)
    assert handled[0] - sent[0] < 5, handled[0] - sent[0]
    assert status == -signal.SIGTERM


def test_the_wait_gives_the_programs_status_and_leaves_no_descriptor_open() -> None:
    before = set(os.listdir("/proc/self/fd"))
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    program = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_for_exit(program) == 3
    assert set(os.listdir("/proc/self/fd")) == before
    assert signal.set_wakeup_fd(wakeup) == wakeup  # the wakeup descriptor is as it was
