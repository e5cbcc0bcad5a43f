"""A run folder's own files, read back later (`stepcli report DIR`, `stepcli compare DIR`): only what this user's
`stepcli run` could have written there.

A run folder may sit in a scratch folder other users can write to, or have been moved or downloaded (a CI
artifact). So `.stepcli/` and its run folders count only when they are real folders of this user, the files in them
only when they are regular files of this user (never through a link), and the paths a saved summary names are
taken inside the folder given, never where the document says (security.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import cast

from stepcli.runsummary import RunSummary

__all__ = ["contained", "read_saved", "rerooted", "run_dirs", "run_dirs_readable"]


def run_dirs(out_dir: str) -> list[Path]:
    """The step-log folders of a run folder (`.stepcli/<run id>/`), newest run first. A folder given to `-o` more
    than once holds one per run; the run id starts with its start time. Only folders `stepcli run` could have
    made: `.stepcli` and each run's folder real folders (not links) of this user. Anything else there (planted in a
    shared scratch folder by another user) is left out, as the launcher leaves it out (security.md)."""
    base = Path(out_dir, ".stepcli")
    if not _own_folder(base):
        return []
    try:
        found = [(p, info) for p in base.iterdir() if (info := _own_folder(p)) is not None]
    except OSError:
        return []
    found.sort(key=lambda item: (item[0].name[:15], item[1].st_mtime), reverse=True)
    return [p for p, _ in found]


def run_dirs_readable(out_dir: str) -> bool:
    """Whether `.stepcli` in `out_dir` is a real folder of this user's (run_dirs reads nothing in any other)."""
    return _own_folder(Path(out_dir, ".stepcli")) is not None


def _own_folder(path: Path) -> os.stat_result | None:
    """lstat of `path` when it is a folder of this user and not a link, else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        return None
    return info


def read_saved(path: Path) -> bytes | None:
    """The bytes of a file `stepcli run` saved in a run's folder (its summary, a step log): a regular file of this
    user, read without following a link and within the input limit; None for anything else (left out)."""
    from stepcli import safefile
    from stepcli.limits import input_limit

    try:
        return safefile.read_regular(str(path), input_limit(), own=True)
    except OSError:
        return None


def rerooted(summary: RunSummary, folder: str) -> RunSummary:
    """A summary found in the run folder `folder`, its paths taken inside that folder. The out_dir it names is
    where the run wrote (the folder may since have been moved, or downloaded from CI) or, in a hostile file,
    anywhere ("/"); the traces it names were checked on loading to lie inside that out_dir, and are taken at the same
    place inside `folder`, so nothing outside the folder given is ever read through it."""
    out_dir = summary.get("out_dir")
    if not isinstance(out_dir, str) or not out_dir:
        return summary
    root = os.path.normpath(out_dir)

    def inside(path: str) -> str:
        return os.path.join(folder, os.path.relpath(os.path.normpath(os.path.join(root, path)), root))

    out = cast(RunSummary, dict(summary))
    out["out_dir"] = os.path.abspath(folder)
    out["traces"] = [t for p in summary.get("traces") or [] if contained(t := inside(p), folder)]
    out["windows"] = [w | {"trace": inside(w["trace"])} if "trace" in w else w for w in summary.get("windows") or []]
    return out


def contained(path: str, folder: str) -> bool:
    """Whether `path`, its links followed, lies inside `folder` (its links followed too): a link in a run folder
    (an unpacked artifact can hold one) must not lead a reader out of it."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root and real != root
