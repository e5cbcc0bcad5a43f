"""`stepcli whatif` against real programs changed for real: predict from one run, make the change in
a copy of the program, measure it with `stepcli run`, compare.

Each case is a small torch program with a knob (a rank's extra work, a data loader's sleep per item,
an operator repeated k times, the bytes of an all-reduce). For every round, taken in turns so that
the machine's drift falls on both alike: the original program is run under `stepcli run`, `stepcli
whatif` predicts the change from its traces, and the changed program is run under `stepcli run` too.
Printed per case: the prediction and the measurement at the profiler's pace (the recorded steps:
`predicted_ms` against the changed run's own `measured_ms`) and at the program's pace
(`predicted_untouched_ms` against the changed run's untouched median), as medians over the rounds
with their range (the noise of repeated runs), and the error of the medians.

    python scripts/whatif_check.py                 # every case, 3 rounds (~10 minutes on 2 cores)
    python scripts/whatif_check.py --rounds 5 --cases slow_rank,off_path
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

DDP = """
    import os, time, torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import record_function
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    extra = {{0: float(os.environ.get("EXTRA0_MS", "0")), 1: float(os.environ.get("EXTRA1_MS", "0"))}}[rank] / 1000
    numel = int(os.environ.get("NUMEL", "0"))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    big = torch.ones(numel) if numel else None
    for _ in range({steps}):
        if extra:
            with record_function("extra_work"):
                time.sleep(extra)
        model(x).sum().backward()
        if big is not None:
            dist.all_reduce(big)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    del model, opt
    import gc; gc.collect()
    dist.destroy_process_group()
