"""`stepcli report`: one self-contained HTML page (charts, tables, advice) for a run, a run summary or traces."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepcli.errors import StepcliError

if TYPE_CHECKING:
    from stepcli.traces.readonce import RunTraces

REPORT_NAME = "report.html"
GENERATOR = '<meta name="generator" content="stepcli">'  # marks pages stepcli may overwrite


def write_html(html: str, path: str) -> None:
    """Write atomically: a temporary name in the same folder, then rename."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):  # on a read-only folder even this fails
            tmp.unlink(missing_ok=True)
        raise StepcliError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def report_main(paths: Sequence[str], out: str | None) -> str:
    """Build the page for PATHs and write it; returns the path written."""
    from stepcli.report.data import gather
    from stepcli.report.page import render

    data = gather(paths)
    out = out or default_output(paths[0])
    if os.path.isdir(out):
        raise StepcliError(f"{out}: is a folder; give -o FILE.html")
    if os.path.exists(out) and not _made_by_stepcli(out):
        raise StepcliError(f"{out}: exists and was not written by stepcli; give another -o FILE.html")
    write_html(render(data, out), out)
    return out


def default_output(first: str) -> str:
    """FOLDER/report.html for a folder; NAME.report.html beside a file (run summary or trace)."""
    if os.path.isdir(first):
        return os.path.join(first, REPORT_NAME)
    name = os.path.basename(first)
    for suffix in (".gz", ".json", ".pt.trace"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return os.path.join(os.path.dirname(first), f"{name}.report.html")


def _made_by_stepcli(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return GENERATOR.encode() in handle.read(2048)
    except OSError:
        return False


def write_run_report(summary: dict[str, Any], log_dir: str, traces: RunTraces | None = None) -> tuple[str, list[str]]:
    """After `stepcli run`: report.html in the output folder, plus the advice lines for the terminal summary.

    The summary is also saved beside the step logs so `stepcli report OUT_DIR` can rebuild the same page later.
    `traces`: what the run summary already read (stepcli.traces.readonce), so no trace is read a second time.
    """
    from stepcli.report.data import SUMMARY_FILE, build, step_logs
    from stepcli.report.page import render
    from stepcli.run.summary import write_run_summary

    out_dir = str(summary["out_dir"])
    try:
        write_run_summary(summary, os.path.join(log_dir, SUMMARY_FILE))
    except StepcliError as exc:  # its message names --json, which this file is not
        raise StepcliError(f"cannot save the run summary in {log_dir}: {exc.message.rsplit(': ', 1)[-1]}") from None
    paths = [p for p in summary.get("traces") or [] if os.path.exists(p)]
    data = build(summary, step_logs(Path(log_dir)), paths, traces=traces)
    path = run_report_path(out_dir)
    html = render(data, path)
    if os.path.basename(path) == REPORT_NAME:
        write_html(html, path)
    else:
        _write_new_file(html, path)
        sys.stderr.write(
            f"stepcli: {REPORT_NAME} in {out_dir} was not written by stepcli: kept, this run's page is {path}\n"
        )
    return path, [advice.line() for advice in data.advice]


def run_report_path(out_dir: str) -> str:
    """report.html, unless a file of that name that stepcli did not write is there (the user's own page is never
    overwritten): then the first free report-N.html."""
    path = os.path.join(out_dir, REPORT_NAME)
    if not os.path.lexists(path) or (os.path.isfile(path) and not os.path.islink(path) and _made_by_stepcli(path)):
        return path
    stem, suffix = os.path.splitext(REPORT_NAME)
    number = 2
    while os.path.lexists(os.path.join(out_dir, f"{stem}-{number}{suffix}")):
        number += 1
    return os.path.join(out_dir, f"{stem}-{number}{suffix}")


def _write_new_file(html: str, path: str) -> None:
    """Write `path` only if nothing is there yet, even a file that appeared a moment ago (a hard link never
    replaces an existing name)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.link(tmp, target)
    except OSError as exc:
        raise StepcliError(f"{path}: cannot write the report: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):  # on a read-only folder even this fails
            tmp.unlink(missing_ok=True)
