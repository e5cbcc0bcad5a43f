"""Option values more than one command parses (`run --hang-timeout`, `table --scheduler-wait`): each
callback turns a value into what the command needs, or raises click.BadParameter with one line. A
value only one command takes is parsed in that command's module."""

from __future__ import annotations

import click


def parse_duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from stepcli.run.live.hangdoctor import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
