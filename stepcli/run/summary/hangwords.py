"""The hang report's words: the printed block (one entry per process, then the verdict's line) from
typed dumps and a Verdict (stepcli/run/summary/hangverdict.py), and the end-of-run summary's hang
block from the run summary's `hang` section. Lines only: nothing here reads a file or decides who
holds the job back.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from stepcli.errors import EXIT_HANG
from stepcli.run.summary.hangdump import FAULTHANDLER, STOPPED, Frame, ProcessId, StackDump
from stepcli.run.summary.hangverdict import (
    FLIGHT_RECORDER,
    INNERMOST_FRAMES,
    Finding,
    Verdict,
    collectives_known,
    waiting_in,
)
from stepcli.runfolder.summaryfile import HangProcess, HangSection

STOPPED_WHY = "stopped (SIGSTOP, or held by a debugger)"
FROM_CPP = (
    "issued from C++, not a torch.distributed call of the program: DDP's reducer, FSDP or the like"
)
SUMMARY_WIDTH = 80  # the block's lines fit 80 columns; a folder path too long for that is never cut
MAX_NAMED = 4  # processes named one by one per report; the others counted


def label(process: ProcessId) -> str:
    """`rank 1 (pid 4242)`, or `pid 4242 on host` for a process without a rank."""
    if process.rank is not None:
        return f"rank {process.rank} (pid {process.pid})"
    return f"pid {process.pid} on {process.host}"


def where(frame: Frame) -> str:
    return f"{frame.function} ({frame.file}:{frame.line})"


def collective_line(dump: StackDump) -> str:
    """A process that waits in a collective: which, since when, at which step."""
    collective = waiting_in(dump)
    assert collective is not None
    ago = collective.entered_s_ago
    when = f"{ago:.1f} s ago" if ago is not None else "when unknown"
    if collective.source == FLIGHT_RECORDER:
        return (
            f"{label(dump.process)}: waits in {collective.label} of process group "
            f"{collective.raw.get('group')} (in flight, started {when}; {FROM_CPP}), step "
            f"{dump.step}"
        )
    return f"{label(dump.process)}: waits in {collective.label} (entered {when}), step {dump.step}"


def elsewhere_lines(dump: StackDump) -> list[str]:
    """A process outside a collective: what is known of its collectives, then its main thread's
    innermost frames."""
    collective = dump.collective
    known = collectives_known(dump)
    if collective is not None:
        state = f"not in a collective (its last, {collective.label}, returned"
        state += "; none in flight)" if known else "; collectives issued from C++ are not seen)"
    elif known:
        state = "not in a collective (none in flight in its process groups)"
    elif dump.collectives_hooked:
        state = (
            "not in a collective called from Python (entered none; collectives issued from C++ are "
            "not seen)"
        )
    else:
        state = "collectives not recorded (run with --hang-timeout)"
    if dump.source == FAULTHANDLER:
        state = "its Python threads could not run (C code holding the GIL?); faulthandler's stacks"
    step = f", step {dump.step}" if dump.step is not None else ""
    lines = [f"{label(dump.process)}: {state}{step}; innermost frames of its main thread:"]
    lines += [f"    {where(frame)}" for frame in dump.main_frames[:INNERMOST_FRAMES]]
    if not dump.main_frames:
        lines.append("    (no Python frame)")
    return lines


def _processes(count: int) -> str:
    return f"{count} process{'es' if count > 1 else ''} wait{'' if count > 1 else 's'}"


def verdict_line(verdict: Verdict | None) -> str | None:
    """The block's last line: who holds the job back (`-> ...`), or None when the dumps say
    nothing."""
    if verdict is None:
        return None
    names = ", ".join(verdict.collectives)
    if verdict.finding is Finding.STOPPED:
        who = ", ".join(label(p) for p in verdict.holders)
        waits = f" while {_processes(verdict.waiting)} in {names}" if verdict.waiting else ""
        one = len(verdict.holders) == 1
        return (
            f"-> {who} {'is' if one else 'are'} stopped{waits}: "
            f"{'it holds' if one else 'they hold'} the job back"
        )
    if verdict.finding is Finding.HELD_BACK:
        blocked = [
            f"{label(p)} is in {where(frame)}" if frame else f"{label(p)} has no Python frame"
            for p, frame in zip(verdict.holders, verdict.where)
        ]
        held = "it holds" if len(verdict.holders) == 1 else "they hold"
        return (
            f"-> {'; '.join(blocked)} while {_processes(verdict.waiting)} in {names}: {held} the "
            f"job back"
        )
    if verdict.finding is Finding.PEER_OUTSIDE:
        return (
            f"-> every process waits in {names}: a peer outside this dump, or the transport, is "
            f"stuck"
        )
    if verdict.finding is Finding.MISMATCHED:
        return f"-> processes wait in different collectives ({names}): mismatched collectives"
    backward = verdict.in_backward
    where_ = ""
    if backward:
        who = ", ".join(label(p) for p in backward) + (" is" if len(backward) == 1 else " are")
        where_ = f"; {who} in backward() (autograd's C++ engine, where DDP all-reduces)"
    return (
        "-> no process waits in a collective called from Python; whether one waits in a collective "
        "issued from "
        f"C++ is unknown (no flight recorder){where_}"
    )


def silent_line(process: ProcessId, stopped: bool) -> str:
    """A process that wrote no stacks: stopped, or it could not write them."""
    if stopped:
        return f"  {label(process)}: {STOPPED_WHY}: it can neither run nor answer"
    return (
        f"  {label(process)}: wrote no stacks (exited while asked, or its signal handler could not "
        f"write)"
    )


# -- the end-of-run summary's hang block (stepcli/run/summary/console.py), from the run summary's
# section ------------
def _numbers(values: list[int]) -> str:
    """`0, 2-5, 7`: sorted integers with runs joined."""
    runs: list[list[int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _who(processes: list[HangProcess]) -> str:
    """`rank 1`, `ranks 0, 2-7`, or `pid 4242` for processes without a rank."""
    ranks = [p.rank for p in processes if p.rank is not None]
    if len(ranks) == len(processes):
        return f"rank{'s' if len(ranks) > 1 else ''} {_numbers(ranks)}"
    return ", ".join(f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}" for p in processes)


def _short_where(process: HangProcess) -> str:
    """The innermost frame in the program's own code, its file by name only (the stacks files hold
    the path)."""
    frame = process.frame
    if frame is not None and frame.function is not None:
        name = str(frame.file or "?").rsplit("/", 1)[-1]
        return f"{frame.function} ({name}:{frame.line})"
    return process.where if process.where else "no Python frame"


def _collective(process: HangProcess) -> str:
    collective = process.collective  # the stacks file's, as it wrote it
    if collective is None:
        return "a collective"
    return f"{collective.get('name')} #{collective.get('seq')}"


def _source(processes: list[HangProcess]) -> str:
    """How the collective was seen, when not from a Python call: torch's flight recorder (issued
    from C++)."""
    collective = processes[0].collective if processes else None
    if collective is not None and collective.get("source") == FLIGHT_RECORDER:
        return " (in flight in its process group, issued from C++: DDP's reducer or the like)"
    return ""


def _waits(processes: list[HangProcess]) -> str:
    return "waits" if len(processes) == 1 else "wait"


def _report_facts(processes: list[HangProcess]) -> list[str]:
    """Who holds the job back and why, and who waits in which collective: one sentence each, not yet
    wrapped."""
    stopped = [p for p in processes if p.source == STOPPED]
    if stopped:
        held = [f"{_who([p])} holds the job back: {STOPPED_WHY}" for p in stopped[:MAX_NAMED]]
        if len(stopped) > MAX_NAMED:
            held.append(f"{len(stopped) - MAX_NAMED} more stopped processes hold it back too")
        return held + _others_facts([p for p in processes if p not in stopped])
    waiting = [p for p in processes if p.waiting is True]
    elsewhere = [p for p in processes if p.waiting is not True]
    groups: dict[str, list[HangProcess]] = {}
    for process in waiting:
        groups.setdefault(_collective(process), []).append(process)
    waits = [f"{_who(g)} {_waits(g)} in {name}" + _source(g) for name, g in sorted(groups.items())]
    facts: list[str] = []
    if waiting and elsewhere:
        for process in elsewhere[:MAX_NAMED]:
            why = (
                "stuck in C code that holds the GIL (its Python could not run)"
                if process.source == FAULTHANDLER
                else "not in a collective"
            )
            facts.append(f"{_who([process])} holds the job back: in {_short_where(process)}, {why}")
        if len(elsewhere) > MAX_NAMED:
            facts.append(
                f"{len(elsewhere) - MAX_NAMED} more processes outside a collective hold it back too"
            )
        return facts + waits[:MAX_NAMED]
    if waiting and len(groups) == 1:
        name, group = next(iter(groups.items()))
        return [
            f"every process waits in {name}{_source(group)}: a peer outside this dump, or the "
            f"transport, is stuck"
        ]
    if waiting:
        return [
            "the processes wait in different collectives: mismatched collectives",
            *waits[:MAX_NAMED],
        ]
    if all(p.collectives_known is True for p in elsewhere):
        facts = ["no process waits in a collective (the flight recorder shows none in flight)"]
    # a collective issued from C++ (DDP's reducer) is not seen without the flight recorder: unknown
    else:
        facts = [
            "no process waits in a collective called from Python; collectives issued from C++ are "
            "unknown"
        ]
    for process in elsewhere[:MAX_NAMED]:
        if process.in_backward is True and process.collectives_known is not True:
            facts.append(
                f"{_who([process])} is in backward() from {_short_where(process)}: autograd's C++ "
                f"engine, where "
                "DDP all-reduces gradients (whether it waits there is unknown)"
            )
        else:
            facts.append(f"{_who([process])} is in {_short_where(process)}")
    return facts


def _others_facts(processes: list[HangProcess]) -> list[str]:
    """Beside stopped processes: which of the others wait in which collective, where the rest
    are."""
    groups: dict[str, list[HangProcess]] = {}
    for process in processes:
        if process.waiting is True:
            groups.setdefault(_collective(process), []).append(process)
    facts = [f"{_who(g)} {_waits(g)} in {name}" + _source(g) for name, g in sorted(groups.items())]
    elsewhere = [p for p in processes if p.waiting is not True]
    facts += [f"{_who([p])} is in {_short_where(p)}" for p in elsewhere]
    return facts[:MAX_NAMED]


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, SUMMARY_WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def summary_lines(section: HangSection | None, short: Callable[[str], str] = str) -> list[str]:
    """The end-of-run summary's hang block from the run summary's `hang` section, or [] without one:
    per report when the hang was called (step, time without a step), who holds the job back and why,
    who waits in which collective, where the stacks are (`short` shortens the folder); then what
    `--on-hang` did. Lines fit 80 columns, except a folder path too long for that, which is never
    cut. A report that says what the one before it said is one line."""
    if section is None:
        return []
    lines: list[str] = []
    previous: list[str] | None = None
    for report in section.reports:
        processes = report.processes
        steps = sorted({p.step for p in processes if p.step is not None})
        at = (
            ""
            if not steps
            else f"at step {steps[0]}, "
            if len(steps) == 1
            else f"at steps {steps[0]}-{steps[-1]}, "
        )
        idle, timeout = report.idle_s, section.timeout_s
        if idle is not None:
            stalled = f"no process completed a step for {idle:.1f} s"
        elif timeout is not None:
            stalled = f"no process completed a step for {timeout:g} s or more"
        else:
            stalled = "no process completed a step"
        facts = _report_facts(processes)
        same = facts == previous
        lines += _wrap(f"hang: {at}{stalled}" + (", as above" if same else ""), "", "  ")
        if not same:
            for fact in facts:
                lines += _wrap(fact, "  ", "    ")
        previous = facts
        folder = f"{short(str(report.folder))}/"
        if len(f"  stacks of every process: {folder}") <= SUMMARY_WIDTH:
            lines.append(f"  stacks of every process: {folder}")
        else:
            lines += ["  stacks of every process:", f"  {folder}"]
    if not lines:
        return []
    if section.ended_job is True:
        lines.append(f"  --on-hang kill ended the job: exit status {EXIT_HANG}")
    elif section.on_hang == "keep":
        lines.append("  --on-hang keep: the job was left running")
    return lines
