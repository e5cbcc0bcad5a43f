"""`stepcli table` on a synthetic job of scripts/make_job.py (the generator of the scale benchmark,
scripts/bench_job.py): the planted late rank is the culprit, and the rank with the shifted clock is
aligned, not blamed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import run_stepcli

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_job.py"


def _make_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_job", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_job"] = module
    spec.loader.exec_module(module)
    return module


def test_the_planted_late_rank_of_a_synthetic_job_is_the_culprit(tmp_path: Path) -> None:
    ranks = 8
    planted = _make_job().write_job(
        tmp_path / "job", ranks, steps=4, collectives=8, late_ms=5.0, shift_s=3.5
    )
    assert planted["late_rank"] != planted["shifted_rank"]
    proc = run_stepcli("table", "--json", tmp_path / "job")
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)["culprit"]
    assert section["culprit"]["rank"] == planted["late_rank"]
    # each round is one collective per group: ranks / tp TP groups, then tp DP groups
    tp = planted["tp"]
    assert section["collectives"] == 4 * (8 // 2) * (ranks // tp + tp)
    offsets = section["alignment"]["offsets_ms"]
    shifted = str(planted["shifted_rank"])
    assert offsets[shifted] == pytest.approx(3500.0, abs=0.1)
    assert all(abs(ms) < 0.1 for rank, ms in offsets.items() if rank != shifted)


def test_whatif_idealizing_the_planted_late_rank_buys_back_its_lateness(tmp_path: Path) -> None:
    # GIVEN a GPU job whose ranks wait on the host for each NCCL collective's end (a stream sync),
    # one rank 5 ms a step late before its collectives
    planted = _make_job().write_job(
        tmp_path / "job", 8, steps=4, collectives=8, late_ms=5.0, shift_s=3.5
    )
    answer = tmp_path / "whatif.json"
    proc = run_stepcli(
        "whatif", tmp_path / "job", "--idealize-rank", str(planted["late_rank"]), "--json", answer
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(answer.read_text())
    # THEN the replay holds, and the planted rank idealized saves about its lateness on every rank
    # (less the few µs of jitter between the ranks it is set to): its compute between its NCCL
    # kernels' launches becomes the other members' median
    assert abs(doc["replay_error"]) < 0.01
    (change,) = doc["changes"]
    assert 4.5 < change["saved_ms"] <= 5.0
    # the others wait for it in their syncs: it alone is (nearly) critical, and some rank's
    # operators have slack
    assert doc["nearly_critical_ranks"] == [planted["late_rank"]]
    assert any(ms > 0 for entry in doc["slack"] for ms in entry["by_rank"].values())
