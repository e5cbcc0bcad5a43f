"""`stepcli capture`: ask every stepping process of a running `stepcli run` for one window at the same steps.

The request goes through the run's private control folder (see stepcli/agent/ondemand.py). The processes write
their heartbeat only when somebody listens, so capture first pings them (a "ping" in requests.json, renewed while
it waits) and waits for a fresh heartbeat from every process that has not ended: a process that does not answer
within a few of its poll intervals is not stepping (paused, hung or killed). From the fresh heartbeats it names a
first global step every rank can still meet (the highest step any rank is at, plus the steps about 1.5 s of polling
lets go by, plus `--wait`), writes the request, and waits for each process to answer with a saved trace or a
reason. Its ping and request are withdrawn when it returns, however it returns.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stepcli.agent.config import CONFIG_ENV, LOG_FOLDER, atomic_write_json
from stepcli.agent.ondemand import (
    CONTROL_FOLDER,
    FINAL,
    LOCK_FILE,
    PING_LEASE_S,
    POLL_INTERVAL_S,
    PROC_PREFIX,
    REQUESTS_FILE,
    RUN_FILE,
    control_dir,
)
from stepcli.agent.schedule import NONE, Schedule
from stepcli.errors import EXIT_NOTHING_MEASURED, StepcliError
from stepcli.fmt import say as _say
from stepcli.fmt import size

SCHEMA = "stepcli.capture"
_TICK_S = 0.2
_MARGIN_S = POLL_INTERVAL_S + 0.5  # every process notices a request within one poll interval
_RENEW_S = PING_LEASE_S / 3  # the ping is renewed well before the processes' lease on it lapses


@dataclass(frozen=True)
class LiveRun:
    run_id: str
    folder: str  # the control folder
    schedule: Schedule | None  # None with --on-demand


@dataclass(frozen=True)
class Ping:
    """This capture listening: while its lease runs, every process writes its heartbeat at each poll."""

    id: str
    asked_at: float  # this host's clock, when the ping was first written

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "lease_s": PING_LEASE_S,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "renewed_at": time.time(),
        }  # a new value each time: the file changes, the processes' lease restarts


@dataclass(frozen=True)
class Request:
    id: str
    open_at: int
    first_step: int
    last_step: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "open_at": self.open_at,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created_at": time.time(),
        }


# -- finding the run ------------------------------------------------------------------------------------------
def find_run(target: str) -> LiveRun:
    """The running `stepcli run` that TARGET (an -o folder or a pid) names; StepcliError (exit 2) otherwise."""
    path = Path(target)
    if path.is_dir():
        folders = sorted(path.joinpath(LOG_FOLDER).glob(f"*/{CONTROL_FOLDER}"))
    elif target.isdigit():
        out_dir, run_id = _run_of_pid(int(target))
        folders = [Path(control_dir(out_dir, run_id))]
    else:
        raise StepcliError(f"{target}: no such folder or process id")
    live = [(document, folder) for folder in folders if (document := _live_run_document(folder)) is not None]
    if not live:
        raise StepcliError(f"{target}: no running stepcli run writes to this folder")
    document, folder = max(live, key=lambda item: item[0].get("started_at", 0))
    if os.stat(folder).st_uid != os.getuid():
        raise StepcliError(f"{target}: the run belongs to another user; only its owner can capture")
    schedule = None if document.get("on_demand") else Schedule(**document["schedule"])
    return LiveRun(run_id=str(document["run_id"]), folder=str(folder), schedule=schedule)


def _live_run_document(folder: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(folder.joinpath(RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the run ended (its launcher removed run.json) or never started
    if not isinstance(document, dict) or "run_id" not in document:
        return None
    if document.get("host") == socket.gethostname():
        import psutil

        if not psutil.pid_exists(int(document.get("launcher_pid", 0))):
            return None  # the launcher was killed before it could clean up
    return document


def _run_of_pid(pid: int) -> tuple[str, str]:
    """(out_dir, run_id) of the run a process belongs to: the launcher, a rank, or torchrun's agent."""
    import psutil

    try:
        process = psutil.Process(pid)
        family = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        raise StepcliError(f"{pid}: no such process") from None
    except psutil.AccessDenied:
        raise StepcliError(f"{pid}: the process belongs to another user; only its owner can capture") from None
    for member in family:
        try:
            text = member.environ().get(CONFIG_ENV)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if text:
            try:
                config = json.loads(text)
                return str(config["out_dir"]), str(config["run_id"])
            except (ValueError, KeyError, TypeError):
                continue
    raise StepcliError(f"{pid}: not a process of a stepcli run")


