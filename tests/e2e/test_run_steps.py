"""Step semantics end to end: which calls count as steps, and that nothing double counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import load_trace, profiler_steps, run_stepcli, trace_files, write_script


def run_json(tmp_path: Path, script: Path, *options: str) -> tuple[dict, list[Path], str]:
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
    )
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "run.json").read_text()), trace_files(out), result.stderr


def test_two_optimizer_gan_counts_one_step_per_iteration(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "gan.py",
        """
        import torch
        g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        opt_g = torch.optim.Adam(g.parameters())
        opt_d = torch.optim.Adam(d.parameters())
        for _ in range(8):
            noise = torch.randn(8, 4)
            opt_d.zero_grad(); d(g(noise).detach()).mean().backward(); opt_d.step()
            opt_g.zero_grad(); (-d(g(noise)).mean()).backward(); opt_g.step()
    """,
    )
    summary, traces, _ = run_json(tmp_path, script)
    assert summary["steps"] == {"global": 8, "requesters": {"Adam#0": 8, "Adam#1": 8}}
    assert [profiler_steps(t) for t in traces] == [[2, 3]]


CLOSURE_SCRIPT = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1))
    opt = {optimizer}
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss
    for _ in range(6):
        opt.step(closure)
"""


@pytest.mark.parametrize(
    "optimizer",
    [
        "torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)",
        "torch.optim.SGD(model.parameters(), lr=0.01)",
    ],
    ids=["lbfgs", "sgd"],
)
def test_a_closure_step_counts_once_and_its_forward_and_backward_are_theirs(
    tmp_path: Path, optimizer: str
) -> None:
    # GIVEN `opt.step(closure)`, the closure running zero_grad, forward and backward inside the
    # optimizer's step
    script = write_script(tmp_path, "closure.py", CLOSURE_SCRIPT.format(optimizer=optimizer))
    summary, traces, stderr = run_json(tmp_path, script)
    assert summary["steps"]["global"] == 6
    assert [profiler_steps(t) for t in traces] == [[2, 3]]
    # THEN the breakdown gives the closure's forward and backward to forward and backward (it was
    # optimizer 95%, backward 0): the optimizer is what is left
    breakdown = summary["breakdown_ms"]
    total = sum(breakdown.values())
    assert breakdown["backward"] > 0 and breakdown["forward"] > 0, breakdown
    # (not a share: on a loaded machine a preemption inside the optimizer's own few operators moves
    # shares by tens of percent; what holds whatever the load: the optimizer's time is its step's
    # annotation less the closure calls in it, its zero_grad calls given back)
    table = run_stepcli("table", "--json", tmp_path / "out")
    assert table.returncode == 0, table.stderr
    total_ms = {row["name"]: row["total_ms"] for row in json.loads(table.stdout)["cpu_ops"]}
    step_ms = next(ms for name, ms in total_ms.items() if name.startswith("Optimizer.step#"))
    zero_grad_ms = next(
        ms for name, ms in total_ms.items() if name.startswith("Optimizer.zero_grad#")
    )
    own_ms = step_ms - total_ms["stepcli: optimizer closure"] + zero_grad_ms
    assert 0 < breakdown["optimizer"] * 2 <= own_ms + 0.01, (breakdown, total_ms)
    # ... the terminal's table says the same shares
    shares = stderr.split("Step breakdown", 1)[1]
    for phase, ms in breakdown.items():
        shown = re.search(rf"│ {phase} +│ +[0-9.]+ │ +([0-9.]+)% │", shares)
        assert shown is not None and float(shown.group(1)) == pytest.approx(
            100 * ms / total, abs=0.06
        ), (phase, shares)
    # ... and the report's headline names the same largest phase
    largest = max(breakdown, key=lambda phase: breakdown[phase])
    page = (tmp_path / "out" / "report.html").read_text()
    assert f"<span>largest phase</span><b>{largest} {breakdown[largest] / total:.0%}</b>" in page


def test_wrapped_optimizers_count_once(tmp_path: Path) -> None:
    # Shapes of HF accelerate's AcceleratedOptimizer (an Optimizer subclass that skips
    # Optimizer.__init__ and delegates), Lightning's LightningOptimizer (a plain wrapper), and a
    # subclass calling super().step().
    script = write_script(
        tmp_path,
        "wrapped.py",
        """
        import torch

        class AcceleratedOptimizer(torch.optim.Optimizer):
            def __init__(self, optimizer):
                self.optimizer = optimizer
            @property
            def param_groups(self):
                return self.optimizer.param_groups
            def zero_grad(self, set_to_none=True):
                self.optimizer.zero_grad(set_to_none)
            def step(self, closure=None):
                self.optimizer.step(closure)

        class LightningOptimizer:
            def __init__(self, optimizer):
                self._optimizer = optimizer
            def step(self, closure=None):
                return self._optimizer.step(closure)

        class MySGD(torch.optim.SGD):
            def step(self, closure=None):
                return super().step(closure)

        model = torch.nn.Linear(4, 1)
        first = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        second = LightningOptimizer(MySGD(model.parameters(), lr=0.1))
        for _ in range(7):
            model(torch.randn(2, 4)).sum().backward()
            first.step()
            second.step()
            first.zero_grad()
    """,
    )
    summary, traces, _ = run_json(tmp_path, script)
    assert summary["steps"] == {"global": 7, "requesters": {"SGD#0": 7, "MySGD#0": 7}}


