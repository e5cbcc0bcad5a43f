"""What a window's trace costs: its size and the pause its save puts into the program, said once
when large, with the cheaper way; and a line every few seconds while a long save runs, so a frozen
program is explained.

Two LSTM steps made a 785 MiB trace: saving it paused the program 31.6 s, and the summary, `table`
and `report` then read it for 12-20 s each, with nothing said. After the first window, its size and
pause are what every later window will cost (the same steps, the same options): when large, one line
says so and what makes it cheaper, and the process keeps it as a note, which the run summary shows
(terminal, `--json`, report.html) as it was said.

Runs inside the target: standard library only.
"""

from __future__ import annotations

import threading
import time

from .output import human_size, rank_prefix, say

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .config import AgentConfig

# a trace this large takes seconds to save and to read back (table, report)
LARGE_BYTES = 200 * 1000 * 1000
# a save this long is a pause the program's users notice (a step, a collective timeout)
LONG_PAUSE_S = 10.0
TICK_S = 5.0  # while a save runs, a line this often


def is_large(size: int, pause_s: float | None) -> bool:
    return size > LARGE_BYTES or (pause_s is not None and pause_s > LONG_PAUSE_S)


def cheaper_ways(config: AgentConfig) -> list[str]:
    """The options of this run that make a window's trace smaller, as the user would change them."""
    ways = []
    if config.schedule.active > 1:
        ways.append(f"--active 1 (now {config.schedule.active})")
    flags = (
        ("--with-stack", config.with_stack),
        ("--record-shapes", config.record_shapes),
        ("--profile-memory", config.profile_memory),
    )
    ways += [f"no {flag}" for flag, on in flags if on]
    if config.memory_entries:
        ways.append("--memory off")
    return ways


def cost_line(steps: str, size: int, pause_s: float | None, config: AgentConfig) -> str:
    """One line: the window's trace is large (its size, the pause), every later window costs the
    same, and what makes it cheaper (or that the steps themselves are large, when no option of this
    run is to blame)."""
    pause = f" and saving it paused the program {pause_s:.1f} s" if pause_s is not None else ""
    later = "; each later window costs about the same" if config.schedule.repeat != 1 else ""
    ways = cheaper_ways(config)
    cheaper = (
        "cheaper: " + ", ".join(ways)
        if ways
        else "its steps alone are this large: record them with --on-demand only when needed"
    )
    return (
        f"the trace of {steps} is {human_size(size)}{pause}{later}; the summary, `stepcli table` "
        f"and `stepcli report` read it for about as long; {cheaper}"
    )


def first_window_cost(windows: list[dict[str, Any]], steps: str, config: AgentConfig) -> str:
    """After the first window is saved (the only one in `windows`), its cost line when large, else
    ""."""
    if len(windows) != 1:
        return ""
    size, pause = windows[0]["bytes"], windows[0].get("save_s")
    return cost_line(steps, size, pause, config) if is_large(size, pause) else ""


class SaveTicker:
    """`still saving the trace of steps A-B (10 s)` every TICK_S seconds until `stop()`: a long save
    is a frozen program, and the line says why. A daemon thread; it says nothing for a save shorter
    than TICK_S."""

    def __init__(self, steps: str) -> None:
        self._done = threading.Event()
        self._steps = steps
        self._thread = threading.Thread(target=self._run, name="stepcli-save-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        waited = 0.0
        while not self._done.wait(TICK_S):
            waited += TICK_S
            say(f"{rank_prefix()}still saving the trace of {self._steps} ({waited:.0f} s) ...")

    def stop(self) -> None:
        self._done.set()


def took(pause_s: float | None) -> str:
    """` in 31.6 s` for the `saved trace` line when the save took a second or more."""
    return f" in {pause_s:.1f} s" if pause_s is not None and pause_s >= 1.0 else ""


class SaveClock:
    """Times a window's save from its announcement (stopping the profiler, writing the file) and,
    with the steps to name, keeps a SaveTicker running meanwhile."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._ticker: SaveTicker | None = None

    def start(self, steps: str | None) -> None:
        self._started = time.perf_counter()
        if steps is not None:
            self._ticker = SaveTicker(steps)

    def stop(self) -> float | None:
        """The seconds since `start` (None when not started), the ticker stopped."""
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None
        started, self._started = self._started, None
        return None if started is None else time.perf_counter() - started
