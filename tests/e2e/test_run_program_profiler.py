"""The program's own profiler: stepcli steps aside only while it warms up or records, never while it
sits idle."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import load_trace, profiler_steps, run_stepcli, trace_files, write_script


def _ops(path: Path) -> set[str]:
    return {
        e["name"]
        for e in load_trace(path)["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
    }


def test_tutorial_profiler_idle_after_its_cycle_leaves_our_windows_recording(
    tmp_path: Path,
) -> None:
    # GIVEN PyTorch's tutorial pattern: the whole loop inside profile(schedule(wait=0, warmup=1,
    # active=2, repeat=1)), which collects its steps 0-2 and then sits idle for the rest of the loop
    script = write_script(
        tmp_path,
        "tutorial.py",
        """
        import torch
        from torch.profiler import profile, schedule, tensorboard_trace_handler
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                     on_trace_ready=tensorboard_trace_handler("own", worker_name="mine")) as prof:
            for i in range(10):
                model(torch.randn(8, 16)).square().mean().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--skip-first",
        "4",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "1",
        "--repeat",
        "5",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # THEN stepcli records its windows at global steps 6 and 9, one trace each, each step annotated
    # once
    traces = trace_files(out)
    assert [profiler_steps(t) for t in traces] == [[6], [9]]
    for trace in traces:
        assert "aten::addmm" in _ops(trace)
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [(w["first_step"], w["last_step"], w["complete"]) for w in summary["windows"]] == [
        (6, 6, True),
        (9, 9, True),
    ]
    # AND the program's own trace is intact: its steps 1-2 (its numbering), with their operators
    (own,) = trace_files(tmp_path / "own")
    assert profiler_steps(own) == [1, 2]
    assert {"aten::addmm", "Optimizer.step#SGD.step"} <= _ops(own)
    # AND only the steps its profiler touched (prepared at step 0, recorded 1-2, stopped and saved
    # during 3) are marked as the program's: 4 = the program's profiler, 0 untouched, 1 warmup, 3
    # recorded, 5 after our window
    assert summary["timeline_phases"] == "4444013513"
    assert "3 step(s) ran under the program's own profiler" in " ".join(summary["notes"])
    assert summary["step_time_ms"]["untouched"]["count"] == 1
    assert "skipped" not in " ".join(summary["notes"])


def test_program_profiler_leaving_idle_mid_window_cuts_ours_short_and_both_traces_keep_their_steps(
    tmp_path: Path,
) -> None:
    # GIVEN a program profiler that waits 5 steps, then warms up at its step 5 and records its step
    # 6, while stepcli's window records steps 2-6
    script = write_script(
        tmp_path,
        "late.py",
        """
        import torch
        from torch.profiler import profile, schedule, tensorboard_trace_handler
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(schedule=schedule(wait=5, warmup=1, active=1, repeat=1),
                     on_trace_ready=tensorboard_trace_handler("own", worker_name="mine")) as prof:
            for i in range(10):
                model(torch.randn(8, 16)).sum().backward()
                opt.step()
                prof.step()
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "5",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # THEN ours was saved first, cut short when the program's profiler began to warm up during step
    # 5 ...
    (ours,) = trace_files(out)
    # one annotation per step: the idle profiler's were left out
    assert profiler_steps(ours) == [2, 3, 4, 5]
    assert load_trace(ours)["stepcli_incomplete_step"] == "5"
    (window,) = json.loads((tmp_path / "run.json").read_text())["windows"]
    assert (window["first_step"], window["last_step"], window["complete"]) == (2, 4, False)
    assert "the program started its own profiler" in window["note"]
    # ... and the program's profiler then recorded its step 6, with its events
    (own,) = trace_files(tmp_path / "own")
    assert profiler_steps(own) == [6]
    assert "aten::addmm" in _ops(own)


def test_a_window_ending_where_the_programs_profiler_starts_is_saved_whole(tmp_path: Path) -> None:
    # GIVEN a loop stepped only by its own profiler (no optimizer), which starts warming up at its
    # step 5, the step right after stepcli's window of steps 2-4
    script = write_script(
        tmp_path,
        "infer.py",
        """
        import torch
        from torch.profiler import profile, schedule, tensorboard_trace_handler
        model = torch.nn.Linear(16, 4)
        with profile(schedule=schedule(wait=5, warmup=1, active=1, repeat=1),
                     on_trace_ready=tensorboard_trace_handler("own", worker_name="mine")) as prof:
            for i in range(8):
                with torch.no_grad():
                    model(torch.randn(8, 16))
                prof.step()
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "3",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # THEN the step() that ends step 4 ends our window first: it is saved whole (it was cut at step
    # 3, the start of step 4 counted as cut off), and the program's profiler then records its step 6
    (ours,) = trace_files(out)
    assert profiler_steps(ours) == [2, 3, 4]
    assert "stepcli_incomplete_step" not in load_trace(ours)
    summary = json.loads((tmp_path / "run.json").read_text())
    (window,) = summary["windows"]
    assert (window["first_step"], window["last_step"], window["complete"]) == (2, 4, True)
    assert summary["steps"]["global"] == 8
    (own,) = trace_files(tmp_path / "own")
    assert profiler_steps(own) == [6]
    assert "aten::addmm" in _ops(own)


def test_window_is_not_opened_when_the_programs_profiler_is_about_to_collect(
    tmp_path: Path,
) -> None:
    # GIVEN a program profiler that starts recording at its step 1, when stepcli's first window
    # would warm up
    script = write_script(
        tmp_path,
        "soon.py",
        """
        import torch
        from torch.profiler import profile, schedule
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(schedule=schedule(wait=1, warmup=0, active=2, repeat=1)) as prof:
            for _ in range(6):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                prof.step()
        print(len(prof.events()))
    """,
    )
    result = run_stepcli(
        "run", "-o", tmp_path / "out", "--json", tmp_path / "run.json", script, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    # THEN stepcli skipped that cycle instead of opening a window it would have to drop at once
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["windows"] == [] and trace_files(tmp_path / "out") == []
    assert "not saved" not in result.stderr
    assert "1 window(s) skipped while the program ran its own profiler" in " ".join(
        summary["notes"]
    )
    assert int(result.stdout) > 10  # the program's profiler kept its events


def test_a_child_forked_after_the_programs_own_profiler_ran_exits(tmp_path: Path) -> None:
    # GIVEN a program whose own profiler ran (stepcli records nothing: --on-demand), which then
    # forks a helper that ends with sys.exit(4) (plain torch hangs such a child forever at exit, in
    # Kineto's teardown)
    script = write_script(
        tmp_path,
        "forks.py",
        """
        import os, sys
        import torch
        from torch.profiler import profile, schedule
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(schedule=schedule(wait=0, warmup=1, active=2), on_trace_ready=lambda p: None) as prof:
            for _ in range(4):
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
                prof.step()
        pid = os.fork()
        if pid == 0:
            print("helper done", flush=True)
            sys.exit(4)
        print("helper status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """,  # noqa: E501
    )
    result = run_stepcli("run", "-q", "--on-demand", "-o", tmp_path / "out", script, timeout=90)
    # THEN the helper exits with its own status and the run ends
    assert result.returncode == 0, result.stderr
    assert "helper done" in result.stdout and "helper status 4" in result.stdout
