"""Regenerate the CUDA traces in tests/data/ that the report's advice tests read (needs a CUDA
machine).

Usage: python scripts/make_cuda_fixture_traces.py

Writes, with `stepcli run --gzip` (the torch on the machine decides the trace format; 2.11 made the
current ones):
- cuda_small.pt.trace.json.gz: 3 recorded steps of a 12-layer MLP with a per-tensor Adam
  (foreach=False) and a `.item()` every step: many tiny kernels, a synchronize per step, an
  optimizer that loops over tensors;
- cuda_compile.pt.trace.json.gz: 4 recorded steps of a torch.compile'd function fed three batch
  sizes in turn, so dynamo recompiles and "Torch-Compiled Region: 0/1" runs in the window.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

SMALL = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(8, 64, device="cuda")
    for i in range(12):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0:
            print("negative")
"""

COMPILE = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    step = torch.compile(lambda x: model(x).square().mean())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(12):
        x = torch.randn(8 + (i % 3), 64, device="cuda")
        loss = step(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""  # noqa: E501


def _record(name: str, source: str, schedule: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / f"{name}.py"
        script.write_text(textwrap.dedent(source))
        out = Path(tmp) / "out"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "stepcli",
                "run",
                "-q",
                "--no-report",
                "--gzip",
                *schedule,
                "-o",
                str(out),
                str(script),
            ],
            check=True,
        )
        (trace,) = out.glob("*.pt.trace.json.gz")
        shutil.copy(trace, DATA / f"{name}.pt.trace.json.gz")
        print(f"wrote {DATA / f'{name}.pt.trace.json.gz'}")


def main() -> int:
    _record("cuda_small", SMALL, ["--wait", "5", "--warmup", "1", "--active", "3"])
    _record("cuda_compile", COMPILE, ["--wait", "6", "--warmup", "1", "--active", "4"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
