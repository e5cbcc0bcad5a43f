"""A process forked after a profiler ran in its parent must still be able to exit.

Once a profiler has started, Kineto keeps a config thread waiting on a condition variable for the
rest of the process. `fork()` copies that variable, waiter count included, but not the thread, so
the child's C++ exit handlers hang forever in Kineto's `ConfigLoader` destructor
(`pthread_cond_destroy` waits for a waiter that does not exist there). Measured on torch 2.13 with
plain `torch.profiler` too: a program that forks a helper and lets it end with `sys.exit()` never
finishes. stepcli starts the profiler in programs that never did, so it must not leave them with
that hang.

The child still runs all of Python's own exit work (atexit handlers, flushing its files); only the
native exit handlers that its parent's libraries registered before the fork are skipped, by having
`exit()` end the process with `_exit(status)` first. This is what `multiprocessing` does for its
forked children (`os._exit`) and what DataLoader workers already get. Standard library only; loaded
(with ctypes) once a profiler has started.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

_register: Callable[[], bool] | None = None  # set by prepare(), in the parent


def prepare() -> None:
    """In the process where a profiler has started: resolve now what a forked child will call, so
    that the child imports and loads nothing (a fork of a threaded process must not take the
    loader's or the import locks)."""
    global _register
    if _register is not None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        # glibc: handlers get (status, arg); run in reverse order of registration
        on_exit = libc.on_exit
        exit_now = libc._exit
    except (OSError, AttributeError):
        return
    # `_exit(status, arg)`: the extra argument is ignored by the calling conventions Linux uses, so
    # the handler ends the process with the status `exit()` was given, before handlers registered
    # earlier (Kineto's) run.
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit.restype = ctypes.c_int
    address = ctypes.cast(exit_now, ctypes.c_void_p).value
    if address is not None:

        def register() -> bool:
            return bool(on_exit(address, None) == 0)

        _register = register


def skip_inherited_native_exit_handlers() -> bool:
    """In a forked child: register `_exit` as the first native exit handler to run. False where
    prepare() could not (no glibc `on_exit`): the process then exits as it would have without
    stepcli."""
    return _register is not None and _register()