def test_critic_stepping_five_times_drives_the_global_step_and_is_explained(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "wgan.py",
        """
        import torch
        critic, gen = torch.nn.Linear(2, 1), torch.nn.Linear(2, 2)
        opt_c = torch.optim.RMSprop(critic.parameters())
        opt_g = torch.optim.RMSprop(gen.parameters())
        for _ in range(3):
            for _ in range(5):
                critic(gen(torch.randn(4, 2)).detach()).mean().backward(); opt_c.step()
            gen(torch.randn(4, 2)).sum().backward(); opt_g.step()
    """,
    )
    summary, _, stderr = run_json(tmp_path, script)
    assert summary["steps"] == {"global": 15, "requesters": {"RMSprop#0": 15, "RMSprop#1": 3}}
    assert "stepped unequally" in stderr and "RMSprop#0" in stderr


def test_step_on_counts_an_inference_loop(tmp_path: Path) -> None:
    write_script(
        tmp_path,
        "servelib.py",
        """
        import torch
        class Server:
            def __init__(self):
                self.model = torch.nn.Linear(8, 2)
            def handle(self, batch):
                with torch.no_grad():
                    return self.model(batch)
    """,
    )
    script = write_script(
        tmp_path,
        "serve.py",
        """
        import torch
        from servelib import Server
        server = Server()
        for _ in range(6):
            server.handle(torch.randn(4, 8))
    """,
    )
    summary, traces, _ = run_json(tmp_path, script, "--step-on", "servelib:Server.handle")
    assert summary["steps"] == {"global": 6, "requesters": {"servelib:Server.handle": 6}}
    assert [profiler_steps(t) for t in traces] == [[2, 3]]


def test_programs_own_profiler_is_not_double_counted_and_keeps_working(tmp_path: Path) -> None:
    # The program profiles itself (steps 1-2 into its own folder) and calls prof.step() after
    # opt.step().
    script = write_script(
        tmp_path,
        "selfprof.py",
        """
        import torch
        from torch.profiler import profile, schedule, tensorboard_trace_handler
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(schedule=schedule(wait=1, warmup=0, active=2, repeat=1),
                     on_trace_ready=tensorboard_trace_handler("own", worker_name="mine")) as prof:
            for _ in range(8):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                prof.step()
    """,
    )
    summary, traces, stderr = run_json(tmp_path, script)
    assert summary["steps"] == {"global": 8, "requesters": {"SGD#0": 8, "profiler#0": 8}}
    # the program's own trace is complete: its steps 1 and 2 (its own numbering)
    (own,) = trace_files(tmp_path / "own")
    assert profiler_steps(own) == [1, 2]
    # stepcli stepped aside for the whole loop and says so
    assert traces == []
    assert "skipped while the program ran its own profiler" in stderr


def test_programs_profiler_started_inside_our_window_cuts_it_short_and_keeps_its_events(
    tmp_path: Path,
) -> None:
    # GIVEN stepcli recording steps 2-5 and a program that opens its own profiler at the start of
    # step 4
    script = write_script(
        tmp_path,
        "midwindow.py",
        """
        import torch
        from torch.profiler import profile
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def train_step():
            model(torch.randn(2, 4)).sum().backward(); opt.step()
        for _ in range(4):
            train_step()
        with profile() as prof:
            for _ in range(2):
                train_step()
        print(len(prof.events()))
        for _ in range(2):
            train_step()
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
        "4",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # THEN the program's profiler saw its events, and ours was saved with the steps it completed
    assert int(result.stdout) > 20
    (trace,) = trace_files(out)
    assert profiler_steps(trace) == [2, 3, 4]
    assert load_trace(trace)["stepcli_incomplete_step"] == "4"
    summary = json.loads((tmp_path / "run.json").read_text())
    (window,) = summary["windows"]
    assert (window["first_step"], window["last_step"], window["complete"]) == (2, 3, False)
    assert "the program started its own profiler" in window["note"]
    # and `stepcli table` leaves the incomplete step out
    table = json.loads(run_stepcli("table", "--json", trace).stdout)
    assert [s["step"] for s in table["steps"]] == [2, 3]


def test_programs_profiler_after_our_window_leaves_both_traces_intact(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "later.py",
        """
        import torch
        from torch.profiler import profile
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def train_step():
            model(torch.randn(2, 4)).sum().backward(); opt.step()
        for _ in range(6):
            train_step()
        with profile() as prof:
            train_step()
        prof.export_chrome_trace("own.json")
        print(len(prof.events()))
    """,
    )
    summary, traces, _ = run_json(tmp_path, script)
    assert [profiler_steps(t) for t in traces] == [[2, 3]]
    assert summary["steps"]["global"] == 7
    own = load_trace(tmp_path / "own.json")["traceEvents"]
    assert any(e.get("name") == "Optimizer.step#SGD.step" for e in own)


def test_optimizer_recreated_each_epoch_keeps_counting(tmp_path: Path) -> None:
    # A new optimizer per epoch may reuse a collected one's id: it must start at the global step,
    # not behind it.
    script = write_script(
        tmp_path,
        "epochs.py",
        """
        import gc
        import torch
        model = torch.nn.Linear(4, 1)
        for epoch in range(3):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
            del opt
            gc.collect()
    """,
    )
    summary, traces, _ = run_json(tmp_path, script)
    assert summary["steps"]["global"] == 12
    assert [profiler_steps(t) for t in traces] == [[2, 3]]
