"""report.html's "Hang" section: the run summary's `hang` section (built by
stepcli/run/summary/hangreport.py), shown only when `stepcli run --hang-timeout` reported a hang.
Per report the verdict comes first (who holds the job back, the collective the others wait in) with
when the hang was called (after the last report, what `--on-hang` did), then where the stacks are
and one row per process. Everything in it comes from the program (file paths, function names) or
from a file on disk, so every value is escaped; nothing is computed here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from stepcli.report.links import page_href
from stepcli.safetext import html_escape as escape

if TYPE_CHECKING:
    from stepcli.runfolder.summaryfile import HangProcess, HangReport, HangSection


def _text(value: Any) -> str:
    return escape(str(value))


def _number(value: Any) -> float | None:
    """A number of the stacks file's `collective` (an object as the agent wrote it), or None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _process(process: HangProcess) -> str:
    rank = process.rank
    return f"rank {_text(rank)}" if rank is not None else f"pid {_text(process.pid)}"


def _collective(process: HangProcess) -> str:
    collective = process.collective
    if collective is None:
        return '<span class="muted">none entered</span>'
    name = f"<code>{_text(collective.get('name'))} #{_text(collective.get('seq'))}</code>"
    entered = _number(collective.get("entered_s_ago"))
    if process.waiting is True and collective.get("source") == "flight_recorder":
        return (
            name
            + f" of process group {_text(collective.get('group'))}, in flight"
            + (f", started {entered:.1f} s before the dump" if entered is not None else "")
            + " <span class=\"muted\">(issued from C++: DDP's reducer or the like; torch's flight "
            "recorder)</span>"
        )
    if process.waiting is True:
        return name + (f" entered {entered:.1f} s before the dump" if entered is not None else "")
    return name + " returned"


def _where(process: HangProcess) -> str:
    where = process.where
    cell = f"<code>{_text(where)}</code>" if where else '<span class="muted">no Python frame</span>'
    if process.source == "stopped":
        return (
            '<span class="muted">stopped (SIGSTOP, or held by a debugger): it could neither run '
            "nor answer</span>"
        )
    if process.source == "faulthandler":
        cell += (
            ' <span class="muted">(its Python could not run: C code holding the GIL? '
            "faulthandler's stacks)</span>"
        )
    return cell


def _table(processes: list[HangProcess], index: int) -> str:
    head = (
        "<tr><th>process</th><th>pid</th><th>host</th><th>step</th><th>waiting</th>"
        "<th>collective</th><th>where (innermost frame of the program's own code)</th></tr>"
    )
    rows = []
    for process in processes:
        waiting = process.waiting is True
        rows.append(
            f'<tr class="{"waiting" if waiting else "elsewhere"}"><td>{_process(process)}</td>'
            f"<td>{_text(process.pid)}</td><td>{_text(process.host)}</td>"
            f"<td>{_text(process.step)}</td>"
            f"<td>{'waits in a collective' if waiting else '<b>not in a collective</b>'}</td>"
            f'<td>{_collective(process)}</td><td class="where">{_where(process)}</td></tr>'
        )
    return (
        f'<table class="hang" '
        f'id="hang-processes-{index}"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    )


def _called(report: HangReport, processes: list[HangProcess], timeout: float | None) -> str:
    steps = sorted({p.step for p in processes if p.step is not None})
    at = (
        ""
        if not steps
        else f" at step {steps[0]}"
        if len(steps) == 1
        else f" at steps {steps[0]}-{steps[-1]}"
    )
    idle = report.idle_s
    if idle is not None:
        stalled = f"no process completed a step for {idle:.1f} s"
    elif timeout is not None:
        stalled = f"no process completed a step for {timeout:g} s or more"
    else:
        stalled = "no process completed a step"
    limit = f" (--hang-timeout {timeout:g} s)" if timeout is not None else ""
    return f"The hang was called{at}: {stalled}{limit}."


def hang_section(hang: HangSection | None, base: str, exit_status: Any = None) -> str:
    """The whole section, or '' when the run reported no hang. `base`: the page's folder, for the
    stacks links; `exit_status`: the run's, said when `--on-hang kill` ended the job."""
    if hang is None or not hang.reports:
        return ""
    reports = hang.reports
    timeout = hang.timeout_s
    outcome = ""
    if hang.ended_job is True:
        status = f", exit status {_text(exit_status)}" if exit_status is not None else ""
        outcome = (
            f' <span id="hang-outcome"><strong>stepcli ended the job after the dump</strong> '
            f"(--on-hang kill{status}).</span>"
        )
    elif hang.on_hang == "keep":
        outcome = ' <span id="hang-outcome">The job was left running (--on-hang keep).</span>'
    parts = ['<h2 id="hang">Hang</h2>']
    for index, report in enumerate(reports, 1):
        processes = report.processes
        folder = str(report.folder or "")
        if len(reports) > 1:
            parts.append(f"<h3>{_text(os.path.basename(folder.rstrip('/')))}</h3>")
        verdict = report.verdict
        if verdict:
            finding = _text(verdict.removeprefix("-> "))
        elif all(p.collectives_known is True for p in processes):
            finding = (
                "No verdict: no process waits in a collective (none in flight). Where each one is, "
                "below."
            )
        else:
            finding = (
                "No verdict: no process waits in a collective called from Python; whether one "
                "waits in a collective issued from C++ (DDP's reducer) is unknown. Where each one "
                "is, below."
            )
        parts.append(
            f'<div class="card advice hang-verdict" id="hang-verdict-{index}"><b>{finding}</b>'
            f"{_text(_called(report, processes, timeout))}"
            f"{outcome if index == len(reports) else ''}</div>"
        )
        parts.append(
            f"<p>Stacks of every process (every thread's frames, faulthandler's text, the last "
            f"collective): "
            f'<a href="{page_href(folder, base)}/"><code>{_text(folder)}/</code></a></p>'
        )
        parts.append(_table(processes, index))
    return "\n".join(parts)
