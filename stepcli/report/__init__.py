"""`stepcli report`: one self-contained HTML page (charts, tables, advice) for a run, a run summary
or traces.

Owns the page only: `data` (what the page shows, from a RunSummary and the traces), `page` (HTML),
`svg` (charts), `links` (hrefs to files beside the page), and one module per section (gpu, hang,
lateness, memorysnapshots, whatifsection, wholerun). It renders and computes nothing new: the run
summary, its advice, and finding the inputs of `stepcli report PATH` belong to stepcli.run
(stepcli.run.summary.htmlreport). May import: stepcli.errors, stepcli.inputs, stepcli.stats,
stepcli.fmt, stepcli.runfolder.summaryfile, stepcli.steptimes, stepcli.traces, stepcli.advice and
stepcli.snapshots; never stepcli.run or stepcli.compare.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from stepcli import safefile
from stepcli.errors import StepcliError

if TYPE_CHECKING:
    from stepcli.report.data import ReportData

REPORT_NAME = "report.html"
GENERATOR = '<meta name="generator" content="stepcli">'  # marks pages stepcli may overwrite


def write_html(html: str, path: str) -> None:
    """Write atomically: a new file under a random temporary name in the same folder, then a rename
    (stepcli.safefile: nothing planted at either name is written through)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        safefile.write_bytes(str(target), html.encode("utf-8"))
    # mkdir's word when a part of the path is a file: name that part instead
    except FileExistsError:
        blocking = next(
            (p for p in target.parents if os.path.lexists(p) and not os.path.isdir(p)),
            target.parent,
        )
        raise StepcliError(f"{path}: cannot write the report: {blocking} is not a folder") from None
    except OSError as exc:
        raise StepcliError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def write_page(data: ReportData, path: str) -> str:
    """Render the page for `data` and write it to `path`; returns the path."""
    from stepcli.report.page import render

    write_html(render(data, path), path)
    return path


def check_output(out: str) -> None:
    """`-o FILE.html` may not be a folder, nor a page stepcli did not write (nothing the user had is
    lost)."""
    if os.path.isdir(out) and not os.path.islink(out):
        raise StepcliError(f"{out}: is a folder; give -o FILE.html")
    # A link (dangling or not) is never replaced by the page, nor written through: merge and compare
    # refuse it too.
    problem = safefile.why_not_replace(out, _is_our_page)
    if problem:
        raise StepcliError(f"{out}: {problem}; give another -o FILE.html")


def default_output(first: str) -> str:
    """FOLDER/report.html for a folder; NAME.report.html beside a file (run summary or trace)."""
    if os.path.isdir(first):
        return os.path.join(first, REPORT_NAME)
    name = os.path.basename(first)
    for suffix in (".gz", ".json", ".pt.trace"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return os.path.join(os.path.dirname(first), f"{name}.report.html")


def _is_our_page(head: bytes) -> bool:
    """Whether a file's first bytes are those of a page stepcli wrote (safefile.why_not_replace
    reads them)."""
    return GENERATOR.encode() in head[:2048]


def run_report_path(out_dir: str) -> str:
    """report.html, unless a file of that name that stepcli did not write is there (the user's own
    page is never overwritten): then the first free report-N.html."""
    path = os.path.join(out_dir, REPORT_NAME)
    # nothing there, or a page stepcli wrote
    if safefile.why_not_replace(path, _is_our_page) is None:
        return path
    stem, suffix = os.path.splitext(REPORT_NAME)
    number = 2
    while os.path.lexists(os.path.join(out_dir, f"{stem}-{number}{suffix}")):
        number += 1
    return os.path.join(out_dir, f"{stem}-{number}{suffix}")


def write_new_file(html: str, path: str) -> None:
    """Write `path` only if nothing is there yet, even a file that appeared a moment ago (a hard
    link never replaces an existing name)."""
    try:
        safefile.write_bytes(path, html.encode("utf-8"), replace=False)
    except OSError as exc:
        raise StepcliError(f"{path}: cannot write the report: {exc.strerror or exc}") from None
