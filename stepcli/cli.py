"""Command-line wiring only: parse, validate, call the module that does the work, map errors to exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from stepcli import __version__
from stepcli.agent.request import MAX_ACTIVE, MAX_WAIT, MAX_WARMUP
from stepcli.cliparse import (
    Steps,
    check_run_options,
    finite_seconds,
    parse_activities,
    parse_duration,
    parse_fail_over,
    parse_size,
    parse_step_on,
)
from stepcli.compare.comparecli import compare
from stepcli.errors import EXIT_INTERNAL, EXIT_USAGE, StepcliError
from stepcli.limits import DEFAULT_DECODE_BYTES
from stepcli.pathparam import PathParam
from stepcli.run.live.topcli import top
from stepcli.run.slowoptions import check_slow_options, slow_options
from stepcli.traces.mergetraces import merge_main  # light: it imports the trace reader only when a merge runs
from stepcli.whatif.whatifcli import whatif


class _RunCommand(click.Command):
    """Remembers whether the target came after `--`, which click itself swallows."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        raw = list(args)
        rest = super().parse_args(ctx, args)
        target = list(ctx.params.get("target") or ())
        ctx.meta["stepcli.dashdash"] = "--" in raw and target == raw[raw.index("--") + 1 :] and bool(target)
        return rest


_FROM_CLI = click.core.ParameterSource.COMMANDLINE


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stepcli")
def cli() -> None:
    """Profile unmodified PyTorch programs on a step schedule."""


