"""`stepcli run`: build the child command and environment, run it faithfully, forward signals,
report.

The child is a real `python SCRIPT` (or `python -m MODULE`, or any command): argv, `sys.path[0]`,
`__main__`, tracebacks and exit codes are plain Python's because it *is* plain Python. stdio is
inherited, never piped.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepcli.agent import ondemand
from stepcli.agent.config import CONFIG_ENV, AgentConfig
from stepcli.agent.schedule import Schedule
from stepcli.errors import EXIT_NOT_SAVED, EXIT_REGRESSION, StepcliError
from stepcli.fmt import say
from stepcli.run.outputs import check_json_writable, prepare_out_dir, write_json
from stepcli.run.signals import (
    CUT_SIGNALS,
    SignalForwarder,
    child_setup,
    in_terminal_foreground,
    wait_for_exit,
)
from stepcli.runfolder.layout import SUMMARY_FILE

if TYPE_CHECKING:
    from stepcli.run.live.hangwatch import HangWatch
    from stepcli.runfolder.summaryfile import RunSummary
    from stepcli.traces.runtraces import RunTraces

BOOTSTRAP_DIR = str(Path(__file__).resolve().parent.parent / "_bootstrap")
# torch 2.13's Kineto prints `USDT:... profiler_start`/`profiler_stop` on stderr at every window,
# between the program's own lines. Its only knob is KINETO_LOG_LEVEL, read when torch starts (0
# verbose .. 4 error, 5 USDT); at 6 it prints nothing, its rare ERROR lines included. `stepcli run
# --verbose` leaves Kineto's default.
KINETO_LOG_LEVEL_ENV = "KINETO_LOG_LEVEL"
KINETO_QUIET_LEVEL = "6"
# With --hang-timeout: torch's flight recorder (gloo and NCCL) keeps the last N collectives of every
# process group, so a hang dump names the collective a process waits in even when C++ issued it
# (DDP's reducer, FSDP), which no Python hook sees (stepcli/agent/lastcollective.py, in_flight). A
# value the user set (or the older NCCL name) is kept.
FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"
FLIGHT_RECORDER_ENTRIES = "2000"


@dataclass(frozen=True)
class RunRequest:
    """A validated `stepcli run`: what to start, how to profile it, where to write."""

    argv: list[str]
    label: str
    schedule: Schedule
    profiler_options: dict[str, Any] = field(default_factory=dict)
    activities: tuple[str, ...] | None = None
    step_on: tuple[str, ...] = ()
    out_dir: str | None = None
    use_gzip: bool = False
    json_path: str | None = None
    fail_over: tuple[tuple[str, float], ...] = ()
    quiet: bool = False
    on_demand: bool = False
    report: bool = True
    verbose: bool = False
    hang_timeout: float | None = None  # --hang-timeout, seconds (stepcli/run/live/hangdoctor.py)
    on_hang: str = "keep"
    memory_entries: int = 0  # --memory: CUDA allocator history entries per process (0: off)
    slow_trigger: dict[str, Any] | None = None  # --capture-on-slow (stepcli/agent/slowrule.py)

    @classmethod
    def from_cli(
        cls,
        *,
        target: list[str],
        module_mode: bool,
        command_mode: bool,
        skip_first: int,
        wait: int,
        warmup: int,
        active: int,
        repeat: int,
        activities: tuple[str, ...] | None,
        step_on: tuple[str, ...],
        out_dir: str | None,
        use_gzip: bool,
        json_path: str | None,
        fail_over: tuple[tuple[str, float], ...],
        quiet: bool,
        on_demand: bool = False,
        report: bool = True,
        verbose: bool = False,
        hang_timeout: float | None = None,
        on_hang: str | None = None,
        memory_entries: int = 0,
        capture_on_slow: str | None = None,
        capture_steps: int = 3,
        max_captures: int = 3,
        **profiler_options: bool,
    ) -> RunRequest:
        """Validate everything that can be checked before the program starts (usage errors exit
        2)."""
        try:
            schedule = Schedule(
                skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
            )
        except ValueError as exc:
            raise StepcliError(str(exc)) from None
        for spec in step_on:
            if spec.split(":", 1)[0] == "__main__":
                raise StepcliError(
                    f"--step-on {spec}: the script's own __main__ cannot be hooked before it runs; "
                    "name a function in an importable module"
                )
        from stepcli.run.live.hangdoctor import check_options

        on_hang = check_options(hang_timeout, on_hang)
        argv, label = _child_command(target, module_mode, command_mode)

        if json_path is not None:
            check_json_writable(json_path)
        return cls(
            argv=argv,
            label=label,
            schedule=schedule,
            profiler_options=dict(profiler_options),
            activities=activities,
            step_on=step_on,
            out_dir=out_dir,
            use_gzip=use_gzip,
            json_path=json_path,
            fail_over=fail_over,
            quiet=quiet,
            on_demand=on_demand,
            report=report,
            verbose=verbose,
            hang_timeout=hang_timeout,
            on_hang=on_hang,
            memory_entries=memory_entries,
            slow_trigger=slow_trigger(capture_on_slow, capture_steps, max_captures),
        )


def _child_command(
    target: list[str], module_mode: bool, command_mode: bool
) -> tuple[list[str], str]:
    """The argv to start, and a short label for folder names and messages."""
    if not target:
        raise StepcliError("nothing to run: give SCRIPT, -m MODULE or -- COMMAND")
    first, rest = target[0], target[1:]
    if command_mode and not module_mode:
        if shutil.which(first) is None:
            hint = (
                f"; a script runs as `-- python {shlex.join(target)}`"
                if first.endswith(".py")
                else ""
            )
            raise StepcliError(f"command not found: {first}{hint}")
        return [first, *rest], _command_label(first, rest)
    if module_mode:
        if not all(part.isidentifier() for part in first.split(".")):
            raise StepcliError(f"-m {first}: not a module name")
        return [sys.executable, "-m", first, *rest], first.rsplit(".", 1)[-1]
    if not os.path.exists(first):
        if _PYTHON_NAME.match(Path(first).name) and rest:
            raise StepcliError(
                f"can't open file {first!r}: stepcli runs the script with its own Python; "
                f"use `stepcli run {shlex.join(rest)}` or `stepcli run -- {shlex.join(target)}`"
            )
        raise StepcliError(f"can't open file {first!r}: no such file")
    return [sys.executable, first, *rest], Path(first).stem or "program"


_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")


def _command_label(first: str, rest: list[str]) -> str:
    """The run folder's label for `-- COMMAND`: the script or module it runs (`-- python train.py`
    -> train), not the interpreter or launcher."""
    for index, arg in enumerate(rest):
        if arg == "-m" and index + 1 < len(rest):
            return rest[index + 1].rsplit(".", 1)[-1]
        if arg.endswith(".py"):
            return Path(arg).stem
    return Path(first).name


def child_environment(
    config: AgentConfig, base: dict[str, str] | None = None, verbose: bool = False
) -> dict[str, str]:
    """A copy of the environment with the bootstrap first on PYTHONPATH and the config in one
    variable.

    The user's entries are kept verbatim, empty ones included: an empty entry means the current
    directory. Unless `verbose`, Kineto's own log lines are silenced (see KINETO_QUIET_LEVEL), if
    the user has not chosen.
    """
    env = dict(os.environ if base is None else base)
    if not verbose:
        env.setdefault(KINETO_LOG_LEVEL_ENV, KINETO_QUIET_LEVEL)
    existing = env.get("PYTHONPATH", "")
    entries = [p for p in existing.split(os.pathsep) if p != BOOTSTRAP_DIR] if existing else []
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *entries])
    env[CONFIG_ENV] = config.to_env()
    if config.hang_timeout and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        env.setdefault(FLIGHT_RECORDER_ENV, FLIGHT_RECORDER_ENTRIES)
    return env


def exit_status(returncode: int) -> int:
    """Killed by signal N -> 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def run_program(request: RunRequest) -> int:
    """Run the program under the agent, then print/write the run summary. Returns stepcli's exit
    status."""
    if request.json_path:
        check_json_writable(request.json_path)
    out_dir = prepare_out_dir(request.out_dir, request.label)
    # nodes may share -o and pids
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{_host_label()}-{os.getpid()}"
    from stepcli.run.controldir import prepare_control_dir

    # private (0700) whatever the umask, before any process writes there
    prepare_control_dir(out_dir, run_id)
    config = _agent_config(request, str(out_dir), run_id)
    if not request.quiet:
        _say_plan(request, out_dir)
    _open_control(config)
    started = time.time()
    start = time.perf_counter()
    returncode, hang_watch = _run_job(request, config)
    status = exit_status(returncode)
    hang_ended = hang_watch is not None and hang_watch.killed
    if hang_ended:
        assert hang_watch is not None
        status = hang_watch.exit_status
    # Even with -q --no-report and nothing else to show it: summary.json is saved beside the step
    # logs, for a `stepcli report OUT` later.
    hang_folders = list(hang_watch.folders) if hang_watch is not None else []
    return _report(
        request,
        config,
        status,
        started,
        time.perf_counter() - start,
        hang_ended=hang_ended,
        hang_folders=hang_folders,
    )


