"""Leave the process without the interpreter's teardown.

At a normal exit Python frees every module and object one by one and runs a last garbage collection: with numpy,
msgspec, click and a trace's tables loaded that is ~75 ms, 15% of `stepcli table` on a 100k-event trace, spent on
memory the operating system takes back at once anyway. The `stepcli` command therefore ends with os._exit, after
doing what the teardown would have done that anyone can see: the atexit handlers run (logging, multiprocessing,
coverage) and the standard streams are flushed. Every file stepcli writes is closed where it is written.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def quick_exit(code: int) -> NoReturn:
    """Exit with `code` now; the ordinary way (sys.exit) while other threads run, since they would be joined."""
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # a closed pipe (`| head`): nothing more to show
            pass
    os._exit(code)
