"""`stepcli memory` on a large snapshot: wall time and peak memory of the streaming reader against
the C unpickler's reading (`load_snapshot(streamed=False)`, what stepcli did before) and plain
`pickle.load` (what torch's `_memory_viz.py` does) of the same file, each in a fresh process.

    python scripts/bench_memory.py [--entries 2000000] [--shape shared|torch] [--keep FILE]

`--shape shared` (the default): each allocation's frames list is shared by its alloc, free_requested
and free_completed events, frame dicts are shared by all lists (each distinct frame once), 20-frame
Python stacks from a few hundred call sites, steps tagged. `--shape torch`: what torch 2.11 writes
(the H200 snapshots of tests/data/gpu): every event and block its own frames list of its own frame
dicts, only the strings shared (tests/memory_snapshots.py `torch_shaped`); 62,000 events make the 12
MB of issue 47's long job, 500,000 about 95 MB.
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


def build_torch_shaped(entries: int) -> dict[str, object]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import memory_snapshots  # the tests' builder: one definition of torch's layout

    return memory_snapshots.torch_shaped(entries)


def build(entries: int) -> dict[str, object]:
    torch_dir = "/usr/lib/python3/site-packages/torch"
    shared = [
        {"name": f"f{i}", "filename": f"{torch_dir}/nn/modules/module.py", "line": 1700 + i}
        for i in range(19)
    ]
    sites = [
        [{"name": "main", "filename": "/work/train.py", "line": 10 + s}, *shared]
        for s in range(400)
    ]
    trace: list[dict[str, object]] = []
    addr = 0x7F0000000000
    live: list[tuple[int, list[dict[str, object]]]] = []
    step = 0
    i = 0
    while len(trace) < entries:
        i += 1
        if i % 7_000 == 0:
            step += 1
        metadata = f"stepcli:step={step}"
        if live and i % 2:
            a, frames = live.pop()
            for action in ("free_requested", "free_completed"):
                trace.append(_entry(action, a, len(trace), metadata, frames))
        else:
            addr += 4096
            frames = list(sites[i % len(sites)])  # one list per allocation, shared by its events
            live.append((addr, frames))
            trace.append(_entry("alloc", addr, len(trace), metadata, frames))
    return {
        "segments": [],
        "device_traces": [trace],
        "allocator_settings": {},
        "external_annotations": [],
    }


def _entry(
    action: str, addr: int, time_us: int, metadata: str, frames: object
) -> dict[str, object]:
    return {
        "action": action,
        "addr": addr,
        "size": 4096,
        "stream": 0,
        "time_us": time_us,
        "compile_context": "",
        "user_metadata": metadata,
        "frames": frames,
    }


def measure(argv: list[str]) -> tuple[float, float, int]:
    """Wall time, CPU time (what a shared machine's load does not inflate) and peak RSS of one child
    process (its own rusage, from wait4)."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{argv} failed with {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument(
        "--shape", choices=("shared", "torch"), default="shared", help="the layout (see above)"
    )
    parser.add_argument("--keep", help="write the snapshot here (and reuse it if it exists)")
    parser.add_argument("--write", help=argparse.SUPPRESS)  # the child that builds the file
    args = parser.parse_args()
    if args.write:
        with open(args.write, "wb") as handle:
            pickle.dump(
                (build_torch_shaped if args.shape == "torch" else build)(args.entries), handle
            )
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.keep or Path(folder) / "big.pickle")
        if not path.exists():
            # Built in a child: a forked child starts with its parent's peak RSS, which would hide
            # the figures.
            child = [
                sys.executable,
                __file__,
                "--entries",
                str(args.entries),
                "--shape",
                args.shape,
            ]
            subprocess.run([*child, "--write", str(path)], check=True)
        size = os.path.getsize(path)
        print(f"snapshot ({args.shape}-shaped, {args.entries} events): {size / MiB:.0f} MiB")
        old = (
            "import sys; from stepcli.snapshots.snapshotfigures import analyze; from "
            "stepcli.snapshots.snapshotreader import load_snapshot; "
            "analyze(load_snapshot(sys.argv[1], streamed=False))"
        )
        runs = {
            "pickle.load (torch's reading)": f"import pickle; pickle.load(open({str(path)!r}, "
            f"'rb'))",
            "C unpickler reader (before)": old,
            "stepcli memory --json (streamed)": None,
        }
        figures = {}
        for name, code in runs.items():
            argv = [sys.executable, "-m", "stepcli", "memory", "--json", str(path)]
            if code is not None:
                argv = [sys.executable, "-c", code, str(path)]
            figures[name] = measure(argv)
            wall, cpu, rss = figures[name]
            print(
                f"{name:34} {wall:6.2f} s ({cpu:6.2f} s CPU), peak RSS {rss / MiB:6.0f} MiB = "
                f"{rss / size:5.2f}x the file"
            )
        _wall, new_cpu, new_rss = figures["stepcli memory --json (streamed)"]
        _wall, old_cpu, old_rss = figures["C unpickler reader (before)"]
        _wall, bare_cpu, bare_rss = figures["pickle.load (torch's reading)"]
        print(
            f"streamed vs before: {new_cpu / old_cpu:.2f}x the CPU time, {new_rss / old_rss:.2f}x "
            f"the peak RSS"
        )
        print(
            f"streamed vs pickle.load: {new_cpu / bare_cpu:.2f}x the CPU time, "
            f"{new_rss / bare_rss:.2f}x the peak RSS"
        )


if __name__ == "__main__":
    main()
