"""On-demand windows: `stepcli capture` asks, every stepping process of the run records the same
global steps.

Runs inside the target: standard library only. The protocol lives in the run's private control
folder, `<out>/.stepcli/<run_id>/control/` (created 0700 by the launcher, so only the run's owner
can ask):

  run.json              the launcher's: this run is alive (removed when it ends, with requests.json)
  requests.json         capture's: {"run_id", "requests": [{"id", "open_at", "first_step",
                        "last_step"}], "pings": [{"id", "lease_s"}]}; absent while nobody asks
  proc.<host>.<pid>.json  each stepping process's heartbeat (step, time, rate, the pings it heard,
                        how many times it was written) and its answer to each request

Each process looks at the control folder at most once a second, from a step boundary (the tracker
compares the clock value it already reads with a deadline: no file system call per step). Looking is
one failed open() while nobody asks; the file is read only when its inode, size or times changed.
The heartbeat is written only when somebody listens, so a job of a thousand ranks does not rewrite a
thousand files a second on a shared file system all day: at the first step and once more at the next
poll, with the pace (capture finds the process and knows how long it may take to hear a ping), while
a capture's ping is heard (every poll: fresh steps and pace; a ping lapses `lease_s` after the file
last changed, so a capture killed with SIGKILL does not leave the processes writing), when an answer
changes, and at exit (`ended`). A request names global steps, so every rank records the same
`ProfilerStep#N`s; a rank already past them refuses instead of recording others. Requests carry the
run id and live in a folder named by it, so a later run into the same `-o` never obeys one.

The folder is opened once and its files only relative to that descriptor (controlfiles.py): a folder
or file put in their place is never followed, never blocks, never read whole. Each request is
checked (request.py) before it is obeyed; a bad one is refused and said once. A pending request that
leaves the file was withdrawn by its capture (it gave up, or placed a later one): its window is
forgotten, or closed unsaved if it records.
"""

from __future__ import annotations

import os
import time

from stepcli.runfolder.layout import LOCK_FILE, PROC_PREFIX, REQUESTS_FILE, RUN_FILE, control_dir

from . import controlfiles
from .config import atomic_write_json
from .request import (
    MAX_CONTROL_BYTES,
    MAX_PENDING,
    Invalid,
    check_ping,
    check_request,
    entries,
    request_id,
)
from .schedule import RECORD, RECORD_AND_SAVE, WARMUP, WindowSchedule
from .tracker import FOREIGN

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from .config import AgentConfig
    from .recorder import Recorder
    from .tracker import StepTracker

    class Agent(Protocol):
        """What on-demand capture needs from the process's agent (stepcli.agent.runtime.Agent
        provides it). Declared here so this module does not refer back to runtime, which imports it:
        no import circle."""

        config: AgentConfig
        enabled: bool
        foreign: set[int]
        pid: int
        recorder: Recorder | None
        tracker: StepTracker


POLL_INTERVAL_S = 1.0
# how long a process keeps listening after requests.json last changed (capture renews it)
PING_LEASE_S = 10.0
MAX_IO_FAILURES = 30  # consecutive polls that could not read or write the control folder
FINAL = ("saved", "refused", "not_recorded")
KEPT_ANSWERS = 16  # final answers kept in the heartbeat (a capture reads its own while it waits)
WITHDRAWN = "withdrawn: the capture that asked for it gave up"


def open_control(out_dir: str, run_id: str, document: dict[str, Any]) -> str:
    """The launcher's side: create the run's private control folder and say the run is alive."""
    folder = control_dir(out_dir, run_id)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    os.mkdir(folder, 0o700)
    os.chmod(folder, 0o700)  # whatever the umask: nobody else may write requests
    atomic_write_json(os.path.join(folder, RUN_FILE), document, 0o600, private_folder=True)
    return folder


def close_control(out_dir: str, run_id: str) -> None:
    """The run ended: no request may outlive it. The processes' answers stay for a capture still
    reading."""
    folder = control_dir(out_dir, run_id)
    for name in (RUN_FILE, REQUESTS_FILE, LOCK_FILE):
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


