"""`stepcli run --memory`: the CUDA allocator's memory history in every process that uses CUDA, and
its snapshot written into the run folder when the process runs out of CUDA memory, before the error
reaches the program.

Runs inside the target: standard library plus the program's torch. Loaded only with --memory.
Nothing here touches CUDA before the program does: the start is queued with `torch.cuda._lazy_call`,
which runs it right after the program's own first CUDA use initializes the device (starting CUDA
ourselves would break a fork that follows and could pick a device before the program sets
CUDA_VISIBLE_DEVICES). Order, as torch requires it: history first (it initializes the caching
allocator), then the out-of-memory observer (attaching one to an allocator not yet initialized
crashed torch, pytorch#102796).
"""

from __future__ import annotations

import os
import sys
import threading

from stepcli.runfolder.layout import (
    NO_CUDA_MARKER,
    ON_DEMAND_PREFIX,
    SNAPSHOT_KEY,
    SNAPSHOT_PREFIX,
    SNAPSHOT_SUFFIX,
)

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, ModuleType
    from typing import Any, Protocol

    from .config import AgentConfig
    from .tracker import StepTracker

    class Agent(Protocol):
        """What this module needs from the process's agent (runtime.Agent, which imports this
        module)."""

        config: AgentConfig
        pid: int
        enabled: bool
        tracker: StepTracker
        in_step: set[int]


# each allocation's `user_metadata` in the snapshot: the global step it was made in
STEP_TAG = "stepcli:step="
_OPTIMIZER_PATH = "/torch/optim/"
_BACKWARD_FUNCTIONS = frozenset({"backward", "_engine_run_backward", "run_backward", "grad"})


class MemoryHistory:
    """Records CUDA allocator history in this process and dumps it on the first out-of-memory
    error."""

    def __init__(self, agent: Agent, torch: ModuleType, max_entries: int) -> None:
        self.agent = agent
        self.torch = torch
        self.max_entries = max_entries
        self.started = False
        self.written: str | None = None

    def install(self) -> None:
        """Queue the start for the program's first CUDA use; on a torch without CUDA, say so once
        per run."""
        torch = self.torch
        if not hasattr(torch._C, "_cuda_record_memory_history"):
            self._say_no_cuda()
            return
        torch.cuda._lazy_call(self._start)

    def _say_no_cuda(self) -> None:
        """One line for the whole run, whichever process imports torch first (an exclusive marker
        file)."""
        try:
            from stepcli import safefile

            fd = safefile.create_new(
                os.path.join(self.agent.config.log_dir, NO_CUDA_MARKER), safefile.PRIVATE
            )
        except OSError:
            return
        os.close(fd)
        version = getattr(self.torch, "__version__", "?")
        _say(
            f"--memory: this torch ({version}) has no CUDA: no CUDA memory to record; the run goes "
            f"on without it"
        )

    def _start(self) -> None:
        """Runs inside torch.cuda's lazy initialization: it must never raise (that would fail the
        program's call)."""
        if self.started or not self.agent.enabled:
            return
        try:
            memory = self.torch.cuda.memory
            memory._record_memory_history(
                max_entries=self.max_entries, context="alloc", stacks="python"
            )
            self.torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
            self.started = True
            if hasattr(memory, "_set_memory_metadata"):
                self._tag_step(self.agent.tracker.global_step)
                self.agent.tracker.add_step_callback(self._tag_step)
        except Exception as exc:
            _say(
                f"--memory: could not start CUDA memory history ({type(exc).__name__}: {exc}); the "
                f"run goes on"
            )

    def _tag_step(self, step: int) -> None:
        """Tag the allocations that follow with the global step (one C call per step, only with
        --memory)."""
        try:
            self.torch.cuda.memory._set_memory_metadata(f"{STEP_TAG}{step}")
        except Exception:
            pass

    def _on_oom(self, device: int, requested: int, device_total: int, device_free: int) -> None:
        """torch's observer, called before the OutOfMemoryError is raised and before anything is
        freed. Never raises: the program gets its error unchanged."""
        if self.written is not None or os.getpid() != self.agent.pid:
            return
        try:
            snapshot = self.torch.cuda.memory._snapshot()
            snapshot[SNAPSHOT_KEY] = {
                "version": 1,
                "step": self.agent.tracker.global_step,
                "phase": current_phase(self.agent.in_step),
                "device": int(device),
                "requested_bytes": int(requested),
                "device_total_bytes": int(device_total),
                "device_free_bytes": int(device_free),
                "pid": os.getpid(),
                "argv": list(sys.argv),
                "max_entries": self.max_entries,
            }
            self.written = _write_snapshot(self.agent.config.out_dir, snapshot)
            info = snapshot[SNAPSHOT_KEY]
            _say(
                f"out of CUDA memory at step {info['step']} ({info['phase']}): memory snapshot "
                f"saved to {self.written} (read it with `stepcli memory {self.written}`)"
            )
        except Exception as exc:
            self.written = ""
            _say(f"--memory: could not save the CUDA memory snapshot: {type(exc).__name__}: {exc}")


