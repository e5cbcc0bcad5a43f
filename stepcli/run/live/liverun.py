"""Which running `stepcli run` a `stepcli capture TARGET` means: an -o folder, or the pid of one of
its processes.

A pid names a run only when that very process belongs to it: a rank, torchrun's agent or anything
else started under the run (they carry its STEPCLI_CONFIG), or the `stepcli run` launcher itself
(its own children name it as their launcher). Its parents and unrelated processes do not: `stepcli
capture 1` is not every run on the machine.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepcli.agent.config import CONFIG_ENV
from stepcli.agent.controlfiles import open_folder, read_json
from stepcli.agent.schedule import Schedule
from stepcli.errors import StepcliError
from stepcli.runfolder.layout import CONTROL_FOLDER, RUN_FILE, RUN_FOLDER, control_dir

_RUN_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class LiveRun:
    run_id: str
    folder: str  # the control folder
    schedule: Schedule | None  # None with --on-demand
    started_at: float = 0.0  # the launcher's clock when the run started (its traces are no older)


def find_run(target: str) -> LiveRun:
    """The running `stepcli run` that TARGET (an -o folder or a pid) names; StepcliError (exit 2)
    otherwise."""
    path = Path(target)
    if path.is_dir():
        folders = sorted(path.joinpath(RUN_FOLDER).glob(f"*/{CONTROL_FOLDER}"))
    elif target.isdigit():
        out_dir, run_id = _run_of_pid(int(target))
        folders = [Path(control_dir(out_dir, run_id))]
    else:
        raise StepcliError(f"{target}: no such folder or process id")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    foreign = [folder for folder in folders if _owner(folder) not in (uid, None)]
    live = [
        (document, folder)
        for folder in folders
        if folder not in foreign and (document := _live_run_document(folder)) is not None
    ]
    if not live and foreign:
        raise StepcliError(f"{target}: the run belongs to another user; only its owner can capture")
    if not live:
        raise StepcliError(f"{target}: no running stepcli run writes to this folder")
    document, folder = max(live, key=lambda item: _number(item[0].get("started_at")))
    try:
        schedule = None if document.get("on_demand") else Schedule(**document["schedule"])
    except (KeyError, TypeError, ValueError):
        raise StepcliError(
            f"{target}: the run's {RUN_FILE} is not one this version of stepcli understands"
        ) from None
    return LiveRun(
        run_id=str(document["run_id"]),
        folder=str(folder),
        schedule=schedule,
        started_at=_number(document.get("started_at")),
    )


def _owner(folder: Path) -> int | None:
    try:
        return os.lstat(folder).st_uid
    except OSError:
        return None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _live_run_document(folder: Path) -> dict[str, Any] | None:
    try:
        fd = open_folder(str(folder))
    except OSError:
        return None  # the run never started, or the folder is not a private folder of this user's
    try:
        document = read_json(fd, RUN_FILE, _RUN_FILE_BYTES)
    except (OSError, ValueError):
        return None  # the run ended (its launcher removed run.json), or the file is not one of ours
    finally:
        os.close(fd)
    if not isinstance(document, dict) or "run_id" not in document:
        return None
    if document.get("host") == socket.gethostname():
        import psutil

        pid = document.get("launcher_pid")
        if not isinstance(pid, int) or not psutil.pid_exists(pid):
            return None  # the launcher was killed before it could clean up
    return document


def _run_of_pid(pid: int) -> tuple[str, str]:
    """(out_dir, run_id) of the run process `pid` belongs to: a rank, torchrun's agent, or the
    launcher."""
    import psutil

    try:
        process = psutil.Process(pid)
        config = _config_of(process)
        if config is None:  # the launcher's own environment has no config; its children's name it
            config = next(
                (
                    c
                    for child in process.children()
                    if (c := _quiet_config_of(child)) and c[2] == pid
                ),
                None,
            )
        uid = process.uids().real
    except psutil.NoSuchProcess:
        raise StepcliError(f"{pid}: no such process") from None
    except psutil.AccessDenied:
        # ours, but not readable (a container's init, a setuid program)
        if _uid_of(pid) == os.getuid():
            raise StepcliError(
                f"{pid}: not a process of a stepcli run you can capture (its environment cannot be "
                f"read)"
            ) from None
        raise StepcliError(
            f"{pid}: a process of another user ({_user_of(pid)}), not one of yours; only a run's "
            f"owner can capture it"
        ) from None
    if config is None:
        raise StepcliError(
            f"{pid}: not a process of a stepcli run (give the run's -o folder or one of its pids)"
        )
    if hasattr(os, "getuid") and uid != os.getuid():
        raise StepcliError(
            f"{pid}: a stepcli run of another user ({_user_of(pid)}); only its owner can capture it"
        )
    return config[0], config[1]


def _config_of(process: Any) -> tuple[str, str, int] | None:
    """(out_dir, run_id, launcher pid) from the process's STEPCLI_CONFIG; psutil's errors
    propagate."""
    text = process.environ().get(CONFIG_ENV)
    if not text:
        return None
    try:
        config = json.loads(text)
        return str(config["out_dir"]), str(config["run_id"]), int(config["launcher_pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _quiet_config_of(process: Any) -> tuple[str, str, int] | None:
    import psutil

    try:
        return _config_of(process)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _uid_of(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).uids().real)
    except psutil.Error:
        return None


def _user_of(pid: int) -> str:
    import psutil

    try:
        return str(psutil.Process(pid).username())
    except (psutil.Error, KeyError):
        return "unknown"
