"""What a hang dump says: the printed block (which processes wait in which collective, which is
elsewhere, and where) and the run summary's `hang` section, from the stacks files
(stepcli/agent/stacks.py).

Three layers, composed here: the reader (hangdump: stacks files as typed dumps), the verdict
(hangverdict: who waits where, who holds the job back) and the words (hangwords: the lines people
read).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stepcli.run.summary.hangdump import Frame, ProcessId, StackDump, is_stopped, read_dumps
from stepcli.run.summary.hangverdict import (
    collectives_known,
    decide,
    in_backward,
    in_collective,
    own_frame,
    split_stopped,
    waiting_in,
)
from stepcli.run.summary.hangwords import (
    collective_line,
    elsewhere_lines,
    silent_line,
    verdict_line,
    where,
)
from stepcli.runfolder.summaryfile import HangFrame, HangProcess, HangReport, HangSection


def verdict(dumps: Sequence[StackDump], stopped: Sequence[ProcessId] = ()) -> str | None:
    """The block's last line naming the process(es) the others wait for, or None when the dumps say
    nothing."""
    return verdict_line(decide(dumps, stopped))


def describe_dumps(dumps: Sequence[StackDump], silent: Sequence[ProcessId]) -> list[str]:
    """The block's lines (without the headline): one entry per process, then the verdict. `silent`:
    processes that wrote no stacks (a stopped one of this host is said so)."""
    ran, stopped_files = split_stopped(dumps)
    lines: list[str] = []
    for dump in sorted(ran, key=lambda d: d.process.order()):
        if in_collective(dump):
            lines.append("  " + collective_line(dump))
        else:
            lines += ["  " + line for line in elsewhere_lines(dump)]
    stopped = [d.process for d in stopped_files] + [p for p in silent if is_stopped(p)]
    for process in sorted({*silent, *stopped}, key=ProcessId.order):
        lines.append(silent_line(process, process in stopped))
    conclusion = verdict(ran, stopped)
    if conclusion:
        lines.append(conclusion)
    return lines


def hang_summary(
    folders: Sequence[str],
    since: float,
    *,
    timeout_s: float | None = None,
    on_hang: str | None = None,
    ended_job: bool = False,
) -> HangSection | None:
    """The run summary's `hang` section: the `OUT/hang-<n>/` folders this run's hang watch wrote
    (`folders`, never one found in the output folder: an earlier run's, or one planted there), the
    timeout, and what `--on-hang` did (`ended_job`: the launcher killed the job after the dump);
    None without a report."""
    reports = []
    for folder in map(Path, folders):
        dumps = [d for d in read_dumps(folder) if d.time >= since]
        if not dumps:
            continue
        # "no process completed a step for": the most recent last step of any process, as the
        # printed block says
        idle = [d.last_step_s_ago for d in dumps if d.last_step_s_ago is not None]
        ran, stopped = split_stopped(dumps)
        reports.append(
            HangReport(
                folder=str(folder),
                idle_s=round(min(idle), 1) if idle else None,
                processes=[_process_entry(d) for d in sorted(dumps, key=_in_order)],
                verdict=verdict(ran, [d.process for d in stopped]),
            )
        )
    if not reports:
        return None
    return HangSection(reports=reports, timeout_s=timeout_s, on_hang=on_hang, ended_job=ended_job)


def _in_order(dump: StackDump) -> tuple[bool, int, str, int]:
    return dump.process.order()


def _frame(frame: Frame | None) -> HangFrame | None:
    return HangFrame(function=frame.function, file=frame.file, line=frame.line) if frame else None


def _process_entry(dump: StackDump) -> HangProcess:
    """One process of a report (docs/reference/summary-json.md, `hang.reports[].processes[]`)."""
    frame = own_frame(dump.main_frames)
    collective = waiting_in(dump) or dump.collective
    return HangProcess(
        worker=dump.process.worker,
        rank=dump.process.rank,
        pid=dump.process.pid,
        host=dump.process.host,
        step=dump.step,
        collective=dict(collective.raw) if collective is not None else None,
        waiting=in_collective(dump),
        # the flight recorder answered: C++ collectives are seen
        collectives_known=collectives_known(dump),
        in_backward=in_backward(dump.main_frames),
        where=where(frame) if frame is not None else None,
        frame=_frame(frame),
        # "faulthandler": its Python could not run (C code holding the GIL); "stopped": SIGSTOP or a
        # debugger
        source=dump.source,
        file=dump.file,
    )
