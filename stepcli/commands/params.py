"""Option values more than one command parses (`run --hang-timeout`, `table --scheduler-wait`): each
callback turns a value into what the command needs, or raises click.BadParameter with one line. A
value only one command takes is parsed in that command's module."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

_F = TypeVar("_F", bound=Callable[..., object])


def parse_duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from stepcli.run.live.hangdoctor import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def scheduler_options(command: _F) -> _F:
    """`--scheduler ADDRESS` and `--scheduler-wait DURATION`, as every command that reads traces on
    a Dask cluster takes them (`table`, `whatif`); check them with `check_scheduler_wait`."""
    command = click.option(
        "--scheduler-wait",
        callback=parse_duration,
        metavar="DURATION",
        default=None,
        help="With --scheduler: how long the cluster may have no worker to run the work (none "
        "joined, or all died) before the command gives up in one line (default: 2m).",
    )(command)
    return click.option(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="Read the files on a Dask cluster (tcp://host:8786; stepcli[dask]).",
    )(command)


def check_scheduler_wait(scheduler: str | None, scheduler_wait: float | None) -> None:
    if scheduler_wait is not None and scheduler is None:
        raise click.UsageError("--scheduler-wait needs --scheduler ADDRESS")
