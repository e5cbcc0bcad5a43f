"""`stepcli whatif` against real programs changed for real: predict from one run, make the change in
a copy of the program, measure it with `stepcli run`, compare.

Each case is a small torch program with a knob (a rank's extra work, a data loader's sleep per item,
an operator repeated k times, the bytes of an all-reduce). For every round, taken in turns so that
the machine's drift falls on both alike: the original program is run under `stepcli run`, `stepcli
whatif` predicts the change from its traces, and the changed program is run under `stepcli run` too.
Printed per case: the prediction and the measurement at the profiler's pace (the recorded steps:
`predicted_ms` against the changed run's own `measured_ms`) and at the program's pace
(`predicted_untouched_ms` against the changed run's untouched median), as medians over the rounds
with their range, the error of the medians, and the noise: half the changed program's own range over
the rounds, relative to its median (an error inside it cannot be told from the machine's drift).
`--json` keeps every round.

    python scripts/whatif_check.py  # every case, 3 rounds (~10 minutes on 2 cores)
    python scripts/whatif_check.py --rounds 5 --cases slow_rank,off_path --examples ''
    python scripts/whatif_check.py --rounds 1 --cases none  # only the example programs' replay
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
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    for _ in range({steps}):
        if extra:
            with record_function("extra_work"):
                time.sleep(extra)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    del model, opt
    import gc; gc.collect()
    dist.destroy_process_group()
"""  # noqa: E501

ALLREDUCE = """
    import os, torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    big = torch.ones(int(os.environ["NUMEL"]))
    for _ in range({steps}):
        model(x).sum().backward()
        dist.all_reduce(big)  # the job's one collective: halving its bytes is what `--comm 0.5` asks
        opt.step()
        opt.zero_grad()
    dist.barrier()
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
            c = torch.bmm(a, b)
        model(torch.randn(64, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
"""


# Replay only: programs in the shape of pytorch/examples (mnist, word_language_model, vae, dcgan, a
# transformer encoder, mnist under DDP), small enough for a CPU. No change is made: the unchanged
# replay must give back the measured step (goals: 2% median, 5% worst).
EXAMPLES = {
    "mnist": """
        import torch, torch.nn as nn, torch.nn.functional as F
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
                self.dropout1, self.fc1, self.fc2 = nn.Dropout(0.25), nn.Linear(9216, 128), nn.Linear(128, 10)
            def forward(self, x):
                x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
                x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
                return F.log_softmax(self.fc2(x), dim=1)
        data = TensorDataset(torch.randn(64 * {steps}, 1, 28, 28), torch.randint(0, 10, (64 * {steps},)))
        model = Net()
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
        for x, y in DataLoader(data, batch_size=64):
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
    """,  # noqa: E501
    "word_language_model": """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        ntokens, bptt, batch = 1000, 35, 20
        class RNNModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder, self.rnn = nn.Embedding(ntokens, 200), nn.LSTM(200, 200, 2, dropout=0.2)
                self.decoder = nn.Linear(200, ntokens)
            def forward(self, x, hidden):
                out, hidden = self.rnn(self.encoder(x), hidden)
                return self.decoder(out).view(-1, ntokens), hidden
        model = RNNModel()
        opt = torch.optim.SGD(model.parameters(), lr=20)
        data = torch.randint(0, ntokens, (bptt * {steps} + 1, batch))
        hidden = (torch.zeros(2, batch, 200), torch.zeros(2, batch, 200))
        for i in range(0, bptt * {steps}, bptt):
            hidden = tuple(h.detach() for h in hidden)
            opt.zero_grad()
            output, hidden = model(data[i:i + bptt], hidden)
            nn.functional.cross_entropy(output, data[i + 1:i + 1 + bptt].reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
    """,  # noqa: E501
    "vae": """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        class VAE(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
                self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)
            def forward(self, x):
                h = F.relu(self.fc1(x.view(-1, 784)))
                mu, logvar = self.fc21(h), self.fc22(h)
                z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
                return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar
        model = VAE()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range({steps}):
            x = torch.rand(128, 784)
            opt.zero_grad()
            recon, mu, logvar = model(x)
            loss = F.binary_cross_entropy(recon, x, reduction="sum")
            (loss - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())).backward()
            opt.step()
    """,  # noqa: E501
    "dcgan": """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        netG = nn.Sequential(nn.ConvTranspose2d(16, 32, 4, 1, 0, bias=False), nn.BatchNorm2d(32), nn.ReLU(True),
                             nn.ConvTranspose2d(32, 3, 4, 2, 1, bias=False), nn.Tanh())
        netD = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                             nn.Conv2d(32, 1, 4, 1, 0, bias=False), nn.Flatten(), nn.Sigmoid())
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
        optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
        loss = nn.BCELoss()
        for _ in range({steps}):  # two optimizers a step: stepcli counts one step (the larger of their counts)
            real = torch.randn(32, 3, 8, 8)
            fake = netG(torch.randn(32, 16, 1, 1))
            netD.zero_grad()
            (loss(netD(real).view(-1), torch.ones(32)) + loss(netD(fake.detach()).view(-1), torch.zeros(32))).backward()
            optD.step()
            netG.zero_grad()
            loss(netD(fake).view(-1), torch.ones(32)).backward()
            optG.step()
    """,  # noqa: E501
    "transformer": """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True)
        model = nn.Sequential(nn.Embedding(1000, 128), nn.TransformerEncoder(layer, 2), nn.Linear(128, 1000))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range({steps}):
            tokens = torch.randint(0, 1000, (8, 64))
            opt.zero_grad()
            nn.functional.cross_entropy(model(tokens).view(-1, 1000), tokens.view(-1)).backward()
            opt.step()
    """,  # noqa: E501
    "mnist_ddp": """
        import torch, torch.nn as nn, torch.nn.functional as F
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        model = DDP(nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2704, 10)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range({steps}):
            x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        dist.barrier()
        dist.destroy_process_group()
    """,  # noqa: E501
}


