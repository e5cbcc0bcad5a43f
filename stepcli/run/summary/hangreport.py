"""What a hang dump says: the printed block (which processes wait in which collective, which is elsewhere, and
where) and the run summary's `hang` section, from the stacks files (stepcli/agent/stacks.py).

The block and the verdict are pure (documents in, lines out), so they are unit tested alone.
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import stepcli

INNERMOST_FRAMES = 5
STOPPED = "stopped"  # a stacks file's `source` for a process that was stopped (SIGSTOP, a debugger): no threads
STOPPED_WHY = "stopped (SIGSTOP, or held by a debugger)"
EXIT_HANG = 124  # `--on-hang kill`: the job was ended after its hang dump (timeout(1)'s status for "timed out")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?+) in (.*)$')


def parse_faulthandler(text: str, main_thread: int | None) -> list[dict[str, Any]]:
    """faulthandler's text (`Thread 0x... (most recent call first):` then `  File "f", line N in func`) as the
    stacks file's `threads`: innermost frame first, as faulthandler prints them; the last dump in `text` only."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            ident = int(thread.group(2), 16)
            if any(t["id"] == ident for t in threads):
                threads = []  # a second dump appended to the file: keep the newest
            threads.append({"id": ident, "name": f"thread {ident:#x}", "main": ident == main_thread, "frames": []})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            number = frame.group(2)
            threads[-1]["frames"].append(
                {"function": frame.group(3), "file": frame.group(1), "line": int(number) if number.isdigit() else None}
            )
    return threads


def label(process: dict[str, Any]) -> str:
    """`rank 1 (pid 4242)`, or `pid 4242 on host` for a process without a rank."""
    rank = process.get("rank")
    if rank is not None:
        return f"rank {rank} (pid {process.get('pid')})"
    return f"pid {process.get('pid')} on {process.get('host')}"


def order(process: dict[str, Any]) -> tuple[Any, ...]:
    rank = process.get("rank")
    return (rank is None, rank if rank is not None else 0, str(process.get("host")), int(process.get("pid") or 0))


FROM_CPP = "issued from C++, not a torch.distributed call of the program: DDP's reducer, FSDP or the like"
BACKWARD_FUNCTIONS = ("_engine_run_backward", "run_backward")  # torch.autograd's entry into its C++ engine


def waiting_in(dump: dict[str, Any]) -> dict[str, Any] | None:
    """The collective the process waits in: a Python collective it entered and that has not returned, else the
    oldest one its process groups started and have not finished (torch's flight recorder: also collectives issued
    from C++, such as DDP's gradient all-reduce, marked `source: flight_recorder`); None when neither shows one."""
    collective = dump.get("collective")
    if isinstance(collective, dict) and not collective.get("returned"):
        return collective
    flights = [entry for entry in dump.get("in_flight") or [] if isinstance(entry, dict)]
    if not flights:
        return None
    first = flights[0]
    return {
        "name": first.get("name"),
        "seq": first.get("seq"),
        "group": first.get("group"),
        "entered_s_ago": first.get("entered_s_ago"),
        "returned": False,
        "source": "flight_recorder",
        "in_flight": len(flights),
    }


def in_collective(dump: dict[str, Any]) -> bool:
    """Waits in a collective: entered one that has not returned, or its process groups have one in flight."""
    return waiting_in(dump) is not None


def collectives_known(dump: dict[str, Any]) -> bool:
    """Whether the dump can tell "in no collective" from "in one issued from C++": the flight recorder answered."""
    return isinstance(dump.get("in_flight"), list)


def in_backward(frames: list[dict[str, Any]]) -> bool:
    """The main thread is inside autograd's C++ engine (loss.backward()), where DDP's reducer all-reduces."""
    return any(frame.get("function") in BACKWARD_FUNCTIONS for frame in frames[:INNERMOST_FRAMES])


def collective_name(collective: dict[str, Any]) -> str:
    return f"{collective.get('name')} #{collective.get('seq')}"


