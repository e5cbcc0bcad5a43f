"""One .gz input read and inflated by a forked process while this one is still importing what will
decode it.

`stepcli table` on one .gz trace spends ~0.1 s importing numpy and the analysis before it reads a
byte, then ~0.1 s inflating the text: on two cores these can run at once. A thread cannot do it
well: the inflating thread's page faults and the imports' library loading contend in one address
space (both ran ~1.5x slower side by side, most of the gain lost). So a process forked while stepcli
is still small (before numpy) reads and inflates the file into an in-memory file (memfd) and reports
the length; the trace reader maps that file copy-on-write (MAP_PRIVATE) and decodes it where it
lies: no copy (copying 35 MB into this process took 25-40 ms of page faults on these machines,
mapping it 4 ms), and the reader's in-place edits (stepcli.traces.read.tracereader) stay private to
the process making them.

Any surprise (no memfd or fork, a read error, a corrupt file, a child that dies) leaves nothing to
take: the reader then reads the file itself, which gives the exact error, so answers and messages
are those of an ordinary read.
"""

from __future__ import annotations

import atexit
import mmap
import os
import threading

# (imported before the fork: the child has it)
from stepcli.inputs import gzip_trailer, inflated_pieces, read_file
from stepcli.limits import input_limit
from stepcli.traces.read.forked import fork_child, stop_child

# the inflated size (from the gzip trailer) from which a fork costs less than it saves
MIN_BYTES = 4 * 1024 * 1024
MAX_BYTES = 1024**3  # and up to which (the mapped text is held in memory, as the ordinary read's)
# bytes of the child's report: the inflated length, little-endian; nothing when it failed
_REPORT = 8


class _ForkedRead:
    """A child inflating one .gz file into an in-memory file; its report comes through a pipe."""

    def __init__(self, path: str) -> None:
        self._memfd = os.memfd_create("stepcli-read-ahead", os.MFD_CLOEXEC)
        try:
            reading, writing = os.pipe()
        except OSError:
            os.close(self._memfd)
            raise
        memfd = self._memfd
        try:
            pid = fork_child(lambda: _inflate(path, memfd, writing, reading))
        except OSError:
            for fd in (reading, writing, memfd):
                os.close(fd)
            raise
        os.close(writing)
        self._pid: int | None = pid
        self._pipe: int | None = reading

    def take(self) -> mmap.mmap | None:
        """Wait for the child; the text it inflated (mapped copy-on-write), or None when it
        failed."""
        if self._pipe is None:
            return None
        try:
            with open(self._pipe, "rb", closefd=False) as pipe:
                report = pipe.read()
            pid, self._pid = self._pid, None  # (waited for below, or never: not to be killed after)
            assert pid is not None
            status = os.waitpid(pid, 0)[1]
            if os.waitstatus_to_exitcode(status) != 0 or len(report) != _REPORT:
                return None
            length = int.from_bytes(report, "little")
            if length == 0 or os.fstat(self._memfd).st_size != length:
                return None
            return mmap.mmap(
                self._memfd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except OSError:  # no address space for the mapping: the ordinary read
            return None
        finally:
            self.stop()

    def stop(self) -> None:
        """Kill and reap the child if it still runs; close the pipe and the in-memory file."""
        if self._pid is not None:
            pid, self._pid = self._pid, None
            stop_child(pid)
        if self._pipe is not None:
            os.close(self._pipe)
            os.close(self._memfd)
            self._pipe = None


def _inflate(path: str, memfd: int, pipe: int, parents_end: int) -> None:
    """In the forked child: inflate `path` into `memfd`, then report the length. A text past
    MAX_BYTES (the trailer's size is mod 4 GiB, and only the last member's) is left to the ordinary
    read: no report."""
    os.close(parents_end)
    limit = input_limit()
    total = 0
    for piece in inflated_pieces(read_file(path, limit), limit, path):
        with memoryview(piece) as view:
            while view:
                view = view[os.write(memfd, view) :]
        total += len(piece)
        if total > MAX_BYTES:
            return
    os.write(pipe, total.to_bytes(_REPORT, "little"))


_reads: dict[str, _ForkedRead] = {}


def read_ahead(path: str) -> None:
    """Start reading and inflating the .gz file `path` in a forked process, when that is safe and
    worth it: this process runs one thread (Linux), and the gzip trailer gives a size from MIN_BYTES
    to MAX_BYTES."""
    if path in _reads or not hasattr(os, "memfd_create") or threading.active_count() != 1:
        return
    size = _inflated_size(path)
    if size is None or not MIN_BYTES <= size <= MAX_BYTES:
        return
    try:
        _reads[path] = _ForkedRead(path)
    except OSError:  # no memfd, a process limit: the ordinary read
        return
    if len(_reads) == 1:
        atexit.register(_stop_all)


def _inflated_size(path: str) -> int | None:
    """The size a gzip file's trailer gives (its last member's, mod 4 GiB), or None if it is not a
    regular gzip file (a FIFO is never waited on: stepcli.inputs.gzip_trailer)."""
    found = gzip_trailer(path)
    return found[1] if found is not None else None


def take(path: str) -> mmap.mmap | None:
    """The text read ahead for `path` (once), or None: never started, or failed (read it the
    ordinary way)."""
    read = _reads.pop(path, None)
    return read.take() if read is not None else None


def _stop_all() -> None:
    """At exit: no child left running, no file held."""
    for read in _reads.values():
        read.stop()
    _reads.clear()
