"""The `stepcli whatif` command's arguments and options; the answer
itself is stepcli.whatif.whatifmain.whatif_main, loaded only when the command runs."""

from __future__ import annotations

import click

from stepcli.commands.params import check_scheduler_wait, scheduler_options
from stepcli.commands.pathparam import PathParam


@click.command(
    short_help="What would make the step faster: the critical path across ranks, and what-if "
    "predictions."
)
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option(
    "--step",
    type=click.IntRange(min=0),
    default=None,
    help="Replay this step only (default: the longest "
    "run of consecutive steps every trace recorded).",
)
@click.option(
    "--scale",
    "scales",
    multiple=True,
    metavar="SELECTOR=FACTOR",
    help="Run what SELECTOR names FACTOR times as long (0 removes it): an operator name, re:REGEX, "
    "phase:dataloader|forward|backward|optimizer|other, each optionally prefixed rank:R/. "
    "Repeatable.",
)
@click.option(
    "--comm",
    "comms",
    multiple=True,
    metavar="FACTOR",
    help="Collectives' transfer time times FACTOR.",
)
@click.option(
    "--idealize-rank",
    "idealize",
    multiple=True,
    metavar="R",
    help="Rank R's compute as the other ranks' median.",
)
@click.option(
    "--json",
    "json_path",
    default=None,
    type=PathParam(dir_okay=False),
    help="Write the answer here (schema stepcli.whatif/1).",
)
@click.option(
    "--trace",
    "trace_path",
    default=None,
    type=PathParam(dir_okay=False),
    help="Write the replayed ranks with the critical path marked, for Perfetto or "
    "chrome://tracing.",
)
@click.option(
    "--jobs", "-j", type=click.IntRange(min=1), default=None, help="Files read in parallel."
)
@click.option(
    "--all-runs",
    is_flag=True,
    help="A run folder that holds several runs: read every run's traces.",
)
@scheduler_options
def whatif(
    paths: tuple[str, ...],
    step: int | None,
    scales: tuple[str, ...],
    comms: tuple[str, ...],
    idealize: tuple[str, ...],
    json_path: str | None,
    trace_path: str | None,
    jobs: int | None,
    all_runs: bool,
    scheduler: str | None,
    scheduler_wait: float | None,
) -> int:
    """Replay the recorded steps of every rank from PATHS (a run folder, a folder of traces or one
    trace), check the replay against the measured step, and predict the step time under each change
    (with none: a ranked list of opportunities). Exit 4 when the replay cannot be trusted."""
    check_scheduler_wait(scheduler, scheduler_wait)
    from stepcli.traces.read.shortcommand import short_run

    changes = (
        [("scale", v) for v in scales]
        + [("comm", v) for v in comms]
        + [("idealize", v) for v in idealize]
    )
    with short_run():
        from stepcli.whatif.whatifmain import whatif_main

        return whatif_main(
            paths, changes, step, json_path, jobs, trace_path, all_runs, scheduler, scheduler_wait
        )
