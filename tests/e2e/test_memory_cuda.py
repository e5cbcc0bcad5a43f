"""`stepcli run --memory` on a real GPU: a script that runs out of CUDA memory on purpose (marker
`cuda`).

Skipped, with the reason, where CUDA is absent. The program keeps allocating activations in its
forward pass until the allocator fails; stepcli must save the snapshot before the error reaches the
program (which catches it and exits 3, so the error is seen to arrive unchanged), and `stepcli
memory` must name the step, the phase and the script's line that allocated the most.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_stepcli, write_script
from test_cuda import _gpus

pytestmark = pytest.mark.cuda

OOM_SCRIPT = """
    import sys
    import torch

    class Hog(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1024, 1024)
            self.kept = []

        def forward(self, x, grow):
            for _ in range(grow):
                self.kept.append(self.layer(x))  # activations that stay alive
            return self.kept[-1].sum() if self.kept else self.layer(x).sum()

    model = Hog().cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(8192, 1024, device="cuda")
    try:
        for step in range(1_000_000):
            loss = model(x, 0 if step < 3 else 1_000_000)
            loss.backward()
            opt.step()
            opt.zero_grad()
    except torch.OutOfMemoryError as exc:
        print("caught", type(exc).__name__, flush=True)
        sys.exit(3)
"""


def test_oom_snapshot_names_step_phase_and_site(tmp_path: Path) -> None:
    count, why = _gpus()
    if not count:
        pytest.skip(why)
    script = write_script(tmp_path, "oom.py", OOM_SCRIPT)
    out = tmp_path / "out"
    result = run_stepcli("run", "--memory", "--no-report", "-o", out, script, timeout=600)
    # the program caught the very OutOfMemoryError torch raised
    assert result.returncode == 3, result.stderr
    assert "caught OutOfMemoryError" in result.stdout
    snapshots = list(out.glob("oom-*.pickle"))
    assert len(snapshots) == 1, result.stderr
    assert "out of CUDA memory at step 3 (forward)" in result.stderr
    # allocation stacks and argv: the user's only
    assert snapshots[0].stat().st_mode & 0o777 == 0o600
    (saved,) = out.glob(".stepcli/*/summary.json")  # the run names the snapshot its process wrote
    assert json.loads(saved.read_text())["memory_snapshots"] == [snapshots[0].name]
    done = run_stepcli("memory", "--json", out)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["snapshots"]
    print(json.dumps({k: report[k] for k in ("moment", "oom", "split", "fragmentation")}, indent=1))
    assert report["moment"]["kind"] == "oom"
    assert (report["moment"]["step"], report["moment"]["phase"]) == (3, "forward")
    top = report["top_sites"][0]
    assert top["site"]["file"].endswith("oom.py") and top["site"]["line"] == 12
    assert report["split"]["activations"] > report["moment"]["allocated_bytes"] / 2
    assert report["oom"]["requested_bytes"] > 0
