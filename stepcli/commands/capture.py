"""`stepcli capture`: its options and their checks; the capture itself is
stepcli.run.live.capturewindow's (a window) or stepcli.run.live.memsnap's (stacks, a memory
snapshot), loaded only when the command runs."""

from __future__ import annotations

import math

import click

from stepcli.agent.request import MAX_ACTIVE, MAX_WAIT, MAX_WARMUP

_FROM_CLI = click.core.ParameterSource.COMMANDLINE


def finite_seconds(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """A time limit: click's FloatRange lets `nan` through (every comparison is false), and it would
    never end."""
    if not math.isfinite(value):
        raise click.BadParameter(f"expected a number of seconds above 0; got {value}")
    return value


@click.command(short_help="Trace a running `stepcli run` now: every rank, the same steps.")
@click.argument("target")
@click.option(
    "--wait",
    type=click.IntRange(min=0, max=MAX_WAIT),
    default=0,
    show_default=True,
    help="Extra steps to let go by before the warmup.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0, max=MAX_WARMUP),
    default=1,
    show_default=True,
    help="Steps the profiler runs but discards.",
)
@click.option(
    "--active",
    type=click.IntRange(min=1, max=MAX_ACTIVE),
    default=3,
    show_default=True,
    help="Steps recorded in each trace.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    callback=finite_seconds,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the traces.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
@click.option(
    "--stacks",
    is_flag=True,
    help="Dump every process's Python stacks now (to OUT/stacks-<n>/) instead.",
)
@click.option(
    "--memory-snapshot",
    is_flag=True,
    help="Dump every process's CUDA memory now (OUT/memory-*.pickle).",
)
def capture(
    target: str, wait: int, warmup: int, active: int, timeout: float, as_json: bool, **now: bool
) -> int:
    """Record one window of a running `stepcli run` on every process, starting at the same global
    step.

    TARGET is the run's -o folder or the pid of one of its processes. Exit 0 traces saved, 2 TARGET
    is not a running stepcli run, 3 nothing captured before --timeout. With --stacks: every
    process's Python stacks instead, now (exit 0 written, 3 no process answered). With
    --memory-snapshot: every process's CUDA memory snapshot, now (exit 0 one written, 3 none: no
    process answered or none uses CUDA).
    """
    if now["stacks"] or now["memory_snapshot"]:
        flag = "--stacks" if now["stacks"] else "--memory-snapshot"
        if now["stacks"] and now["memory_snapshot"]:
            raise click.UsageError("--stacks and --memory-snapshot: give one")
        ctx = click.get_current_context()
        given = [
            f"--{name}"
            for name in ("wait", "warmup", "active")
            if ctx.get_parameter_source(name) == _FROM_CLI
        ]
        if given:
            raise click.UsageError(f"{flag} records no window: drop {', '.join(given)}")
        from stepcli.run.live.memsnap import capture_now

        return capture_now(
            target, timeout=timeout, as_json=as_json, memory_snapshot=now["memory_snapshot"]
        )
    from stepcli.run.live.capturewindow import capture_main

    return capture_main(
        target, wait=wait, warmup=warmup, active=active, timeout=timeout, as_json=as_json
    )
