"""Event names with unescaped double quotes, as PyTorch writes them (pytorch/pytorch#146900).

Kineto writes each event's name as `"name": "<text>"` without escaping a `"` inside the text. With
`with_stack`, a Python frame's name is `<co_filename>(<line>): <function>`, and generated code
(dataclasses, torch.compile, anything made with exec) can have a filename holding quotes: one such
frame makes the whole trace invalid JSON, unreadable by Perfetto, TensorBoard, HTA and stepcli.
Kineto puts every name on a line of its own, so the line shows where the name ends: the quotes
between `"name": "` and the line's last `"` are the name's own.

Used by the agent on each trace it saves (before the rename, so no reader ever sees the broken file)
and by the trace reader on a file that fails to decode. Standard library only: it runs inside the
profiled process.
"""

from __future__ import annotations

import mmap
import os
import re

TYPE_CHECKING = False  # typing is not imported at run time: this module loads in profiled processes
if TYPE_CHECKING:
    from collections.abc import Iterator

# A name whose first quote after the opening one is not where Kineto ends the line (`",` or `"`,
# then the newline): a suspect, checked by _repairs (an escaped quote stops this fast scan too, and
# needs nothing).
_SUSPECT = re.compile(rb'"name": "[^"\n]*"(?!,?\r?\n)')
_NAME_LINE = re.compile(rb'^( *"name": ")(.*)(",?\r?)$', re.DOTALL)
_BARE_QUOTE = re.compile(rb'(?<!\\)"')


def _repairs(data: bytes | bytearray | mmap.mmap) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, fixed line) for every line (newline excluded) of Kineto's form `"name":
    "<text>",` whose text holds a bare quote, in order. A line of another form is left as it is:
    this is no general JSON repair."""
    position = 0
    while True:
        found = _SUSPECT.search(data, position)
        if found is None:
            return
        start = data.rfind(b"\n", 0, found.start()) + 1
        end = data.find(b"\n", found.start())
        end = len(data) if end < 0 else end
        line = bytes(data[start:end])
        parts = _NAME_LINE.match(line)
        if parts is not None:
            head, text, tail = parts.groups()
            fixed = head + _BARE_QUOTE.sub(_backslash_quote, text) + tail
            if fixed != line:
                yield start, end, fixed
        position = end


def _backslash_quote(_: re.Match[bytes]) -> bytes:
    return b'\\"'


def escape_names(data: bytes | bytearray) -> bytes | None:
    """`data` with every name's inner quotes escaped, or None when no name needs it."""
    pieces: list[bytes] = []
    done = 0
    for start, end, line in _repairs(data):
        pieces += [bytes(data[done:start]), line]
        done = end
    if not pieces:
        return None
    pieces.append(bytes(data[done:]))
    return b"".join(pieces)


def repair_file(path: str) -> int:
    """Escape the inner quotes of every broken name in the (uncompressed) trace at `path`, in place
    through a temporary file and a rename; returns how many lines were fixed (0: the file is left
    untouched).

    The check maps the file instead of reading it, so a clean trace costs one scan of the page
    cache."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return 0
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            lines = list(_repairs(data))
            if not lines:
                return 0
            from stepcli import safefile

            # a new file under a random name, renamed over `path`
            with safefile.NewFile(path) as out:
                done = 0
                for start, end, line in lines:
                    out.write(data[done:start])
                    out.write(line)
                    done = end
                out.write(data[done:])
    return len(lines)