"""  # noqa: E501

LOADER = """
    import os, time, torch
    from torch.utils.data import DataLoader, Dataset
    SLEEP = float(os.environ.get("ITEM_SLEEP_MS", "0")) / 1000
    class Slow(Dataset):
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            if SLEEP:
                time.sleep(SLEEP)
            return torch.randn(128), torch.randn(1)
    if __name__ == "__main__":
        workers = int(os.environ.get("WORKERS", "0"))
        loader = DataLoader(Slow(), batch_size=4, num_workers=workers)
        model = torch.nn.Sequential(torch.nn.Linear(128, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, (x, y) in enumerate(loader):
            if i == {steps}:
                break
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
"""  # noqa: E501

REPEAT = """
    import os, torch
    k = int(os.environ.get("REPEAT", "8"))
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a, b = torch.randn(8, 128, 128), torch.randn(8, 128, 128)
    for _ in range({steps}):
        for _ in range(k):
            a = torch.bmm(a, b).tanh()
        model(torch.randn(64, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
"""


@dataclass
class Case:
    name: str
    program: str
    torchrun: bool
    before: dict[str, str]  # the original program's knobs
    after: dict[str, str]  # the changed program's
    change: list[str]  # whatif's flags for the same change
    steps: int = 30


def cases(delays: list[int]) -> list[Case]:
    out = []
    for delay in delays:
        out.append(
            Case(
                f"slow_rank_{delay}ms",
                DDP,
                True,
                {"EXTRA1_MS": str(delay)},
                {},
                ["--idealize-rank", "1"],
            )
        )
    out.append(
        Case(
            "slow_rank_extra_removed",
            DDP,
            True,
            {"EXTRA1_MS": "10"},
            {},
            ["--scale", "rank:1/extra_work=0"],
        )
    )
    out.append(  # off the critical path: the faster rank's extra work, which the slower rank hides
        Case(
            "off_path",
            DDP,
            True,
            {"EXTRA1_MS": "20", "EXTRA0_MS": "5"},
            {"EXTRA1_MS": "20"},
            ["--scale", "rank:0/extra_work=0"],
        )
    )
    out.append(
        Case(
            "allreduce_half",
            DDP,
            True,
            {"NUMEL": "4000000"},
            {"NUMEL": "2000000"},
            ["--comm", "0.5"],
        )
    )
    for workers in (0, 1, 2):
        out.append(
            Case(
                f"loader_sleep_{workers}_workers",
                LOADER,
                False,
                {"ITEM_SLEEP_MS": "1", "WORKERS": str(workers)},
                {"WORKERS": str(workers)},
                ["--scale", "phase:dataloader=0"],
                steps=40,
            )
        )
    out.append(
        Case(
            "bmm_halved",
            REPEAT,
            False,
            {"REPEAT": "8"},
            {"REPEAT": "4"},
            ["--scale", "aten::bmm=0.5"],
        )
    )
    return out


def run(case: Case, knobs: dict[str, str], folder: Path) -> Path:
    """The program under `stepcli run` (steps 4-6 recorded), its run folder."""
    script = folder / "program.py"
    script.write_text(textwrap.dedent(case.program.format(steps=case.steps)).lstrip())
    out = folder / f"run{len(list(folder.glob('run*')))}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **knobs}
    command = (
        ["torchrun", "--nproc-per-node", "2", str(script)]
        if case.torchrun
        else ["python", str(script)]
    )
    argv = [
        sys.executable,
        "-m",
        "stepcli",
        "run",
        "--quiet",
        "--wait",
        "3",
        "--active",
        "3",
        "-o",
        str(out),
        "--",
    ]
    subprocess.run(argv + command, env=env, check=True, cwd=folder, stdout=subprocess.DEVNULL)
    return out


def whatif(out: Path, change: list[str]) -> dict:
    answer = out.parent / f"{out.name}.whatif.json"
    done = subprocess.run(
        [sys.executable, "-m", "stepcli", "whatif", str(out), *change, "--json", str(answer)],
        stdout=subprocess.DEVNULL,
    )
    if done.returncode not in (0, 4):
        raise SystemExit(f"whatif failed on {out} (exit {done.returncode})")
    return json.loads(answer.read_text())


def check(case: Case, rounds: int) -> dict:
    predicted, predicted_untouched, measured, measured_untouched, replay_errors = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(rounds):
            doc = whatif(run(case, case.before, folder), case.change)
            changed = whatif(run(case, case.after, folder), [])
            replay_errors.append(abs(doc["replay_error"] or 0))
            if doc["verdict"] != "ok" or changed["measured_ms"] is None:
                continue
            entry = doc["changes"][0]
            predicted.append(entry["predicted_ms"])
            measured.append(changed["measured_ms"])
            if entry["predicted_untouched_ms"] is not None and changed["untouched_ms"] is not None:
                predicted_untouched.append(entry["predicted_untouched_ms"])
                measured_untouched.append(changed["untouched_ms"])
    return {
        "case": case.name,
        "change": " ".join(case.change),
        "rounds": len(predicted),
        "replay_error_max": max(replay_errors) if replay_errors else None,
        "profiled": _pair(predicted, measured),
        "untouched": _pair(predicted_untouched, measured_untouched),
    }


def _pair(predicted: list[float], measured: list[float]) -> dict:
    if not predicted:
        return {}
    p, m = statistics.median(predicted), statistics.median(measured)
    return {
        "predicted": p,
        "predicted_range": (min(predicted), max(predicted)),
        "measured": m,
        "measured_range": (min(measured), max(measured)),
        "error": (p - m) / m,
    }


def _row(result: dict, pace: str) -> str:
    pair = result[pace]
    if not pair:
        return f"| {result['case']} | {pace} | - | - | - |"
    lo_p, hi_p = pair["predicted_range"]
    lo_m, hi_m = pair["measured_range"]
    return (
        f"| {result['case']} | {pace} | {pair['predicted']:.2f} ({lo_p:.2f}-{hi_p:.2f}) | "
        f"{pair['measured']:.2f} ({lo_m:.2f}-{hi_m:.2f}) | {pair['error']:+.1%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--delays", default="2,5,10,20,40", help="ms of rank 1's extra work, one case each"
    )
    parser.add_argument("--cases", default="", help="comma-separated case names (prefixes) to run")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    chosen = [c for c in cases([int(d) for d in args.delays.split(",")]) if not args.cases or
              any(c.name.startswith(p) for p in args.cases.split(","))]  # fmt: skip
    results = []
    print("| case | pace | predicted ms/step (range) | measured ms/step (range) | error |")
    print("|---|---|---|---|---|")
    for case in chosen:
        result = check(case, args.rounds)
        results.append(result)
        print(_row(result, "profiled"))
        print(_row(result, "untouched"), flush=True)
    errors = [
        abs(r[pace]["error"]) for r in results for pace in ("profiled", "untouched") if r[pace]
    ]
    if errors:
        print(
            f"\nwhat-if error: median {statistics.median(errors):.1%}, worst {max(errors):.1%} "
            f"({len(errors)} figures)"
        )
    replay = [r["replay_error_max"] for r in results if r["replay_error_max"] is not None]
    if replay:
        print(f"replay error (unchanged): worst {max(replay):.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
