"""`stepcli run` end to end: real stepcli subprocesses running real small torch scripts on the
CPU."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    TRAIN_LOOP,
    load_trace,
    profiler_steps,
    run_stepcli,
    trace_files,
    write_script,
)

# What TRAIN_LOOP prints over 10 iterations, as plain `python` prints it.
PROGRAM_STDOUT = "".join(f"iter {i}\n" for i in range(10))


@pytest.fixture(scope="module")
def scheduled_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 10-iteration loop under `--wait 1 --warmup 1 --active 2`, with a --fail-over budget it
    stays far within."""
    tmp = tmp_path_factory.mktemp("scheduled")
    script = write_script(tmp, "train.py", TRAIN_LOOP)
    out = tmp / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        "--fail-over",
        "p50=100000",
        "-o",
        out,
        script,
        cwd=tmp,
    )
    return {"result": result, "out": out}


def test_records_exactly_the_scheduled_steps_and_leaves_stdout_alone(
    scheduled_run: dict[str, Any],
) -> None:
    # GIVEN a 10-iteration one-optimizer loop WHEN it runs under stepcli with wait 1, warmup 1,
    # active 2
    result, out = scheduled_run["result"], scheduled_run["out"]
    # THEN one trace holds ProfilerStep#2 and #3 only, stdout is the program's alone, exit 0
    assert result.returncode == 0, result.stderr
    traces = trace_files(out)
    assert len(traces) == 1
    assert profiler_steps(traces[0]) == [2, 3]
    assert result.stdout == PROGRAM_STDOUT
    assert "stepcli: " in result.stderr and "saved trace of steps 2-3" in result.stderr
    assert re.search(r"^steps\s+10\s+\(SGD#0 10\)", result.stderr, re.M)
    assert not list(out.rglob("*.tmp*"))
    # AND the trace says which clock its times come from: this host and this boot (aligning ranks of
    # one machine)
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    if boot_id.exists():
        clock = json.loads(traces[0].read_text())["stepcli_clock"]
        assert clock == f"{socket.gethostname()} {boot_id.read_text().strip()}", clock


def test_fail_over_within_budget_passes(scheduled_run: dict[str, Any]) -> None:
    # GIVEN a healthy program WHEN its median step time is far within the --fail-over budget THEN
    # exit 0, and one line saying the budget held, with the figures (issue 49: it said nothing)
    result = scheduled_run["result"]
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "--fail-over: " in line]
    assert len(lines) == 1 and re.fullmatch(
        r"stepcli: --fail-over: passed: median \(p50\) \w+ step time [\d.,]+ ms <= 100000 ms "
        r"\(over \d+ steps?\)",
        lines[0],
    ), lines


