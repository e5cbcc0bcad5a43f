"""The wrappers that turn optimizer, GradScaler, profiler and `--step-on` calls into steps.

Runs inside the target: standard library plus the program's torch, which is already imported when
these run. Loaded only once the program imports torch (or a `--step-on` module), so other processes
never pay for it.
"""

from __future__ import annotations

import functools

from stepcli.runfolder.layout import CLOSURE_ANNOTATION

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable
    from types import ModuleType
    from typing import Any

    from .stephooks import StepHooks


def _guarded(agent: StepHooks, what: str, call: Callable[[], None]) -> None:
    """Run agent bookkeeping from inside a program call: an error disables the agent, never the
    program."""
    try:
        call()
    except Exception as exc:
        agent.fail(what, exc)


def _counted_call(
    agent: StepHooks, key: int, owner: Any, function: Any, args: Any, kwargs: Any
) -> Any:
    """Call `function` and count one step for requester `key` when it returns (once, however deeply
    nested: a subclass calling super().step(), or GradScaler.step calling optimizer.step)."""
    in_step = agent.in_step
    if agent.is_compiling() or key in in_step or not agent.enabled:
        return function(*args, **kwargs)
    in_step.add(key)
    try:
        result = function(*args, **kwargs)
    finally:
        in_step.discard(key)
    if key not in agent.tracker.requesters:
        _guarded(
            agent, "an optimizer", lambda: agent.requester_created(key, type(owner).__name__, owner)
        )
    agent.tracker.step(key)
    return result


def patch_optimizers(agent: StepHooks, torch: ModuleType) -> None:
    """One requester per optimizer instance, registered when it is constructed (lazily would count
    N+1)."""
    optimizer_cls = torch.optim.Optimizer
    original_init = optimizer_cls.__init__
    if getattr(original_init, "_stepcli", False):
        return

    mark = _closure_marker(agent, torch)

    @functools.wraps(original_init)
    def stepcli_optimizer_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if agent.enabled:
            _guarded(agent, "an optimizer", lambda: _register_optimizer(agent, self, mark))

    stepcli_optimizer_init._stepcli = True  # type: ignore[attr-defined]
    optimizer_cls.__init__ = stepcli_optimizer_init

    # GradScaler.step skips optimizer.step() on inf/NaN gradients: the iteration is still a step.
    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    original_scaler_step = getattr(scaler_cls, "step", None)
    if original_scaler_step is not None and not getattr(original_scaler_step, "_stepcli", False):

        @functools.wraps(original_scaler_step)
        def stepcli_scaler_step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            return _counted_call(
                agent,
                id(optimizer),
                optimizer,
                original_scaler_step,
                (self, optimizer, *args),
                kwargs,
            )

        stepcli_scaler_step._stepcli = True  # type: ignore[attr-defined]
        scaler_cls.step = stepcli_scaler_step  # type: ignore[union-attr]


def _register_optimizer(agent: StepHooks, optimizer: Any, mark: Callable[[Any], Any]) -> None:
    agent.requester_created(id(optimizer), type(optimizer).__name__, optimizer)
    _wrap_step(agent, type(optimizer), mark)


def _closure_marker(agent: StepHooks, torch: ModuleType) -> Callable[[Any], Any]:
    """What wraps the closure an optimizer's step() is given, so that each call of it is a
    `CLOSURE_ANNOTATION` range in the trace: the closure runs the program's forward and backward
    inside `Optimizer.step#...`, and without the range its forward could not be told from the
    optimizer's own work. Only while a stepcli window records (the program's own profiler's traces
    stay as the program made them); otherwise the closure as is."""
    try:
        ops = torch.ops.profiler
        enter, leave = ops._record_function_enter_new, ops._record_function_exit._RecordFunction
        enabled = torch._C._autograd._profiler_enabled
    except Exception:
        return _unchanged

    def mark(closure: Any) -> Any:
        if not callable(closure) or getattr(closure, "_stepcli", False):
            return closure
        if agent.foreign or agent.is_compiling() or not agent.window_open() or not enabled():
            return closure  # (under torch.compile's tracing: nothing of ours in its graph)

        @functools.wraps(closure)
        def stepcli_closure(*args: Any, **kwargs: Any) -> Any:
            record = enter(CLOSURE_ANNOTATION, None)
            try:
                return closure(*args, **kwargs)
            finally:
                leave(record)

        stepcli_closure._stepcli = True  # type: ignore[attr-defined]
        return stepcli_closure

    return mark


