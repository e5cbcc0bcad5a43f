"""`stepcli run`: its options and their checks; the run itself is stepcli.run.launcher.run_program,
loaded only when the command runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from stepcli.commands.params import parse_duration
from stepcli.commands.pathparam import PathParam
from stepcli.commands.slowoptions import check_slow_options, slow_options


class _RunCommand(click.Command):
    """Remembers whether the target came after `--`, which click itself swallows."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        raw = list(args)
        rest = super().parse_args(ctx, args)
        target = list(ctx.params.get("target") or ())
        ctx.meta["stepcli.dashdash"] = (
            "--" in raw and target == raw[raw.index("--") + 1 :] and bool(target)
        )
        return rest


# No program makes 2^40 steps (a trillion); larger schedule values are refused up front, not after
# the program ran (2^64 overflowed the run summary's JSON at the end: no summary, and the program's
# status lost).
_MAX_STEPS = 2**40


class StepCount(click.IntRange):
    """A count of steps, bounded by _MAX_STEPS: `--help` shows `x>=1` where 0 is refused, never that
    bound (a guard against overflow, of no use to a reader: it was on every schedule option)."""

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


def parse_activities(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    unknown = [n for n in names if n not in _ACTIVITIES]
    if not names or unknown:
        raise click.BadParameter(
            f"expected a comma-separated list of {', '.join(_ACTIVITIES)}; got {value!r}"
        )
    return names


def parse_step_on(
    _ctx: click.Context, _param: click.Parameter, value: Sequence[str]
) -> tuple[str, ...]:
    for spec in value:
        module, sep, qualname = spec.partition(":")
        if (
            not sep
            or not module
            or not qualname
            or not all(part.isidentifier() for part in module.split(".") + qualname.split("."))
        ):
            raise click.BadParameter(
                f"expected MODULE:QUALNAME such as mypkg.infer:Model.forward; got {spec!r}"
            )
    return tuple(value)


def parse_fail_over(
    _ctx: click.Context, _param: click.Parameter, value: Sequence[str]
) -> tuple[tuple[str, float], ...]:
    from stepcli.compare.budgets import parse_budget

    try:
        return tuple(parse_budget(spec) for spec in value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def check_run_options(ctx: click.Context, options: dict[str, Any]) -> None:
    """The option combinations `stepcli run` refuses (schedule options with --on-demand,
    --memory-entries without --memory); `--memory` is taken out of `options`, its meaning left in
    memory_entries (0: off)."""
    if options["on_demand"]:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("skip_first", "wait", "warmup", "active", "repeat")
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(
                f"--on-demand opens no scheduled window: drop {', '.join(given)} (capture takes "
                f"its own)"
            )
    memory = options.pop("memory")
    if (
        not memory
        and ctx.get_parameter_source("memory_entries") == click.core.ParameterSource.COMMANDLINE
    ):
        raise click.UsageError("--memory-entries needs --memory")
    options["memory_entries"] = options["memory_entries"] if memory else 0


@click.command(
    cls=_RunCommand,
    context_settings={"allow_interspersed_args": False},
    short_help="Run a program and profile the steps of the schedule.",
)
@click.option(
    "--skip-first",
    type=StepCount(min=0),
    default=0,
    show_default=True,
    help="Steps to skip before the first cycle.",
)
@click.option(
    "--wait",
    type=StepCount(min=0),
    default=1,
    show_default=True,
    help="Steps to wait at the start of each cycle.",
)
@click.option(
    "--warmup",
    type=StepCount(min=0),
    default=1,
    show_default=True,
    help="Steps the profiler runs but discards.",
)
@click.option(
    "--active",
    type=StepCount(min=1),
    default=3,
    show_default=True,
    help="Steps recorded in each trace.",
)
@click.option(
    "--repeat",
    type=StepCount(min=0),
    default=1,
    show_default=True,
    help="Cycles to record; 0 = until the program ends.",
)
@click.option("--record-shapes", is_flag=True, help="Record operator input shapes.")
@click.option("--profile-memory", is_flag=True, help="Track tensor memory allocation.")
@click.option("--with-stack", is_flag=True, help="Record Python source stacks.")
@click.option("--with-flops", is_flag=True, help="Estimate FLOPs of matmul and conv operators.")
@click.option("--with-modules", is_flag=True, help="Record the nn.Module hierarchy.")
@click.option(
    "--activities",
    callback=parse_activities,
    metavar="LIST",
    help="Comma-separated, e.g. cpu,cuda [default: all torch supports].",
)
@click.option(
    "--step-on",
    multiple=True,
    callback=parse_step_on,
    metavar="MODULE:QUALNAME",
    help="Count each call of this function as a step (repeatable).",
)
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=PathParam(file_okay=False),
    help="Folder for traces and logs [default: a new folder under ./stepcli-runs/].",
)
@click.option("--gzip", "use_gzip", is_flag=True, help="Write .json.gz traces.")
@click.option(
    "--json",
    "json_path",
    type=PathParam(dir_okay=False),
    help="Write the run summary as JSON to this file.",
)
@click.option(
    "--fail-over",
    multiple=True,
    callback=parse_fail_over,
    metavar="STAT=MS",
    help="Exit non-zero when a step-time statistic exceeds a budget, e.g. p50=25 (repeatable).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines and no summary.")
@click.option(
    "--on-demand",
    is_flag=True,
    help="Open no scheduled window; record when `stepcli capture OUT` asks.",
)
@click.option(
    "--hang-timeout",
    callback=parse_duration,
    metavar="DURATION",
    help="When no process completes a step for this long (e.g. 10m), dump every process's stacks "
    "to OUT/hang-<n>/.",
)
@click.option(
    "--on-hang",
    type=click.Choice(["keep", "kill"]),
    default=None,
    help="After a hang dump: keep the job running (default; dump again while it stays hung) or "
    "kill it (exit 124).",
)
@click.option(
    "--no-report",
    "report",
    is_flag=True,
    flag_value=False,
    default=True,
    help="Don't write report.html in the output folder.",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="Let torch's Kineto print its own log lines (USDT:, STAGE:, ERROR:) on stderr.",
)
@click.option(
    "--memory",
    is_flag=True,
    help="Record CUDA allocator history; on out-of-memory, save a snapshot (oom-<worker>.pickle) "
    "for `stepcli memory`.",
)
@click.option(
    "--memory-entries",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    metavar="N",
    help="With --memory: allocator events kept per process (a ring; older ones are dropped).",
)
@slow_options
@click.option(
    "-m",
    "module_mode",
    is_flag=True,
    help="Run a module like python -m: stepcli run -m pkg.mod ARGS.",
)
@click.argument(
    "target",
    nargs=-1,
    type=click.UNPROCESSED,
    required=True,
    metavar="SCRIPT [ARGS]... | -m MODULE [ARGS]... | -- COMMAND [ARGS]...",
)
@click.pass_context
def run(ctx: click.Context, target: tuple[str, ...], module_mode: bool, **options: Any) -> int:
    """Run a program and profile the steps of the schedule.

    A step is one training iteration: each optimizer.step() (several optimizers stepping once per
    iteration make one step), each step() of a torch.profiler the program runs, or each call of a
    --step-on function. With the defaults (skip-first 0, wait 1, warmup 1, active 3, repeat 1)
    stepcli skips step 0 (start-up), warms the profiler up on step 1, records steps 2-4 into one
    trace, and only times the other steps.

    stepcli options go before the script; everything after it is passed to the program untouched.
    """
    from stepcli.run.launcher import RunRequest, run_program

    check_run_options(ctx, options)
    check_slow_options(ctx, options)
    request = RunRequest.from_cli(
        target=list(target),
        module_mode=module_mode,
        command_mode=bool(ctx.meta.get("stepcli.dashdash")),
        **options,
    )
    return run_program(request)