def current_phase(in_step: set[int], frame: FrameType | None = None) -> str:
    """forward, backward, optimizer or other: what the main thread is doing now, from its Python
    stack.

    An optimizer step is known from the tracker's wrappers (`in_step`); backward from autograd's
    entry points on the stack (the main thread waits there while autograd's device threads run);
    forward from a module call. The outermost match wins: a module re-run by activation
    checkpointing inside backward is backward.
    """
    if in_step:
        return "optimizer"
    if frame is None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
    phase = "other"
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename.replace("\\", "/")
        if _OPTIMIZER_PATH in filename:
            phase = "optimizer"
        elif code.co_name in _BACKWARD_FUNCTIONS and (
            "/torch/autograd/" in filename or "/torch/_tensor" in filename
        ):
            phase = "backward"
        elif code.co_name in ("_call_impl", "_wrapped_call_impl") and filename.endswith(
            "/torch/nn/modules/module.py"
        ):
            phase = "forward"
        frame = frame.f_back
    return phase


# the snapshot files this process wrote (names in the output folder), for its step log
WRITTEN: list[str] = []


def snapshot_name(worker: str) -> str:
    """`oom-rank<N>.pickle` in distributed runs, else `oom-<host>_<pid>.pickle`."""
    return f"{SNAPSHOT_PREFIX}{worker}{SNAPSHOT_SUFFIX}"


def _write_snapshot(out_dir: str, snapshot: dict[str, Any]) -> str:
    """Pickle into a new private file (0600: it holds allocation stacks and argv) under a random
    temporary name, then link it to its name, which never replaces anything: a reader never sees
    half a file; an existing file is kept (a restarted rank writing into the same folder gets a name
    with the time)."""
    import pickle
    import time

    from stepcli import safefile

    from .output import worker_name

    worker = worker_name()
    snapshot[SNAPSHOT_KEY]["worker"] = worker
    fd, tmp = safefile.create_temp(out_dir, snapshot_name(worker), safefile.PRIVATE)
    try:
        with open(fd, "wb") as handle:
            pickle.dump(snapshot, handle, protocol=pickle.DEFAULT_PROTOCOL)
        path = os.path.join(out_dir, snapshot_name(worker))
        try:
            safefile.publish(tmp, path, replace=False)
        except FileExistsError:
            path = os.path.join(out_dir, snapshot_name(f"{worker}.{time.time_ns()}"))
            safefile.publish(tmp, path, replace=False)
    finally:
        safefile.remove(tmp)
    WRITTEN.append(os.path.basename(path))
    return path


def dump_now(agent: Agent, torch: ModuleType | None) -> dict[str, Any]:
    """`stepcli capture --memory-snapshot`, on this process's dump thread: the allocator's snapshot
    now, in the OOM snapshot's layout, as `memory-<worker>-<n>.pickle` in the run folder. Never
    starts CUDA: a process that has not used it answers that it has no CUDA memory. Returns the
    answer: snapshot path (or None), history, reason."""
    answer: dict[str, Any] = {
        "snapshot": None,
        "history": False,
        "reason": None,
        "step": agent.tracker.global_step,
    }
    if torch is None or not hasattr(torch._C, "_cuda_record_memory_history"):
        answer["reason"] = (
            "no CUDA memory (its torch has no CUDA)" if torch is not None else "no CUDA memory"
        )
        return answer
    if not torch.cuda.is_initialized():
        answer["reason"] = "no CUDA memory (it has not used CUDA)"
        return answer
    try:
        snapshot = torch.cuda.memory._snapshot()
        snapshot[SNAPSHOT_KEY] = {
            "version": 1,
            "on_demand": True,
            "step": agent.tracker.global_step,
            "phase": current_phase(getattr(agent, "in_step", set())),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "max_entries": getattr(agent.config, "memory_entries", 0),
        }
        answer["history"] = any(bool(trace) for trace in snapshot.get("device_traces") or [])
        answer["phase"] = snapshot[SNAPSHOT_KEY]["phase"]
        answer["snapshot"] = _write_numbered(agent.config.out_dir, snapshot)
    except Exception as exc:
        answer["reason"] = f"could not take the snapshot: {type(exc).__name__}: {exc}"
    return answer


def _write_numbered(out_dir: str, snapshot: dict[str, Any]) -> str:
    """`memory-<worker>-<n>.pickle` with the first n free: written once under a temporary name, then
    hard-linked to a name that does not exist yet (a link never replaces a file), so nothing is ever
    overwritten."""
    import pickle

    from stepcli import safefile

    from .output import worker_name

    worker = worker_name()
    snapshot[SNAPSHOT_KEY]["worker"] = worker
    # 0600: stacks, argv
    fd, tmp = safefile.create_temp(out_dir, f"{ON_DEMAND_PREFIX}{worker}", safefile.PRIVATE)
    try:
        with open(fd, "wb") as handle:
            pickle.dump(snapshot, handle, protocol=pickle.DEFAULT_PROTOCOL)
        for n in range(1, 1_000_000):
            path = os.path.join(out_dir, f"{ON_DEMAND_PREFIX}{worker}-{n}{SNAPSHOT_SUFFIX}")
            try:
                os.link(tmp, path, follow_symlinks=False)
                WRITTEN.append(os.path.basename(path))
                return path
            except FileExistsError:
                continue
        raise OSError(f"{out_dir}: no free {ON_DEMAND_PREFIX}{worker}-<n>{SNAPSHOT_SUFFIX} name")
    finally:
        safefile.remove(tmp)


def _say(message: str) -> None:
    from .output import say

    say(message)


def install(agent: Agent, torch: ModuleType, max_entries: int) -> MemoryHistory:
    """Called once the program imports torch, only with --memory."""
    history = MemoryHistory(agent, torch, max_entries)
    history.install()
    return history
