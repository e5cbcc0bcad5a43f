"""A run folder's own files, read back later (`stepcli report DIR`, `stepcli compare DIR`): only
what this user's `stepcli run` could have written there.

A run folder may sit in a scratch folder other users can write to, or have been moved or downloaded
(a CI artifact). So `.stepcli/` and its run folders count only when they are real folders of this
user, the files in them only when they are regular files of this user (never through a link), and
the paths a saved summary names are taken inside the folder given, never where the document says
(security.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import msgspec

from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.inputs import Written, expect_written, file_problem
from stepcli.runfolder.layout import RUN_FOLDER, SUMMARY_FILE, run_dir, runs_dir
from stepcli.runfolder.summaryfile import RunSummary

__all__ = [
    "RunPick",
    "contained",
    "pick_run",
    "read_saved",
    "read_saved_json",
    "rerooted",
    "run_dirs",
    "run_dirs_readable",
    "run_traces",
    "runs_to_read",
    "written_traces",
]

# A run's step logs in its private folder (the agent's STEP_LOG_SUFFIX; the agent imports nothing of
# the readers).
_STEP_LOGS = "*.steps.json"


def run_dirs(out_dir: str) -> list[Path]:
    """The step-log folders of a run folder (`.stepcli/<run id>/`), newest run first. A folder given
    to `-o` more than once holds one per run; the run id starts with its start time. Only folders
    `stepcli run` could have made: `.stepcli` and each run's folder real folders (not links) of this
    user. Anything else there (planted in a shared scratch folder by another user) is left out, as
    the launcher leaves it out (security.md)."""
    base = Path(runs_dir(out_dir))
    if not _own_folder(base):
        return []
    try:
        found = [(p, info) for p in base.iterdir() if (info := _own_folder(p)) is not None]
    except OSError:
        return []
    found.sort(key=lambda item: (item[0].name[:15], item[1].st_mtime), reverse=True)
    return [p for p, _ in found]


def run_dirs_readable(out_dir: str) -> bool:
    """Whether `.stepcli` in `out_dir` is a real folder of this user's (run_dirs reads nothing in
    any other)."""
    return _own_folder(Path(runs_dir(out_dir))) is not None


def _own_folder(path: Path) -> os.stat_result | None:
    """lstat of `path` when it is a folder of this user and not a link, else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        return None
    return info


