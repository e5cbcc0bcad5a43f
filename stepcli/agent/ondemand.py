"""On-demand windows: `stepcli capture` asks, every stepping process of the run records the same global steps.

Runs inside the target: standard library only. The protocol lives in the run's private control folder,
`<out>/.stepcli/<run_id>/control/` (created 0700 by the launcher, so only the run's owner can ask):

  run.json              the launcher's: this run is alive (removed when it ends, with requests.json)
  requests.json         capture's: {"run_id", "requests": [{"id", "open_at", "first_step", "last_step"}],
                        "pings": [{"id", "lease_s"}]}; absent while nobody asks
  proc.<host>.<pid>.json  each stepping process's heartbeat (step, time, rate, the pings it heard, how many times
                        it was written) and its answer to each request

Each process looks at the control folder at most once a second, from a step boundary (the tracker compares the
clock value it already reads with a deadline: no file system call per step). Looking is one failed open() while
nobody asks; the file is read only when its inode, size or times changed. The heartbeat is written only when
somebody listens, so a job of a thousand ranks does not rewrite a thousand files a second on a shared file system
all day: at the first step and once more at the next poll, with the pace (capture finds the process and knows how
long it may take to hear a ping), while a capture's ping is heard (every poll: fresh steps and pace; a ping lapses
`lease_s` after the file last changed, so a capture killed with SIGKILL does not leave the processes writing),
when an answer changes, and at exit (`ended`). A request names global steps, so every rank
records the same `ProfilerStep#N`s; a rank already past them refuses instead of recording others. Requests carry
the run id and live in a folder named by it, so a later run into the same `-o` never obeys one.
"""

from __future__ import annotations

import json
import os
import time

from .config import LOG_FOLDER, atomic_write_json
from .schedule import NONE, RECORD, RECORD_AND_SAVE, WARMUP, Schedule
from .tracker import FOREIGN

TYPE_CHECKING = False  # typing is not imported at run time: this module loads in every profiled process
if TYPE_CHECKING:
    from typing import Any, Protocol

    from .config import AgentConfig
    from .recorder import Recorder
    from .tracker import StepTracker

    class Agent(Protocol):
        """What on-demand capture needs from the process's agent (stepcli.agent.runtime.Agent provides it).
        Declared here so this module does not refer back to runtime, which imports it: no import circle."""

        config: AgentConfig
        enabled: bool
        foreign: set[int]
        pid: int
        recorder: Recorder | None
        tracker: StepTracker


CONTROL_FOLDER = "control"
RUN_FILE = "run.json"
REQUESTS_FILE = "requests.json"
LOCK_FILE = "capture.lock"
PROC_PREFIX = "proc."
POLL_INTERVAL_S = 1.0
PING_LEASE_S = 10.0  # how long a process keeps listening after requests.json last changed (capture renews it)
MAX_IO_FAILURES = 30  # consecutive polls that could not read or write the control folder
FINAL = ("saved", "refused", "not_recorded")


def control_dir(out_dir: str, run_id: str) -> str:
    return os.path.join(out_dir, LOG_FOLDER, run_id, CONTROL_FOLDER)


def open_control(out_dir: str, run_id: str, document: dict[str, Any]) -> str:
    """The launcher's side: create the run's private control folder and say the run is alive."""
    folder = control_dir(out_dir, run_id)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    os.mkdir(folder, 0o700)
    os.chmod(folder, 0o700)  # whatever the umask: nobody else may write requests
    atomic_write_json(os.path.join(folder, RUN_FILE), document)
    return folder


def close_control(out_dir: str, run_id: str) -> None:
    """The run ended: no request may outlive it. The processes' answers stay for a capture still reading."""
    folder = control_dir(out_dir, run_id)
    for name in (RUN_FILE, REQUESTS_FILE, LOCK_FILE):
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


class WindowSchedule:
    """The run's schedule (None with `--on-demand`) plus the windows asked for on demand.

    Answers `action`, `starts_cycle` and `next_profiled_step` like `Schedule`, so the recorder drives
    both kinds of window the same way.
    """

    def __init__(self, base: Schedule | None) -> None:
        self.base = base
        self.windows: list[tuple[int, int, int]] = []  # (first warmup step, first recorded step, last step)

    def add(self, open_at: int, first: int, last: int) -> None:
        self.windows.append((open_at, first, last))

    def forget_before(self, step: int) -> None:
        self.windows = [w for w in self.windows if w[2] >= step]

    def action(self, step: int) -> int:
        for open_at, first, last in self.windows:
            if open_at <= step <= last:
                return WARMUP if step < first else RECORD_AND_SAVE if step == last else RECORD
        return self.base.action(step) if self.base is not None else NONE

    def starts_cycle(self, step: int) -> bool:
        if self.action(step) == NONE:
            return False
        return step == 0 or self.action(step - 1) in (NONE, RECORD_AND_SAVE)

    def next_profiled_step(self, step: int) -> int | None:
        candidates = [max(step, open_at) for open_at, _, last in self.windows if last >= step]
        if self.base is not None:
            scheduled = self.base.next_profiled_step(step)
            if scheduled is not None:
                candidates.append(scheduled)
        return min(candidates, default=None)

    def first_busy(self, start: int, end: int) -> int | None:
        """The first step in [start, end] some window (scheduled or on demand) already uses."""
        return next((s for s in range(start, end + 1) if self.action(s) != NONE), None)


