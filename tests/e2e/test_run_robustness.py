"""The program always comes first: threads, compile, async, mixed profilers, agent failures, odd
environments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    profiler_steps,
    run_python,
    run_stepcli,
    stepcli_env,
    trace_files,
    write_script,
)


def run_json(
    tmp_path: Path, script: Path, *options: str, **kwargs: object
) -> tuple[object, dict | None]:
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        *options,
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
        **kwargs,
    )
    summary = (
        json.loads((tmp_path / "run.json").read_text())
        if (tmp_path / "run.json").exists()
        else None
    )
    return result, summary


def test_training_on_a_thread_counts_steps_and_never_crashes(tmp_path: Path) -> None:
    # GIVEN a loop trained on a worker thread that ends mid-schedule (plain torch.profiler would
    # crash at exit if a window were left open on that thread)
    script = write_script(
        tmp_path,
        "threaded.py",
        """
        import sys, threading, torch
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        def train(n):
            for _ in range(n):
                model(torch.randn(8, 16)).sum().backward(); opt.step()
        worker = threading.Thread(target=train, args=(3,)); worker.start(); worker.join()
        print("done"); sys.exit(0)
    """,
    )
    result, summary = run_json(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert summary is not None and summary["steps"]["global"] == 3
    assert any("main thread" in note for note in summary["notes"])


def test_legacy_profiler_started_before_the_optimizer_is_not_emptied(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "legacy.py",
        """
        import torch
        model = torch.nn.Linear(4, 1)
        with torch.autograd.profiler.profile() as prof:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(8):
                model(torch.randn(2, 4)).sum().backward(); opt.step()
        prof.export_chrome_trace("own.json")
        print(len(prof.function_events))
    """,
    )
    plain = run_python(script, cwd=tmp_path)
    result, summary = run_json(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 100 and abs(int(result.stdout) - int(plain.stdout)) < 50
    assert trace_files(tmp_path / "out") == []
    assert summary is not None and summary["steps"]["global"] == 8


@pytest.mark.parametrize(
    "opener", ["torch.autograd.profiler.emit_itt()", "torch.autograd.profiler_legacy.profile()"]
)
def test_a_profiler_the_program_opens_inside_the_window_never_fails_it(
    tmp_path: Path, opener: str
) -> None:
    # GIVEN a program that opens torch's ITT emitter or the legacy profiler in step 3, inside
    # stepcli's window (steps 2-3)
    script = write_script(
        tmp_path,
        "opens.py",
        f"""
        import torch
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def train(n):
            for _ in range(n):
                model(torch.randn(4, 16)).sum().backward(); opt.step()
        train(3)
        with {opener}:
            train(3)
        train(4)
        print("done")
    """,
    )
    result, summary = run_json(tmp_path, script)
    # THEN the program runs to its end (it raised "Profiler is already enabled on this thread"),
    # stepcli's window is saved up to there, and every step is counted
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert "Traceback" not in result.stderr
    (trace,) = trace_files(tmp_path / "out")
    # step 2 whole, the start of step 3 up to the program's profiler
    assert profiler_steps(trace) == [2, 3]
    assert "cut short: the program started its own profiler" in result.stderr
    assert summary is not None and summary["steps"]["global"] == 10


def test_an_agent_failure_never_reaches_the_program(tmp_path: Path) -> None:
    # GIVEN an output folder that disappears (replaced by a file) before the program builds its
    # optimizer
    script = write_script(
        tmp_path,
        "vanish.py",
        """
        import os, shutil, sys, torch
        out = sys.argv[1]
        shutil.rmtree(out); open(out, "w").close()
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        for _ in range(4):
            opt.step()
        print("trained")
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run", "--wait", "0", "--warmup", "0", "-o", out, script, out, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    assert "Traceback" not in result.stderr
    assert "stepcli: " in result.stderr


def test_step_on_in_threads_counts_every_call(tmp_path: Path) -> None:
    write_script(
        tmp_path,
        "serverlib.py",
        """
        import time
        class Server:
            def infer(self, x):
                time.sleep(0.0005)
                return x * 2
    """,
    )
    script = write_script(
        tmp_path,
        "threads.py",
        """
        import threading, torch
        from serverlib import Server
        server = Server()
        def client():
            for i in range(50):
                server.infer(i)
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
    """,
    )
    result, summary = run_json(tmp_path, script, "--step-on", "serverlib:Server.infer")
    assert result.returncode == 0, result.stderr
    assert summary is not None and summary["steps"]["global"] == 200


