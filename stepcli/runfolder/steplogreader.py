"""The step logs of one run, checked before the run summary trusts them.

Anything that can write into `<out>/.stepcli/<run-id>/` during a run could otherwise steer the
summary: a made-up worker with 99 steps, a window naming a trace outside the output folder, or a
malformed entry that crashes the report. So a step log counts only if it is a regular file signed
with this run's key (which only the run's own processes get, in their environment) and matches its
schema; a window's trace counts only if it is a regular file inside the output folder, of this user,
the very file (inode and device) and size the agent recorded, written after the run started: another
user can swap a same-size forgery in under its name. Everything refused is named in one note.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from collections.abc import Callable
from typing import Any

from stepcli.agent.config import AgentConfig
from stepcli.agent.signing import signature_matches
from stepcli.errors import StepcliError
from stepcli.inputs import Written, expect_written, file_problem, read_input
from stepcli.runfolder.layout import SIGNATURE_KEY, STEP_LOG_SUFFIX, STEP_LOG_VERSION

_WORKER = re.compile(r"[A-Za-z0-9_.\-]{1,200}\Z")
_MAX_INT = 2**63 - 1
_MAX_SHOWN = 3


def _int(value: Any, low: int = 0, high: int = _MAX_INT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


_FIELDS: dict[str, Callable[[Any], bool]] = {
    "worker": lambda v: isinstance(v, str) and bool(_WORKER.match(v)),
    "rank": _optional(lambda v: _int(v, 0, 2**31 - 1)),
    "pid": lambda v: _int(v, 1, 2**31 - 1),
    "host": lambda v: isinstance(v, str),
    "argv": _strings,
    "python": _optional(lambda v: isinstance(v, str)),
    "torch": _optional(lambda v: isinstance(v, str)),
    "started_at": _number,
    "global_steps": _int,
    "durations_us": lambda v: isinstance(v, list) and all(_int(d) for d in v),
    "phases": lambda v: isinstance(v, str) and v.isascii() and (v.isdigit() or v == ""),
    "skipped_windows": _int,
    "notes": _strings,
    "exit": lambda v: isinstance(v, str),
    "peak_rss_bytes": _optional(_int),
    "cuda_peak_bytes": _optional(_int),
}


def schema_problem(log: Any) -> str | None:
    """Why `log` is not a step log of schema version 1, or None when every field has its type and
    the counts fit."""
    if not isinstance(log, dict):
        return "not a JSON object"
    if log.get("schema_version") != STEP_LOG_VERSION:
        return f"schema_version {log.get('schema_version')!r} is not {STEP_LOG_VERSION}"
    for name, check in _FIELDS.items():
        if name not in log:
            return f"{name} is missing"
        if not check(log[name]):
            return f"{name} has the wrong type or range"
    steps = log["global_steps"]
    if len(log["durations_us"]) != len(log["phases"]) or len(log["durations_us"]) > steps + 1:
        return "durations_us and phases do not match global_steps"
    requesters = log.get("requesters")
    if not isinstance(requesters, list):
        return "requesters is not a list"
    for requester in requesters:
        if not (
            isinstance(requester, dict)
            and isinstance(requester.get("name"), str)
            and _int(requester.get("calls"))
            and _int(requester.get("first_step"), 0, steps)
        ):
            return "a requester lacks name, calls or first_step"
    windows = log.get("windows")
    if not isinstance(windows, list):
        return "windows is not a list"
    for window in windows:
        if not (
            isinstance(window, dict)
            and _int(window.get("first_step"))
            and _int(window.get("last_step"), window["first_step"], steps)
            and isinstance(window.get("trace"), str)
            and _int(window.get("bytes"))
            and _int(window.get("inode"))
            and _int(window.get("device"))
            and isinstance(window.get("complete"), bool)
            and isinstance(window.get("note", ""), str)
        ):
            return "a window lacks first_step, last_step, trace, bytes, inode, device or complete"
    return None


def trace_problem(
    window: dict[str, Any], out_dir: str, since: float, same_host: bool = True
) -> str | None:
    """Why a window's trace is not the file this run wrote (place, owner, inode, size, time), or
    None; when it is, every later read of it checks it again on the descriptor it reads
    (stepcli.inputs.expect_written), so a forgery renamed over it after this look is never read.
    `same_host` False (a step log of another node sharing the output folder): its device number is
    that node's mount of a shared file system, not comparable here; the inode (the server's) still
    is."""
    path = window["trace"]
    root = os.path.realpath(out_dir)
    try:
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            return "outside the output folder"
    except (OSError, ValueError):
        return "missing"
    written = Written(
        window["inode"], window["device"] if same_host else None, window["bytes"], os.geteuid()
    )
    problem = file_problem(path, written)
    if problem is not None:
        return problem
    try:
        if os.lstat(path).st_mtime < since - 2.0:  # 2 s: coarse file-system timestamps
            return "older than the run"
    except OSError:
        return "missing"
    expect_written(path, written)
    return None


def load_step_logs(config: AgentConfig, since: float) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's trustworthy step logs (windows with untrusted traces removed) and notes: one naming
    what was refused, one per process whose final step log is missing. `since` is the run's start
    (epoch seconds)."""
    folder = config.log_dir
    logs: list[dict[str, Any]] = []
    refused: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return logs, []
    for name in names:
        if name.startswith(".") or not name.endswith(STEP_LOG_SUFFIX):
            continue
        problem, log = _read_log(os.path.join(folder, name), config.run_key)
        if problem is None:
            problem = schema_problem(log)
        if problem is not None or log is None:
            refused.append(f"step log {name} ({problem})")
            continue
        kept = []
        for window in log["windows"]:
            why = trace_problem(window, config.out_dir, since, log["host"] == socket.gethostname())
            # checked: the summary's windows are as documented
            del window["inode"], window["device"]
            if why is None:
                kept.append(window)
            else:
                refused.append(f"trace {window['trace']} ({why})")
        log["windows"] = kept
        logs.append(log)
    notes = [stale_log_note(log, config, since) for log in logs if log["exit"] == "running"]
    if refused:
        shown = "; ".join(refused[:_MAX_SHOWN]) + (
            f"; +{len(refused) - _MAX_SHOWN} more" if len(refused) > _MAX_SHOWN else ""
        )
        notes.insert(
            0,
            f"ignored {len(refused)} file(s) this run's processes did not write as recorded: "
            f"{shown}",
        )
    return logs, notes


