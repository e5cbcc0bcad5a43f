"""Creating files and folders where other users may write: never through a link or FIFO planted
there.

Every file stepcli creates goes through here. The output folder may be a scratch folder that other
users can write to; anything at a name stepcli will use may have been planted there first: a link to
one of the user's own files (which a plain `open(name, "w")` would truncate and overwrite), a FIFO
(which blocks the opener forever), a folder link that sends the file somewhere else. So:

- a file is always created new (O_CREAT|O_EXCL|O_NOFOLLOW) under a temporary name no one can guess
  (random, not the pid), written, then renamed over its final name: a rename replaces a link planted
  at the final name instead of writing through it, and readers never see half a file;
- `replace=False` never replaces anything at the final name (a hard link of the temporary file,
  which fails when the name is taken);
- a folder stepcli uses inside the output folder is opened without following a link and must be a
  real folder.

Standard library only and import-light: the agent (inside the profiled program) uses it too.
"""

from __future__ import annotations

import errno
import os
import stat

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | O_NOFOLLOW | O_CLOEXEC
READ_FLAGS = os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC
LINK_ERRNOS = (errno.ELOOP, errno.EMLINK)  # what O_NOFOLLOW answers for a link (Linux, BSD)
# files that hold stack frames, argv or allocation stacks: the user's only, whatever the umask
PRIVATE = 0o600
SHARED = 0o666  # everything else: the umask decides, as for any file


# The temporary files being written now, by this process: (pid, path, dir_fd) by NewFile. A short
# command (merge, report -o, compare --markdown, ...) stopped by SIGTERM, SIGHUP or Ctrl-C removes
# them (stepcli.quickexit.remove_temps_on_signals) instead of leaving a half-written
# `.NAME.<random>.tmp` for good.
_LIVE: dict[int, tuple[int, str, int | None]] = {}


def uid() -> int:
    """This user's id: the owner every file and folder stepcli writes into must have (0 where there
    is none)."""
    return os.getuid() if hasattr(os, "getuid") else 0


def random_tag() -> str:
    """16 hex digits from the OS's random source: a temporary name nobody can plant a link at in
    advance."""
    return os.urandom(8).hex()


def temp_name(name: str) -> str:
    """`.NAME.<random>.tmp`: hidden, and skipped by every reader of the folder (".tmp")."""
    return f".{name}.{random_tag()}.tmp"


def create_new(path: str, mode: int = SHARED, *, dir_fd: int | None = None) -> int:
    """A descriptor (write-only) of a file created at `path` now: FileExistsError when anything is
    there, a link included (never followed)."""
    return os.open(path, NEW_FILE_FLAGS, mode, dir_fd=dir_fd)


def create_temp(
    folder: str, name: str, mode: int = SHARED, *, dir_fd: int | None = None, track: object = None
) -> tuple[int, str]:
    """(descriptor, path) of a new temporary file for `name` in `folder` (with `dir_fd`, the path is
    relative to it and `folder` is ignored). `track`: the writer; its file is listed in _LIVE before
    it exists, so a signal at any moment after finds it."""
    for _ in range(100):
        tmp = temp_name(name)
        path = tmp if dir_fd is not None else os.path.join(folder, tmp)
        if track is not None:
            _LIVE[id(track)] = (os.getpid(), path, dir_fd)
        try:
            return create_new(path, mode, dir_fd=dir_fd), path
        except FileExistsError:  # 64 random bits taken: someone plants names; try another
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", folder)


