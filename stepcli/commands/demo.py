"""`stepcli demo`: `stepcli run` on the bundled demo training script (stepcli.demo)."""

from __future__ import annotations

import click

# the context's meta key of the entry point `stepcli demo` runs `stepcli run` through
MAIN = "stepcli.main"


@click.command(
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    short_help="Profile a small training script that ships with stepcli.",
)
@click.argument("run_options", nargs=-1, type=click.UNPROCESSED)
def demo(run_options: tuple[str, ...]) -> int:
    """Profile the bundled demo training script: `stepcli demo [RUN OPTIONS] [-- DEMO OPTIONS]`.

    Options after `--` go to the demo script (--iterations N, --batch-size N, --device D), e.g.
    `stepcli demo --active 2 -- --iterations 20`.
    """
    from stepcli.demo import demo_argv

    options = list(run_options)
    script_options: list[str] = []
    if "--" in options:
        at = options.index("--")
        options, script_options = options[:at], options[at + 1 :]
    rerun = click.get_current_context().meta[MAIN]  # stepcli.cli.main, with its error mapping
    return int(rerun(["run", *options, *demo_argv(), *script_options]))