@dataclass
class Case:
    name: str
    program: str
    torchrun: bool
    before: dict[str, str]  # the original program's knobs
    after: dict[str, str]  # the changed program's
    change: list[str]  # whatif's flags for the same change
    steps: int = 60


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
            ALLREDUCE,
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
                steps=70,
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
    """The program under `stepcli run` (steps 11-20 recorded: past the first steps' warm-up, DDP's
    bucket rebuild and the allocator's growth; ten steps so that one step's hiccup moves the mean by
    little), its run folder."""
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
        "10",
        "--active",
        "10",
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
    raw = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(rounds):
            doc = whatif(run(case, case.before, folder), case.change)
            changed = whatif(run(case, case.after, folder), [])
            replay_errors.append(abs(doc["replay_error"] or 0))
            raw.append(
                {
                    key: doc.get(key)
                    for key in ("verdict", "measured_ms", "untouched_ms", "replay_error")
                }
            )
            raw[-1]["change"] = doc["changes"][0] if doc["changes"] else None
            raw[-1]["changed"] = {
                key: changed.get(key) for key in ("verdict", "measured_ms", "untouched_ms")
            }
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
        "raw": raw,
    }


def _pair(predicted: list[float], measured: list[float]) -> dict:
    """Medians, ranges, the error of the medians, and the noise: half the changed program's own
    range over its rounds, relative to its median (an error inside it cannot be told from the
    machine's drift)."""
    if not predicted:
        return {}
    p, m = statistics.median(predicted), statistics.median(measured)
    return {
        "predicted": p,
        "predicted_range": (min(predicted), max(predicted)),
        "measured": m,
        "measured_range": (min(measured), max(measured)),
        "error": (p - m) / m,
        "noise": (max(measured) - min(measured)) / 2 / m,
    }


def _row(result: dict, pace: str) -> str:
    pair = result[pace]
    if not pair:
        return f"| {result['case']} | {pace} | - | - | - | - |"
    lo_p, hi_p = pair["predicted_range"]
    lo_m, hi_m = pair["measured_range"]
    return (
        f"| {result['case']} | {pace} | {pair['predicted']:.2f} ({lo_p:.2f}-{hi_p:.2f}) | "
        f"{pair['measured']:.2f} ({lo_m:.2f}-{hi_m:.2f}) | {pair['error']:+.1%} | "
        f"±{pair['noise']:.1%} |"
    )