def publish(tmp: str, path: str, *, replace: bool = True, dir_fd: int | None = None) -> None:
    """Give the finished temporary file its final name. `replace=False`: FileExistsError when the
    name is taken (by anything, a link included), and the temporary file is left for the caller to
    remove."""
    if replace:
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return
    try:
        os.link(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        # A file system without hard links: a name taken a moment ago could still be replaced,
        # nothing else.
        try:
            os.lstat(path, dir_fd=dir_fd)
        except FileNotFoundError:
            os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return
        raise FileExistsError(errno.EEXIST, "exists", path) from None
    remove(tmp, dir_fd=dir_fd)


def remove(path: str, *, dir_fd: int | None = None) -> None:
    try:
        os.unlink(path, dir_fd=dir_fd)
    except OSError:
        pass


def remove_live_temps() -> None:
    """Remove every temporary file this process is writing now (a child forked meanwhile removes
    none of its parent's: the pid is checked)."""
    pid = os.getpid()
    for owner, path, dir_fd in list(_LIVE.values()):
        if owner == pid:
            remove(path, dir_fd=dir_fd)
    _LIVE.clear()


class NewFile:
    """`with NewFile(path) as handle:` writes a binary file created new under a temporary name
    beside `path`, renamed to `path` when the block ends without an exception (and removed when it
    raises).

    `mode`: PRIVATE (0600) or SHARED (the umask decides). `replace=False`: never replace what is at
    `path` (FileExistsError). `dir_fd`: `path` is a name in that folder's descriptor."""

    def __init__(
        self, path: str, mode: int = SHARED, *, replace: bool = True, dir_fd: int | None = None
    ) -> None:
        self.path, self.mode, self.replace, self.dir_fd = path, mode, replace, dir_fd
        self.tmp = ""
        self._handle: IO[bytes] | None = None

    def __enter__(self) -> IO[bytes]:
        folder, name = os.path.split(self.path)
        if self.dir_fd is not None and folder:
            raise ValueError("with dir_fd, the path is a bare name")
        try:
            fd, self.tmp = create_temp(folder, name, self.mode, dir_fd=self.dir_fd, track=self)
        except BaseException:  # a Ctrl-C just after the file was made, too: it goes
            entry = _LIVE.pop(id(self), None)
            if entry is not None and entry[0] == os.getpid():
                remove(entry[1], dir_fd=entry[2])
            raise
        try:
            self._handle = open(fd, "wb")  # noqa: SIM115 (closed in __exit__)
        except BaseException:
            os.close(fd)
            remove(self.tmp, dir_fd=self.dir_fd)
            _LIVE.pop(id(self), None)
            raise
        return self._handle

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        handle, self._handle = self._handle, None
        published = False
        try:
            if handle is not None:
                handle.close()  # (a full disk may say so only here)
            if kind is None:
                publish(self.tmp, self.path, replace=self.replace, dir_fd=self.dir_fd)
                published = self.replace
        finally:
            # failed, or linked (the final name holds the data): the temporary name goes
            if not published:
                remove(self.tmp, dir_fd=self.dir_fd)
            _LIVE.pop(id(self), None)


def write_bytes(
    path: str,
    data: bytes | bytearray | memoryview,
    mode: int = SHARED,
    *,
    replace: bool = True,
    dir_fd: int | None = None,
) -> None:
    """Write `data` to `path` through a new temporary file and a rename (see NewFile)."""
    with NewFile(path, mode, replace=replace, dir_fd=dir_fd) as handle:
        handle.write(data)


def probe_writable(folder: str, prefix: str = "stepcli-write-test") -> None:
    """OSError when no file can be created in `folder`: a new empty temporary file, removed at
    once."""
    fd, tmp = create_temp(folder, prefix, PRIVATE)
    os.close(fd)
    remove(tmp)


def make_folder(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
    """Create the folder `path` (its parent must exist), or accept one that is there: a real folder
    (not a link) of this user. OSError otherwise, before anything is written into it."""
    try:
        os.mkdir(path, mode, dir_fd=dir_fd)
        return
    except FileExistsError:
        pass
    info = os.lstat(path, dir_fd=dir_fd)
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, "is a link, not a folder: not followed", path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder", path)
    if info.st_uid != uid():
        raise PermissionError(errno.EPERM, "is a folder of another user: not written into", path)


def open_folder(path: str, *, dir_fd: int | None = None) -> int:
    """A descriptor of the real folder at `path` (a link there is refused: OSError
    ELOOP/ENOTDIR)."""
    try:
        return os.open(path, FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in LINK_ERRNOS:
            raise OSError(errno.ELOOP, "is a link, not a folder: not followed", path) from None
        raise


def open_regular(
    path: str, *, dir_fd: int | None = None, own: bool = False
) -> tuple[int, os.stat_result]:
    """(read-only descriptor, stat) of the regular file at `path`: a link is not followed, a FIFO
    never blocks, anything else is refused (OSError). `own`: a file of another user is refused
    too."""
    try:
        fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in LINK_ERRNOS:
            raise OSError(errno.ELOOP, "is a link, not a regular file", path) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO or a device?)", path)
        if own and info.st_uid != uid():
            raise PermissionError(errno.EPERM, "belongs to another user", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


NOT_OURS = "exists and was not written by stepcli"


def why_not_replace(path: str, ours: Callable[[bytes], object], head: int = 4096) -> str | None:
    """Why an output may not replace what is at `path` (a few words), or None when nothing is there
    or it is a regular file, not a link, whose first `head` bytes `ours` recognizes as this
    command's own earlier output. So the user's files, the command's own inputs, a link, a FIFO or a
    device are never replaced."""
    if not os.path.lexists(path):
        return None
    try:
        fd, _ = open_regular(path)  # a link is not followed, a FIFO never blocks
    except OSError:
        return "exists and is not a regular file"
    try:
        first = os.read(fd, head)
    except OSError as exc:
        return f"exists and cannot be read ({exc.strerror or exc})"
    finally:
        os.close(fd)
    # (an empty file holds nothing to lose: `mktemp`'s)
    return None if not first or ours(first) else NOT_OURS


def read_regular(path: str, limit: int, *, dir_fd: int | None = None, own: bool = False) -> bytes:
    """At most `limit` bytes of the regular file at `path` (see open_regular); OSError EFBIG when it
    holds more."""
    fd, _ = open_regular(path, dir_fd=dir_fd, own=own)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
    return b"".join(chunks)
