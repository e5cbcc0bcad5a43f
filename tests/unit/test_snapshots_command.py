"""stepcli/snapshots/memorymain.py: the progress of a long read of a snapshot, on stderr (issue
47)."""

from __future__ import annotations

import io

import pytest

from stepcli.snapshots import memorymain as command


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(command.time, "monotonic", fake)
    return fake


def test_a_short_read_says_nothing(clock: _Clock) -> None:
    for out in (io.StringIO(), _Terminal()):
        progress = command.ReadProgress("/x/oom-rank0.pickle", out)
        for read in range(0, 100, 10):
            clock.now += 0.1
            progress(read << 20, 100 << 20)
        progress.done()
        assert out.getvalue() == ""


def test_off_a_terminal_a_line_every_ten_seconds_past_two(clock: _Clock) -> None:
    out = io.StringIO()
    progress = command.ReadProgress("/x/oom-rank0.pickle", out)
    for second in range(1, 31):
        clock.now += 1
        progress(second << 20, 30 << 20)
    progress.done()
    lines = out.getvalue().splitlines()
    assert lines == [
        "stepcli: reading oom-rank0.pickle: 7% of 30.0 MiB, 2 s",
        "stepcli: reading oom-rank0.pickle: 40% of 30.0 MiB, 12 s",
        "stepcli: reading oom-rank0.pickle: 73% of 30.0 MiB, 22 s",
    ]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_on_a_terminal_one_line_redrawn_then_cleared(clock: _Clock) -> None:
    out = _Terminal()
    progress = command.ReadProgress("/x/\x1b[2Jevil.pickle", out)
    for second in range(1, 5):
        clock.now += 1
        progress(second << 20, 4 << 20)
    progress.done()
    text = out.getvalue()
    assert text.count("\r") == 4 and "\n" not in text and text.endswith("\r\x1b[K")
    # the name's control characters shown
    assert "reading \\x1b[2Jevil.pickle: 75% of 4.0 MiB, 3 s" in text
