"""The step log of one profiled process: writing it, and the save at exit that writes it last.

The step log holds every step's time and phase, the windows recorded, notes and peaks (signed with
the run's key), written atomically under the process's host and pid; at exit, or when saved as
progress, the whole-run record (steprecord.py) too. `runtime.Agent` decides when to save (at exit,
after a window, from the stacks thread) and holds the lock; this module is loaded only the first
time a process saves, so processes that never step never import it.

Runs inside the target: standard library only.
"""

from __future__ import annotations

import os
import sys
import time

from stepcli.runfolder.layout import STEP_LOG_SUFFIX, STEP_LOG_VERSION

from .config import atomic_write_json

TYPE_CHECKING = False  # typing is not imported at run time: this module loads in profiled processes
if TYPE_CHECKING:
    from typing import Protocol

    from .compiles import CompileWatcher
    from .config import AgentConfig
    from .gcpauses import GcPauses
    from .ondemand import OnDemand
    from .recorder import Recorder
    from .tracker import StepTracker

    class Agent(Protocol):
        """What the step log needs from the process's agent (runtime.Agent, which imports this
        module). Declared here so this module does not refer back to runtime: no import circle."""

        config: AgentConfig
        pid: int
        tracker: StepTracker
        recorder: Recorder | None
        ondemand: OnDemand | None
        compiles: CompileWatcher | None
        gc_pauses: GcPauses
        exit_reason: str
        hook_notes: list[str]  # --step-on targets that could not be hooked
        wall_start: float  # time.time() when the agent started
        saved_steps: int  # global step of the last step log written
        saved_stalled: bool  # ... written when the process stopped stepping (its steps are whole)
        # a whole-run record was written (write_step_log keeps it as fresh as the log)
        record_saved: bool


def save_at_exit(agent: Agent, reason: str, blocked: bool) -> None:
    """The save at exit (or at a signal): stop the recorder and on-demand capture, then write the
    step log. `blocked`: the main thread cannot run (saved by the stacks thread). Called once, under
    the agent's write lock (`Agent.flush`)."""
    agent.exit_reason = reason
    recorder = agent.recorder
    busy = recorder.busy if recorder is not None else False
    if recorder is not None:
        recorder.busy = True  # a SIGTERM arriving mid-save waits for the save
    try:
        if recorder is not None:
            recorder.stop(
                "cut short: the program exited" if reason == "exit" else f"cut short: {reason}"
            )
            if recorder.prof is not None:
                recorder.notes.append(
                    f"the window open at {reason} could not be saved: "
                    + (
                        "the main thread was blocked"
                        if blocked
                        else "it exited from another thread"
                    )
                )
        if agent.ondemand is not None:
            agent.ondemand.finish(reason)
        # (a process that never stepped writes none, unless it saved one already: it stalled at step
        # 0)
        if agent.tracker.global_step or (recorder and recorder.windows) or agent.record_saved:
            write_step_log(agent)
    except Exception as exc:
        step_log_failed(agent, exc)
    finally:
        if recorder is not None:
            recorder.busy = busy
            if not busy:
                recorder.deliver_deferred_signal()


def step_log_failed(agent: Agent, exc: BaseException) -> None:
    """One line naming the cause (stepcli.agent.output.write_failed), and profiling stops in this
    process."""
    from .output import cause, write_failed

    message = f"could not write the step log in {agent.config.log_dir}: {cause(exc)}"
    if agent.recorder is not None:
        agent.recorder.stop_after_write_failure(message)
    else:
        write_failed(message)


