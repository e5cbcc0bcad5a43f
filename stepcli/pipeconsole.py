"""A rich Console for output that may go to a pipe: no trailing spaces on lines that are not for a terminal.

rich pads table titles, captions and grid rows with spaces to the table's width; on a terminal that is invisible,
in a CI log or a file it is noise that `diff`, `grep 'x$'` and editors trip over. Lines for a terminal are left as
rich draws them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment

_TRAILING = re.compile(r"[ \t]+(?=\n|\Z)")


def strip_trailing(text: str) -> str:
    """`text` without spaces or tabs at the end of any line."""
    return _TRAILING.sub("", text)


def pipe_console(base: type[Console] | None = None, **options: Any) -> Console:
    """A Console (of class `base`, else rich's) that drops trailing spaces when it does not write to a terminal."""
    from rich.console import Console as RichConsole

    parent = base or RichConsole

    class _PipeConsole(parent):  # type: ignore[valid-type,misc]
        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            text = super()._render_buffer(buffer)
            return text if self.is_terminal else strip_trailing(text)

    console: Console = _PipeConsole(**options)
    return console