def _unchanged(closure: Any) -> Any:
    return closure


def _wrap_step(agent: StepHooks, cls: type, mark: Callable[[Any], Any] = _unchanged) -> None:
    """Count a step when `cls.step` returns: outside torch's own hook wrapper, whose
    `Optimizer.step#...` annotation must close before the next `ProfilerStep#N` opens. A closure
    given to it (`step(closure)`) is marked in the trace (`_closure_marker`)."""
    # mypy: type has no .step
    original = cls.__dict__.get("step") or getattr(cls, "step")  # noqa: B009
    if getattr(original, "_stepcli", False):
        return

    @functools.wraps(original)  # copies torch's `hooked` flag too, so torch never wraps over us
    def stepcli_optimizer_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            args = (mark(args[0]), *args[1:])
        elif "closure" in kwargs:
            kwargs["closure"] = mark(kwargs["closure"])
        return _counted_call(agent, id(self), self, original, (self, *args), kwargs)

    stepcli_optimizer_step._stepcli = True  # type: ignore[attr-defined]
    cls.step = stepcli_optimizer_step  # type: ignore[attr-defined]


def patch_profilers(agent: StepHooks, torch: ModuleType) -> None:
    """The program's own torch.profiler.profile objects: each is a requester; while one collects, we
    step aside.

    A profile object with a schedule spends most of its life idle (its wait phase, after its last
    cycle), with no Kineto session: it only collects between `prepare_trace` (warmup) and
    `stop_trace`, so that is when stepcli steps aside. A plain `profile()` collects from `start()`
    to `stop()`, which is the same pair.
    """
    profile = torch.profiler.profile
    if getattr(profile.step, "_stepcli", False):
        return
    # prepare/stop_trace live there
    kineto_profile = getattr(torch.profiler.profiler, "_KinetoProfile", profile)
    _patch_profile_lifetime(agent, profile)
    _patch_profile_step(agent, profile)
    _patch_collecting(agent, kineto_profile)
    autograd_profiler = torch.autograd.profiler
    legacy = getattr(torch.autograd, "profiler_legacy", None)
    # each turns on a profiler of its own: one per thread
    for name in ("profile", "emit_itt", "emit_nvtx"):
        _patch_legacy_profiler(agent, getattr(autograd_profiler, name, None))
    _patch_legacy_profiler(agent, getattr(legacy, "profile", None))


def _mark(*wrappers: Any) -> None:
    for wrapper in wrappers:
        wrapper._stepcli = True


def _patch_profile_lifetime(agent: StepHooks, profile: Any) -> None:
    """`__init__` makes a requester; `start`/`stop` bracket the time the program's profiler is
    entered."""
    original_init, original_start, original_stop = profile.__init__, profile.start, profile.stop
    own = agent.is_own_profiler

    @functools.wraps(original_init)
    def stepcli_profile_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if agent.enabled and not own(self):
            _guarded(
                agent, "a profiler", lambda: agent.requester_created(id(self), "profiler", self)
            )

    @functools.wraps(original_start)
    def stepcli_profile_start(self: Any) -> None:
        if agent.enabled and not own(self):
            agent.program_profiler_entered(self)
            _without_step_annotation(agent, self, original_start)
        else:
            original_start(self)

    @functools.wraps(original_stop)
    def stepcli_profile_stop(self: Any) -> None:
        try:
            original_stop(self)
        finally:
            if agent.enabled and not own(self):
                agent.program_profiler_left(self)

    _mark(stepcli_profile_init, stepcli_profile_start, stepcli_profile_stop)
    profile.__init__, profile.start, profile.stop = (
        stepcli_profile_init,
        stepcli_profile_start,
        stepcli_profile_stop,
    )


def _patch_profile_step(agent: StepHooks, profile: Any) -> None:
    """Each `step()` of the program's profiler is a step of its requester."""
    original_step = profile.step
    own = agent.is_own_profiler

    @functools.wraps(original_step)
    def stepcli_profile_step(self: Any) -> None:
        if agent.enabled and not own(self):
            # counted when step() returns, or earlier if it starts collecting
            self._stepcli_step_pending = True
            try:
                _without_step_annotation(agent, self, original_step)
            except BaseException:
                self._stepcli_step_pending = False
                raise
            if self._stepcli_step_pending:
                count_profiler_step(agent, self)
        else:
            original_step(self)

    _mark(stepcli_profile_step)
    profile.step = stepcli_profile_step


