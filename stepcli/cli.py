"""The `stepcli` group and its entry point: one command per module of stepcli/commands/, errors
mapped to exit codes and one line on stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from stepcli import __version__
from stepcli.commands.capture import capture
from stepcli.commands.compare import compare
from stepcli.commands.demo import MAIN, demo
from stepcli.commands.memory import memory
from stepcli.commands.merge import merge
from stepcli.commands.report import report
from stepcli.commands.run import run
from stepcli.commands.table import table
from stepcli.commands.top import top
from stepcli.commands.whatif import whatif
from stepcli.errors import EXIT_INTERNAL, EXIT_USAGE, StepcliError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stepcli")
def cli() -> None:
    """Profile unmodified PyTorch programs on a step schedule."""


# One module per command, in stepcli/commands/, in the order `stepcli --help` lists them
# (alphabetical).
for _command in (run, table, compare, whatif, capture, top, memory, report, merge, demo):
    cli.add_command(_command)


def entry() -> NoReturn:
    """The `stepcli` command (and `python -m stepcli`): main(), then an exit without the
    interpreter's teardown (stepcli.quickexit)."""
    from stepcli.quickexit import quick_exit

    quick_exit(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the exit status instead of raising SystemExit."""
    # error lines name files and values the user or a trace chose
    from stepcli.safetext import visible

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"] and "--" in args:
        # `stepcli demo [RUN OPTIONS] -- DEMO OPTIONS`: split here, on the raw words, since click
        # drops a `--` that follows a flag or comes first, and the demo's options would then reach
        # `run` (No such option).
        from stepcli.demo import demo_argv

        at = args.index("--")
        if {"--help", "-h"} & set(args[at + 1 :]):  # the demo's own help: no run, no run folder
            from stepcli.demo import demo_help

            return demo_help()
        if not {"--help", "-h"} & set(args[1:at]):
            return main(["run", *args[1:at], *demo_argv(), *args[at + 1 :]])
    from stepcli.pipeconsole import guard_stdout

    stdout = guard_stdout()  # a closed or full stdout: one error line, not "internal error"
    from stepcli import safefile
    from stepcli.quickexit import remove_temps_on_signals

    # SIGTERM/SIGHUP mid-write: no half-written `.NAME.<random>.tmp` is left
    remove_temps_on_signals()
    try:
        from stepcli.limits import check_input_limit

        check_input_limit()
        # make_context/invoke, not cli.main: click's main turns a broken pipe into exit 1 and a
        # traceback at exit
        with cli.make_context("stepcli", args) as ctx:
            ctx.meta[MAIN] = main  # `stepcli demo` runs `stepcli run` through it
            result = cli.invoke(ctx)
        # what print() left buffered fails here, inside the guard, not at the exit's flush
        sys.stdout.flush()
    except click.exceptions.Exit as exc:  # --help, --version
        sys.stdout.flush()
        return exc.exit_code
    # (what click's own main turns into Abort)
    except (click.exceptions.Abort, KeyboardInterrupt, EOFError):
        safefile.remove_live_temps()
        click.echo("stepcli: aborted", err=True)
        return 130
    # bare `stepcli`: the usage, as written, not as one line
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(
            exc.ctx.get_help() if exc.ctx else "Usage: stepcli [OPTIONS] COMMAND [ARGS]...",
            err=True,
        )
        return EXIT_USAGE
    except click.UsageError as exc:
        # (an option's missing value is raised before the command's context exists: the command is
        # the first word)
        command = (
            exc.ctx.info_name
            if exc.ctx and exc.ctx.parent
            else args[0]
            if args[:1] and args[0] in cli.commands
            else None
        )
        hint = f" (see 'stepcli {command} --help')" if command else " (see 'stepcli --help')"
        click.echo(visible(f"stepcli: error: {exc.format_message()}{hint}"), err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        click.echo(visible(f"stepcli: error: {exc.format_message()}"), err=True)
        return exc.exit_code
    except StepcliError as exc:
        click.echo(visible(f"stepcli: error: {exc.message}"), err=True)
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`| head`): what it wanted, it got
        from stepcli.pipeconsole import discard_stdout

        discard_stdout(stdout)
        return 0
    except Exception as exc:  # a bug in stepcli: still one line, the traceback only on request
        if os.environ.get("STEPCLI_DEBUG"):
            raise
        click.echo(
            visible(
                f"stepcli: internal error: {type(exc).__name__}: {exc} (set STEPCLI_DEBUG=1 for "
                f"the traceback)"
            ),
            err=True,
        )
        return EXIT_INTERNAL
    finally:
        sys.stdout = stdout
    if isinstance(result, int):
        return result
    return 0
