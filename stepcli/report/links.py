"""Links from report.html to files beside it (traces, dump folders): relative to the page's folder,
so the folder can be moved or shared whole, and percent-encoded, since '#', '?', '%' and spaces
occur in file names."""

from __future__ import annotations

import os
from urllib.parse import quote

from stepcli.safetext import html_escape


def page_href(path: str, base: str) -> str:
    """`path` as an escaped href relative to `base` (the page's folder); the path itself where no
    relative path exists (another drive)."""
    try:
        relative = os.path.relpath(path, base)
    except ValueError:
        relative = path
    return html_escape("/".join(quote(part) for part in relative.split(os.sep)))
