"""`stepcli run --capture-on-slow RULE --capture-steps K --max-captures N`: the options and their
check (the rule itself is stepcli/agent/slowrule.py, shared with the profiled processes; the
launcher turns the options into the agent's config, stepcli.run.launcher.slow_trigger)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from stepcli.agent.slowrule import MAX_CAPTURE_STEPS, MAX_CAPTURES

_OPTIONS = (
    click.option(
        "--capture-on-slow",
        metavar="RULE",
        default=None,
        help="Trace the next steps on every rank when a step is slow: 3x (the rolling median), "
        "+50ms, or z4.",
    ),
    click.option(
        "--capture-steps",
        type=click.IntRange(1, MAX_CAPTURE_STEPS),
        default=3,
        show_default=True,
        metavar="K",
        help="With --capture-on-slow: steps recorded per triggered window.",
    ),
    click.option(
        "--max-captures",
        type=click.IntRange(1, MAX_CAPTURES),
        default=3,
        show_default=True,
        metavar="N",
        help="With --capture-on-slow: triggered windows per run at most.",
    ),
)


def slow_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The three options, on `stepcli run`."""
    for option in reversed(_OPTIONS):
        function = option(function)
    return function


def check_slow_options(ctx: click.Context, options: dict[str, Any]) -> None:
    """--capture-steps and --max-captures mean nothing without a rule: a usage error."""
    if options["capture_on_slow"] is None:
        for name in ("capture_steps", "max_captures"):
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"--{name.replace('_', '-')} needs --capture-on-slow")
