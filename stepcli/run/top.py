"""`stepcli top RUN`: a live view of a running `stepcli run`, one line per rank.

It reads what the run already writes: the processes' heartbeats in the control folder (stepcli/agent/ondemand.py).
Those are written only while somebody listens, so top pings the run the way `stepcli capture` does (a ping in
requests.json, renewed while it watches, withdrawn when it returns, however it returns): while nobody watches,
the job writes nothing more than it does today. Per rank: its global step, steps/s, the last and the median of
its recent step times, windows recording or pending, and "no step for N s" when a rank that should be heard
stopped stepping (a hang, a pause, a dead rank). The rank with the largest median step time is marked slowest.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from stepcli.agent.config import LOG_FOLDER
from stepcli.agent.ondemand import CONTROL_FOLDER
from stepcli.errors import StepcliError
from stepcli.run.capture import Ping, _ping, _renewer, _withdraw, await_heartbeats
from stepcli.run.captureplan import fresh
from stepcli.run.controldir import read_processes, run_alive
from stepcli.run.liverun import LiveRun, find_run

SCHEMA = "stepcli.top"
_FIRST_LOOK_S = 15.0  # the longest top waits for the first fresh heartbeats


def snapshot(processes: list[dict[str, Any]], run_id: str, running: bool, now: float) -> dict[str, Any]:
    """Pure: the heartbeats in, one row per process and the slowest rank out."""
    rows: list[dict[str, Any]] = []
    for process in sorted(processes, key=_order):
        answers = process.get("responses")
        answers = list(answers.values()) if isinstance(answers, dict) else []
        pending = len([a for a in answers if isinstance(a, dict) and a.get("status") == "accepted"])
        ended = str(process.get("ended") or "")
        stalled = not ended and running and not fresh(process, now)
        rows.append(
            {
                "rank": process.get("rank"),
                "worker": str(process.get("worker") or f"{process.get('host')}_{process.get('pid')}"),
                "step": process.get("step"),
                "steps_per_s": process.get("steps_per_s"),
                "last_ms": process.get("last_ms"),
                "median_ms": process.get("median_ms"),
                "recording": bool(process.get("recording")),
                "pending": pending,
                "ended": ended,
                "no_step_for_s": round(now - _number(process.get("time")), 1) if stalled else None,
                "slowest": False,
            }
        )
    timed = [r for r in rows if isinstance(r["median_ms"], (int, float)) and not r["ended"]]
    if len(timed) > 1:
        max(timed, key=lambda r: float(r["median_ms"]))["slowest"] = True
    slowest = next((r["rank"] if r["rank"] is not None else r["worker"] for r in rows if r["slowest"]), None)
    return {"schema": SCHEMA, "run_id": run_id, "running": running, "ranks": rows, "slowest": slowest}


def _order(process: dict[str, Any]) -> tuple[Any, ...]:
    rank = process.get("rank")
    return (not isinstance(rank, int), rank if isinstance(rank, int) else 0, str(process.get("worker")))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _state(row: dict[str, Any]) -> str:
    if row["ended"]:
        return f"ended ({row['ended']})"
    if row["no_step_for_s"] is not None:
        return f"no step for {row['no_step_for_s']:.0f} s (hang?)"
    parts = (["recording"] if row["recording"] else []) + ([f"{row['pending']} pending"] if row["pending"] else [])
    return ", ".join(parts) or "stepping"


def render(document: dict[str, Any]) -> Any:
    """A rich table of the snapshot; the slowest rank in bold red."""
    from rich.table import Table

    status = "running" if document["running"] else "finished"
    table = Table(title=f"stepcli top: run {document['run_id']} ({status})", title_justify="left")
    for name in ("rank", "step", "steps/s", "last ms", "median ms", "windows / state", ""):
        table.add_column(name, justify="left" if name in ("rank", "windows / state", "") else "right")
    for row in document["ranks"]:
        table.add_row(
            row["worker"],
            str(row["step"]),
            _fmt(row["steps_per_s"], ".1f"),
            _fmt(row["last_ms"], ".1f"),
            _fmt(row["median_ms"], ".1f"),
            _state(row),
            "slowest" if row["slowest"] else "",
            style="bold red" if row["slowest"] else None,
        )
    return table


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _finished_run(target: str) -> dict[str, Any]:
    """The last heartbeats of the newest run in folder TARGET that is not running; StepcliError if none."""
    path = Path(target)
    controls = sorted(path.joinpath(LOG_FOLDER).glob(f"*/{CONTROL_FOLDER}")) if path.is_dir() else []
    if not controls:
        raise StepcliError(f"{target}: not a stepcli run folder (no {LOG_FOLDER}/ run inside)")
    control = max(controls, key=lambda folder: folder.stat().st_mtime)
    processes = read_processes(str(control))
    return snapshot(processes, control.parent.name, False, time.time())


def top_main(target: str, *, once: bool, as_json: bool, interval: float = 1.0) -> int:
    """Exit 0 (a snapshot or a live view until Ctrl-C; a finished run is said so); 2 TARGET is not a run."""
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
        if once or as_json:
            _print(snapshot(processes, run.run_id, run_alive(run.folder), time.time()), as_json)
            return 0
        _live(run, renew, interval)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _withdraw(run, ping, None)


def _live(run: LiveRun, renew: Any, interval: float) -> None:
    from rich.live import Live

    with Live(render(_now(run)), auto_refresh=False) as live:
        while True:
            document = _now(run)
            live.update(render(document), refresh=True)
            if not document["running"]:
                return
            renew()
            time.sleep(interval)


def _now(run: LiveRun) -> dict[str, Any]:
    return snapshot(read_processes(run.folder), run.run_id, run_alive(run.folder), time.time())


def _print(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(document, indent=2))
        return
    from rich.console import Console

    from stepcli.pipeconsole import pipe_console

    console = pipe_console(width=max(100, Console().width))  # on a pipe: no trailing spaces (the title's)
    console.print(render(document))
    if not document["running"]:
        console.print(f"run {document['run_id']} has finished")


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)
