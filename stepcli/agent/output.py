"""File names and atomic writes for traces and step logs. Runs inside the target: standard library
only."""

from __future__ import annotations

import os
import re
import sys
import time

from stepcli.runfolder.layout import WINDOW_FOLDER_PREFIX

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_known_rank: int | None = None


def current_rank() -> int | None:
    """The distributed rank: torch.distributed's when initialized, else $RANK, else None.

    Once known it sticks, so names stay the same after `destroy_process_group()`.
    """
    global _known_rank
    if _known_rank is None:
        _known_rank = _find_rank()
    return _known_rank


def _find_rank() -> int | None:
    torch = sys.modules.get("torch")
    try:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-torn-down process group must not stop a save
        pass
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        pass
    return _slurm_rank()


def _slurm_rank() -> int | None:
    """Under `srun` without torchrun, each task's SLURM_PROCID is its global rank; a job of one task
    is not distributed (SLURM_PROCID is 0 there too), so it keeps the `<host>_<pid>` name."""
    try:
        if int(os.environ.get("SLURM_NTASKS") or os.environ.get("SLURM_NPROCS") or 1) > 1:
            return int(os.environ["SLURM_PROCID"])
    except (KeyError, ValueError):
        pass
    return None


def rank_prefix() -> str:
    """`rank3: ` in a distributed run, where every rank says the same lines at once; nothing in a
    lone process."""
    rank = current_rank()
    return f"rank{rank}: " if rank is not None else ""


def worker_name() -> str:
    """TensorBoard's worker part of a trace name: `rank<R>` in distributed runs, else
    `<host>_<pid>`."""
    rank = current_rank()
    if rank is not None:
        return f"rank{rank}"
    import socket  # only processes that save traces pay for it

    return f"{socket.gethostname()}_{os.getpid()}"


def trace_folder(out_dir: str, first_step: int, several_windows: bool) -> str:
    """Where a window's trace goes: the output folder itself when the schedule records one window
    per process, else `<out>/window-step<first_step>/`, one folder per window holding every rank's
    trace of it.

    Holistic Trace Analysis keeps one trace per rank from a folder and TensorBoard shows a folder as
    one run, so several windows of a rank side by side would be mixed up (rank 0's steps 2-3 paired
    with rank 1's 6-7). Ranks step in lockstep under one schedule, so the same window starts at the
    same step on every rank."""
    if not several_windows:
        return out_dir
    return os.path.join(out_dir, f"{WINDOW_FOLDER_PREFIX}{first_step}")


def export_trace(
    prof: Any, out_dir: str, use_gzip: bool, own_folder: bool = False
) -> tuple[str, os.stat_result]:
    """Export `prof`'s last cycle as `<worker>.<time_ns>.pt.trace.json[.gz]` via a temporary name
    and a rename; its path and the file's stat (size, inode, device: what the run's end checks the
    trace by).

    The output folder may be writable by others (a shared scratch folder): the folder is opened once
    without following a link (`own_folder`, a window folder: created here, or one of this user's),
    the profiler writes into a new private folder inside it (it opens its files by name: nothing can
    be planted in a folder only this user can enter), addressed through that descriptor, and the
    finished trace is linked to its final name, which never replaces anything."""
    from stepcli import safefile

    worker, suffix = worker_name(), ".pt.trace.json" + (".gz" if use_gzip else "")
    os.makedirs(os.path.dirname(out_dir) if own_folder else out_dir, exist_ok=True)
    if own_folder:
        safefile.make_folder(out_dir)  # a link planted at window-step<N> is refused, never followed
    folder_fd = safefile.open_folder(out_dir)
    scratch = ""
    try:
        scratch = safefile.temp_name("stepcli-export")
        os.mkdir(scratch, 0o700, dir_fd=folder_fd)
        base = (
            f"/proc/self/fd/{folder_fd}" if os.path.isdir(f"/proc/self/fd/{folder_fd}") else out_dir
        )
        tmp_json = os.path.join(base, scratch, "trace.json")
        tmp_gz = tmp_json + ".gz"
        name = f"{worker}.{time.time_ns()}{suffix}"
        prof.export_chrome_trace(tmp_json)
        # Kineto reports a failed write only in its own (silenced) log
        if not os.path.isfile(tmp_json):
            raise folder_problem(out_dir) or OSError(0, "the profiler wrote no trace file")
        _name_final_file(tmp_json, os.path.join(out_dir, name))
        from .tracenames import repair_file

        # names with bare quotes (a PyTorch bug) would make the whole file invalid JSON
        repair_file(tmp_json)
        ready = "trace.json"
        if use_gzip:
            import gzip
            import shutil

            with open(tmp_json, "rb") as source, gzip.open(tmp_gz, "wb", compresslevel=6) as target:
                shutil.copyfileobj(source, target, 1 << 20)
            ready = "trace.json.gz"
        # the private scratch file, before it is named: what sits at the public name may soon be
        # another's file
        info = os.stat(f"{scratch}/{ready}", dir_fd=folder_fd, follow_symlinks=False)
        for attempt in range(1000):  # another node or launch sharing the folder: never overwrite
            try:
                safefile.publish(f"{scratch}/{ready}", name, replace=False, dir_fd=folder_fd)
                break
            except FileExistsError:
                name = f"{worker}.{time.time_ns() + attempt + 1}{suffix}"
        else:
            raise FileExistsError(17, "no free trace name", out_dir)
    finally:
        if scratch:
            # (Kineto's own temporary name)
            for leftover in ("trace.json", "trace.json.gz", "trace.json.tmp"):
                safefile.remove(f"{scratch}/{leftover}", dir_fd=folder_fd)
            try:
                os.rmdir(scratch, dir_fd=folder_fd)
            except OSError:
                pass
        os.close(folder_fd)
    return os.path.join(out_dir, name), info


