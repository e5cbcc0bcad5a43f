"""`stepcli table --json` and `stepcli merge` on a folder of 4 NCCL-style rank traces in tensor- and
data-parallel process groups (tests/nccl_groups.py): each collective is matched among its group's
members, the late rank is named, and only the members of its groups are charged waits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_stepcli
from nccl_groups import STEPS, write_group_traces


def test_table_names_the_late_rank_inside_its_process_group(tmp_path: Path) -> None:
    folder = tmp_path / "ranks"
    write_group_traces(folder)
    proc = run_stepcli("table", "--json", folder)
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)["culprit"]
    assert section["process_groups"] == {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    assert section["collectives"] == 4 * STEPS
    found = section["culprit"]
    assert found["rank"] == 3 and found["cause"] == "no_operator"
    assert found["lateness_ms_per_step"] == pytest.approx(60.05, abs=0.01)
    waited = {row["rank"]: row["waited_ms_per_step"] for row in section["ranks"]}
    assert waited == {0: pytest.approx(30.05, abs=0.005), 1: pytest.approx(30.04, abs=0.005)} | {
        2: pytest.approx(30.01, abs=0.005),
        3: pytest.approx(0.0, abs=0.005),
    }
    tp = [c for c in section["per_collective"] if c["group"] == "2"]
    assert len(tp) == STEPS and all(c["last_rank"] == 3 and set(c["waits_ms"]) == {"2"} for c in tp)

    text = run_stepcli("table", folder)
    assert text.returncode == 0, text.stderr
    assert "culprit: rank 3 arrives last at 100% of the collectives" in text.stdout

    merged = tmp_path / "all.json"
    proc = run_stepcli("merge", folder, "-o", merged)
    assert proc.returncode == 0, proc.stderr
    arrows = [
        e
        for e in json.loads(merged.read_text())["traceEvents"]
        if e.get("cat") == "stepcli_culprit"
    ]
    # one waiting member per collective (groups of two), not every other rank of the job
    assert sum(1 for e in arrows if e["ph"] == "s") == 4 * STEPS


def test_a_rank_late_only_at_its_tensor_parallel_group_is_named_with_the_group(
    tmp_path: Path,
) -> None:
    """Rank 3 late only before its TP all-reduce (the DP one comes first): last at half its
    collectives, and at every one of TP group "2": named with the group in the terminal line and the
    JSON."""
    folder = tmp_path / "ranks"
    write_group_traces(folder, dp_first=True)
    proc = run_stepcli("table", "--json", folder)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)["culprit"]["culprit"]
    assert found["rank"] == 3 and found["last_share"] == 0.5
    assert (
        found["group"]["name"] == "2"
        and found["group"]["ranks"] == [2, 3]
        and found["group"]["last_share"] == 1
    )
    text = run_stepcli("table", folder)
    assert text.returncode == 0, text.stderr
    assert (
        "culprit: rank 3 arrives last at 100% of the collectives on process group 2 [ranks 2, 3], "
        "30.0 ms/step" in (text.stdout)
    )