# -- the control folder ----------------------------------------------------------------------------------------
def read_processes(folder: str) -> list[dict[str, Any]]:
    """Every process's heartbeat and answers (files written atomically: a half file is never seen)."""
    processes: list[dict[str, Any]] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return processes
    for name in names:
        if not (name.startswith(PROC_PREFIX) and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(document, dict):
            processes.append(document)
    return processes


@contextmanager
def _locked(folder: str) -> Iterator[None]:
    """One capture at a time edits requests.json (two at once would pick overlapping steps)."""
    import fcntl

    fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_requests(folder: str, run_id: str) -> list[dict[str, Any]]:
    return _read_control(folder, run_id)[0]


def _read_control(folder: str, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the requests, the pings) in requests.json."""
    try:
        with open(os.path.join(folder, REQUESTS_FILE), encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return [], []
    if not isinstance(document, dict) or document.get("run_id") != run_id:
        return [], []
    return _entries(document.get("requests")), _entries(document.get("pings"))


def _entries(value: Any) -> list[dict[str, Any]]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _still_wanted(request: dict[str, Any]) -> bool:
    """False for the request of a capture on this host that died without withdrawing it (dropped when the file
    is next written; its window is still avoided when placing a new one, as processes may be recording it)."""
    if request.get("host") != socket.gethostname():
        return True
    import psutil

    return bool(psutil.pid_exists(int(request.get("pid", 0))))


def _write_requests(folder: str, run_id: str, requests: list[dict[str, Any]], pings: list[dict[str, Any]]) -> None:
    path = os.path.join(folder, REQUESTS_FILE)
    if requests or pings:
        atomic_write_json(path, {"run_id": run_id, "requests": requests, "pings": pings})
    else:
        try:
            os.unlink(path)  # nobody asks: the processes' poll finds no file, the cheapest answer
        except FileNotFoundError:
            pass


def _ping(run: LiveRun, ping: Ping) -> None:
    """Write or renew this capture's ping, dropping the pings of captures that died; not once the run has ended
    (its launcher removed run.json and requests.json). In the instant the run ends a write may still land after
    that removal: no process reads it any more, and this capture's `finally` takes it back."""
    with _locked(run.folder):
        if not os.path.exists(os.path.join(run.folder, RUN_FILE)):
            return
        requests, pings = _read_control(run.folder, run.run_id)
        pings = [p for p in pings if p.get("id") != ping.id and _still_wanted(p)]
        _write_requests(run.folder, run.run_id, requests, [*pings, ping.to_dict()])


def _renewer(run: LiveRun, ping: Ping) -> Callable[[], None]:
    """A call to make while waiting: renews the ping every few seconds, before the processes' lease lapses."""
    renewed = [time.time()]

    def renew() -> None:
        if time.time() - renewed[0] >= _RENEW_S:
            renewed[0] = time.time()
            try:
                _ping(run, ping)
            except OSError:
                pass  # a shared file system's hiccup: the lease leaves time for the next try

    return renew


def heard(process: dict[str, Any], ping: Ping) -> bool:
    """The process wrote this heartbeat after it read the ping (no clock compared across hosts)."""
    pings = process.get("pings")
    return isinstance(pings, list) and ping.id in pings


def _unheard(process: dict[str, Any], ping: Ping, now: float) -> bool:
    """Still worth waiting for: a process that has not ended and may yet answer the ping (one that steps
    notices it within a poll interval plus a step, at the pace its last heartbeat gave), or answered but its pace
    is not known yet (it only began)."""
    if process.get("ended"):
        return False
    if heard(process, ping):
        return not process.get("steps_per_s") and now - ping.asked_at <= 2 * POLL_INTERVAL_S + 0.5
    return now - ping.asked_at <= _patience(process)


def await_heartbeats(run: LiveRun, ping: Ping, timeout_at: float, renew: Callable[[], None]) -> list[dict[str, Any]]:
    """The heartbeats once every process that has not ended answered the ping, or could have and did not."""
    while True:
        now = time.time()
        processes = read_processes(run.folder)
        if not any(_unheard(p, ping, now) for p in processes) or now >= timeout_at:
            return processes
        if not os.path.exists(os.path.join(run.folder, RUN_FILE)):
            return processes
        renew()
        time.sleep(_TICK_S)


# -- choosing the steps --------------------------------------------------------------------------------------
def _patience(process: dict[str, Any], slack_steps: float = 3.0) -> float:
    """Seconds a stepping process may take to write a heartbeat: a poll interval plus a few of its steps."""
    rate = float(process.get("steps_per_s") or 0.0)
    return POLL_INTERVAL_S + 1.0 + (slack_steps / rate if rate > 0 else 3.0)


def _fresh(process: dict[str, Any], now: float, slack_steps: float = 3.0) -> bool:
    """Still stepping: its heartbeat is no older than a poll interval plus a few of its steps (while a capture
    listens, a stepping process writes its heartbeat at every poll)."""
    return now - float(process.get("time", 0.0)) <= _patience(process, slack_steps)


def plan_request(
    processes: list[dict[str, Any]],
    others: list[dict[str, Any]],
    schedule: Schedule | None,
    wait: int,
    warmup: int,
    active: int,
    now: float,
) -> Request:
    """The first step every rank can still meet, clear of scheduled windows and of other captures' windows."""
    live = [p for p in processes if not p.get("ended")] or processes
    top, rate = 0.0, 0.0
    for process in live:
        speed = float(process.get("steps_per_s") or 0.0)
        age = max(0.0, min(now - float(process.get("time", now)), _MARGIN_S)) if _fresh(process, now) else 0.0
        top = max(top, int(process.get("step", 0)) + speed * age)
        rate = max(rate, speed)
    open_at = math.ceil(top) + math.ceil(rate * _MARGIN_S) + 2 + wait

    def busy(step: int) -> bool:
        if schedule is not None and schedule.action(step) != NONE:
            return True
        return any(int(r["open_at"]) - 1 <= step <= int(r["last_step"]) + 1 for r in others)

    for _ in range(10_000):
        last = open_at + warmup + active - 1
        clashes = [s for s in range(open_at - 1, last + 2) if busy(s)]
        if not clashes:
            return Request(uuid.uuid4().hex[:12], open_at, open_at + warmup, last)
        open_at = max(clashes) + 2
    raise StepcliError(f"the run's schedule leaves no room for a window of {warmup + active} steps")


# -- waiting for the answers -------------------------------------------------------------------------------------
def _label(process: dict[str, Any]) -> str:
    return str(process.get("worker") or f"{process.get('host')}_{process.get('pid')}")


def _order(process: dict[str, Any]) -> tuple[Any, ...]:
    rank = process.get("rank")
    return (rank is None, rank if rank is not None else 0, str(process.get("host")), int(process.get("pid", 0)))


def wait_for_answers(
    run: LiveRun,
    request: Request,
    timeout_at: float,
    renew: Callable[[], None] = lambda: None,
) -> tuple[list[dict[str, Any]], str]:
    """(the processes with their answer to `request`, why it stopped waiting when nothing final came)."""
    while True:
        now = time.time()
        processes = read_processes(run.folder)
        run_alive = os.path.exists(os.path.join(run.folder, RUN_FILE))
        waiting = []
        for process in processes:
            answer = process.get("responses", {}).get(request.id)
            status = answer.get("status") if isinstance(answer, dict) else None
            if status in FINAL or process.get("ended"):
                continue
            if status == "accepted":
                # Accepted: wait while it steps; its export can take a while, so be patient with a silent one.
                if now - float(process.get("time", 0.0)) <= max(10.0, 3 * _MARGIN_S) or _fresh(process, now, 10.0):
                    waiting.append(process)
            elif _fresh(process, now):
                waiting.append(process)  # still stepping, has not seen the request yet
        answered = [p for p in processes if isinstance(p.get("responses", {}).get(request.id), dict)]
        if answered and not waiting:
            return processes, ""
        if not run_alive:
            return read_processes(run.folder), "the run ended"
        if now >= timeout_at:
            return processes, "timeout"
        renew()
        time.sleep(_TICK_S)


def _outcome(
    processes: list[dict[str, Any]],
    request: Request,
    stop: str,
    timeout: float,
    now: float,
    ping: Ping | None = None,
) -> dict[str, Any]:
    traces, missing, idle = [], [], []
    for process in sorted(processes, key=_order):
        answer = process.get("responses", {}).get(request.id)
        who = {
            "worker": _label(process),
            "rank": process.get("rank"),
            "host": process.get("host"),
            "pid": process.get("pid"),
        }
        if isinstance(answer, dict) and answer.get("status") == "saved":
            traces.append(
                who
                | {
                    "first_step": answer["first_step"],
                    "last_step": answer["last_step"],
                    "path": answer["trace"],
                    "bytes": answer["bytes"],
                    "complete": answer.get("complete", True),
                }
                | ({"note": answer["note"]} if answer.get("note") else {})
            )
            continue
        if isinstance(answer, dict) and answer.get("status") in ("refused", "not_recorded"):
            reason = str(answer.get("reason", answer["status"]))
        elif process.get("ended"):
            if not isinstance(answer, dict):
                continue  # ended before the request: not part of the capture
            reason = f"the process exited ({process['ended']}) at step {process.get('step')}"
        elif isinstance(answer, dict):
            reason = f"stopped stepping at step {process.get('step')} ({now - float(process.get('time', now)):.0f} s without a step)"
        elif _fresh(process, now):
            reason = f"did not see the request within {timeout:g} s"
        else:  # stopped stepping before the request: named only when others saved traces (else said once below)
            if ping is None or heard(process, ping):
                reason = f"stopped stepping at step {process.get('step')} before the request"
            else:  # quiet since its last heartbeat, which may be much older than its last step
                reason = f"made no step since capture asked (last step reported: {process.get('step')})"
            idle.append(who | {"reason": reason})
            continue
        missing.append(who | {"reason": reason})
    if traces:
        missing += idle
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "request": {
            "id": request.id,
            "first_step": request.first_step,
            "last_step": request.last_step,
            "warmup_from": request.open_at,
        },
        "traces": traces,
        "not_captured": missing,
    }
    if not traces:
        document["reason"] = _why_nothing(processes, missing, stop, timeout, now, ping)
    return document