def _agent_config(request: RunRequest, out_dir: str, run_id: str) -> AgentConfig:
    """What the agent in every process of the job is told (through the environment), with a fresh
    run key."""
    return AgentConfig(
        run_key=secrets.token_hex(16),
        run_id=run_id,
        out_dir=out_dir,
        launcher_pid=os.getpid(),
        schedule=request.schedule,
        activities=request.activities,
        step_on=request.step_on,
        use_gzip=request.use_gzip,
        quiet=request.quiet,
        on_demand=request.on_demand,
        hang_timeout=request.hang_timeout or 0.0,
        memory_entries=request.memory_entries,
        slow_trigger=request.slow_trigger,
        **request.profiler_options,
    )


def _say_plan(request: RunRequest, out_dir: Path) -> None:
    """What will be recorded and where: one line, or two rather than one past 80 columns."""
    plan = (
        f"recording on demand: run `stepcli capture {shlex.quote(_short(out_dir))}` to trace the "
        f"next steps"
        if request.on_demand
        else request.schedule.describe()
    )
    where = f"output in {_short(out_dir)}"
    if len(f"stepcli: {plan}; {where}") <= 80:
        say(f"{plan}; {where}")
    else:
        say(plan)
        say(where)


def _run_job(request: RunRequest, config: AgentConfig) -> tuple[int, HangWatch | None]:
    """Start the program under the agent and wait for it, forwarding signals, with the watchdog and
    the hang watch beside it; (its return code, the hang watch). On return CUT_SIGNALS are held:
    from then on a SIGTERM, SIGHUP or SIGINT is stepcli's to handle (it cuts the summary short),
    taken when _report listens for it."""
    foreground = in_terminal_foreground()
    from stepcli.run import subreaper
    from stepcli.run.watchdog import start_watchdog

    # the job's orphans (a daemonized grandchild) become stepcli's children
    subreaper.become_subreaper()

    # A signal that arrives between starting the program and installing the forwarder (a scheduler's
    # kill -INT right after the program's first output) must be forwarded, not kill stepcli: hold it
    # until then.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SignalForwarder.FORWARDED)
    ended = False
    try:
        try:
            env = child_environment(config, verbose=request.verbose)
            proc = subprocess.Popen(request.argv, env=env, preexec_fn=child_setup(foreground, mask))
        except OSError as exc:
            ondemand.close_control(config.out_dir, config.run_id)
            raise StepcliError(
                f"could not start {request.argv[0]}: {exc.strerror or exc}"
            ) from None
        subreaper.own(proc.pid)
        # in the environment of the job's processes only
        marker = f"{CONFIG_ENV}={env[CONFIG_ENV]}".encode()
        watchdog = start_watchdog(proc.pid, os.getpgrp() if foreground else proc.pid, marker)
        if watchdog is not None:
            subreaper.own(watchdog.pid)
        from stepcli.run.live.hangwatch import start_hang_watch

        hang_watch = start_hang_watch(request.hang_timeout, request.on_hang, config, proc)
        try:
            with SignalForwarder(proc, foreground) as forwarder:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # held signals are forwarded now
                returncode = wait_for_exit(proc)
                # from here a SIGTERM/SIGHUP/SIGINT is stepcli's to handle (it cuts the summary
                # short): held until _report listens for it, with the program's status known
                signal.pthread_sigmask(signal.SIG_BLOCK, CUT_SIGNALS)
                ended = True
                forwarder.reap_orphans()
                if hang_watch is not None and hang_watch.killed:
                    # nothing of a job stepcli ended survives it (a daemonized grandchild)
                    subreaper.end_adopted()
        finally:
            if hang_watch is not None:
                hang_watch.stop()
            if watchdog is not None:
                watchdog.release()
            ondemand.close_control(config.out_dir, config.run_id)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, {*mask, *CUT_SIGNALS} if ended else mask)
    return returncode, hang_watch