@pytest.fixture(scope="module")
def default_folder_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs of the 5-iteration loop without -o from one folder: the first with --json, the
    second --quiet --gzip --no-report."""
    tmp = tmp_path_factory.mktemp("default_out")
    script = write_script(tmp, "train.py", TRAIN_LOOP)
    first = run_stepcli("run", "--active", "1", "--json", tmp / "a.json", script, "5", cwd=tmp)
    second = run_stepcli(
        "run", "--active", "1", "--quiet", "--gzip", "--no-report", script, "5", cwd=tmp
    )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    return {
        "first": first,
        "second": second,
        "runs": tmp / "stepcli-runs",
        "summary": tmp / "a.json",
    }


def test_trace_names_follow_tensorboard(default_folder_runs: dict[str, Any]) -> None:
    # GIVEN --gzip on the second run THEN its one trace is <worker>.<time_ns>.pt.trace.json.gz, the
    # first's not gzipped
    (trace,) = [t for t in trace_files(default_folder_runs["runs"]) if t.name.endswith(".gz")]
    worker, stamp, *rest = trace.name.split(".")
    assert rest == ["pt", "trace", "json", "gz"]
    assert stamp.isdigit() and len(stamp) >= 19  # time_ns
    assert "_" in worker  # <host>_<pid> without RANK
    assert profiler_steps(trace) == [2]


def test_default_out_dir_is_new_per_run(default_folder_runs: dict[str, Any]) -> None:
    runs = sorted(p for p in default_folder_runs["runs"].iterdir())
    assert len(runs) == 2 and all(len(trace_files(r)) == 1 for r in runs)


def test_quiet_prints_nothing_of_stepcli(default_folder_runs: dict[str, Any]) -> None:
    # --quiet: nothing from stepcli (torch may still log)
    assert "stepcli" not in default_folder_runs["second"].stderr


def test_quiet_without_a_report_still_saves_the_run_summary(
    default_folder_runs: dict[str, Any],
) -> None:
    # (issue 30, item 18) nothing shows the summary, but `stepcli report OUT` later needs it
    (trace,) = [t for t in trace_files(default_folder_runs["runs"]) if t.name.endswith(".gz")]
    out = trace.parent
    (saved,) = out.glob(".stepcli/*/summary.json")
    assert json.loads(saved.read_text())["steps"]["global"] == 5
    assert not (out / "report.html").exists()
    (first,) = [r for r in default_folder_runs["runs"].iterdir() if r != out]
    assert (first / "report.html").exists()  # (the run without --no-report wrote its report)


def test_json_summary(default_folder_runs: dict[str, Any]) -> None:
    summary = json.loads(default_folder_runs["summary"].read_text())
    assert summary["schema"] == "stepcli.run" and summary["schema_version"] == 2
    assert len(summary["run_id"]) == 32
    [process] = summary["step_times"]
    assert (
        len(process["durations_ms"]) == len(process["phases"]) == 5
        and process["phases"][1:3] != "00"
    )
    assert summary["exit_status"] == 0
    assert summary["steps"] == {"global": 5, "requesters": {"SGD#0": 5}}
    # step 4 (0 is start-up; 1-2 profiled; 3, the first after the window, set aside)
    assert summary["step_time_ms"]["untouched"]["count"] == 1
    assert summary["step_time_ms"]["after_window"]["count"] == 1
    assert summary["step_time_ms"]["profiled"]["count"] == 2
    assert [(w["first_step"], w["last_step"]) for w in summary["windows"]] == [(2, 2)]
    assert summary["traces"] == [w["trace"] for w in summary["windows"]]


def test_without_with_flops_no_flops(default_folder_runs: dict[str, Any]) -> None:
    assert json.loads(default_folder_runs["summary"].read_text())["flops"] is None
    assert not list(default_folder_runs["runs"].rglob("*.flops"))


def test_a_program_that_never_compiles_has_no_compile_section(
    default_folder_runs: dict[str, Any],
) -> None:
    assert json.loads(default_folder_runs["summary"].read_text())["compile"] is None


def test_skip_first_and_repeat_are_honoured(tmp_path: Path, train_script: Path) -> None:
    # GIVEN 12 iterations WHEN the first 3 steps are skipped, then two cycles of wait 1, warmup 1,
    # active 2 run
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--skip-first",
        "3",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        "--repeat",
        "2",
        "-o",
        out,
        train_script,
        "12",
    )
    # THEN two traces, each of its cycle's last two steps, counted after the skipped ones (without
    # the skip they would be 2-3 and 6-7; without the repeat 5-6 alone)
    assert result.returncode == 0, result.stderr
    assert sorted(profiler_steps(t) for t in trace_files(out)) == [[5, 6], [9, 10]]


def test_repeat_zero_records_until_the_program_ends(tmp_path: Path, train_script: Path) -> None:
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "0",
        "--active",
        "1",
        "--repeat",
        "0",
        "-o",
        out,
        train_script,
        "10",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(profiler_steps(t) for t in trace_files(out)) == [[1], [3], [5], [7], [9]]


# Generated code (dataclasses, torch.compile, exec) can have a filename holding double quotes;
# PyTorch writes such a frame's name into the trace unescaped (pytorch/pytorch#146900), which
# stepcli repairs before the trace is named.
QUOTED_FRAME = """
    namespace = {}
    exec(compile("def generated(x):\\n    return x\\n", '{"device": "cpu"}/gen.py', "exec"), namespace)
    torch.nn.Linear.forward = (lambda forward: lambda self, x: namespace["generated"](forward(self, x)))(
        torch.nn.Linear.forward
    )
