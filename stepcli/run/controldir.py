"""The control folder `<out>/.stepcli/<run-id>/`: private to the user whatever the umask, never someone else's.

The profiled processes write their step logs there and the launcher trusts what it reads back (after checking it,
stepcli/run/steplogs.py), so nobody else may create, replace or write into it. Traces and summaries elsewhere in the
output folder follow the user's umask, as files usually do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stepcli.agent.config import LOG_FOLDER
from stepcli.errors import StepcliError

PRIVATE_MODE = 0o700


def prepare_control_dir(out_dir: Path, run_id: str) -> Path:
    """Create `<out>/.stepcli/` (or check an existing one) and a new `<run-id>/` inside it, both mode 0700."""
    base = out_dir / LOG_FOLDER
    run_dir = base / run_id
    try:
        _private_dir(base)
        _private_dir(run_dir)  # may exist: launchers of several nodes can share an output folder and a run id
    except OSError as exc:
        raise StepcliError(f"cannot create the control folder {run_dir}: {exc.strerror or exc}") from None
    return run_dir


def _private_dir(path: Path) -> None:
    try:
        os.mkdir(path, PRIVATE_MODE)  # the umask can only remove bits from 0700; the chmod below restores them
    except FileExistsError:
        pass  # checked below: ours, a real folder, and made private
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise StepcliError(f"control folder {path} exists and is not a folder (a link?): refusing to use it")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise StepcliError(f"control folder {path} belongs to another user: refusing to use it")
    if stat.S_IMODE(info.st_mode) != PRIVATE_MODE:
        os.chmod(path, PRIVATE_MODE)