def _report(
    request: RunRequest,
    config: AgentConfig,
    status: int,
    started: float,
    duration_s: float,
    hang_ended: bool = False,
    hang_folders: list[str] | None = None,
) -> int:
    """Summary, --json and --fail-over after the program exited. The program's status wins, except
    that a budget that was exceeded, or could not be checked, fails a run that succeeded.
    `hang_ended`: `--on-hang kill` ended the job. A SIGTERM/SIGHUP/SIGINT meanwhile (a scheduler's
    time limit, a Ctrl-C on a long read) cuts the summary short but keeps the program's status and
    the `--json` file (stepcli.run.summaryfallback.summary_cut)."""
    from stepcli.run.signals import SummaryCut, cut_by_signals

    written: set[str] = set()
    try:
        with cut_by_signals(unblock=True):
            return _summarize(
                request, config, status, started, duration_s, hang_ended, hang_folders, written
            )
    except SummaryCut as cut:
        from stepcli.run.summaryfallback import summary_cut

        display = _display(request)
        return summary_cut(
            cut.signum,
            request,
            config,
            command=display,
            status=status,
            started=started,
            duration_s=duration_s,
            json_written="json" in written,
        )


def _display(request: RunRequest) -> list[str]:
    """The command as the summary shows it: `python ...` rather than the interpreter's full path,
    the script relative to the current folder when inside it, and the demo by its module (not its
    site-packages path)."""
    if request.argv[0] != sys.executable:
        return request.argv
    rest = request.argv[1:]
    if rest and not rest[0].startswith("-"):
        from stepcli.demo import DEMO_SCRIPT

        script = Path(rest[0])
        if script == DEMO_SCRIPT:
            return ["python", "-m", "stepcli.demo.train", *rest[1:]]
        if script.is_absolute() and script.is_relative_to(Path.cwd()):
            rest = [str(script.relative_to(Path.cwd())), *rest[1:]]
    return ["python", *rest]