"""  # noqa: E501


def test_window_at_step_zero_and_profiler_flags(tmp_path: Path) -> None:
    out = tmp_path / "out"
    train_script = write_script(
        tmp_path,
        "train.py",
        TRAIN_LOOP.replace("\n    def main", QUOTED_FRAME + "\n    def main", 1),
    )
    result = run_stepcli(
        "run",
        "--wait",
        "0",
        "--warmup",
        "0",
        "--active",
        "2",
        "--record-shapes",
        "--with-stack",
        "--activities",
        "cpu",
        "-o",
        out,
        train_script,
        "4",
    )
    assert result.returncode == 0, result.stderr
    (trace,) = trace_files(out)
    assert profiler_steps(trace) == [0, 1]
    ops = [e for e in load_trace(trace)["traceEvents"] if e.get("cat") == "cpu_op"]
    # --record-shapes reached torch.profiler
    assert any("Input Dims" in e.get("args", {}) for e in ops)
    # --with-stack reached it too, and the frame with quotes in its name left the trace valid JSON
    # (load_trace)
    frames = {
        e["name"] for e in load_trace(trace)["traceEvents"] if e.get("cat") == "python_function"
    }
    assert '{"device": "cpu"}/gen.py(1): generated' in frames
    assert "could not summarize" not in result.stderr, result.stderr
    assert not list(out.rglob("*.tmp*"))


def test_no_trace_when_the_program_stops_before_the_window(
    tmp_path: Path, train_script: Path
) -> None:
    out = tmp_path / "out"
    result = run_stepcli("run", "--wait", "5", "-o", out, train_script, "1")
    assert result.returncode == 0, result.stderr
    assert trace_files(out) == []
    # not "1 steps"
    assert "the program made 1 step, and the first window records steps 6-" in result.stderr


def test_no_trace_when_the_program_ends_as_the_window_opens(
    tmp_path: Path, train_script: Path
) -> None:
    # GIVEN a program that makes 2 steps, and a window of steps 2-3: it opens as the program exits
    # normally
    out = tmp_path / "out"
    result = run_stepcli(
        "run", "--wait", "1", "--warmup", "1", "--active", "2", "-o", out, train_script, "2"
    )
    assert result.returncode == 0, result.stderr
    assert trace_files(out) == []
    # THEN the note says that no step of the window ran, not that a SIGKILL or a crash lost its
    # trace
    assert "the program made 2 steps, and the first window records steps 2-3" in result.stderr
    assert "SIGKILL" not in result.stderr and "hard crash" not in result.stderr


def test_script_without_torch_runs_normally_with_a_clear_note(tmp_path: Path) -> None:
    script = write_script(tmp_path, "plain.py", "print('hello')\n")
    result = run_stepcli("run", "-o", tmp_path / "out", script)
    assert result.returncode == 0
    assert result.stdout == "hello\n"
    assert "no steps observed: the program never imported torch" in result.stderr
    assert trace_files(tmp_path / "out") == []


def test_torch_without_steps_suggests_step_on(tmp_path: Path) -> None:
    script = write_script(tmp_path, "infer.py", "import torch\nprint(torch.ones(2).sum().item())\n")
    result = run_stepcli("run", "-o", tmp_path / "out", script)
    assert result.returncode == 0
    assert "--step-on" in result.stderr and "no steps observed" in result.stderr


def test_isolated_interpreter_explains_that_the_hook_never_loaded(
    tmp_path: Path, train_script: Path
) -> None:
    import sys

    result = run_stepcli(
        "run", "-o", tmp_path / "out", "--", sys.executable, "-I", train_script, "3"
    )
    assert result.returncode == 0, result.stderr
    assert "hook never loaded" in result.stderr and "-I" in result.stderr


def test_fail_over_budget_gates_the_run(tmp_path: Path, train_script: Path) -> None:
    # GIVEN a healthy program; WHEN its median step time is over budget THEN stepcli exits 1 and
    # says why (a run within its budget: test_fail_over_within_budget_passes)
    over = run_stepcli(
        "run", "--active", "1", "--fail-over", "p50=0.0001", "-o", tmp_path / "a", train_script, "8"
    )
    assert over.returncode == 1
    assert "--fail-over: " in over.stderr and "median" in over.stderr


def test_fail_over_keeps_the_programs_own_failure(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "fails.py",
        """
        import sys
        import torch
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        for _ in range(6):
            opt.step()
        sys.exit(4)
    """,
    )
    result = run_stepcli(
        "run", "--active", "1", "--fail-over", "max=0.0000001", "-o", tmp_path / "out", script
    )
    assert result.returncode == 4
    assert "--fail-over: " in result.stderr
