"""A process forked after a profiler ran in its parent must still be able to exit.

Once a profiler has started, Kineto keeps a config thread waiting on a condition variable for the rest of the
process. `fork()` copies that variable, waiter count included, but not the thread, so the child's C++ exit handlers
hang forever in Kineto's `ConfigLoader` destructor (`pthread_cond_destroy` waits for a waiter that does not exist
there). Measured on torch 2.13 with plain `torch.profiler` too: a program that forks a helper and lets it end with
`sys.exit()` never finishes. stepcli starts the profiler in programs that never did, so it must not leave them
with that hang.

The child still runs all of Python's own exit work (atexit handlers, flushing its files); only the native exit
handlers that its parent's libraries registered before the fork are skipped, by having `exit()` end the process
with `_exit(status)` first. This is what `multiprocessing` does for its forked children (`os._exit`) and what
DataLoader workers already get. Standard library only; loaded only in such children.
"""

from __future__ import annotations

import sys


def skip_inherited_native_exit_handlers() -> bool:
    """Register `_exit` as the first native exit handler to run in this (forked) process. False where the C
    library cannot (no glibc `on_exit`): the process then exits as it would have without stepcli."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        on_exit = libc.on_exit  # glibc: handlers get (status, arg); run in reverse order of registration
        exit_now = libc._exit
    except (OSError, AttributeError):
        return False
    # `_exit(status, arg)`: the extra argument is ignored by the calling conventions Linux uses, so the handler
    # ends the process with the status `exit()` was given, before handlers registered earlier (Kineto's) run.
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit.restype = ctypes.c_int
    address = ctypes.cast(exit_now, ctypes.c_void_p).value
    return address is not None and on_exit(address, None) == 0
