"""Progress lines on stderr for reading traces that may take seconds (`stepcli table`, `report`, the
end of `run`): a 785 MiB trace took `table` 12 s and `report` 15 s with nothing said. Nothing is
said for a read that ends within SAY_AFTER_S; after that, one line, another every TICK_S, and its
time at the end. Only where it can matter: on a terminal, or for inputs of LARGE_INPUT_BYTES or more
(a pipe or a CI log then sees it too), so small reads stay silent whatever the machine's load.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

SAY_AFTER_S = 3.0
TICK_S = 10.0
LARGE_INPUT_BYTES = 100 * 1000 * 1000


def input_bytes(paths: Sequence[str]) -> int:
    """The size of the trace files at `paths` (files, or folders walked for .json/.json.gz
    files)."""
    total = 0
    for path in paths:
        try:
            if os.path.isdir(path):
                for folder, _, names in os.walk(path):
                    total += sum(
                        os.path.getsize(os.path.join(folder, name))
                        for name in names
                        if name.endswith((".json", ".json.gz"))
                    )
            else:
                total += os.path.getsize(path)
        except OSError:
            continue
    return total


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _say(line: str) -> None:
    try:
        print(f"stepcli: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr gone: progress is not worth an error
        pass


@contextmanager
def reading(paths: Sequence[str], enabled: bool = True) -> Iterator[None]:
    """Progress of reading the traces at `paths` (see the module docstring)."""
    size = input_bytes(paths) if enabled else 0
    if not enabled or not (_is_terminal() or size >= LARGE_INPUT_BYTES):
        yield
        return
    from stepcli.fmt import size_or_dash

    what = f"reading the traces ({size_or_dash(size)})"
    done = threading.Event()
    said: list[bool] = []
    start = time.monotonic()

    def watch() -> None:
        if done.wait(SAY_AFTER_S):
            return
        said.append(True)
        _say(f"{what} ...")
        while not done.wait(TICK_S):
            _say(f"still {what}: {time.monotonic() - start:.0f} s ...")

    thread = threading.Thread(target=watch, name="stepcli-reading", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if said:
            _say(f"{what}: done in {time.monotonic() - start:.1f} s")
