"""`stepcli memory SNAPSHOT_OR_RUN`: read each snapshot, analyze it, advise, print."""

from __future__ import annotations

import click

from stepcli.advice.memory import advise
from stepcli.errors import EXIT_NOTHING_MEASURED, EXIT_OK, StepcliError
from stepcli.snapshots.analysis import analyze
from stepcli.snapshots.reader import find_snapshots, load_snapshot
from stepcli.snapshots.render import to_json, to_text


def memory_main(path: str, *, as_json: bool, top: int) -> int:
    """Exit 0 analyzed, 2 bad input (StepcliError), 3 a run folder without any snapshot."""
    files = find_snapshots(path)
    if not files:
        raise StepcliError(
            f"{path}: no memory snapshot here (oom-*.pickle is written by `stepcli run --memory` when a process "
            "runs out of CUDA memory, memory-*.pickle by `stepcli capture --memory-snapshot`)",
            EXIT_NOTHING_MEASURED,
        )
    reports = []
    for file in files:
        report = analyze(load_snapshot(file), top=top)
        report["advice"] = advise(report)
        reports.append(report)
    if as_json:
        click.echo(to_json(reports))
    else:
        from stepcli.fmt import visible_all  # file and function names from the snapshot: control characters shown

        click.echo("\n\n".join(to_text(visible_all(report)) for report in reports))
    return EXIT_OK
