"""`stepcli memory SNAPSHOT_OR_RUN`: read each snapshot, analyze it, advise, print."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from stepcli.advice.memoryadvice import advise
from stepcli.errors import EXIT_NOTHING_MEASURED, StepcliError
from stepcli.limits import DEFAULT_DECODE_BYTES
from stepcli.snapshots.memoryrender import to_json, to_text
from stepcli.snapshots.snapshotfigures import analyze
from stepcli.snapshots.snapshotreader import find_snapshots, load_snapshot

PROGRESS_AFTER_S = 2.0  # a read shorter than this says nothing
# off a terminal (a CI log): one line this often; on one, the line is redrawn
PROGRESS_EVERY_S = 10.0


def memory_main(
    path: str, *, as_json: bool, top: int, max_memory: int = DEFAULT_DECODE_BYTES
) -> str:
    """The report of every snapshot PATH holds (JSON or text), for the command to print;
    StepcliError: exit 2 bad input, 3 a run folder without any snapshot."""
    files = find_snapshots(path)
    if not files:
        raise StepcliError(
            f"{path}: no memory snapshot here (oom-*.pickle is written by `stepcli run --memory` "
            f"when a process "
            "runs out of CUDA memory, memory-*.pickle by `stepcli capture --memory-snapshot`)",
            EXIT_NOTHING_MEASURED,
        )
    reports = []
    for file in files:
        progress = ReadProgress(file, sys.stderr)
        try:
            snapshot = load_snapshot(file, max_memory=max_memory, progress=progress)
        finally:
            progress.done()
        report = analyze(snapshot, top=top)
        report["advice"] = advise(report)
        reports.append(report)
    if as_json:
        return to_json(reports)
    # file and function names from the snapshot: control characters shown
    from stepcli.safetext import visible_all

    return "\n\n".join(to_text(visible_all(report)) for report in reports)


class ReadProgress:
    """How far a long read of a snapshot is, on stderr: nothing for the first seconds; then, on a
    terminal, one line redrawn in place (cleared at the end), elsewhere a plain line every
    PROGRESS_EVERY_S."""

    def __init__(self, path: str, out: TextIO) -> None:
        from stepcli.safetext import visible

        self._name = visible(os.path.basename(path))
        self._out = out
        self._start = time.monotonic()
        self._shown = 0.0  # when a line was last written
        try:
            self._terminal = out.isatty()
        except (AttributeError, ValueError):
            self._terminal = False
        self._drawn = False

    def __call__(self, read: int, size: int) -> None:
        now = time.monotonic()
        elapsed = now - self._start
        if elapsed < PROGRESS_AFTER_S or now - self._shown < (
            0.25 if self._terminal else PROGRESS_EVERY_S
        ):
            return
        self._shown = now
        share = f"{min(read / size, 1.0):.0%} of " if size else ""
        from stepcli.fmt import size as fmt_size

        line = f"stepcli: reading {self._name}: {share}{fmt_size(size)}, {elapsed:.0f} s"
        if self._terminal:
            self._out.write("\r" + line + "\x1b[K")
            self._drawn = True
        else:
            self._out.write(line + "\n")
        self._out.flush()

    def done(self) -> None:
        """The read is over: a line drawn on a terminal is cleared (what follows starts on a clean
        line)."""
        if self._drawn:
            self._out.write("\r\x1b[K")
            self._out.flush()
            self._drawn = False
