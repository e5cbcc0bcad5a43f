"""`stepcli compare A B` on two traces of many short steps, as a ratio to `stepcli table A B` on the
same traces in the same run: a long window must not stall a CI gate (issue 47: compare should take
about what reading the traces takes).

Writes two synthetic traces of --steps short steps (scripts/bench_compare_steps.py's), then takes
turns running `stepcli table A B` and `stepcli compare A B --json FILE` with this tree's code (and,
with `--against REV`, REV's in a temporary `git worktree`), and prints wall and CPU seconds (medians
of --rounds), compare's CPU time as a multiple of table's, and whether compare's JSON is
byte-identical between the trees.

    python scripts/bench_compare.py                        # 100,000 steps a trace: compare / table
    python scripts/bench_compare.py --steps 20000 --against main
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare_steps import timed_stepcli, write_trace  # noqa: E402
from bench_table import REPO, checkout, remove_checkout, short  # noqa: E402


def run(tree: Path, argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (the child's and its workers') of `python -m stepcli ARGV` with `tree`'s
    code."""
    wall, cpu, _ = timed_stepcli(tree, argv)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="recorded steps per trace")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each command, taking turns")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also time REV's code, and check compare's JSON is the same",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        work = Path(tmp)
        base, cur = work / "base.pt.trace.json", work / "cur.pt.trace.json"
        write_trace(base, args.steps, 1, 1.0)
        write_trace(cur, args.steps, 2, 1.6)
        size = base.stat().st_size / 1e6
        print(f"two traces of {args.steps:,} steps ({size:.1f} MB each)")
        trees = {"working tree": REPO}
        against = short(args.against) if args.against else ""  # (once: a branch may move meanwhile)
        if args.against:
            trees = {against: checkout(against, work / "against"), **trees}
        timings: dict[tuple[str, str], list[tuple[float, float]]] = {}
        answers: dict[str, bytes] = {}
        try:
            for _ in range(max(1, args.rounds)):
                for label, tree in trees.items():
                    answer = work / f"{len(answers)}.json"
                    for command, argv in (
                        ("table", ["table", str(base), str(cur)]),
                        ("compare", ["compare", str(base), str(cur), "--json", str(answer)]),
                    ):
                        timings.setdefault((label, command), []).append(run(tree, argv))
                    answers[label] = answer.read_bytes()
        finally:
            if args.against:
                remove_checkout(trees[against])  # (only REV's temporary tree, never this one)
    for label in trees:
        cpu = {}
        for command in ("table", "compare"):
            values = timings[(label, command)]
            wall, cpu[command] = (
                statistics.median(w for w, _ in values),
                statistics.median(c for _, c in values),
            )
            print(f"  {label:<13} {command:<8} wall {wall:7.2f} s  cpu {cpu[command]:7.2f} s")
        print(f"  {label:<13} compare / table (CPU seconds): {cpu['compare'] / cpu['table']:.2f}x")
    if args.against:
        same = len(set(answers.values())) == 1
        print(f"  compare --json byte-identical between the trees: {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
