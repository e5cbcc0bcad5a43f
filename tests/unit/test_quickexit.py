"""stepcli.quickexit: the `stepcli` command's exit skips the interpreter's teardown, never what
anyone can see."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PROGRAM = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from stepcli.quickexit import quick_exit
    atexit.register(lambda: print("atexit handler ran", flush=False))
    sys.stdout.write("buffered text, ")
    sys.stderr.write("an error line")
    if sys.argv[1] == "thread":  # a thread still running: it must be joined, as at an ordinary exit
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished,", end=" "))).start()
    quick_exit(int(sys.argv[2]))
    """  # noqa: E501
)


@pytest.mark.parametrize("threads", ["alone", "thread"])
def test_quick_exit_keeps_the_status_the_output_and_the_atexit_handlers(threads: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM, threads, "3"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    expected = (
        "buffered text, thread finished, atexit handler ran"
        if threads == "thread"
        else "buffered text, atexit handler ran"
    )
    assert proc.stdout.strip() == expected
    assert proc.stderr == "an error line"


def test_the_command_ends_through_it() -> None:
    # `python -m stepcli` and the console script both go through entry() (pyproject's
    # [project.scripts])
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["stepcli"] == "stepcli.cli:entry"
    code = (
        "import atexit, runpy, sys; atexit.register(lambda: print('handler')); sys.argv = "
        "['stepcli', '--version']; runpy.run_module('stepcli', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "handler"
    assert "stepcli" in proc.stdout
