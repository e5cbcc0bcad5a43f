"""`stepcli capture`: ask every stepping process of a running `stepcli run` for one window at the
same steps.

The request goes through the run's private control folder (see stepcli/agent/ondemand.py). The
processes write their heartbeat only when somebody listens, so capture first pings them (a "ping" in
requests.json, renewed while it waits) and waits for a fresh heartbeat from every process that has
not ended: a process that does not answer within a few of its poll intervals is not stepping
(paused, hung or killed). From the fresh heartbeats it names a first global step every rank can
still meet (stepcli/run/live/captureplan.py), writes the request, and waits for each process to
answer with a saved trace or a reason. A process already past those steps says so: then the request
is withdrawn (processes that accepted it drop its window) and a new one placed further ahead, a few
times at most. Its ping and request are withdrawn when it returns, however it returns: a window
nobody waits for any more is dropped by the processes, never left recording.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepcli.agent.ondemand import FINAL, PING_LEASE_S, POLL_INTERVAL_S
from stepcli.errors import EXIT_NOTHING_MEASURED
from stepcli.fmt import say as _say
from stepcli.fmt import size
from stepcli.run.controldir import (
    locked,
    read_control,
    read_processes,
    run_alive,
    still_wanted,
    write_requests,
)
from stepcli.run.live.captureplan import (
    MARGIN_S,
    CaptureRequest,
    fresh,
    patience,
    plan_request,
    step_time,
)
from stepcli.run.live.liverun import LiveRun, find_run

SCHEMA = "stepcli.capture"
_TICK_S = 0.2
_RENEW_S = PING_LEASE_S / 3  # the ping is renewed well before the processes' lease on it lapses
# placements tried when the run is already past the steps asked for (each twice as far ahead)
_PLANS = 4


@dataclass(frozen=True)
class Ping:
    """This capture listening: while its lease runs, every process writes its heartbeat at each
    poll."""

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


# -- pings and requests
# ---------------------------------------------------------------------------------------
def _ping(run: LiveRun, ping: Ping) -> None:
    """Write or renew this capture's ping, dropping the pings of captures that died; not once the
    run has ended (its launcher removed run.json and requests.json). In the instant the run ends a
    write may still land after that removal: no process reads it any more, and this capture's
    `finally` takes it back."""
    with locked(run.folder) as fd:
        if not run_alive(run.folder):
            return
        requests, pings = read_control(run.folder, run.run_id)
        pings = [p for p in pings if p.get("id") != ping.id and still_wanted(p)]
        write_requests(fd, run.run_id, requests, [*pings, ping.to_dict()])


def _renewer(run: LiveRun, ping: Ping) -> Callable[[], None]:
    """A call to make while waiting: renews the ping every few seconds, before the processes' lease
    lapses."""
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
    """Still worth waiting for: a process that has not ended and may yet answer the ping (one that
    steps notices it within a poll interval plus a step, at the pace its last heartbeat gave), or
    answered but its pace is not known yet (it only began)."""
    if process.get("ended"):
        return False
    if heard(process, ping):
        return not process.get("steps_per_s") and now - ping.asked_at <= 2 * POLL_INTERVAL_S + 0.5
    return now - ping.asked_at <= patience(process)


def await_heartbeats(
    run: LiveRun, ping: Ping, timeout_at: float, renew: Callable[[], None]
) -> list[dict[str, Any]]:
    """The heartbeats once every process that has not ended answered the ping, or could have and did
    not."""
    while True:
        now = time.time()
        processes = read_processes(run.folder)
        if not any(_unheard(p, ping, now) for p in processes) or now >= timeout_at:
            return processes
        if not run_alive(run.folder):
            return processes
        renew()
        time.sleep(_TICK_S)


def _place(
    run: LiveRun, ping: Ping, wait: int, warmup: int, active: int, margin_s: float
) -> CaptureRequest:
    """Choose the steps from the freshest heartbeats and add the request to the file, under the
    lock."""
    with locked(run.folder) as fd:
        others, pings = read_control(run.folder, run.run_id)
        processes = read_processes(run.folder)
        request = plan_request(
            [p for p in processes if heard(p, ping)] or processes,
            others,
            run.schedule,
            wait,
            warmup,
            active,
            time.time(),
            margin_s,
        )
        if run_alive(run.folder):  # else the run ended: nothing brings the file back
            write_requests(
                fd, run.run_id, [*filter(still_wanted, others), request.to_dict()], pings
            )
    return request


def _withdraw(run: LiveRun, ping: Ping | None, request: CaptureRequest | None) -> None:
    """Take back this capture's ping and request: with none left the file goes, and the processes
    stop writing. A process that accepted the request drops its window (it no longer recording is
    what it costs the job)."""
    mine = {ping.id if ping is not None else "", request.id if request is not None else ""}
    try:
        with locked(run.folder) as fd:
            requests, pings = read_control(run.folder, run.run_id)
            kept = [r for r in requests if r.get("id") not in mine and still_wanted(r)]
            write_requests(
                fd,
                run.run_id,
                kept,
                [p for p in pings if p.get("id") not in mine and still_wanted(p)],
            )
    except OSError:
        pass  # the run ended and took its control files with it


# -- waiting for the answers
# -------------------------------------------------------------------------------------
def _label(process: dict[str, Any]) -> str:
    return str(process.get("worker") or f"{process.get('host')}_{process.get('pid')}")


def _order(process: dict[str, Any]) -> tuple[Any, ...]:
    rank, pid = process.get("rank"), process.get("pid")
    return (
        not isinstance(rank, int),
        rank if isinstance(rank, int) else 0,
        str(process.get("host")),
        pid if isinstance(pid, int) else 0,
    )


def _answer(process: dict[str, Any], request: CaptureRequest) -> dict[str, Any] | None:
    responses = process.get("responses")
    answer = responses.get(request.id) if isinstance(responses, dict) else None
    return answer if isinstance(answer, dict) else None


def too_late(processes: list[dict[str, Any]], request: CaptureRequest) -> bool:
    """Some process was already past the first step asked for, and none has saved a trace of it
    yet."""
    answers = [a for p in processes if (a := _answer(p, request)) is not None]
    return any(a.get("late") for a in answers) and not any(
        a.get("status") == "saved" for a in answers
    )


def wait_for_answers(
    run: LiveRun,
    request: CaptureRequest,
    timeout_at: float,
    renew: Callable[[], None] = lambda: None,
) -> tuple[list[dict[str, Any]], str]:
    """(the processes with their answer to `request`, why it stopped waiting when nothing final
    came)."""
    while True:
        now = time.time()
        processes = read_processes(run.folder)
        alive = run_alive(run.folder)
        if too_late(processes, request):
            return processes, "late"  # placed again, further ahead: no use waiting for the others
        waiting = []
        for process in processes:
            answer = _answer(process, request)
            status = answer.get("status") if answer is not None else None
            if status in FINAL or process.get("ended"):
                continue
            if status == "accepted":
                # Accepted: wait while it steps; its export can take a while, so be patient with a
                # silent one.
                if fresh(process, now, 10.0) or now - _time_of(process) <= max(10.0, 3 * MARGIN_S):
                    waiting.append(process)
            elif fresh(process, now):
                waiting.append(process)  # still stepping, has not seen the request yet
        answered = [p for p in processes if _answer(p, request) is not None]
        if answered and not waiting:
            return processes, ""
        if not alive:
            return read_processes(run.folder), "the run ended"
        if now >= timeout_at:
            return processes, "timeout"
        renew()
        time.sleep(_TICK_S)


def _outcome(
    processes: list[dict[str, Any]],
    request: CaptureRequest,
    stop: str,
    timeout: float,
    now: float,
    ping: Ping | None = None,
) -> dict[str, Any]:
    traces, missing, idle = [], [], []
    for process in sorted(processes, key=_order):
        answer = _answer(process, request)
        who = {
            "worker": _label(process),
            "rank": process.get("rank"),
            "host": process.get("host"),
            "pid": process.get("pid"),
        }
        if answer is not None and answer.get("status") == "saved":
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
        if answer is not None and answer.get("status") in ("refused", "not_recorded"):
            reason = str(answer.get("reason", answer["status"]))
        elif process.get("ended"):
            if answer is None:
                continue  # ended before the request: not part of the capture
            reason = f"the process exited ({process['ended']}) at step {process.get('step')}"
        elif answer is not None:
            reason = (
                f"stopped stepping at step {process.get('step')} "
                f"({now - _time_of(process, now):.0f} s without a step)"
            )
        elif fresh(process, now):
            reason = f"did not see the request within {timeout:g} s"
        # stopped stepping before the request: named only when others saved traces (else said once
        # below)
        else:
            if ping is None or heard(process, ping):
                reason = f"stopped stepping at step {process.get('step')} before the request"
            else:  # quiet since its last heartbeat, which may be much older than its last step
                reason = (
                    f"made no step since capture asked (last step reported: {process.get('step')})"
                )
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
    latest = max(processes, key=_time_of)
    if not any(fresh(p, now) for p in processes):
        if ping is not None and not any(heard(p, ping) for p in processes):
            # Quiet is normal until somebody asks: the last heartbeat may be much older than the
            # last step.
            top = max(int(p.get("step", 0)) for p in processes)
            return (
                f"the run stopped stepping: its last step (at least {top}) came before this "
                f"capture asked, {now - ping.asked_at:.0f} s ago"
            )
        idle = now - _time_of(latest, now)
        return (
            f"the run stopped stepping: its last step ({latest.get('step')}) was {idle:.0f} s ago"
        )
    details = "; ".join(f"{m['worker']}: {m['reason']}" for m in missing)
    return f"no process saved a trace within {timeout:g} s" + (f" ({details})" if details else "")


def _time_of(process: dict[str, Any], default: float = 0.0) -> float:
    """When the process last stepped (its heartbeat's time, less the time without a step it
    reports)."""
    value = process.get("time")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return default
    return step_time(process)


# -- the command
# --------------------------------------------------------------------------------------------------
def capture_main(
    target: str, *, wait: int, warmup: int, active: int, timeout: float, as_json: bool
) -> int:
    """Exit 0 traces saved; 2 (StepcliError) TARGET is not a running run; 3 nothing captured in
    time."""
    run = find_run(target)
    timeout_at = time.time() + timeout
    # SIGTERM (a scheduler) and SIGHUP (the terminal closed) end it through `finally`, which
    # withdraws the ping and the request.
    previous = {sig: signal.signal(sig, _terminate) for sig in _ENDING_SIGNALS}
    ping: Ping | None = None
    # the last is withdrawn by `finally` (each earlier one was, when replaced)
    placed: list[CaptureRequest] = []
    try:
        why = _await_a_step(run, timeout, timeout_at)
        if why:
            return _nothing(why, as_json)
        # Quiet is normal: ask every process for fresh heartbeats (their step and pace) before
        # choosing steps.
        ping = Ping(uuid.uuid4().hex[:12], time.time())
        _ping(run, ping)
        renew = _renewer(run, ping)
        await_heartbeats(run, ping, timeout_at, renew)
        processes, request, stop = _ask(
            run, ping, renew, timeout_at, (wait, warmup, active), as_json, placed
        )
        document = _outcome(processes, request, stop, timeout, time.time(), ping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ping is not None:
            _withdraw(run, ping, placed[-1] if placed else None)
    return _print(document, as_json)


def _ask(
    run: LiveRun,
    ping: Ping,
    renew: Callable[[], None],
    timeout_at: float,
    window: tuple[int, int, int],
    as_json: bool,
    placed: list[CaptureRequest],
) -> tuple[list[dict[str, Any]], CaptureRequest, str]:
    """Place the request and wait for the answers; when the run was already past its steps, withdraw
    it (those that accepted drop the window) and place a new one twice as far ahead, a few times at
    most."""
    wait, warmup, active = window
    late = ""
    for attempt in range(_PLANS):
        request = _place(run, ping, wait, warmup, active, MARGIN_S * 2**attempt)
        placed.append(request)
        if not as_json:
            _say(f"asked run {run.run_id} to record {_describe(request)}{late}")
        processes, stop = wait_for_answers(run, request, timeout_at, renew)
        if stop != "late":
            return processes, request, stop
        if attempt == _PLANS - 1 or time.time() >= timeout_at:
            break
        _withdraw(run, None, request)
        late = f" (the run was already past step {request.first_step})"
    return processes, request, ""


def _await_a_step(run: LiveRun, timeout: float, timeout_at: float) -> str:
    """Wait until some process of the run has made a step; why nothing can be captured when none
    will."""
    processes = read_processes(run.folder)
    while not any(not p.get("ended") for p in processes) and time.time() < timeout_at:
        if not run_alive(run.folder):
            break
        time.sleep(_TICK_S)  # started, but no process has made a step yet
        processes = read_processes(run.folder)
    if any(not p.get("ended") for p in processes):
        return ""
    if not run_alive(run.folder):
        return "the run ended"
    if processes:
        return "every process that stepped has exited"
    return f"the run made no step within {timeout:g} s"


def _describe(request: CaptureRequest) -> str:
    first, last = request.first_step, request.last_step
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return steps + (f" (warming up from step {request.open_at})" if request.open_at < first else "")


_ENDING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _nothing(why: str, as_json: bool) -> int:
    if as_json:
        print(
            json.dumps(
                {
                    "schema": SCHEMA,
                    "request": None,
                    "traces": [],
                    "not_captured": [],
                    "reason": why,
                },
                indent=2,
            )
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
            print(
                f"{trace['worker']:<{width}}  {steps}  {trace['path']}  "
                f"{size(trace['bytes'])}{extra}"
            )
        if document["traces"]:  # with none, the one line below says why
            for miss in document["not_captured"]:
                _say(f"{miss['worker']}: no trace: {miss['reason']}")
    if not document["traces"]:
        _say(f"nothing captured: {document['reason']}")
        return EXIT_NOTHING_MEASURED
    return 0
