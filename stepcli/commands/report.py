"""`stepcli report`: its options; finding the inputs and writing the page is
stepcli.run.summary.htmlreport's, loaded only when the command runs."""

from __future__ import annotations

import click

from stepcli.commands.pathparam import PathParam


@click.command(short_help="Write a self-contained HTML report with charts and advice.")
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option(
    "-o",
    "--output",
    "output",
    type=PathParam(dir_okay=False),
    help="HTML file to write [default: report.html in the run folder, or NAME.report.html beside "
    "the file].",
)
def report(paths: tuple[str, ...], output: str | None) -> int:
    """Write one HTML page (no network needed to open it) for a run.

    PATHS: a `stepcli run` output folder, a run summary (--json), traces, or folders of traces.
    """
    from stepcli.run.summary.htmlreport import report_main

    click.echo(report_main(list(paths), output))
    return 0
