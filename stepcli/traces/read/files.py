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
    """A file stands for itself; a folder for the traces under it (hidden and temporary names skipped)."""
    if os.path.isdir(path):
        found = sorted(_walk(Path(path)))
        # A run folder can also hold manifests and summaries; when torch-named traces are there, use only those.
        named = [p for p in found if ".pt.trace.json" in Path(p).name]
        found = named or found
        if not found:
            raise TraceError(path, "no .json or .json.gz trace files in this folder")
        return found
    if not os.path.exists(path):
        raise TraceError(path, "no such file or folder")
    return [path]


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
