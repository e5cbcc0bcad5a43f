"""The wrappers that turn optimizer, GradScaler, profiler and `--step-on` calls into steps, on a
fake torch.

tests/e2e/test_run_steps.py and test_run_program_profiler.py check the same on real torch, end to
end.
"""

from __future__ import annotations

import asyncio
import types

import pytest
from fake_torch import FakeAgent, fake_torch

from stepcli.agent.patches import StepOnError, patch_optimizers, patch_profilers, patch_step_on
from stepcli.runfolder.layout import CLOSURE_ANNOTATION


@pytest.fixture
def agent() -> FakeAgent:
    return FakeAgent()


@pytest.fixture
def torch(agent: FakeAgent) -> types.ModuleType:
    module = fake_torch()
    patch_optimizers(agent, module)
    patch_profilers(agent, module)
    return module


def test_each_optimizer_is_a_requester_from_construction_and_counts_a_step_when_step_returns(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    sgd, adam = torch.optim.SGD(), torch.optim.Adam()
    # registered when constructed (lazily at the first step, the second would count N+1), which arms
    # the agent
    assert agent.tracker.counts() == {"SGD": 0, "Adam": 0} and agent.trains
    for _ in range(3):
        sgd.step()
        adam.step()  # Adam.step calls super().step(): one step, not two
    assert agent.tracker.global_step == 3
    assert agent.tracker.counts() == {"SGD": 3, "Adam": 3}
    assert (sgd.calls, adam.calls) == (3, 3)  # the program's own step ran each time


def test_a_scaler_step_is_a_step_even_when_it_skips_the_optimizer(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    optimizer = torch.optim.SGD()
    torch.amp.GradScaler().step(optimizer)  # it calls optimizer.step(): counted once
    # inf/NaN gradients: no optimizer.step(), still an iteration
    torch.amp.GradScaler(skip=True).step(optimizer)
    assert agent.tracker.counts() == {"SGD": 2} and optimizer.calls == 1


def test_a_step_that_raises_or_runs_under_compile_or_after_a_failure_counts_nothing(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    optimizer = torch.optim.SGD()
    with pytest.raises(ValueError):
        optimizer.step(ValueError("nan loss"))
    agent.compiling = True  # torch.compile traces it: nothing of stepcli's in its graph
    optimizer.step()
    agent.compiling, agent.enabled = False, False
    optimizer.step()
    assert agent.tracker.global_step == 0 and optimizer.calls == 3
    assert agent.in_step == set()  # left clean after the exception


def test_patching_twice_wraps_once(agent: FakeAgent, torch: types.ModuleType) -> None:
    patch_optimizers(agent, torch)
    patch_profilers(agent, torch)
    optimizer = torch.optim.SGD()
    optimizer.step()
    assert agent.tracker.counts() == {"SGD": 1}


def test_an_error_in_stepcli_bookkeeping_disables_the_agent_never_the_program(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    agent.fail_on_create = True
    optimizer = torch.optim.SGD()  # constructed all the same
    optimizer.step()
    assert optimizer.calls == 1
    assert agent.failures == ["an optimizer: bookkeeping broke"] and not agent.enabled


def test_a_closure_is_a_marked_range_only_while_a_window_records(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    optimizer = torch.optim.SGD()
    optimizer.step(lambda: None)  # no window: the closure as it is
    agent.window, torch.profiler_enabled[0] = True, True
    optimizer.step(closure=lambda: None)
    assert torch.ranges == [f"enter {CLOSURE_ANNOTATION}", f"exit {CLOSURE_ANNOTATION}"]
    agent.foreign.add(1)  # the program's own profiler runs: its trace stays as the program made it
    optimizer.step(lambda: None)
    assert len(torch.ranges) == 2 and agent.tracker.global_step == 3


def test_the_programs_profiler_is_a_requester_and_stepcli_steps_aside_while_it_collects(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    prof = torch.profiler.profile(collect_at=2)
    key = id(prof)
    prof.start()  # idle: its schedule waits
    prof.step()
    assert agent.foreign == set() and agent.tracker.counts() == {"profiler": 1}
    prof.step()  # this step() starts it collecting: the step is counted before stepcli steps aside
    assert agent.foreign == {key}
    assert agent.tracker.global_step == 2
    prof.stop()
    assert agent.foreign == set()
    assert [name for name, _ in agent.events] == [
        "requester",
        "arm",
        "entered",
        "foreign started",
        "foreign stopped",
        "left",
    ]


def test_a_programs_profiler_that_fails_to_start_leaves_stepcli_recording(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    prof = torch.profiler.profile()
    prof.broken = True
    with pytest.raises(RuntimeError):
        prof.start()
    assert agent.foreign == set()  # not left stepping aside for a profiler that never ran


def test_the_step_that_starts_the_programs_profiler_is_counted_before_it_collects(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    prof = torch.profiler.profile(collect_at=1)
    seen: list[int] = []
    started = agent.foreign_profiler_started
    agent.foreign_profiler_started = lambda key: (
        seen.append(agent.tracker.global_step),
        started(key),
    )  # type: ignore[method-assign]
    prof.step()
    # counted first: a window of ours would otherwise be cut inside a step already ended
    assert seen == [1]
    assert agent.tracker.global_step == 1  # and once only


def test_stepcli_own_profiler_is_left_alone(agent: FakeAgent, torch: types.ModuleType) -> None:
    agent.building = True
    prof = torch.profiler.profile()
    agent.building = False
    agent.own.append(prof)
    prof.start()
    prof.step()
    prof.stop()
    assert agent.tracker.requesters == {} and agent.events == [] and agent.foreign == set()


def test_the_autograd_profiler_makes_stepcli_step_aside(
    agent: FakeAgent, torch: types.ModuleType
) -> None:
    with torch.autograd.profiler.profile() as prof:
        assert agent.foreign == {id(prof)}
    assert agent.foreign == set()
    with torch.autograd.profiler.profile(enabled=False):
        assert agent.foreign == set()  # a disabled one turns nothing on


def _step_on_module() -> types.ModuleType:
    module = types.ModuleType("train_loop")
    calls: list[int] = []

    def train_step(depth: int = 0, fail: bool = False) -> int:
        calls.append(depth)
        # through the module, as a recursive call would go: the wrapper sees the nested calls
        if depth:
            return int(module.train_step(depth - 1, fail))
        if fail:
            raise ValueError("bad batch")
        return depth

    class Trainer:
        @staticmethod
        def fit_one(x: int) -> int:
            return x

    async def serve(x: int) -> int:
        await asyncio.sleep(0)
        return x

    def batches() -> object:
        yield 1

    module.train_step, module.Trainer, module.serve, module.batches, module.calls = (
        train_step,
        Trainer,
        serve,
        batches,
        calls,
    )
    return module


def test_step_on_counts_each_outermost_call_that_returns(agent: FakeAgent) -> None:
    module = _step_on_module()
    patch_step_on(agent, module, "train_loop:train_step", "train_step")
    # armed at the first call
    assert agent.tracker.counts() == {"train_loop:train_step": 0} and not agent.trains
    module.train_step()
    assert agent.trains and agent.tracker.global_step == 1
    module.train_step(3)  # four nested calls: one step
    assert agent.tracker.global_step == 2
    with pytest.raises(ValueError):
        module.train_step(2, fail=True)
    assert agent.tracker.global_step == 2  # a call that raised is no step, however deep
    module.train_step()
    assert agent.tracker.global_step == 3 and len(module.calls) == 9


def test_step_on_wraps_static_and_async_functions(agent: FakeAgent) -> None:
    module = _step_on_module()
    patch_step_on(agent, module, "train_loop:Trainer.fit_one", "Trainer.fit_one")
    patch_step_on(agent, module, "train_loop:serve", "serve")
    assert module.Trainer().fit_one(5) == 5 and isinstance(
        module.Trainer.__dict__["fit_one"], staticmethod
    )
    assert asyncio.run(module.serve(7)) == 7
    assert agent.tracker.counts() == {"train_loop:Trainer.fit_one": 1, "train_loop:serve": 1}


@pytest.mark.parametrize(
    ("qualname", "message"),
    [
        (
            "batches",
            "train_loop:batches is not a plain or async function (generators are not supported)",
        ),
        (
            "Trainer.fit_two",
            "train_loop.Trainer has no attribute 'fit_two' (after the module's code ran)",
        ),
        ("missing", "train_loop has no attribute 'missing' (after the module's code ran)"),
    ],
)
def test_step_on_refuses_what_it_cannot_count_in_its_own_words(
    agent: FakeAgent, qualname: str, message: str
) -> None:
    with pytest.raises(StepOnError) as raised:
        patch_step_on(agent, _step_on_module(), f"train_loop:{qualname}", qualname)
    assert str(raised.value) == message
    assert agent.tracker.requesters == {}
