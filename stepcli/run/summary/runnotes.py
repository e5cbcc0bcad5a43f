"""The notes of a run summary that explain what the run did not measure: why no step was seen, why
no trace was saved, `--step-on` targets never hooked or called, and what each process said of
itself.

They read the step logs (as stepcli.runfolder.steplogreader loaded them) and the processes' hello
files; the summary (stepcli.run.summary.build) lists them in its `notes`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

from stepcli.agent.config import AgentConfig
from stepcli.errors import TraceError
from stepcli.fmt import plural
from stepcli.inputs import read_side_json
from stepcli.runfolder.layout import HELLO_PREFIX

_MAX_HELLO_BYTES = 1 << 20  # a process's hello file: a few notes


def _load_json_files(folder: str, predicate: Any) -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    if not os.path.isdir(folder):
        return documents
    for name in sorted(os.listdir(folder)):
        if name.startswith(".") or not predicate(name):
            continue
        try:
            # (never blocking on a FIFO)
            document = read_side_json(os.path.join(folder, name), _MAX_HELLO_BYTES)
        except TraceError:
            continue
        if document is not None:
            documents.append(document)
    return documents


# stepcli run's own options: given after the script, they reach the program instead (and often its
# argparse).
_RUN_OPTIONS = frozenset(
    {
        "--skip-first",
        "--wait",
        "--warmup",
        "--active",
        "--repeat",
        "--record-shapes",
        "--profile-memory",
        "--with-stack",
        "--with-flops",
        "--with-modules",
        "--activities",
        "--step-on",
        "--out",
        "--gzip",
        "--json",
        "--fail-over",
        "--quiet",
    }
)


def _window_loss_explained(logs: list[dict[str, Any]]) -> bool:
    """Whether a process's own notes say why its window was not saved (the main thread blocked at a
    SIGTERM, the program exiting from another thread): then the launcher's guess at a cause would
    contradict them."""
    return any(
        "window" in note and "saved" in note
        for log in logs
        for note in log.get("notes", [])
        if isinstance(note, str)
    )


def _hook_notes(config: AgentConfig) -> list[str]:
    """What the launcher's own child said of `--step-on` targets it could not hook (its hello file:
    a process that never steps writes no step log)."""
    hellos = (
        _load_json_files(config.log_dir, lambda n: n.startswith(HELLO_PREFIX))
        if config.step_on
        else []
    )
    found: list[str] = []
    for hello in hellos:
        for note in hello.get("hook_notes") or []:
            if isinstance(note, str) and note not in found:
                found.append(note)
    return found


def why_no_steps(config: AgentConfig, exit_status: int, command: list[str] | None = None) -> str:
    hellos = _load_json_files(config.log_dir, lambda n: n.startswith(HELLO_PREFIX))
    if not hellos:
        return (
            "no steps observed: stepcli's hook never loaded in the program. Python flags -I, -E or "
            "-S skip PYTHONPATH/sitecustomize; a command that is not Python, or that resets "
            "PYTHONPATH, also hides it."
        )
    if 0 < exit_status <= 128:
        note = (
            f"no steps observed: the program exited with status {exit_status} before its first step"
        )
        misplaced = [
            a.split("=", 1)[0] for a in (command or [])[2:] if a.split("=", 1)[0] in _RUN_OPTIONS
        ]
        if misplaced:
            note += (
                f"; {misplaced[0]} came after the script, so it went to the program: stepcli's "
                f"options go before "
                "the script (stepcli run --active 2 train.py)"
            )
        return note + "."
    if not any(h.get("torch_imported") for h in hellos):
        return "no steps observed: the program never imported torch."
    if exit_status > 128:
        try:
            name = signal.Signals(exit_status - 128).name
        except ValueError:
            name = f"signal {exit_status - 128}"
        # the agent saves on these: no step log means no step yet
        if name in ("SIGINT", "SIGTERM", "SIGHUP"):
            return f"no steps recorded: the program was interrupted ({name}) before its first step."
        return (
            f"no steps recorded: the program ended with status {exit_status} ({name}?) before "
            f"stepcli could write "
            "its step log; a SIGKILL or an out-of-memory kill leaves no time to save."
        )
    failed = _hook_notes(config)
    # the --step-on target the user named is not there: say that, not "name one with --step-on"
    if failed:
        return f"no steps observed: {failed[0]}"
    return (
        "no steps observed: torch was imported but no optimizer.step(), torch.profiler step() or "
        "--step-on function was called. For inference or custom loops, name the step with "
        "--step-on MODULE:QUALNAME."
    )


def primary_notes(
    config: AgentConfig,
    primary: dict[str, Any],
    logs: list[dict[str, Any]],
    any_window: bool,
    exit_status: int,
    hang_folders: Sequence[str],
    hang_ended: bool,
) -> list[str]:
    """What the primary process says of the run: unequal requesters, and why no trace was saved."""
    notes: list[str] = []
    requesters = [r for r in primary.get("requesters", []) if r["calls"]]
    together = [
        r
        for r in requesters
        if r["first_step"] == min((q["first_step"] for q in requesters), default=0)
    ]
    # requesters alive together that stepped at different rates
    if len({r["calls"] for r in together}) > 1:
        busiest = max(together, key=lambda r: r["calls"])
        notes.append(
            f"requesters stepped unequally; the global step follows the busiest "
            f"({busiest['name']}, {plural(busiest['calls'], 'step')}), as KinetoStepTracker does"
        )
    if not any_window and config.on_demand:
        notes.append(
            "no trace: no `stepcli capture` asked for a window while the run stepped (--on-demand)"
        )
    elif not any_window:
        note = _no_trace_note(config, primary, logs, exit_status, hang_folders, hang_ended)
        notes += [note] if note else []
    return notes


def _no_trace_note(
    config: AgentConfig,
    primary: dict[str, Any],
    logs: list[dict[str, Any]],
    exit_status: int,
    hang_folders: Sequence[str],
    hang_ended: bool,
) -> str | None:
    """Why a run that stepped saved no trace: it hung, ended before the window, or died inside
    it."""
    steps = primary.get("global_steps", 0)
    first_window = next(config.schedule.windows(1), None)
    # a log not written at the process's end (it was killed) holds the count of its last periodic
    # save
    final = primary.get("exit", "running") != "running" or primary.get("progress") == "stalled"
    if first_window and steps <= first_window[1] and hang_folders:  # it hung: the hang said why
        ended = ", and --on-hang kill ended it" if hang_ended else ""
        return (
            f"no trace: the job hung at step {steps}, before the first window (steps "
            f"{first_window[1]}-{first_window[2]}){ended}; what each process was doing is in "
            f"{', '.join(os.path.basename(f.rstrip(os.sep)) + '/' for f in hang_folders)}"
        )
    if first_window and steps <= first_window[1] and final:  # step N is the N+1st: none ended
        return (
            f"no trace: the program made {plural(steps, 'step')}, and the first window records "
            f"steps {first_window[1]}-{first_window[2]}; lower --wait/--skip-first/--warmup"
        )
    if first_window and steps <= first_window[2] and not _window_loss_explained(logs):
        # it ended inside the window with no time to save it, and said nothing of it
        cause = (
            "SIGKILL leaves no time"
            if exit_status == 128 + signal.SIGKILL
            else "a SIGKILL or a hard crash leaves no time; SIGTERM, Ctrl-C and an ordinary exit "
            "save what was recorded"
        )
        where = (
            f"at step {steps}, inside the window of steps"
            if final
            else f"at step {steps} or later (its last saved count), in or before the window of "
            f"steps"
        )
        return (
            f"no trace: the program ended (exit {exit_status}) {where} "
            f"{first_window[1]}-{first_window[2]}, before its trace could be saved ({cause}); a "
            f"shorter "
            "--active is saved sooner"
        )
    return None


def hook_and_process_notes(
    config: AgentConfig, logs: list[dict[str, Any]], said_so_far: list[str], foreign: int
) -> list[str]:
    """`--step-on` targets never hooked or never called, each process's own notes, and steps under
    the program's own profiler; a hook failure a process or an earlier note already said is not
    repeated."""
    notes: list[str] = []
    stepped = {r["name"] for log in logs for r in log.get("requesters", []) if r["calls"]}
    unhooked = " ".join(
        note for log in logs for note in log.get("notes", []) if isinstance(note, str)
    )
    hooks_failed = _hook_notes(config)
    said = " ".join(said_so_far)
    # (no step log says it)
    notes.extend(note for note in hooks_failed if note not in unhooked and note not in said)
    unhooked += " " + " ".join(hooks_failed)
    for spec in config.step_on:
        if spec not in stepped and f"could not hook {spec.partition(':')[0]} " not in unhooked:
            notes.append(
                f"--step-on {spec} never completed a call: its module was never imported, the "
                f"function never "
                "called, or it runs as __main__ (with -m, or as the script itself)"
            )
    for log in logs:
        if log.get("skipped_windows"):
            notes.append(
                f"{log['worker']}: {log['skipped_windows']} window(s) skipped while the program "
                f"ran its own profiler"
            )
        notes.extend(f"{log['worker']}: {note}" for note in log.get("notes", []))
    if foreign:
        notes.append(
            f"{foreign} step(s) ran under the program's own profiler and are left out of the "
            f"statistics"
        )
    return notes
