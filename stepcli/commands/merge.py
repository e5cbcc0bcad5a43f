"""`stepcli merge`: its options; the merge is stepcli.traces.mergetraces's."""

from __future__ import annotations

import click

from stepcli.commands.pathparam import PathParam

# light: it imports the trace reader only when a merge runs
from stepcli.traces.mergetraces import merge_main


@click.command(short_help="Merge the ranks' traces into one, clocks aligned, culprits marked.")
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option(
    "-o",
    "--output",
    required=True,
    type=PathParam(dir_okay=False),
    help="Write here (never over others).",
)
@click.option(
    "--all-runs",
    is_flag=True,
    help="A run folder that holds several runs: merge every run's traces.",
)
def merge(paths: tuple[str, ...], output: str, all_runs: bool) -> None:
    """One Chrome trace of the ranks in PATHS (run folders, traces), clocks aligned, each
    collective's culprit marked. A run folder is read as its latest run; FOLDER/.stepcli/RUN_ID
    names another."""
    from stepcli.runfolder.runs import runs_to_read

    click.echo(merge_main(runs_to_read(paths, all_runs), output))
