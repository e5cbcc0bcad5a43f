"""The `stepcli top` command's options; the view itself is stepcli/run/live/liveview.py, loaded when
run."""

from __future__ import annotations

import click


@click.command(short_help="Watch a running `stepcli run` live: every rank's step, pace and state.")
@click.argument("target", metavar="RUN")
@click.option("--once", is_flag=True, help="Print one snapshot and exit (for scripts and CI logs).")
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON on stdout.")
def top(target: str, once: bool, as_json: bool) -> int:
    """Show a running `stepcli run` (its -o folder or one of its pids) live, one line per rank."""
    from stepcli.run.live.liveview import top_main

    return top_main(target, once=once, as_json=as_json)
