"""The exit guard: the step log is saved once before a process ends, which then ends as it would
have.

The signal cases run in a plain Python child (no torch: a few tens of ms), since they end the
process; tests/e2e/test_run_endings.py checks the same on real torch programs under `stepcli run`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

from stepcli.agent.exitguard import ExitGuard


class Recorder:
    busy = False
    deferred_signal = 0


def _guard(
    saves: list[str], owner: list[bool] | None = None, recorder: Recorder | None = None
) -> ExitGuard:
    owns = owner if owner is not None else [True]
    return ExitGuard(
        lambda reason, blocked: saves.append(reason), lambda: owns[0], lambda: recorder
    )  # type: ignore[arg-type,return-value]


@pytest.fixture
def default_handlers() -> Iterator[None]:
    """SIGTERM/SIGHUP at their default action for the test, and back as they were after it."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    for signum in before:
        signal.signal(signum, signal.SIG_DFL)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_the_final_save_is_made_once_and_only_by_the_process_that_made_the_steps() -> None:
    saves: list[str] = []
    owner = [False]  # a forked child: its parent's steps are not its own
    guard = _guard(saves, owner)
    guard.flush("exit")
    assert saves == [] and not guard.flushed
    owner[0] = True
    guard.flush("exit")
    guard.flush("SIGTERM")
    assert saves == ["exit"] and guard.flushed


def test_signals_are_guarded_only_where_the_program_left_the_default(
    default_handlers: None,
) -> None:
    guard = _guard([])
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the program's choice (nohup): kept
    guard.guard_signals(True)
    assert signal.getsignal(signal.SIGTERM) == guard.on_signal
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    guard.guard_signals(False)  # a window's end: back to the default
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    guard.guard_for_the_run()
    guard.guard_signals(False)  # a window's end no longer unguards: the process trains
    assert signal.getsignal(signal.SIGTERM) == guard.on_signal


def test_no_handler_is_installed_from_another_thread(default_handlers: None) -> None:
    guard = _guard([])
    thread = threading.Thread(target=guard.guard_signals, args=(True,))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_signal_during_profiler_work_waits_for_it() -> None:
    saves: list[str] = []
    recorder = Recorder()
    recorder.busy = True
    guard = _guard(saves, recorder=recorder)
    guard.on_signal(signal.SIGTERM, None)
    # the recorder delivers it when done
    assert recorder.deferred_signal == signal.SIGTERM and saves == []
    # (the stacks thread sees the main thread took it)
    assert guard.signal_handled == signal.SIGTERM


def _child(body: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from stepcli.agent.exitguard import ExitGuard

        def save(reason, blocked):
            print("saved", reason, flush=True)
            SAVE_HOOK()

        SAVE_HOOK = lambda: None
        guard = ExitGuard(save, lambda: True, lambda: None)
        guard.guard_os_exit()
        guard.guard_for_the_run()
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


def test_sigterm_saves_then_ends_the_process_of_sigterm() -> None:
    result = _child("os.kill(os.getpid(), signal.SIGTERM)\nprint('survived')\n")
    assert result.stdout == "saved SIGTERM\n"
    assert result.returncode == -signal.SIGTERM  # the exit status still says what killed it


def test_os_exit_saves_first_and_keeps_its_status() -> None:
    result = _child("os._exit(3)\n")
    assert (result.stdout, result.returncode) == ("saved os._exit\n", 3)


def test_a_second_sigterm_during_the_save_waits_for_it() -> None:
    # torchrun forwards the scheduler's SIGTERM: the second one lands inside the first one's save
    result = _child(
        """
        def again():
            os.kill(os.getpid(), signal.SIGTERM)
            print("save finished", flush=True)
        SAVE_HOOK = again
        guard.flush("exit")
        print("survived")
        """
    )
    assert result.stdout == "saved exit\nsave finished\n"
    assert result.returncode == -signal.SIGTERM
