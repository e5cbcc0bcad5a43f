"""How often `stepcli compare` cries wolf, and how often it catches a real slowdown, on this
machine.

Runs a small program under `stepcli run --json` many times: each step sleeps SLEEP ms plus up to 20%
seeded jitter, then takes an optimizer step. Baseline runs use SLEEP; "current" runs use SLEEP * (1
+ shift) for each shift. Every baseline run is then compared with every current run of a shift (one
run per side), and 40 pairs of three-run groups (three baseline runs against three current ones) are
compared (several runs per side), with the default gate (median, --tolerance 10%, 95% confidence).
The decision is the same code `stepcli compare` runs (in process, to keep the benchmark short).

Rows: shift 0% counts false alarms (a regression verdict for an unchanged program); 25% counts
detections; 5% and 10% show what happens at and below the tolerance, where "inconclusive" is the
honest answer.

    python scripts/bench_gate.py                  # ~5 minutes on 2 cores
    python scripts/bench_gate.py --runs 4 --steps 40 --shifts 0,25
    python scripts/bench_gate.py --speed          # only time the statistics (3,000 steps per side)
"""

from __future__ import annotations

import argparse
import itertools
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

from stepcli.compare.load import load_side
from stepcli.compare.verdict import decide

PROGRAM = """
    import random
    import sys
    import time

    import torch

    sleep_ms, steps, seed = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    weight = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([weight], lr=0.1)
    for _ in range(steps):
        time.sleep((sleep_ms + rng.uniform(0.0, 0.2 * sleep_ms)) / 1000.0)
        weight.grad = torch.ones(4)
        opt.step()
"""


def record(folder: Path, script: Path, sleep_ms: float, steps: int, seed: int) -> Path:
    summary = folder / f"run-{sleep_ms:.3f}-{seed}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "stepcli",
            "run",
            "-q",
            "-o",
            str(folder / summary.stem),
            "--json",
            str(summary),
            str(script),
            str(sleep_ms),
            str(steps),
            str(seed),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return summary


def verdict(baseline: list[Path], current: list[Path]) -> str:
    base = load_side([str(p) for p in baseline])
    cur = load_side([str(p) for p in current])
    return decide(base, cur, tolerance=0.10, min_delta_ms=0.0).verdict


def rates(counts: Counter[str]) -> tuple[int, str, str, str]:
    total = sum(counts.values())
    pct = lambda key: f"{100 * counts[key] / total:.0f}%"  # noqa: E731
    return total, pct("regression"), pct("inconclusive"), pct("no_change")


def speed() -> None:
    """The statistics alone: numpy's vectorized bootstrap against the same resampling in pure
    Python."""
    import statistics

    from stepcli.compare.inference import estimate_change

    rng = random.Random(0)
    base = [[10.0 + rng.gauss(0.0, 1.0) for _ in range(3000)]]
    cur = [[10.5 + rng.gauss(0.0, 1.0) for _ in range(3000)]]
    started = time.perf_counter()
    estimate_change([base], [cur])
    vectorized = time.perf_counter() - started
    started = time.perf_counter()
    values = base[0]
    for _ in range(200):  # a tenth of the resamples of one side, i.i.d. for brevity
        statistics.median(values[rng.randrange(3000)] for _ in range(3000))
    pure = (time.perf_counter() - started) * 10 * 2
    print(
        f"3,000 steps per side, 2,000 resamples: numpy {vectorized:.2f} s for both sides; "
        f"pure Python about {pure:.1f} s (extrapolated from 200 resamples)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=6, help="runs per shift (and baseline runs)")
    parser.add_argument("--steps", type=int, default=60, help="steps per run")
    parser.add_argument("--sleep-ms", type=float, default=8.0)
    parser.add_argument("--shifts", default="0,5,10,25", help="slowdowns in percent")
    parser.add_argument("--speed", action="store_true", help="only time the statistics")
    args = parser.parse_args()
    if args.speed:
        speed()
        return
    shifts = [float(s) for s in args.shifts.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        folder = Path(tmp)
        script = folder / "sleeper.py"
        script.write_text(textwrap.dedent(PROGRAM).lstrip())
        started = time.perf_counter()
        # Interleave the runs of every shift so slow and quiet moments of the machine hit all of
        # them alike.
        plan = [(shift, i) for i in range(args.runs) for shift in [None, *shifts]]
        summaries: dict[float | None, list[Path]] = {}
        for shift, i in plan:
            sleep = args.sleep_ms * (1 + (shift or 0.0) / 100)
            seed = 1000 * i + (0 if shift is None else int(shift * 10) + 1)
            summaries.setdefault(shift, []).append(record(folder, script, sleep, args.steps, seed))
        run_time = time.perf_counter() - started
        print(
            f"{len(plan)} runs of {args.steps} steps ({args.sleep_ms:g} ms sleep + up to 20% "
            f"jitter) in {run_time:.0f} s; gate: median, --tolerance 10%, 95% confidence\n"
        )
        print(
            "| shift | 1 run per side: comparisons | regression | inconclusive | no change "
            "| 3 runs per side: comparisons | regression | inconclusive | no change |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        baseline = summaries[None]
        for shift in shifts:
            current = summaries[shift]
            single = Counter(verdict([b], [c]) for b in baseline for c in current)
            groups_b = [list(g) for g in itertools.combinations(baseline, 3)]
            groups_c = [list(g) for g in itertools.combinations(current, 3)]
            pairs = random.Random(int(shift)).sample(
                list(itertools.product(groups_b, groups_c)), min(40, len(groups_b) * len(groups_c))
            )
            several = Counter(verdict(b, c) for b, c in pairs)
            print(
                f"| {shift:g}% | "
                + " | ".join(map(str, rates(single)))
                + " | "
                + " | ".join(map(str, rates(several)))
                + " |"
            )


if __name__ == "__main__":
    main()
