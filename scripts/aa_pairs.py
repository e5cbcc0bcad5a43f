"""How often `stepcli compare` calls noise significant: N A/A pairs (the same program run twice,
nothing changed), each compared with `--json -`, counting the attribution rows (phases, operators)
marked significant and the verdicts. Attribution must hold its own false-positive rate: at most 5%
of rows significant at the default 95%.

    python scripts/aa_pairs.py --pairs 10  # the demo: stepcli demo --active 20 -- --iterations 100
    python scripts/aa_pairs.py --pairs 6 --ddp  # a 2-rank gloo DDP job under torchrun
    python scripts/aa_pairs.py --runs-dir /tmp/aa  # keep the runs there; a second call reuses them

Runs are made one after the other, A and B of a pair back to back (the machine's load drifts between
pairs, as on a CI runner). Prints one line per pair and the totals; exit 1 when more than --max-rate
of rows were significant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

DDP = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 128), torch.randint(0, 8, (64,))
for _ in range(100):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.barrier()
del model, opt
import gc; gc.collect()
dist.destroy_process_group()
"""  # noqa: E501


def _stepcli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepcli", *args], capture_output=True, text=True, env=env
    )


def make_run(folder: Path, name: str, ddp: bool, env: dict[str, str]) -> Path:
    """One run into folder/name (and its --json folder/name.json), unless it is there already."""
    summary = folder / f"{name}.json"
    if summary.exists():
        return summary
    out = folder / name
    if out.exists():
        shutil.rmtree(out)
    common = ["-q", "--active", "20", "--no-report", "-o", str(out), "--json", str(summary)]
    if ddp:
        script = folder / "ddp.py"
        script.write_text(textwrap.dedent(DDP))
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        args = [
            "run",
            *common,
            "--",
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
        ]
    else:
        args = ["demo", *common, "--", "--iterations", "100"]
    result = _stepcli(*args, env=env)
    if result.returncode != 0 or not summary.exists():
        raise SystemExit(f"run {name} failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return summary


def compare(a: Path, b: Path, env: dict[str, str]) -> dict[str, Any]:
    result = _stepcli("compare", str(a), str(b), "--allow-inconclusive", "--json", "-", env=env)
    if result.returncode not in (0, 1):
        raise SystemExit(
            f"compare {a.name} {b.name} failed (exit {result.returncode}):\n{result.stderr[-2000:]}"
        )
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pairs", type=int, default=10, help="A/A pairs to run and compare (default 10)"
    )
    parser.add_argument(
        "--ddp", action="store_true", help="a 2-rank gloo DDP job instead of the demo"
    )
    parser.add_argument(
        "--runs-dir", help="keep the runs here (reused when present) instead of a temporary folder"
    )
    parser.add_argument(
        "--max-rate", type=float, default=0.05, help="exit 1 above this share of significant rows"
    )
    options = parser.parse_args()
    env = dict(os.environ)
    # as torchrun gives each rank; the demo's steps then measure alike
    env.setdefault("OMP_NUM_THREADS", "1")
    folder = (
        Path(options.runs_dir) if options.runs_dir else Path(tempfile.mkdtemp(prefix="stepcli-aa-"))
    )
    folder.mkdir(parents=True, exist_ok=True)
    rows = significant = 0
    verdicts: dict[str, int] = {}
    kind = "ddp" if options.ddp else "demo"
    for pair in range(options.pairs):
        a = make_run(folder, f"{kind}{pair}a", options.ddp, env)
        b = make_run(folder, f"{kind}{pair}b", options.ddp, env)
        document = compare(a, b, env)
        attribution = document["attribution"]
        marked = [row for row in attribution if row["significant"]]
        rows += len(attribution)
        significant += len(marked)
        verdicts[document["verdict"]] = verdicts.get(document["verdict"], 0) + 1
        names = ", ".join(f"{row['label']} {row['delta_ms']:+.3f} ms" for row in marked) or "-"
        print(
            f"pair {pair}: {document['verdict']:<12} rows {len(attribution):>2}, significant "
            f"{len(marked)}: {names}"
        )
    rate = significant / rows if rows else 0.0
    print(
        f"{kind}: {options.pairs} A/A pairs, {rows} attribution rows, {significant} significant "
        f"({rate:.1%}); verdicts {', '.join(f'{v} {n}' for v, n in sorted(verdicts.items()))}; "
        f"runs in {folder}"
    )
    return 1 if rate > options.max_rate else 0


if __name__ == "__main__":
    sys.exit(main())