class OnDemand:
    """One process's side of the protocol: heartbeat, accept or refuse requests, report saved
    traces.

    The control folder is opened once, here, and every file in it is read and written relative to
    that descriptor (stepcli/agent/controlfiles.py): a folder put in its place later is never looked
    at."""

    def __init__(self, agent: Agent) -> None:
        import socket

        config = agent.config
        self.agent = agent
        self.run_id = config.run_id
        self.folder = control_dir(config.out_dir, config.run_id)
        self.host = socket.gethostname()
        self.proc_name = f"{PROC_PREFIX}{self.host}.{agent.pid}.json"
        self.proc_path = os.path.join(self.folder, self.proc_name)
        self.schedule = WindowSchedule(None if config.on_demand else config.schedule)
        self.responses: dict[str, dict[str, Any]] = {}
        self.triggers: dict[str, dict[str, Any]] = {}  # id -> what triggered it (--capture-on-slow)
        # windows this process's --capture-on-slow placed: no capture withdraws them
        self.own: set[str] = set()
        # id -> (first, last step) of a triggered window
        self.trigger_steps: dict[str, tuple[int, int]] = {}
        # the triggered windows this process did not record, and why (its step log, hence the run
        # summary)
        self.not_recorded: list[dict[str, Any]] = []
        # id -> (first, last step, windows, notes before)
        self.pending: dict[str, tuple[int, int, int, int]] = {}
        self._written_step = -1
        # the first poll (the first step) writes the heartbeat: capture can find the process
        self._dirty = True
        # ... and the second (`_writes < 2`) writes its pace: how long capture may wait for it to
        # hear a ping (step, time) of the last poll, for the step rate
        self._mark: tuple[int, float] | None = None
        self._rate = 0.0
        # requests.json as last read: inode, size, mtime, ctime
        self._seen: tuple[int, int, int, int] | None = None
        self._pings: list[str] = []  # the ids of the captures listening, as last read
        self._listen_until = 0.0  # time.monotonic() until which the heartbeat is written every poll
        self._writes = 0
        self._ended = ""
        self._failures = 0
        self._said: set[str] = set()
        self.active = False
        self.folder_fd = -1
        self._last_poll = time.monotonic()  # when the main thread last polled (at a step boundary)
        # written by beat_off_main: the main thread makes no step
        self._no_step_for_s: float | None = None
        import threading

        # the stacks thread polls too while the main thread makes no step
        self._lock = threading.RLock()
        if agent.recorder is not None:
            agent.recorder.schedule = self.schedule  # type: ignore[assignment]
            agent.recorder.trigger_at = self.trigger_at
        try:
            self.folder_fd = controlfiles.open_folder(self.folder)
        except FileNotFoundError:  # a run started by an older launcher has none: nobody can ask
            return
        except OSError as exc:
            self._say_once(f"on-demand capture disabled in this process: {exc}")
            return
        agent.tracker.set_poller(self.poll, POLL_INTERVAL_S)
        self.active = True

    # -- called by the tracker (at most once a second) and by the agent
    # ----------------------------------------
    def poll(self, step: int) -> None:
        """At a step boundary: read requests (only when they changed) and write the heartbeat if
        anybody listens."""
        self._last_poll = time.monotonic()
        with self._lock:
            self._no_step_for_s = None
            self._poll(step)

    def beat_off_main(self, step: int, no_step_for_s: float) -> None:
        """From the stacks thread, once a second: while the main thread makes no step (no poll for
        two intervals: blocked in C, a hang, a long step), poll for it, so a capture or `stepcli
        top` listening now hears this process's real step and how long it has made none
        (`no_step_for_s`), not a stale heartbeat."""
        if not self.active or time.monotonic() - self._last_poll < 2 * POLL_INTERVAL_S:
            return
        with self._lock:
            self._no_step_for_s = no_step_for_s
            # written at every poll while somebody listens, like a stepping process
            self._written_step = -1
            # the pace stays the one it stepped at: `no_step_for_s` says it stopped
            self._poll(step, pace=False)

    def _poll(self, step: int, pace: bool = True) -> None:
        try:
            listening = self._read_requests(step)
            self._settle(step)
            if pace:
                self._pace(step)
            if self._dirty or ((listening or self._writes < 2) and step != self._written_step):
                self._write(step)
            self._failures = 0
        # a shared file system's hiccup: try again next second, but not forever
        except OSError as exc:
            self._failures += 1
            if self._failures >= MAX_IO_FAILURES:
                self._give_up(exc)
        except Exception as exc:
            self._give_up(exc)

    def window_saved(self) -> None:
        """A window was saved (or dropped): answer at once, not at the next poll."""
        if not self.pending:
            return
        with self._lock:
            self._window_saved()

    def _window_saved(self) -> None:
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
        """The process exits (after its open window was saved): answer every pending request, say we
        ended."""
        if not self.active:
            return
        with self._lock:
            self._finish(reason)

    def _finish(self, reason: str) -> None:
        try:
            step = self.agent.tracker.global_step
            self._settle(step)
            for rid in list(self.pending):
                self._answer(
                    rid, "not_recorded", reason=f"the process exited ({reason}) at step {step}"
                )
            self._ended = reason
            self._write(step)
        except Exception:
            pass

    def _give_up(self, exc: BaseException) -> None:
        self.agent.tracker.set_poller(None)
        self.active = False
        self._say_once(f"on-demand capture disabled in this process: {type(exc).__name__}: {exc}")

    def _say_once(self, message: str) -> None:
        """One line per kind of trouble, however many polls meet it (messages never quote forged
        values)."""
        if message in self._said:
            return
        self._said.add(message)
        from .output import say

        say(message)

    # -- requests
    # ---------------------------------------------------------------------------------------------
    def _read_requests(self, step: int) -> bool:
        """Whether a capture listens. open() rather than stat(): on NFS, open revalidates the file
        (close-to-open)."""
        try:
            fd, stat = controlfiles.open_regular(self.folder_fd, REQUESTS_FILE)
        except FileNotFoundError:  # the usual case: nobody is asking
            self._seen, self._pings, self._listen_until = None, [], 0.0
            self._withdraw_missing(set(), step)
            return False
        # a link, a FIFO, a device, or not the run owner's: never read
        except controlfiles.Refused as exc:
            self._say_once(f"on-demand capture: ignoring the control folder's {exc}")
            self._seen = None
            return False
        try:
            seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
            if seen == self._seen:  # unchanged since the last poll: nothing new to read
                return time.monotonic() < self._listen_until
            try:
                data = controlfiles.read_bounded(fd, MAX_CONTROL_BYTES, REQUESTS_FILE)
            except controlfiles.Refused as exc:
                self._say_once(f"on-demand capture: ignoring the control folder's {exc}")
                self._seen = seen
                return False
        finally:
            os.close(fd)
        # Marked as read only now: after a failed read (OSError, an NFS hiccup) the next poll reads
        # it again.
        self._seen = seen
        try:
            document = controlfiles.parse_json(data)
        except ValueError:
            return False  # malformed as written: read again only once it changes
        if not isinstance(document, dict) or document.get("run_id") != self.run_id:
            return False
        self._listen(entries(document, "pings"))
        self._take_requests(entries(document, "requests"), step)
        return time.monotonic() < self._listen_until

    def _take_requests(self, requests: list[Any], step: int) -> None:
        """Consider each new request; a pending one no longer in the file was withdrawn by its
        capture."""
        asked: set[str] = set()
        for entry in requests:
            try:
                rid, open_at, first, last = check_request(entry)
            except Invalid as exc:
                self._refuse_malformed(entry, exc, step)
                continue
            asked.add(rid)
            if rid not in self.responses:
                if "trigger" in entry:  # placed by a rank's --capture-on-slow
                    from .triggerinfo import clean_trigger

                    self.triggers[rid] = clean_trigger(entry["trigger"]) or {}
                    self.trigger_steps[rid] = (first, last)
                self._consider(rid, open_at, first, last, step)
        self._withdraw_missing(asked, step)

    def _refuse_malformed(self, entry: Any, exc: Invalid, step: int) -> None:
        rid = request_id(entry)
        if rid is None:
            self._say_once(f"on-demand capture: ignoring a malformed request: {exc}")
        elif rid not in self.responses:
            self._say_once(f"on-demand capture: refusing a malformed request: {exc}")
            self._answer(rid, "refused", reason=f"malformed request: {exc}", at_step=step)

    def _listen(self, pings: list[Any]) -> None:
        """Captures waiting for fresh heartbeats: listen for their lease from now (this host's
        clock, not theirs)."""
        ids, leases = [], []
        for entry in pings:
            try:
                pid, lease = check_ping(entry, PING_LEASE_S, POLL_INTERVAL_S, 600.0)
            except Invalid as exc:
                self._say_once(f"on-demand capture: ignoring a malformed ping: {exc}")
                continue
            ids.append(pid)
            leases.append(lease)
        if set(ids) - set(self._pings):
            self._dirty = True  # a new capture listens: tell it at once that this process was heard
        self._pings = ids
        self._listen_until = time.monotonic() + max(leases) if leases else 0.0

    def _consider(self, rid: str, open_at: int, first: int, last: int, step: int) -> None:
        recorder = self.agent.recorder
        start = max(open_at, step)
        if recorder is None or recorder.disabled or not self.agent.enabled:
            self._answer(
                rid, "refused", reason="profiling is disabled in this process", at_step=step
            )
            return
        reason, late = "", False
        if self.agent.foreign or recorder._profiler_already_running():
            reason = "the program's own profiler is running (it wins; nothing recorded)"
        elif step > first:
            reason, late = f"already at step {step}, past step {first}", True
        elif len(self.pending) >= MAX_PENDING:
            reason = f"{MAX_PENDING} windows are already waiting in this process"
        else:
            busy = self.schedule.first_busy(start, last)
            if busy is not None:
                reason = f"step {busy} belongs to another window"
        if reason:
            self._answer(
                rid, "refused", reason=reason, at_step=step, **({"late": True} if late else {})
            )
            return
        self.schedule.add(start, first, last)
        self.agent.tracker.wake_at_step(start)
        self.pending[rid] = (first, last, len(recorder.windows), len(recorder.notes))
        self._answer(rid, "accepted", first_step=first, last_step=last, at_step=step)

    def _withdraw_missing(self, asked: set[str], step: int) -> None:
        """Drop the windows whose request left the file: their capture gave up (its timeout) or
        re-planned, and nobody waits for them. One that records is closed unsaved, so it stops
        costing time and memory."""
        for rid in [rid for rid in self.pending if rid not in asked and rid not in self.own]:
            first, last, _, _ = self.pending[rid]
            window = self.schedule.remove(first, last)
            recorder = self.agent.recorder
            if window is not None and recorder is not None and recorder.prof is not None:
                if window[0] <= step <= last + 1:  # this window is the one open now
                    recorder.drop(WITHDRAWN)
            self._answer(rid, "not_recorded", reason=WITHDRAWN, at_step=step)

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
                if rid in self.triggers:
                    from .triggerinfo import save_trigger

                    record["trigger"] = self.triggers[rid]
                    save_trigger(record["trace"], record["trigger"])
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

    def trigger_at(self, step: int) -> dict[str, Any] | None:
        """What triggered the waiting window that records `step` (--capture-on-slow), with its
        steps; None when no triggered window holds it."""
        for rid, (first, last, _, _) in self.pending.items():
            trigger = self.triggers.get(rid)
            if trigger is not None and first <= step <= last:
                return {**trigger, "first_step": first, "last_step": last}
        return None

    def _answer(self, rid: str, status: str, **fields: Any) -> None:
        # re-inserted last: the oldest answers come first, and go first
        self.responses.pop(rid, None)
        self.responses[rid] = {"status": status, "time": time.time(), **fields}
        if status in FINAL:
            trigger = self.triggers.get(rid)
            steps = self.trigger_steps.pop(rid, None)
            if (
                trigger is not None
                and status != "saved"
                and steps is not None
                and len(self.not_recorded) < 16
            ):
                self.not_recorded.append(
                    {
                        "first_step": steps[0],
                        "last_step": steps[1],
                        **trigger,
                        "recorded": False,
                        "reason": str(fields.get("reason") or status)[:200],
                    }
                )
            self.pending.pop(rid, None)
            self.triggers.pop(rid, None)
            self.own.discard(rid)
        finals = [key for key, answer in self.responses.items() if answer["status"] in FINAL]
        for key in finals[: max(0, len(finals) - KEPT_ANSWERS)]:
            # bounded: a long run with many captures keeps a small heartbeat
            del self.responses[key]
        self._dirty = True

    # -- heartbeat
    # --------------------------------------------------------------------------------------------
    def _pace(self, step: int) -> None:
        """The step rate over about the last poll interval, kept at every poll (written or not): the
        first heartbeat a capture hears already says how fast the process goes."""
        now = time.time()
        if self._mark is None:  # the first poll: no pace yet
            self._mark = (step, now)
        elif now - self._mark[1] >= POLL_INTERVAL_S / 2:
            self._rate = (step - self._mark[0]) / (now - self._mark[1])
            self._mark = (step, now)

    def _step_times(self) -> dict[str, Any]:
        """The last step's time, the median of the recent ones and whether a window records: for
        `stepcli top`. Computed only when the heartbeat is written (somebody listens)."""
        durations = self.agent.tracker.durations_ns
        recent = durations[max(1, len(durations) - 64) :].tolist()
        recent.sort()
        recorder = self.agent.recorder
        return {
            "last_ms": round(durations[-1] / 1e6, 3) if len(durations) > 1 else None,
            "median_ms": round(recent[len(recent) // 2] / 1e6, 3) if recent else None,
            "recording": recorder is not None and recorder.prof is not None,
        }

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
            "no_step_for_s": self._no_step_for_s,
            **self._step_times(),
        }
        controlfiles.write_json(self.folder_fd, self.proc_name, document)
        self._written_step = step
        self._dirty = False