@cli.command(
    cls=_RunCommand,
    context_settings={"allow_interspersed_args": False},
    short_help="Run a program and profile the steps of the schedule.",
)
@click.option(
    "--skip-first",
    type=Steps(min=0),
    default=0,
    show_default=True,
    help="Steps to skip before the first cycle.",
)
@click.option(
    "--wait",
    type=Steps(min=0),
    default=1,
    show_default=True,
    help="Steps to wait at the start of each cycle.",
)
@click.option(
    "--warmup",
    type=Steps(min=0),
    default=1,
    show_default=True,
    help="Steps the profiler runs but discards.",
)
@click.option(
    "--active",
    type=Steps(min=1),
    default=3,
    show_default=True,
    help="Steps recorded in each trace.",
)
@click.option(
    "--repeat",
    type=Steps(min=0),
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
@click.option("--json", "json_path", type=PathParam(dir_okay=False), help="Write the run summary as JSON to this file.")
@click.option(
    "--fail-over",
    multiple=True,
    callback=parse_fail_over,
    metavar="STAT=MS",
    help="Exit non-zero when a step-time statistic exceeds a budget, e.g. p50=25 (repeatable).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines and no summary.")
@click.option("--on-demand", is_flag=True, help="Open no scheduled window; record when `stepcli capture OUT` asks.")
@click.option(
    "--hang-timeout",
    callback=parse_duration,
    metavar="DURATION",
    help="When no process completes a step for this long (e.g. 10m), dump every process's stacks to OUT/hang-<n>/.",
)
@click.option(
    "--on-hang",
    type=click.Choice(["keep", "kill"]),
    default=None,
    help="After a hang dump: keep the job running (default; dump again while it stays hung) or kill it (exit 124).",
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
    "--verbose", is_flag=True, help="Let torch's Kineto print its own log lines (USDT:, STAGE:, ERROR:) on stderr."
)
@click.option(
    "--memory",
    is_flag=True,
    help="Record CUDA allocator history; on out-of-memory, save a snapshot (oom-<worker>.pickle) for `stepcli memory`.",
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
@click.option("-m", "module_mode", is_flag=True, help="Run a module like python -m: stepcli run -m pkg.mod ARGS.")
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

    A step is one training iteration: each optimizer.step() (several optimizers stepping once per iteration make
    one step), each step() of a torch.profiler the program runs, or each call of a --step-on function. With the
    defaults (skip-first 0, wait 1, warmup 1, active 3, repeat 1) stepcli skips step 0 (start-up), warms the
    profiler up on step 1, records steps 2-4 into one trace, and only times the other steps.

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


@cli.command(short_help="Summarize PyTorch profiler trace files.")
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option(
    "--sort-by",
    type=click.Choice(["self", "total", "calls", "avg", "name"]),
    default="self",
    show_default=True,
    help="Order of operator rows: self time, total time (with children), calls, average time per call, or name.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Rows per operator table (default: 20 on the terminal and with --markdown; every row with --csv; "
    "--json is always whole).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV on stdout, every operator unless --limit.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Markdown tables on stdout.")
@click.option(
    "--group-by-shape", is_flag=True, help="One operator row per input shape (traces recorded with --record-shapes)."
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
    help="A run folder that holds several runs (`-o` given twice): read every run's traces, not only the latest.",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    default=None,
    help="Read the files on a Dask cluster (tcp://host:8786; stepcli[dask]).",
)
@click.option(
    "--scheduler-wait",
    callback=parse_duration,
    metavar="DURATION",
    default=None,
    help="With --scheduler: how long the cluster may have no worker to run the work (none joined, or all died) "
    "before the command gives up in one line (default: 2m).",
)
def table(
    paths: tuple[str, ...],
    sort_by: str,
    limit: int | None,
    as_json: bool,
    as_csv: bool,
    as_markdown: bool,
    group_by_shape: bool,
    jobs: int | None,
    all_runs: bool,
    scheduler: str | None,
    scheduler_wait: float | None,
) -> int:
    """Summarize traces: per-operator, per-step and per-rank tables.

    PATHS are .json or .json.gz traces (from stepcli or plain torch.profiler) or folders of them. A run folder
    is read as its latest run; FOLDER/.stepcli/RUN_ID names another.
    """
    chosen = [name for name, on in (("json", as_json), ("csv", as_csv), ("markdown", as_markdown)) if on]
    if len(chosen) > 1:
        raise click.UsageError(f"--{chosen[0]} and --{chosen[1]} cannot be used together: choose one output format")
    fmt = chosen[0] if chosen else None
    if scheduler_wait is not None and scheduler is None:
        raise click.UsageError("--scheduler-wait needs --scheduler ADDRESS")
    from stepcli.runfolder.runs import runs_to_read
    from stepcli.traces.read.shortcommand import read_ahead_one, short_run

    paths = tuple(runs_to_read(paths, all_runs))
    read_ahead_one(paths, jobs, scheduler)
    with short_run():  # before numpy is imported: no spinning OpenBLAS threads, no cyclic GC
        from stepcli.slowwork import reading
        from stepcli.traces.engine import summarize_paths

        with reading(paths):  # a large trace takes seconds: said, not silent
            summary = summarize_paths(
                paths, group_by_shape=group_by_shape, jobs=jobs, scheduler=scheduler, scheduler_wait=scheduler_wait
            )
        from stepcli.traces.render.formats import print_table_report

        print_table_report(summary, sort_by=sort_by, limit=limit, fmt=fmt or "rich")
    if group_by_shape and not any(row.shape for row in summary.cpu_ops):
        click.echo("stepcli: note: --group-by-shape: these traces have no input shapes; record them with "
                   "`stepcli run --record-shapes` (torch.profiler: record_shapes=True)", err=True)  # fmt: skip
    return 0


cli.add_command(compare)  # stepcli/compare/comparecli.py
cli.add_command(whatif)  # stepcli/whatif/whatifcli.py


@cli.command(short_help="Trace a running `stepcli run` now: every rank, the same steps.")
@click.argument("target")
@click.option(
    "--wait",
    type=click.IntRange(min=0, max=MAX_WAIT),
    default=0,
    show_default=True,
    help="Extra steps to let go by before the warmup.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0, max=MAX_WARMUP),
    default=1,
    show_default=True,
    help="Steps the profiler runs but discards.",
)
@click.option(
    "--active",
    type=click.IntRange(min=1, max=MAX_ACTIVE),
    default=3,
    show_default=True,
    help="Steps recorded in each trace.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    callback=finite_seconds,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the traces.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
@click.option("--stacks", is_flag=True, help="Dump every process's Python stacks now (to OUT/stacks-<n>/) instead.")
@click.option("--memory-snapshot", is_flag=True, help="Dump every process's CUDA memory now (OUT/memory-*.pickle).")
def capture(target: str, wait: int, warmup: int, active: int, timeout: float, as_json: bool, **now: bool) -> int:
    """Record one window of a running `stepcli run` on every process, starting at the same global step.

    TARGET is the run's -o folder or the pid of one of its processes. Exit 0 traces saved, 2 TARGET is not a
    running stepcli run, 3 nothing captured before --timeout. With --stacks: every process's Python stacks instead,
    now (exit 0 written, 3 no process answered). With --memory-snapshot: every process's CUDA memory snapshot, now
    (exit 0 one written, 3 none: no process answered or none uses CUDA).
    """
    if now["stacks"] or now["memory_snapshot"]:
        from stepcli.run.live.memsnap import capture_now

        ctx = click.get_current_context()
        given = [f"--{name}" for name in ("wait", "warmup", "active") if ctx.get_parameter_source(name) == _FROM_CLI]
        return capture_now(target, given, timeout=timeout, as_json=as_json, **now)
    from stepcli.run.live.capturewindow import capture_main

    return capture_main(target, wait=wait, warmup=warmup, active=active, timeout=timeout, as_json=as_json)


cli.add_command(top)  # stepcli/run/live/topcli.py


@cli.command(short_help="What filled CUDA memory: a snapshot's peak or out-of-memory error, split and advice.")
@click.argument("path", type=PathParam())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Allocation sites listed.")
@click.option(
    "--max-memory",
    default=f"{DEFAULT_DECODE_BYTES >> 30}GiB",
    show_default=True,
    callback=parse_size,
    help="Memory the decoding of one snapshot may take (4GiB, 512MiB...); past it, refused.",
)
def memory(path: str, as_json: bool, top: int, max_memory: int) -> int:
    """Read CUDA memory snapshots and say what filled the memory, when, and what to do about it.

    PATH is a snapshot (a torch.cuda.memory._snapshot() pickle, .gz too) or a `stepcli run --memory` output
    folder (its oom-*.pickle files). Exit 0 analyzed, 2 bad input (missing, not a snapshot, not of a snapshot's
    shape, a pickle that asks for a class, over --max-memory: refused), 3 no snapshot in the folder.
    """
    from stepcli.snapshots.memorymain import memory_main

    return memory_main(path, as_json=as_json, top=top, max_memory=max_memory)


@cli.command(short_help="Write a self-contained HTML report with charts and advice.")
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option(
    "-o",
    "--output",
    "output",
    type=PathParam(dir_okay=False),
    help="HTML file to write [default: report.html in the run folder, or NAME.report.html beside the file].",
)
def report(paths: tuple[str, ...], output: str | None) -> int:
    """Write one HTML page (no network needed to open it) for a run.

    PATHS: a `stepcli run` output folder, a run summary (--json), traces, or folders of traces.
    """
    from stepcli.run.summary.htmlreport import report_main

    click.echo(report_main(list(paths), output))
    return 0


@cli.command(short_help="Merge the ranks' traces into one, clocks aligned, culprits marked.")
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option("-o", "--output", required=True, type=PathParam(dir_okay=False), help="Write here (never over others).")
@click.option("--all-runs", is_flag=True, help="A run folder that holds several runs: merge every run's traces.")
def merge(paths: tuple[str, ...], output: str, all_runs: bool) -> None:
    """One Chrome trace of the ranks in PATHS (run folders, traces), clocks aligned, each collective's culprit marked.
    A run folder is read as its latest run; FOLDER/.stepcli/RUN_ID names another."""
    from stepcli.runfolder.runs import runs_to_read

    click.echo(merge_main(runs_to_read(paths, all_runs), output))


@cli.command(
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
    return main(["run", *options, *demo_argv(), *script_options])


def entry() -> NoReturn:
    """The `stepcli` command (and `python -m stepcli`): main(), then an exit without the interpreter's teardown
    (stepcli.quickexit)."""
    from stepcli.quickexit import quick_exit

    quick_exit(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the exit status instead of raising SystemExit."""
    from stepcli.fmt import visible  # error lines name files and values the user or a trace chose

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"] and "--" in args:
        # `stepcli demo [RUN OPTIONS] -- DEMO OPTIONS`: split here, on the raw words, since click drops a `--`
        # that follows a flag or comes first, and the demo's options would then reach `run` (No such option).
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

    remove_temps_on_signals()  # SIGTERM/SIGHUP mid-write: no half-written `.NAME.<random>.tmp` is left
    try:
        from stepcli.limits import check_input_limit

        check_input_limit()
        # make_context/invoke, not cli.main: click's main turns a broken pipe into exit 1 and a traceback at exit
        with cli.make_context("stepcli", args) as ctx:
            result = cli.invoke(ctx)
        sys.stdout.flush()  # what print() left buffered fails here, inside the guard, not at the exit's flush
    except click.exceptions.Exit as exc:  # --help, --version
        sys.stdout.flush()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt, EOFError):  # (what click's own main turns into Abort)
        safefile.remove_live_temps()
        click.echo("stepcli: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `stepcli`: the usage, as written, not as one line
        click.echo(exc.ctx.get_help() if exc.ctx else "Usage: stepcli [OPTIONS] COMMAND [ARGS]...", err=True)
        return EXIT_USAGE
    except click.UsageError as exc:
        # (an option's missing value is raised before the command's context exists: the command is the first word)
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
            visible(f"stepcli: internal error: {type(exc).__name__}: {exc} (set STEPCLI_DEBUG=1 for the traceback)"),
            err=True,
        )
        return EXIT_INTERNAL
    finally:
        sys.stdout = stdout
    if isinstance(result, int):
        return result
    return 0