@pytest.mark.parametrize("trains", [True, False])
def test_step_on_a_name_the_module_lacks_says_so(tmp_path: Path, trains: bool) -> None:
    # GIVEN --step-on naming a class the imported module does not have (a typo), in a program that
    # still trains, or in an inference program that has no other step (so no step log: only the
    # launcher's child says it)
    write_script(tmp_path, "servelib.py", "def serve(x):\n    return x\n")
    script = write_script(
        tmp_path,
        "typo.py",
        f"""
        import torch, servelib
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        for _ in range(4):
            servelib.serve(1)
            {"opt.step()" if trains else "pass"}
    """,
    )
    result, summary = run_json(tmp_path, script, "--step-on", "servelib:Nope.serve")
    assert result.returncode == 0, result.stderr
    # THEN one line names what is missing, in stepcli's words: not Python's "partially initialized
    # module ... (most likely due to a circular import)", nor a guess that the module was never
    # imported
    assert "could not hook servelib (servelib has no attribute 'Nope'" in result.stderr
    assert "circular" not in result.stderr and "never imported" not in result.stderr
    assert summary is not None and any("no attribute 'Nope'" in note for note in summary["notes"])
    notes = " ".join(summary["notes"])
    assert "never imported" not in notes and "name the step with --step-on" not in notes, notes


def test_step_on_async_function_stays_a_coroutine_function(tmp_path: Path) -> None:
    write_script(
        tmp_path,
        "asynclib.py",
        """
        import asyncio
        async def handle(x):
            await asyncio.sleep(0)
            return x + 1
    """,
    )
    script = write_script(
        tmp_path,
        "serve_async.py",
        """
        import asyncio, inspect, torch
        import asynclib
        print(inspect.iscoroutinefunction(asynclib.handle))
        async def main():
            for i in range(6):
                assert await asynclib.handle(i) == i + 1
        asyncio.run(main())
    """,
    )
    result, summary = run_json(tmp_path, script, "--step-on", "asynclib:handle")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"
    assert summary is not None and summary["steps"] == {
        "global": 6,
        "requesters": {"asynclib:handle": 6},
    }
    assert [profiler_steps(t) for t in trace_files(tmp_path / "out")] == [[2, 3]]