def _why_nothing(
    processes: list[dict[str, Any]],
    missing: list[dict[str, Any]],
    stop: str,
    timeout: float,
    now: float,
    ping: Ping | None = None,
) -> str:
    if missing and stop != "timeout":
        return "; ".join(f"{m['worker']}: {m['reason']}" for m in missing)
    if stop == "the run ended":
        return "the run ended before the window was recorded"
    if not processes:
        return f"the run made no step within {timeout:g} s"
    latest = max(processes, key=lambda p: float(p.get("time", 0.0)))
    if not any(_fresh(p, now) for p in processes):
        if ping is not None and not any(heard(p, ping) for p in processes):
            # Quiet is normal until somebody asks: the last heartbeat may be much older than the last step.
            top = max(int(p.get("step", 0)) for p in processes)
            return (
                f"the run stopped stepping: its last step (at least {top}) came before this capture asked, "
                f"{now - ping.asked_at:.0f} s ago"
            )
        idle = now - float(latest.get("time", now))
        return f"the run stopped stepping: its last step ({latest.get('step')}) was {idle:.0f} s ago"
    details = "; ".join(f"{m['worker']}: {m['reason']}" for m in missing)
    return f"no process saved a trace within {timeout:g} s" + (f" ({details})" if details else "")


# -- the command ---------------------------------------------------------------------------------------------------
def capture_main(target: str, *, wait: int, warmup: int, active: int, timeout: float, as_json: bool) -> int:
    """Exit 0 traces saved; 2 (StepcliError) TARGET is not a running run; 3 nothing captured in time."""
    run = find_run(target)
    timeout_at = time.time() + timeout
    # SIGTERM (a scheduler) and SIGHUP (the terminal closed) end it through `finally`, which withdraws the ping
    # and the request.
    previous = {sig: signal.signal(sig, _terminate) for sig in _ENDING_SIGNALS}
    ping: Ping | None = None
    request: Request | None = None
    try:
        processes = read_processes(run.folder)
        while not any(not p.get("ended") for p in processes) and time.time() < timeout_at:
            if not os.path.exists(os.path.join(run.folder, RUN_FILE)):
                break
            time.sleep(_TICK_S)  # started, but no process has made a step yet
            processes = read_processes(run.folder)
        if not any(not p.get("ended") for p in processes):
            if not os.path.exists(os.path.join(run.folder, RUN_FILE)):
                why = "the run ended"
            elif processes:
                why = "every process that stepped has exited"
            else:
                why = f"the run made no step within {timeout:g} s"
            return _nothing(why, as_json)
        # Quiet is normal: ask every process for fresh heartbeats (their step and pace) before choosing steps.
        ping = Ping(uuid.uuid4().hex[:12], time.time())
        _ping(run, ping)
        renew = _renewer(run, ping)
        processes = await_heartbeats(run, ping, timeout_at, renew)
        with _locked(run.folder):
            others, pings = _read_control(run.folder, run.run_id)
            processes = read_processes(run.folder)
            request = plan_request(
                [p for p in processes if heard(p, ping)] or processes,
                others,
                run.schedule,
                wait,
                warmup,
                active,
                time.time(),
            )
            if os.path.exists(os.path.join(run.folder, RUN_FILE)):  # else the run ended: nothing brings the file back
                _write_requests(run.folder, run.run_id, [*filter(_still_wanted, others), request.to_dict()], pings)
        if not as_json:
            steps = (
                f"step {request.first_step}"
                if request.first_step == request.last_step
                else f"steps {request.first_step}-{request.last_step}"
            )
            warming = f" (warming up from step {request.open_at})" if request.open_at < request.first_step else ""
            _say(f"asked run {run.run_id} to record {steps}{warming}")
        processes, stop = wait_for_answers(run, request, timeout_at, renew)
        document = _outcome(processes, request, stop, timeout, time.time(), ping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ping is not None:
            _withdraw(run, ping, request)
    return _print(document, as_json)


_ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _withdraw(run: LiveRun, ping: Ping, request: Request | None) -> None:
    """Take back this capture's ping and request: with none left the file goes, and the processes stop writing."""
    mine = {ping.id, request.id if request is not None else ""}
    try:
        with _locked(run.folder):
            requests, pings = _read_control(run.folder, run.run_id)
            kept = [r for r in requests if r.get("id") not in mine and _still_wanted(r)]
            _write_requests(
                run.folder, run.run_id, kept, [p for p in pings if p.get("id") not in mine and _still_wanted(p)]
            )
    except OSError:
        pass  # the run ended and took its control files with it


def _nothing(why: str, as_json: bool) -> int:
    if as_json:
        print(
            json.dumps({"schema": SCHEMA, "request": None, "traces": [], "not_captured": [], "reason": why}, indent=2)
        )
    _say(f"nothing captured: {why}")
    return EXIT_NOTHING_MEASURED


def _print(document: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(document, indent=2))
    else:
        width = max((len(t["worker"]) for t in document["traces"]), default=0)
        for trace in document["traces"]:
            first, last = trace["first_step"], trace["last_step"]
            steps = f"step {first}" if first == last else f"steps {first}-{last}"
            extra = "" if trace["complete"] else f"  ({trace.get('note') or 'incomplete'})"
            print(f"{trace['worker']:<{width}}  {steps}  {trace['path']}  {size(trace['bytes'])}{extra}")
        if document["traces"]:  # with none, the one line below says why
            for miss in document["not_captured"]:
                _say(f"{miss['worker']}: no trace: {miss['reason']}")
    if not document["traces"]:
        _say(f"nothing captured: {document['reason']}")
        return EXIT_NOTHING_MEASURED
    return 0