def _floor(results: list[dict]) -> list[float]:
    """What no prediction can beat on this machine: the changed program measured in one round
    against the same program in another (|a - b| / b over every ordered pair of rounds, both
    paces)."""
    floor = []
    for result in results:
        for pace in ("measured_ms", "untouched_ms"):
            values = [r["changed"][pace] for r in result["raw"] if r["changed"][pace] is not None]
            floor += [
                abs(a - b) / b
                for i, a in enumerate(values)
                for j, b in enumerate(values)
                if i != j and b > 0
            ]
    return floor


def replay_examples(rounds: int, names: list[str]) -> list[dict]:
    """Each example program run `rounds` times under `stepcli run` and replayed unchanged: measured
    vs replayed."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = Case(name, EXAMPLES[name], name.endswith("_ddp"), {}, {}, [], steps=30)
            folder = Path(tmp) / name
            folder.mkdir()
            docs = [whatif(run(case, {}, folder), []) for _ in range(rounds)]
            errors = [doc["replay_error"] for doc in docs if doc["replay_error"] is not None]
            results.append(
                {
                    "program": name,
                    "verdicts": [doc["verdict"] for doc in docs],
                    "measured_ms": [doc["measured_ms"] for doc in docs],
                    "replayed_ms": [doc["replayed_ms"] for doc in docs],
                    "replay_errors": errors,
                }
            )
            worst = max(errors, key=abs) if errors else None
            print(
                f"| {name} | "
                f"{statistics.median(r for r in results[-1]['measured_ms'] if r is not None):.2f} "
                f"| {worst:+.1%} | {', '.join(results[-1]['verdicts'])} |"
                if worst is not None
                else f"| {name} | - | - | {', '.join(results[-1]['verdicts'])} |",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--delays", default="2,5,10,20,40", help="ms of rank 1's extra work, one case each"
    )
    parser.add_argument("--cases", default="", help="comma-separated case names (prefixes) to run")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--examples",
        default=",".join(EXAMPLES),
        help="comma-separated example programs to replay unchanged ('' for none)",
    )
    args = parser.parse_args()
    chosen = [c for c in cases([int(d) for d in args.delays.split(",")]) if not args.cases or
              any(c.name.startswith(p) for p in args.cases.split(","))]  # fmt: skip
    results = []
    if chosen:
        print(
            "| case | pace | predicted ms/step (range) | measured ms/step (range) | error | noise |"
        )
        print("|---|---|---|---|---|---|")
    for case in chosen:
        result = check(case, args.rounds)
        results.append(result)
        print(_row(result, "profiled"))
        print(_row(result, "untouched"), flush=True)
    pairs = [r[pace] for r in results for pace in ("profiled", "untouched") if r[pace]]
    if pairs:
        errors = [abs(pair["error"]) for pair in pairs]
        inside = sum(abs(pair["error"]) <= pair["noise"] for pair in pairs)
        print(
            f"\nwhat-if error: median {statistics.median(errors):.1%}, worst {max(errors):.1%} "
            f"({len(errors)} figures); {inside} of them within the changed program's own noise"
        )
        floor = _floor(results)
        if floor:
            print(
                f"the floor (A/A: the same changed program, one round against another): median "
                f"{statistics.median(floor):.1%}, worst {max(floor):.1%} ({len(floor)} pairs)"
            )
    replay = [r["replay_error_max"] for r in results if r["replay_error_max"] is not None]
    if replay:
        print(f"replay error (unchanged): worst {max(replay):.1%}")
    examples = [name for name in args.examples.split(",") if name]
    replayed = []
    if examples:
        print(
            "\n| example program | measured ms/step (median) | replay error (worst round) | "
            "verdicts |"
        )
        print("|---|---|---|---|")
        replayed = replay_examples(args.rounds, examples)
        every = [abs(e) for r in replayed for e in r["replay_errors"]]
        if every:
            print(
                f"\nreplay error over the examples: median {statistics.median(every):.1%}, worst "
                f"{max(every):.1%}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"whatifs": results, "examples": replayed}, indent=2))


if __name__ == "__main__":
    main()
