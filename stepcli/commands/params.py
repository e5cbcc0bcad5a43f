"""Parsing of `stepcli run`'s option values for click (kept out of cli.py, which stays wiring only): each callback
turns a value into what the run needs, or raises click.BadParameter with one line; `check_run_options` refuses the
combinations of options that contradict each other, with a usage error."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import click

# No program makes 2^40 steps (a trillion); larger schedule values are refused up front, not after the program
# ran (2^64 overflowed the run summary's JSON at the end: no summary, and the program's status lost).
_MAX_STEPS = 2**40


class Steps(click.IntRange):
    """A count of steps, bounded by _MAX_STEPS: `--help` shows `x>=1` where 0 is refused, never that bound (a
    guard against overflow, of no use to a reader: it was on every schedule option)."""

    def __init__(self, min: int) -> None:  # noqa: A002 (click's name)
        super().__init__(min=min, max=_MAX_STEPS)
        self.low = min

    name = "integer"  # (`--active INTEGER`, not `INTEGER RANGE`)

    def _describe_range(self) -> str:
        return f"x>={self.low}" if self.low else ""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.INT.convert(value, param, ctx)
        if not self.low <= number <= _MAX_STEPS:
            self.fail(f"{number} is not in the range {self.low}<=x<={_MAX_STEPS}.", param, ctx)
        return number


_ACTIVITIES = ("cpu", "cuda", "xpu", "mtia", "hpu")


def parse_activities(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    unknown = [n for n in names if n not in _ACTIVITIES]
    if not names or unknown:
        raise click.BadParameter(f"expected a comma-separated list of {', '.join(_ACTIVITIES)}; got {value!r}")
    return names


def parse_step_on(_ctx: click.Context, _param: click.Parameter, value: Sequence[str]) -> tuple[str, ...]:
    for spec in value:
        module, sep, qualname = spec.partition(":")
        if (
            not sep
            or not module
            or not qualname
            or not all(part.isidentifier() for part in module.split(".") + qualname.split("."))
        ):
            raise click.BadParameter(f"expected MODULE:QUALNAME such as mypkg.infer:Model.forward; got {spec!r}")
    return tuple(value)


def finite_seconds(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """A time limit: click's FloatRange lets `nan` through (every comparison is false), and it would never end."""
    if not math.isfinite(value):
        raise click.BadParameter(f"expected a number of seconds above 0; got {value}")
    return value


def parse_fail_over(
    _ctx: click.Context, _param: click.Parameter, value: Sequence[str]
) -> tuple[tuple[str, float], ...]:
    from stepcli.compare.budgets import parse_budget

    try:
        return tuple(parse_budget(spec) for spec in value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from stepcli.run.live.hangdoctor import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
_SIZE_UNITS.update({"t": 1 << 40, "tib": 1 << 40, "kb": 1000, "mb": 10**6, "gb": 10**9, "tb": 10**12})


def parse_size(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    """A size in bytes: `4GiB`, `512MiB`, `1.5G` (binary), `2GB` (decimal), `1073741824`."""
    text = value.strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    unit = _SIZE_UNITS.get(text[len(number) :])
    try:
        count = float(number) * unit if unit is not None and number else math.nan
    except ValueError:
        count = math.nan
    if not math.isfinite(count) or count < 1 << 20:
        raise click.BadParameter(f"expected a size of at least 1MiB, such as 4GiB or 512MiB; got {value!r}")
    return int(count)


def check_run_options(ctx: click.Context, options: dict[str, Any]) -> None:
    """The option combinations `stepcli run` refuses (schedule options with --on-demand, --memory-entries without
    --memory); `--memory` is taken out of `options`, its meaning left in memory_entries (0: off)."""
    if options["on_demand"]:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("skip_first", "wait", "warmup", "active", "repeat")
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(
                f"--on-demand opens no scheduled window: drop {', '.join(given)} (capture takes its own)"
            )
    memory = options.pop("memory")
    if not memory and ctx.get_parameter_source("memory_entries") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--memory-entries needs --memory")
    options["memory_entries"] = options["memory_entries"] if memory else 0
