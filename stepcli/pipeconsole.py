"""A command's output on stdout, and a rich Console for output that may go to a pipe.

rich pads table titles, captions and grid rows with spaces to the table's width; on a terminal that
is invisible, in a CI log or a file it is noise that `diff`, `grep 'x$'` and editors trip over.
Lines for a terminal are left as rich draws them.

A reader that goes away (`stepcli table T | head -1`) is not an error: the console raises
BrokenPipeError (rich's own handling would `sys.exit(1)`), and the command ends quietly with its own
status (compare's verdict survives a `| head`). Output that cannot be written at all (stdout closed
by `>&-`, a full disk, `> /dev/full`) is not a bug in stepcli either: `guard_stdout` turns it into
one `stepcli: error:` line and exit 2, said once.

A stdout whose encoding lacks a character (`PYTHONIOENCODING=latin-1`, a Latin-1 or ASCII locale) is
no failure: the characters stepcli draws with (`…`, `≥`, `×`, bars) are written as ASCII look-alikes
and any other as a `\\uXXXX` escape, JSON output (json_for) with escapes only, so it reads back the
same; the command's exit status, compare's verdict included, is what it would be on a UTF-8
terminal.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from stepcli.errors import EXIT_USAGE, StepcliError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment

_TRAILING = re.compile(r"[ \t]+(?=\n|\Z)")


def strip_trailing(text: str) -> str:
    """`text` without spaces or tabs at the end of any line."""
    return _TRAILING.sub("", text)


def pipe_console(base: type[Console] | None = None, **options: Any) -> Console:
    """A Console (of class `base`, else rich's) that drops trailing spaces when it does not write to
    a terminal."""
    from rich.console import Console as RichConsole

    parent = base or RichConsole

    class _PipeConsole(parent):  # type: ignore[valid-type,misc]
        def on_broken_pipe(self) -> None:
            self.quiet = True  # drop whatever is still buffered; nothing can reach the reader now
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            text = super()._render_buffer(buffer)
            return text if self.is_terminal else strip_trailing(text)

    if "width" not in options:
        width = _width_for_bad_columns(options)
        if width is not None:
            options["width"] = width
    console: Console = _PipeConsole(**options)
    return console


def _width_for_bad_columns(options: dict[str, Any]) -> int | None:
    """The width to use when COLUMNS is set but is no width (`0`, as some shells and CI runners set
    it, or a negative number): the stream's terminal's, else 80. rich would take `0` as zero columns
    and draw nothing."""
    raw = os.environ.get("COLUMNS", "").strip()
    if not re.fullmatch(r"-?\d+", raw) or int(raw) > 0:
        return None  # unset, a real width, or text rich ignores anyway
    stream = options.get("file") or (sys.stderr if options.get("stderr") else sys.stdout)
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


# ASCII look-alikes of the characters stepcli's own output uses, for a stdout whose encoding lacks
# them.
_LOOKALIKES = {
    "…": "...",
    "≥": ">=",
    "≤": "<=",
    "×": "x",
    "µ": "u",
    "·": ".",
    "↑": "^",
    "→": "->",
    "←": "<-",
    "—": "-",
    "–": "-",
    "─": "-",
    "│": "|",
    "┃": "|",
    **dict.fromkeys("▁▂▃▄▅▆▇█▉▊▋▌▍▎▏", "#"),
}
_FALLBACK = "stepcli-lookalike"


_JSON_ESCAPES = "stepcli-json-escapes"


def _lookalike(error: UnicodeError, lookalikes: dict[str, str] = _LOOKALIKES) -> tuple[str, int]:
    """Codec error handler: each character the encoding lacks as its ASCII look-alike, else as
    `\\uXXXX` (a surrogate pair beyond the BMP, as JSON writes it)."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    out = []
    for char in error.object[error.start : error.end]:
        code = ord(char)
        if char in lookalikes:
            out.append(lookalikes[char])
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out), error.end


codecs.register_error(_FALLBACK, _lookalike)
codecs.register_error(_JSON_ESCAPES, lambda error: _lookalike(error, {}))


def json_for(stream: object, text: str) -> str:
    """JSON `text` as `stream` can take it: unchanged, or each character its encoding lacks as a
    `\\uXXXX` escape (the document reads back the same; a look-alike would change a name)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, _JSON_ESCAPES).decode(encoding)
    except LookupError:  # (an encoding Python does not know: the stream itself will say so)
        pass
    return text


def _encodable(text: str, encoding: str | None) -> str:
    """`text` with what `encoding` cannot write replaced (_lookalike)."""
    encoding = encoding or "utf-8"
    return text.encode(encoding, _FALLBACK).decode(encoding)


class StdoutError(StepcliError):
    """stdout cannot take the command's output (closed, a full disk, an I/O error): the user's
    setup, not a bug."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot write the output to stdout: {reason}", EXIT_USAGE)


class _GuardedStdout:
    """sys.stdout for a command: a failed write or flush raises StdoutError once, then output is
    dropped."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._stream = stream
        self._failed = False

    def _fail(self, reason: str) -> None:
        if not self._failed:
            self._failed = True
            raise StdoutError(reason)

    def write(self, text: str) -> int:
        # click probes for a binary stream with write(b""): this one is text
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        # (an empty write, click's other probe, proves nothing either way)
        if self._failed or not text:
            return len(text)
        if self._stream is None:
            self._fail("it is closed")
            return 0
        try:
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:  # (raised before anything is written)
                self._stream.write(_encodable(text, getattr(self._stream, "encoding", None)))
                return len(text)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:
            self._fail(getattr(exc, "strerror", None) or str(exc))
            return 0

    def flush(self) -> None:
        if self._failed or self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:
            self._fail(getattr(exc, "strerror", None) or str(exc))

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError(errno.EBADF, "stdout is closed")
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


def guard_stdout() -> Any:
    """Put a guarded stdout in place of sys.stdout; returns the one it replaced, for `sys.stdout =
    ...` after."""
    before = sys.stdout
    sys.stdout = _GuardedStdout(before)
    return before


def discard_stdout(out: IO[str] | None = None) -> None:
    """After a broken pipe on stdout, point its descriptor at /dev/null so that the interpreter's
    last flush of what is still buffered succeeds silently instead of printing "Exception ignored
    ... BrokenPipeError"."""
    target = out if out is not None else sys.stdout
    try:
        fd = target.fileno()
    except (AttributeError, OSError, ValueError):
        return
    try:
        stdout_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        stdout_fd = 1
    if fd != stdout_fd:
        return  # a stream the caller opened: closing it is theirs to handle
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