def count_profiler_step(agent: StepHooks, prof: Any) -> None:
    """One step of the program's profiler, counted once (see `_patch_collecting` for the early
    count)."""
    prof._stepcli_step_pending = False
    key = id(prof)
    if key not in agent.tracker.requesters:
        _guarded(agent, "a profiler", lambda: agent.requester_created(key, "profiler", prof))
    agent.tracker.step(key)


def _patch_collecting(agent: StepHooks, kineto_profile: Any) -> None:
    """Between `prepare_trace` and `stop_trace` the program's profiler collects: stepcli steps
    aside."""
    original_prepare, original_stop_trace = kineto_profile.prepare_trace, kineto_profile.stop_trace
    own = agent.is_own_profiler

    @functools.wraps(original_prepare)
    def stepcli_prepare_trace(self: Any) -> None:
        if not agent.enabled or own(self):
            original_prepare(self)
            return
        if getattr(self, "_stepcli_hidden", False):
            # it collects from this step on: its ProfilerStep#N is its own again
            self.record_steps = True
        if getattr(self, "_stepcli_step_pending", False):
            # Its step() starts it collecting: that step boundary is ours too, and comes first.
            # Counted after the start, it would cut our window inside a step that had already ended
            # (a whole window saved short) not a window to open at this step: it starts collecting
            # now
            self._stepcli_starting = True
            try:
                count_profiler_step(agent, self)
            finally:
                self._stepcli_starting = False
        agent.foreign_profiler_started(id(self))  # saves an open window of ours first
        try:
            original_prepare(self)
        except BaseException:
            agent.foreign_profiler_stopped(id(self))
            raise

    @functools.wraps(original_stop_trace)
    def stepcli_stop_trace(self: Any) -> None:
        try:
            original_stop_trace(self)
        finally:
            if agent.enabled and not own(self):
                agent.foreign_profiler_stopped(id(self))

    _mark(stepcli_prepare_trace, stepcli_stop_trace)
    kineto_profile.prepare_trace, kineto_profile.stop_trace = (
        stepcli_prepare_trace,
        stepcli_stop_trace,
    )


def _patch_legacy_profiler(agent: StepHooks, legacy: Any) -> None:
    """The autograd profiler (and its legacy, ITT and NVTX forms) turns on torch's one profiler per
    thread: opened inside our window it raised "Profiler is already enabled on this thread" in the
    program, and a Kineto one would have emptied ours. Our window is saved and steps aside first, as
    for the program's torch.profiler."""
    if legacy is None or getattr(legacy.__enter__, "_stepcli", False):
        return
    legacy_enter, legacy_exit = legacy.__enter__, legacy.__exit__

    @functools.wraps(legacy_enter)
    def stepcli_legacy_enter(self: Any) -> Any:
        if agent.enabled and getattr(self, "enabled", True):
            agent.foreign_profiler_started(id(self))
        return legacy_enter(self)

    @functools.wraps(legacy_exit)
    def stepcli_legacy_exit(self: Any, *exc: Any) -> Any:
        try:
            return legacy_exit(self, *exc)
        finally:
            if agent.enabled:
                agent.foreign_profiler_stopped(id(self))

    _mark(stepcli_legacy_enter, stepcli_legacy_exit)
    legacy.__enter__, legacy.__exit__ = stepcli_legacy_enter, stepcli_legacy_exit


def _without_step_annotation(agent: StepHooks, prof: Any, call: Any) -> None:
    """Run the program's idle profiler's `start()`/`step()` without its `ProfilerStep#N` annotation
    while our window records: the annotation would land in our trace beside ours, with the program's
    numbering.

    If the call makes it start collecting (`prepare_trace` runs inside it), the annotation is
    switched back on before torch opens it, so the program's own trace keeps its steps."""
    hide = (
        bool(getattr(prof, "record_steps", False))
        and agent.window_open()
        and id(prof) not in agent.foreign
    )
    if not hide:
        call(prof)
        return
    annotation, prof.step_rec_fn = prof.step_rec_fn, None
    if annotation is not None:
        annotation.__exit__(None, None, None)
    prof.record_steps, prof._stepcli_hidden = False, True
    try:
        call(prof)
    finally:
        prof.record_steps, prof._stepcli_hidden = True, False


