"""Ctrl-C held back while stepcli's driver works, then delivered once (stepcli.agent.interrupts)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from stepcli.agent.interrupts import Held


def _until_delivered() -> None:
    """Run Python until a redelivered signal's handler has run (it comes from another thread)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pass


def test_ctrl_c_waits_until_the_block_is_done_then_reaches_the_program() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with Held():
            signal.raise_signal(signal.SIGINT)
            for _ in range(1000):  # the handler would have run by now
                pass
            done.append("the block finished")
        _until_delivered()
    assert done == ["the block finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_programs_own_handler_gets_it_once_and_stays_installed() -> None:
    calls: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        calls.append(signum)

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with Held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            assert calls == []
        deadline = time.monotonic() + 30
        while not calls and time.monotonic() < deadline:
            pass
        assert calls == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is mine
        with Held():  # nothing arrived: nothing delivered
            pass
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_sigint_and_other_threads_are_left_alone() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Held():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    seen: list[Any] = []

    def elsewhere() -> None:
        with Held():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_program_taking_signals_through_the_wakeup_fd_is_not_held() -> None:
    # asyncio's add_signal_handler reads the wakeup fd, which the C handler writes whatever the
    # Python handler: holding would have the program's handler run twice
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)
    try:
        with Held():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


def test_the_redelivered_ctrl_c_wakes_a_main_thread_that_blocks() -> None:
    # a Ctrl-C noted while held reaches a main thread then waiting in a sleep (or a lock, a read) at
    # once
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with Held():
            signal.raise_signal(signal.SIGINT)
        time.sleep(20)
    assert time.monotonic() - started < 10
