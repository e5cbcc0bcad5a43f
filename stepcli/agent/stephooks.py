"""The step hooks: what the wrappers of patches.py tell the process's agent, and what they ask it.

One seam, declared once. `runtime.Agent` implements it (mypy checks it where the agent hands itself
to patches); the unit tests of the wrappers stand a small fake in its place (tests/fake_torch.py),
so the step counting is tested without torch or a process. Declared here, not in runtime.py, so
patches.py does not refer back to runtime, which imports it: no import circle.

Only the type checker reads it (typing is not imported at run time: the agent loads in every
profiled process).
"""

from __future__ import annotations

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable
    from typing import Any, Protocol

    from .tracker import StepTracker

    class StepHooks(Protocol):
        """The agent as the wrappers see it: its state, and the events they report."""

        # False once stepcli's own bookkeeping failed: every wrapper just calls the program
        enabled: bool
        trains: bool  # a requester armed the recorder (a --step-on function arms at its first call)
        in_step: set[int]  # requesters inside their step() now: a nested step() is the same step
        tracker: StepTracker
        # torch.compile is tracing: nothing of stepcli's in its graph
        is_compiling: Callable[[], bool]
        foreign: set[int]  # the program's own profilers now collecting

        def fail(self, what: str, exc: BaseException) -> None:
            """An error in stepcli's bookkeeping: say so once and stop profiling; the program
            carries on."""

        def arm(self) -> None:
            """The process trains: set up the recorder and the exit guards (once)."""

        def is_own_profiler(self, prof: Any) -> bool:
            """True for the profile objects stepcli drives (and while it builds one): the wrappers
            leave them be."""

        def foreign_profiler_started(self, key: int) -> None:
            """The program's profiler starts collecting: an open window of stepcli's is saved and
            steps aside."""

        def foreign_profiler_stopped(self, key: int) -> None:
            """... and stopped collecting."""

        def requester_created(
            self, key: Hashable, base_name: str, owner: object = None, arm: bool = True
        ) -> None:
            """A new source of steps (an optimizer, a profiler, a --step-on function), counted from
            now."""

        def program_profiler_entered(self, prof: Any) -> None:
            """The program's profiler object was started (it may sit idle in its schedule's
            wait)."""

        def program_profiler_left(self, prof: Any) -> None:
            """... and stopped."""

        def window_open(self) -> bool:
            """A stepcli window records now."""
