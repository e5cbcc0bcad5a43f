"""The same per-file plan as stepcli.traces.engine on a Dask distributed cluster (`--scheduler tcp://host:8786`): each
file is read and summarized by a cluster worker and only the small per-file parts come back to be merged here.

An optional extra (`pip install 'stepcli[dask]'`); the workers need stepcli installed and the trace paths readable
at the same absolute paths (a shared file system).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from stepcli.errors import StepcliError

_INSTALL = "--scheduler needs Dask's distributed package: pip install 'stepcli[dask]'"


def cluster_results(
    scheduler: str, work: Callable[..., Any], files: list[str], groupings: tuple[bool, ...], shapes: bool
) -> list[Any]:
    """`work` (stepcli.traces.engine's per-file step) for every file on the cluster at `scheduler`, in file order, the
    results naming the files as given here."""
    try:
        from distributed import Client
    except ImportError:
        raise StepcliError(_INSTALL) from None
    absolute = [os.path.abspath(f) for f in files]
    try:
        client = Client(scheduler, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise StepcliError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    try:
        futures = client.map(work, absolute, groupings=groupings, shapes=shapes, pure=False)
        results = client.gather(futures)
    finally:
        client.close()
    for given, result in zip(files, results):  # name the files as the user gave them, like the local engine
        for part in result if isinstance(result, list) else [result]:
            part.path = given
    return list(results)
