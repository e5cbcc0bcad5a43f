"""Stack dumps on request, and the hang watch of `stepcli run --hang-timeout`, inside each stepping
process.

Runs inside the target: standard library only, and nothing per step. When the process starts to
train, it registers `faulthandler` on DUMP_SIGNAL (a real-time signal no program uses by default)
writing into a pipe, and starts one daemon thread that sleeps on that pipe. The signal is handled in
C, so it is delivered even while the main thread is blocked in C code (a collective, a sleep, a
lock); its bytes wake the thread, which then writes one JSON file: every Python thread's stack
(`sys._current_frames()`), faulthandler's own text, the step, and the last collective entered
(stepcli/agent/lastcollective.py). The launcher or `stepcli capture --stacks` say where to write in
a request file (`dump.<id>.json`) of the run's private control folder before they send the signal.

The same thread wakes every second (every T/10 with `--hang-timeout T`) and reads the tracker's step
count (one attribute read; the step path itself is untouched). With `--hang-timeout T`, after T
without a step it writes `stall.<host>.<pid>.json` and saves the step log (stepcli/agent/runtime.py,
`save_progress`: every step made so far, for a process killed later), and removes the stall file
when steps resume. The launcher calls a hang when every live stepping process has one. In any run it
saves the step log now and then (PROGRESS_INTERVAL_S), and keeps the heartbeat
(stepcli/agent/ondemand.py) answering `stepcli top`/`capture` while the main thread makes no step
(blocked in C): the step, and how long since the last one. It also watches SIGTERM/SIGHUP
(`watch_signals`): faulthandler writes into a pipe of its own in C, then Python's handler is
chained; when the main thread has not entered that handler within SIGNAL_GRACE_S (blocked in C,
where no Python handler runs), this thread saves the step log and ends the process of that signal.
Files, in `<out>/.stepcli/<run-id>/control/`:

  stacks.<host>.<pid>.json   this process can dump: pid, start time (so a reused pid is never
                             signalled), signal
  stall.<host>.<pid>.json    no step for T: the step, and when the last one ended (wall clock)
  fault.<host>.<pid>.txt     faulthandler's text for FAULT_SIGNAL, appended by its C handler: the
                             stacks of a process whose threads cannot run (C code holding the GIL),
                             read by the launcher
  alive.<host>.<pid>.json    the answer to the launcher's probe (`probe.json`, then the dump
                             signal): this process's Python can run. When some processes are stalled
                             and the others are not, the launcher probes those: one that cannot
                             answer (C code holding the GIL) is stuck.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from stepcli.runfolder.layout import (
    ALIVE_PREFIX,
    FAULT_PREFIX,
    MEMORY_ANSWER_SCHEMA,
    PROBE_FILE,
    REGISTER_PREFIX,
    REQUEST_PREFIX,
    STACKS_SCHEMA,
    STALL_PREFIX,
)

from . import controlfiles
from .config import atomic_write_json

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from .config import AgentConfig
    from .hooks import PostImportHooks
    from .tracker import StepTracker

    class Agent(Protocol):
        """What the dumper needs from the process's agent (stepcli.agent.runtime.Agent provides it);
        declared here so this module does not refer back to runtime, which imports it."""

        config: AgentConfig
        tracker: StepTracker
        hooks: PostImportHooks


# per thread, innermost first: enough for any real stack, bounded for a runaway recursion
MAX_FRAMES = 60
_QUIET_S = 0.1  # faulthandler writes its text in one go: this long without more bytes ends it
_MAX_TEXT = 1 << 20
_MAX_REQUEST = 64 * 1024  # a request or probe file is a few dozen bytes
# a main thread that can run Python enters its SIGTERM handler well within this
SIGNAL_GRACE_S = 2.0
_TICK_S = 1.0


def dump_signal() -> int | None:
    """SIGRTMIN+6 on Linux (its default action would end a process: only registered processes get
    it)."""
    import signal

    low = getattr(signal, "SIGRTMIN", None)
    return int(low) + 6 if low is not None else None


def fault_signal() -> int | None:
    """SIGRTMIN+5: faulthandler appends every thread's stack to the process's fault file, with no
    Python at all, for a process whose threads cannot run because C code holds the GIL."""
    signum = dump_signal()
    return signum - 1 if signum is not None else None


def process_start_ticks(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): pid plus this
    names one process for good, so a pid reused after the process ended is never signalled."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class StackDumper:
    """This process's dump thread: answers DUMP_SIGNAL with a stacks file; with a hang timeout,
    watches steps."""

    def __init__(
        self, agent: Agent, folder: str, signum: int, hang_timeout: float, training: bool = True
    ) -> None:
        import socket

        self.agent = agent
        self.folder = folder
        # its files only relative to it (see controlfiles.py)
        self.folder_fd = controlfiles.open_folder(folder)
        self.signum = signum
        self.hang_timeout = hang_timeout
        # False from joining a distributed job until the first sign of training (`train`): dumped,
        # never stalled
        self.training = training
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.tag = f"{self.host}.{self.pid}.json"
        self.answered: set[str] = set()
        self.stalled = False
        self._probe = ""
        self._failed = False
        self._step = agent.tracker.global_step
        self._step_wall = time.time()
        self._step_mono = time.monotonic()
        self.fault_name = FAULT_PREFIX + self.tag[: -len(".json")] + ".txt"
        self._fault_fd = os.open(
            self.fault_name,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
            0o600,
            dir_fd=self.folder_fd,
        )
        self._read_fd, self._write_fd = os.pipe()
        # a full pipe drops text; never blocks the signal handler
        os.set_blocking(self._write_fd, False)
        # signum -> (read, write): watch_signals
        self._signal_pipes: dict[int, tuple[int, int]] = {}
        self._stop = False

    def start(self) -> None:
        import faulthandler

        try:
            import fcntl

            # room for a thousand threads' text
            fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, _MAX_TEXT)
        except (ImportError, AttributeError, OSError):
            pass
        faulthandler.register(self.signum, file=self._write_fd, all_threads=True, chain=False)
        fallback = fault_signal()
        if fallback is not None:
            faulthandler.register(fallback, file=self._fault_fd, all_threads=True, chain=False)
        thread = threading.Thread(target=self._run, name="stepcli-stacks", daemon=True)
        thread.start()
        self._register()

    def train(self) -> None:
        """The process starts to train (it joined its job earlier): from now on it can stall,
        counted from now."""
        if self.training:
            return
        self._step = self.agent.tracker.global_step
        self._step_wall, self._step_mono = time.time(), time.monotonic()
        self.training = True
        try:
            self._register()
        # (a full disk, say): profiling goes on; the hang watch keeps the old registration
        except OSError:
            pass

    def _register(self) -> None:
        from .output import current_rank, worker_name

        controlfiles.write_json(
            self.folder_fd,
            REGISTER_PREFIX + self.tag,
            {
                "pid": self.pid,
                "host": self.host,
                "start_ticks": process_start_ticks(),
                "signal": self.signum,
                "fault_signal": fault_signal(),
                "fault_file": self.fault_name,
                "main_thread": threading.main_thread().ident,
                "rank": current_rank(),
                "worker": worker_name(),
                "hang_timeout_s": self.hang_timeout,
                "registered_at": time.time(),
                "training": self.training,
            },
        )

    def watch_signals(self, handler: Any) -> None:
        """SIGTERM/SIGHUP whose Python handler is `handler` (the agent's) also wake this thread,
        from C: when the main thread cannot take them (blocked in C), this thread saves and ends the
        process (see the module)."""
        import faulthandler
        import signal

        for signum in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(signum) != handler:
                    continue  # the program's own handler: its business
                read_fd, write_fd = os.pipe()
                os.set_blocking(write_fd, False)
                faulthandler.register(signum, file=write_fd, all_threads=False, chain=True)
                self._signal_pipes[int(signum)] = (read_fd, write_fd)
            except (OSError, ValueError, RuntimeError):
                continue

    def forked(self) -> None:
        """In a forked child (a DataLoader worker): no thread here, and the parent's pipe is not
        ours."""
        import faulthandler

        self._stop = True
        try:
            for signum, fds in self._signal_pipes.items():
                faulthandler.unregister(signum)
                os.close(fds[0])
                os.close(fds[1])
            self._signal_pipes = {}
            faulthandler.unregister(self.signum)
            fallback = fault_signal()
            if fallback is not None:
                faulthandler.unregister(fallback)
            os.close(self._read_fd)
            os.close(self._write_fd)
            os.close(self._fault_fd)
            os.close(self.folder_fd)
        except (OSError, ValueError):
            pass

    def unregister(self) -> None:
        """At exit: this process can no longer dump, nor be stalled (what other hosts' launchers go
        by)."""
        if os.getpid() != self.pid:
            return
        for prefix in (REGISTER_PREFIX, STALL_PREFIX, ALIVE_PREFIX):
            _unlink(self.folder_fd, prefix + self.tag)
        _unlink(self.folder_fd, self.fault_name)

    # -- the thread
    # --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        import select

        tick = min(_TICK_S, self.hang_timeout / 10) if self.hang_timeout > 0 else _TICK_S
        while not self._stop:
            try:
                watched = {fds[0]: signum for signum, fds in self._signal_pipes.items()}
                ready, _, _ = select.select([self._read_fd, *watched], [], [], tick)
                if self._stop:
                    return
                for fd in ready:
                    if fd in watched:
                        os.read(fd, 1 << 16)
                        self._signalled(watched[fd])
                if self._read_fd in ready:
                    self._answer(self._read_text())
                    self._answer_probe()
                self._watch_steps()
            except Exception as exc:  # never take the program down; say it once, keep answering
                if not self._failed:
                    self._failed = True
                    from .output import say

                    say(f"a stack dump failed in this process: {type(exc).__name__}: {exc}")

    def _read_text(self) -> str:
        import select

        chunks: list[bytes] = []
        size = 0
        while size < _MAX_TEXT:
            ready, _, _ = select.select([self._read_fd], [], [], _QUIET_S)
            if not ready:
                break
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def _signalled(self, signum: int) -> None:
        """SIGTERM/SIGHUP arrived: the main thread's handler saves and ends the process; when it has
        not begun within SIGNAL_GRACE_S (the main thread is blocked in C), this thread does
        (agent.die_off_main_thread)."""
        deadline = time.monotonic() + SIGNAL_GRACE_S
        while time.monotonic() < deadline:
            exits = getattr(self.agent, "exits", None)  # (runtime.Agent's ExitGuard)
            if exits is not None and (exits.signal_handled or exits.flushed):
                return
            time.sleep(0.02)
        die = getattr(self.agent, "die_off_main_thread", None)
        if die is not None:
            die(signum)

    def _watch_steps(self) -> None:
        if not self.training:
            return
        step = self.agent.tracker.global_step
        now = time.monotonic()
        if step != self._step:
            self._step, self._step_mono, self._step_wall = step, now, time.time()
            if self.stalled:
                self.stalled = False
                _unlink(self.folder_fd, STALL_PREFIX + self.tag)
            self._save(False)
            return
        ondemand = getattr(self.agent, "ondemand", None)
        # `stepcli top` and capture still hear a process whose main thread is stuck
        if ondemand is not None:
            ondemand.beat_off_main(step, round(time.time() - self._step_wall, 1))
        if (
            self.hang_timeout > 0
            and not self.stalled
            and now - self._step_mono >= self.hang_timeout
        ):
            self.stalled = True
            # before the stall file: the launcher may end the job as soon as it sees it
            self._save(True)
            controlfiles.write_json(
                self.folder_fd,
                STALL_PREFIX + self.tag,
                {"pid": self.pid, "host": self.host, "step": step, "last_step_at": self._step_wall},
            )

    def _save(self, stalled: bool) -> None:
        save = getattr(self.agent, "save_progress", None)
        if save is not None:
            save(stalled)

    def _answer_probe(self) -> None:
        """The launcher asks whether this process's Python can run: say so, with the step."""
        try:
            probe = str(controlfiles.read_json(self.folder_fd, PROBE_FILE, _MAX_REQUEST)["id"])
        # absent, or not ours (controlfiles.Refused)
        except (OSError, ValueError, KeyError, TypeError):
            return
        if probe == self._probe:
            return
        self._probe = probe
        controlfiles.write_json(
            self.folder_fd,
            ALIVE_PREFIX + self.tag,
            {
                "probe": probe,
                "pid": self.pid,
                "host": self.host,
                "step": self.agent.tracker.global_step,
            },
        )

    def _answer(self, text: str) -> None:
        """Write a stacks file for every request not answered yet (several may share one signal)."""
        for name in sorted(os.listdir(self.folder_fd)):
            if (
                not (name.startswith(REQUEST_PREFIX) and name.endswith(".json"))
                or name in self.answered
            ):
                continue
            try:
                request = controlfiles.read_json(self.folder_fd, name, _MAX_REQUEST)
                target = str(request["dir"])
            # gone, or not ours (controlfiles.Refused)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            self.answered.add(name)
            if request.get("kind") == "memory":  # `stepcli capture --memory-snapshot`
                document = self.memory_answer(str(request.get("id", name)))
            else:
                document = self.snapshot(text, str(request.get("id", name)))
            try:
                atomic_write_json(
                    os.path.join(target, f"{document['worker']}.{self.host}.{self.pid}.json"),
                    document,
                    0o600,
                )
            except OSError:
                # the folder is gone (a request left by a launcher that died): the others still get
                # theirs
                continue

    def memory_answer(self, request_id: str) -> dict[str, Any]:
        """The CUDA memory snapshot now, written into the run folder (stepcli/agent/cudamemory.py),
        and the answer."""
        from .cudamemory import dump_now
        from .output import current_rank, worker_name

        answer = dump_now(self.agent, sys.modules.get("torch"))  # type: ignore[arg-type]
        answer.update(
            schema=MEMORY_ANSWER_SCHEMA,
            request=request_id,
            pid=self.pid,
            host=self.host,
            rank=current_rank(),
            worker=worker_name(),
            time=time.time(),
        )
        return answer

    def snapshot(self, text: str, request_id: str) -> dict[str, Any]:
        """Every Python thread's stack now (innermost frame first), the step, and the last
        collective."""
        from .lastcollective import LAST, in_flight
        from .output import current_rank, worker_name

        now = time.time()
        names = {thread.ident: thread for thread in threading.enumerate()}
        own = threading.get_ident()
        main = threading.main_thread().ident
        threads = []
        for ident, frame in sys._current_frames().items():
            if ident == own:
                continue
            thread = names.get(ident)
            threads.append(
                {
                    "id": ident,
                    "name": thread.name if thread is not None else f"thread {ident:#x}",
                    "main": ident == main,
                    "daemon": bool(thread.daemon) if thread is not None else None,
                    "frames": _frames(frame),
                }
            )
        threads.sort(key=lambda t: (not t["main"], str(t["name"])))
        tracker = self.agent.tracker
        return {
            "schema": STACKS_SCHEMA,
            "request": request_id,
            "pid": self.pid,
            "host": self.host,
            "rank": current_rank(),
            "worker": worker_name(),
            "time": now,
            "step": tracker.global_step,
            # False: joined its job, never started to train (no step, no optimizer)
            "training": self.training,
            "last_step_s_ago": round(now - self._last_step_wall(), 3)
            if self.hang_timeout > 0
            else None,
            "collective": LAST.to_dict(now),
            "collectives_hooked": self.hang_timeout > 0,
            "in_flight": in_flight(now),  # None: unknown (no flight recorder here)
            "threads": threads,
            "faulthandler": text,
        }

    def _last_step_wall(self) -> float:
        if self.agent.tracker.global_step != self._step:  # stepped since the thread last looked
            return time.time()
        return self._step_wall


def _frames(frame: Any) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append({"function": code.co_name, "file": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return frames


def _unlink(folder_fd: int, name: str) -> None:
    try:
        controlfiles.unlink(folder_fd, name)
    except OSError:
        pass


def start_stacks(agent: Agent, training: bool = True) -> StackDumper | None:
    """At the process's first sign of training (or, `training` False, when it joins a distributed
    job): register for dumps. Never raises; None where it cannot."""
    from stepcli.runfolder.layout import control_dir

    signum = dump_signal()
    folder = control_dir(agent.config.out_dir, agent.config.run_id)
    if signum is None or not os.path.isdir(folder):
        return None
    try:
        timeout = float(getattr(agent.config, "hang_timeout", 0.0) or 0.0)
        dumper = StackDumper(agent, folder, signum, timeout, training)
        dumper.start()
    except Exception as exc:
        from .output import say

        say(f"stack dumps unavailable in this process: {type(exc).__name__}: {exc}")
        return None
    os.register_at_fork(after_in_child=dumper.forked)
    import atexit

    atexit.register(dumper.unregister)
    return dumper


def install_collective_hook(agent: Agent) -> None:
    """With --hang-timeout: note each torch.distributed collective entered (see
    stepcli/agent/lastcollective.py)."""
    if not getattr(agent.config, "hang_timeout", 0.0):
        return
    from .lastcollective import hook_collectives

    joined = getattr(agent, "joined_job", None)
    agent.hooks.when_imported("torch.distributed", lambda dist: hook_collectives(dist, joined))
