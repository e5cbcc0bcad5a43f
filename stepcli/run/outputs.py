"""Where a run writes, checked before the program starts: the output folder (the one asked for, or a
new one per run that never reuses an old folder) and the `--json` path, so a typo or a read-only
folder fails in a second, not after an hour of training.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stepcli import safefile
from stepcli.errors import StepcliError

if TYPE_CHECKING:
    from stepcli.runfolder.summaryfile import RunSummary

DEFAULT_RUNS_DIR = "stepcli-runs"


def check_json_writable(path: str) -> None:
    """`--json PATH` must be writable before the program runs, not found unwritable after a long
    run."""
    target = Path(path).absolute()
    if target.is_dir():
        raise StepcliError(f"--json {path}: is a folder")
    folder = target.parent
    # never created: a typo must not make folders (as root, at the filesystem root)
    if not folder.exists():
        raise StepcliError(f"--json {path}: folder {folder} does not exist (create it first)")
    try:
        if not folder.is_dir():
            raise NotADirectoryError(20, "not a folder")
        safefile.probe_writable(str(folder), "stepcli-json-test")
    except OSError as exc:
        raise StepcliError(
            f"--json {path}: cannot write in {folder}: {exc.strerror or exc}"
        ) from None
    # It replaces only a run summary written before (a job run again), never the user's own file
    # (the script!), a link, a FIFO or a device.
    problem = safefile.why_not_replace(str(target), _RUN_SUMMARY.match)
    if problem == safefile.NOT_OURS:
        raise StepcliError(f"--json {path}: {problem} run; give another --json FILE or remove it")
    if problem is not None:
        raise StepcliError(f"--json {path}: {problem}; give another --json FILE")


def json_taken(path: str) -> str | None:
    """Checked again when the run ends, before `--json` is written: what the user (or their program)
    put at the path while it ran is theirs, and is not replaced. None when the path may be
    written."""
    problem = safefile.why_not_replace(str(Path(path).absolute()), _RUN_SUMMARY.match)
    if problem is None:
        return None
    return f"--json {path}: {problem} (it appeared while the program ran); left as it is"


def write_json(json_path: str | None, out_dir: str, summary: RunSummary, written: set[str]) -> bool:
    """Write `--json` at the run's end; False when it could not be written (a full disk): then the
    previous run's summary at that path is removed, so the next `compare` never judges it as this
    run, and the run fails (EXIT_NOT_SAVED). A file of the user's that appeared there while the
    program ran is kept, with a warning."""
    from stepcli.fmt import say
    from stepcli.run.summary.build import write_run_summary

    if not json_path:
        return True
    taken = json_taken(json_path)
    try:
        if taken:
            raise StepcliError(
                f"{taken}; `stepcli compare {out_dir}` reads the run summary saved there"
            )
        write_run_summary(summary, json_path)
        written.add("json")
    except StepcliError as exc:
        if taken:
            say(f"warning: {exc.message}")
            return True
        say(f"error: {exc.message}; {drop_stale_json(json_path)}")
        return False
    return True


def drop_stale_json(path: str) -> str:
    """`--json PATH` could not be written (the disk filled during the run): the previous run's
    summary must not stay there, complete and valid, for the next `compare` to judge as this run.
    Removes it (only a run summary stepcli wrote: never the user's file, a link or a FIFO) and says,
    in a few words, what is left at the path."""
    target = str(Path(path).absolute())
    if not os.path.lexists(target):
        return "no run summary is there"
    if safefile.why_not_replace(target, _RUN_SUMMARY.match) is not None:
        return "what is there is not a run summary of stepcli's and is left as it is"
    try:
        os.unlink(target)
    except OSError as exc:
        return (
            f"the previous run's summary there could not be removed ({exc.strerror or exc}): it is "
            f"NOT this run's"
        )
    return "the previous run's summary there was removed"


_RUN_SUMMARY = re.compile(rb'\s*\{\s*"schema"\s*:\s*"stepcli\.run"')  # how every run summary begins


def prepare_out_dir(out_dir: str | None, label: str) -> Path:
    """Create the output folder: the one asked for, or a new one per run that never reuses an old
    folder."""
    try:
        if out_dir is not None:
            path = _own_out_dir(out_dir)
        else:
            base = Path(DEFAULT_RUNS_DIR).resolve()
            base.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for attempt in range(1, 1000):
                path = base / (f"{stamp}-{label}" if attempt == 1 else f"{stamp}-{label}-{attempt}")
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    continue
        safefile.probe_writable(str(path), "stepcli-write-test")
    except StepcliError:
        raise
    except OSError as exc:
        raise StepcliError(
            f"cannot write to output folder {out_dir or DEFAULT_RUNS_DIR}: {exc.strerror or exc}"
        ) from None
    return path


def _own_out_dir(out_dir: str) -> Path:
    """`-o DIR` made (with its parents) or found, never through a link another user planted at DIR:
    in a shared folder they can put one there before the run creates DIR, to have the run written
    where the link points. The last name is created without following anything (mkdir never does)
    and looked at without following it; a link is followed only when it is this user's (or root's)
    own, as one made to a scratch folder is."""
    given = Path(out_dir).absolute()
    # the root, or a name that only moves up: nothing to plant there
    if given.name in ("", ".", ".."):
        path = given.resolve()
    else:
        path = given.parent.resolve() / given.name
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (safefile.uid(), 0):
                raise StepcliError(
                    f"output folder {out_dir}: is a link of another user (uid {info.st_uid}), not "
                    f"followed; "
                    "remove it or give another -o DIR"
                )
            path = path.resolve()
    if path.exists() and not path.is_dir():
        raise StepcliError(f"output folder {out_dir}: exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)
    return path
