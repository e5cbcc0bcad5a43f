"""`stepcli table` (with its culprit), `merge` and `report` on synthetic jobs of growing size (scripts/make_job.py).

Usage: python scripts/bench_job.py [--ranks 8 64 256 1024] [--steps 4] [--collectives 8] [--workdir DIR]
       [--repeat 1] [--keep]

For each size: the job is written (one planted late rank, one rank with a shifted clock), then each command runs
in its own process with the checkout's stepcli; printed per command: wall seconds and peak RSS summed over its
process tree (scripts/bench_table.py's `measure`, best of --repeat), the input's size, and whether `table --json`
names the planted rank as the culprit. Each size's folder is deleted after it is measured, unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_table import measure, stepcli_cmd  # noqa: E402 (beside this script)
from make_job import write_job  # noqa: E402

MIB = 1024 * 1024


def culprit_of(folder: Path) -> int | None:
    """The rank `stepcli table --json` names as the culprit, or None."""
    proc = subprocess.run(stepcli_cmd("table", "--json", str(folder)), capture_output=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        return None
    found = (json.loads(proc.stdout).get("culprit") or {}).get("culprit") or {}
    rank = found.get("rank")
    return rank if isinstance(rank, int) else None


def best(argv: list[str], repeat: int, output: Path) -> tuple[float, int]:
    """Best wall time and that run's peak RSS of `repeat` runs (exits on a failure); `output` is removed before
    each (merge never writes over a file)."""
    runs = []
    for _ in range(max(1, repeat)):
        output.unlink(missing_ok=True)
        wall, rss, code = measure(argv)
        if code != 0:
            raise SystemExit(f"{' '.join(argv[3:6])}: exit {code}")
        runs.append((wall, rss))
    return min(runs)


def main(argv: list[str] | None = None) -> int:
    assert __doc__
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--collectives", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep each size's folder and outputs")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stepcli-bench-job-"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"{args.steps} steps x {args.collectives} collectives a rank; {cores} cores; load {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>6}{'input MiB':>10}  {'command':8}{'wall s':>8}{'peak RSS MiB':>14}{'RSS/input':>10}  culprit")
    for ranks in args.ranks:
        folder = workdir / f"job-{ranks}"
        shutil.rmtree(folder, ignore_errors=True)
        t = time.perf_counter()
        planted = write_job(folder / "traces", ranks, args.steps, args.collectives)
        made = time.perf_counter() - t
        size = planted["bytes"]
        found = culprit_of(folder / "traces")
        verdict = f"rank {found} ({'planted' if found == planted['late_rank'] else 'NOT the planted'} rank)"
        commands = {
            "table": stepcli_cmd("table", "--json", str(folder / "traces")),
            "merge": stepcli_cmd("merge", str(folder / "traces"), "-o", str(folder / "merged.json")),
            "report": stepcli_cmd("report", str(folder / "traces"), "-o", str(folder / "report.html")),
        }
        merged = 0
        for label, cmd in commands.items():
            wall, rss = best(cmd, args.repeat, folder / ("report.html" if label == "report" else "merged.json"))
            if label == "merge":
                merged = (folder / "merged.json").stat().st_size
            print(
                f"{ranks:6}{size / MIB:10.1f}  {label:8}{wall:8.2f}{rss / MIB:14.0f}{rss / size:10.2f}"
                f"  {verdict if label == 'table' else ''}",
                flush=True,
            )
        print(f"{'':6}(written in {made:.1f} s; the merged trace {merged / MIB:.0f} MiB)")
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
