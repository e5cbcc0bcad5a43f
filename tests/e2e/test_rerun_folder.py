"""A folder given to `stepcli run -o` more than once (README's tour, run again): every reader takes
its latest run, says so in one line, and reads them all with `--all-runs` or one by
`FOLDER/.stepcli/<run id>`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import TRAIN_LOOP, run_stepcli, trace_files, write_script


@pytest.fixture(scope="module")
def rerun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """runs/base written three times: a run that measured nothing, then two that did (6 steps, then
    10)."""
    root = tmp_path_factory.mktemp("rerun")
    nothing = write_script(root, "nothing.py", "print('no steps')\n")
    train = write_script(root, "train.py", TRAIN_LOOP)
    failed = run_stepcli("run", "--no-report", "-o", "runs/base", nothing, cwd=root)
    assert failed.returncode == 0, failed.stderr
    note_after_failure = (root / "runs/base/NOTHING-MEASURED.txt").exists()
    first = run_stepcli("run", "-o", "runs/base", train, "6", cwd=root)
    assert first.returncode == 0, first.stderr
    older = trace_files(root / "runs/base")
    second = run_stepcli("run", "-o", "runs/base", train, "10", cwd=root)
    assert second.returncode == 0, second.stderr
    latest = [p for p in trace_files(root / "runs/base") if p not in older]
    assert len(older) == 1 and len(latest) == 1
    runs = sorted(p.name for p in (root / "runs/base/.stepcli").iterdir())
    return {"root": root, "older": older[0], "latest": latest[0], "runs": runs, "second": second,
            "note_after_failure": note_after_failure}  # fmt: skip


def _note(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if "runs/base: reading the latest of its 3 runs; " in line
    ]


def test_a_later_run_that_measured_removes_the_note_of_one_that_did_not(
    rerun: dict[str, Any],
) -> None:
    assert rerun["note_after_failure"]
    assert not (rerun["root"] / "runs/base/NOTHING-MEASURED.txt").exists()


def test_table_reads_the_latest_run_and_says_how_to_read_the_others(rerun: dict[str, Any]) -> None:
    root = rerun["root"]
    result = run_stepcli("table", "--json", "runs/base", cwd=root)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["ranks"]) <= 1, doc["ranks"]  # one process: not the runs side by side as ranks
    assert [Path(f).name for f in doc["files"]] == [rerun["latest"].name], doc["files"]
    note = _note(result.stderr)
    assert len(note) == 1, result.stderr
    assert note[0].endswith("--all-runs reads all, runs/base/.stepcli/<run id> one"), note


def test_all_runs_and_one_run_by_its_id(rerun: dict[str, Any]) -> None:
    root = rerun["root"]
    every = json.loads(run_stepcli("table", "--json", "--all-runs", "runs/base", cwd=root).stdout)
    assert sorted(Path(f).name for f in every["files"]) == sorted(
        [rerun["older"].name, rerun["latest"].name]
    )
    one = run_stepcli("table", "--json", f"runs/base/.stepcli/{rerun['runs'][1]}", cwd=root)
    assert one.returncode == 0, one.stderr
    assert [Path(f).name for f in json.loads(one.stdout)["files"]] == [rerun["older"].name]
    assert not _note(one.stderr)
    # the run that measured nothing: one line, no traceback
    empty = run_stepcli("table", f"runs/base/.stepcli/{rerun['runs'][0]}", cwd=root)
    assert (
        empty.returncode == 2
        and "recorded no trace" in empty.stderr
        and len(empty.stderr.splitlines()) == 1
    )


def test_merge_whatif_report_and_compare_read_the_latest_run(rerun: dict[str, Any]) -> None:
    root = rerun["root"]
    merged = run_stepcli("merge", "runs/base", "-o", "merged.json", cwd=root)
    assert (
        merged.returncode == 0 and "1 trace" in merged.stdout and len(_note(merged.stderr)) == 1
    ), merged
    whatif = run_stepcli("whatif", "runs/base", cwd=root)
    assert whatif.returncode in (0, 4) and len(_note(whatif.stderr)) == 1, whatif.stderr
    report = run_stepcli("report", "runs/base", cwd=root)
    assert report.returncode == 0 and len(_note(report.stderr)) == 1, report.stderr
    older = run_stepcli("report", f"runs/base/.stepcli/{rerun['runs'][1]}", cwd=root)
    assert older.returncode == 0, older.stderr
    assert older.stdout.strip() == f"runs/base/report-{rerun['runs'][1]}.html"
    compare = run_stepcli(
        "compare", "runs/base", f"runs/base/.stepcli/{rerun['runs'][1]}", cwd=root
    )
    assert compare.returncode in (0, 1, 4), compare.stderr
    assert len(_note(compare.stderr)) == 1, compare.stderr
    assert "10 steps" in compare.stdout and "6 steps" in compare.stdout, compare.stdout


def test_the_hta_one_liner_names_the_latest_runs_trace(rerun: dict[str, Any]) -> None:
    stderr = rerun["second"].stderr.splitlines()
    line = next(line for line in stderr if "TraceAnalysis" in line)
    # HTA reads every trace of a folder and keeps one per rank: the folder alone could load the
    # older run's
    code = shlex.split(line.strip())[-1]
    assert f'trace_files={{0: "{rerun["latest"].name}"}}, trace_dir="runs/base"' in code, code


def test_a_latest_run_still_running_is_read_as_the_traces_no_other_run_lists(
    rerun: dict[str, Any], tmp_path: Path
) -> None:
    # GIVEN a copy of the folder whose latest run has saved no summary yet (it is still running)
    import shutil

    copy = tmp_path / "base"
    shutil.copytree(rerun["root"] / "runs/base", copy)
    (copy / ".stepcli" / rerun["runs"][-1] / "summary.json").unlink()
    # WHEN table reads the folder THEN it reads that run's trace: the one no finished run lists
    result = run_stepcli("table", "--json", copy)
    assert result.returncode == 0, result.stderr
    assert [Path(f).name for f in json.loads(result.stdout)["files"]] == [rerun["latest"].name]
