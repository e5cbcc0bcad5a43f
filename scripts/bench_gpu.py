"""Benchmark stepcli's device figures against Holistic Trace Analysis on the same real GPU traces, in one run.

Usage: python scripts/bench_gpu.py [--traces DIR] [--repeat N]

For each real trace (or folder of ranks) under --traces (default: ../shared/traces beside the checkout), it runs
in separate processes: HTA 0.5.0's temporal breakdown + communication/computation overlap + kernel breakdown
(`TraceAnalysis(...)`, `get_temporal_breakdown`, `get_comm_comp_overlap`, `get_gpu_kernel_breakdown`), and
`stepcli table --json` (which also gives idle time by cause, launch statistics and the operator tables). It prints
each one's wall time, CPU time (user + system) and peak RSS (the run with the least CPU time of --repeat, the two
taking turns), the ratios HTA / stepcli (the goal: at least 10x on traces of 100k events and more; on a machine
shared with other work, the CPU ratio is the steadier one), and the overlap each reports as a sanity check (HTA over
the whole trace minus its last step, stepcli over the recorded steps, so they differ a little).

Both run from compiled bytecode, as installed packages do: pip compiled HTA and its dependencies when it installed
them, and this script compiles the checkout's stepcli first (with PYTHONDONTWRITEBYTECODE=1, as set on the project's
machines, a checkout would compile every module it imports at every start: 0.05-0.1 s that no installed stepcli
spends).
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
    """
)


def _events(path: Path) -> int:
    """Events in a trace (or a folder of them), counted in a child: the measured commands are forked from this
    process, and a child's peak RSS counts the pages of the parent it was forked from (see bench_table.generate)."""
    code = (
        "import gzip, json, sys; from pathlib import Path; p = Path(sys.argv[1]); "
        "files = sorted(p.glob('*.json.gz')) if p.is_dir() else [p]; "
        "print(sum(len(json.load(gzip.open(f, 'rt') if f.suffix == '.gz' else open(f))['traceEvents']) for f in files))"
    )
    return int(
        subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    )


def measure(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system, the command and the processes it waited for) and peak RSS bytes
    (the peak of the sum over its process tree, sampled every 5 ms) of one command; exits on a failure."""
    import os
    import time

    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root, peak = psutil.Process(proc.pid), 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{proc.stderr.read().decode() if proc.stderr else ''}")
    return elapsed, usage.ru_utime + usage.ru_stime, max(peak, usage.ru_maxrss * 1024)


def _best_of_rounds(commands: list[list[str]], repeat: int) -> list[tuple[float, float, int]]:
    """Per command, its run with the least CPU time of `repeat`, the commands taking turns (round-robin), so that
    a change of load on a shared machine hits them alike (wall time there mostly measures the others)."""
    runs: list[list[tuple[float, float, int]]] = [[] for _ in commands]
    for _ in range(max(1, repeat)):
        for argv, mine in zip(commands, runs):
            mine.append(measure(argv))
    return [min(mine, key=lambda run: run[1]) for mine in runs]


def bench(target: Path, repeat: int, workdir: Path) -> tuple[str, ...]:
    """One row: name, events, HTA s/MB, stepcli s/MB, ratio, HTA and stepcli overlap of the first rank."""
    folder = target if target.is_dir() else workdir / target.name.split(".")[0]
    if not target.is_dir():  # HTA reads folders: one per trace
        folder.mkdir(exist_ok=True)
        link = folder / target.name
        if not link.exists():
            link.symlink_to(target)
    script = workdir / "hta_bench.py"
    script.write_text(HTA_SCRIPT)
    overlap_file = workdir / "overlap.json"
    (hta_s, hta_cpu, hta_rss), (stepcli_s, stepcli_cpu, stepcli_rss) = _best_of_rounds(
        [[sys.executable, str(script), str(folder), str(overlap_file)], stepcli_cmd("table", "--json", str(target))],
        repeat,
    )
    hta_overlap = json.loads(overlap_file.read_text())
    table = subprocess.run(stepcli_cmd("table", "--json", str(target)), capture_output=True, text=True, check=True)
    ranks = json.loads(table.stdout)["ranks"]
    mine = {str(r["rank"]): r["device"]["comm_overlap_share"] for r in ranks if r.get("device")}
    first = sorted(hta_overlap)[0]
    ours = mine.get(first)
    return (
        target.name,
        f"{_events(target):,}",
        f"{hta_s:.2f} s / {hta_cpu:.2f} s / {hta_rss / 2**20:.0f} MB",
        f"{stepcli_s:.2f} s / {stepcli_cpu:.2f} s / {stepcli_rss / 2**20:.0f} MB",
        f"{hta_s / stepcli_s:.1f}x / {hta_cpu / stepcli_cpu:.1f}x",
        f"rank {first}: {hta_overlap[first]:.1f}% vs {ours * 100:.1f}%" if ours is not None else "-",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the best is reported")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"bench_gpu: no traces at {args.traces}", file=sys.stderr)
        return 2
    targets = sorted(p for p in args.traces.iterdir() if p.name.endswith(".json.gz") or p.is_dir())
    # An installed stepcli has its modules compiled (pip writes the .pyc files), as HTA's are; a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would compile them at every start, which no user pays (as scripts/bench_table.py).
    compileall.compile_dir(str(REPO / "stepcli"), quiet=1)
    header = (
        "trace",
        "events",
        "HTA (wall / CPU / peak RSS)",
        "stepcli table --json (same)",
        "HTA/stepcli wall / CPU",
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
