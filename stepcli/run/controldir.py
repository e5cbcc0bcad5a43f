"""The control folder `<out>/.stepcli/<run-id>/`: private to the user whatever the umask, never
someone else's.

The profiled processes write their step logs there and the launcher trusts what it reads back (after
checking it, stepcli/runfolder/steplogreader.py), so nobody else may create, replace or write into
it. Traces and summaries elsewhere in the output folder follow the user's umask, as files usually
do.

`stepcli capture`'s side of its `control/` folder is here too: the heartbeats it reads and the
requests.json it writes, every file opened relative to the folder's checked descriptor
(stepcli/agent/controlfiles.py).
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stepcli.agent import controlfiles
from stepcli.agent.request import MAX_CONTROL_BYTES, Invalid, check_request
from stepcli.errors import StepcliError
from stepcli.runfolder.layout import LOCK_FILE, PROC_PREFIX, REQUESTS_FILE, RUN_FILE, RUN_FOLDER

PRIVATE_MODE = 0o700


def prepare_control_dir(out_dir: Path, run_id: str) -> Path:
    """Create `<out>/.stepcli/` (or check an existing one) and a new `<run-id>/` inside it, both
    mode 0700."""
    base = out_dir / RUN_FOLDER
    run_dir = base / run_id
    try:
        _private_dir(base)
        # may exist: launchers of several nodes can share an output folder and a run id
        _private_dir(run_dir)
    except OSError as exc:
        raise StepcliError(
            f"cannot create the control folder {run_dir}: {exc.strerror or exc}"
        ) from None
    return run_dir


def _private_dir(path: Path) -> None:
    try:
        # the umask can only remove bits from 0700; the chmod below restores them
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        pass  # checked below: ours, a real folder, and made private
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise StepcliError(
            f"control folder {path} exists and is not a folder (a link?): refusing to use it"
        )
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise StepcliError(f"control folder {path} belongs to another user: refusing to use it")
    if stat.S_IMODE(info.st_mode) != PRIVATE_MODE:
        os.chmod(path, PRIVATE_MODE)


# -- `stepcli capture`'s side of the control/ folder
# ---------------------------------------------------------------
_PROC_BYTES = 1 << 20  # a heartbeat holds a few answers: far below this


@contextmanager
def _folder(folder: str) -> Iterator[int]:
    """The control folder's descriptor, checked (a private folder of this user's, not a link) and
    closed after."""
    fd = controlfiles.open_folder(folder)
    try:
        yield fd
    finally:
        os.close(fd)


def read_processes(folder: str) -> list[dict[str, Any]]:
    """Every process's heartbeat and answers (files written atomically: a half file is never
    seen)."""
    processes: list[dict[str, Any]] = []
    try:
        with _folder(folder) as fd:
            for name in os.listdir(fd):
                if not (name.startswith(PROC_PREFIX) and name.endswith(".json")):
                    continue
                try:
                    document = controlfiles.read_json(fd, name, _PROC_BYTES)
                except (OSError, ValueError):
                    continue
                if isinstance(document, dict):
                    processes.append(document)
    except OSError:
        pass
    return processes


def run_alive(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, RUN_FILE))


@contextmanager
def locked(folder: str) -> Iterator[int]:
    """One capture at a time edits requests.json (two at once would pick overlapping steps)."""
    import fcntl

    with _folder(folder) as folder_fd:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(LOCK_FILE, flags, 0o600, dir_fd=folder_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield folder_fd
        finally:
            os.close(fd)


def read_requests(folder: str, run_id: str) -> list[dict[str, Any]]:
    return read_control(folder, run_id)[0]


def read_control(folder: str, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the well-formed requests, the pings) in requests.json."""
    try:
        with _folder(folder) as fd:
            document = controlfiles.read_json(fd, REQUESTS_FILE, MAX_CONTROL_BYTES)
    except (OSError, ValueError):
        return [], []
    if not isinstance(document, dict) or document.get("run_id") != run_id:
        return [], []
    return [r for r in _entries(document.get("requests")) if _well_formed(r)], _entries(
        document.get("pings")
    )


def _well_formed(request: dict[str, Any]) -> bool:
    try:
        check_request(request)
    except Invalid:
        return False
    return True


def _entries(value: Any) -> list[dict[str, Any]]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def still_wanted(request: dict[str, Any]) -> bool:
    """False for the request of a capture on this host that died without withdrawing it (dropped
    when the file is next written; its window is still avoided when placing a new one, as processes
    may be recording it)."""
    if request.get("host") != socket.gethostname():
        return True
    import psutil

    pid = request.get("pid")
    return isinstance(pid, int) and pid > 0 and bool(psutil.pid_exists(pid))


def write_requests(
    folder_fd: int, run_id: str, requests: list[dict[str, Any]], pings: list[dict[str, Any]]
) -> None:
    if requests or pings:
        controlfiles.write_json(
            folder_fd, REQUESTS_FILE, {"run_id": run_id, "requests": requests, "pings": pings}
        )
    else:
        # nobody asks: the processes' poll finds no file, the cheapest
        controlfiles.unlink(folder_fd, REQUESTS_FILE)
