"""The summary `stepcli run` prints: every section, for the demo and for a two-rank torchrun run."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from conftest import profiler_steps, run_stepcli, trace_files, write_script

SECTIONS = [
    "stepcli summary",
    "command",
    "untouched steps",
    "profiled steps",
    "timeline",
    "peak memory",
    "trace",
    "Top CPU operators by self time",
    "Step breakdown",
    "next:\n  stepcli table",
]


def test_demo_prints_every_section(tmp_path: Path) -> None:
    # GIVEN nothing but stepcli; WHEN the demo runs THEN it records a window and the summary shows every section
    result = run_stepcli(
        "demo", "--active", "2", "-o", tmp_path / "out", "--json", tmp_path / "demo.json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "iteration   0" in result.stdout  # the demo's own output stays on stdout
    for section in SECTIONS:
        assert section in result.stderr, section
    assert re.search(r"^steps\s+12\s+\(AdamW#0 12\)", result.stderr, re.M)
    (trace,) = trace_files(tmp_path / "out")
    assert profiler_steps(trace) == [2, 3]
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["top_operators"] and all(op["name"] != "ProfilerStep*" for op in summary["top_operators"])
    assert set(summary["breakdown_ms"]) == {"dataloader", "forward", "backward", "optimizer", "other"}
    assert summary["breakdown_ms"]["optimizer"] > 0 and summary["breakdown_ms"]["backward"] > 0
    assert summary["peak_memory"]["rss_bytes"] > 10 * 2**20


def test_torchrun_summary_shows_both_ranks(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    script = write_script(
        tmp_path,
        "ddp.py",
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(32, 1))
        opt = torch.optim.Adam(model.parameters())
        for _ in range(8):
            model(torch.randn(16, 32)).sum().backward()
            opt.step()
        dist.barrier()
        del model, opt  # DDP's reducer holds gloo's group: freed here, not at exit, where torch 2.13 can abort
        import gc; gc.collect()
        dist.destroy_process_group()
    """,
    )
    result = run_stepcli(
        "run",
        "--active",
        "2",
        "-o",
        tmp_path / "out",
        "--json",
        tmp_path / "run.json",
        "--",
        torchrun,
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    for section in SECTIONS + ["processes", "Recorded step time per rank"]:
        assert section in result.stderr, section
    assert "rank0 8 steps, rank1 8 steps" in result.stderr
    assert "Compute" in result.stderr and "Wait" in result.stderr  # each rank's step: compute and collective wait
    summary = json.loads((tmp_path / "run.json").read_text())
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    assert all(r["compute_ms"] > 0 and r["comm_ms"] > 0 for r in summary["ranks"])  # DDP's all_reduce is a wait
    assert summary["slowest_rank"] in (0, 1, None)  # equal work: a straggler only when one stands out
    assert summary["steps"] == {"global": 8, "requesters": {"Adam#0": 8}}
