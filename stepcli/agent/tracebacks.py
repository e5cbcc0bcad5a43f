"""The program's tracebacks as plain python prints them: without the frames of stepcli's own
wrappers.

Runs inside the target: standard library only. The patched `optimizer.step`, `profiler.step` and
`--step-on` functions call the program's code, so an exception raised there (Ctrl-C's
KeyboardInterrupt, the program's own errors) passes through a stepcli frame. A `sys.excepthook` that
drops those frames (every file of stepcli/agent and stepcli/_bootstrap) before the hook it replaced
prints the traceback; a hook the program sets itself replaces ours.
"""

from __future__ import annotations

import os
import sys

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

_OURS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
    for name in ("agent", "_bootstrap")
)


def is_ours(filename: str) -> bool:
    return filename.startswith(_OURS)


def without_our_frames(tb: TracebackType | None) -> TracebackType | None:
    """The same traceback less the entries of stepcli's own files (new entries: the frames are
    untouched)."""
    from types import TracebackType

    kept = []
    while tb is not None:
        if not is_ours(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out: TracebackType | None = None
    for entry in reversed(kept):
        out = TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def install() -> None:
    """Wrap the interpreter's default hook (only that one: a hook someone set stays as it is)."""
    if sys.excepthook is not sys.__excepthook__:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        # torchrun stopped by a signal: one line, not 30 of torchrun's own frames
        if _launcher_stopped(kind):
            sigval = getattr(value, "sigval", None)
            name = getattr(sigval, "name", None) or str(sigval)
            try:
                sys.stderr.write(
                    f"{kind.__name__}: {value} ({name}; torchrun's traceback left out by stepcli)\n"
                )
                sys.stderr.flush()
                return
            except Exception:
                pass
        try:
            seen: set[int] = set()
            current: BaseException | None = value
            # the chain: __cause__ and __context__ too
            while current is not None and id(current) not in seen:
                seen.add(id(current))
                current.__traceback__ = without_our_frames(current.__traceback__)
                current = current.__cause__ or current.__context__
            tb = value.__traceback__  # the printer reads the exception's own traceback
        except Exception:
            pass  # never lose the program's traceback over this
        previous(kind, value, tb)

    sys.excepthook = hook


def _launcher_stopped(kind: type[BaseException]) -> bool:
    """torch.distributed.elastic's SignalException: torchrun's agent got SIGTERM/SIGINT/SIGHUP (from
    `--on-hang kill`, a forwarded signal, a scheduler). It is the launcher's own shutdown, never the
    program's error: its traceback only lists torchrun's frames."""
    return kind.__name__ == "SignalException" and kind.__module__.startswith(
        "torch.distributed.elastic"
    )
