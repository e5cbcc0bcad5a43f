"""`stepcli top RUN`: a live view of a running `stepcli run`, one line per rank.

It reads what the run already writes: the processes' heartbeats in the control folder
(stepcli/agent/ondemand.py). Those are written only while somebody listens, so top pings the run the
way `stepcli capture` does (a ping in requests.json, renewed while it watches, withdrawn when it
returns, however it returns): while nobody watches, the job writes nothing more than it does today.
Per rank: its global step, steps/s, the last and the median of its recent step times, windows
recording or pending, and "no step for N s" when a rank that should be heard stopped stepping (a
hang, a pause, a dead rank). A process whose main thread makes no step (blocked in C) is still
heard: its stacks thread writes the heartbeat for it, with its real step and how long it has made
none.

The rank marked slowest is the culprit of the culprit analysis (stepcli.traces.analyses.culprit: who
arrives last at the collectives, with its thresholds) over the traces the run has saved so far, or
nobody: under synchronous collectives every rank's step takes the same time, so step times name
noise (often a waiting rank).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from stepcli.errors import StepcliError
from stepcli.run.controldir import read_processes, run_alive
from stepcli.run.live.captureplan import fresh, step_time
from stepcli.run.live.capturewindow import Ping, _ping, _renewer, _withdraw, await_heartbeats
from stepcli.run.live.liverun import LiveRun, find_run
from stepcli.runfolder.layout import CONTROL_FOLDER, RUN_FOLDER, out_of_control_dir
from stepcli.safetext import visible

SCHEMA = "stepcli.top"
_FIRST_LOOK_S = 15.0  # the longest top waits for the first fresh heartbeats


def snapshot(
    processes: list[dict[str, Any]],
    run_id: str,
    running: bool,
    now: float,
    culprit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pure: the heartbeats and the culprit analysis of the saved traces (`culprit_of`) in, one row
    per process and the slowest rank (the culprit, or None) out."""
    rows: list[dict[str, Any]] = []
    for process in sorted(processes, key=_order):
        answers = process.get("responses")
        answers = list(answers.values()) if isinstance(answers, dict) else []
        pending = len([a for a in answers if isinstance(a, dict) and a.get("status") == "accepted"])
        ended = str(process.get("ended") or "")
        # counted from its last step (step_time)
        stalled = not ended and running and not fresh(process, now)
        rows.append(
            {
                "rank": process.get("rank"),
                "worker": str(
                    process.get("worker") or f"{process.get('host')}_{process.get('pid')}"
                ),
                "step": process.get("step"),
                "steps_per_s": 0.0 if stalled else process.get("steps_per_s"),
                "last_ms": process.get("last_ms"),
                "median_ms": process.get("median_ms"),
                "recording": bool(process.get("recording")),
                "pending": pending,
                "ended": ended,
                "no_step_for_s": round(now - step_time(process), 1) if stalled else None,
                "slowest": False,
            }
        )
    found = (culprit or {}).get("culprit")
    rank = found.get("rank") if isinstance(found, dict) else None
    for row in rows:
        row["slowest"] = rank is not None and row["rank"] == rank
    slowest = rank if any(row["slowest"] for row in rows) else None
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "running": running,
        "ranks": rows,
        "slowest": slowest,
        "culprit": _culprit_basis(culprit, slowest),
    }


def _culprit_basis(culprit: dict[str, Any] | None, slowest: Any) -> dict[str, Any]:
    """What `slowest` rests on: the culprit analysis of the saved traces (its evidence), or why
    nobody is named."""
    if not culprit or not culprit.get("collectives"):
        return {
            "rank": None,
            "collectives": 0,
            "why": "no saved trace with collectives on two or more ranks yet",
        }
    found = culprit.get("culprit")
    if slowest is not None and isinstance(found, dict):
        return {
            "rank": slowest,
            "collectives": culprit["collectives"],
            "why": str(found.get("evidence") or ""),
        }
    decided = culprit.get("no_culprit")  # the test that decided, in the analysis's own words
    words = decided.get("words") if isinstance(decided, dict) else None
    return {
        "rank": None,
        "collectives": culprit["collectives"],
        "why": str(words)
        if words
        else f"no rank arrives last consistently enough at {culprit['collectives']} collectives",
    }


def run_traces(out_dir: Path, since: float) -> list[str]:
    """The traces a run has saved so far in its output folder (and its window folders), none older
    than the run."""
    found = []
    for pattern in (
        "*.pt.trace.json",
        "*.pt.trace.json.gz",
        "*/*.pt.trace.json",
        "*/*.pt.trace.json.gz",
    ):
        for path in out_dir.glob(pattern):
            try:
                if (
                    path.is_file()
                    and path.stat().st_mtime >= since - 2.0
                    and not path.name.startswith(".")
                ):
                    found.append(str(path))
            except OSError:
                continue
    return sorted(found)


class CulpritWatch:
    """The culprit analysis of a run's saved traces, computed again only when the set of traces
    changes."""

    def __init__(self, out_dir: Path, since: float) -> None:
        self.out_dir = out_dir
        self.since = since
        self._key: tuple[tuple[str, int], ...] | None = None
        self._culprit: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any] | None:
        paths = run_traces(self.out_dir, self.since)
        key = tuple((path, _size(path)) for path in paths)
        if key != self._key:
            self._key, self._culprit = key, culprit_of(paths)
        return self._culprit


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return -1


