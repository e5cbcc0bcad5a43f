"""The hang report's verdict: from typed stacks dumps (stepcli/run/summary/hangdump.py), which
process waits in which collective, which is elsewhere and where in the program's own code, and who
holds the job back. Pure facts, no words (stepcli/run/summary/hangwords.py says them), so each rule
is unit tested alone.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import stepcli
from stepcli.run.summary.hangdump import STOPPED, Collective, Frame, ProcessId, StackDump

INNERMOST_FRAMES = 5
# torch.autograd's entry into its C++ engine
BACKWARD_FUNCTIONS = ("_engine_run_backward", "run_backward")
# a collective seen in flight in a process group, not in a Python call
FLIGHT_RECORDER = "flight_recorder"


def waiting_in(dump: StackDump) -> Collective | None:
    """The collective the process waits in: a Python collective it entered and that has not
    returned, else the oldest one its process groups started and have not finished (torch's flight
    recorder: also collectives issued from C++, such as DDP's gradient all-reduce, marked `source:
    flight_recorder`); None when neither shows one."""
    if dump.collective is not None and not dump.collective.returned:
        return dump.collective
    if not dump.in_flight:
        return None
    first = dump.in_flight[0].raw
    raw = {
        "name": first.get("name"),
        "seq": first.get("seq"),
        "group": first.get("group"),
        "entered_s_ago": first.get("entered_s_ago"),
        "returned": False,
        "source": FLIGHT_RECORDER,
        "in_flight": len(dump.in_flight),
    }
    found = Collective.of(raw)
    assert found is not None  # (a dict always reads)
    return found


def in_collective(dump: StackDump) -> bool:
    """Waits in a collective: entered one that has not returned, or its process groups have one in
    flight."""
    return waiting_in(dump) is not None


def collectives_known(dump: StackDump) -> bool:
    """Whether the dump can tell "in no collective" from "in one issued from C++": the flight
    recorder answered."""
    return dump.in_flight is not None


def in_backward(frames: Sequence[Frame]) -> bool:
    """The main thread is inside autograd's C++ engine (loss.backward()), where DDP's reducer
    all-reduces."""
    return any(frame.function in BACKWARD_FUNCTIONS for frame in frames[:INNERMOST_FRAMES])


_PACKAGE_FOLDERS = ("/site-packages/", "/dist-packages/")


def _library_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    libraries = {
        paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths
    }
    # stepcli's own frames (its collective wrapper) too, wherever it is installed from (an editable
    # install)
    package = Path(stepcli.__file__).parent
    return (*sorted(libraries), f"{package}/", f"{package.resolve()}/")


def own_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame in the program's own code (not the standard library, an installed package
    or stepcli)."""
    libraries = _library_paths()
    for frame in frames:
        # (an installed package found outside this interpreter's own paths, through a .pth file or
        # PYTHONPATH, still lies in a site-packages folder)
        if not frame.file.startswith(libraries) and not any(
            part in frame.file for part in _PACKAGE_FOLDERS
        ):
            return frame
    return frames[0] if frames else None


class Finding(Enum):
    """What the dumps say, as one of the cases the words tell apart."""

    STOPPED = "stopped"  # stopped processes hold the job back (maybe while others wait)
    # some wait in a collective while others are elsewhere: those hold the job back
    HELD_BACK = "held_back"
    PEER_OUTSIDE = (
        # every process waits in the same collective: a peer outside the dump, or the transport
        "peer_outside"
    )
    MISMATCHED = "mismatched"  # the processes wait in different collectives
    # none waits in a Python collective; C++ collectives cannot be seen (no flight recorder)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Verdict:
    finding: Finding
    # who holds the job back: stopped processes, or those outside a collective
    holders: tuple[ProcessId, ...]
    # per holder: its innermost frame in the program's own code (HELD_BACK)
    where: tuple[Frame | None, ...]
    waiting: int  # how many processes wait in a collective
    collectives: tuple[str, ...]  # the collectives waited in, sorted
    in_backward: tuple[ProcessId, ...]  # UNKNOWN: those in backward(), where DDP all-reduces


def decide(dumps: Sequence[StackDump], stopped: Sequence[ProcessId] = ()) -> Verdict | None:
    """Who the others wait for, when the dumps (and `stopped`: processes of this host that wrote no
    stacks because they are stopped) say it; None when they say nothing."""
    waiting = [d for d in dumps if in_collective(d)]
    elsewhere = sorted((d for d in dumps if not in_collective(d)), key=lambda d: d.process.order())
    names = tuple(sorted({(waiting_in(d) or _NONE).label for d in waiting}))
    if stopped:
        holders = tuple(sorted(stopped, key=ProcessId.order))
        return Verdict(Finding.STOPPED, holders, (), len(waiting), names, ())
    if waiting and elsewhere:
        frames = tuple(own_frame(d.main_frames) for d in elsewhere)
        return Verdict(
            Finding.HELD_BACK, tuple(d.process for d in elsewhere), frames, len(waiting), names, ()
        )
    if waiting:
        finding = Finding.PEER_OUTSIDE if len(names) == 1 else Finding.MISMATCHED
        return Verdict(finding, (), (), len(waiting), names, ())
    if dumps and not all(collectives_known(d) for d in dumps):
        ordered = sorted(dumps, key=lambda d: d.process.order())
        backward = tuple(d.process for d in ordered if in_backward(d.main_frames))
        return Verdict(Finding.UNKNOWN, (), (), 0, (), backward)
    return None


_NONE = Collective(None, None, None, None, False, None, "None #None", {})


def split_stopped(dumps: Sequence[StackDump]) -> tuple[list[StackDump], list[StackDump]]:
    """(the dumps of processes that ran, the files the launcher wrote for stopped ones)."""
    return [d for d in dumps if d.source != STOPPED], [d for d in dumps if d.source == STOPPED]
