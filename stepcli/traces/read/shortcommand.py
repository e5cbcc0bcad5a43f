"""What a short command that reads traces and exits (`stepcli table`) turns off, because it costs
CPU and buys nothing.

- OpenBLAS's threads: numpy's OpenBLAS starts one thread per core when numpy is imported, and they
  spin while they wait for work, ~0.1 s of CPU of a 0.5 s `table` run on 2 cores
  (scripts/bench_gpu.py). The trace analysis does no BLAS work (no matrix products), so OpenBLAS
  gets one thread: OPENBLAS_NUM_THREADS, which it reads once, when numpy is first imported (a value
  already set is kept). Worker processes (stepcli.traces.engine) inherit it.
- The cyclic garbage collector: such a run makes almost no reference cycles, and the collector's
  passes over the modules it imports and the summary it builds (20-40 ms) would free nothing.

Both are put back on exit, for callers in the same process (tests); numpy, once imported, keeps its
one thread.

And what it starts early: one .gz trace is read and inflated by a forked process
(stepcli.traces.read.readahead) while the command imports numpy and the analysis.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator, Sequence

BLAS_THREADS = "OPENBLAS_NUM_THREADS"


@contextlib.contextmanager
def short_run() -> Iterator[None]:
    """Run the body with one OpenBLAS thread (unless numpy is already loaded or the variable is set)
    and no cyclic garbage collection."""
    set_blas = BLAS_THREADS not in os.environ
    if set_blas:
        os.environ[BLAS_THREADS] = "1"
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        if set_blas:
            os.environ.pop(BLAS_THREADS, None)


def read_ahead_one(paths: Sequence[str], jobs: int | None, scheduler: str | None) -> None:
    """Start reading the trace now when `paths` is one .gz file read here on more than one core (not
    with `--jobs 1`, which asks for one core, nor with a cluster, whose workers read it)."""
    if len(paths) != 1 or jobs == 1 or scheduler is not None or not paths[0].endswith(".gz"):
        return
    from stepcli.traces.read.forked import available_cores

    if available_cores() < 2 or not os.path.isfile(paths[0]):
        return
    from stepcli.traces.read.readahead import read_ahead

    read_ahead(paths[0])
