"""Traces other tools read right: `traceName` names the final file, and with several windows per
rank each window has a folder of its own (one trace per rank), so Holistic Trace Analysis and
TensorBoard open one window at a time. The same torchrun run checks the summary a two-rank job
prints (every section, both ranks)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ddp_script,
    load_trace,
    profiler_steps,
    run_stepcli,
    stepcli_env,
    trace_files,
    write_script,
)
from test_run_summary import SECTIONS

_DDP = ddp_script(10)


@pytest.fixture(scope="module")
def two_ranks_two_windows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank torchrun run with --repeat 2 (windows at steps 2-3 and 6-7), gzipped traces."""
    folder = tmp_path_factory.mktemp("layout")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    script = write_script(folder, "ddp.py", _DDP)
    out = folder / "out"
    proc = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        "--repeat",
        "2",
        "--gzip",
        "-o",
        out,
        "--json",
        folder / "run.json",
        "--",
        torchrun,
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return {
        "out": out,
        "stderr": proc.stderr,
        "summary": json.loads((folder / "run.json").read_text()),
    }


def test_summary_shows_every_section_and_both_ranks(two_ranks_two_windows: dict[str, Any]) -> None:
    # GIVEN a two-rank torchrun run THEN its summary has every section, with both ranks and their 10
    # steps each
    stderr = two_ranks_two_windows["stderr"]
    for section in SECTIONS + ["processes", "Recorded step time per rank"]:
        assert section in stderr, section
    assert "rank0 10 steps, rank1 10 steps" in stderr
    assert "Compute" in stderr and "Wait" in stderr  # each rank's step: compute and collective wait
    summary = two_ranks_two_windows["summary"]
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    # DDP's all_reduce is a wait
    assert all(r["compute_ms"] > 0 and r["comm_ms"] > 0 for r in summary["ranks"])
    # equal work: a straggler only when one stands out
    assert summary["slowest_rank"] in (0, 1, None)
    assert summary["steps"] == {"global": 10, "requesters": {"SGD#0": 10}}


def test_counts_are_per_rank_and_the_convention_is_said_once(
    two_ranks_two_windows: dict[str, Any],
) -> None:
    # GIVEN 2 ranks of 10 steps, each profiling steps 1-3 and 5-7 (warmup and recorded); 4 and 8
    # come right after a window (set aside: they pay for its stop and save), 9 is untouched
    stderr = " ".join(two_ranks_two_windows["stderr"].split())
    times = two_ranks_two_windows["summary"]["step_time_ms"]
    # THEN every count is per rank, as `steps 10` is (it was "untouched steps n=6" beside "steps
    # 10"), the JSON keeps each rank's count beside the pooled one, and the output says the
    # convention once
    assert times["untouched"]["per_process"] == [1, 1] and times["untouched"]["count"] == 2
    assert times["after_window"]["per_process"] == [2, 2] and times["after_window"]["count"] == 4
    assert times["profiled"]["per_process"] == [6, 6] and times["profiled"]["count"] == 12
    assert (
        "untouched steps n=1 per rank median" in stderr
        and "profiled steps n=6 per rank median" in stderr
    )
    assert stderr.count("counts are per rank; the statistics pool every rank's steps") == 1
    assert "untouched steps n=2" not in stderr and "n=12" not in stderr
    # AND each rank's whole-run line says its percentiles hold the profiled steps (so its p50 is not
    # the untouched median), in the units its neighbours use; report.html says so too
    for rank in (0, 1):
        assert (
            f"whole run rank{rank}: 10 steps; after the first (start-up), profiled ones included: "
            f"p50 ~" in stderr
        )
    html = (two_ranks_two_windows["out"] / "report.html").read_text()
    assert "profiled steps included, unlike the untouched steps' median above" in html


def test_trace_name_names_the_final_file(two_ranks_two_windows: dict[str, Any]) -> None:
    traces = trace_files(two_ranks_two_windows["out"])
    assert len(traces) == 4
    for trace in traces:
        assert load_trace(trace)["traceName"] == str(trace)


def test_each_window_has_a_folder_with_one_trace_per_rank(
    two_ranks_two_windows: dict[str, Any],
) -> None:
    # GIVEN two windows recorded on two ranks
    out: Path = two_ranks_two_windows["out"]
    # THEN each window's folder holds exactly rank0 and rank1, with the same ProfilerStep numbers
    # (what HTA needs)
    folders = sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [f.name for f in folders] == ["window-step2", "window-step6"]
    for folder, steps in zip(folders, ([2, 3], [6, 7])):
        traces = trace_files(folder)
        assert sorted(t.name.split(".")[0] for t in traces) == ["rank0", "rank1"]
        assert [profiler_steps(t) for t in traces] == [steps, steps]
        assert sorted(load_trace(t)["distributedInfo"]["rank"] for t in traces) == [0, 1]
    assert not list(out.glob("*.pt.trace.json*"))  # nothing left beside the window folders
    # and the run summary lists them
    summary = two_ranks_two_windows["summary"]
    assert (
        sorted(Path(t).parent.name for t in summary["traces"])
        == ["window-step2"] * 2 + ["window-step6"] * 2
    )
    # one row per process (rank), its two windows inside
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    assert all(len(r["windows"]) == 2 for r in summary["ranks"]), summary["ranks"]


