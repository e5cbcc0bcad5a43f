"""The most bytes stepcli reads from one input (a trace, a run summary, a snapshot), after
decompression.

Decoding holds the text plus the events it keeps, so this bounds memory at a few times the limit.
Real traces are well below the default; $STEPCLI_MAX_INPUT_BYTES raises (or lowers) it on purpose.
Standard library only and import-light: the command line checks the variable before any command
starts.
"""

from __future__ import annotations

import os

from stepcli.errors import EXIT_USAGE, StepcliError

LIMIT_ENV = "STEPCLI_MAX_INPUT_BYTES"
DEFAULT_LIMIT_BYTES = 4 * 1024**3
# What decoding one memory snapshot may add to the process (`stepcli memory --max-memory`): a real
# snapshot takes about as much as its events and frames (tens of MiB for a 10 MB pickle), so this is
# room for snapshots of millions of events, and a bound on what a crafted one can take.
DEFAULT_DECODE_BYTES = 4 * 1024**3

__all__ = [
    "DEFAULT_DECODE_BYTES",
    "DEFAULT_LIMIT_BYTES",
    "LIMIT_ENV",
    "check_input_limit",
    "input_limit",
]


def input_limit() -> int:
    """The size limit for one input: $STEPCLI_MAX_INPUT_BYTES when it is a positive integer, else 4
    GiB (the command line refuses any other value first: check_input_limit)."""
    value = _limit_from(os.environ.get(LIMIT_ENV, ""))
    return DEFAULT_LIMIT_BYTES if value is None else value


def _limit_from(text: str) -> int | None:
    """A positive whole number of bytes written in ASCII digits, else None."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        return None
    return int(text)


def check_input_limit() -> None:
    """One line (StepcliError, exit 2) when $STEPCLI_MAX_INPUT_BYTES is set to anything but a
    positive whole number of bytes: a limit the user set and stepcli ignored would read inputs they
    meant to refuse."""
    text = os.environ.get(LIMIT_ENV)
    if text is not None and text.strip() and _limit_from(text) is None:
        raise StepcliError(
            f"{LIMIT_ENV}: expected a positive whole number of bytes; got {text!r}", EXIT_USAGE
        )
