"""Regenerate the small real traces in tests/data/ with plain torch.profiler (no stepcli involved).

Usage: python scripts/make_fixture_traces.py

Writes train_cpu.pt.trace.json (two recorded steps of a small training loop with a DataLoader,
record_shapes on) and train_cpu.key_averages.json (torch's own key_averages() for the same window:
name, count, self and total us).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randn(32, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=8)

    def ready(prof):
        prof.export_chrome_trace(out + ".pt.trace.json")
        rows = [dict(name=e.key, count=e.count, self_us=e.self_cpu_time_total, total_us=e.cpu_time_total)
                for e in prof.key_averages() if str(e.device_type) == "DeviceType.CPU"]
        with open(out + ".key_averages.json", "w") as f:
            json.dump(rows, f, indent=1)

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1), on_trace_ready=ready) as prof:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
    """  # noqa: E501
)


def main() -> int:
    """Run the script once and report the files it wrote."""
    DATA.mkdir(parents=True, exist_ok=True)
    stem = DATA / "train_cpu"
    subprocess.run([sys.executable, "-c", SCRIPT, str(stem)], check=True, stderr=subprocess.DEVNULL)
    for path in sorted(DATA.glob("train_cpu*")):
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