def _summarize(
    request: RunRequest,
    config: AgentConfig,
    status: int,
    started: float,
    duration_s: float,
    hang_ended: bool,
    hang_folders: list[str] | None,
    written: set[str],
) -> int:
    """_report's work; `written` collects what is already saved ("json")."""
    from stepcli.run.summary.build import analysis_progress, build_run_summary
    from stepcli.run.summary.console import print_run_summary
    from stepcli.traces.runtraces import RunTraces

    display = _display(request)
    # One read of the traces for the summary and report.html; shapes only when the page will show
    # them.
    traces = RunTraces(shapes=request.report, memory=config.profile_memory, lanes=True)
    try:
        with analysis_progress(not request.quiet, config.out_dir):
            summary = build_run_summary(
                config,
                command=display,
                exit_status=status,
                started_at=started,
                duration_s=duration_s,
                traces=traces,
                on_hang=request.on_hang,
                hang_ended=hang_ended,
                hang_folders=hang_folders or [],
            )
    # the program's result, and the --json file CI reads next, must survive a bug here
    except Exception as exc:
        from stepcli.run.summaryfallback import summary_failed

        return summary_failed(
            exc,
            request,
            config,
            command=display,
            status=status,
            started=started,
            duration_s=duration_s,
        )
    try:
        from stepcli.runfolder.steprecordreader import attach

        # the whole run's step times and the triggered captures
        attach(summary, config.log_dir, config.run_key)
    except Exception as exc:
        say(f"warning: the whole-run step times could not be read: {type(exc).__name__}: {exc}")
    # before printing: that must not lose it
    json_lost = not _save_summary(request, config, summary, written)
    report_path = _html_report(request, config, summary, traces)
    from stepcli.run.nothingnote import update_note

    update_note(summary, measured=bool(summary.traces or report_path))
    if not request.quiet:
        try:
            print_run_summary(summary, report_path=report_path)
        except OSError:
            pass  # stderr closed: nothing more to say
        except Exception as exc:
            from stepcli.run.summaryfallback import summary_failed

            return summary_failed(
                exc,
                request,
                config,
                command=display,
                status=status,
                started=started,
                duration_s=duration_s,
                json_written=True,
            )
    if request.fail_over and not _budgets_held(request, summary) and status == 0:
        return EXIT_REGRESSION
    if json_lost and status == 0:
        return EXIT_NOT_SAVED
    return status


