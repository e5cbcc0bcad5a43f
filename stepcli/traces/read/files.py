"""Which files a `stepcli table`/`compare` argument names: a file stands for itself, a folder for
the traces under it; and the rank a file name carries."""

from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from stepcli.errors import TraceError

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
# the first key of `stepcli merge`'s output (stepcli.traces.mergetraces)
MERGED_MARKER = "stepcli_merged"
_MERGED_HEAD = re.compile(rb'\s*\{\s*"' + MERGED_MARKER.encode() + rb'"\s*:')
MERGED_PROBLEM = (
    "already a merged trace (stepcli merge output: every rank in one file, for a viewer);"
    " give the rank traces it was made from"
)
# the first key of stepcli's other JSON outputs, which a user may save beside the traces they were
# made from: `whatif --trace` (stepcli.whatif.tracefile.MARKER) and the documents with a stepcli
# schema (`whatif --json`, `compare --json`, `run --json`)
_OWN_OUTPUT_HEAD = re.compile(rb'\s*\{\s*"(?:stepcli_whatif_trace"\s*:|schema"\s*:\s*"stepcli\.)')
OWN_OUTPUT_PROBLEM = (
    "a stepcli output (whatif --trace, or a --json document), not a profiler trace; give the "
    "traces it was made from"
)


def list_trace_files(paths: Sequence[str]) -> list[str]:
    """The trace files `paths` name (files, or folders searched recursively), in a stable order,
    each once. A merged trace (`stepcli merge -o`) is refused when named, and left out of a folder
    (where it repeats the rank traces beside it): read as one process, its ranks' steps would be
    taken for one rank's."""
    files: list[str] = []
    for path in paths:
        files.extend(_expand(path))
        if not os.path.isdir(path):
            kind = _head_kind(path)
            if kind == "merged":
                raise TraceError(path, MERGED_PROBLEM)
            if kind == "own":
                raise TraceError(path, OWN_OUTPUT_PROBLEM)
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
    """A file stands for itself; a folder for the traces under it (hidden and temporary names
    skipped; merged traces and stepcli's own outputs saved there left out)."""
    if os.path.isdir(path):
        found = sorted(_walk(Path(path)))
        kinds: dict[str, str | None] = {}  # each file's head read once

        def kind(file: str) -> str | None:
            if file not in kinds:
                kinds[file] = _head_kind(file)
            return kinds[file]

        # A run folder can also hold manifests and summaries; when torch-named traces are there, use
        # only those. (A stepcli output saved under such a name is no trace: it does not make the
        # others manifests.)
        named = [p for p in found if ".pt.trace.json" in Path(p).name and kind(p) != "own"]
        found = named or found
        if not found:
            raise TraceError(path, "no .json or .json.gz trace files in this folder")
        # (a merged trace repeats the rank traces beside it; stepcli's own outputs, read as traces,
        # failed the folder or joined a job as a process without a rank)
        return [p for p in found if kind(p) not in ("merged", "own")]
    if not os.path.exists(path):
        from stepcli.inputs import broken_link

        raise TraceError(path, broken_link(path) or "no such file or folder")
    return [path]


def _walk(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or ".tmp" in name:
                continue
            if name.endswith(".json") or name.endswith(".json.gz"):
                yield os.path.join(dirpath, name)


def gzip_aware(match: Callable[[bytes], object]) -> Callable[[bytes], object]:
    """`match` on a file's first bytes, inflated first when they are gzip's (an output written as
    NAME.json.gz): for stepcli.safefile.why_not_replace."""

    def matches(head: bytes) -> object:
        try:
            head = _inflated(head)
        except zlib.error:
            return None
        return match(head) if head else None

    return matches


# the first key of a document with a stepcli schema (`run --json`, `compare --json`, ...)
_STEPCLI_SCHEMA_HEAD = re.compile(rb'\s*\{\s*"schema"\s*:\s*"stepcli\.')
# a gzip file inflating to at most this is read whole to tell a document from a trace
_SMALL_DOCUMENT = 8 << 20


def reads_as_document(path: str) -> bool:
    """Whether a NAME.gz file is read by its content (a run summary, say) rather than handed to the
    trace reader, decided without inflating a large gzipped trace: it is no gzip at all (plain JSON
    under a .gz name, as `run --json NAME.json.gz` writes), its first bytes inflated open a
    document of a stepcli schema, or it is small (8 MiB at most, inflated: a summary whose keys
    were reordered)."""
    from stepcli.inputs import GZIP_MAGIC, gzip_trailer

    raw = _regular_head(path)
    if raw is None:
        return False
    if raw[:2] != GZIP_MAGIC:
        return True
    try:
        if _STEPCLI_SCHEMA_HEAD.match(_inflated(raw)):
            return True
    except zlib.error:
        return False  # (the trace reader names the problem)
    trailer = gzip_trailer(path)
    return trailer is not None and max(trailer) <= _SMALL_DOCUMENT


def _head_kind(path: str) -> str | None:
    """ "merged" for `stepcli merge` output, "own" for another stepcli output (see
    _OWN_OUTPUT_HEAD), None for anything else, by the file's first bytes (inflated when
    gzipped)."""
    raw = _regular_head(path)
    try:
        head = _inflated(raw) if raw is not None else b""
    except zlib.error:
        return None
    if _MERGED_HEAD.match(head):
        return "merged"
    return "own" if _OWN_OUTPUT_HEAD.match(head) else None


def _regular_head(path: str) -> bytes | None:
    """The first 4 KiB of a regular file, as they are; None for anything else or a file that cannot
    be read (a FIFO is never waited on: the reader refuses it in one line)."""
    from stepcli.inputs import open_input

    try:
        fd, info = open_input(path)
    except TraceError:
        return None
    try:
        return os.read(fd, 4096) if stat.S_ISREG(info.st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _inflated(head: bytes) -> bytes:
    """A file's first bytes, inflated when they are gzip's (as far as they go); zlib.error when
    they are not whole gzip."""
    return zlib.decompressobj(31).decompress(head, 4096) if head[:2] == b"\x1f\x8b" else head


def rank_from_name(path: str) -> int | None:
    """The N of a `rank<N>` in the file name (tensorboard_trace_handler's worker_name, stepcli's
    rank files)."""
    match = _RANK_IN_NAME.search(os.path.basename(path))
    return int(match.group(1)) if match else None
