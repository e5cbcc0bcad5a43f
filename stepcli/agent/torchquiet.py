"""stepcli's own profiler calls leave the program as they found it: no warning of torch's in its
stderr, and no CUPTI left subscribed after a window. Runs inside the target: standard library only.

torch.profiler warns "Profiler clears events at the end of each cycle" (once per process,
`_warn_once`) when one of its objects prepares a second trace, which stepcli's windows do on a GPU.
That is advice for code that reads `key_averages()` across cycles; stepcli saves each cycle as it
ends, so it is noise in the program's stderr. Only that message is silenced, only while stepcli
calls the profiler, and torch's memory of having shown it is undone, so the program's own profiler
still warns as it would without stepcli.

Kineto leaves CUPTI subscribed after a session unless `TEARDOWN_CUPTI=1` (libkineto reads it at each
stop): its runtime callbacks then stay on for every later kernel launch, which on a launch-bound GPU
loop made the steps after a window 1.14x-1.40x slower than the plain program's (issue 31; measured
by scripts/gpu_check.py). stepcli asks for the teardown before its first window, unless the
program's environment already says (torch itself sets `TEARDOWN_CUPTI=0` when inductor's CUDA graphs
need CUPTI to stay).
"""

from __future__ import annotations

import os
import sys
import warnings

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CLEARS_EVENTS = "Warning: Profiler clears events at the end of each cycle"


def ask_cupti_teardown() -> None:
    """`TEARDOWN_CUPTI=1` unless the environment already sets it (the user's or torch's choice
    wins)."""
    os.environ.setdefault("TEARDOWN_CUPTI", "1")


class QuietProfiler:
    """A `with` block around stepcli's own calls into torch.profiler: the cycle warning is not
    shown."""

    __slots__ = ("_catcher", "_shown_before")

    def __init__(self) -> None:
        self._catcher: Any = None
        self._shown_before = True

    def __enter__(self) -> None:
        self._shown_before = _already_shown()
        self._catcher = warnings.catch_warnings()
        self._catcher.__enter__()
        warnings.filterwarnings("ignore", message=CLEARS_EVENTS)

    def __exit__(self, *exc: object) -> None:
        self._catcher.__exit__(*exc)
        if not self._shown_before:
            _forget_shown()


def _shown_set() -> Any:
    module = sys.modules.get("torch.profiler.profiler")
    shown = getattr(module, "_WARNINGS_SHOWN", None)
    return shown if isinstance(shown, set) else None


def _already_shown() -> bool:
    shown = _shown_set()
    return shown is None or any(isinstance(m, str) and m.startswith(CLEARS_EVENTS) for m in shown)


def _forget_shown() -> None:
    """torch's `_warn_once` remembered the message we hid: forget it, so the program's own use still
    warns."""
    shown = _shown_set()
    if shown is not None:
        for message in [m for m in shown if isinstance(m, str) and m.startswith(CLEARS_EVENTS)]:
            shown.discard(message)