def read_saved(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of a file `stepcli run` saved in a run's folder (its summary, a step log): a
    regular file of this user, read without following a link and within `limit` bytes (the input
    limit by default); None for anything else (left out)."""
    from stepcli import safefile
    from stepcli.limits import input_limit

    try:
        return safefile.read_regular(str(path), input_limit() if limit is None else limit, own=True)
    except OSError:
        return None


def read_saved_json(path: Path, limit: int | None = None) -> dict[str, Any] | None:
    """stepcli's own JSON saved in a run's folder (its summary, a step log, a step record), with one
    failure policy: the JSON object of a file read_saved reads, or None for anything else (a link,
    another user's file, too large, not JSON, not an object): left out, never an error. The readers
    say what is missing from a run, not why a file of it could not be read; a file given on the
    command line is read by stepcli.inputs."""
    import orjson

    data = read_saved(path, limit)
    if data is None:
        return None
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        import json  # (NaN, which Python's json writes and orjson refuses)

        try:
            document = json.loads(data)
        except (ValueError, RecursionError):
            return None
    return document if isinstance(document, dict) else None


def rerooted(summary: RunSummary, folder: str) -> RunSummary:
    """A summary found in the run folder `folder`, its paths taken inside that folder. The out_dir
    it names is where the run wrote (the folder may since have been moved, or downloaded from CI)
    or, in a hostile file, anywhere ("/"); the traces it names were checked on loading to lie inside
    that out_dir, and are taken at the same place inside `folder`, so nothing outside the folder
    given is ever read through it."""
    out_dir = summary.out_dir
    if not isinstance(out_dir, str) or not out_dir:
        return summary
    root = os.path.normpath(out_dir)

    def inside(path: str) -> str:
        return os.path.join(
            folder, os.path.relpath(os.path.normpath(os.path.join(root, path)), root)
        )

    return msgspec.structs.replace(
        summary,
        out_dir=os.path.abspath(folder),
        traces=[t for p in summary.traces if contained(t := inside(p), folder)],
        windows=[msgspec.structs.replace(w, trace=inside(w.trace)) for w in summary.windows],
    )


def written_traces(run_dir: Path, folder: str, traces: Sequence[str]) -> list[str]:
    """Those of `traces` (taken inside the run folder `folder`) that are the very files the run's
    step logs in `run_dir` record, by the run end's own check (stepcli.inputs.written_problem: a
    regular file of this user, its inode and size), each then read only while it still is
    (stepcli.inputs.expect_written); the others are named in one `stepcli: note:` line and left out.
    Another user can rename a same-size forgery over a trace in a shared folder after the run. A
    folder read elsewhere than where the run wrote (its saved summary's out_dir) was moved or copied
    (a CI artifact), and a copy's inodes say nothing: its traces are checked by owner and size."""
    recorded = _recorded_traces(run_dir, folder)
    kept: list[str] = []
    refused: list[str] = []
    for path in traces:
        written = recorded.get(os.path.abspath(path))
        problem = (
            "no step log of the run records it" if written is None else file_problem(path, written)
        )
        if written is not None and problem is None:
            expect_written(path, written)
            kept.append(path)
        else:
            refused.append(f"{path} ({problem})")
    if refused:
        from stepcli.fmt import say

        shown = "; ".join(refused[:3]) + (f"; +{len(refused) - 3} more" if len(refused) > 3 else "")
        say(f"note: left out {len(refused)} trace(s) that are not the files the run wrote: {shown}")
    return kept


def _recorded_traces(run_dir: Path, folder: str) -> dict[str, Written]:
    """What the run's step logs (regular files of this user in its private folder) record of each
    trace they name, by the trace's absolute path inside `folder` (see written_traces)."""
    import socket

    out_dir = None
    doc = read_saved_json(run_dir / SUMMARY_FILE)
    if doc is not None and isinstance(doc.get("out_dir"), str) and os.path.isabs(doc["out_dir"]):
        out_dir = doc["out_dir"]
    in_place = out_dir is None or os.path.realpath(out_dir) == os.path.realpath(folder)
    root = os.path.normpath(out_dir) if out_dir else None
    found: dict[str, Written] = {}
    for log_path in sorted(run_dir.glob(_STEP_LOGS)):
        log = read_saved_json(log_path)
        if log is None or not isinstance(log.get("windows"), list):
            continue
        same_host = log.get("host") == socket.gethostname()
        for window in log["windows"]:
            if not isinstance(window, dict) or not isinstance(window.get("trace"), str):
                continue
            size, inode, device = window.get("bytes"), window.get("inode"), window.get("device")
            if not (_whole(size) and _whole(inode) and _whole(device)):
                continue  # (the run end refused such a window: its trace is no trace of the run)
            path = window["trace"]
            if root is not None:
                path = os.path.join(
                    folder, os.path.relpath(os.path.normpath(os.path.join(root, path)), root)
                )
            found[os.path.abspath(path)] = Written(
                inode if in_place else None,
                device if in_place and same_host else None,
                size,
                os.geteuid(),
            )
    return found


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def contained(path: str, folder: str) -> bool:
    """Whether `path`, its links followed, lies inside `folder` (its links followed too): a link in
    a run folder (an unpacked artifact can hold one) must not lead a reader out of it."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root and real != root


@dataclass(frozen=True)
class RunPick:
    """One run chosen in a run folder: the folder given to `-o`, the run's own `.stepcli/<run id>/`,
    and the other runs the folder holds (a folder given to `-o` more than once)."""

    folder: str
    run_dir: Path
    others: int
    named: bool  # given by its run id (`FOLDER/.stepcli/<run id>`), not taken as the latest
    # runs that ran at the same time as the latest: the other nodes of one job (`stepcli run -o
    # SHARED` on each node makes a run of its own there), read with it
    together: tuple[Path, ...] = ()


def pick_run(path: str) -> RunPick | None:
    """The run a path names: `FOLDER/.stepcli/<run id>` names that run, a run folder its latest run;
    None for anything else (a folder of traces, a file)."""
    given = Path(path)
    if given.parent.name == RUN_FOLDER and _own_folder(given) is not None:
        folder = str(given.parent.parent)
        runs = run_dirs(folder)
        if any(os.path.samefile(given, run) for run in runs):
            return RunPick(folder, given, len(runs) - 1, named=True)
        return None
    runs = run_dirs(path) if os.path.isdir(path) else []
    if not runs:
        return None
    together = tuple(_concurrent(runs[0], runs[1:]))
    return RunPick(path, runs[0], len(runs) - 1 - len(together), named=False, together=together)


def _span(run: Path) -> tuple[float, float] | None:
    """When a run ran (epoch seconds), from its saved summary; None without one."""
    from datetime import datetime

    from stepcli.runfolder.summaryread import read_run_summary

    data = read_saved(run / SUMMARY_FILE)
    if data is None:
        return None
    try:
        summary = read_run_summary(data, str(run / SUMMARY_FILE))
        start = datetime.fromisoformat(str(summary.started_at)).timestamp()
    except (StepcliError, ValueError):
        return None
    return start, start + float(summary.duration_s or 0.0)


def _concurrent(latest: Path, others: Sequence[Path]) -> list[Path]:
    """The runs that ran beside the latest one for more than a second: one job's launches on several
    nodes. (Run summaries give their start to the second: a run started right after another ended
    overlaps it by less.)"""
    span = _span(latest)
    if span is None:
        return []
    out = []
    for run in others:
        other = _span(run)
        if other is not None and min(span[1], other[1]) - max(span[0], other[0]) > 1.0:
            out.append(run)
    return out


def other_runs_note(pick: RunPick, all_runs: bool = True) -> str | None:
    """The one line saying a run folder holds other runs, which one is read, and how to read the
    others; None when there are none, or the run was named."""
    if pick.others == 0 or pick.named:
        return None
    one = run_dir(pick.folder, "<run id>")
    how = f"--all-runs reads all, {one} one" if all_runs else f"{one} reads another"
    return f"{pick.folder}: reading the latest of its {pick.others + 1} runs; {how}"


def run_traces(pick: RunPick) -> list[str]:
    """The traces the chosen run wrote that are still there, as its saved run summary lists them
    (inside the folder: rerooted). A run with no saved summary (stepcli itself was killed) or no
    trace is refused in one line that says how to read the folder's traces anyway."""
    from stepcli.runfolder.summaryread import read_run_summary

    path = pick.run_dir / SUMMARY_FILE
    data = read_saved(path)
    which = f"run {pick.run_dir.name}" if pick.named else f"its latest run ({pick.run_dir.name})"
    anyway = f"; `--all-runs {pick.folder}` reads every trace in the folder"
    # still running (or stepcli was killed): its traces are those no other run lists
    if data is None:
        traces = _unclaimed_traces(pick)
        if traces is None:
            raise StepcliError(
                f"{pick.folder}: {which} saved no run summary, so its traces are unknown{anyway}",
                EXIT_USAGE,
            )
    else:
        traces = []
        for run in (pick.run_dir, *pick.together):
            saved = data if run == pick.run_dir else read_saved(run / SUMMARY_FILE)
            if saved is None:
                continue
            summary = rerooted(read_run_summary(saved, str(run / SUMMARY_FILE)), pick.folder)
            traces += written_traces(
                run, pick.folder, [t for t in summary.traces if os.path.lexists(t)]
            )
    if not traces:
        raise StepcliError(f"{pick.folder}: {which} recorded no trace{anyway}", EXIT_USAGE)
    return traces


def _unclaimed_traces(pick: RunPick) -> list[str] | None:
    """The traces in the folder (where `stepcli run` writes them: the folder itself and its
    `window-step<N>/`) that no other run's saved summary lists: those of a run still running. None
    when another run has no readable summary (then no trace can be told apart)."""
    from stepcli.runfolder.summaryread import read_run_summary

    claimed: set[str] = set()
    for run in run_dirs(pick.folder):
        if run == pick.run_dir:
            continue
        data = read_saved(run / SUMMARY_FILE)
        if data is None:
            return None
        try:
            summary = rerooted(read_run_summary(data, str(run / SUMMARY_FILE)), pick.folder)
        except StepcliError:
            return None
        claimed |= {os.path.realpath(t) for t in summary.traces or []}
    root = Path(pick.folder)
    found = [*root.glob("*.pt.trace.json*"), *root.glob("window-step*/*.pt.trace.json*")]
    return sorted(
        str(p)
        for p in found
        if p.is_file()
        and not p.name.startswith(".")
        and ".tmp" not in p.name
        and os.path.realpath(p) not in claimed
    )


def runs_to_read(paths: Sequence[str], all_runs: bool) -> list[str]:
    """`paths` with each run folder replaced by its latest run's traces (or, `FOLDER/.stepcli/<run
    id>`, that run's): a folder given to `-o` twice holds both runs' traces, which read together
    would look like two ranks. With `all_runs`, a run folder stands for every trace in it, as
    before. Says on stderr when other runs are left out."""
    from stepcli.fmt import say

    out: list[str] = []
    for path in paths:
        pick = pick_run(path)
        if pick is None or (all_runs and not pick.named) or (pick.others == 0 and not pick.named):
            out.append(path)
            continue
        out.extend(run_traces(pick))
        note = other_runs_note(pick)
        if note:
            say(note)
    return out
