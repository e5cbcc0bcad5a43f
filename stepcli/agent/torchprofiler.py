"""The parts of a `torch.profiler.profile` object stepcli reaches past the public API for, in one
place (torch moves them between releases): the `ProfilerStep#N` range, ended before stepcli's own
bookkeeping of a step and opened after it, so the program's step holds none of it; the clock mark
every trace carries; the CUDA sync events option.

Runs inside the target: standard library plus the program's own torch.
"""

from __future__ import annotations

from stepcli.runfolder.layout import CLOCK_KEY

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_clock: list[str] = []


def mark_clock(prof: Any) -> None:
    """Say in the trace which clock its times come from (stepcli.runfolder.layout.CLOCK_KEY): once
    per recording, while Kineto records (add_metadata is dropped outside that)."""
    if not _clock:
        import socket

        try:
            # (bytes: a text file looks up its codec in the registry, which a program's own signal
            # handler can leave unable to find "ascii"; bytes.decode("ascii") never asks it,
            # stepcli.run.subreaper.children)
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                boot = f.read(64).decode("ascii", "replace").strip()
        except OSError:  # not Linux: the host alone
            boot = ""
        _clock.append(f"{socket.gethostname()} {boot}".strip())
    try:
        prof.add_metadata(CLOCK_KEY, _clock[0])
    except Exception:  # a trace without it is aligned by its collectives, as any other tool's trace
        pass


def end_step_range(prof: Any) -> None:
    """End the profiler's `ProfilerStep#N` range now, before stepcli's bookkeeping of the step (its
    CPU-time sample, the `saving trace ...` line and the save ticker's thread), which would
    otherwise be counted in the program's step: torch's step() ends the range only when it is still
    open (`step_rec_fn` set)."""
    rec = getattr(prof, "step_rec_fn", None)
    if rec is None or not getattr(prof, "record_steps", False):
        return
    try:
        rec.__exit__(None, None, None)
    finally:
        prof.step_rec_fn = None


def step_without_range(prof: Any) -> None:
    """torch's step() (the schedule's next action: start, stop, save), without the `ProfilerStep#N`
    range it opens at its end: begin_step_range opens it once stepcli's bookkeeping of the step is
    done."""
    record_steps = getattr(prof, "record_steps", False)
    prof.record_steps = False
    try:
        prof.step()
    finally:
        prof.record_steps = record_steps


def begin_step_range(prof: Any) -> None:
    """Open `ProfilerStep#N` for the step that begins, as torch's step() does (`step_rec_fn`, which
    its step() and stop() end)."""
    if not getattr(prof, "record_steps", False) or getattr(prof, "step_rec_fn", None) is not None:
        return
    from torch.autograd import profiler as autograd_profiler

    rec = autograd_profiler.record_function(f"ProfilerStep#{prof.step_num}")
    rec.__enter__()
    prof.step_rec_fn = rec


def cuda_sync_events(profiler: Any, activities: list[Any] | None) -> dict[str, Any]:
    """`experimental_config` turning on the profiler's CUDA sync events (cudaEventRecord ->
    cudaStreamWaitEvent, the waits `stepcli whatif` joins streams by) when CUDA work is recorded and
    this torch has them; else nothing, so CPU runs and older torch build the profiler exactly as
    before."""
    cuda = getattr(getattr(profiler, "ProfilerActivity", None), "CUDA", None)
    if cuda is None:
        return {}
    try:
        recorded = activities if activities is not None else list(profiler.supported_activities())
    except Exception:
        return {}
    config_type = getattr(profiler, "_ExperimentalConfig", None)
    if cuda not in recorded or config_type is None:
        return {}
    try:
        return {"experimental_config": config_type(enable_cuda_sync_events=True)}
    except Exception:  # (TypeError: a torch without the option)
        return {}
