"""The hang report's reader: a stacks file (stepcli/agent/stacks.py writes it; the launcher writes
one for a process that could not) as a typed `StackDump`, faulthandler's text as threads, and
whether a process of this host is stopped. Everything past this module works on the typed dump,
never on the file's dict.

A stacks file comes from the run's own control folder, but its values are still checked: a value of
the wrong type reads as unknown (None), never as an error later in the verdict or the words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# a stacks file's `source` for a process that was stopped (SIGSTOP, a debugger): no threads
STOPPED = "stopped"
# `source`: its Python could not run; the launcher parsed faulthandler's text
FAULTHANDLER = "faulthandler"
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?+) in (.*)$')
# one process's stacks: thousands of threads' frames stay well below
_MAX_DUMP_BYTES = 64 * 1024 * 1024


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ProcessId:
    """Who a dump or a registration is: rank (None without one), pid and host."""

    pid: int | None
    host: str | None
    rank: int | None = None
    worker: str | None = None

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> ProcessId:
        return cls(
            pid=_int(document.get("pid")),
            host=_text(document.get("host")),
            rank=_int(document.get("rank")),
            worker=_text(document.get("worker")),
        )

    def order(self) -> tuple[bool, int, str, int]:
        """Ranks first, in rank order; then the others by host and pid."""
        return (self.rank is None, self.rank or 0, str(self.host), self.pid or 0)


@dataclass(frozen=True)
class Frame:
    function: str | None
    file: str
    line: int | None

    @classmethod
    def of(cls, document: Any) -> Frame | None:
        if not isinstance(document, Mapping):
            return None
        return cls(
            _text(document.get("function")),
            str(document.get("file", "")),
            _int(document.get("line")),
        )


@dataclass(frozen=True)
class Collective:
    """A collective a process entered (its Python call) or that its process groups have in flight
    (torch's flight recorder: also those issued from C++, such as DDP's gradient all-reduce;
    `source` "flight_recorder")."""

    name: str | None
    seq: int | None
    group: str | None
    entered_s_ago: float | None
    returned: bool
    source: str | None
    label: str  # `all_reduce #6`, as the file names it
    raw: Mapping[str, Any]  # as in the file: the run summary keeps it so

    @classmethod
    def of(cls, document: Any) -> Collective | None:
        if not isinstance(document, Mapping):
            return None
        return cls(
            name=None if document.get("name") is None else str(document.get("name")),
            seq=_int(document.get("seq")),
            group=None if document.get("group") is None else str(document.get("group")),
            entered_s_ago=_number(document.get("entered_s_ago")),
            returned=document.get("returned") is True,
            source=_text(document.get("source")),
            label=f"{document.get('name')} #{document.get('seq')}",
            raw=document,
        )


@dataclass(frozen=True)
class StackDump:
    """One process's stacks file: who, when, its step, its collectives and its threads' frames
    (innermost first)."""

    process: ProcessId
    time: float
    step: int | None
    last_step_s_ago: float | None
    collective: Collective | None  # the last one it entered from Python (returned or not)
    collectives_hooked: bool
    in_flight: tuple[Collective, ...] | None  # None: unknown (no flight recorder)
    # the main thread's (the first thread's if the main one is not there)
    main_frames: tuple[Frame, ...]
    source: str  # "python" (its own thread wrote it), FAULTHANDLER or STOPPED
    file: str | None
    document: Mapping[str, Any]  # the file as read (`stepcli capture --stacks --json` prints it)

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> StackDump:
        flights = document.get("in_flight")
        threads = [t for t in document.get("threads") or [] if isinstance(t, Mapping)]
        main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
        frames = [Frame.of(f) for f in main.get("frames") or []] if main is not None else []
        return cls(
            process=ProcessId.of(document),
            time=_number(document.get("time")) or 0.0,
            step=_int(document.get("step")),
            last_step_s_ago=_number(document.get("last_step_s_ago")),
            collective=Collective.of(document.get("collective")),
            collectives_hooked=document.get("collectives_hooked") is True,
            in_flight=tuple(c for c in map(Collective.of, flights) if c)
            if isinstance(flights, list)
            else None,
            main_frames=tuple(f for f in frames if f is not None),
            source=_text(document.get("source")) or "python",
            file=_text(document.get("file")),
            document=document,
        )


def parse_faulthandler(text: str, main_thread: int | None) -> list[dict[str, Any]]:
    """faulthandler's text (`Thread 0x... (most recent call first):` then `  File "f", line N in
    func`) as the stacks file's `threads`: innermost frame first, as faulthandler prints them; the
    last dump in `text` only."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            ident = int(thread.group(2), 16)
            if any(t["id"] == ident for t in threads):
                threads = []  # a second dump appended to the file: keep the newest
            threads.append(
                {
                    "id": ident,
                    "name": f"thread {ident:#x}",
                    "main": ident == main_thread,
                    "frames": [],
                }
            )
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            number = frame.group(2)
            threads[-1]["frames"].append(
                {
                    "function": frame.group(3),
                    "file": frame.group(1),
                    "line": int(number) if number.isdigit() else None,
                }
            )
    return threads


def read_stacks_file(path: str) -> dict[str, Any] | None:
    """A stacks file as a dict, or None for anything else: never blocking on a FIFO, never reading
    `/dev/zero` (stepcli.inputs.read_side_json)."""
    from stepcli.errors import TraceError
    from stepcli.inputs import read_side_json

    try:
        document = read_side_json(path, _MAX_DUMP_BYTES)
    except TraceError:
        return None
    return document if isinstance(document, dict) else None


def read_dumps(target: Path) -> list[StackDump]:
    """The stacks files of one dump folder, each with its file name."""
    dumps = []
    for path in sorted(target.glob("*.json")):
        document = read_stacks_file(str(path))
        if document is not None:
            document["file"] = path.name
            dumps.append(StackDump.of(document))
    return dumps


def is_stopped(process: ProcessId) -> bool:
    """Whether a process of this host is stopped (state T or t in /proc: SIGSTOP, or a tracer holds
    it)."""
    import socket

    if process.host != socket.gethostname() or process.pid is None:
        return False
    try:
        with open(f"/proc/{process.pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return False
    return state in (b"T", b"t")
