"""`stepcli run`'s slow-capture options take their bounds from the agent's rule module: one home for
each limit."""

from __future__ import annotations

import click

from stepcli.agent import slowrule
from stepcli.cli import cli


def _bounds(name: str) -> tuple[object, object]:
    run = cli.commands["run"]
    option = next(param for param in run.params if param.name == name)
    assert isinstance(option.type, click.IntRange)
    return option.type.min, option.type.max


def test_the_capture_bounds_are_the_agents_constants() -> None:
    # GIVEN the limits the agent's slow trigger enforces, WHEN `stepcli run` parses its options,
    # THEN the same
    assert _bounds("capture_steps") == (1, slowrule.MAX_CAPTURE_STEPS)
    assert _bounds("max_captures") == (1, slowrule.MAX_CAPTURES)