class OnDemand:
    """One process's side of the protocol: heartbeat, accept or refuse requests, report saved traces."""

    def __init__(self, agent: Agent) -> None:
        import socket

        config = agent.config
        self.agent = agent
        self.run_id = config.run_id
        self.folder = control_dir(config.out_dir, config.run_id)
        self.requests_path = os.path.join(self.folder, REQUESTS_FILE)
        self.host = socket.gethostname()
        self.proc_path = os.path.join(self.folder, f"{PROC_PREFIX}{self.host}.{agent.pid}.json")
        self.schedule = WindowSchedule(None if config.on_demand else config.schedule)
        self.responses: dict[str, dict[str, Any]] = {}
        self.pending: dict[str, tuple[int, int, int, int]] = {}  # id -> (first, last step, windows, notes before)
        self._written_step = -1
        self._dirty = True  # the first poll (the first step) writes the heartbeat: capture can find the process
        # ... and the second (`_writes < 2`) writes its pace: how long capture may wait for it to hear a ping
        self._mark: tuple[int, float] | None = None  # (step, time) of the last poll, for the step rate
        self._rate = 0.0
        self._seen: tuple[int, int, int, int] | None = None  # requests.json as last read: inode, size, mtime, ctime
        self._pings: list[str] = []  # the ids of the captures listening, as last read
        self._listen_until = 0.0  # time.monotonic() until which the heartbeat is written every poll
        self._writes = 0
        self._ended = ""
        self._failures = 0
        self.active = False
        if agent.recorder is not None:
            agent.recorder.schedule = self.schedule  # type: ignore[assignment]
        if os.path.isdir(self.folder):  # a run started by an older launcher has none: nobody can ask
            agent.tracker.set_poller(self.poll, POLL_INTERVAL_S)
            self.active = True

    # -- called by the tracker (at most once a second) and by the agent ----------------------------------------
    def poll(self, step: int) -> None:
        """At a step boundary: read requests (only when they changed) and write the heartbeat if anybody listens."""
        try:
            listening = self._read_requests(step)
            self._settle(step)
            self._pace(step)
            if self._dirty or ((listening or self._writes < 2) and step != self._written_step):
                self._write(step)
            self._failures = 0
        except OSError as exc:  # a shared file system's hiccup: try again next second, but not forever
            self._failures += 1
            if self._failures >= MAX_IO_FAILURES:
                self._give_up(exc)
        except Exception as exc:
            self._give_up(exc)

    def window_saved(self) -> None:
        """A window was saved (or dropped): answer at once, not at the next poll."""
        if not self.pending:
            return
        try:
            step = self.agent.tracker.global_step
            self._settle(step)
            if self._dirty:
                self._write(step)
        except OSError:
            pass  # still dirty: the next poll writes it
        except Exception as exc:
            self._give_up(exc)

    def finish(self, reason: str) -> None:
        """The process exits (after its open window was saved): answer every pending request, say we ended."""
        if not self.active:
            return
        try:
            step = self.agent.tracker.global_step
            self._settle(step)
            for rid in list(self.pending):
                self._answer(rid, "not_recorded", reason=f"the process exited ({reason}) at step {step}")
            self._ended = reason
            self._write(step)
        except Exception:
            pass

    def _give_up(self, exc: BaseException) -> None:
        self.agent.tracker.set_poller(None)
        self.active = False
        from .output import say

        say(f"on-demand capture disabled in this process: {type(exc).__name__}: {exc}")

    # -- requests ---------------------------------------------------------------------------------------------
    def _read_requests(self, step: int) -> bool:
        """Whether a capture listens. open() rather than stat(): on NFS, open revalidates the file (close-to-open)."""
        try:
            handle = open(self.requests_path, encoding="utf-8")
        except FileNotFoundError:  # the usual case: nobody is asking
            self._seen, self._pings, self._listen_until = None, [], 0.0
            return False
        with handle:
            stat = os.fstat(handle.fileno())
            seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
            if seen == self._seen:  # unchanged since the last poll: nothing new to read
                return time.monotonic() < self._listen_until
            if stat.st_uid != os.getuid():
                self._seen = seen
                return False  # only the run's owner may ask
            try:
                document = json.load(handle)
            except ValueError:
                self._seen = seen  # malformed as written: read it again only once it changes
                return False
            # Marked as read only now: after a failed read (OSError, an NFS hiccup) the next poll reads it again.
            self._seen = seen
        if not isinstance(document, dict) or document.get("run_id") != self.run_id:
            return False
        self._listen(document.get("pings"))
        for request in document.get("requests", []):
            if isinstance(request, dict) and request.get("id") not in self.responses:
                try:
                    self._consider(request, step)
                except (KeyError, TypeError, ValueError):
                    continue  # not a request this version understands
        return time.monotonic() < self._listen_until

    def _listen(self, pings: Any) -> None:
        """Captures waiting for fresh heartbeats: listen for their lease from now (this host's clock, not theirs)."""
        pings = [p for p in pings if isinstance(p, dict) and "id" in p] if isinstance(pings, list) else []
        ids = [str(p["id"]) for p in pings]
        if set(ids) - set(self._pings):
            self._dirty = True  # a new capture listens: tell it at once that this process was heard
        self._pings = ids
        leases = []
        for ping in pings:
            try:
                leases.append(min(max(float(ping.get("lease_s", PING_LEASE_S)), POLL_INTERVAL_S), 600.0))
            except (TypeError, ValueError):
                leases.append(PING_LEASE_S)
        self._listen_until = time.monotonic() + max(leases) if leases else 0.0

    def _consider(self, request: dict[str, Any], step: int) -> None:
        rid = str(request["id"])
        open_at, first, last = int(request["open_at"]), int(request["first_step"]), int(request["last_step"])
        recorder = self.agent.recorder
        start = max(open_at, step)
        if recorder is None or recorder.disabled or not self.agent.enabled:
            self._answer(rid, "refused", reason="profiling is disabled in this process", at_step=step)
            return
        reason = ""
        if self.agent.foreign or recorder._profiler_already_running():
            reason = "the program's own profiler is running (it wins; nothing recorded)"
        elif step > first:
            reason = f"already at step {step}, past step {first}"
        else:
            busy = self.schedule.first_busy(start, last)
            if busy is not None:
                reason = f"step {busy} belongs to another window"
        if reason:
            self._answer(rid, "refused", reason=reason, at_step=step)
            return
        self.schedule.add(start, first, last)
        self.agent.tracker.wake_at_step(start)
        self.pending[rid] = (first, last, len(recorder.windows), len(recorder.notes))
        self._answer(rid, "accepted", first_step=first, last_step=last, at_step=step)

    def _settle(self, step: int) -> None:
        """Answer requests whose window was saved, or whose steps went by without one."""
        recorder = self.agent.recorder
        for rid, (first, last, before, notes) in list(self.pending.items()):
            record = None
            for window in recorder.windows[before:] if recorder is not None else []:
                if window["first_step"] <= last and window["last_step"] >= first:
                    record = window
                    break
            if record is not None:
                record["capture"] = rid
                self._answer(
                    rid,
                    "saved",
                    first_step=record["first_step"],
                    last_step=record["last_step"],
                    trace=record["trace"],
                    bytes=record["bytes"],
                    complete=record["complete"],
                    note=record.get("note", ""),
                )
            elif step > last + 1 and (recorder is None or recorder.prof is None):
                self._answer(rid, "not_recorded", reason=self._why_not(first, last, notes))
        self.schedule.forget_before(step - 1)

    def _why_not(self, first: int, last: int, notes_before: int) -> str:
        phases = self.agent.tracker.phases[first : last + 1]
        if FOREIGN in phases:
            return "the program's own profiler ran during those steps (it wins)"
        recorder = self.agent.recorder
        if recorder is not None and len(recorder.notes) > notes_before:
            return recorder.notes[-1]
        if not any(phase in (WARMUP, RECORD, RECORD_AND_SAVE) for phase in phases):
            return "no window opened (steps on a thread other than the main thread?)"
        return "no trace was saved"

    def _answer(self, rid: str, status: str, **fields: Any) -> None:
        self.responses[rid] = {"status": status, "time": time.time(), **fields}
        if status in FINAL:
            self.pending.pop(rid, None)
        self._dirty = True

    # -- heartbeat --------------------------------------------------------------------------------------------
    def _pace(self, step: int) -> None:
        """The step rate over about the last poll interval, kept at every poll (written or not): the first
        heartbeat a capture hears already says how fast the process goes."""
        now = time.time()
        if self._mark is None:  # the first poll: no pace yet
            self._mark = (step, now)
        elif now - self._mark[1] >= POLL_INTERVAL_S / 2:
            self._rate = (step - self._mark[0]) / (now - self._mark[1])
            self._mark = (step, now)

    def _write(self, step: int) -> None:
        from .output import current_rank, worker_name

        now = time.time()
        self._writes += 1
        document = {
            "run_id": self.run_id,
            "host": self.host,
            "pid": self.agent.pid,
            "rank": current_rank(),
            "worker": worker_name(),
            "step": step,
            "time": now,
            "steps_per_s": round(self._rate, 3),
            "ended": self._ended,
            "pings": self._pings,
            "writes": self._writes,
            "responses": self.responses,
        }
        atomic_write_json(self.proc_path, document)
        self._written_step = step
        self._dirty = False
