"""End-to-end tests of `stepcli compare`: real subprocess, real torch.profiler traces, hand-written
run summaries."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import markdown_tables, run_stepcli, stepcli_env, write_script

# Plain torch.profiler with a schedule, as a user's script does it without stepcli: wait 1, warmup
# 1, active 10, so ProfilerStep#2..#11 are recorded (10 steps: the fewest compare decides on). The
# slow variant sleeps inside each step.
MAKE_TRACES = """
    import sys
    import time
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    def record(folder, worker, sleep_ms):
        torch.manual_seed(0)
        torch.set_num_threads(1)  # no intra-op threads fighting the other test workers for the CPU
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(32, 16)
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=10, repeat=1),
            on_trace_ready=tensorboard_trace_handler(folder, worker_name=worker),
        ) as prof:
            for _ in range(13):
                opt.zero_grad()
                model(data).square().mean().backward()
                opt.step()
                if sleep_ms:
                    time.sleep(sleep_ms / 1000)
                prof.step()

    def unscheduled(folder):
        # A trace without a schedule has events but no ProfilerStep#N annotation.
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.randn(8, 8).matmul(torch.randn(8, 8))
        prof.export_chrome_trace(folder + "/nosteps.pt.trace.json")

    root = sys.argv[1]
    for name, sleep_ms in (("fast", 0), ("fast2", 0), ("slow", 100)):
        for worker in ("rank0", "rank1"):
            record(f"{root}/{name}", worker, sleep_ms)
    import os
    os.makedirs(f"{root}/nosteps")
    unscheduled(f"{root}/nosteps")
