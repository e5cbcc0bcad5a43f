"""The `stepcli compare` command's arguments and options, and their checks; the
comparison itself is stepcli.compare.comparemain.compare_main, loaded only when the command runs."""

from __future__ import annotations

import click

from stepcli.commands.pathparam import PathParam
from stepcli.stats import METRICS


@click.command(
    short_help="Compare runs with confidence intervals; exit 1 on a step-time regression."
)
@click.argument("baseline", required=False, type=PathParam())
@click.argument("current", required=False, type=PathParam())
@click.option(
    "--baseline",
    "baselines",
    multiple=True,
    type=PathParam(),
    help="A baseline run (repeatable), instead of BASELINE.",
)
@click.option(
    "--current",
    "currents",
    multiple=True,
    type=PathParam(),
    help="A current run (repeatable), instead of CURRENT.",
)
@click.option(
    "--tolerance",
    default="10%",
    show_default=True,
    help="Allowed relative slowdown, e.g. 10% or 0.1.",
)
@click.option(
    "--min-delta-ms",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Slowdowns smaller than this many ms never fail.",
)
@click.option(
    "--metric",
    type=click.Choice(METRICS),
    default="median",
    show_default=True,
    help="Step-time statistic that decides.",
)
@click.option(
    "--confidence",
    default="95%",
    show_default=True,
    help="Confidence level of the intervals, e.g. 95% or 0.99.",
)
@click.option(
    "--skip-steps",
    type=click.IntRange(min=0),
    default=None,
    help="Leave out steps before this step number in every run [default: detect warm-up].",
)
@click.option(
    "--allow-inconclusive",
    is_flag=True,
    help="Exit 0 (with a warning) when the result is inconclusive [default: exit 4, the gate "
    "fails].",
)
@click.option(
    "--strict",
    is_flag=True,
    hidden=True,
    help="Exit 4 when inconclusive: the default now, kept for scripts.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=PathParam(dir_okay=False),
    help="Also write a Markdown report here (- for stdout).",
)
@click.option(
    "--json",
    "json_path",
    type=PathParam(dir_okay=False),
    help="Also write the comparison as JSON here (- for stdout, instead of the report).",
)
def compare(
    baseline: str | None,
    current: str | None,
    baselines: tuple[str, ...],
    currents: tuple[str, ...],
    tolerance: str,
    min_delta_ms: float,
    metric: str,
    confidence: str,
    skip_steps: int | None,
    allow_inconclusive: bool,
    strict: bool,
    markdown_path: str | None,
    json_path: str | None,
) -> int:
    """Compare BASELINE and CURRENT: run summaries (--json of run), traces, or folders of either.

    Several runs per side: --baseline A1 --baseline A2 --current B1 ... (or folders of run
    summaries). A run folder (-o of run) is read through the run summary saved in it. Exit 0 no
    change or improvement, 1 regression, 2 bad input, 3 nothing measured on a side, 4 inconclusive
    (0 with --allow-inconclusive).
    """
    from stepcli.compare.comparemain import compare_main, parse_confidence, parse_tolerance

    ctx = click.get_current_context()
    if current is None and baseline is not None and not (baselines or currents):
        raise click.UsageError("missing CURRENT: give BASELINE CURRENT", ctx=ctx)
    if (baseline is None) != (current is None) or (
        baseline is not None and (baselines or currents)
    ):
        raise click.UsageError(
            "give BASELINE CURRENT, or --baseline and --current (repeatable), not a mix", ctx=ctx
        )
    if baseline is None and not (baselines and currents):
        raise click.UsageError(
            "missing runs: give BASELINE CURRENT, or at least one --baseline and one --current",
            ctx=ctx,
        )
    if markdown_path == "-" and json_path == "-":
        raise click.UsageError(
            "--markdown - and --json - both want stdout: give one of them a FILE", ctx=ctx
        )
    if strict and allow_inconclusive:
        raise click.UsageError(
            "--strict fails an inconclusive verdict, --allow-inconclusive passes it: give one",
            ctx=ctx,
        )
    try:
        fraction = parse_tolerance(tolerance)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="'--tolerance'") from None
    try:
        level = parse_confidence(confidence)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="'--confidence'") from None
    return compare_main(
        [baseline] if baseline is not None else list(baselines),
        [current] if current is not None else list(currents),
        tolerance=fraction,
        min_delta_ms=min_delta_ms,
        metric=metric,
        markdown_path=markdown_path,
        json_path=json_path,
        confidence=level,
        skip_steps=skip_steps,
        allow_inconclusive=allow_inconclusive,
    )
