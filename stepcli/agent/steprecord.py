"""The whole run's step times in a few kilobytes, whatever the number of steps: written by each
process at exit.

Runs inside the target: standard library only. `<out>/.stepcli/<run-id>/<host>.<pid>.steptimes.json`
holds:
  recent     the last RECENT step times exactly (us), from step `recent_from`
  histogram  every step but the first (start-up) in log buckets, STEP_RECORD_BUCKETS_PER_DOUBLING
             per doubling of time: {bucket: count}, bucket b holding times from 2**(b/8) us up to
             the next (a few hundred buckets at most)
  blocks     the run cut into at most BLOCKS equal runs of steps: [first step, max us, mean us]
             each, so slow steps over time show in any run length
  slowest    the SLOWEST slowest steps: [step, us]
It is built once, at exit, from the durations the tracker keeps anyway: nothing is added per step.
"""

from __future__ import annotations

import heapq
import math
import os

from stepcli.runfolder.layout import (
    STEP_RECORD_BUCKETS_PER_DOUBLING,
    STEP_RECORD_SCHEMA,
    STEP_RECORD_SUFFIX,
)

from .config import atomic_write_json

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from array import array
    from typing import Any

RECENT = 1000
BLOCKS = 200
SLOWEST = 20
# Steps up to which a window's save (on the program's main thread) rebuilds the record (about 20 ms
# at this size on the 2-core VM); past it the stale record is removed
# (stepcli.agent.steplogwriter.write_step_log)
REBUILT_WITH_WINDOWS = 100_000


def bucket(us: int) -> int:
    return int(math.log2(us) * STEP_RECORD_BUCKETS_PER_DOUBLING) if us > 1 else 0


def build(durations_ns: array[int], worker: str, rank: int | None) -> dict[str, Any]:
    """The compact record of step durations (ns) 0..n-1; step 0, start-up, only in `recent` and
    `blocks`."""
    us = [d // 1000 for d in durations_ns]
    n = len(us)
    histogram: dict[int, int] = {}
    for value in us[1:]:
        b = bucket(value)
        histogram[b] = histogram.get(b, 0) + 1
    size = max(1, math.ceil(n / BLOCKS))
    blocks = [
        [i, max(us[i : i + size]), sum(us[i : i + size]) // len(us[i : i + size])]
        for i in range(0, n, size)
    ]
    slowest = heapq.nlargest(SLOWEST, range(1, n), key=us.__getitem__)
    return {
        "schema": STEP_RECORD_SCHEMA,
        "worker": worker,
        "rank": rank,
        "steps": n,
        "recent_from": max(0, n - RECENT),
        "recent": us[-RECENT:],
        "histogram": {str(k): v for k, v in sorted(histogram.items())},
        "block_steps": size,
        "blocks": blocks,
        "slowest": [[step, us[step]] for step in sorted(slowest)],
    }


def write(log_dir: str, host: str, pid: int, record: dict[str, Any]) -> None:
    atomic_write_json(
        os.path.join(log_dir, f"{host}.{pid}{STEP_RECORD_SUFFIX}"),
        record,
        0o600,
        private_folder=True,
    )


def remove(log_dir: str, host: str, pid: int) -> None:
    try:
        os.unlink(os.path.join(log_dir, f"{host}.{pid}{STEP_RECORD_SUFFIX}"))
    except OSError:
        pass
