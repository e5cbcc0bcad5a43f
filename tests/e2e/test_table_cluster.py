"""`stepcli table --scheduler`: the per-file plan on a Dask distributed cluster gives the local
answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_stepcli

from stepcli.traces.analyses.mergeparts import summarize
from stepcli.traces.read.tracereader import load_paths


def test_cluster_gives_the_local_answers(scheduler: str, rank_folder: Path) -> None:
    # GIVEN a folder of four rank traces and a cluster WHEN `stepcli table --json --scheduler` reads
    # it
    result = run_stepcli("table", "--json", "--scheduler", scheduler, rank_folder)
    assert result.returncode == 0, result.stderr
    # THEN every figure equals the local one-process summary, files named as given
    local = json.loads(json.dumps(summarize(load_paths([str(rank_folder)])).to_dict()))
    assert json.loads(result.stdout) == local
    assert [r["rank"] for r in local["ranks"]] == [0, 1, 2, 3]


def test_a_folder_of_more_files_than_tasks_gives_the_local_answers(
    scheduler: str, rank_folder: Path, tmp_path: Path
) -> None:
    # GIVEN 40 rank traces (the four ranks, each as ten ranks): more files than the cluster's tasks
    # (16), so each task reads a run of neighbouring files
    import shutil

    from stepcli.traces.cluster import MIN_TASKS

    sources = sorted(rank_folder.iterdir())
    for copy in range(10):
        for source in sources:
            shutil.copy(source, tmp_path / source.name.replace("host_", f"host{copy}_"))
    assert len(list(tmp_path.iterdir())) == 40 > MIN_TASKS
    # WHEN read on the cluster and locally THEN the answers are the same, byte for byte
    remote = run_stepcli("table", "--json", "--scheduler", scheduler, tmp_path)
    local = run_stepcli("table", "--json", tmp_path)
    assert remote.returncode == local.returncode == 0, remote.stderr + local.stderr
    assert remote.stdout == local.stdout
    assert len(json.loads(local.stdout)["files"]) == 40


def test_cluster_names_a_bad_file_in_one_line(scheduler: str, tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text('{"traceEvents": [')
    result = run_stepcli("table", "--scheduler", scheduler, tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "rank0.json: truncated JSON" in result.stderr.strip().splitlines()[-1]


def test_unreachable_scheduler_is_one_line(rank_folder: Path) -> None:
    pytest.importorskip("distributed")
    result = run_stepcli("table", "--scheduler", "tcp://127.0.0.1:1", rank_folder, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in result.stderr


def test_without_the_extra_the_flag_says_what_to_install(tmp_path: Path, rank_folder: Path) -> None:
    # GIVEN an environment where `distributed` cannot be imported
    blocker = tmp_path / "blocked" / "distributed"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed')\n")
    result = run_stepcli(
        "table",
        "--scheduler",
        "tcp://127.0.0.1:8786",
        rank_folder,
        env={"PYTHONPATH": str(blocker.parent)},
    )
    # THEN one line says what to install
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "stepcli: error: --scheduler needs Dask's distributed package: pip install "
        "'stepcli[dask]'"
    )
