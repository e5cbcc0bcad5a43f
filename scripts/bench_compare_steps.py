"""`stepcli compare` on two traces of many short recorded steps: this tree against the commit before
the per-step attribution became one array pass (stepcli/traces/analyses/stepops.py), or any REV.

Each recorded step used to be summarized alone (~1 ms of Python a step: minutes for 100,000 steps).
Writes two synthetic traces of --steps short steps (a ProfilerStep#N, a dataloader annotation, an
operator with a nested namesake, a kernel launched in the step that ends after it, an optimizer
step), runs `stepcli compare A B --markdown` with REV's code (a temporary `git worktree`) and this
tree's, in turns, and prints CPU and wall seconds, the ratio, and whether the outputs (terminal and
Markdown) are byte-identical.

    python scripts/bench_compare_steps.py  # 20,000 steps a trace (the old code: ~1 min)
    python scripts/bench_compare_steps.py --steps 100000 --rounds 1
    python scripts/bench_compare_steps.py --against HEAD~3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import REPO, checkout, remove_checkout, short  # noqa: E402


def write_trace(path: Path, steps: int, seed: int, slower: float) -> None:
    """`steps` short steps (~35 µs each), `slower` stretching the operator (the change compare
    should find)."""
    rng = random.Random(seed)
    events = []
    t = 1_700_000_000_000.0
    for step in range(steps):
        op = 20 + rng.random() * 5 * slower
        kernel = 5 + rng.random() * 2
        dur = op + 12
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": round(t, 3),
                "dur": round(dur, 3),
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "enumerate(DataLoader)#_Iter.__next__",
                "pid": 1,
                "tid": 1,
                "ts": round(t + 0.5, 3),
                "dur": 1.2,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::linear",
                "pid": 1,
                "tid": 1,
                "ts": round(t + 2, 3),
                "dur": round(op, 3),
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": round(t + 2.5, 3),
                "dur": round(op - 1, 3),
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": round(t + op, 3),
                "dur": 1.0,
                "args": {"correlation": step + 1},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "gemm",
                "pid": 0,
                "tid": 7,
                "ts": round(t + dur - 2, 3),
                "dur": round(kernel, 3),
                "args": {"correlation": step + 1},
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "Optimizer.step#SGD.step",
                "pid": 1,
                "tid": 1,
                "ts": round(t + op + 3, 3),
                "dur": 6.0,
            },
        ]
        t += dur + 1 + rng.random()
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))


def timed_stepcli(tree: Path, argv: list[str]) -> tuple[float, float, bytes]:
    """Wall seconds, CPU seconds (the child's and the workers it waited for) and the output of
    `python -m stepcli ARGV` with `tree`'s code; exits on a status other than 0, 1 or 4."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120", "NO_COLOR": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "stepcli", *argv], capture_output=True, cwd=tree, env=env
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1, 4):
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        raise SystemExit(f"stepcli {argv[0]} in {tree}: exit {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout + proc.stderr


def run(tree: Path, argv: list[str]) -> tuple[float, float, bytes]:
    """timed_stepcli's figures, and the terminal output + Markdown of a `compare ... --markdown
    FILE`."""
    markdown = Path(argv[-1])
    markdown.unlink(missing_ok=True)
    wall, cpu, output = timed_stepcli(tree, argv)
    return wall, cpu, output + markdown.read_bytes()


def before_array_pass() -> str:
    """The commit before stepcli/traces/analyses/stepops.py was added."""
    added = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            "stepcli/traces/analyses/stepops.py",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise SystemExit("stepops.py is not committed yet: give --against REV")
    return f"{added[-1]}~1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="recorded steps per trace")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, taking turns")
    parser.add_argument(
        "--against", metavar="REV", help="the code to compare with (default: before stepops.py)"
    )
    args = parser.parse_args()
    rev = args.against or before_array_pass()
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        work = Path(tmp)
        base, cur = work / "base.pt.trace.json", work / "cur.pt.trace.json"
        write_trace(base, args.steps, 1, 1.0)
        write_trace(cur, args.steps, 2, 1.6)
        size = base.stat().st_size / 1e6
        print(
            f"two traces of {args.steps:,} steps ({size:.1f} MB each); stepcli compare A B "
            f"--markdown FILE"
        )
        tree = checkout(rev, work / "against")
        try:
            argv = ["compare", str(base), str(cur), "--markdown", str(work / "report.md")]
            timings: dict[str, list[tuple[float, float]]] = {"before": [], "this tree": []}
            outputs: dict[str, bytes] = {}
            for _ in range(max(1, args.rounds)):
                for label, code in (("before", tree), ("this tree", REPO)):
                    wall, cpu, output = run(code, argv)
                    timings[label].append((wall, cpu))
                    outputs[label] = output
        finally:
            remove_checkout(tree)
    for label, values in timings.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(
            f"  {label:<10} {short(rev) if label == 'before' else 'working tree':<12} wall "
            f"{wall:8.2f} s  cpu {cpu:8.2f} s"
        )
    ratio = statistics.median(c for _, c in timings["this tree"]) / statistics.median(
        c for _, c in timings["before"]
    )
    print(f"  ratio (this tree / {short(rev)}, CPU seconds): {ratio:.3f}x")
    same = outputs["before"] == outputs["this tree"]
    print(f"  outputs (terminal and Markdown) byte-identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