_PROBE_BYTES = 64 * 1024


def folder_problem(folder: str) -> OSError | None:
    """Why files cannot be written in `folder` now (read-only, full, no permission), found by
    writing a small probe file there and removing it; None when the probe could be written."""
    import errno

    from stepcli import safefile

    try:
        fd, probe = safefile.create_temp(folder, "stepcli-probe", safefile.PRIVATE)
    except OSError as exc:
        return exc
    try:
        os.write(fd, b"\0" * _PROBE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass
    try:
        info = os.statvfs(folder)
        if info.f_bavail * info.f_frsize < _PROBE_BYTES:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except (OSError, AttributeError):
        pass
    return None


def cause(exc: BaseException) -> str:
    """An exception as the cause a user can act on: the system's words for an OSError ("No space
    left on device"), else the exception's type and text."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


_write_failed = False


def write_failed(message: str) -> None:
    """The first failure to write a trace or step log in this process is said in one line; later
    ones are not (profiling has stopped, and the run summary names what is missing)."""
    global _write_failed
    if not _write_failed:
        _write_failed = True
        say(message)


def _name_final_file(tmp_json: str, final: str) -> None:
    """Kineto ends the file with `"traceName": "<the path it exported to>"`, our temporary name,
    which is gone after the rename; rewrite that last field (only the file's tail is read) to name
    the final file."""
    import json

    with open(tmp_json, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(0, size - 65536)
        handle.seek(start)
        tail = handle.read()
        at = tail.rfind(b'"traceName"')
        if at < 0 or not tail[at:].rstrip().endswith(b"}"):
            return  # not the layout we know: leave the file as torch wrote it
        handle.seek(start + at)
        handle.write(b'"traceName": ' + json.dumps(final).encode("ascii") + b"}\n")
        handle.truncate()


def human_size(size: int) -> str:
    """Binary units labelled KiB/MiB/GiB, as stepcli.fmt.size writes them (this module may not
    import it)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


# stepcli.safetext.visible's characters (the agent imports nothing of stepcli outside itself;
# tests/unit/test_fmt.py checks that the two agree): C0 and C1 controls, DEL, bidi embeddings,
# overrides and isolates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control character shown as `\\xNN` (`\\uNNNN` for bidi controls), as
    stepcli.fmt does."""
    return _CONTROL.sub(_escape, text)


def say(message: str) -> None:
    """One `stepcli:`-prefixed line on the launcher's terminal: the stderr Python opened at start
    (`sys.__stderr__`), never what the program made of `sys.stderr` (a StringIO it captures, its log
    file). Paths and names in it (an output folder named with ESC sequences) are shown as escapes,
    never sent raw."""
    message = visible(message)
    stream = sys.__stderr__
    try:
        if stream is not None:
            stream.write(f"stepcli: {message}\n")
            stream.flush()
        else:  # (no stderr at start: a daemon; fd 2 may still be open)
            os.write(2, f"stepcli: {message}\n".encode("utf-8", "backslashreplace"))
    except Exception:  # a closed stderr must not break the program
        pass