def main_frames(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """The main thread's frames, innermost first (the first thread's if the main thread is not there)."""
    threads = [t for t in dump.get("threads") or [] if isinstance(t, dict)]
    main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
    return list(main.get("frames") or []) if main is not None else []


def _library_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    libraries = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    # stepcli's own frames (its collective wrapper) too, wherever it is installed from (an editable install)
    package = Path(stepcli.__file__).parent
    return (*sorted(libraries), f"{package}/", f"{package.resolve()}/")


def own_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame in the program's own code (not the standard library, an installed package or stepcli)."""
    libraries = _library_paths()
    for frame in frames:
        if not str(frame.get("file", "")).startswith(libraries):
            return frame
    return frames[0] if frames else None


def where(frame: dict[str, Any]) -> str:
    return f"{frame.get('function')} ({frame.get('file')}:{frame.get('line')})"


def _collective_line(dump: dict[str, Any]) -> str:
    collective = waiting_in(dump) or {}
    ago = collective.get("entered_s_ago")
    when = f"{ago:.1f} s ago" if isinstance(ago, (int, float)) else "when unknown"
    if collective.get("source") == "flight_recorder":
        return (
            f"{label(dump)}: waits in {collective_name(collective)} of process group {collective.get('group')} "
            f"(in flight, started {when}; {FROM_CPP}), step {dump.get('step')}"
        )
    return f"{label(dump)}: waits in {collective_name(collective)} (entered {when}), step {dump.get('step')}"


def _elsewhere_lines(dump: dict[str, Any]) -> list[str]:
    collective = dump.get("collective")
    known = collectives_known(dump)
    if isinstance(collective, dict):
        state = f"not in a collective (its last, {collective_name(collective)}, returned"
        state += "; none in flight)" if known else "; collectives issued from C++ are not seen)"
    elif known:
        state = "not in a collective (none in flight in its process groups)"
    elif dump.get("collectives_hooked"):
        state = "not in a collective called from Python (entered none; collectives issued from C++ are not seen)"
    else:
        state = "collectives not recorded (run with --hang-timeout)"
    if dump.get("source") == "faulthandler":
        state = "its Python threads could not run (C code holding the GIL?); faulthandler's stacks"
    step = f", step {dump['step']}" if dump.get("step") is not None else ""
    lines = [f"{label(dump)}: {state}{step}; innermost frames of its main thread:"]
    frames = main_frames(dump)
    lines += [f"    {where(frame)}" for frame in frames[:INNERMOST_FRAMES]]
    if not frames:
        lines.append("    (no Python frame)")
    return lines


def verdict(dumps: list[dict[str, Any]], stopped: Sequence[dict[str, Any]] = ()) -> str | None:
    """One line naming the process(es) the others wait for, when the dumps (and `stopped`: processes of this host
    that wrote no stacks because they are stopped) say it."""
    waiting = [d for d in dumps if in_collective(d)]
    elsewhere = [d for d in dumps if not in_collective(d)]
    if stopped:
        who = ", ".join(label(p) for p in sorted(stopped, key=order))
        names = sorted({collective_name(waiting_in(d) or {}) for d in waiting})
        waits = (
            f" while {len(waiting)} process{'es' if len(waiting) > 1 else ''} wait{'' if len(waiting) > 1 else 's'} "
            f"in {', '.join(names)}"
            if waiting
            else ""
        )
        one = len(stopped) == 1
        return f"-> {who} {'is' if one else 'are'} stopped{waits}: {'it holds' if one else 'they hold'} the job back"
    if waiting and elsewhere:
        blocked = []
        for dump in sorted(elsewhere, key=order):
            frame = own_frame(main_frames(dump))
            blocked.append(f"{label(dump)} is in {where(frame)}" if frame else f"{label(dump)} has no Python frame")
        names = sorted({collective_name(waiting_in(d) or {}) for d in waiting})
        return (
            f"-> {'; '.join(blocked)} while {len(waiting)} process{'es' if len(waiting) > 1 else ''} "
            f"wait{'' if len(waiting) > 1 else 's'} in {', '.join(names)}: "
            f"{'it holds' if len(elsewhere) == 1 else 'they hold'} the job back"
        )
    if waiting:
        numbers = {collective_name(waiting_in(d) or {}) for d in waiting}
        if len(numbers) == 1:
            return f"-> every process waits in {numbers.pop()}: a peer outside this dump, or the transport, is stuck"
        return f"-> processes wait in different collectives ({', '.join(sorted(numbers))}): mismatched collectives"
    if dumps and not all(collectives_known(d) for d in dumps):
        backward = [d for d in sorted(dumps, key=order) if in_backward(main_frames(d))]
        where_ = (
            f"; {_who_dumps(backward)} in backward() (autograd's C++ engine, where DDP all-reduces)" if backward else ""
        )
        return (
            "-> no process waits in a collective called from Python; whether one waits in a collective issued from "
            f"C++ is unknown (no flight recorder){where_}"
        )
    return None


def _who_dumps(dumps: list[dict[str, Any]]) -> str:
    return ", ".join(label(d) for d in dumps) + (" is" if len(dumps) == 1 else " are")


def is_stopped(process: dict[str, Any]) -> bool:
    """Whether a process of this host is stopped (state T or t in /proc: SIGSTOP, or a tracer holds it)."""
    import socket

    if process.get("host") != socket.gethostname():
        return False
    try:
        with open(f"/proc/{int(process['pid'])}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    return state in (b"T", b"t")


def describe_dumps(dumps: list[dict[str, Any]], silent: list[dict[str, Any]]) -> list[str]:
    """The block's lines (without the headline): one entry per process, then the verdict."""
    lines: list[str] = []
    stopped = [d for d in dumps if d.get("source") == STOPPED]  # files the launcher wrote for stopped processes
    dumps = [d for d in dumps if d.get("source") != STOPPED]
    for dump in sorted(dumps, key=order):
        if in_collective(dump):
            lines.append("  " + _collective_line(dump))
        else:
            lines += ["  " + line for line in _elsewhere_lines(dump)]
    stopped += [p for p in silent if is_stopped(p)]
    for process in sorted([*silent, *(d for d in stopped if d not in silent)], key=order):
        if process in stopped:
            lines.append(f"  {label(process)}: {STOPPED_WHY}: it can neither run nor answer")
        else:
            lines.append(
                f"  {label(process)}: wrote no stacks (exited while asked, or its signal handler could not write)"
            )
    conclusion = verdict(dumps, stopped)
    if conclusion:
        lines.append(conclusion)
    return lines


_MAX_DUMP_BYTES = 64 * 1024 * 1024  # one process's stacks: thousands of threads' frames stay well below


def read_json(path: str) -> dict[str, Any] | None:
    """A stacks file as a dict, or None for anything else: never blocking on a FIFO, never reading `/dev/zero`
    (stepcli.inputs.read_side_json)."""
    from stepcli.errors import TraceError
    from stepcli.inputs import read_side_json

    try:
        document = read_side_json(path, _MAX_DUMP_BYTES)
    except TraceError:
        return None
    return document if isinstance(document, dict) else None


def read_dumps(target: Path) -> list[dict[str, Any]]:
    """The stacks files of one dump folder, each with its file name."""
    dumps = []
    for path in sorted(target.glob("*.json")):
        document = read_json(str(path))
        if document is not None:
            document["file"] = path.name
            dumps.append(document)
    return dumps


def hang_summary(
    folders: Sequence[str],
    since: float,
    *,
    timeout_s: float | None = None,
    on_hang: str | None = None,
    ended_job: bool = False,
) -> dict[str, Any] | None:
    """The run summary's `hang` section: the `OUT/hang-<n>/` folders this run's hang watch wrote (`folders`, never
    one found in the output folder: an earlier run's, or one planted there), the timeout, and what `--on-hang` did
    (`ended_job`: the launcher killed the job after the dump); None without a report."""
    reports = []
    for folder in map(Path, folders):
        dumps = [d for d in read_dumps(folder) if float(d.get("time", 0.0)) >= since]
        if not dumps:
            continue
        # "no process completed a step for": the most recent last step of any process, as the printed block says
        idle = [float(d["last_step_s_ago"]) for d in dumps if isinstance(d.get("last_step_s_ago"), (int, float))]
        stopped = [d for d in dumps if d.get("source") == STOPPED]
        reports.append(
            {
                "folder": str(folder),
                "idle_s": round(min(idle), 1) if idle else None,
                "processes": [_process_entry(dump) for dump in sorted(dumps, key=order)],
                "verdict": verdict([d for d in dumps if d not in stopped], stopped),
            }
        )
    if not reports:
        return None
    return {"reports": reports, "timeout_s": timeout_s, "on_hang": on_hang, "ended_job": ended_job}


def _process_entry(dump: dict[str, Any]) -> dict[str, Any]:
    frames = main_frames(dump)
    frame = own_frame(frames)
    return {
        "worker": dump.get("worker"),
        "rank": dump.get("rank"),
        "pid": dump.get("pid"),
        "host": dump.get("host"),
        "step": dump.get("step"),
        "collective": waiting_in(dump) or dump.get("collective"),
        "waiting": in_collective(dump),
        "collectives_known": collectives_known(dump),  # the flight recorder answered: C++ collectives are seen
        "in_backward": in_backward(frames),
        "where": where(frame) if frame is not None else None,
        "frame": {key: frame.get(key) for key in ("function", "file", "line")} if frame is not None else None,
        # "faulthandler": its Python could not run (C code holding the GIL); "stopped": SIGSTOP or a debugger
        "source": dump.get("source", "python"),
        "file": dump.get("file"),
    }


# -- the end-of-run summary's hang block (stepcli/run/summary/console.py) -----------------------------------------------
SUMMARY_WIDTH = 80  # the block's lines fit 80 columns; a folder path too long for that is never cut
MAX_NAMED = 4  # processes named one by one per report; the others counted


def _numbers(values: list[int]) -> str:
    """`0, 2-5, 7`: sorted integers with runs joined."""
    runs: list[list[int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _who(processes: list[dict[str, Any]]) -> str:
    """`rank 1`, `ranks 0, 2-7`, or `pid 4242` for processes without a rank."""
    ranks = [p["rank"] for p in processes if isinstance(p.get("rank"), int) and not isinstance(p.get("rank"), bool)]
    if len(ranks) == len(processes):
        return f"rank{'s' if len(ranks) > 1 else ''} {_numbers(ranks)}"
    return ", ".join(f"rank {p['rank']}" if p.get("rank") is not None else f"pid {p.get('pid')}" for p in processes)


def _short_where(process: dict[str, Any]) -> str:
    """The innermost frame in the program's own code, its file by name only (the stacks files hold the path)."""
    frame = process.get("frame")
    if isinstance(frame, dict) and frame.get("function") is not None:
        name = str(frame.get("file") or "?").rsplit("/", 1)[-1]
        return f"{frame['function']} ({name}:{frame.get('line')})"
    return str(process["where"]) if process.get("where") else "no Python frame"


def _collective(process: dict[str, Any]) -> str:
    collective = process.get("collective")
    return collective_name(collective) if isinstance(collective, dict) else "a collective"


def _source(processes: list[dict[str, Any]]) -> str:
    """How the collective was seen, when not from a Python call: torch's flight recorder (issued from C++)."""
    collective = processes[0].get("collective") if processes else None
    if isinstance(collective, dict) and collective.get("source") == "flight_recorder":
        return " (in flight in its process group, issued from C++: DDP's reducer or the like)"
    return ""


def _plural(processes: list[dict[str, Any]], one: str, many: str) -> str:
    return one if len(processes) == 1 else many


def _report_facts(processes: list[dict[str, Any]]) -> list[str]:
    """Who holds the job back and why, and who waits in which collective: one sentence each, not yet wrapped."""
    stopped = [p for p in processes if p.get("source") == STOPPED]
    if stopped:
        held = [f"{_who([p])} holds the job back: {STOPPED_WHY}" for p in stopped[:MAX_NAMED]]
        if len(stopped) > MAX_NAMED:
            held.append(f"{len(stopped) - MAX_NAMED} more stopped processes hold it back too")
        return held + _others_facts([p for p in processes if p not in stopped])
    waiting = [p for p in processes if p.get("waiting") is True]
    elsewhere = [p for p in processes if p.get("waiting") is not True]
    groups: dict[str, list[dict[str, Any]]] = {}
    for process in waiting:
        groups.setdefault(_collective(process), []).append(process)
    waits = [f"{_who(g)} {_plural(g, 'waits', 'wait')} in {name}" + _source(g) for name, g in sorted(groups.items())]
    facts: list[str] = []
    if waiting and elsewhere:
        for process in elsewhere[:MAX_NAMED]:
            why = (
                "stuck in C code that holds the GIL (its Python could not run)"
                if process.get("source") == "faulthandler"
                else "not in a collective"
            )
            facts.append(f"{_who([process])} holds the job back: in {_short_where(process)}, {why}")
        if len(elsewhere) > MAX_NAMED:
            facts.append(f"{len(elsewhere) - MAX_NAMED} more processes outside a collective hold it back too")
        return facts + waits[:MAX_NAMED]
    if waiting and len(groups) == 1:
        name, group = next(iter(groups.items()))
        return [f"every process waits in {name}{_source(group)}: a peer outside this dump, or the transport, is stuck"]
    if waiting:
        return ["the processes wait in different collectives: mismatched collectives", *waits[:MAX_NAMED]]
    if all(p.get("collectives_known") is True for p in elsewhere):
        facts = ["no process waits in a collective (the flight recorder shows none in flight)"]
    else:  # a collective issued from C++ (DDP's reducer) is not seen without the flight recorder: unknown
        facts = ["no process waits in a collective called from Python; collectives issued from C++ are unknown"]
    for process in elsewhere[:MAX_NAMED]:
        if process.get("in_backward") is True and process.get("collectives_known") is not True:
            facts.append(
                f"{_who([process])} is in backward() from {_short_where(process)}: autograd's C++ engine, where "
                "DDP all-reduces gradients (whether it waits there is unknown)"
            )
        else:
            facts.append(f"{_who([process])} is in {_short_where(process)}")
    return facts


def _others_facts(processes: list[dict[str, Any]]) -> list[str]:
    """Beside stopped processes: which of the others wait in which collective, where the rest are."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for process in processes:
        if process.get("waiting") is True:
            groups.setdefault(_collective(process), []).append(process)
    facts = [f"{_who(g)} {_plural(g, 'waits', 'wait')} in {name}" + _source(g) for name, g in sorted(groups.items())]
    elsewhere = [p for p in processes if p.get("waiting") is not True]
    facts += [f"{_who([p])} is in {_short_where(p)}" for p in elsewhere]
    return facts[:MAX_NAMED]


def _wrap(text: str, first: str, rest: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, SUMMARY_WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [
        first.rstrip()
    ]


def summary_lines(section: Any, short: Any = str) -> list[str]:
    """The end-of-run summary's hang block from the run summary's `hang` section, or [] without one: per report
    when the hang was called (step, time without a step), who holds the job back and why, who waits in which
    collective, where the stacks are (`short` shortens the folder); then what `--on-hang` did. Lines fit 80
    columns, except a folder path too long for that, which is never cut. A report that says what the one before
    it said is one line."""
    if not isinstance(section, dict):
        return []
    lines: list[str] = []
    previous: list[str] | None = None
    for report in section.get("reports") or []:
        if not isinstance(report, dict):
            continue
        processes = [p for p in report.get("processes") or [] if isinstance(p, dict)]
        steps = sorted({p["step"] for p in processes if isinstance(p.get("step"), int)})
        at = "" if not steps else f"at step {steps[0]}, " if len(steps) == 1 else f"at steps {steps[0]}-{steps[-1]}, "
        idle, timeout = report.get("idle_s"), section.get("timeout_s")
        if isinstance(idle, (int, float)):
            stalled = f"no process completed a step for {idle:.1f} s"
        elif isinstance(timeout, (int, float)):
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
        folder = f"{short(str(report.get('folder')))}/"
        if len(f"  stacks of every process: {folder}") <= SUMMARY_WIDTH:
            lines.append(f"  stacks of every process: {folder}")
        else:
            lines += ["  stacks of every process:", f"  {folder}"]
    if not lines:
        return []
    if section.get("ended_job") is True:
        lines.append(f"  --on-hang kill ended the job: exit status {EXIT_HANG}")
    elif section.get("on_hang") == "keep":
        lines.append("  --on-hang keep: the job was left running")
    return lines
