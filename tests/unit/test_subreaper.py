"""The launcher's child-subreaper helpers (stepcli.run.subreaper): what its SIGCHLD handler may and
may not do."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from stepcli.run import subreaper

# A fresh interpreter in which the "ascii" codec is unknown, as a lookup interrupted by the SIGCHLD
# handler left it (the handler ran again inside itself, found the codec's module half imported:
# Python then remembers the codec as unknown). Listing the children must not depend on it.
_UNKNOWN_ASCII = textwrap.dedent(
    """
    import encodings, subprocess, sys
    encodings._cache["ascii"] = None
    from stepcli.run.subreaper import children
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        print(child.pid in children())
    finally:
        child.communicate()
    """  # noqa: E501
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task/*/children")
def test_children_are_listed_without_a_text_codec() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _UNKNOWN_ASCII], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", done.stdout + done.stderr


def test_the_sigchld_handler_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN listing the adopted children fails (any error) WHEN the handler runs THEN nothing
    # reaches the launcher
    def failing() -> list[int]:
        raise LookupError("unknown encoding: ascii")

    monkeypatch.setattr(subreaper, "adopted", failing)
    subreaper.reap_adopted(17, None)
