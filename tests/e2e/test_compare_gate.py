"""End-to-end tests of the statistical gate: real `stepcli run --json` runs of a script whose step
is a fixed sleep plus seeded random jitter, compared by a real `stepcli compare` subprocess."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import markdown_tables, run_stepcli, write_script

# A step: sleep for SLEEP ms plus up to 20% seeded jitter, inside a record_function so the traces
# name it (a long name, as real operators have: at 80 columns it must still be shown whole).
SLEEPER = """
    import os
    import random
    import sys
    import time

    import torch

    sleep_ms, steps, seed = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    # Start together: wait (in start-up step 0, never compared) until every run of the batch is ready to step.
    barrier, batch = sys.argv[4], int(sys.argv[5])
    open(os.path.join(barrier, str(seed)), "w").close()
    while len(os.listdir(barrier)) < batch:
        time.sleep(0.005)
    rng = random.Random(seed)
    weight = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([weight], lr=0.1)
    for _ in range(steps):
        with torch.profiler.record_function("time.sleep inside the training loop"):
            time.sleep((sleep_ms + rng.uniform(0.0, 0.2 * sleep_ms)) / 1000.0)
        weight.grad = torch.ones(4)
        opt.step()
"""  # noqa: E501
# The step: long against the noise a busy machine adds. With two CPU burners on 2 cores, a sleeping
# process wakes up late by an amount that is absolute (measured: medians of unchanged runs apart by
# +0.5 ms, +5% of an 8 ms step, with a 95% CI reaching +14%: INCONCLUSIVE). The recorded steps that
# name the cause are fewer, and the load of the moment falls on each window alone: on a CI machine
# with more busy processes than cores a 40 ms sleep's recorded steps were seen 86-92 ms long; beside
# a CPU burner and three other test workers, one 60 ms window's sleeps were 10.6 ms longer than
# nominal and the other's 2.4 ms, and the 15 ms change (25% of 60) fell inside the attribution's
# interval (-1.0 .. +15.6 ms). 120 ms makes the change 30 ms, over 30 recorded steps.
SLEEP_MS = 120.0
# Steps per run (~21 s of sleeping, ~26 s for the slow run; all four at once): the untouched steps
# decide.
STEPS = 160
# base1's recorded steps 2-31: over per-operator attribution's OP_MIN_STEPS; 32 after it (set
# aside), 33-159 untouched
ACTIVE = 30
FIRST_UNTOUCHED = ACTIVE + 3  # step ACTIVE + 2, the first after the window, is set aside
OP_NAME = "time.sleep inside the training loop"
# The runs' recorded windows (--wait: the first recorded step is WAIT + 1) come one after another in
# time, each starting ~0.5 s after the one before has been saved, with ~20 ms a step to spare for a
# loaded machine's late wake-ups: a window recorded while other runs record and save theirs saw
# steps 80-170 ms long beside a CPU burner (a 25% change of a 40 ms sleep hidden in the
# attribution's interval); each window alone sees only the burner.
PLAN = (  # name, sleep ms, seed, --wait
    ("base1", SLEEP_MS, 1, 1),  # steps 2-31 of ~132 ms: 0.1-4.1 s
    ("slow", SLEEP_MS * 1.25, 4, 30),  # steps 31-60 of ~165 ms: 5.1-9.9 s
    ("same", SLEEP_MS, 3, 81),  # 10.7-14.7 s
    ("base2", SLEEP_MS, 2, 117),  # 15.4-19.4 s
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run summaries: base1/base2/same (unchanged program, other seeds) and slow (the sleep 25%
    longer).

    Interleaved: all four run at the same time, so a neighbour's load (another test, a CPU burner)
    falls on the baseline and the current alike instead of on whichever ran later; that is what made
    an unchanged program INCONCLUSIVE under load. The runs sleep, so four at once do not compete for
    the cores.
    """
    root = tmp_path_factory.mktemp("gate")
    script = write_script(root, "sleeper.py", SLEEPER)
    (root / "barrier").mkdir()
    with ThreadPoolExecutor(len(PLAN)) as pool:
        done = dict(
            zip(
                [name for name, *_ in PLAN],
                pool.map(lambda item: record(root, script, *item), PLAN),
            )
        )
    for name, result in done.items():
        assert result.returncode == 0, (name, result.stderr)
    return {name: root / f"{name}.json" for name in done}


