"""`stepcli run` records the environment variables that change how device work overlaps and
collectives run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import run_stepcli


def test_the_summary_records_cuda_connections_and_nccl_settings(tmp_path: Path) -> None:
    out, summary = tmp_path / "run", tmp_path / "summary.json"
    inherited = {
        k: "" for k in os.environ if k.startswith("NCCL_") or k == "CUDA_DEVICE_MAX_CONNECTIONS"
    }
    env = {
        **inherited,
        "NCCL_DEBUG": "INFO",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCLX_OTHER": "no",
    }
    result = run_stepcli(
        "demo", "--active", "2", "-o", out, "--json", summary, "--", "--iterations", "8", env=env
    )
    assert result.returncode == 0, result.stderr
    recorded = json.loads(summary.read_text())["environment"]
    assert {k: v for k, v in recorded.items() if v} == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_DEBUG": "INFO",
    }
    # the CPU run's traces are as before: no CUDA sync events asked of a profiler recording no CUDA
    # work
    traces = list(out.rglob("*.pt.trace.json*"))
    assert traces and all(b"cuda_sync" not in t.read_bytes() for t in traces)