def test_table_reads_the_layout_whole_or_one_window(two_ranks_two_windows: dict[str, Any]) -> None:
    out: Path = two_ranks_two_windows["out"]
    whole = run_stepcli("table", "--json", out)
    assert whole.returncode == 0, whole.stderr
    ranks = json.loads(whole.stdout)["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(
        len(r["windows"]) == 2 for r in ranks
    ), ranks
    one = run_stepcli("table", "--json", out / "window-step6")
    assert one.returncode == 0, one.stderr
    report = json.loads(one.stdout)
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert sorted({s["step"] for s in report["steps"]}) == [6, 7]


def test_summary_prints_the_hta_one_liner_for_one_window(
    two_ranks_two_windows: dict[str, Any],
) -> None:
    out: Path = two_ranks_two_windows["out"]
    stderr = two_ranks_two_windows["stderr"].splitlines()
    lines = [line for line in stderr if "TraceAnalysis" in line]
    # a command on a line of its own, under next:
    assert len(lines) == 1 and lines[0].startswith("  python -c ")
    assert stderr[stderr.index(lines[0]) - 1] == "  Holistic Trace Analysis of one window:"
    assert f'TraceAnalysis(trace_dir="{out}/window-step2")' in lines[0]


def test_holistic_trace_analysis_reads_each_window_with_the_same_steps_on_every_rank(
    two_ranks_two_windows: dict[str, Any],
) -> None:
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is in the test extra")
    out: Path = two_ranks_two_windows["out"]
    # GIVEN HTA loading each window folder, as the summary's one-liner does
    probe = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
result = {}
for folder in sys.argv[1:]:
    analysis = TraceAnalysis(trace_dir=folder)
    names = analysis.t.symbol_table.get_sym_table()
    per_rank = {}
    for rank in sorted(analysis.t.get_ranks()):
        ids = analysis.t.get_trace(rank)["name"].unique()
        per_rank[int(rank)] = sorted(int(names[i].split("#")[1]) for i in ids if names[i].startswith("ProfilerStep#"))
    result[folder] = {"ranks": per_rank, "steps": [int(s) for s in analysis.get_profiler_steps()]}
print(json.dumps(result))
"""  # noqa: E501
    folders = [str(out / "window-step2"), str(out / "window-step6")]
    proc = subprocess.run(
        [sys.executable, "-c", probe, *folders],
        capture_output=True,
        text=True,
        timeout=180,
        env=stepcli_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # THEN every rank of a window reports the same steps, and they are that window's steps
    for folder, first in zip(folders, (2, 6)):
        ranks = result[folder]["ranks"]
        assert sorted(ranks) == ["0", "1"]
        assert ranks["0"] == ranks["1"] and ranks["0"] and ranks["0"][0] == first, ranks
        assert result[folder]["steps"] and result[folder]["steps"][0] == first


def test_the_ranks_progress_lines_name_their_rank_and_fit_80_columns(
    two_ranks_two_windows: dict[str, Any],
) -> None:
    # GIVEN the lines both ranks print while the job runs (issue 49: "saving trace ..." said by two
    # ranks at once, neither named; "saved trace ...: PATH" and "recording steps ..." past 80
    # columns)
    out: Path = two_ranks_two_windows["out"]
    stderr = two_ranks_two_windows["stderr"]
    lines = [
        line
        for line in stderr[: stderr.index("stepcli summary")].splitlines()
        if line.startswith("stepcli: ")
    ]
    saving = [line for line in lines if "saving trace" in line]
    assert len(saving) == 4 and all(
        re.match(r"stepcli: rank[01]: saving trace of steps \d-\d \.\.\.$", s) for s in saving
    )
    saved = [i for i, line in enumerate(lines) if "saved trace" in line]
    assert len(saved) == 4, lines
    for i in saved:
        assert re.fullmatch(
            r"stepcli: rank[01]: saved trace of steps \d-\d \([\d.]+ KiB\):", lines[i]
        ), lines[i]
        assert lines[i + 1].startswith(f"stepcli:   {out}/window-step") and lines[i + 1].endswith(
            ".pt.trace.json.gz"
        )
    # THEN each fits 80 columns, with the output folder's path counted as a short name
    long = [line for line in lines if len(line.replace(str(out), "OUT")) > 80]
    assert long == [], long