def record(
    root: Path, script: Path, name: str, sleep_ms: float, seed: int, wait: int
) -> subprocess.CompletedProcess[str]:
    """One `stepcli run --json` of the sleeper."""
    return run_stepcli(
        "run",
        "-q",
        "--wait",
        str(wait),
        "--active",
        str(ACTIVE),
        "-o",
        root / name,
        "--json",
        root / f"{name}.json",
        script,
        str(sleep_ms),
        str(STEPS),
        str(seed),
        root / "barrier",
        str(len(PLAN)),
    )


def verdict(stdout: str) -> str:
    """The verdict, its lines wrapped to the width joined again (continuation lines are
    indented)."""
    text = re.sub(r"\n  (?=\S)", " ", stdout)
    lines = [
        line
        for line in text.splitlines()
        if re.match(r"(NO CHANGE|IMPROVEMENT|INCONCLUSIVE|REGRESSION|NOTHING MEASURED): ", line)
    ]
    assert len(lines) == 1, stdout
    return lines[0]


def test_run_summary_v2_keeps_every_step_of_every_process(runs: dict[str, Path]) -> None:
    doc = json.loads(runs["base1"].read_text())
    assert doc["schema_version"] == 2 and re.fullmatch(r"[0-9a-f]{32}", doc["run_id"])
    [process] = doc["step_times"]
    assert len(process["durations_ms"]) == len(process["phases"]) == STEPS
    # step 0 untouched (start-up), the window's warmup step 1 and recorded steps 2-11 profiled, the
    # rest untouched
    assert process["phases"][: ACTIVE + 2] == "01" + "2" * (ACTIVE - 1) + "3"
    # the step after the window pays for its stop and save: set aside as "after a window" (5)
    assert process["phases"][ACTIVE + 2 :] == "5" + "0" * (STEPS - ACTIVE - 3)
    assert all(t >= SLEEP_MS * 0.95 for t in process["durations_ms"][1:])


def test_unchanged_program_passes(runs: dict[str, Path]) -> None:
    result = run_stepcli("compare", runs["base1"], runs["same"])
    assert result.returncode == 0, result.stdout + result.stderr
    line = verdict(result.stdout)
    assert line.startswith("NO CHANGE: median step time (untouched steps) "), line
    assert re.search(
        r"\(\S+ ms, [+-][\d.]+%, 95% CI [+-][\d.]+% \.\. [+-][\d.]+%\) is within the allowed", line
    )
    assert "method:   block bootstrap over steps" in result.stdout
    assert re.search(
        rf"steps:    baseline \S+base1.json: untouched steps \d+-{STEPS - 1}", result.stdout
    )


def test_sleep_25_percent_longer_is_a_regression_that_names_its_cause(
    runs: dict[str, Path],
) -> None:
    result = run_stepcli("compare", runs["base1"], runs["slow"])
    assert result.returncode == 1, result.stdout + result.stderr
    line = verdict(result.stdout)
    assert line.startswith("REGRESSION: median step time (untouched steps) ")
    low = float(re.search(r"95% CI \+([\d.]+)% \.\. ", line).group(1))  # type: ignore[union-attr]
    assert 10 < low < 30
    # Both sides have traces: the operator whose self time per step grew most is the sleep, with its
    # interval.
    table = result.stdout[result.stdout.index("Operators whose self time per step changed most") :]
    first_row = next(row for row in table.splitlines() if "sleep" in row or "aten::" in row)
    assert "sleep" in first_row and first_row.rstrip(" │|").endswith("yes"), table


def test_operator_changes_fit_80_columns_on_a_pipe_with_names_and_numbers_whole(
    runs: dict[str, Path],
) -> None:
    # GIVEN a CI log: stdout is a pipe, 80 columns WHEN the phase and operator changes are printed
    result = run_stepcli("compare", runs["base1"], runs["slow"], env={"COLUMNS": "80"})
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # THEN no line ends in spaces, and no table or section line is wider than the terminal (the
    # header's paths and the verdict line stay whole on lines of their own, for grep)
    assert all(line == line.rstrip() for line in lines), result.stdout
    first = lines.index("Step time (ms)")
    last = next(i for i, line in enumerate(lines) if line.startswith(("note: ", "REGRESSION: ")))
    assert all(len(line) <= 80 for line in lines[first:last]), result.stdout
    table = result.stdout[result.stdout.index("Operators whose self time per step changed most") :]
    # and names get the width: the 35-character operator is shown whole (not `time.sl…loop`), with
    # its numbers whole on the line below (the interval too)
    rows = table.splitlines()
    index = next(i for i, row in enumerate(rows) if OP_NAME in row)
    assert rows[index].strip() == OP_NAME, table
    assert re.search(
        r"ms, \+[\d.]+ \([\d.]+% CI \+[\d.]+ \.\. \+[\d.]+\), significant$", rows[index + 1]
    ), table
    assert "…" not in table, table
    # The phases come first: the step's time changed in the phase that holds the sleep.
    phases = result.stdout[result.stdout.index("Step phases whose time per step changed most") :]
    assert phases.index("forward") < phases.index("Operators whose"), phases


