"""The profiler's closing stub: the last ProfilerStep#N a program's own torch.profiler opens and
closes at once when it stops, with none of the program's work in it. It is no step
(stepcli.traces.analyses.traceanalysis leaves it out as a window's cut step is left out, and says
so)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepcli.traces.read.names import STEP_PREFIX, step_of

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.read.typedcolumns import Columns

# cudaDeviceSynchronize, hipDeviceSynchronize: the profiler's stop waits for the device
_SYNC_SUFFIX = "DeviceSynchronize"


def profiler_stub(columns: Columns) -> int | None:
    """The N of the profiler's closing stub: the trace's last ProfilerStep#N when it holds none of
    the program's work while the step before it, longer, does; else None.

    A program's own torch.profiler whose schedule was still recording when the program stopped
    stepping (its loop ended, or `with profile(...)` closed) opens ProfilerStep#N at the last
    `prof.step()` and closes it at once when it stops: a step of microseconds with nothing in it,
    which would pull the minimum and the mean down. It is told by what it holds, not by its length:
    no host event of its process starts at or after its start (on any thread; a device synchronize,
    the profiler's own, aside), while the step before it holds some, so the program's work is
    recorded (a trace of steps with no operators in them, as some annotations are, loses nothing),
    and is longer than it (the stub lasts microseconds; an empty step as long as the program's is
    left as it is). A step of the program's ends where the next begins, so its last operators start
    inside it."""
    import numpy as np

    from stepcli.traces.read import typedcolumns

    names = columns.names
    is_step_name = np.array(
        [n.startswith(STEP_PREFIX) and step_of(n) is not None for n in names] or [False], bool
    )
    is_step = is_step_name[columns.name] & (columns.kind == typedcolumns.USER_ANNOTATION)
    steps = np.nonzero(is_step)[0]
    if steps.size < 2:
        return None
    numbers = np.array([step_of(names[code]) for code in columns.name[steps].tolist()], np.int64)
    last = int(numbers.max())
    sync = np.array([n.endswith(_SYNC_SUFFIX) for n in names] or [False], bool)

    # the program's host events among `where`, of `pid`
    def work(where: np.ndarray, pid: int) -> np.ndarray:
        keep = (
            (columns.kind[where] < typedcolumns.DEVICE)
            & ~sync[columns.name[where]]
            & ~is_step[where]
        )
        found: np.ndarray = where[keep & (columns.pid[where] == pid)]
        return found

    for at in steps[numbers == last].tolist():
        pid = int(columns.pid[at])
        # (few events: the trace's last ones)
        if work(np.nonzero(columns.ts >= columns.ts[at])[0], pid).size:
            return None  # something of the program's starts in it or after it
        mine = (numbers != last) & (columns.pid[steps] == pid)
        if not mine.any():
            return None
        before = steps[mine][np.argmax(numbers[mine])]  # the step before it
        lo, hi = columns.ts[before], columns.ts[before] + columns.dur[before]
        if not work(np.nonzero((columns.ts >= lo) & (columns.ts < hi))[0], pid).size:
            return None  # the step before holds no operator either: nothing says this one lacks any
        if columns.dur[at] >= columns.dur[before]:
            return None  # as long as a step of the program's: a step, whatever it holds
    return last
