"""The hang doctor's watch: `stepcli run --hang-timeout/--on-hang`. A launcher thread calls a hang
when every live registered process that trains is stalled (stepcli/agent/stacks.py), dumps every
process's stacks through stepcli.run.live.hangdoctor, prints the block, and with `--on-hang kill`
ends the job."""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any

from stepcli.agent import controlfiles
from stepcli.agent.stacks import dump_signal
from stepcli.errors import EXIT_HANG
from stepcli.run.live.hangdoctor import (
    DUMP_WAIT_S,
    MAX_REPORTS,
    PROBE_WAIT_S,
    TERM_GRACE_S,
    Folder,
    _documents,
    _say,
    _short,
    _signal,
    _tag,
    _write_control,
    dump_key,
    local,
    registered,
    request_stacks,
)
from stepcli.run.summary.hangdump import ProcessId, is_stopped
from stepcli.run.summary.hangreport import describe_dumps
from stepcli.runfolder.layout import ALIVE_PREFIX, PROBE_FILE, STALL_PREFIX

if TYPE_CHECKING:
    import subprocess

    from stepcli.agent.config import AgentConfig


class HangWatch:
    """A launcher thread: calls a hang when every live stepping process is stalled, dumps, maybe
    ends the job."""

    def __init__(
        self, config: AgentConfig, timeout_s: float, on_hang: str, proc: subprocess.Popen[bytes]
    ) -> None:
        from stepcli.runfolder.layout import control_dir

        path = control_dir(config.out_dir, config.run_id)
        # Held from here on, not reopened by path: another user can rename `.stepcli` away in a
        # shared folder, and the processes keep writing through their own descriptors into the
        # folder wherever it now is.
        try:
            self.folder: Folder = controlfiles.open_folder(path)
        except OSError:
            # (made by the launcher just before: gone already, the watch looks by path)
            self.folder = path
        self.out_dir = config.out_dir
        self.timeout_s = timeout_s
        self.on_hang = on_hang
        self.proc = proc
        self.killed = False
        self.exit_status = EXIT_HANG
        self.reports = 0
        # the OUT/hang-<n>/ folders this watch wrote: the summary reads only those
        self.folders: list[str] = []
        self._probes = 0
        # (whom, all silent, until)
        self._probed: tuple[frozenset[str], bool, float] = (frozenset(), False, 0.0)
        # tag -> wall time this watch first saw the process stopped
        self._seen_stopped: dict[str, float] = {}
        # tag -> the step its stall file gave, as hung() last read them
        self._stalled_at: dict[str, Any] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepcli-hang-watch", daemon=True)

    def start(self) -> HangWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=DUMP_WAIT_S + TERM_GRACE_S + 5)
        try:
            _write_control(self.folder, PROBE_FILE, None)
        except OSError:
            pass
        if isinstance(self.folder, int) and not self._thread.is_alive():
            os.close(self.folder)

    def hung(self) -> tuple[float, list[dict[str, Any]]] | None:
        """(when the last step ended, the processes) while every live registered process is stalled,
        or stalled processes wait and every other one is stuck where its Python cannot run (it
        answers no probe).

        A stopped process (SIGSTOP, a debugger) cannot mark itself stalled: once this watch has seen
        it stopped for the timeout it counts as stalled since it was first seen so (its last step
        came before: a lower bound).
        """
        processes = registered(self.folder)
        # A process that joined its job but never trained (stepcli.agent.stacks.StackDumper.train)
        # is dumped with the others, never waited for: it cannot stall, and holding the job back
        # before its first step it is what the dump must show.
        training = [p for p in processes if p.get("training") is not False]
        stalls = _documents(self.folder, STALL_PREFIX)
        now = time.time()
        stopped = {_tag(p) for p in training if is_stopped(ProcessId.of(p))}
        self._seen_stopped = {tag: self._seen_stopped.get(tag, now) for tag in stopped}
        last_step = {tag: float(stall.get("last_step_at", 0.0)) for tag, stall in stalls.items()}
        for tag, since in self._seen_stopped.items():
            if tag not in last_step and now - since >= self.timeout_s:
                last_step[tag] = since
        stalled = [p for p in training if _tag(p) in last_step]
        quiet = [p for p in training if _tag(p) not in last_step]
        # the step each was stalled at: a dump showing a later one means the job stepped on
        # meanwhile (_report)
        self._stalled_at = {tag: stall.get("step") for tag, stall in stalls.items()}
        if not stalled or (quiet and not self._silent(quiet)):
            return None
        return max(last_step[_tag(p)] for p in stalled), processes

    def _silent(self, quiet: list[dict[str, Any]]) -> bool:
        """Whether none of `quiet` (processes not marked stalled) answers a probe: each is stuck in
        C code that holds the GIL, so it cannot step either. Probed at most once per timeout; the
        answer is kept till then."""
        if any(not local(p) for p in quiet):
            return False  # another host's process cannot be probed from here: it may be stepping
        # a stopped one cannot answer, nor step
        quiet = [p for p in quiet if _tag(p) not in self._seen_stopped]
        if not quiet:
            return True
        whom = frozenset(_tag(p) for p in quiet)
        cached_whom, cached, until = self._probed
        if whom == cached_whom and time.monotonic() < until:
            return cached
        self._probes += 1
        probe = f"{os.getpid()}-{self._probes}"
        try:
            _write_control(self.folder, PROBE_FILE, {"id": probe})
        except OSError:
            return False
        for process in quiet:
            _signal(process, process.get("signal"), dump_signal())
        # no longer than a step may take
        deadline = time.monotonic() + min(PROBE_WAIT_S, max(2.0, self.timeout_s))
        silent = True
        while silent and time.monotonic() < deadline and not self._stopped.is_set():
            answers = _documents(self.folder, ALIVE_PREFIX)
            silent = not any(answers.get(tag, {}).get("probe") == probe for tag in whom)
            if silent:
                time.sleep(0.1)
        self._probed = (whom, silent, time.monotonic() + self.timeout_s)
        return silent

    def _run(self) -> None:
        tick = min(0.5, self.timeout_s / 10)
        episode, reports, next_at = None, 0, 0.0
        # A hang found over while it was dumped (a process stepped on) is not dumped again while the
        # same processes look stalled since the same time: their stale stall files go at their next
        # look (a tenth of the timeout). Anything else (another process stalled or gone, or a
        # timeout later) is looked at afresh.
        moved_on: tuple[float, frozenset[str], float] | None = None
        while not self._stopped.wait(tick):
            try:
                state = self.hung()
            except Exception:
                state = None
            if state is None:
                episode = moved_on = None
                continue
            since, processes = state
            stalled = frozenset(self._stalled_at)
            if (
                moved_on is not None
                and moved_on[:2] == (since, stalled)
                and time.monotonic() < moved_on[2]
            ):
                continue
            if since != episode:
                episode, reports, next_at = since, 0, 0.0
            if reports >= MAX_REPORTS or time.monotonic() < next_at:
                continue
            try:
                if not self._report(since, processes, reports + 1):
                    # no hang: it stepped on
                    moved_on = (since, stalled, time.monotonic() + self.timeout_s)
                    continue
            except Exception as exc:  # the job must not lose its launcher to a bug here
                _say(f"hang dump failed: {type(exc).__name__}: {exc}")
            reports += 1
            self.reports += 1
            next_at = time.monotonic() + self.timeout_s
            if self.on_hang == "kill":
                self.killed = True
                _say(f"--on-hang kill: ending the job (exit status {EXIT_HANG})")
                terminate_job(self.proc)
                return

    def _report(self, since: float, processes: list[dict[str, Any]], repeat: int) -> bool:
        """Dump and say it; False (and nothing kept or said) when a dump shows a process that
        stepped after its stall was read: the job moved on while it was being dumped, and stacks
        taken then show no hang."""
        whom, silent_then, _ = self._probed
        # a probe just found their Python unable to run
        unanswering = whom if silent_then else frozenset()
        target, dumps, silent = request_stacks(
            self.folder, self.out_dir, "hang", processes, unanswering=unanswering
        )
        if any(
            _stepped_since(dump.step, self._stalled_at.get(f"{dump_key(dump)}.json"))
            for dump in dumps
        ):
            # (made by this dump, just now: nothing of the user's)
            shutil.rmtree(target, ignore_errors=True)
            return False
        self.folders.append(str(target))
        idle = time.time() - since
        again = f" (still hung: report {repeat} of {MAX_REPORTS})" if repeat > 1 else ""
        headline = [
            f"hang: no process completed a step for {idle:.1f} s{again}; stacks in "
            f"{_short(target)}/"
        ]
        # the folder on a line of its own rather than past 80 columns
        if len(f"stepcli: {headline[0]}") > 80:
            headline = [
                f"hang: no process completed a step for {idle:.1f} s{again}; stacks in",
                f"  {_short(target)}/",
            ]
        for line in [*headline, *describe_dumps(dumps, [ProcessId.of(p) for p in silent])]:
            _say(line)
        return True


def _stepped_since(step: int | None, stalled_at: Any) -> bool:
    """Whether a process's dump shows a later step (`step`) than the one its stall file gave."""
    return _is_int(step) and _is_int(stalled_at) and step > stalled_at


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def start_hang_watch(
    timeout_s: float | None, on_hang: str, config: AgentConfig, proc: subprocess.Popen[bytes]
) -> HangWatch | None:
    if timeout_s is None:
        return None
    return HangWatch(config, timeout_s, on_hang, proc).start()


def terminate_job(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the program, every process it started and every orphan of the job stepcli adopted
    as their child subreaper (stepcli/run/subreaper.py: a daemonized grandchild), SIGCONT to the
    stopped ones (so they act on it), SIGKILL to those left after TERM_GRACE_S. The program's status
    is left to the launcher's wait(); the adopted ones are reaped here (WNOHANG, by pid). A zombie
    counts as gone."""
    import psutil

    from stepcli.run import subreaper

    family: list[Any] = []
    for pid in [proc.pid, *subreaper.adopted()]:
        try:
            family += [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
    subreaper.terminate(family, TERM_GRACE_S)
    subreaper.end_adopted(TERM_GRACE_S)  # any the job forked or orphaned meanwhile
