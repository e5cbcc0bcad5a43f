"""`stepcli memory` on a large snapshot: wall time and peak memory against plain `pickle.load` (what torch's
`_memory_viz.py` does) of the same file, both in fresh processes.

    python scripts/bench_memory.py [--entries 2000000]

The snapshot is built like torch's: history entries whose `frames` lists share frame dicts (torch symbolizes
each distinct frame once), 20-frame Python stacks from a few dozen call sites, steps tagged.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


def build(entries: int) -> dict[str, object]:
    torch_dir = "/usr/lib/python3/site-packages/torch"
    shared = [{"filename": f"{torch_dir}/nn/modules/module.py", "line": 1700 + i, "name": f"f{i}"} for i in range(19)]
    sites = [[{"filename": "/work/train.py", "line": 10 + s, "name": "main"}, *shared] for s in range(40)]
    trace = []
    addr = 0x7F0000000000
    live: list[int] = []
    step = 0
    for i in range(entries):
        if i % 20_000 == 0:
            step += 1
        if live and i % 2:
            a = live.pop()
            trace.append({"action": "free_completed", "addr": a, "size": 4096, "stream": 0, "time_us": i})
        else:
            addr += 4096
            live.append(addr)
            trace.append(
                {
                    "action": "alloc",
                    "addr": addr,
                    "size": 4096,
                    "stream": 0,
                    "time_us": i,
                    "compile_context": "",
                    "user_metadata": f"stepcli:step={step}",
                    "frames": list(sites[i % len(sites)]),  # a list per entry, shared frame dicts
                }
            )
    return {"segments": [], "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}


def measure(argv: list[str]) -> tuple[float, int]:
    """Wall time and peak RSS of one child process (its own rusage, from wait4)."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{argv} failed with {child.returncode}")
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--write", help=argparse.SUPPRESS)  # the child that builds the file
    args = parser.parse_args()
    if args.write:
        with open(args.write, "wb") as handle:
            pickle.dump(build(args.entries), handle)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.pickle"
        # Built in a child: a forked child starts with its parent's peak RSS, which would hide the figures.
        subprocess.run([sys.executable, __file__, "--entries", str(args.entries), "--write", str(path)], check=True)
        size = os.path.getsize(path)
        print(f"snapshot: {args.entries} history entries, {size / MiB:.0f} MiB")
        ref_wall, ref_rss = measure([sys.executable, "-c", f"import pickle; pickle.load(open({str(path)!r}, 'rb'))"])
        wall, rss = measure([sys.executable, "-m", "stepcli", "memory", "--json", str(path)])
        print(f"pickle.load (reference): {ref_wall:6.2f} s, peak RSS {ref_rss / MiB:6.0f} MiB")
        print(f"stepcli memory --json:   {wall:6.2f} s, peak RSS {rss / MiB:6.0f} MiB")
        print(f"ratio: {wall / ref_wall:.2f}x the time, peak RSS {rss / size:.2f}x the file")


if __name__ == "__main__":
    main()