def write_step_log(agent: Agent, progress: str = "") -> None:
    """The step log (and at exit, or with `progress`, the whole-run record). Called from the main
    thread, or from the stacks thread (`progress`, or a signal the main thread could not take): the
    step arrays are copied first (each copy is one C call, whole under the GIL) and cut to the same
    length."""
    from .output import current_rank, worker_name

    # the launcher made it already, private
    os.makedirs(agent.config.log_dir, mode=0o700, exist_ok=True)
    worker = worker_name()
    recorder = agent.recorder
    tracker = agent.tracker
    durations, phases = tracker.durations_ns[:], bytes(tracker.phases)
    count = min(len(durations), len(phases))
    del durations[count:]
    steps = max(tracker.global_step, count - 1)
    document = {
        "schema_version": STEP_LOG_VERSION,
        "worker": worker,
        "rank": current_rank(),
        "pid": agent.pid,
        "host": _hostname(),
        "argv": list(sys.argv),
        "python": sys.version.split()[0],
        "torch": getattr(sys.modules.get("torch"), "__version__", None),
        "started_at": agent.wall_start,
        "global_steps": steps,
        "requesters": [
            {"name": r.name, "calls": r.calls, "first_step": min(r.start, steps)}
            for r in list(tracker.order)
        ],
        "durations_us": [d // 1000 for d in durations],
        "phases": "".join(map(str, phases[:count])),
        "windows": list(recorder.windows) if recorder else [],
        "skipped_windows": recorder.skipped_windows if recorder else 0,
        "notes": [*agent.hook_notes, *(recorder.notes if recorder else [])],
        # --capture-on-slow windows placed but not recorded here (the job ended first, a rank was
        # past them)
        "triggers_not_recorded": list(agent.ondemand.not_recorded)
        if agent.ondemand is not None
        else [],
        "exit": agent.exit_reason or "running",
        "saved_at": time.time(),
        "progress": progress if not agent.exit_reason else "",
        "peak_rss_bytes": _peak_rss_bytes(),
        "cuda_peak_bytes": _cuda_peak_bytes(),
        # torch's intra-op threads and the CPUs this process may run on: ranks x threads beyond a
        # host's cores slow every operator (the summary's `threads` section and its advice)
        "intra_op_threads": _intra_op_threads(),
        "cpus": _cpus(),
        "compile": agent.compiles.to_log() if agent.compiles is not None else None,
        "gc": agent.gc_pauses.to_log(),
        # the CUDA memory snapshots it wrote (--memory; the module is loaded only then)
        "memory_snapshots": list(
            getattr(sys.modules.get(f"{__package__}.cudamemory"), "WRITTEN", [])
        ),
    }
    if agent.config.run_key:
        from stepcli.runfolder.layout import SIGNATURE_KEY

        from .signing import sign

        document[SIGNATURE_KEY] = sign(agent.config.run_key, document)
    # Named by host and pid, not worker: the worker name changes when a rank appears.
    name = f"{document['host']}.{agent.pid}{STEP_LOG_SUFFIX}"  # hosts may share -o and reuse pids
    atomic_write_json(
        os.path.join(agent.config.log_dir, name), document, 0o600, private_folder=True
    )
    agent.saved_steps = steps
    agent.saved_stalled = progress == "stalled"
    # The whole run's step times, compact (steprecord.py): at exit, with each progress save, and,
    # once one was written, with every log after it (a window's save), so that a process killed
    # later leaves the two agreeing. On the main thread (a window's save) a long run's record costs
    # too much to build each time: the stale one is removed instead, until the next progress save or
    # the exit writes it again.
    if agent.exit_reason or progress or agent.record_saved:
        from . import steprecord

        if not (agent.exit_reason or progress) and count > steprecord.REBUILT_WITH_WINDOWS:
            steprecord.remove(agent.config.log_dir, _hostname(), agent.pid)
            return
        record = steprecord.build(durations, worker, current_rank())
        if agent.config.run_key:
            from stepcli.runfolder.layout import SIGNATURE_KEY

            from .signing import sign

            record[SIGNATURE_KEY] = sign(agent.config.run_key, record)
        steprecord.write(agent.config.log_dir, _hostname(), agent.pid, record)
        agent.record_saved = True


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _peak_rss_bytes() -> int | None:
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except Exception:
        return None


def _intra_op_threads() -> int | None:
    """torch.get_num_threads() of this process (OMP_NUM_THREADS, torch.set_num_threads), if torch is
    loaded."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:
        return None


def _cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity mask; taskset, cgroups' cpusets), else all of
    them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count()
        return list(range(count)) if count else None


def _cuda_peak_bytes() -> int | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated())
    except Exception:
        pass
    return None
