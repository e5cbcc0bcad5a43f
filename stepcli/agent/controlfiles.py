"""The run's control folder seen through one descriptor: its files opened relative to it, never
followed, never blocking, read only up to a bound, and only when they are regular files of this
user.

Runs inside the target (and in `stepcli capture`): standard library only. The output folder may live
where other users can write (a shared scratch folder). They cannot write into the private control
folder, but they can rename it away and put their own in its place, with `requests.json` a link to
/dev/zero or a FIFO. A process that holds the folder's descriptor from the start never sees their
folder; one that opens nothing it did not check never reads /dev/zero or blocks on a FIFO.
"""

from __future__ import annotations

import errno
import json
import os
import stat

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_NOFOLLOW | _O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK)  # what O_NOFOLLOW answers for a link (Linux, BSD)


class Refused(OSError):
    """A control file or folder that is not what this user made: never read, never written
    through."""


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def open_folder(path: str) -> int:
    """A descriptor of the control folder at `path`: a real folder (not a link) of this user, closed
    to others."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS or exc.errno == errno.ENOTDIR:
            raise Refused(f"{path} is not a folder (a link?)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode):
            raise Refused(f"{path} is not a folder")
        if info.st_uid != _uid():
            raise Refused(f"{path} belongs to another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise Refused(f"{path} is open to other users")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(folder_fd: int, name: str) -> tuple[int, os.stat_result]:
    """(descriptor, its stat) of `name` in the folder, a regular file of this user;
    FileNotFoundError when absent.

    O_NOFOLLOW: a link is refused, not followed. O_NONBLOCK: opening a FIFO returns at once (and is
    refused)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise Refused(f"{name} is a link, not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{name} is not a regular file (a FIFO or a device?)")
        if info.st_uid != _uid():
            raise Refused(f"{name} belongs to another user")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_bounded(fd: int, limit: int, name: str) -> bytes:
    """At most `limit` bytes of an open regular file; Refused when it holds more."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise Refused(f"{name} is larger than {limit} bytes")
    return b"".join(chunks)


def read_json(folder_fd: int, name: str, limit: int) -> Any:
    """The JSON document in `name`; FileNotFoundError when absent, Refused for anything not ours or
    too big, ValueError when it is not JSON (RecursionError, from a deeply nested one, included)."""
    fd, _ = open_regular(folder_fd, name)
    try:
        data = read_bounded(fd, limit, name)
    finally:
        os.close(fd)
    return parse_json(data)


def parse_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def write_json(folder_fd: int, name: str, document: Any) -> None:
    """Write `name` in the folder under a temporary name, then rename it: readers never see half a
    file. The temporary file is created new under a random name (stepcli.safefile): nothing that was
    there is written through."""
    from stepcli import safefile

    from .interrupts import Held

    # a Ctrl-C meanwhile reaches the program once the file is whole (stepcli.agent.config)
    with Held():
        safefile.write_bytes(
            name,
            json.dumps(document, separators=(",", ":")).encode("utf-8"),
            0o600,
            dir_fd=folder_fd,
        )


def unlink(folder_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass
