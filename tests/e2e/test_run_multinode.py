"""Multi-node runs: two torchrun launches sharing one output folder (two nodes simulated on
127.0.0.1), and `srun`-style ranks from SLURM_PROCID."""

from __future__ import annotations

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import ddp_script, profiler_steps, run_stepcli, trace_files, write_script

DDP_SCRIPT = ddp_script(6)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two `stepcli run -o SHARED -- torchrun --nnodes 2 --node-rank K ...` launches at once, one
    process each."""
    tmp = tmp_path_factory.mktemp("multinode")
    script = write_script(tmp, "ddp.py", DDP_SCRIPT)
    shared = tmp / "shared"
    endpoint = f"127.0.0.1:{_free_port()}"

    def launch(node: int) -> Any:
        return run_stepcli(
            "run",
            "--wait",
            "1",
            "--warmup",
            "1",
            "--active",
            "2",
            "-o",
            shared,
            "--json",
            tmp / f"node{node}.json",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            "stepcli-test",
            script,
            cwd=tmp,
            timeout=400,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(launch, [0, 1]))
    for result in results:
        assert result.returncode == 0, result.stderr
    summaries = [json.loads((tmp / f"node{node}.json").read_text()) for node in (0, 1)]
    return {"shared": shared, "results": results, "summaries": summaries}


def test_each_node_writes_one_trace_per_rank_into_the_shared_folder(
    two_nodes: dict[str, Any],
) -> None:
    traces = trace_files(two_nodes["shared"])
    # one per global rank, no collision
    assert sorted(t.name.split(".")[0] for t in traces) == ["rank0", "rank1"]
    assert [profiler_steps(t) for t in traces] == [[2, 3], [2, 3]]


def test_each_launch_summarizes_only_its_own_processes(two_nodes: dict[str, Any]) -> None:
    ranks = []
    for summary in two_nodes["summaries"]:
        # its own rank, not the other node's (nor torchrun's agent)
        (process,) = summary["processes"]
        (window,) = summary["windows"]
        assert window["worker"] == process["worker"] == f"rank{process['rank']}"
        assert Path(window["trace"]).exists()
        ranks.append(process["rank"])
    assert sorted(ranks) == [0, 1]
    run_logs = sorted(p.name for p in (two_nodes["shared"] / ".stepcli").iterdir())
    assert len(run_logs) == 2  # one step-log folder per launch: host and launcher pid in its name


def test_table_of_the_shared_folder_shows_both_nodes_ranks(two_nodes: dict[str, Any]) -> None:
    result = run_stepcli("table", "--json", two_nodes["shared"])
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    assert sorted(r["rank"] for r in table["ranks"]) == [0, 1]


def test_srun_tasks_without_torchrun_take_their_rank_from_slurm_procid(
    tmp_path: Path, train_script: Path
) -> None:
    # GIVEN task 3 of a 4-task srun step, no torchrun and no process group
    out = tmp_path / "out"
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "77"}
    result = run_stepcli(
        "run",
        "--active",
        "1",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        train_script,
        "4",
        cwd=tmp_path,
        env=slurm,
    )
    assert result.returncode == 0, result.stderr
    # THEN its trace and its process carry rank 3
    (trace,) = trace_files(out)
    assert trace.name.startswith("rank3.")
    (process,) = json.loads((tmp_path / "run.json").read_text())["processes"]
    assert (process["worker"], process["rank"]) == ("rank3", 3)


def test_a_one_task_slurm_job_is_not_distributed(tmp_path: Path, train_script: Path) -> None:
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--active",
        "1",
        "-o",
        out,
        train_script,
        "4",
        cwd=tmp_path,
        env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
    )
    assert result.returncode == 0, result.stderr
    (trace,) = trace_files(out)
    assert not trace.name.startswith("rank")  # <host>_<pid>