def test_markdown_puts_the_verdict_first_with_distributions(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    summary = tmp_path / "job-summary.md"
    result = run_stepcli(
        "compare",
        runs["base1"],
        runs["slow"],
        "--markdown",
        "-",
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.returncode == 1
    text = result.stdout
    assert text.startswith("### stepcli compare: REGRESSION\n\n**REGRESSION**: median step time")
    assert "- change: **median +" in text and "95% CI" in text
    fence = text.split("```text\n")[1].split("```")[0].splitlines()
    assert len(fence) == 16 and sum("baseline" in row for row in fence) == 8  # 8 bins x 2 sides
    steps, phases, operators = markdown_tables(text)
    assert steps[0][:4] == ["steps", "stat", "baseline", "current"]
    assert (
        phases[0][0] == "phase"
        and phases[1][:2] == ["`forward`", "phase"]
        and phases[1][-1] == "yes"
    )
    assert operators[0] == [
        "operator",
        "kind",
        "baseline",
        "current",
        "delta",
        "interval",
        "significant",
    ]
    assert operators[1][0] == f"`{OP_NAME}`" and operators[1][-1] == "yes"
    assert summary.read_text() == "\n" + text


def test_several_runs_per_side(runs: dict[str, Path], tmp_path: Path) -> None:
    same = run_stepcli(
        "compare",
        "--baseline",
        runs["base1"],
        "--baseline",
        runs["base2"],
        "--current",
        runs["same"],
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert (
        "two-level bootstrap (runs, then blocks of steps): runs resampled (2 baseline, 1 current)"
        in same.stdout
    )
    assert "2 run summaries" in same.stdout
    # A folder of run summaries is one side of several runs.
    folder = tmp_path / "baseline"
    folder.mkdir()
    for name in ("base1", "base2"):
        shutil.copy(runs[name], folder / f"{name}.json")
    slow = run_stepcli("compare", folder, runs["slow"])
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert _header(slow.stdout, "baseline:").startswith(
        f"baseline: {folder} (2 runs) (2 run summaries"
    )
    # So is a folder of `-o` run folders (downloaded CI artifacts), each read through the summary
    # saved in it, not as a heap of traces; a run whose --json file lies beside its folder counts
    # once
    folders = tmp_path / "artifacts"
    for name in ("base1", "base2"):
        shutil.copytree(runs[name].with_suffix(""), folders / name, symlinks=True)
    shutil.copy(runs["base1"], folders / "base1.json")
    slow = run_stepcli("compare", folders, runs["slow"])
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert _header(slow.stdout, "baseline:").startswith(
        f"baseline: {folders} (2 runs) (2 run summaries"
    )
    # on a pipe of 80 columns only a line that holds a path, whole, may be longer
    narrow = run_stepcli("compare", folders, runs["slow"], env={"COLUMNS": "80"})
    assert narrow.returncode == 1 and f"baseline: {folders} (2 runs)\n" in narrow.stdout, (
        narrow.stdout
    )
    paths = (str(tmp_path), str(runs["slow"].parent))
    assert all(
        len(line) <= 80 or any(p in line for p in paths) for line in narrow.stdout.splitlines()
    ), narrow.stdout
    assert verdict(slow.stdout).startswith("REGRESSION: median step time (untouched steps)")


def test_run_summaries_saved_as_json_gz_are_read_as_run_summaries(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    # GIVEN the baseline's run summaries as a CI job keeps them: one gzipped by an artifact step,
    # one plain under a .json.gz name (what `stepcli run --json base.json.gz` writes)
    folder = tmp_path / "baseline"
    folder.mkdir()
    gzipped, plain = folder / "base1.json.gz", folder / "base2.json.gz"
    gzipped.write_bytes(gzip.compress(runs["base1"].read_bytes()))
    shutil.copy(runs["base2"], plain)
    # and one re-saved with its keys sorted (`jq -S`), then gzipped: no "schema" first
    resorted = tmp_path / "sorted.json.gz"
    text = json.dumps(json.loads(runs["base1"].read_text()), sort_keys=True)
    assert not text.startswith('{"schema"'), text[:40]
    resorted.write_bytes(gzip.compress(text.encode()))
    cases = ((gzipped, ""), (plain, ""), (resorted, ""), (folder, " (2 runs)"))
    for baseline, runs_read in cases:
        # WHEN each, and their folder, is compared with the slower run
        result = run_stepcli("compare", baseline, runs["slow"])
        # THEN each is read as the run summary it is (they were refused as "not a profiler trace")
        assert result.returncode == 1, result.stdout + result.stderr
        header = _header(result.stdout, "baseline:")
        assert header.startswith(f"baseline: {baseline}{runs_read} ("), result.stdout
        assert "run summar" in header, header
        assert verdict(result.stdout).startswith("REGRESSION: median step time (untouched steps)")


def test_a_run_compared_with_itself_is_said_so(runs: dict[str, Path]) -> None:
    # GIVEN one path given as both sides (a CI variable left unset) WHEN compared THEN it passes,
    # with a warning
    same = run_stepcli("compare", runs["base1"], runs["base1"])
    assert same.returncode == 0, same.stdout + same.stderr
    assert (
        "stepcli: warning: baseline and current are the same files: the verdict compares them with "
        "themselves" in (same.stderr)
    )
    other = run_stepcli("compare", runs["base1"], runs["base2"])
    assert "the same files" not in other.stderr and "the same run" not in other.stderr
    # nor may one run given twice as its folder and its --json file
    folder = run_stepcli("compare", runs["base1"].with_suffix(""), runs["base1"])
    assert folder.returncode == 0, folder.stdout + folder.stderr
    assert "stepcli: warning: baseline and current are the same run" in folder.stderr
    # AND a run on both sides among others (a CI glob that picked up the baseline's artifact too) is
    # refused: it would pull the sides together and water a regression down
    mixed = run_stepcli(
        "compare", "--baseline", runs["base1"], "--baseline", runs["base2"],
        "--current", runs["slow"], "--current", runs["base1"].with_suffix(""),
    )  # fmt: skip
    assert mixed.returncode == 2, mixed.stdout + mixed.stderr
    assert "the same run" in mixed.stderr and "give it to one side" in mixed.stderr
    assert len(mixed.stderr.splitlines()) == 1


def test_runs_of_different_programs_are_said_so(runs: dict[str, Path], tmp_path: Path) -> None:
    # GIVEN the baseline run, and the same run saved as if it had run another script (the wrong CI
    # artifact)
    doc = json.loads(runs["same"].read_text())
    assert doc["command"][1].endswith("sleeper.py")
    doc["command"][1] = doc["command"][1].replace("sleeper.py", "evaluate.py")
    other = tmp_path / "evaluate.json"
    other.write_text(json.dumps(doc))
    # WHEN compared THEN the verdict stands, with a warning naming both programs, on stderr and in
    # the report
    result = run_stepcli("compare", runs["base1"], other)
    warning = "baseline and current ran different programs (sleeper.py vs evaluate.py)"
    assert f"stepcli: warning: {warning}" in result.stderr
    assert warning in " ".join(result.stdout.split())
    # AND runs of one program, with other arguments, are one program
    assert "different programs" not in run_stepcli("compare", runs["base1"], runs["slow"]).stderr


def _header(stdout: str, name: str) -> str:
    """compare's header line for one side, its wrapped continuation lines (80 columns on a pipe)
    joined."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(name))
    rest = [line.strip() for line in lines[start + 1 :]][
        : next((i for i, line in enumerate(lines[start + 1 :]) if not line.startswith(" " * 10)), 0)
    ]
    return " ".join([lines[start], *rest])


def test_schema_1_summary_still_compares(runs: dict[str, Path], tmp_path: Path) -> None:
    doc: dict[str, Any] = json.loads(runs["base1"].read_text())
    for key in ("run_id", "step_times"):
        del doc[key]
    doc["schema_version"] = 1
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(doc))
    assert run_stepcli("compare", old, runs["same"]).returncode == 0
    result = run_stepcli("compare", old, runs["slow"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "95% CI" in verdict(result.stdout)  # the primary process's timeline gives every step


def test_skip_steps_and_confidence(runs: dict[str, Path]) -> None:
    skip = FIRST_UNTOUCHED + 8
    result = run_stepcli(
        "compare", runs["base1"], runs["same"], "--skip-steps", str(skip), "--confidence", "99%"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"untouched steps {skip}-{STEPS - 1} ({STEPS - skip} step times); steps "
        f"{FIRST_UNTOUCHED}-{skip - 1} left out: --skip-steps {skip}" in result.stdout
    )
    assert "99% CI" in verdict(result.stdout)
    nothing = run_stepcli("compare", runs["base1"], runs["same"], "--skip-steps", "1000")
    assert nothing.returncode == 3
    assert "no untouched steps from step 1000 on" in verdict(nothing.stdout)


# ---------------------------------------------------------------- hand-written v2 summaries:
# inconclusive, usage


def v2_summary(times: list[float]) -> dict[str, Any]:
    return {
        "schema": "stepcli.run",
        "schema_version": 2,
        "run_id": "0" * 32,
        "exit_status": 0,
        "steps": {"global": len(times), "requesters": {"SGD#0": len(times)}},
        "step_time_ms": {
            "untouched": {
                "count": len(times) - 1,
                "mean": 1,
                "median": 1,
                "p90": 1,
                "min": 1,
                "max": 1,
            },
            "profiled": None,
        },
        "step_times": [
            {
                "worker": "w",
                "rank": None,
                "pid": 1,
                "durations_ms": times,
                "phases": "0" * len(times),
            }
        ],
        "traces": [],
    }


def test_inconclusive_fails_the_gate_unless_allowed(tmp_path: Path) -> None:
    import random

    rng = random.Random(0)
    noisy = [[10.0 * (1 + rng.uniform(-0.4, 0.4)) for _ in range(15)] for _ in range(2)]
    base, cur = tmp_path / "b.json", tmp_path / "c.json"
    base.write_text(json.dumps(v2_summary(noisy[0])))
    cur.write_text(json.dumps(v2_summary(noisy[1])))
    # GIVEN a verdict the gate cannot reach WHEN compared with the defaults THEN the gate fails
    # (exit 4) and says how to let it pass
    result = run_stepcli("compare", base, cur)
    assert result.returncode == 4, result.stdout + result.stderr
    assert verdict(result.stdout).startswith("INCONCLUSIVE: ")
    assert "more steps per side" in verdict(result.stdout)
    assert result.stderr.startswith("stepcli: warning: inconclusive: median step time")
    assert (
        "--allow-inconclusive passes it" in result.stderr and len(result.stderr.splitlines()) == 1
    )
    # AND --allow-inconclusive passes it with a warning; --strict (the old way to ask for exit 4)
    # still works
    allowed = run_stepcli("compare", base, cur, "--allow-inconclusive")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert allowed.stderr.startswith("stepcli: warning: inconclusive: median step time")
    assert run_stepcli("compare", base, cur, "--strict").returncode == 4


@pytest.mark.parametrize(
    ("args", "mention"),
    [
        (["--confidence", "120%"], "--confidence"),
        (["--confidence", "0.2"], "--confidence"),
        (["--skip-steps", "-1"], "--skip-steps"),
        (["--baseline", "x.json"], "not a mix"),
        (["--strict", "--allow-inconclusive"], "give one"),
    ],
)
def test_bad_gate_options_are_usage_errors(tmp_path: Path, args: list[str], mention: str) -> None:
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps(v2_summary([10.0] * 20)))
    result = run_stepcli("compare", doc, doc, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("stepcli: error: ") and mention in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_tolerances_past_100_percent_and_the_highest_confidence_are_accepted(
    tmp_path: Path,
) -> None:
    # GIVEN every current step twice as long as every baseline step (a 100% slowdown)
    base, cur = tmp_path / "b.json", tmp_path / "c.json"
    base.write_text(json.dumps(v2_summary([10.0 + i % 3 * 0.1 for i in range(30)])))
    cur.write_text(json.dumps(v2_summary([20.0 + i % 3 * 0.2 for i in range(30)])))
    # THEN it is a regression within 50% and not within 150%; 99.9% (the documented top) is a
    # confidence level
    assert run_stepcli("compare", base, cur, "--tolerance", "50%").returncode == 1
    within = run_stepcli("compare", base, cur, "--tolerance", "150%", "--confidence", "99.9%")
    assert within.returncode == 0, within.stdout + within.stderr
    assert verdict(within.stdout).startswith("NO CHANGE: "), within.stdout


def test_only_flags_without_a_current_is_a_usage_error(tmp_path: Path) -> None:
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps(v2_summary([10.0] * 20)))
    result = run_stepcli("compare", "--baseline", doc)
    assert result.returncode == 2 and "at least one --baseline and one --current" in result.stderr


def test_several_runs_need_every_steps_time_and_one_kind(tmp_path: Path) -> None:
    v2 = tmp_path / "v2.json"
    v2.write_text(json.dumps(v2_summary([10.0] * 20)))
    stats_only = tmp_path / "stats-only.json"
    doc = v2_summary([10.0] * 20)
    del doc["step_times"]
    doc["schema_version"] = 1
    stats_only.write_text(json.dumps(doc))
    trace = tmp_path / "t.pt.trace.json"
    trace.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "name": "ProfilerStep#1",
                        "ph": "X",
                        "cat": "user_annotation",
                        "pid": 1,
                        "tid": 1,
                        "ts": 0,
                        "dur": 10,
                    }
                ]
            }
        )
    )
    copy = tmp_path / "copy.json"
    copy.write_text(v2.read_text())
    for other, mention in (
        (stats_only, "has step statistics but not every step's time"),
        (trace, "mixes run summaries and traces"),
        (copy, "the same run (run_id 000000000000) as"),
    ):
        result = run_stepcli("compare", "--baseline", v2, "--baseline", other, "--current", v2)
        assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
        assert result.stderr.startswith("stepcli: error: ") and mention in result.stderr
        assert len(result.stderr.splitlines()) == 1
    # Alone, the statistics-only summary still compares, on its two medians, and says so.
    alone = run_stepcli("compare", stats_only, v2)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "without a confidence interval" in alone.stdout


def test_too_few_steps_are_inconclusive_and_intervals_stay_above_minus_100_percent(
    tmp_path: Path,
) -> None:
    # GIVEN 2 runs per side of 3 steps each (step 0 is start-up), levels far apart
    files = {}
    for name, times in (
        ("b1", [1.0, 1.1, 0.9]),
        ("b2", [90.0, 95.0, 99.0]),
        ("c1", [1.0, 1.2, 1.0]),
        ("c2", [80.0, 70.0, 99.0]),
    ):
        files[name] = tmp_path / f"{name}.json"
        doc = v2_summary([5.0, *times])
        doc["run_id"] = name.ljust(32, "0")
        files[name].write_text(json.dumps(doc))
    result = run_stepcli(
        "compare",
        "--baseline",
        files["b1"],
        "--baseline",
        files["b2"],
        "--current",
        files["c1"],
        "--current",
        files["c2"],
    )
    # THEN inconclusive (exit 4 with a warning), no impossible interval such as -1141.6% .. +1102.4%
    assert result.returncode == 4, result.stdout + result.stderr
    line = verdict(result.stdout)
    assert (
        line.startswith("INCONCLUSIVE: ")
        and "too few steps to decide (6 baseline and 6 current" in line
    ), line
    assert "CI" not in line and "change:" not in result.stdout
    # WITH enough steps per run, the interval of the same kind of data is a ratio: never below -100%
    for name in files:
        doc = json.loads(files[name].read_text())
        doc["step_times"][0]["durations_ms"] = [
            5.0,
            *(doc["step_times"][0]["durations_ms"][1:] * 5),
        ]
        doc["step_times"][0]["phases"] = "0" * 16
        files[name].write_text(json.dumps(doc))
    result = run_stepcli(
        "compare",
        "--baseline",
        files["b1"],
        "--baseline",
        files["b2"],
        "--current",
        files["c1"],
        "--current",
        files["c2"],
    )
    low = re.search(r"95% CI ([+-][\d.]+)% \.\. ", verdict(result.stdout))
    assert low and float(low.group(1)) > -100, result.stdout


# ---------------------------------------------------------------- run folders; overwhelming
# evidence from few steps


def test_a_run_folder_is_read_through_its_run_summary(runs: dict[str, Path]) -> None:
    # GIVEN the `-o` folders of two runs (traces of 20 recorded steps beside the summary stepcli
    # saved there)
    base, slow = runs["base1"].with_suffix(""), runs["slow"].with_suffix("")
    assert (base / ".stepcli").is_dir() and list(base.glob("*.pt.trace.json"))
    # WHEN compared as folders THEN they are read as the run summaries inside them: every step, the
    # untouched ones decide (as their --json files do), not the traces' recorded steps
    result = run_stepcli("compare", base, slow)
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict(result.stdout).startswith("REGRESSION: median step time (untouched steps) "), (
        result.stdout
    )
    assert re.search(
        rf"steps:    baseline {re.escape(str(base))} \(run \S+\): untouched steps \d+-{STEPS - 1}",
        result.stdout,
    )


# The case: 14 iterations, a short window (10 recorded steps), the current side 13x slower.
SHORT = """
    import sys
    import time

    import torch

    sleep_ms, steps = float(sys.argv[1]), int(sys.argv[2])
    weight = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([weight], lr=0.1)
    for _ in range(steps):
        time.sleep(sleep_ms / 1000.0)
        weight.grad = torch.ones(4)
        opt.step()
"""


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run folders (with --json beside) of 14 steps: fast (3 ms sleeps) and slow (43 ms), window of
    10, and the same programs with the default window (3 recorded steps)."""
    root = tmp_path_factory.mktemp("short")
    script = write_script(root, "short.py", SHORT)
    plan = [
        (f"{speed}{window}", ms, active)
        for speed, ms in (("fast", 3.0), ("slow", 43.0))
        for window, active in (("10", "10"), ("3", "3"))
    ]

    def one(name: str, ms: float, active: str) -> subprocess.CompletedProcess[str]:
        out = root / name
        return run_stepcli(
            "run",
            "-q",
            "--active",
            active,
            "-o",
            out,
            "--json",
            f"{out}.json",
            script,
            str(ms),
            "14",
        )

    with ThreadPoolExecutor(2) as pool:
        done = dict(zip([p[0] for p in plan], pool.map(lambda p: one(*p), plan)))
    for name, result in done.items():
        assert result.returncode == 0, (name, result.stderr)
    return {name: root / name for name in done}


def test_overwhelming_slowdown_fails_the_gate_with_few_steps(short_runs: dict[str, Path]) -> None:
    # GIVEN 10 recorded and 1 untouched step per side (step 0 is start-up, step 12 the first after
    # the window), every current step ~14x slower than every baseline step
    for folder in (short_runs["fast10"], short_runs["slow10"]):
        doc = json.loads(Path(f"{folder}.json").read_text())
        assert doc["steps"]["global"] == 14 and doc["step_time_ms"]["untouched"]["count"] == 1
    # WHEN compared (run summaries, and the same runs' folders) THEN REGRESSION, exit 1: the
    # recorded steps count when the untouched ones are too few, and a complete separation far beyond
    # the tolerance decides
    for base, cur in (
        (f"{short_runs['fast10']}.json", f"{short_runs['slow10']}.json"),
        (short_runs["fast10"], short_runs["slow10"]),
    ):
        result = run_stepcli("compare", base, cur)
        assert result.returncode == 1, result.stdout + result.stderr
        assert verdict(result.stdout).startswith(
            "REGRESSION: median step time (profiled steps) "
        ), result.stdout
        assert "too few untouched steps" in result.stdout
    # AND with the default window (3 recorded steps, 9 untouched): too few for an interval, but
    # every current step is far beyond every baseline step: REGRESSION, and the verdict says why
    result = run_stepcli("compare", short_runs["fast3"], short_runs["slow3"])
    assert result.returncode == 1, result.stdout + result.stderr
    line = verdict(result.stdout)
    assert line.startswith("REGRESSION: median step time (untouched steps) "), line
    assert (
        "current steps is slower than every one of the" in line
        and "by chance with probability 1/" in line
    )
    # AND the mirror image is an improvement (exit 0); the unchanged program against itself is never
    # a regression
    assert run_stepcli("compare", short_runs["slow3"], short_runs["fast3"]).returncode == 0
    same = run_stepcli("compare", short_runs["fast3"], short_runs["fast3"])
    assert same.returncode in (0, 4) and not verdict(same.stdout).startswith("REGRESSION"), (
        same.stdout
    )
