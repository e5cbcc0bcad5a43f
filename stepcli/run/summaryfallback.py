"""When building or printing the run summary fails: keep the program's result and the `--json` file
CI reads next.

A bug in the report must neither lose the `--json` file (the `stepcli compare` that follows in CI
would fail on a missing file, far from the cause) nor hide behind exit 0. So a run summary that says
nothing was measured, with the error in its notes, is written instead, and a run whose program
succeeded exits 70 (EX_SOFTWARE).
"""

from __future__ import annotations

import platform
import socket
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from stepcli import __version__
from stepcli.errors import EXIT_INTERNAL, StepcliError
from stepcli.fmt import say
from stepcli.runfolder.layout import SUMMARY_FILE, SUMMARY_SCHEMA, SUMMARY_VERSION
from stepcli.runfolder.summaryfile import (
    PeakMemory,
    RunSummary,
    Steps,
    StepTimeMs,
)

if TYPE_CHECKING:
    from typing import Protocol

    from stepcli.agent.config import AgentConfig

    class RunRequest(Protocol):
        """The part of stepcli.run.launcher.RunRequest this module reads (declared here: launcher
        imports us)."""

        @property
        def json_path(self) -> str | None: ...


def fallback_summary(
    config: AgentConfig,
    *,
    command: list[str],
    status: int,
    started: float,
    duration_s: float,
    error: str,
) -> RunSummary:
    """A valid `stepcli.run` document that measured nothing (so `compare` says exit 3), with the
    error in notes."""
    return RunSummary(
        schema=SUMMARY_SCHEMA,
        schema_version=SUMMARY_VERSION,
        stepcli_version=__version__,
        command=list(command),
        exit_status=status,
        started_at=datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        duration_s=round(duration_s, 3),
        host=socket.gethostname(),
        platform=platform.platform(),
        python=platform.python_version(),
        out_dir=config.out_dir,
        schedule={key: value for key, value in config.schedule.to_dict().items()},
        steps=Steps(global_=0),
        step_time_ms=StepTimeMs(),
        timeline_phases="",
        peak_memory=PeakMemory(),
        notes=[
            f"stepcli could not summarize this run: {error}; the traces are in {config.out_dir}"
        ],
        advice=[],
    )


def summary_cut(
    signum: int,
    request: RunRequest,
    config: AgentConfig,
    *,
    command: list[str],
    status: int,
    started: float,
    duration_s: float,
    json_written: bool,
) -> int:
    """A signal cut the summary short after the program ended: say so, keep `--json` and the saved
    summary (a summary that measured nothing, with the reason in its notes, where none was written
    yet), and return the program's status, or the signal's (128+N) for a program that succeeded: the
    run was stopped."""
    import os
    import signal

    name = signal.Signals(signum).name
    say(
        f"{name}: the summary was cut short (the program had ended: exit {status}); the traces are "
        f"in {config.out_dir}"
    )
    error = f"{name} arrived while the traces were read, after the program ended"
    document = fallback_summary(
        config, command=command, status=status, started=started, duration_s=duration_s, error=error
    )
    if request.json_path and not json_written:
        _save(document, request.json_path)
    saved = os.path.join(config.log_dir, SUMMARY_FILE)
    if not os.path.lexists(saved):
        _save(document, saved, private_folder=True)
    return status if status != 0 else 128 + signum


def _save(document: RunSummary, path: str, private_folder: bool = False) -> bool:
    """Write a fallback summary where `--json` (or the run's control folder) wants it, never over a
    file stepcli did not write; a failure is a warning line. Whether it was written."""
    from stepcli.run.outputs import drop_stale_json, json_taken
    from stepcli.run.summary.build import write_run_summary

    taken = None if private_folder else json_taken(path)
    try:
        if taken:
            raise StepcliError(taken)
        write_run_summary(document, path, private_folder=private_folder)
    except StepcliError as write_error:
        stale = "" if taken or private_folder else f"; {drop_stale_json(path)}"
        say(f"warning: {write_error.message}{stale}")
        return False
    return True


def summary_failed(
    exc: Exception,
    request: RunRequest,
    config: AgentConfig,
    *,
    command: list[str],
    status: int,
    started: float,
    duration_s: float,
    json_written: bool = False,
) -> int:
    """Say what failed in one line, make sure `--json` exists, and return stepcli's exit status."""
    error = f"{type(exc).__name__}: {exc}"
    say(f"internal error while summarizing the run ({error}); traces are in {config.out_dir}")
    if request.json_path and not json_written:
        document = fallback_summary(
            config,
            command=command,
            status=status,
            started=started,
            duration_s=duration_s,
            error=error,
        )
        if _save(document, request.json_path):
            say(f"wrote {request.json_path} without measurements (it says why in its notes)")
    if status != 0:
        return status  # the program's own failure says more
    return EXIT_INTERNAL
