"""Which files a `stepcli table`/`compare` argument names: a file stands for itself, a folder for the traces under
it; and the rank a file name carries."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from stepcli.errors import TraceError

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def list_trace_files(paths: Sequence[str]) -> list[str]:
    """The trace files `paths` name (files, or folders searched recursively), in a stable order, each once."""
    files: list[str] = []
    for path in paths:
        files.extend(_expand(path))
    seen: set[str] = set()
    unique: list[str] = []
    for file in files:
        key = os.path.realpath(file)
        if key in seen:
            continue
        seen.add(key)
        unique.append(file)
    return unique


def _expand(path: str) -> list[str]:
    """A file stands for itself; a folder for the traces under it (hidden and temporary names skipped). A stepcli
    run folder given to `-o` more than once holds several runs: only the newest run's traces (see `older_runs`)."""
    if os.path.isdir(path):
        found = sorted(_walk(Path(path)))
        older = older_runs(path)
        if older is not None:
            newest, runs, left_out = older
            kept = [p for p in found if os.path.realpath(p) not in left_out]
            if len(kept) < len(found):
                from stepcli.fmt import say

                say(
                    f"{path}: {runs} runs in this folder (-o given {runs} times): read the newest, {newest}; "
                    f"{len(found) - len(kept)} trace(s) of older runs left out (give their files to read them)"
                )
                found = kept
        # A run folder can also hold manifests and summaries; when torch-named traces are there, use only those.
        named = [p for p in found if ".pt.trace.json" in Path(p).name]
        found = named or found
        if not found:
            raise TraceError(path, "no .json or .json.gz trace files in this folder")
        return found
    if not os.path.exists(path):
        raise TraceError(path, "no such file or folder")
    return [path]


def older_runs(folder: str) -> tuple[str, int, set[str]] | None:
    """For a stepcli run folder of several runs (`.stepcli/<run id>/` each): the newest run's id, the number of
    runs, and the real paths of the traces the older runs wrote (their step logs' windows) that the newest run did
    not; None for any other folder. Runs into one folder stay apart: a step of rank 0 is one run's step."""
    import orjson

    from stepcli.agent.config import STEP_LOG_SUFFIX
    from stepcli.errors import StepcliError
    from stepcli.inputs import read_input

    base = Path(folder, ".stepcli")
    if not base.is_dir() or base.is_symlink():
        return None
    runs = sorted(
        (p for p in base.iterdir() if p.is_dir() and not p.is_symlink()),
        key=lambda p: (p.name[:15], p.stat().st_mtime),
        reverse=True,
    )
    if len(runs) < 2:
        return None

    def traces(run: Path) -> set[str]:
        out: set[str] = set()
        for log_path in run.glob(f"*{STEP_LOG_SUFFIX}"):
            try:
                log = orjson.loads(read_input(str(log_path), gunzip=False))
            except (StepcliError, orjson.JSONDecodeError):
                continue
            windows = log.get("windows") if isinstance(log, dict) else None
            for window in windows if isinstance(windows, list) else []:
                trace = window.get("trace") if isinstance(window, dict) else None
                if isinstance(trace, str):
                    # recorded where the run saw it: map it into this folder, wherever the folder is now
                    out.add(os.path.realpath(os.path.join(folder, os.path.relpath(trace, _run_root(trace)))))
                    out.add(os.path.realpath(trace))
        return out

    newest = traces(runs[0])
    older = set().union(*(traces(run) for run in runs[1:])) - newest
    return runs[0].name, len(runs), older


def _run_root(trace: str) -> str:
    """The output folder a window's trace was written under (the trace's folder, or above a window-step folder)."""
    parent = os.path.dirname(trace)
    return os.path.dirname(parent) if os.path.basename(parent).startswith("window-step") else parent


def _walk(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or ".tmp" in name:
                continue
            if name.endswith(".json") or name.endswith(".json.gz"):
                yield os.path.join(dirpath, name)


def rank_from_name(path: str) -> int | None:
    """The N of a `rank<N>` in the file name (tensorboard_trace_handler's worker_name, stepcli's rank files)."""
    match = _RANK_IN_NAME.search(os.path.basename(path))
    return int(match.group(1)) if match else None