def stale_log_note(log: dict[str, Any], config: AgentConfig, since: float) -> str:
    """A step log still marked "running" after the program ended is one the process wrote before its
    end, not the final one: its steps, statistics and traces stop there. Say so, and why when the
    folder tells (full or read-only), instead of a summary that is silently short."""
    from stepcli.agent.output import folder_problem

    problem = folder_problem(config.log_dir) if os.path.isdir(config.log_dir) else None
    why = (
        f"could not be written ({problem.strerror or problem} in {config.log_dir})"
        if problem is not None
        else "was never written (the process was killed, or could not write it)"
    )
    # saved by its stacks thread when it stopped stepping
    if log.get("progress") == "stalled" and problem is None:
        return (
            f"{log['worker']}: its final step log was never written (the process was killed), but "
            f"it was saved when the process stopped stepping, at step {log['global_steps']}: every "
            f"step it made is counted"
        )
    listed = {os.path.realpath(w["trace"]) for w in log["windows"]}
    unlisted = [
        path for path in _traces_of(log["worker"], config.out_dir, since) if path not in listed
    ]
    more = (
        f"; {len(unlisted)} more of its traces are in {config.out_dir} (stepcli table reads them)"
        if unlisted
        else ""
    )
    return (
        f"{log['worker']}: its step log is from step {log['global_steps']} and its final one "
        f"{why}: its later steps and traces are missing from this summary{more}"
    )


def _traces_of(worker: str, out_dir: str, since: float) -> list[str]:
    """Traces named after `worker` written in `out_dir` (or its window folders) since the run
    started."""
    found = []
    for folder, dirs, names in os.walk(out_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .stepcli/ holds no trace
        for name in names:
            path = os.path.join(folder, name)
            if (
                name.startswith(f"{worker}.")
                and ".pt.trace.json" in name
                and not name.endswith(".tmp")
            ):
                try:
                    if os.lstat(path).st_mtime >= since - 2.0:
                        found.append(os.path.realpath(path))
                except OSError:
                    pass
    return found


def _read_log(path: str, key: str) -> tuple[str | None, dict[str, Any] | None]:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return "a symbolic link", None
        data = read_input(path, gunzip=False)
        document = json.loads(data)
    except StepcliError as exc:
        return exc.message.rsplit(": ", 1)[-1], None
    except (OSError, ValueError, RecursionError):
        return "not valid JSON", None
    if not isinstance(document, dict):
        return "not a JSON object", None
    signature = document.pop(SIGNATURE_KEY, None)
    if not signature_matches(key, document, signature):
        return "not signed by this run's processes", None
    return None, document
