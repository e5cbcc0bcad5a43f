"""Benchmark stepcli's device figures against Holistic Trace Analysis on the same real GPU traces,
in one run.

Usage: python scripts/bench_gpu.py [--traces DIR] [--repeat N]

For each real trace (or folder of ranks) under --traces (default: ../shared/traces beside the
checkout), it runs in separate processes: HTA 0.5.0's temporal breakdown + communication/computation
overlap + kernel breakdown (`TraceAnalysis(...)`, `get_temporal_breakdown`, `get_comm_comp_overlap`,
`get_gpu_kernel_breakdown`), and `stepcli table --json` (which also gives idle time by cause, launch
statistics and the operator tables). It prints each one's best wall time and best CPU time (user +
system) of --repeat runs, the two taking turns, and its peak memory (PSS summed over its processes,
in a run of its own, so that the sampling takes no CPU from the timed runs); the ratios HTA /
stepcli of the best wall times, of the best CPU times, and the median of the rounds' wall ratios
(the goal: at least 10x on traces of 100k events and more; on a machine shared with other work the
median is the steadier one); and the overlap each reports as a sanity check (HTA over the whole
trace minus its last step, stepcli over the recorded steps, so they differ a little).

Both run from compiled bytecode, as installed packages do: pip compiled HTA and its dependencies
when it installed them, and this script compiles the checkout's stepcli first (with
PYTHONDONTWRITEBYTECODE=1, as set on the project's machines, a checkout would compile every module
it imports at every start: 0.05-0.1 s that no installed stepcli spends).
"""

from __future__ import annotations

import argparse
import compileall
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import stepcli_cmd  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HTA_SCRIPT = textwrap.dedent(
    """
    import json, logging, sys, warnings
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    analysis.get_temporal_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    analysis.get_gpu_kernel_breakdown(visualize=False)
    json.dump({str(int(r)): float(p) for r, p in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"])},
              open(sys.argv[2], "w"))
    """  # noqa: E501
)


def _events(path: Path) -> int:
    """Events in a trace (or a folder of them), counted in a child: the measured commands are forked
    from this process, and a child's peak RSS counts the pages of the parent it was forked from (see
    bench_table.generate)."""
    code = (
        "import gzip, json, sys; from pathlib import Path; p = Path(sys.argv[1]); files = "
        "sorted(p.glob('*.json.gz')) if p.is_dir() else [p]; print(sum(len(json.load(gzip.open(f, "
        "'rt') if f.suffix == '.gz' else open(f))['traceEvents']) for f in files))"
    )
    return int(
        subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
        ).stdout
    )


def measure(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the command and the processes it waited for) of
    one command, with nothing else of this script running meanwhile (a sampler would take CPU from a
    command using both cores); exits on a failure."""
    import os
    import time

    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{stderr.decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime


def peak_memory(argv: list[str]) -> int:
    """Peak proportional set size (PSS) in bytes of a command's process tree, summed and sampled
    every 5 ms in a run of its own: pages the processes share (stepcli's forked children, libraries)
    count once, not per process."""
    import os
    import time

    import psutil

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root, peak = psutil.Process(proc.pid), 0
    while True:
        pid, _, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            peak = max(
                peak, sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)])
            )
        except psutil.Error:
            pass
        time.sleep(0.005)
    return peak or usage.ru_maxrss * 1024


def _rounds(commands: list[list[str]], repeat: int) -> list[list[tuple[float, float]]]:
    """Per command, its (wall, CPU) in each of `repeat` rounds, the commands taking turns
    (round-robin), so that a change of load on a shared machine hits them alike."""
    runs: list[list[tuple[float, float]]] = [[] for _ in commands]
    for _ in range(max(1, repeat)):
        for argv, mine in zip(commands, runs):
            mine.append(measure(argv))
    return runs


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def bench(target: Path, repeat: int, workdir: Path) -> tuple[str, ...]:
    """One row: name, events, HTA s/MB, stepcli s/MB, ratio, HTA and stepcli overlap of the first
    rank."""
    folder = target if target.is_dir() else workdir / target.name.split(".")[0]
    if not target.is_dir():  # HTA reads folders: one per trace
        folder.mkdir(exist_ok=True)
        link = folder / target.name
        if not link.exists():
            link.symlink_to(target)
    script = workdir / "hta_bench.py"
    script.write_text(HTA_SCRIPT)
    overlap_file = workdir / "overlap.json"
    commands = [
        [sys.executable, str(script), str(folder), str(overlap_file)],
        stepcli_cmd("table", "--json", str(target)),
    ]
    hta, ours_runs = _rounds(commands, repeat)
    hta_s, hta_cpu = min(w for w, _ in hta), min(c for _, c in hta)
    stepcli_s, stepcli_cpu = min(w for w, _ in ours_runs), min(c for _, c in ours_runs)
    median_ratio = _median([h[0] / o[0] for h, o in zip(hta, ours_runs)])
    hta_rss, stepcli_rss = (peak_memory(argv) for argv in commands)
    hta_overlap = json.loads(overlap_file.read_text())
    table = subprocess.run(
        stepcli_cmd("table", "--json", str(target)), capture_output=True, text=True, check=True
    )
    ranks = json.loads(table.stdout)["ranks"]
    mine = {str(r["rank"]): r["device"]["comm_overlap_share"] for r in ranks if r.get("device")}
    first = sorted(hta_overlap)[0]
    ours = mine.get(first)
    return (
        target.name,
        f"{_events(target):,}",
        f"{hta_s:.2f} s / {hta_cpu:.2f} s / {hta_rss / 2**20:.0f} MB",
        f"{stepcli_s:.2f} s / {stepcli_cpu:.2f} s / {stepcli_rss / 2**20:.0f} MB",
        f"{hta_s / stepcli_s:.1f}x / {hta_cpu / stepcli_cpu:.1f}x / {median_ratio:.1f}x",
        f"rank {first}: {hta_overlap[first]:.1f}% vs {ours * 100:.1f}%"
        if ours is not None
        else "-",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument(
        "--repeat", type=int, default=1, help="timed rounds per trace; the best are reported"
    )
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"bench_gpu: no traces at {args.traces}", file=sys.stderr)
        return 2
    targets = sorted(p for p in args.traces.iterdir() if p.name.endswith(".json.gz") or p.is_dir())
    # An installed stepcli has its modules compiled (pip writes the .pyc files), as HTA's are; a
    # checkout run with PYTHONDONTWRITEBYTECODE=1 would compile them at every start, which no user
    # pays (as scripts/bench_table.py).
    compileall.compile_dir(str(REPO / "stepcli"), quiet=1)
    header = (
        "trace",
        "events",
        "HTA (wall / CPU / peak PSS)",
        "stepcli table --json (same)",
        "HTA/stepcli wall / CPU / median",
        "overlap HTA vs stepcli",
    )
    rows = [header]
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:
        for target in targets:
            rows.append(bench(target, args.repeat, Path(tmp)))
            print("  ".join(rows[-1]), flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print()
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