def _save_summary(
    request: RunRequest, config: AgentConfig, summary: RunSummary, written: set[str]
) -> bool:
    """`--json` (whether it was written, when asked) and the copy beside the step logs, for `stepcli
    report OUT` later (with --no-report too); a copy that cannot be saved is a note in the summary
    (and a line with -q)."""
    from stepcli.run.summary.build import write_run_summary

    saved = write_json(request.json_path, config.out_dir, summary, written)
    try:
        write_run_summary(summary, os.path.join(config.log_dir, SUMMARY_FILE), private_folder=True)
    except StepcliError as exc:  # its message names --json, which this file is not
        reason = exc.message.rsplit(": ", 1)[-1]
        summary.notes.append(f"cannot save the run summary in {config.log_dir}: {reason}")
        if request.quiet:
            say(f"could not save the run summary in {config.log_dir}: {reason}")
    return saved


def _budgets_held(request: RunRequest, summary: RunSummary) -> bool:
    """`--fail-over` on the untouched step time (the profiled one when there is none): a line per
    budget exceeded, one line when all held; whether all held."""
    from stepcli.compare.budgets import budgets_held, check_budgets

    times = summary.step_time_ms
    chosen = times.untouched if times and times.untouched else times.profiled if times else None
    population = "untouched" if times and times.untouched else "profiled"
    stats = chosen.stats() if chosen else None
    failures = check_budgets(list(request.fail_over), stats, what=f"{population} step time")
    for failure in failures:
        say(f"--fail-over: {failure}")
    held = budgets_held(list(request.fail_over), stats, what=f"{population} step time")
    if held:
        say(f"--fail-over: {held}")
    return not failures


def _open_control(config: AgentConfig) -> None:
    """The folder `stepcli capture` asks through (every run accepts requests, not only --on-demand
    ones)."""
    document = {
        "run_id": config.run_id,
        "launcher_pid": config.launcher_pid,
        "host": socket.gethostname(),
        "out_dir": config.out_dir,
        "on_demand": config.on_demand,
        "schedule": config.schedule.to_dict(),
        "started_at": time.time(),
    }
    try:
        ondemand.open_control(config.out_dir, config.run_id, document)
    except OSError as exc:
        say(f"warning: on-demand capture unavailable: {exc.strerror or exc}")


def _html_report(
    request: RunRequest, config: AgentConfig, summary: RunSummary, traces: RunTraces | None = None
) -> str | None:
    """report.html in the output folder (unless --no-report), or None; `traces` is what the summary
    read, reused."""
    if not request.report or not (
        summary.traces or (summary.steps and summary.steps.global_) or summary.hang
    ):
        return None
    try:
        from stepcli.run.summary.htmlreport import write_run_report

        return write_run_report(summary, traces)
    # the program's result and the terminal summary must survive a bug in the page
    except Exception as exc:
        reason = exc.message if isinstance(exc, StepcliError) else f"{type(exc).__name__}: {exc}"
        # a full or read-only folder, say
        summary.notes.append(f"report.html not written: {reason}")
        if request.quiet:
            say(f"could not write report.html: {reason}")
        return None


def _host_label() -> str:
    """This host's name, reduced to characters that are safe in a folder name."""
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9_.]+", "_", socket.gethostname())[:64] or "host"


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def slow_trigger(rule: str | None, steps: int, max_captures: int) -> dict[str, Any] | None:
    """The agent's `slow_trigger` config from the options; StepcliError (one line, exit 2) for a bad
    rule."""
    if rule is None:
        return None
    from stepcli.agent.slowrule import parse

    try:
        kind, value = parse(rule)
    except ValueError as exc:
        raise StepcliError(str(exc)) from None
    return {"kind": kind, "value": value, "text": rule.strip(), "steps": steps, "max": max_captures}