_CO_GENERATOR, _CO_COROUTINE, _CO_ASYNC_GENERATOR = 0x20, 0x80, 0x200


class StepOnError(Exception):
    """A `--step-on` target that is missing or cannot be wrapped: said in stepcli's words, without a
    type name."""


def patch_step_on(agent: StepHooks, module: ModuleType, spec: str, qualname: str) -> None:
    """`--step-on MODULE:QUALNAME`: each completed call of that function or method is a step.

    Nested and recursive calls count once per outermost call, per thread or asyncio task. Inside
    code torch.compile is tracing nothing is counted (counting there would break `fullgraph=True`);
    name a function outside the compiled region.
    """
    owner, attr, kind, function = _step_on_target(module, qualname)
    if getattr(function, "_stepcli", False):
        return
    flags = getattr(getattr(function, "__code__", None), "co_flags", 0)
    if not callable(function) or flags & (_CO_GENERATOR | _CO_ASYNC_GENERATOR):
        raise StepOnError(f"{spec} is not a plain or async function (generators are not supported)")
    key = ("step-on", spec)
    counter = _OutermostCalls(agent, key, spec)
    wrapper = (
        _async_step_on(agent, function, counter)
        if flags & _CO_COROUTINE
        else _step_on(agent, function, counter)
    )
    wrapper._stepcli = True  # type: ignore[attr-defined]
    # armed at the first call, not at import (DataLoader workers)
    agent.requester_created(key, spec, arm=False)
    setattr(owner, attr, kind(wrapper) if kind is not None else wrapper)


def _step_on_target(module: ModuleType, qualname: str) -> tuple[Any, str, Any, Any]:
    """(owner, attribute, staticmethod/classmethod or None, the function itself) that QUALNAME
    names."""
    *owner_path, attr = qualname.split(".")
    owner: Any = module
    where = module.__name__
    # our own words: the module is still importing, and Python's would blame a
    for part in [*owner_path, attr]:
        if not hasattr(owner, part):  # circular import for a name it simply lacks
            raise StepOnError(f"{where} has no attribute {part!r} (after the module's code ran)")
        if part != attr:
            owner, where = getattr(owner, part), f"{where}.{part}"
    raw = (
        owner.__dict__[attr]
        if isinstance(owner, type) and attr in owner.__dict__
        else getattr(owner, attr)
    )
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    return owner, attr, kind, raw.__func__ if kind is not None else raw


class _OutermostCalls:
    """Counts a step when the outermost call completes. The depth is per context, not per thread:
    concurrent asyncio tasks each have their own, so they never mix up levels."""

    def __init__(self, agent: StepHooks, key: Hashable, spec: str) -> None:
        import contextvars

        self.agent = agent
        self.key = key
        self.depth: contextvars.ContextVar[int] = contextvars.ContextVar(
            f"stepcli_depth_{spec}", default=0
        )

    def enter(self) -> tuple[int, Any]:
        if not self.agent.trains:
            self.agent.arm()
        level = self.depth.get()
        return level, self.depth.set(level + 1)

    def leave(self, entered: tuple[int, Any], completed: bool) -> None:
        level, token = entered
        try:
            self.depth.reset(token)
        except ValueError:  # reset from another context (a generator finished elsewhere): fall back
            self.depth.set(level)
        if completed and level == 0 and self.agent.enabled:
            self.agent.tracker.step(self.key)


def _step_on(agent: StepHooks, function: Any, counter: _OutermostCalls) -> Callable[..., Any]:
    @functools.wraps(function)
    def stepcli_step_on(*args: Any, **kwargs: Any) -> Any:
        if agent.is_compiling():
            return function(*args, **kwargs)
        entered = counter.enter()
        try:
            result = function(*args, **kwargs)
        except BaseException:
            counter.leave(entered, False)
            raise
        counter.leave(entered, True)
        return result

    return stepcli_step_on


def _async_step_on(agent: StepHooks, function: Any, counter: _OutermostCalls) -> Callable[..., Any]:
    @functools.wraps(function)
    async def stepcli_step_on(*args: Any, **kwargs: Any) -> Any:
        if agent.is_compiling():
            return await function(*args, **kwargs)
        entered = counter.enter()
        try:
            result = await function(*args, **kwargs)
        except BaseException:
            counter.leave(entered, False)
            raise
        counter.leave(entered, True)
        return result

    return stepcli_step_on