"""

# Jitter of sub-millisecond CPU steps stays below this floor even on a loaded runner (tens of ms
# seen); the 100 ms sleep is far above it, even against the tens of ms a step can take on a loaded
# 2-core runner.
FLOOR = ("--min-delta-ms", "50")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fast/, fast2/ (same program), slow/ (+100 ms per step): two ranks' traces each; nosteps/."""
    root = tmp_path_factory.mktemp("traces")
    script = write_script(root, "make_traces.py", MAKE_TRACES)
    done = subprocess.run(
        [sys.executable, str(script), str(root)],
        env=stepcli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    for name in ("fast", "fast2", "slow"):
        assert len(list((root / name).glob("*.pt.trace.json"))) == 2
    return root


def one_trace(folder: Path) -> Path:
    return sorted(folder.glob("rank0.*.pt.trace.json"))[0]


def assert_bad_input(result: subprocess.CompletedProcess[str], *mentions: str) -> None:
    """Exit 2, nothing on stdout, exactly one `stepcli: error:` line on stderr, no traceback."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepcli: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for mention in mentions:
        assert mention in lines[0]


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


# ---------------------------------------------------------------- traces


def test_trace_against_itself_passes(traces: Path) -> None:
    # GIVEN one plain torch.profiler trace WHEN compared with itself THEN exit 0, never a
    # regression. Ten recorded steps may not narrow the interval below 10%, so it may say so
    # (inconclusive, a warning on stderr, exit 4: a gate that cannot decide does not pass).
    trace = one_trace(traces / "fast")
    result = run_stepcli("compare", trace, trace)
    assert result.returncode == (4 if verdict(result.stdout).startswith("INCONCLUSIVE") else 0), (
        result.stderr
    )
    line = verdict(result.stdout)
    assert re.match(
        r"(NO CHANGE|INCONCLUSIVE): median step time \(recorded steps\) .* \(\+0\.000 ms, \+0\.0%, "
        r"95% CI ",
        line,
    )
    assert ("stepcli: warning: inconclusive" in result.stderr) == line.startswith("INCONCLUSIVE")
    assert "aten::" in result.stdout  # the operator table


def test_trace_vs_slower_trace_is_a_regression(traces: Path) -> None:
    # GIVEN the same program with a 100 ms sleep per step WHEN compared THEN exit 1 with the delta
    # shown.
    result = run_stepcli("compare", one_trace(traces / "fast"), one_trace(traces / "slow"), *FLOOR)
    assert result.returncode == 1, result.stdout + result.stderr
    line = verdict(result.stdout)
    assert line.startswith("REGRESSION: median step time (recorded steps)")
    delta = float(re.search(r"\(\+([\d.]+) ms, ", line).group(1))  # type: ignore[union-attr]
    assert delta >= 35
    assert "<- decides" in result.stdout


def test_folder_vs_folder(traces: Path) -> None:
    # Two separate runs of the same program stay within the floor; the slow folder does not.
    same = run_stepcli("compare", traces / "fast", traces / "fast2", *FLOOR)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "trace, 20 steps" in same.stdout  # 10 recorded steps x 2 ranks
    slower = run_stepcli("compare", traces / "fast", traces / "slow", *FLOOR)
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert verdict(slower.stdout).startswith("REGRESSION")
    # The improvement direction is never a regression.
    faster = run_stepcli("compare", traces / "slow", traces / "fast", *FLOOR)
    assert faster.returncode == 0


def test_metric_option(traces: Path) -> None:
    result = run_stepcli("compare", traces / "fast", traces / "slow", "--metric", "min", *FLOOR)
    assert result.returncode == 1
    assert verdict(result.stdout).startswith("REGRESSION: min step time")


def test_empty_folder_and_stepless_trace_measure_nothing(traces: Path, tmp_path: Path) -> None:
    # A run folder with no traces (the program never stepped) must not pass.
    empty = tmp_path / "empty-run"
    empty.mkdir()
    result = run_stepcli("compare", traces / "fast", empty)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no trace files in this folder" in verdict(result.stdout)
    assert verdict(result.stdout).startswith("NOTHING MEASURED: current")
    # `run -o DIR --json DIR/summary.json` of a program that never stepped: a summary but no trace.
    write_json(empty / "summary.json", run_summary(untouched=None, profiled=None, steps=0))
    (empty / ".stepcli").mkdir()
    write_json(empty / ".stepcli" / "w.1.steps.json", {"steps": []})
    # The run summary in the folder speaks for the run (it has every step, a trace only the recorded
    # ones).
    result = run_stepcli("compare", traces / "fast", empty)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "summary.json has 0 steps" in verdict(result.stdout)
    # A trace with events but no ProfilerStep#N (profiler without schedule) has no step times.
    result = run_stepcli("compare", traces / "nosteps" / "nosteps.pt.trace.json", traces / "fast")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no ProfilerStep#N step annotations" in verdict(result.stdout)


def test_run_summary_vs_trace_says_what_it_compared(traces: Path, tmp_path: Path) -> None:
    summary = write_json(tmp_path / "run.json", run_summary(untouched=0.2, profiled=0.3))
    result = run_stepcli("compare", summary, traces / "slow", *FLOOR)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(profiled/recorded steps)" in verdict(result.stdout)
    assert (
        "compared the run's profiled (warmup+recorded) steps with the trace's recorded steps"
        in result.stdout
    )


def test_bad_trace_files(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.pt.trace.json"
    truncated.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a"')
    assert_bad_input(
        run_stepcli("compare", truncated, truncated), "truncated.pt.trace.json", "truncated JSON"
    )
    corrupt = tmp_path / "corrupt.pt.trace.json.gz"
    corrupt.write_bytes(gzip.compress(b'{"traceEvents": []}')[:-8] + b"garbage!")
    assert_bad_input(run_stepcli("compare", corrupt, corrupt), "corrupt.pt.trace.json.gz")


# ---------------------------------------------------------------- run summaries


def stats(median: float, count: int = 10) -> dict[str, Any]:
    return {
        "count": count,
        "mean": median * 1.02,
        "median": median,
        "p90": median * 1.2,
        "min": median * 0.9,
        "max": median * 1.5,
    }


def run_summary(
    untouched: float | None = 10.0, profiled: float | None = 13.0, steps: int = 20, **extra: Any
) -> dict[str, Any]:
    """A document shaped like `stepcli run --json` (schema version 1)."""
    doc = {
        "schema": "stepcli.run",
        "schema_version": 1,
        "command": ["python", "train.py"],
        "exit_status": 0,
        "steps": {"global": steps, "requesters": {"SGD#0": steps}},
        "step_time_ms": {
            "untouched": None if untouched is None else stats(untouched, max(steps - 5, 1)),
            "profiled": None if profiled is None else stats(profiled, 4),
        },
        "top_operators": [
            {
                "name": "aten::addmm",
                "calls": 12,
                "self_ms": 4.0,
                "total_ms": 6.0,
                "avg_ms": 0.5,
                "self_share": 0.4,
            },
            {
                "name": "Optimizer.step#SGD.step",
                "calls": 4,
                "self_ms": 2.0,
                "total_ms": 3.0,
                "avg_ms": 0.75,
                "self_share": 0.2,
            },
        ],
        "traces": [],
    }
    doc.update(extra)
    return doc


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def summaries(tmp_path: Path) -> dict[str, Path]:
    slow_ops = run_summary(untouched=20.0, profiled=26.0)
    slow_ops["top_operators"].append(
        {
            "name": "aten::sleepy",
            "calls": 4,
            "self_ms": 40.0,
            "total_ms": 40.0,
            "avg_ms": 10.0,
            "self_share": 0.6,
        }
    )
    return {
        "base": write_json(tmp_path / "base.json", run_summary()),
        "noisy": write_json(tmp_path / "noisy.json", run_summary(untouched=10.9, profiled=30.0)),
        "slow": write_json(tmp_path / "slow.json", slow_ops),
        "zero": write_json(
            tmp_path / "zero.json", run_summary(untouched=None, profiled=None, steps=0)
        ),
    }


def test_run_summary_against_itself_passes(summaries: dict[str, Path]) -> None:
    result = run_stepcli("compare", summaries["base"], summaries["base"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict(result.stdout) == (
        "NO CHANGE: median step time (untouched steps) 10.000 ms -> 10.000 ms (+0.000 ms, +0.0%) "
        "is within the allowed +1.000 ms (larger of tolerance 10% of baseline = 1.000 ms and "
        "--min-delta-ms 0.000)"
    )


def test_profiler_overhead_does_not_decide(summaries: dict[str, Path]) -> None:
    # GIVEN untouched +9% but profiled steps +130% WHEN compared at 10% THEN it passes: untouched
    # steps decide.
    result = run_stepcli("compare", summaries["base"], summaries["noisy"], "--tolerance", "0.1")
    assert result.returncode == 0, result.stdout
    assert "+130.8%" in result.stdout  # the profiled row is still shown
    tighter = run_stepcli("compare", summaries["base"], summaries["noisy"], "--tolerance", "5%")
    assert tighter.returncode == 1


def test_run_summary_regression_shows_numbers_and_new_ops(summaries: dict[str, Path]) -> None:
    result = run_stepcli("compare", summaries["base"], summaries["slow"], "--min-delta-ms", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict(result.stdout).startswith(
        "REGRESSION: median step time (untouched steps) 10.000 ms -> 20.000 ms (+10.000 ms, "
        "+100.0%) exceeds the allowed +2.000 ms"
    )
    sleepy = next(line for line in result.stdout.splitlines() if "aten::sleepy" in line)
    assert "not in baseline top" in sleepy  # a run summary keeps only its top operators
    # A floor above the delta turns it into a pass: both conditions must hold.
    assert (
        run_stepcli(
            "compare", summaries["base"], summaries["slow"], "--min-delta-ms", "10"
        ).returncode
        == 0
    )


def test_zero_step_run_measures_nothing(summaries: dict[str, Path]) -> None:
    for pair in (
        (summaries["base"], summaries["zero"]),
        (summaries["zero"], summaries["base"]),
        (summaries["zero"], summaries["zero"]),
    ):
        result = run_stepcli("compare", *pair)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "has 0 steps" in verdict(result.stdout)
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "mentions"),
    [
        (None, ["no such file or directory"]),
        ("", ["empty file"]),
        ("not json at all", ["not JSON"]),
        ('{"hello": "world"}', ["neither a stepcli run summary", "nor a profiler trace"]),
        ("[1, 2, 3]", ["neither a stepcli run summary"]),
        ('{"schema": "other.tool", "schema_version": 1}', ["unknown document schema 'other.tool'"]),
        (json.dumps(run_summary(schema_version=3)), ["unsupported run summary schema_version 3"]),
        (
            json.dumps(run_summary(step_time_ms={"untouched": {"median": "fast"}})),
            ["not a valid stepcli run summary"],
        ),
    ],
)
def test_bad_inputs_exit_2_with_one_line(
    summaries: dict[str, Path], tmp_path: Path, content: str | None, mentions: list[str]
) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert_bad_input(run_stepcli("compare", summaries["base"], bad), str(bad), *mentions)
    assert_bad_input(run_stepcli("compare", bad, summaries["base"]), str(bad), *mentions)


@pytest.mark.parametrize("tolerance", ["10", "ten", "-5%", "1.5", ""])
def test_bad_tolerance_is_a_usage_error(summaries: dict[str, Path], tolerance: str) -> None:
    assert_bad_input(
        run_stepcli("compare", summaries["base"], summaries["base"], "--tolerance", tolerance),
        "--tolerance",
    )


def test_bad_metric_and_min_delta_are_usage_errors(summaries: dict[str, Path]) -> None:
    assert_bad_input(
        run_stepcli("compare", summaries["base"], summaries["base"], "--metric", "p99"), "--metric"
    )
    assert_bad_input(
        run_stepcli("compare", summaries["base"], summaries["base"], "--min-delta-ms", "-1"),
        "--min-delta-ms",
    )


# ---------------------------------------------------------------- Markdown and GitHub job summary


def test_markdown_file_is_valid_tables(summaries: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    result = run_stepcli("compare", summaries["base"], summaries["slow"], "--markdown", report)
    assert result.returncode == 1
    assert verdict(result.stdout).startswith("REGRESSION")  # the terminal report is still printed
    text = report.read_text()
    steps, operators = markdown_tables(text)
    assert steps[0][:4] == ["steps", "stat", "baseline", "current"]
    assert ["untouched", "**median**", "10.000", "20.000", "+10.000", "+100.0%", "decides"] in steps
    assert operators[0][0] == "operator"
    assert ["`aten::sleepy`", "-", "40.000", "-", "-", "not in baseline top"] in operators
    assert "**REGRESSION**: median step time" in text


def test_markdown_replaces_only_a_report_compare_wrote(
    summaries: dict[str, Path], tmp_path: Path
) -> None:
    # GIVEN a report compare wrote before (a CI job run again) WHEN written again THEN it is
    # replaced
    report = tmp_path / "report.md"
    assert (
        run_stepcli(
            "compare", summaries["base"], summaries["slow"], "--markdown", report
        ).returncode
        == 1
    )
    assert (
        run_stepcli(
            "compare", summaries["base"], summaries["base"], "--markdown", report
        ).returncode
        == 0
    )
    assert report.read_text().startswith("### stepcli compare: NO CHANGE")
    # GIVEN anything else at the path: the user's note, the baseline itself, a link to a file, a
    # FIFO, a folder
    note = tmp_path / "notes.md"
    note.write_text("# my notes\n")
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(summaries["base"].read_bytes())
    link = tmp_path / "link.md"
    link.symlink_to(report)
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    before = {
        p: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in (note, baseline, link, fifo)
    }
    for target in (note, baseline, link, fifo):
        # WHEN it is the --markdown path THEN one line, exit 2, before anything is compared, and
        # nothing replaced
        result = run_stepcli(
            "compare", baseline, summaries["slow"], "--markdown", target, timeout=60
        )
        assert_bad_input(result, f"{target}: ", "--markdown FILE")
    assert_bad_input(
        run_stepcli("compare", baseline, summaries["slow"], "--markdown", tmp_path), "--markdown"
    )
    assert (
        "was not written by stepcli compare"
        in run_stepcli("compare", baseline, baseline, "--markdown", baseline).stderr
    )
    after = {
        p: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in before
    }
    assert after == before
    assert os.readlink(link) == str(report)


def test_a_fifo_as_the_github_job_summary_never_hangs_the_gate(
    summaries: dict[str, Path], tmp_path: Path
) -> None:
    fifo = tmp_path / "summary"
    os.mkfifo(fifo)  # no reader: an ordinary open for writing would wait forever
    result = run_stepcli(
        "compare",
        summaries["base"],
        summaries["slow"],
        env={"GITHUB_STEP_SUMMARY": str(fifo)},
        timeout=60,
    )
    assert result.returncode == 1, result.stderr  # the verdict is unchanged
    assert "could not append to GITHUB_STEP_SUMMARY" in result.stderr


def test_the_github_job_summary_is_never_appended_to_an_input(
    summaries: dict[str, Path], tmp_path: Path
) -> None:
    # GIVEN GITHUB_STEP_SUMMARY pointing at the baseline itself (a variable mixed up in the job)
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(summaries["base"].read_bytes())
    result = run_stepcli(
        "compare", baseline, summaries["slow"], env={"GITHUB_STEP_SUMMARY": str(baseline)}
    )
    # THEN the verdict stands, the baseline is untouched (it stays valid JSON), and a warning says
    # why
    assert result.returncode == 1, result.stderr
    assert baseline.read_bytes() == summaries["base"].read_bytes()
    assert f"GITHUB_STEP_SUMMARY {baseline} is one of the inputs" in result.stderr


def test_the_deciding_mark_never_wraps_onto_a_row_of_its_own() -> None:
    # GIVEN README's own example, whose step times are too wide for "<- decides" at 80 columns
    examples = Path(__file__).parents[2] / "docs" / "examples"
    result = run_stepcli(
        "compare", examples / "base.json", examples / "bigbatch.json", env={"COLUMNS": "80"}
    )
    lines = result.stdout.splitlines()
    # THEN no table row holds the word alone; the short mark is explained under the table
    assert not [line for line in lines if line.replace("│", "").split() == ["decides"]], (
        result.stdout
    )
    assert (
        any(line.endswith("│ <- │") for line in lines) and "<- the statistic that decides" in lines
    )
    assert all(len(line) <= 80 for line in lines)


def test_markdown_to_stdout(summaries: dict[str, Path]) -> None:
    result = run_stepcli("compare", summaries["base"], summaries["base"], "--markdown", "-")
    assert result.returncode == 0
    assert result.stdout.startswith("### stepcli compare: NO CHANGE")
    assert "┃" not in result.stdout  # Markdown instead of the rich table, not both
    assert len(markdown_tables(result.stdout)) == 2


def test_github_step_summary_is_appended(summaries: dict[str, Path], tmp_path: Path) -> None:
    # GIVEN a job summary file that earlier steps already wrote to
    job_summary = tmp_path / "step_summary.md"
    job_summary.write_text("# Earlier step\n\nkeep me\n")
    env = {"GITHUB_STEP_SUMMARY": str(job_summary)}
    # WHEN two comparisons run in the job
    assert run_stepcli("compare", summaries["base"], summaries["base"], env=env).returncode == 0
    assert run_stepcli("compare", summaries["base"], summaries["zero"], env=env).returncode == 3
    # THEN both reports follow the earlier content, which is untouched
    text = job_summary.read_text()
    assert text.startswith("# Earlier step\n\nkeep me\n")
    assert text.index("### stepcli compare: NO CHANGE") < text.index(
        "### stepcli compare: NOTHING MEASURED"
    )
    assert len(markdown_tables(text)) >= 3


def test_steps_without_time_are_nothing_measured(tmp_path: Path) -> None:
    # GIVEN traces whose 12 steps all last 0 us (a clock that did not move), and one whose steps
    # take 10 us
    def steps_trace(name: str, dur: float) -> Path:
        events = []
        for step in range(12):
            events.append(
                {
                    "name": f"ProfilerStep#{step}",
                    "ph": "X",
                    "cat": "user_annotation",
                    "pid": 1,
                    "tid": 1,
                }
            )
            events[-1].update(ts=step * 100, dur=dur)
        path = tmp_path / name
        path.write_text(json.dumps({"traceEvents": events}))
        return path

    frozen, other, timed = (
        steps_trace("frozen.json", 0),
        steps_trace("other.json", 0),
        steps_trace("timed.json", 10),
    )
    # WHEN compared THEN nothing was measured (exit 3), never NO CHANGE (+0 ms within tolerance) nor
    # a -100% change
    for base, current in ((frozen, other), (timed, frozen)):
        result = run_stepcli("compare", base, current)
        assert result.returncode == 3, result.stdout
        assert (
            "NOTHING MEASURED" in result.stdout and "only recorded steps of 0 ms" in result.stdout
        )


def test_traces_with_no_operator_in_common_are_said_to_be_different_programs(
    tmp_path: Path,
) -> None:
    def trace_of(name: str, op: str) -> Path:
        events = []
        for step in range(12):
            events.append(
                {
                    "name": f"ProfilerStep#{step}",
                    "ph": "X",
                    "cat": "user_annotation",
                    "pid": 1,
                    "tid": 1,
                }
            )
            events[-1].update(ts=step * 100, dur=50)
            events.append(
                {
                    "name": op,
                    "ph": "X",
                    "cat": "cpu_op",
                    "pid": 1,
                    "tid": 1,
                    "ts": step * 100 + 1,
                    "dur": 40,
                }
            )
        path = tmp_path / name
        path.write_text(json.dumps({"traceEvents": events}))
        return path

    train, serve = trace_of("train.json", "aten::mm"), trace_of("serve.json", "aten::conv2d")
    result = run_stepcli("compare", train, serve)
    assert "stepcli: warning: baseline and current have no operator in common" in result.stderr
    assert (
        "no operator in common"
        not in run_stepcli("compare", train, trace_of("again.json", "aten::mm")).stderr
    )