def test_step_on_inside_torch_compile_fullgraph_does_not_break_it(tmp_path: Path) -> None:
    write_script(
        tmp_path,
        "netlib.py",
        """
        import torch
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)
            def forward(self, x):
                return torch.relu(self.lin(x))
    """,
    )
    script = write_script(
        tmp_path,
        "compiled.py",
        """
        import torch
        from netlib import Net
        model = torch.compile(Net(), fullgraph=True, backend="eager")
        for _ in range(3):
            model(torch.randn(2, 8))
        print("ok")
    """,
    )
    result, _ = run_json(tmp_path, script, "--step-on", "netlib:Net.forward", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


def test_grad_scaler_iterations_count_even_when_the_optimizer_step_is_skipped(
    tmp_path: Path,
) -> None:
    # GIVEN a scale so large that every iteration overflows, so GradScaler skips every
    # optimizer.step()
    script = write_script(
        tmp_path,
        "scaler.py",
        """
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
        for _ in range(6):
            opt.zero_grad()
            scaler.scale(model(torch.randn(2, 4) * 1e30).sum()).backward()
            scaler.step(opt)
            scaler.update()
    """,
    )
    result, summary = run_json(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert summary is not None and summary["steps"] == {"global": 6, "requesters": {"SGD#0": 6}}


def test_empty_pythonpath_entry_still_means_the_current_directory(tmp_path: Path) -> None:
    write_script(tmp_path, "cwdmod/helper.py", "VALUE = 'from cwd'\n")
    script = write_script(tmp_path, "scripts/use.py", "import helper\nprint(helper.VALUE)\n")
    env = {"PYTHONPATH": os.pathsep + str(tmp_path / "nowhere")}
    plain = run_python(script, cwd=tmp_path / "cwdmod", env=env)
    ours = run_stepcli(
        "run", "-q", "-o", tmp_path / "out", script, cwd=tmp_path / "cwdmod", env=env
    )
    assert plain.stdout == ours.stdout == "from cwd\n", ours.stderr


def test_sigint_sent_to_stepcli_alone_reaches_the_program(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "waits.py",
        """
        import time
        try:  # the signal may land while print() is still returning: inside the try too
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
    """,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepcli", "run", "-q", "-o", str(tmp_path / "out"), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stepcli_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)  # a scheduler's kill -INT, not the terminal's Ctrl-C
    stdout, _ = proc.communicate(timeout=60)
    assert "interrupted" in stdout
    assert proc.returncode == 128 + signal.SIGINT


def test_sigusr1_is_forwarded(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "usr1.py",
        """
        import signal, sys, time
        signal.signal(signal.SIGUSR1, lambda *a: (print("checkpointing", flush=True), sys.exit(0)))
        print("ready", flush=True)
        time.sleep(60)
    """,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepcli", "run", "-q", "-o", str(tmp_path / "out"), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stepcli_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGUSR1)
    stdout, _ = proc.communicate(timeout=60)
    assert "checkpointing" in stdout and proc.returncode == 0


def test_unwritable_json_path_fails_before_the_program_starts(
    tmp_path: Path, train_script: Path
) -> None:
    (tmp_path / "afile").write_text("")
    result = run_stepcli(
        "run", "--json", tmp_path / "afile" / "run.json", "-o", tmp_path / "out", train_script
    )
    assert result.returncode == 2
    assert result.stdout == ""  # the program never ran
    assert result.stderr.startswith("stepcli: error: --json")


def test_concurrent_async_calls_each_count(tmp_path: Path) -> None:
    write_script(
        tmp_path,
        "aserve.py",
        """
        import asyncio
        async def handle(x):
            await asyncio.sleep(0.001)
            return x
    """,
    )
    script = write_script(
        tmp_path,
        "gather.py",
        """
        import asyncio, torch
        import aserve
        async def main():
            for _ in range(3):
                await asyncio.gather(*(aserve.handle(i) for i in range(10)))
            for i in range(10):
                await aserve.handle(i)
        asyncio.run(main())
    """,
    )
    result, summary = run_json(tmp_path, script, "--step-on", "aserve:handle")
    assert result.returncode == 0, result.stderr
    assert summary is not None and summary["steps"]["global"] == 40


def test_a_step_on_another_thread_ends_the_window_cleanly(tmp_path: Path) -> None:
    write_script(
        tmp_path,
        "worklib.py",
        """
        import torch
        def step():
            torch.randn(64, 64) @ torch.randn(64, 64)
    """,
    )
    script = write_script(
        tmp_path,
        "mixed.py",
        """
        import threading
        from worklib import step
        for _ in range(4):
            step()                      # window opens at step 1 (warmup), records 2-3 on the main thread
        worker = threading.Thread(target=lambda: [step() for _ in range(3)])
        worker.start(); worker.join()   # steps made elsewhere while the window is open
        for _ in range(3):
            step()
        print("done")
    """,  # noqa: E501
    )
    result, summary = run_json(tmp_path, script, "--active", "4", "--step-on", "worklib:step")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert summary is not None and summary["steps"]["global"] == 10
    (window,) = summary["windows"]
    assert (window["first_step"], window["last_step"], window["complete"]) == (2, 3, False)
    assert "another thread" in window["note"]


def test_programs_profiler_on_another_thread_during_our_window_does_not_crash(
    tmp_path: Path,
) -> None:
    script = write_script(
        tmp_path,
        "side_profiler.py",
        """
        import threading, torch
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
        for _ in range(3):
            opt.step()                  # our window is open from step 1
        events = {}
        def profile_on_the_side():
            with torch.profiler.profile() as prof:
                torch.randn(64, 64) @ torch.randn(64, 64)
            events["n"] = len(prof.events())
        side = threading.Thread(target=profile_on_the_side); side.start(); side.join()
        for _ in range(4):
            opt.step()
        print(events["n"] > 0)
    """,
    )
    result, summary = run_json(tmp_path, script, "--active", "6")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"
    assert summary is not None and any("abandoned" in note for note in summary["notes"])


def test_an_agent_error_during_a_window_never_crashes_the_program(tmp_path: Path) -> None:
    # GIVEN stepcli's own bookkeeping failing while a window is open (simulated through the agent's
    # failure path)
    script = write_script(
        tmp_path,
        "fails_inside.py",
        """
        import sys, torch
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
        for i in range(8):
            opt.step()
            if i == 2:
                sys.modules["_stepcli_agent.runtime"]._agent.fail("a test", RuntimeError("boom"))
        print("finished")
    """,
    )
    result, summary = run_json(tmp_path, script, "--active", "4")
    # THEN one line says profiling stopped, the program finishes normally, and its steps so far are
    # reported
    assert result.returncode == 0, result.stderr
    assert result.stdout == "finished\n"
    assert (
        "profiling disabled in this process after an error in a test: RuntimeError: boom"
        in result.stderr
    )
    assert summary is not None and summary["steps"]["global"] == 3


def test_stepcli_lines_never_land_in_what_the_program_made_of_stderr(tmp_path: Path) -> None:
    # GIVEN a program that captures its stderr in a buffer, as a test harness or a logging setup
    # does
    script = write_script(
        tmp_path,
        "captures.py",
        """
        import io, sys
        import torch
        mine = io.StringIO()
        sys.stderr = mine
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        print("the program's own line", file=sys.stderr)
        sys.stderr = sys.__stderr__
        print("captured: " + repr(mine.getvalue()), file=sys.stderr)
        """,
    )
    # WHEN run THEN stepcli's progress lines reach the launcher's terminal, and the program's buffer
    # holds only its own
    result = run_stepcli("run", "--active", "1", "-o", tmp_path / "out", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stepcli: saved trace of step 2" in result.stderr
    assert 'captured: "the program\'s own line\\n"' in result.stderr, result.stderr
