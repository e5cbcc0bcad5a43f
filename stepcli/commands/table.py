"""`stepcli table`: its options, the choice of output format, and the read-summarize-print of the
traces (the figures are stepcli.traces', loaded only when the command runs)."""

from __future__ import annotations

import click

from stepcli.commands.params import check_scheduler_wait, scheduler_options
from stepcli.commands.pathparam import PathParam

STACK_ROWS = 10  # `table --stacks` without N


@click.command(short_help="Summarize PyTorch profiler trace files.")
# required: checked by _stacks_option
@click.argument("paths", nargs=-1, type=PathParam(), metavar="PATHS...")
@click.option(
    "--sort-by",
    type=click.Choice(["self", "total", "calls", "avg", "name"]),
    default="self",
    show_default=True,
    help="Order of operator rows: self time, total time (with children), calls, average time per "
    "call, or name.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Rows per operator table (default: 20 on the terminal and with --markdown; every row with "
    "--csv; --json is always whole).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV on stdout, every operator unless --limit.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Markdown tables on stdout.")
@click.option(
    "--group-by-shape",
    is_flag=True,
    help="One operator row per input shape (traces recorded with --record-shapes).",
)
@click.option(
    "--stacks",
    metavar="[N]",
    is_flag=False,
    flag_value=str(STACK_ROWS),
    default=None,
    help=f"The top N Python stacks by CPU time (traces recorded with --with-stack; N: "
    f"{STACK_ROWS}).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Files read in parallel (default: the cores available).",
)
@click.option(
    "--all-runs",
    is_flag=True,
    help="A run folder that holds several runs (`-o` given twice): read every run's traces, not "
    "only the latest.",
)
@scheduler_options
def table(
    paths: tuple[str, ...],
    sort_by: str,
    limit: int | None,
    as_json: bool,
    as_csv: bool,
    as_markdown: bool,
    group_by_shape: bool,
    stacks: str | None,
    jobs: int | None,
    all_runs: bool,
    scheduler: str | None,
    scheduler_wait: float | None,
) -> int:
    """Summarize traces: per-operator, per-step and per-rank tables.

    PATHS are .json or .json.gz traces (from stepcli or plain torch.profiler) or folders of them. A
    run folder is read as its latest run; FOLDER/.stepcli/RUN_ID names another.
    """
    chosen = [
        name for name, on in (("json", as_json), ("csv", as_csv), ("markdown", as_markdown)) if on
    ]
    if len(chosen) > 1:
        raise click.UsageError(
            f"--{chosen[0]} and --{chosen[1]} cannot be used together: choose one output format"
        )
    fmt = chosen[0] if chosen else None
    check_scheduler_wait(scheduler, scheduler_wait)
    paths, stack_rows = _stacks_option(paths, stacks)
    if stack_rows and scheduler is not None:
        raise click.UsageError("--stacks reads the traces on this machine: leave out --scheduler")
    from stepcli.runfolder.runs import runs_to_read
    from stepcli.traces.read.shortcommand import read_ahead_one, short_run

    paths = tuple(runs_to_read(paths, all_runs))
    read_ahead_one(paths, jobs, scheduler)
    with short_run():  # before numpy is imported: no spinning OpenBLAS threads, no cyclic GC
        from stepcli.slowwork import reading
        from stepcli.traces.engine import summarize_paths

        with reading(paths):  # a large trace takes seconds: said, not silent
            summary = summarize_paths(
                paths,
                group_by_shape=group_by_shape,
                jobs=jobs,
                scheduler=scheduler,
                scheduler_wait=scheduler_wait,
                stacks=bool(stack_rows),
            )
        from stepcli.traces.render.formats import print_table_report

        print_table_report(
            summary, sort_by=sort_by, limit=limit, fmt=fmt or "rich", stacks=stack_rows
        )
    if group_by_shape and not any(row.shape for row in summary.cpu_ops):
        click.echo(
            "stepcli: note: --group-by-shape: these traces have no input shapes; record them with "
            "`stepcli run --record-shapes` (torch.profiler: record_shapes=True)",
            err=True,
        )
    return 0


def _stacks_option(
    paths: tuple[str, ...], stacks: str | None
) -> tuple[tuple[str, ...], int | None]:
    """(PATHS, rows of --stacks or None). `--stacks` takes an optional N, so `table --stacks
    runs/base` hands the folder to it: a value that is no number is a path, and N its default."""
    if stacks is not None and not (stacks.isascii() and stacks.isdecimal()):
        paths = (PathParam().convert(stacks, None, None), *paths)
        stacks = str(STACK_ROWS)
    if not paths:
        raise click.UsageError("Missing argument 'PATHS...': give trace files or folders")
    if stacks is not None and int(stacks) < 1:
        raise click.UsageError(f"--stacks {stacks}: give a number of stacks of 1 or more")
    return paths, int(stacks) if stacks is not None else None
