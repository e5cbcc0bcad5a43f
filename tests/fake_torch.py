"""A stand-in for the parts of torch the agent wraps, and an agent that records what its wrappers
tell it.

`fake_torch()` builds a module object with torch.optim.Optimizer (two subclasses),
torch.amp.GradScaler, torch.profiler.profile (and its _KinetoProfile base), the autograd profiler
and the record-function ops the closure marker uses: enough for stepcli.agent.patches, without
importing torch (~1 s and a few hundred MB a process). Each call builds fresh classes, so the
patches one test applies never leak into another.

`FakeAgent` implements stepcli.agent.stephooks.StepHooks over a real StepTracker.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Hashable
from typing import Any

from stepcli.agent.tracker import StepTracker


def fake_clock(step_ns: int = 1000) -> Callable[[], int]:
    """A clock that advances `step_ns` each time it is read."""
    counter = itertools.count(step_ns, step_ns)
    return lambda: next(counter)


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def fake_torch() -> types.ModuleType:
    """A fresh module object shaped like the torch stepcli's patches expect."""
    torch = _module("torch")
    _add_optimizers(torch)
    _add_profilers(torch)
    _add_record_function_ops(torch)
    return torch


def _add_optimizers(torch: types.ModuleType) -> None:
    class Optimizer:
        def __init__(self, params: Any = (), lr: float = 0.1) -> None:
            self.calls = 0

        def step(self, closure: Any = None) -> Any:
            self.calls += 1
            if isinstance(closure, Exception):
                raise closure
            return closure() if closure is not None else None

    class SGD(Optimizer):
        pass

    class Adam(Optimizer):
        # a subclass that calls super().step(), as many do
        def step(self, closure: Any = None) -> Any:
            return super().step(closure)

    class GradScaler:
        def __init__(self, skip: bool = False) -> None:
            self.skip = skip

        def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # inf/NaN gradients: optimizer.step() is skipped, the iteration is still a step
            if self.skip:
                return None
            return optimizer.step(*args, **kwargs)

    torch.optim = _module("torch.optim", Optimizer=Optimizer, SGD=SGD, Adam=Adam)
    torch.amp = _module("torch.amp", GradScaler=GradScaler)


def _add_profilers(torch: types.ModuleType) -> None:
    class _KinetoProfile:
        def __init__(self) -> None:
            self.collecting = False

        def prepare_trace(self) -> None:
            if getattr(self, "broken", False):
                raise RuntimeError("Kineto could not start")
            self.collecting = True

        def stop_trace(self) -> None:
            self.collecting = False

    class profile(_KinetoProfile):  # noqa: N801 (torch's name)
        """`collect_at`: the step_num at which its schedule starts collecting (None: from start(),
        as a plain profile() does)."""

        def __init__(self, collect_at: int | None = None) -> None:
            super().__init__()
            self.collect_at = collect_at
            self.step_num = 0
            self.record_steps = True
            self.step_rec_fn = None

        def start(self) -> None:
            if self.collect_at is None:
                self.prepare_trace()

        def stop(self) -> None:
            if self.collecting:
                self.stop_trace()

        def step(self) -> None:
            self.step_num += 1
            if self.step_num == self.collect_at:
                self.prepare_trace()

    class autograd_profile:  # noqa: N801 (torch.autograd.profiler.profile)
        def __init__(self, enabled: bool = True) -> None:
            self.enabled = enabled

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

    torch.profiler = _module(
        "torch.profiler",
        profile=profile,
        profiler=_module("torch.profiler.profiler", _KinetoProfile=_KinetoProfile),
    )
    torch.autograd = _module(
        "torch.autograd", profiler=_module("torch.autograd.profiler", profile=autograd_profile)
    )


def _add_record_function_ops(torch: types.ModuleType) -> None:
    """What the closure marker opens its ranges with; `torch.ranges` lists them,
    `torch.profiler_enabled[0]` says whether a profiler records."""
    ranges: list[str] = []  # the record_function ranges opened, for the closure marker's test

    class _exit:  # noqa: N801
        @staticmethod
        def _RecordFunction(record: str) -> None:  # noqa: N802 (torch's name)
            ranges.append(f"exit {record}")

    def enter(name: str, args: Any) -> str:
        ranges.append(f"enter {name}")
        return name

    profiler_enabled = [False]
    ops_profiler = _module(
        "torch.ops.profiler", _record_function_enter_new=enter, _record_function_exit=_exit
    )
    torch.ops = _module("torch.ops", profiler=ops_profiler)
    torch._C = _module(
        "torch._C",
        _autograd=_module("torch._C._autograd", _profiler_enabled=lambda: profiler_enabled[0]),
    )
    torch.ranges = ranges
    torch.profiler_enabled = profiler_enabled


class FakeAgent:
    """The agent as the patches see it (stepcli.agent.stephooks.StepHooks): a real tracker, and a
    log of what the wrappers reported."""

    def __init__(self) -> None:
        self.enabled = True
        self.trains = False
        self.in_step: set[int] = set()
        self.tracker = StepTracker(clock=fake_clock())
        self.compiling = False
        self.foreign: set[int] = set()
        self.window = False
        self.own: list[Any] = []  # the profile objects stepcli drives
        self.building = False  # stepcli is constructing one of its own (asked in its __init__)
        self.events: list[tuple[str, Any]] = []
        self.failures: list[str] = []
        self.fail_on_create = False

    def is_compiling(self) -> bool:
        return self.compiling

    def fail(self, what: str, exc: BaseException) -> None:
        self.failures.append(f"{what}: {exc}")
        self.enabled = False

    def arm(self) -> None:
        self.trains = True
        self.events.append(("arm", None))

    def is_own_profiler(self, prof: Any) -> bool:
        return self.building or any(prof is own for own in self.own)

    def foreign_profiler_started(self, key: int) -> None:
        self.foreign.add(key)
        self.events.append(("foreign started", key))

    def foreign_profiler_stopped(self, key: int) -> None:
        self.foreign.discard(key)
        self.events.append(("foreign stopped", key))

    def requester_created(
        self, key: Hashable, base_name: str, owner: object = None, arm: bool = True
    ) -> None:
        if self.fail_on_create:
            raise RuntimeError("bookkeeping broke")
        if key in self.tracker.requesters:
            return
        self.tracker.register(key, base_name)
        self.events.append(("requester", base_name))
        if arm and not self.trains:
            self.arm()

    def program_profiler_entered(self, prof: Any) -> None:
        self.events.append(("entered", id(prof)))

    def program_profiler_left(self, prof: Any) -> None:
        self.events.append(("left", id(prof)))

    def window_open(self) -> bool:
        return self.window