def culprit_of(paths: list[str]) -> dict[str, Any] | None:
    """The culprit section of the traces' analysis (stepcli.traces.analyses.culprit), or None (no
    traces, or unreadable)."""
    if len(paths) < 2:
        return None
    try:
        from stepcli.traces.engine import summarize_paths

        section = summarize_paths(paths).to_dict().get("culprit")
    except Exception:  # a trace still being written, or one the analysis refuses: nobody is named
        return None
    return section if isinstance(section, dict) else None


def _order(process: dict[str, Any]) -> tuple[Any, ...]:
    rank = process.get("rank")
    return (
        not isinstance(rank, int),
        rank if isinstance(rank, int) else 0,
        str(process.get("worker")),
    )


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _state(row: dict[str, Any]) -> str:
    if row["ended"]:
        return f"ended ({row['ended']})"
    if row["no_step_for_s"] is not None:
        return f"no step for {row['no_step_for_s']:.0f} s (hang?)"
    parts = (["recording"] if row["recording"] else []) + (
        [f"{row['pending']} pending"] if row["pending"] else []
    )
    return ", ".join(parts) or "stepping"


def render(document: dict[str, Any]) -> Any:
    """A rich table of the snapshot; the slowest rank in bold red. What the heartbeats say is shown
    as text: never read as rich markup (`[bold red]`), control characters (ESC, bidi overrides)
    shown as escapes."""
    from rich.table import Table
    from rich.text import Text

    def cell(value: Any) -> Text:
        return Text(visible(str(value)))

    status = "running" if document["running"] else "finished"
    table = Table(
        title=cell(f"stepcli top: run {document['run_id']} ({status})"), title_justify="left"
    )
    # the culprit's column only when the analysis names one: never an empty, unlabelled last column
    named = any(row["slowest"] for row in document["ranks"])
    for name in (
        "rank",
        "step",
        "steps/s",
        "last ms",
        "median ms",
        "windows / state",
        *(["culprit"] if named else []),
    ):
        table.add_column(
            name, justify="left" if name in ("rank", "windows / state", "culprit") else "right"
        )
    for row in document["ranks"]:
        table.add_row(
            cell(row["worker"]),
            cell(row["step"]),
            _fmt(row["steps_per_s"], ".1f"),
            _fmt(row["last_ms"], ".1f"),
            _fmt(row["median_ms"], ".1f"),
            cell(_state(row)),
            *(["slowest" if row["slowest"] else ""] if named else []),
            style="bold red" if row["slowest"] else None,
        )
    return table


def _fmt(value: Any, spec: str) -> str:
    return (
        format(value, spec)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else "-"
    )


def _finished_run(target: str) -> dict[str, Any]:
    """The last heartbeats of the newest run in folder TARGET that is not running; StepcliError if
    none."""
    path = Path(target)
    controls = (
        sorted(path.joinpath(RUN_FOLDER).glob(f"*/{CONTROL_FOLDER}")) if path.is_dir() else []
    )
    if not controls:
        raise StepcliError(f"{target}: not a stepcli run folder (no {RUN_FOLDER}/ run inside)")
    control = max(controls, key=lambda folder: folder.stat().st_mtime)
    processes = read_processes(str(control))
    since = min((_number(p.get("time")) for p in processes), default=0.0) - 3600.0
    culprit = culprit_of(run_traces(path, since))
    return snapshot(processes, control.parent.name, False, time.time(), culprit)


def top_main(target: str, *, once: bool, as_json: bool, interval: float = 1.0) -> int:
    """Exit 0 (a snapshot or a live view until Ctrl-C; a finished run is said so); 2 TARGET is not a
    run."""
    try:
        run = find_run(target)
    except StepcliError as exc:
        if not Path(target).is_dir() or "no running" not in exc.message:
            raise
        _print(_finished_run(target), as_json)
        return 0
    previous = signal.signal(signal.SIGTERM, _terminate)
    ping = Ping(uuid.uuid4().hex[:12], time.time())
    try:
        _ping(run, ping)
        renew = _renewer(run, ping)
        processes = await_heartbeats(run, ping, time.time() + _FIRST_LOOK_S, renew)
        culprit = CulpritWatch(Path(out_of_control_dir(str(run.folder))), run.started_at)
        if once or as_json:
            _print(
                snapshot(processes, run.run_id, run_alive(run.folder), time.time(), culprit()),
                as_json,
            )
            return 0
        _live(run, renew, interval, culprit)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _withdraw(run, ping, None)


def _live(run: LiveRun, renew: Any, interval: float, culprit: CulpritWatch) -> None:
    from rich.live import Live

    with Live(render(_now(run, culprit)), auto_refresh=False) as live:
        while True:
            document = _now(run, culprit)
            live.update(render(document), refresh=True)
            if not document["running"]:
                return
            renew()
            time.sleep(interval)


def _now(run: LiveRun, culprit: CulpritWatch) -> dict[str, Any]:
    return snapshot(
        read_processes(run.folder), run.run_id, run_alive(run.folder), time.time(), culprit()
    )


def _print(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(document, indent=2))
        return
    from rich.console import Console

    from stepcli.pipeconsole import pipe_console

    # on a pipe: no trailing spaces (the title's)
    console = pipe_console(width=max(100, Console().width))
    console.print(render(document))
    basis = document.get("culprit") or {}
    if basis.get("why"):
        console.print(
            f"slowest: "
            f"{'rank ' + str(basis['rank']) if basis.get('rank') is not None else 'nobody'} "
            f"({basis['why']})",
            markup=False,
            highlight=False,
        )
    if not document["running"]:
        console.print(
            f"run {visible(str(document['run_id']))} has finished", markup=False, highlight=False
        )


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)
