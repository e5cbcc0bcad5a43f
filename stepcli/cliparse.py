"""Parsing of `stepcli run`'s option values for click (kept out of cli.py, which stays wiring only): each callback
turns a value into what the run needs, or raises click.BadParameter with one line."""

from __future__ import annotations

from collections.abc import Sequence

import click

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
